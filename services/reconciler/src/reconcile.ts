import type { KV } from '@nats-io/kv';
import { decide, type OperationRecord } from '@tooltx/lifecycle';
import { ConcurrencyError, decode, newEventId, type OperationStore, type Subjects } from '@tooltx/nats';
import type { ImplementationRegistry, Logger } from '@tooltx/runtime';
import { recoverOperation } from '@tooltx/runtime/recovery';
import { reconcileValueSchema, type IndexEntry } from './projection.js';

export interface SweepDeps {
  index: KV;
  results: KV;
  store: OperationStore;
  subjects: Subjects;
  tools: ImplementationRegistry;
  log: Logger;
  /** Pause between two sweeps of the index, ms. */
  intervalMs: number;
  now?: () => number;
}

/** Probing backoff of `unknown` operations: exponential from 1 s, capped at 60 s, with ±50 % jitter. */
export function nextProbeDelayMs(failures: number, random: () => number = Math.random): number {
  const base = Math.min(60_000, 1_000 * 2 ** Math.min(failures, 6));
  return Math.round(base * (0.5 + random()));
}

/**
 * The reconciler's sweep over its index of non-terminal operations (issue 7):
 * - `accepted` but not `running` beyond the contract's `runningBoundMs` → requeued (re-driven,
 *   whatever the dispatch path missed);
 * - `running` past its deadline and its `runningBoundMs` → verified by a probe (commit / requeue /
 *   unknown, {@link recoverOperation});
 * - `unknown` → probed again with bounded exponential backoff and jitter; past the contract's
 *   `unknownDeadlineMs` it is reported as needing a person (takeover records come with issue 8).
 * Safe with several instances: every write is an append under the expected subject sequence.
 */
export function startSweeper(d: SweepDeps): { stop(): Promise<void> } {
  const now = d.now ?? Date.now;
  const backoff = new Map<string, { failures: number; nextAt: number; reported: boolean }>();
  let stopping = false;
  let wake: (() => void) | null = null;
  // The non-terminal operations, fed by one long-lived watch of the index (never a full key
  // listing per sweep: that was O(all operations ever) and could hang across a server restart).
  const watched = new Map<string, IndexEntry>();
  const watcher = watchIndex(d.index, watched, d.log, () => stopping);

  const sweepOnce = async () => {
    for (const key of [...backoff.keys()]) if (!watched.has(key)) backoff.delete(key);
    for (const [key, v] of [...watched]) {
      if (stopping) return;
      await visit(key, v).catch((err: unknown) => d.log.warn({ err, key }, 'reconcile step failed; next sweep retries'));
    }
  };

  const visit = async (key: string, e: IndexEntry) => {
    const impl = d.tools.get(e.tool, e.version);
    if (!impl) return;
    const { runningBoundMs, unknownDeadlineMs } = impl.contract.timing;
    const t = now();
    const due =
      (e.status === 'accepted' && t - e.updatedAt > runningBoundMs) ||
      (e.status === 'running' && t > Math.max(e.deadlineAt ?? 0, (e.runningAt ?? e.updatedAt) + runningBoundMs)) ||
      (e.status === 'unknown' && t >= (backoff.get(key)?.nextAt ?? 0));
    if (!due) return;
    const [tenant, opId] = key.split('.') as [string, string];
    const { state, seq } = await d.store.load(tenant, opId);
    if (state.status === 'none' || state.status !== e.status) return; // the index lags: next sweep
    const l = d.log.child({ tenant, operationKey: state.operationKey, attempt: state.attempt, status: state.status });
    if (state.status === 'accepted') {
      const r = decide({ type: 'requeue', eventId: newEventId(), at: t, attempt: state.attempt, reason: 'stale_accepted' }, state);
      if (r.kind === 'append') {
        try {
          await d.store.append(tenant, opId, r.event, seq);
          l.info({ waitedMs: t - e.updatedAt }, 'stale accepted operation re-driven');
        } catch (err) {
          if (!(err instanceof ConcurrencyError)) throw err;
        }
      }
      return;
    }
    const outcome = await recoverOperation({ store: d.store, subjects: d.subjects, results: d.results, impl, tenant, opId, state: state as OperationRecord, seq, log: l, now });
    if (outcome === 'kept' || outcome === 'marked_unknown' || outcome === 'no_probe') {
      const b = backoff.get(key) ?? { failures: 0, nextAt: 0, reported: false };
      b.failures++;
      b.nextAt = now() + nextProbeDelayMs(b.failures);
      const unknownSince = state.evidence?.at ?? state.updatedAt;
      if (!b.reported && now() - unknownSince > unknownDeadlineMs) {
        b.reported = true;
        l.error({ unknownForMs: now() - unknownSince }, 'unknown past its deadline: needs a person (takeover)');
      }
      backoff.set(key, b);
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
    async stop() {
      stopping = true;
      wake?.();
      watcher.stop();
      await Promise.all([done, watcher.done]);
    },
  };
}

/**
 * Keeps `into` equal to the index's non-terminal entries: one KV watch (an ordered consumer that
 * resumes after a reconnect), started again from the last values if it ever ends.
 */
function watchIndex(index: KV, into: Map<string, IndexEntry>, log: Logger, stopped: () => boolean): { stop(): void; done: Promise<void> } {
  let current: { stop(): void } | null = null;
  const done = (async () => {
    while (!stopped()) {
      try {
        const it = await index.watch({ key: '>' });
        current = it;
        if (stopped()) it.stop();
        into.clear();
        for await (const e of it) {
          if (e.operation !== 'PUT') {
            into.delete(e.key);
            continue;
          }
          let v;
          try {
            v = decode(reconcileValueSchema, e.value);
          } catch (err) {
            log.error({ err, key: e.key }, 'undecodable index entry skipped');
            continue;
          }
          if (v.terminal) into.delete(e.key);
          else into.set(e.key, v);
        }
      } catch (err) {
        if (!stopped()) log.warn({ err }, 'index watch ended; watching again');
      }
      if (!stopped()) await new Promise((r) => setTimeout(r, 1_000));
    }
  })();
  return { stop: () => current?.stop(), done };
}
