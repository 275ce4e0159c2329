/**
 * tooltx reconciler — for now, its projection (issue 3): consumes the event log on its own durable
 * (`reconciler`, filter `<prefix>.op.>`) and keeps the index of non-terminal operations in KV
 * `<prefix>_reconcile`, one entry per operation under `<tenant>.<opId>` (see `projection.ts`).
 * Any number of instances may run: entries are written with compare-and-set and ordered by stream
 * sequence. Probing and redriving operations come in a later issue.
 *
 * Usage: `tsx services/reconciler/src/main.ts [--help]`. Same environment as the executor.
 * Stops cleanly on SIGTERM/SIGINT: stops pulling, finishes in-flight applies, drains.
 */
import { projectionHandler, startConsumerLoop, openBucket } from '@tooltx/nats';
import { runService } from '@tooltx/runtime/service';
import { Durables } from '@tooltx/streams';
import { applyToIndex, reconcileValueSchema } from './projection.js';

await runService({
  name: 'reconciler',
  summary: 'projects the event log into the index of non-terminal operations (KV <prefix>_reconcile, key <tenant>.<opId>; committed and rejected operations leave a tombstone). Probing and redriving are not built yet',
  async start({ subjects, log, js, nc, config }) {
    const kv = await openBucket(nc, subjects.reconcileBucket);
    const loop = await startConsumerLoop({
      js,
      stream: subjects.eventsStream,
      durable: Durables.reconciler,
      concurrency: config.TOOLTX_CONCURRENCY,
      log,
      handle: projectionHandler({ subjects, kv, schema: reconcileValueSchema, rule: applyToIndex, log }),
    });
    return () => loop.stop();
  },
});
