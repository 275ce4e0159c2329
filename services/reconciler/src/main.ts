/**
 * tooltx reconciler — the index of operations still in flight, the sweep that re-drives and
 * verifies them, and the takeover service. Consumes the event log on its own durable
 * (`reconciler`, filter `<prefix>.op.>`) and keeps the index of non-terminal operations in KV
 * `<prefix>_reconcile`, one entry per operation under `<tenant>.<opId>` (see `reconcile-index.ts`).
 * Any number of instances may run: entries are written with compare-and-set and ordered by stream
 * sequence. A sweep (reconcile.ts) verifies stale and unknown operations by probing the downstream.
 *
 * Usage: `tsx services/reconciler/src/main.ts [--help]`. Same environment as the executor.
 * Stops cleanly on SIGTERM/SIGINT: stops pulling, finishes in-flight applies, drains.
 */
import { runService } from '@tooltx/runtime/service';
import { reconcilerRole } from './role.js';

await runService(reconcilerRole);
