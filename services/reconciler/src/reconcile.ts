import type { KV } from '@nats-io/kv';
import {
  compensationSettlement,
  handleCommand,
  lookDue,
  nextProbeInMs,
  sweepAction,
  takeoverDue,
  type OperationRecord,
  type OperationStore,
  type ReceiptSigner,
} from '@tooltx/lifecycle';
import { operationIdOf } from '@tooltx/contracts';
import { KvMirror, newEventId, type Subjects } from '@tooltx/nats';
import { discardPrepared, linkCompensation, projectEntry, type FrozenTaskWatch } from '@tooltx/runtime';
import type { ImplementationRegistry, Logger } from '@tooltx/runtime';
import { recoverOperation } from '@tooltx/runtime/recover-operation';
import { applyStateToIndex, reconcileValueSchema, type IndexEntry } from './reconcile-index.js';
import { openTakeover, repairFreezes } from './open-takeover.js';

export interface SweepDeps {
  index: KV;
  results: KV;
  /** The frozen-task bucket and a watch of it (for the thaw repair). */
  tasks: KV;
  frozen: Pick<FrozenTaskWatch, 'entries'>;
  store: OperationStore;
  subjects: Subjects;
  tools: ImplementationRegistry;
  log: Logger;
  /** Signs the receipts of commits found by probing. */
  signer: ReceiptSigner;
  /** Freezes a task before its original is linked `compensation_failed` (FM-20), as the link does. */
  freeze?: (tenant: string, taskId: string, operationKey: string, at: number) => Promise<void>;
  /** Pause between two sweeps of the index, ms. */
  intervalMs: number;
  /** Wall clock (ms since the epoch): the times of the events it appends, and with the events' own times a schedule of looks; never a verdict. */
  now?: () => number;
  /** Monotonic clock for every wait it decides (ms, any origin): `performance.now` by default. */
  elapsed?: () => number;
}

/**
 * The reconciler's sweep over its index of non-terminal operations:
 * - `accepted` but not `running` beyond the contract's `runningBoundMs` → requeued (re-driven,
 *   whatever the dispatch path missed);
 * - `running` beyond the attempt's `timeoutMs` (plus a grace) and its `runningBoundMs` → verified by
 *   a probe (commit / requeue / unknown, {@link recoverOperation});
 * - `unknown` → probed again with bounded exponential backoff and jitter; past the contract's
 *   `unknownDeadlineMs` → a takeover record, its task frozen (FM-14);
 * - a probe that finds another effect under our key → a takeover record at once;
 * - an operation under takeover is a person's: never probed again;
 * - `awaiting_confirmation` past its confirmation deadline → `rolled_back` (`expire_confirmation`):
 *   nothing was sent, and nothing is.
 * Whether an attempt may run again is the probe's verdict, on the downstream's clock — never a
 * comparison of this process's clock with a time another process wrote (their clocks may disagree
 * by any amount: docs/clocks.md). When to look is scheduled by the events' own times or, whichever
 * comes first, by a duration on this process's monotonic clock from when it saw the entry in its
 * current state; the probe backoff and the takeover past `unknownDeadlineMs` only by the latter (a
 * clock ahead never calls a person early; after a restart that wait starts again). Safe with
 * several instances: every write is an append under the expected subject sequence.
 */
export function startSweeper(d: SweepDeps): {
  stop(): Promise<void>;
  watched: ReadonlyMap<string, IndexEntry>;
  /** Watches the index again from its start (after it was rebuilt: KvMirror.resync). */
  resync(): void;
} {
  const now = d.now ?? Date.now;
  const elapsed = d.elapsed ?? (() => performance.now());
  /** Next probe of an operation, on the monotonic clock; `failures` probes found nothing new. */
  const backoff = new Map<string, { failures: number; nextAt: number }>();
  /** When the sweep first saw each entry at its current sequence, on the monotonic clock. */
  const seen = new Map<string, { seq: number; at: number }>();
  let stopping = false;
  let wake: (() => void) | null = null;
  // The non-terminal operations, fed by one long-lived watch of the index (never a full key
  // listing per sweep: that was O(all operations ever) and could hang across a server restart).
  const mirror = new KvMirror(d.index, reconcileValueSchema, {
    log: d.log,
    what: 'reconciler index',
    keep: (v) => !v.terminal,
  });
  void mirror.start();
  const watched = mirror.map as ReadonlyMap<string, IndexEntry>;

  const takeoverDeps = { store: d.store, tasks: d.tasks, log: d.log, now };
  /** When this sweep first saw each freeze, on the monotonic clock (repairFreezes). */
  const freezesSeen = new Map<string, number>();
  let sweeps = 0;
  const sweepOnce = async () => {
    // Every ~30 sweeps: thaw freezes no open takeover backs any more (a lost thaw).
    if (sweeps++ % 30 === 0)
      await repairFreezes(takeoverDeps, d.frozen, freezesSeen, { elapsed }).catch((err: unknown) =>
        d.log.warn({ err }, 'freeze repair failed'),
      );
    for (const key of [...backoff.keys()]) if (!watched.has(key)) backoff.delete(key);
    for (const key of [...seen.keys()]) if (!watched.has(key)) seen.delete(key);
    for (const [key, v] of [...watched]) {
      if (stopping) return;
      await visit(key, v).catch((err: unknown) =>
        d.log.warn({ err, key }, 'reconcile step failed; next sweep retries'),
      );
    }
  };

  const visit = async (key: string, e: IndexEntry) => {
    if (e.takeoverAt !== undefined) return; // a person's now
    const impl = d.tools.get(e.tool, e.version);
    if (!impl) return;
    const { unknownDeadlineMs } = impl.contract.timing;
    const t = elapsed();
    let since = seen.get(key);
    if (!since || since.seq !== e.seq) {
      since = { seq: e.seq, at: t };
      seen.set(key, since);
    }
    const age = t - since.at;
    const due = lookDue(e, impl.contract.timing, {
      seenForMs: age,
      wallNow: now(),
      probeDue: t >= (backoff.get(key)?.nextAt ?? 0),
    });
    if (!due) return;
    const [tenant, opId] = key.split('.') as [string, string];
    const { state, seq } = await d.store.load(tenant, opId);
    const action = sweepAction(e, state, seq);
    if (action === 'skip' || state.status === 'none') return;
    if (action === 'close_entry') {
      // The operation ended but its entry stayed open (its terminal event was applied where the
      // entry was not yet known: index-writer.ts): take it out of the index.
      await projectEntry({
        kv: d.index,
        key,
        schema: reconcileValueSchema,
        apply: (cur) => applyStateToIndex(cur, state, seq),
      });
      d.log.info({ key, status: state.status }, 'stale index entry of an ended operation closed');
      return;
    }
    const l = d.log.child({ tenant, operationKey: state.operationKey, attempt: state.attempt, status: state.status });
    if (action === 'settle_compensation') {
      // Its compensation ended but the original does not show it (its link was lost, or read a
      // stale attempt): linked now, tied to the attempt this request registered. One still running
      // is its own operation's; one never registered is completed by a repeat of the request.
      const compKey = state.compensation?.operationKey;
      if (!compKey) return;
      const { state: comp } = await d.store.load(tenant, operationIdOf(compKey));
      const settlement = compensationSettlement(state, comp);
      if (settlement.kind === 'link' && comp.status !== 'none') {
        const linked = await linkCompensation(d.store, comp, {
          now,
          ...(d.freeze ? { freeze: d.freeze } : {}),
        });
        if (linked) l.info({ compensationKey: compKey, event: linked }, 'compensation outcome linked by the sweep');
        backoff.delete(key);
        return;
      }
      // Nothing to link yet: looked at again later, less and less often (a compensation may run,
      // or wait for a person, for long).
      const b = backoff.get(key) ?? { failures: 0, nextAt: 0 };
      b.failures++;
      b.nextAt = elapsed() + nextProbeInMs(b.failures);
      backoff.set(key, b);
      if (settlement.kind === 'register' && b.failures === 1)
        l.warn(
          { compensationKey: compKey },
          'compensation requested but never registered: a repeat of the request registers it',
        );
      return;
    }
    if (action === 'expire_confirmation') {
      // No confirmation came by the deadline: rolled back, nothing sent (the decider refuses it
      // `not_due` on this command's time if the deadline has not passed).
      const h = await handleCommand(
        d.store,
        tenant,
        opId,
        () => ({ type: 'expire_confirmation', eventId: newEventId(), at: now(), attempt: state.attempt }),
        { known: { state, seq }, retry: false },
      );
      if (h.kind === 'appended') {
        l.info('held-back operation not confirmed by its deadline: rolled back');
        if (h.event.state.status === 'rolled_back')
          await discardPrepared(d.store, d.subjects, impl, h.event.state, l, impl.contract.timing.timeoutMs);
      }
      return;
    }
    if (action === 'requeue_stale') {
      const h = await handleCommand(
        d.store,
        tenant,
        opId,
        () => ({ type: 'requeue', eventId: newEventId(), at: now(), attempt: state.attempt, reason: 'stale_accepted' }),
        { known: { state, seq }, retry: false },
      );
      if (h.kind === 'appended') l.info({ waitedMs: Math.round(age) }, 'stale accepted operation re-driven');
      return;
    }
    const b = backoff.get(key) ?? { failures: 0, nextAt: 0 };
    const outcome = await recoverOperation({
      store: d.store,
      subjects: d.subjects,
      results: d.results,
      impl,
      tenant,
      opId,
      state: state as OperationRecord,
      seq,
      log: l,
      now,
      signer: d.signer,
      onMismatch: async (probed) =>
        void (await openTakeover(takeoverDeps, tenant, opId, {
          reason: 'probe_mismatch',
          probes: b.failures + 1,
          probed,
        })),
    });
    if (outcome.result === 'kept' || outcome.result === 'marked_unknown' || outcome.result === 'no_probe') {
      b.failures++;
      b.nextAt =
        elapsed() +
        nextProbeInMs(b.failures, {
          ...(outcome.retryInMs === undefined ? {} : { retryInMs: outcome.retryInMs }),
          ...(state.status === 'unknown' ? { untilDeadlineMs: unknownDeadlineMs - (elapsed() - since.at) } : {}),
        });
      backoff.set(key, b);
      if (takeoverDue(state.status, elapsed() - since.at, unknownDeadlineMs)) {
        if (await openTakeover(takeoverDeps, tenant, opId, { reason: 'unknown_past_deadline', probes: b.failures }))
          backoff.delete(key);
      }
    } else backoff.delete(key);
  };

  const done = (async () => {
    while (!stopping) {
      await sweepOnce().catch((err: unknown) => d.log.warn({ err }, 'sweep failed'));
      if (stopping) break;
      await new Promise<void>((r) => {
        wake = r;
        setTimeout(r, d.intervalMs);
      });
    }
  })();

  return {
    watched,
    resync: () => mirror.resync(),
    async stop() {
      stopping = true;
      wake?.();
      await Promise.all([done, mirror.stop()]);
    },
  };
}
