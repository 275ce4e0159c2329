import { downstreamKeyOf, EMPTY_RESULT_DIGEST, type Implementation } from '@tooltx/contracts';
import {
  handleCommand,
  planRecovery,
  receiptOnlyResult,
  type Evidence,
  type OperationCommand,
  type OperationRecord,
  type OperationStore,
  type ReceiptSigner,
  type RecoveryInput,
} from '@tooltx/lifecycle';
import { encode, newEventId, type Subjects } from '@tooltx/nats';
import type { KV } from '@nats-io/kv';
import type { Logger } from 'pino';

/** What {@link recoverOperation} did. */
export type RecoveryResult =
  | 'committed'
  | 'requeued'
  | 'marked_unknown'
  | 'kept'
  | 'moved_on'
  | 'no_probe'
  | 'mismatch';

/**
 * {@link RecoveryResult}, with `retryInMs` when the downstream's clock said when the attempt's
 * request can no longer land (a duration, ms: probe again then, or sooner).
 */
export interface RecoveryOutcome {
  result: RecoveryResult;
  retryInMs?: number;
}

/**
 * The recovery shell shared by the executor (a redelivered operation whose executor died) and the
 * reconciler (stale `running`, `unknown`): probe the downstream by our key, decide with the pure
 * {@link decideRecovery}, append under the expected sequence. A commit from a probe stores the
 * result only when the contract's output is empty (a write's receipt-only result, FM-19): a probe
 * cannot recover a business result, so other contracts stay `unknown` for a person.
 * Throws the store's errors (the caller naks and retries).
 */
export async function recoverOperation(deps: {
  store: OperationStore;
  subjects: Subjects;
  results: KV;
  impl: Implementation;
  tenant: string;
  opId: string;
  state: OperationRecord;
  seq: number;
  log: Logger;
  /** Signs the receipt of a commit found by the probe. */
  signer: ReceiptSigner;
  now?: () => number;
  /**
   * Called when the probe found an effect under our key that is not what was asked (another input
   * digest): the reconciler opens a takeover. The attempt is first marked `unknown` if it was running.
   */
  onMismatch?: (probed: { resourceId: string; inputDigest: string }) => Promise<void>;
}): Promise<RecoveryOutcome> {
  const { subjects, results, impl, tenant, opId, state, log } = deps;
  const now = deps.now ?? Date.now;
  // The probe's duration on the monotonic clock: a wall clock stepped back meanwhile must not make
  // it negative (an event that could not be read back, docs/clocks.md).
  const startedMono = performance.now();
  const took = () => Math.max(0, Math.round(performance.now() - startedMono));
  let input: RecoveryInput = { kind: 'no_probe' };
  if (impl.probe) {
    try {
      const r = await impl.probe({
        tenant,
        actor: state.actor,
        operationKey: state.operationKey,
        downstreamKey: downstreamKeyOf(tenant, state.operationKey),
        attempt: state.attempt,
        inputDigest: state.inputDigest,
        signal: AbortSignal.timeout(impl.contract.timing.timeoutMs),
      });
      input = r.found
        ? { kind: 'found', resourceId: r.resourceId, ...(r.inputDigest ? { inputDigest: r.inputDigest } : {}) }
        : { kind: 'not_found', ...(r.downstreamAt !== undefined ? { downstreamAt: r.downstreamAt } : {}) };
    } catch {
      input = { kind: 'unavailable' };
    }
  }
  const receiptOnly = receiptOnlyResult(impl.contract);
  const plan = planRecovery(state, input, { downstream: impl.contract.downstream, receiptOnly: receiptOnly !== null });
  const l = log.child({ tenant, operationKey: state.operationKey, attempt: state.attempt, probe: input.kind });
  switch (plan.kind) {
    case 'commit': {
      const { result, digest: resultDigest } = receiptOnly!;
      if (resultDigest !== EMPTY_RESULT_DIGEST)
        await results.put(
          subjects.resultKey(tenant, opId),
          encode({ operationKey: state.operationKey, attempt: state.attempt, resultDigest, result }),
        );
      const d = await append(deps, () => ({
        type: 'commit',
        eventId: newEventId(),
        at: now(),
        attempt: state.attempt,
        ...run(state),
        resourceId: plan.resourceId,
        resultDigest,
      }));
      l.info({ resourceId: plan.resourceId, outcome: d }, 'recovered: committed from the probe');
      return { result: d === 'appended' ? 'committed' : 'moved_on' };
    }
    case 'requeue': {
      const d = await append(deps, () => ({
        type: 'requeue',
        eventId: newEventId(),
        at: now(),
        attempt: state.attempt,
        ...run(state),
        reason: 'probe_not_found',
      }));
      l.info({ outcome: d }, 'recovered: nothing downstream, requeued under the same key');
      return { result: d === 'appended' ? 'requeued' : 'moved_on' };
    }
    case 'unknown': {
      const evidenceKind = plan.markEvidence;
      const d = evidenceKind
        ? await append(deps, () => ({
            type: 'mark_unknown',
            eventId: newEventId(),
            at: now(),
            attempt: state.attempt,
            ...run(state),
            evidence: evidence(evidenceKind, now(), input.kind === 'no_probe' ? undefined : took()),
          }))
        : undefined;
      switch (plan.reason) {
        case 'no_probe':
          return { result: 'no_probe' };
        case 'mismatch':
          l.error(
            { resourceId: plan.probed?.resourceId },
            'probe found another effect under our key: left for a person',
          );
          if (plan.probed) await deps.onMismatch?.(plan.probed);
          return { result: 'mismatch' };
        case 'result_not_recoverable':
          l.warn('probe found the effect but cannot recover its result: left for a person');
          return { result: 'marked_unknown' };
        case 'requeue_limit':
          if (d === undefined) return { result: 'kept' };
          l.warn(
            { outcome: d, requeues: state.requeues },
            'probe found nothing again after the last requeue allowed: left to a person past its deadline',
          );
          return d === 'appended' ? { result: 'marked_unknown' } : { result: 'moved_on' };
        case 'unresolved':
          if (d === undefined) return { result: 'kept', ...retry(plan) };
          l.warn({ outcome: d, ...retry(plan) }, 'outcome unknown: left to the reconciler');
          return d === 'appended' ? { result: 'marked_unknown', ...retry(plan) } : { result: 'moved_on' };
      }
    }
  }
}

function retry(step: { retryInMs?: number }): { retryInMs?: number } {
  return step.retryInMs === undefined ? {} : { retryInMs: step.retryInMs };
}

function evidence(kind: Evidence['kind'], at: number, elapsedMs?: number): Evidence {
  return { kind, at, ...(elapsedMs !== undefined ? { elapsedMs } : {}) };
}

/** Binds a recovery outcome to the run it probed (see the decider's `runId`). */
function run(state: OperationRecord): { runId?: string } {
  return state.running ? { runId: state.running.eventId } : {};
}

/**
 * Appends one command decided on the state the probe was about: a probe's verdict holds for that
 * state only, so a lost race is `moved_on`, never decided again on a newer state.
 */
async function append(
  d: {
    store: OperationStore;
    tenant: string;
    opId: string;
    state: OperationRecord;
    seq: number;
    signer: ReceiptSigner;
  },
  make: () => OperationCommand,
): Promise<'appended' | 'moved_on'> {
  const h = await handleCommand(d.store, d.tenant, d.opId, make, {
    known: { state: d.state, seq: d.seq },
    retry: false,
    signer: d.signer,
  });
  return h.kind === 'appended' ? 'appended' : 'moved_on';
}
