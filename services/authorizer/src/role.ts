/**
 * The authorizer role ({@link RoleSpec}): what it consumes, what it starts and how it stops. Run as a process
 * of its own by main.ts.
 */
import { startConsumerLoop, openBucket } from '@tooltx/nats';
import { FrozenTaskWatch, RegistryMirror } from '@tooltx/runtime';
import { AnswerPusher, StatusService } from '@tooltx/readside';
import { defineRole } from '@tooltx/runtime/service';
import { TenantWatch } from '@tooltx/runtime/tenants';
import { Durables } from '@tooltx/streams';
import { intentHandler } from './authorize.js';
import { startCompensateService } from './compensate-service.js';
import { startConfirmService } from './confirm-service.js';
import { TokenBucket } from './rate.js';

/** The bytes of intent one intake token pays for (docs/tenancy.md). */
const INTAKE_TOKEN_BYTES = 16 * 1024;
/** The most one intent is charged beyond its own token: what its size and its bounded checks can cost (docs/tenancy.md). */
const MAX_INTAKE_CHARGE = 100;

export const authorizerRole = defineRole({
  name: 'authorizer',
  summary:
    "consumes intents, checks identity, contract, key and policy, registers operations, and answers status requests and operators' compensation, confirmation and discard requests",
  async start({ subjects, store, tools, log, js, nc, config, colocation }) {
    const results = await openBucket(nc, subjects.resultsBucket);
    const status = new StatusService({
      nc,
      js,
      subjects,
      store,
      results,
      tools,
      log: log.child({ component: 'status' }),
    });
    await status.start();
    const frozen = new FrozenTaskWatch(
      await openBucket(nc, subjects.tasksBucket),
      log.child({ component: 'frozen-tasks' }),
    );
    await frozen.start();
    // The contract registry, watched (docs/contracts.md): intake refuses new intents on a retired
    // or withdrawn version from this in-memory copy, never with a registry read per intent.
    const registry = new RegistryMirror(
      await openBucket(nc, subjects.contractsBucket),
      log.child({ component: 'contract-registry' }),
    );
    await registry.start();
    // Each tenant's pace (docs/tenancy.md): one token per intent, one more per millisecond its intake
    // checks took beyond the first and per 16 KiB beyond the first, so that an intent built to be
    // costly (thousands of fields, a megabyte of junk) is paced by its cost: the flood waits in the
    // tenant's own stream, which then refuses at its bound, storing nothing.
    const paces = new Map<string, TokenBucket>();
    const handle = intentHandler({
      subjects,
      store,
      tools,
      // The executor of this process, when it hosts one: what it can take now is started here.
      localExecutor: () => colocation.executor,
      log,
      frozen,
      registry,
      results,
      pusher: new AnswerPusher({ subjects, log, publish: (subject, data) => nc.publish(subject, data) }),
      onIntakeCost: (tenant, ms, bytes) =>
        paces
          .get(tenant)
          ?.charge(
            Math.min(MAX_INTAKE_CHARGE, Math.max(0, ms - 1) + Math.max(0, Math.ceil(bytes / INTAKE_TOKEN_BYTES) - 1)),
          ),
    });
    const tenants = new TenantWatch(
      await openBucket(nc, subjects.tenantsBucket),
      log.child({ component: 'tenants' }),
      async (tenant, limits) => {
        const decisions = await status.watchDecisions(tenant);
        const pace = new TokenBucket(limits.intentsPerSecond, limits.intentBurst);
        paces.set(tenant, pace);
        try {
          const loop = await startConsumerLoop({
            js,
            stream: subjects.intentsStream(tenant),
            durable: Durables.authorizer,
            concurrency: config.TOOLTX_CONCURRENCY,
            log: log.child({ tenant }),
            // The pace admits before the pull: a flood's intents wait in the tenant's own stream, never
            // here or on this connection ahead of other tenants' (a 1 MB junk intent costs ~62 tokens).
            admit: { take: (free) => pace.takeUpTo(free), unused: (n) => pace.giveBack(n) },
            handle,
          });
          log.info({ tenant, intentsPerSecond: limits.intentsPerSecond }, 'serving tenant');
          return {
            update: (l) => pace.set(l.intentsPerSecond, l.intentBurst),
            async stop() {
              const stopped = loop.stop();
              pace.release();
              await stopped;
              decisions.stop();
              paces.delete(tenant);
            },
          };
        } catch (err) {
          decisions.stop();
          throw err;
        }
      },
    );
    // Operators' compensation requests (`tooltx compensate`), registered through the intake above.
    const compensations = startCompensateService({
      nc,
      js,
      store,
      subjects,
      tools,
      log: log.child({ component: 'operator-compensate' }),
    });
    // Operators' confirmations and discards of held-back operations (`tooltx confirm`, `tooltx discard`).
    const confirmations = startConfirmService({
      nc,
      js,
      store,
      subjects,
      log: log.child({ component: 'operator-confirm' }),
    });
    await tenants.start();
    // Started = serving every listed tenant (one whose streams are missing is tried again meanwhile).
    await Promise.race([tenants.ready(), new Promise((r) => setTimeout(r, 10_000).unref())]);
    return async () => {
      await compensations.stop();
      await Promise.all(confirmations.map((c) => c.stop()));
      await tenants.stop();
      await status.stop();
      await frozen.stop();
      await registry.stop();
    };
  },
});
