/**
 * The executor role ({@link RoleSpec}): what it consumes, what it starts and how it stops. Run as a process
 * of its own by main.ts.
 */
import { randomBytes } from 'node:crypto';
import { setMaxListeners } from 'node:events';
import { z } from 'zod';
import { DEFAULT_MIN_SAMPLING_WINDOW_MS, MAX_SAMPLING_WINDOW_MS } from '@tooltx/lifecycle';
import { startConsumerLoop, openBucket } from '@tooltx/nats';
import { FrozenTaskWatch, readKeyFile, Sampler, scrubber } from '@tooltx/runtime';
import { AnswerPusher, startDebugService } from '@tooltx/readside';
import { defineRole } from '@tooltx/runtime/service';
import { describeConnectError, startupStep } from '@tooltx/runtime';
import { Durables } from '@tooltx/streams';
import { executorHandlers } from './execute.js';

const executorEnvSchema = z.object({
  /**
   * Which durable consumer to pull from (default `executor`). A second durable makes two executor
   * groups compete for every accepted operation — safe, since only one `running` append can win,
   * and how the race tests force it; otherwise only for migrations. It must exist (the provisioner
   * creates the ones the identity list's `executorDurables` names).
   */
  TOOLTX_EXECUTOR_DURABLE: z
    .string()
    .regex(/^[A-Za-z0-9_-]{1,64}$/, 'a durable name: ^[A-Za-z0-9_-]{1,64}$')
    .default(Durables.executor),
  /**
   * Shortest debug-sampling window accepted, ms (docs/debug-samples.md): 1 min by default; tests
   * lower it to seconds so a window's end can be waited for. Never above the 4 h bound.
   */
  TOOLTX_DEBUG_MIN_WINDOW_MS: z.coerce
    .number()
    .int()
    .min(1_000)
    .max(MAX_SAMPLING_WINDOW_MS)
    .default(DEFAULT_MIN_SAMPLING_WINDOW_MS),
});

export const executorRole = defineRole({
  name: 'executor',
  summary: 'consumes the event log and runs each accepted operation once',
  signsReceipts: true,
  env: executorEnvSchema,
  envHelp: `  TOOLTX_EXECUTOR_DURABLE  the durable consumer to pull from (default ${Durables.executor}); another one (provisioned
                           from the identity list's executorDurables) makes a competing executor group
  TOOLTX_DEBUG_MIN_WINDOW_MS shortest debug-sampling window accepted, ms (1000-${MAX_SAMPLING_WINDOW_MS}; default
                           ${DEFAULT_MIN_SAMPLING_WINDOW_MS}); the longest is always 4 h (docs/debug-samples.md)`,
  async start({ subjects, store, tools, log, js, jsm, nc, config, env, signer, colocation }) {
    const results = await openBucket(nc, subjects.resultsBucket);
    const shutdown = new AbortController();
    // Each attempt in flight listens on it (and stops listening when it ends): up to
    // TOOLTX_CONCURRENCY at once, which is not a leak — without this Node warns past 10 on stderr.
    setMaxListeners(config.TOOLTX_CONCURRENCY + 10, shutdown.signal);
    const frozen = new FrozenTaskWatch(
      await openBucket(nc, subjects.tasksBucket),
      log.child({ component: 'frozen-tasks' }),
    );
    await frozen.start();
    // Debug sampling (docs/debug-samples.md): the switches in memory, the samples scrubbed as the
    // logs are, purged at each window's end; the operators' debug service beside it.
    const samplesBucket = await openBucket(nc, subjects.samplesBucket);
    const switches = await openBucket(nc, subjects.samplingBucket);
    // A window's tenant must be listed: read from the tenants bucket the provisioner writes.
    const tenantsKv = await openBucket(nc, subjects.tenantsBucket);
    const purge = async (token: string) => {
      await jsm.streams.purge(`KV_${subjects.samplesBucket}`, { filter: `$KV.${subjects.samplesBucket}.${token}.>` });
    };
    const sampler = new Sampler({
      switches,
      samples: samplesBucket,
      subjects,
      log: log.child({ component: 'sampler' }),
      scrub: scrubber(config.TOOLTX_LOG_HMAC_KEY_FILE ? readKeyFile(config.TOOLTX_LOG_HMAC_KEY_FILE) : randomBytes(32)),
      purge,
    });
    await sampler.start();
    const debug = startDebugService({
      nc,
      js,
      switches,
      samples: samplesBucket,
      subjects,
      log: log.child({ component: 'debug' }),
      instance: config.TOOLTX_INSTANCE_ID,
      minWindowMs: env.TOOLTX_DEBUG_MIN_WINDOW_MS,
      holds: (contract) => {
        const at = contract.lastIndexOf('@');
        return tools.get(contract.slice(0, at), Number(contract.slice(at + 1))) !== undefined;
      },
      open: () => sampler.switches().map((sw) => sw.contract),
      tenantListed: async (tenant) => {
        const e = await tenantsKv.get(tenant);
        return !!e && e.operation === 'PUT' && e.length > 0;
      },
      purge,
    });
    const handlers = executorHandlers(
      {
        subjects,
        store,
        tools,
        log,
        results,
        executorId: config.TOOLTX_INSTANCE_ID,
        shutdown: shutdown.signal,
        frozen,
        signer: signer!,
        pusher: new AnswerPusher({ subjects, log, publish: (subject, data) => nc.publish(subject, data) }),
        sampler,
      },
      config.TOOLTX_CONCURRENCY,
    );
    // A durable that does not exist, or that this identity may not read, is the operator's setting.
    // A process hosting every role reads the log once for all of them (its own durable unused).
    const loop = colocation.eventLog
      ? colocation.eventLog.register('executor', handlers.events, { long: true })
      : await startupStep(
          'TOOLTX_EXECUTOR_DURABLE',
          env.TOOLTX_EXECUTOR_DURABLE,
          () =>
            startConsumerLoop({
              js,
              stream: subjects.eventsStream,
              durable: env.TOOLTX_EXECUTOR_DURABLE,
              concurrency: config.TOOLTX_CONCURRENCY,
              log,
              handle: handlers.events,
            }),
          (err) =>
            `no durable consumer of that name on ${subjects.eventsStream} that this identity may read (\`tooltx streams apply\` provisions the default; another is listed in the identity list's executorDurables and provisioned): ${describeConnectError(err)}`,
        );
    // An authorizer of this process hands over what it accepts and starts in one append.
    colocation.executor = handlers.local;
    return async () => {
      if (colocation.executor === handlers.local) delete colocation.executor;
      await debug.stop();
      await loop.stop();
      await handlers.idle();
      await sampler.stop();
      await frozen.stop();
    };
  },
});
