import type { DownstreamGuarantees, ErrorInfo } from '@tooltx/contracts';
import type { Evidence, OperationRecord, OperationState, TakeoverRecord } from './events.js';
import { attemptEnded } from './transitions.js';

/** What a read-only probe of the downstream by our key found. */
export type ProbeOutcome =
  /** `inputDigest`: the digest of the input the downstream recorded with the effect, when it keeps one. */
  | { kind: 'found'; resourceId: string; inputDigest?: string }
  /**
   * `downstreamAt`: the downstream's clock when it looked (ms since the epoch), on a clock that never
   * goes back; absent when the downstream does not report it.
   */
  | { kind: 'not_found'; downstreamAt?: number }
  /** The probe itself failed: nothing is known. */
  | { kind: 'unavailable' };

/** The next step for an operation whose attempt may or may not have reached the downstream. */
export type RecoveryStep =
  | { kind: 'commit'; resourceId: string }
  /**
   * The downstream holds an effect under our key that is not what this operation asked (its
   * recorded input digest differs): never commit someone else's effect — a person takes over.
   */
  | { kind: 'mismatch'; resourceId: string; inputDigest: string }
  /** Run the attempt again under the same key: safe because nothing was found and no late request can land. */
  | { kind: 'requeue' }
  /**
   * Nothing proves either outcome: `unknown` with evidence, the reconciler keeps probing.
   * `retryInMs`: when the downstream's clock says the attempt's request can no longer land — a
   * duration, so no other clock enters; probing sooner is fine.
   */
  | { kind: 'mark_unknown'; retryInMs?: number }
  /** Already `unknown` and still nothing new: keep observing (`retryInMs` as for `mark_unknown`). */
  | { kind: 'keep'; retryInMs?: number };

/** Margin added to a `retryInMs`, ms: the next probe lands after the deadline, not on it. */
export const RETRY_MARGIN_MS = 250;

/**
 * Verify before acting (FM-12, FM-13, FM-27). Pure,
 * and without a clock of its own: whether a request in flight can still land is decided by the
 * clock of the party that enforces the deadline — the downstream's, as its probe reports it — never
 * by the caller's clock (docs/clocks.md).
 *
 * - found → compared with what was asked: the same input digest (or none recorded) → `commit` with
 *   the downstream's resource id (FM-02, FM-13, FM-27); another digest → `mismatch` (takeover);
 * - not found, and the downstream honours our key → `requeue` (a repeat cannot make a second effect);
 * - not found, and the downstream enforces our absolute deadline: `requeue` once its own clock at the
 *   probe (`downstreamAt`) is past the attempt's deadline (it refuses any later request of that
 *   attempt, and any earlier one would have been found); before that, the request may still land:
 *   `unknown` (the executor that sent it is gone or late), probed again once the downstream's clock
 *   will have passed the deadline (`retryInMs`), handed to a person past the contract's
 *   `unknownDeadlineMs` like any `unknown`; without `downstreamAt`, nothing proves a late request
 *   cannot land: `unknown`;
 * - otherwise (or probe unavailable) → `mark_unknown` (or `keep` when already unknown).
 */
export function decideRecovery(
  state: OperationRecord,
  probe: ProbeOutcome,
  downstream: DownstreamGuarantees,
): RecoveryStep {
  if (probe.kind === 'found') {
    if (probe.inputDigest !== undefined && probe.inputDigest !== state.inputDigest)
      return { kind: 'mismatch', resourceId: probe.resourceId, inputDigest: probe.inputDigest };
    return { kind: 'commit', resourceId: probe.resourceId };
  }
  if (probe.kind === 'not_found') {
    if (downstream.honoursKey) return { kind: 'requeue' };
    if (downstream.enforcesDeadline && state.running !== undefined && probe.downstreamAt !== undefined) {
      const left = state.running.deadlineAt - probe.downstreamAt;
      if (left < 0) return { kind: 'requeue' };
      const retryInMs = left + RETRY_MARGIN_MS;
      return state.status === 'unknown' ? { kind: 'keep', retryInMs } : { kind: 'mark_unknown', retryInMs };
    }
  }
  return state.status === 'unknown' ? { kind: 'keep' } : { kind: 'mark_unknown' };
}

/** What the executor does with an attempt whose `running` event is stored: see {@link decideSend}. */
export type SendStep = { kind: 'send' } | { kind: 'requeue' } | { kind: 'reject' };

/**
 * Requeues of an operation after which a late start (or a late refusal) is rejected instead (not
 * applied; the caller backs off, FM-15), and after which a probe that finds nothing leaves the
 * operation `unknown` for a person instead of sending it again (FM-14).
 */
export const MAX_LATE_START_REQUEUES = 5;

/**
 * Whether an attempt still has time to be sent once its `running` event is stored. Pure.
 *
 * The attempt's absolute deadline is fixed before the append (the event carries it, and the
 * reconciler judges by it). An append that took most of the attempt's time — a stream leader
 * election while a cluster node dies or restarts (FM-29), a stalled server — leaves a request that a
 * deadline-enforcing downstream refuses as late, or that times out at once and becomes `unknown`.
 * Nothing has left yet, so the same attempt is requeued and starts again with a fresh deadline:
 * - `send` while at least half of the attempt's time (`deadlineAt - startedAt`, ms) is left at `now`;
 * - else `requeue` (the `late_start` reason), unless the operation was requeued
 *   {@link MAX_LATE_START_REQUEUES} times already: then `reject` as `dependency_unavailable` —
 *   nothing was sent, so it is definitively not applied.
 * `startedAt` and `now` are the same process's clock: no other party's clock is involved.
 */
export function decideSend(a: { startedAt: number; deadlineAt: number; now: number; requeues: number }): SendStep {
  const timeoutMs = a.deadlineAt - a.startedAt;
  if (a.deadlineAt - a.now >= timeoutMs / 2) return { kind: 'send' };
  return decideRunAgain(a.requeues);
}

/**
 * A run of which nothing was applied — stored too late to send (`late_start`), or refused by the
 * downstream as past its deadline (`refused_late`): `requeue` the same attempt, unless it was
 * requeued {@link MAX_LATE_START_REQUEUES} times already; then `reject` as `dependency_unavailable`
 * (definitively not applied; the caller backs off, FM-15). Pure.
 */
export function decideRunAgain(requeues: number): { kind: 'requeue' } | { kind: 'reject' } {
  return requeues < MAX_LATE_START_REQUEUES ? { kind: 'requeue' } : { kind: 'reject' };
}

/** How long after a running attempt's deadline the reconciler leaves it to its executor, ms (so the executor's own evidence lands first). */
export const RUNNING_GRACE_MS = 1_000;

/** Probing backoff of `unknown` operations: exponential from 1 s, capped at 60 s, with ±50 % jitter (ms). */
export function nextProbeDelayMs(failures: number, random: () => number = Math.random): number {
  const base = Math.min(60_000, 1_000 * 2 ** Math.min(failures, 6));
  return Math.round(base * (0.5 + random()));
}

/** What the reconciler's index says of a non-terminal operation (times are other processes' wall clocks, ms). */
export interface WatchedOperation {
  /** `accepted`, `running`, `unknown`, `awaiting_confirmation` or `compensation_requested`; any other status is never due. */
  status: string;
  updatedAt: number;
  runningAt?: number;
  deadlineAt?: number;
  /** A held-back operation's confirmation deadline (`awaiting_confirmation`). */
  confirmDeadlineAt?: number;
}

/**
 * Whether the reconciler looks at an operation now (docs/clocks.md). A look only schedules: what
 * is done is decided on the operation's state and, for a running or unknown one, on a probe's
 * verdict on the downstream's clock. Due when either says so:
 * - the events' own times (other processes' clocks, against `wallNow`): a clock ahead looks sooner,
 *   which is harmless;
 * - how long this process has seen the entry in its current state (`seenForMs`, monotonic): a clock
 *   behind is caught by it.
 * `accepted` beyond `runningBoundMs` (never started: requeue); `running` beyond its attempt's time
 * plus {@link RUNNING_GRACE_MS} and its `runningBoundMs`, when a probe is due; `unknown` when a
 * probe is due; `awaiting_confirmation` once its confirmation deadline has passed by `wallNow` (the
 * deadline is the contract's promise to the caller, on the wall clock: the decider judges the
 * expiry again on the command's own time, and refuses it `not_due` before); `compensation_requested`
 * beyond `runningBoundMs` (its compensation may have ended unlinked), when a look is due. Pure.
 */
export function lookDue(
  e: WatchedOperation,
  timing: { timeoutMs: number; runningBoundMs: number },
  o: { seenForMs: number; wallNow: number; probeDue: boolean },
): boolean {
  const { timeoutMs, runningBoundMs } = timing;
  switch (e.status) {
    case 'accepted':
      return o.seenForMs > runningBoundMs || o.wallNow - e.updatedAt > runningBoundMs;
    case 'running':
      return (
        o.probeDue &&
        (o.seenForMs > Math.max(timeoutMs + RUNNING_GRACE_MS, runningBoundMs) ||
          o.wallNow > Math.max((e.deadlineAt ?? 0) + RUNNING_GRACE_MS, (e.runningAt ?? e.updatedAt) + runningBoundMs))
      );
    case 'unknown':
      return o.probeDue;
    case 'awaiting_confirmation':
      return e.confirmDeadlineAt !== undefined && o.wallNow >= e.confirmDeadlineAt;
    case 'compensation_requested':
      // Its compensation registers and ends on its own path; looked at once that had time to, then
      // on the sweep's backoff.
      return o.probeDue && (o.seenForMs > runningBoundMs || o.wallNow - e.updatedAt > runningBoundMs);
    default:
      return false;
  }
}

/**
 * Whether an `unknown` operation goes to a person (FM-14): still unknown after this process has
 * seen it so for longer than the contract's `unknownDeadlineMs` (monotonic: a clock ahead never
 * calls a person early; after a restart the wait starts again). Pure.
 */
export function takeoverDue(status: OperationRecord['status'], seenForMs: number, unknownDeadlineMs: number): boolean {
  return status === 'unknown' && seenForMs > unknownDeadlineMs;
}

/** What every takeover record names of its operation: where it lives and digests of what it was asked. */
function takeoverIdentityOf(state: OperationRecord) {
  return {
    operationKey: state.operationKey,
    tenant: state.tenant,
    taskId: state.taskId,
    tool: state.tool,
    version: state.version,
    targetDigest: state.targetDigest,
    inputDigest: state.inputDigest,
  };
}

/**
 * The takeover record of an `unknown` operation handed to a person (FM-14): what is known of it —
 * its target, its last evidence, what a probe found under our key, its attempts and times. Pure.
 */
export function takeoverRecordOf(
  state: OperationRecord,
  why: { reason: TakeoverRecord['reason']; probes: number; probed?: TakeoverRecord['probed'] },
  openedAt: number,
): TakeoverRecord {
  return {
    ...takeoverIdentityOf(state),
    reason: why.reason,
    ...(state.evidence ? { lastEvidence: state.evidence } : {}),
    ...(why.probed ? { probed: why.probed } : {}),
    attempts: { attempt: state.attempt, requeues: state.requeues ?? 0, probes: why.probes },
    times: {
      acceptedAt: state.acceptedAt,
      ...(state.running ? { runningAt: state.running.at } : {}),
      ...(state.evidence ? { unknownSince: state.evidence.at } : {}),
      openedAt,
    },
  };
}

/**
 * The takeover record of a committed original whose compensation failed (FM-20), written in the
 * same append as `compensation_failed`: what a person needs to decide — the original's receipt
 * reference (never its body), the compensation's key and contract, how it failed, its error class
 * and its last evidence. Pure.
 */
export function compensationTakeoverRecordOf(
  state: OperationRecord,
  failure: { kind: 'rejected' | 'taken_over'; error?: ErrorInfo; evidence?: Evidence },
  openedAt: number,
): TakeoverRecord {
  const r = state.receipt;
  const link = state.compensation;
  return {
    ...takeoverIdentityOf(state),
    reason: 'compensation_failed',
    ...(failure.evidence ? { lastEvidence: failure.evidence } : {}),
    ...(r
      ? {
          receipt: {
            operationKey: r.operationKey,
            resourceId: r.resourceId,
            committedAt: r.committedAt,
            resultDigest: r.resultDigest,
            keyId: r.keyId,
            signature: r.signature,
          },
        }
      : {}),
    ...(link
      ? {
          compensation: {
            operationKey: link.operationKey,
            tool: link.tool,
            version: link.version,
            kind: failure.kind,
            ...(failure.error ? { error: failure.error } : {}),
            ...(failure.evidence ? { evidence: failure.evidence } : {}),
          },
        }
      : {}),
    attempts: { attempt: state.attempt, requeues: state.requeues ?? 0, probes: 0 },
    times: {
      acceptedAt: state.acceptedAt,
      ...(state.running ? { runningAt: state.running.at } : {}),
      openedAt,
    },
  };
}

/**
 * A person's resolution of the failed compensation of `state` (FM-20), or undefined when none was
 * recorded. A resolution of the original's own unknown outcome (`committed`) is not one. Pure.
 */
export function compensationResolutionOf(state: OperationState): CompensationResolutionOutcome | undefined {
  if (state.status !== 'compensation_failed') return undefined;
  const o = state.resolution?.outcome;
  return o === 'effect_kept' || o === 'undone_by_hand' ? o : undefined;
}

/**
 * Whether `state` holds a takeover a person has not resolved yet (FM-14, FM-20): `unknown` under
 * takeover, or `compensation_failed` without a person's resolution. What the reconciler's index
 * keeps for `tooltx takeover list` and what backs a freeze of the task. Pure.
 */
export function openTakeoverOf(state: OperationState): TakeoverRecord | undefined {
  if (state.status === 'unknown') return state.takeover;
  if (state.status === 'compensation_failed' && !compensationResolutionOf(state))
    return state.takeover?.reason === 'compensation_failed' ? state.takeover : undefined;
  return undefined;
}

/**
 * Whether a takeover can be opened on `state` (FM-14): `open` when it is `unknown` with none open,
 * `already` when one is open, `not_unknown` otherwise (only an unknown outcome goes to a person). The
 * task is frozen before the takeover is appended, so this is asked before anything is written. Pure.
 */
export function takeoverOpenable(state: OperationState): 'open' | 'already' | 'not_unknown' {
  if (state.status !== 'unknown') return 'not_unknown';
  return state.takeover ? 'already' : 'open';
}

/**
 * Whether an open takeover backs a freeze of the operation's task: it is `unknown` and handed to a
 * person (FM-14), or its compensation failed and no person resolved that yet (FM-20; also when the
 * failure predates its takeover record). Pure.
 */
export function freezeBacked(state: OperationState): boolean {
  return (
    (state.status === 'unknown' && state.takeover !== undefined) ||
    (state.status === 'compensation_failed' && !compensationResolutionOf(state))
  );
}

/** What a person may decide about a failed compensation (FM-20). */
export type CompensationResolutionOutcome = 'effect_kept' | 'undone_by_hand';

/**
 * A person's resolution of a takeover: what the operator asked — `committed` or `not_applied` for an
 * unknown operation (FM-14), `effect_kept` or `undone_by_hand` for a failed compensation (FM-20).
 */
export type ResolutionOutcome =
  | { kind: 'committed'; resourceId: string }
  | { kind: 'not_applied' }
  | { kind: CompensationResolutionOutcome };

/**
 * What a person's resolution does to `state` (FM-14, FM-20):
 * - `already`: the same resolution was recorded (a repeat answers the state);
 * - `resolve`: an `unknown` operation resolved `committed` or `not_applied`;
 * - `resolve_compensation`: a `compensation_failed` one, not resolved yet, resolved `effect_kept`
 *   or `undone_by_hand`;
 * - `outcome_mismatch`: an outcome that does not fit the takeover (an unknown outcome's on a failed
 *   compensation, or the other way round): refused as invalid input at `outcome.kind`;
 * - `not_unknown`: nothing (else) to resolve — refused as an idempotency conflict. Pure.
 */
export function resolutionVerdict(
  state: OperationState,
  outcome: ResolutionOutcome,
): 'already' | 'resolve' | 'resolve_compensation' | 'outcome_mismatch' | 'not_unknown' {
  if (state.status === 'compensation_failed') {
    if (outcome.kind !== 'effect_kept' && outcome.kind !== 'undone_by_hand') return 'outcome_mismatch';
    const recorded = compensationResolutionOf(state);
    if (recorded) return recorded === outcome.kind ? 'already' : 'not_unknown';
    return 'resolve_compensation';
  }
  if (
    state.status !== 'none' &&
    state.resolution?.outcome === outcome.kind &&
    (outcome.kind !== 'committed' || state.receipt?.resourceId === outcome.resourceId)
  )
    return 'already';
  if (state.status !== 'unknown') return 'not_unknown';
  return outcome.kind === 'committed' || outcome.kind === 'not_applied' ? 'resolve' : 'outcome_mismatch';
}

/** What a recovery may learn of the downstream: a probe's outcome, or that the contract has no probe. */
export type RecoveryInput = ProbeOutcome | { kind: 'no_probe' };

/**
 * What recovery does with an operation whose attempt may or may not have reached the downstream
 * (FM-12, FM-13, FM-19, FM-27): the whole verdict, so the shell only carries it out.
 * - `commit` with the resource id the probe found (only for a receipt-only result: a probe cannot
 *   recover a business result);
 * - `requeue`: run the same attempt again under the same key;
 * - `unknown`: nothing proves the outcome. `markEvidence` is set when the operation is still
 *   `running`: append `mark_unknown` with that evidence; otherwise it stays `unknown`. `reason`:
 *   `unresolved` (the probe proved nothing yet; `retryInMs` as in {@link decideRecovery}),
 *   `no_probe` (the contract has none: a person decides), `result_not_recoverable` (the effect is
 *   there but its result cannot be rebuilt: a person decides), `mismatch` (another effect under
 *   our key: a person takes over at once, `probed` names it), `requeue_limit` (the probe found
 *   nothing again, but the attempt was requeued {@link MAX_LATE_START_REQUEUES} times already: it
 *   stays `unknown` and goes to a person past its `unknownDeadlineMs`, FM-14).
 */
export type RecoveryPlan =
  | { kind: 'commit'; resourceId: string }
  | { kind: 'requeue' }
  | {
      kind: 'unknown';
      reason: 'unresolved' | 'no_probe' | 'result_not_recoverable' | 'mismatch' | 'requeue_limit';
      markEvidence?: Evidence['kind'];
      retryInMs?: number;
      probed?: { resourceId: string; inputDigest: string };
    };

/**
 * The recovery verdict ({@link RecoveryPlan}) for `state` from what was learned of the downstream.
 * `receiptOnly`: whether the contract's result is its receipt (FM-19, {@link receiptOnlyResult}). Pure.
 */
export function planRecovery(
  state: OperationRecord,
  input: RecoveryInput,
  c: { downstream: DownstreamGuarantees; receiptOnly: boolean },
): RecoveryPlan {
  const running = state.status === 'running';
  const mark = (kind: Evidence['kind']) => (running ? { markEvidence: kind } : {});
  if (input.kind === 'no_probe') return { kind: 'unknown', reason: 'no_probe', ...mark('executor_lost') };
  const step = decideRecovery(state, input, c.downstream);
  switch (step.kind) {
    case 'mismatch':
      return {
        kind: 'unknown',
        reason: 'mismatch',
        ...mark('probe'),
        probed: { resourceId: step.resourceId, inputDigest: step.inputDigest },
      };
    case 'commit':
      return c.receiptOnly
        ? { kind: 'commit', resourceId: step.resourceId }
        : { kind: 'unknown', reason: 'result_not_recoverable', ...mark('probe') };
    case 'requeue':
      // A downstream that takes requests and never applies them (a black hole before it) would
      // otherwise be sent the same attempt forever: after the bound, a person decides (FM-14).
      return decideRunAgain(state.requeues ?? 0).kind === 'requeue'
        ? { kind: 'requeue' }
        : { kind: 'unknown', reason: 'requeue_limit', ...mark('probe') };
    case 'mark_unknown':
    case 'keep':
      return {
        kind: 'unknown',
        reason: 'unresolved',
        ...mark(input.kind === 'unavailable' ? 'probe' : 'executor_lost'),
        ...(step.retryInMs !== undefined ? { retryInMs: step.retryInMs } : {}),
      };
  }
}

/** What the reconciler's sweep does with a watched operation once it has read it ({@link sweepAction}). */
export type SweepAction =
  /** Nothing: not registered, a person's (under takeover), or the index lags (the next sweep looks again). */
  | 'skip'
  /** The operation ended but its index entry stayed open: close the entry. */
  | 'close_entry'
  /** Accepted and never started within its bound: requeue it (`stale_accepted`). */
  | 'requeue_stale'
  /** Running past its time or unknown: verify it (probe, {@link planRecovery}). */
  | 'verify'
  /** Held back past its confirmation deadline: end it `rolled_back` (`expire_confirmation`), nothing sent. */
  | 'expire_confirmation'
  /** Being compensated: read its compensation and settle it (`compensationSettlement`). */
  | 'settle_compensation';

/**
 * The sweep's action for an index entry (`entry`: its status and the sequence it was written at)
 * and the operation as read now (`state` at `seq`). Pure.
 */
export function sweepAction(entry: { status: string; seq: number }, state: OperationState, seq: number): SweepAction {
  if (state.status === 'none') return 'skip';
  if (attemptEnded(state.status) && seq > entry.seq) return 'close_entry';
  if (state.status !== entry.status) return 'skip';
  if (state.status === 'accepted') return 'requeue_stale';
  if (state.status === 'awaiting_confirmation') return 'expire_confirmation';
  if (state.status === 'compensation_requested') return 'settle_compensation';
  if (state.takeover) return 'skip';
  return state.status === 'running' || state.status === 'unknown' ? 'verify' : 'skip';
}

/**
 * The next probe of an operation a verification left unresolved, ms from now: the exponential
 * backoff ({@link nextProbeDelayMs}) after `failures` unresolved probes — or sooner, when the
 * downstream's clock said when the attempt's request can no longer land (`retryInMs`), or when the
 * operation's unknown deadline falls before it (`untilDeadlineMs`, the time left until then): the
 * last probe comes just past the deadline, and the takeover it calls for (FM-14) opens then rather
 * than at whatever later probe the backoff would have picked (up to a minute late). Pure but for the
 * jitter's `random`.
 */
export function nextProbeInMs(
  failures: number,
  bounds: { retryInMs?: number; untilDeadlineMs?: number } = {},
  random: () => number = Math.random,
): number {
  const { retryInMs, untilDeadlineMs } = bounds;
  const deadline = untilDeadlineMs === undefined || untilDeadlineMs < 0 ? Infinity : untilDeadlineMs + 1;
  return Math.min(retryInMs ?? Infinity, deadline, nextProbeDelayMs(failures, random));
}
