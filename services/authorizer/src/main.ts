/**
 * tooltx authorizer — consumes each tenant's intents, checks them in the order docs/lifecycle.md
 * gives and registers operations; also serves the status endpoint (`<prefix>.status.<tenant>.<actor>`,
 * queue group `tooltx-status`).
 *
 * Usage: `tsx services/authorizer/src/main.ts [--help]`. Configuration from the environment:
 * NATS_URL, NATS_CREDS_FILE, TOOLTX_PREFIX, TOOLTX_TOOLS_MODULE (required), TOOLTX_CONCURRENCY
 * (intents handled at once per tenant), LOG_LEVEL, TOOLTX_INSTANCE_ID and the stream settings of
 * `tooltx streams apply`. The tenants and their limits come from the tenants bucket
 * (docs/tenancy.md): one intake consumer per tenant, each paced by the tenant's own rate, so one
 * tenant's backlog never delays another's.
 * Stops cleanly on SIGTERM/SIGINT: stops pulling, finishes in-flight intents, drains.
 */
import { startConsumerLoop, openBucket } from '@tooltx/nats';
import { FrozenTaskWatch } from '@tooltx/runtime';
import { AnswerPusher, StatusService } from '@tooltx/readside';
import { runService } from '@tooltx/runtime/service';
import { TenantWatch } from '@tooltx/runtime/tenants';
import { Durables } from '@tooltx/streams';
import { intentHandler } from './authorize.js';
import { TokenBucket } from './rate.js';

/** The bytes of intent one intake token pays for (docs/tenancy.md). */
const INTAKE_TOKEN_BYTES = 16 * 1024;
/** The most one intent is charged beyond its own token: what its size and its bounded checks can cost (docs/tenancy.md). */
const MAX_INTAKE_CHARGE = 100;

await runService({
  name: 'authorizer',
  summary: 'consumes intents, checks identity, contract, key and policy, registers operations, and answers status requests',
  async start({ subjects, store, tools, log, js, nc, config }) {
    const results = await openBucket(nc, subjects.resultsBucket);
    const status = new StatusService({ nc, js, subjects, store, results, tools, log: log.child({ component: 'status' }) });
    await status.start();
    const frozen = new FrozenTaskWatch(await openBucket(nc, subjects.tasksBucket), log.child({ component: 'frozen-tasks' }));
    await frozen.start();
    // Each tenant's pace (docs/tenancy.md): one token per intent, one more per millisecond its intake
    // checks took beyond the first and per 16 KiB beyond the first, so that an intent built to be
    // costly (thousands of fields, a megabyte of junk) is paced by its cost: the flood waits in the
    // tenant's own stream, which then refuses at its bound, storing nothing.
    const paces = new Map<string, TokenBucket>();
    const handle = intentHandler({
      subjects, store, tools, log, frozen, results,
      pusher: new AnswerPusher({ subjects, log, publish: (subject, data) => nc.publish(subject, data) }),
      onIntakeCost: (tenant, ms, bytes) => paces.get(tenant)?.charge(Math.min(MAX_INTAKE_CHARGE, Math.max(0, ms - 1) + Math.max(0, Math.ceil(bytes / INTAKE_TOKEN_BYTES) - 1))),
    });
    const tenants = new TenantWatch(await openBucket(nc, subjects.tenantsBucket), log.child({ component: 'tenants' }), async (tenant, limits) => {
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
          handle: async (m) => {
            await pace.take();
            return handle(m);
          },
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
    });
    await tenants.start();
    // Started = serving every listed tenant (one whose streams are missing is tried again meanwhile).
    await Promise.race([tenants.ready(), new Promise((r) => setTimeout(r, 10_000).unref())]);
    return async () => {
      await tenants.stop();
      await status.stop();
      await frozen.stop();
    };
  },
});
