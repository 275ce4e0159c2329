/**
 * The reconciler role ({@link RoleSpec}): what it consumes, what it starts and how it stops. Run as a process
 * of its own by main.ts.
 */
import { z } from 'zod';
import type { KV } from '@nats-io/kv';
import { heldLimit, KvMirror, startConsumerLoop, openBucket } from '@tooltx/nats';
import { freezeTask, FrozenTaskWatch, linkCompensation, ProjectionGuard } from '@tooltx/runtime';
import { envInt, type Logger } from '@tooltx/runtime';
import { defineRole } from '@tooltx/runtime/service';
import { startTakeoverService } from '@tooltx/readside';
import { Durables } from '@tooltx/streams';
import { advisoryHandler } from './advisories.js';
import { IndexWriter } from './index-writer.js';
import { indexRebuilder } from './rebuild-index.js';
import { reconcileValueSchema, type IndexEntry } from './reconcile-index.js';
import { startSweeper } from './reconcile.js';

/** The reconciler's own settings (validated with the common ones; a bad value refuses to start, exit 2). */
const reconcilerEnvSchema = z.object({
  /** Pause between two sweeps, ms (default 2000). */
  TOOLTX_RECONCILE_INTERVAL_MS: envInt(1, 3_600_000).default(2_000),
  /** `off` runs a projection-only instance: the index, no probing, no takeovers (default `on`). */
  TOOLTX_RECONCILE_SWEEP: z.enum(['on', 'off']).default('on'),
  /**
   * How long an accepted or running event waits before its operation is indexed, ms (default
   * 1000; 0 = index every event at once). An operation that ends within it is never written to the
   * index (index-writer.ts). Keep it well below every contract's `runningBoundMs`.
   */
  TOOLTX_RECONCILE_INDEX_DELAY_MS: envInt(0, 60_000).default(1_000),
});

/** A projection-only instance's view of the index (what a sweeper would watch), so its writer knows which entries exist. */
function projectionOnly(
  kv: KV,
  log: Logger,
): { stop(): Promise<void>; watched: ReadonlyMap<string, IndexEntry>; resync(): void } {
  const mirror = new KvMirror(kv, reconcileValueSchema, { log, what: 'reconciler index', keep: (v) => !v.terminal });
  void mirror.start();
  return {
    watched: mirror.map as ReadonlyMap<string, IndexEntry>,
    stop: () => mirror.stop(),
    resync: () => mirror.resync(),
  };
}

export const reconcilerRole = defineRole({
  name: 'reconciler',
  summary:
    'projects the event log into the index of non-terminal operations (KV <prefix>_reconcile) and sweeps it every TOOLTX_RECONCILE_INTERVAL_MS (default 2000; TOOLTX_RECONCILE_SWEEP=off for a projection-only instance): stale accepted → re-driven; stale running and unknown → probed by key, then committed, requeued under the same key, or kept unknown',
  signsReceipts: true,
  env: reconcilerEnvSchema,
  envHelp: `  TOOLTX_RECONCILE_INTERVAL_MS  pause between two sweeps, ms: an integer 1..3600000 (default 2000)
  TOOLTX_RECONCILE_SWEEP   on|off (default on); off = a projection-only instance (the index, no
                           probing, no takeovers)
  TOOLTX_RECONCILE_INDEX_DELAY_MS  how long an accepted or running event waits before its operation
                           is indexed, ms: an integer 0..60000 (default 1000; 0 = at once). An
                           operation that ends sooner is never written to the index`,
  async start({ subjects, log, js, jsm, nc, config, env, store, tools, topology, signer, colocation }) {
    const kv = await openBucket(nc, subjects.reconcileBucket);
    // The index is on memory storage: gone after a server restart, then rebuilt from the event log
    // (@tooltx/runtime ProjectionGuard). Its writes wait until it is whole.
    let resync: () => void = () => undefined;
    const guard = new ProjectionGuard({
      nc,
      js,
      jsm,
      bucket: topology.projections.reconcile,
      log,
      sources: () => [{ stream: subjects.eventsStream, filter: subjects.allOps }],
      rebuilder: () =>
        indexRebuilder({
          kv,
          subjects,
          log: log.child({ component: 'rebuild' }),
          delayMs: env.TOOLTX_RECONCILE_INDEX_DELAY_MS,
        }),
      onRebuilt: () => resync(),
    });
    guard.start();
    const results = await openBucket(nc, subjects.resultsBucket);
    const tasks = await openBucket(nc, subjects.tasksBucket);
    const frozen = new FrozenTaskWatch(tasks, log.child({ component: 'frozen-tasks' }));
    await frozen.start();
    const sweeper =
      env.TOOLTX_RECONCILE_SWEEP === 'off'
        ? projectionOnly(kv, log)
        : startSweeper({
            index: kv,
            results,
            tasks,
            frozen,
            store,
            subjects,
            tools,
            signer: signer!,
            freeze: (tenant, taskId, operationKey, at) => freezeTask(tasks, tenant, taskId, operationKey, at),
            log: log.child({ component: 'sweep' }),
            intervalMs: env.TOOLTX_RECONCILE_INTERVAL_MS,
          });
    resync = () => sweeper.resync();
    // Operators' takeover requests: list, show, resolve.
    const takeover = startTakeoverService({
      nc,
      store,
      subjects,
      results,
      tasks,
      tools,
      signer: signer!,
      log: log.child({ component: 'takeover' }),
      watched: sweeper.watched,
    });
    // Held operations are bounded so their unacked messages (up to 3 each) stay under the durable's
    // max_ack_pending with the loop's own in-flight ones.
    const maxHeld = colocation.eventLog
      ? await colocation.eventLog.heldLimit(jsm, subjects.eventsStream, config.TOOLTX_CONCURRENCY)
      : await heldLimit(jsm, subjects.eventsStream, Durables.reconciler, config.TOOLTX_CONCURRENCY);
    const index = new IndexWriter({
      subjects,
      kv,
      store,
      log,
      delayMs: env.TOOLTX_RECONCILE_INDEX_DELAY_MS,
      maxHeld,
      isIndexed: (key) => sweeper.watched.has(key),
      guard,
      // A compensation that ended moves its original (compensated, compensation_failed, or
      // committed again when it was refused before it ran).
      onCompensation: (state) =>
        linkCompensation(store, state, {
          freeze: (tenant, taskId, operationKey, at) => freezeTask(tasks, tenant, taskId, operationKey, at),
        }),
    });
    // A process hosting every role reads the log once for all of them (its own durable unused).
    const loop =
      colocation.eventLog?.register('reconciler', index.handle) ??
      (await startConsumerLoop({
        js,
        stream: subjects.eventsStream,
        durable: Durables.reconciler,
        concurrency: config.TOOLTX_CONCURRENCY,
        log,
        handle: index.handle,
      }));
    // The max-deliveries advisories of the event log: an operation whose message a durable
    // gave up on goes back into the index, where the sweep finds it — even if this was down then.
    const advisories = await startConsumerLoop({
      js,
      stream: topology.streams.advisories.name,
      durable: Durables.reconcilerAdvisories,
      concurrency: 1,
      log,
      handle: advisoryHandler({ store, subjects, index: kv, log: log.child({ component: 'advisories' }) }),
    });
    return async () => {
      await advisories.stop();
      await takeover.stop();
      await sweeper.stop();
      await index.flush();
      await loop.stop();
      await frozen.stop();
      guard.stop();
    };
  },
});
