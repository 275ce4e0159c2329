/**
 * tooltx audit-projector — consumes the event log on its own durable (`audit-projector`, filter
 * `<prefix>.op.>`) and keeps one audit record per operation in KV `<prefix>_audit` under
 * `<tenant>.<opId>` (issue 3; see `projection.ts`): who, which contract and target digest, side
 * effect or not, every state with its time, final state, error class, result digest — never a body,
 * input or raw error text. Any number of instances may run: records are written with
 * compare-and-set and are the same whatever order the events arrive in. The auditors' query
 * service comes later.
 *
 * Usage: `tsx services/audit-projector/src/main.ts [--help]`. Same environment as the executor.
 * Stops cleanly on SIGTERM/SIGINT: stops pulling, finishes in-flight applies, drains.
 */
import { projectionHandler, startConsumerLoop, openBucket } from '@tooltx/nats';
import { runService } from '@tooltx/runtime/service';
import { Durables } from '@tooltx/streams';
import { applyToAudit, auditRecordSchema } from './projection.js';

await runService({
  name: 'audit-projector',
  summary: 'projects the event log into one audit record per operation (KV <prefix>_audit, key <tenant>.<opId>): actor, contract, target digest, states with times, side effect, error class, result digest — no bodies',
  async start({ subjects, log, js, nc, config }) {
    const kv = await openBucket(nc, subjects.auditBucket);
    const loop = await startConsumerLoop({
      js,
      stream: subjects.eventsStream,
      durable: Durables.auditProjector,
      concurrency: config.TOOLTX_CONCURRENCY,
      log,
      handle: projectionHandler({ subjects, kv, schema: auditRecordSchema, rule: applyToAudit, log }),
    });
    return () => loop.stop();
  },
});
