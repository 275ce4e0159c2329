import type { EffectClass, ErrorInfo } from '@tooltx/contracts';
import {
  EVENT_SCHEMA_VERSION,
  eventCountOf,
  RECEIPT_SCHEMA_VERSION,
  type AuthDecision,
  type Evidence,
  type OperationEvent,
  type OperationRecord,
  type OperationState,
  type Receipt,
  type Requester,
  type TakeoverRecord,
} from './events.js';
import { compensationResolutionOf, compensationTakeoverRecordOf } from './recovery.js';
import type { ReceiptSigner, UnsignedReceipt } from './signing.js';
import { isAllowedTransition, TRANSITIONS, type Transition } from './transitions.js';

/** What a decision may need besides the command and the state: the signer of receipts. */
export interface DecideContext {
  /** Required for `commit` and a committed `resolve`: signs the receipt the event carries. */
  signer?: ReceiptSigner;
  /** The allowed transitions (default {@link TRANSITIONS}, the one table; a test may narrow it). */
  transitions?: readonly Transition[];
}

/**
 * The operation aggregate as a pure decider (decide / evolve / initialState): no clock, no I/O.
 * Times and event ids come in with the command. Every write goes through the one command handler
 * (handler.ts, `handleCommand`): load the operation's last event → decide → append under the
 * sequence it was decided on → on a lost race, again; the services consume, build a command, hand
 * it to the handler and settle the message.
 *
 * Rules (docs/lifecycle.md):
 * - `committed` is final; every replay of the key returns the original receipt.
 * - `rejected` is definitively not applied: the identical input may start a new attempt.
 * - `unknown` is never re-executed by a resubmission.
 * - The same key with another input digest is an explicit conflict, in every state.
 * - A held-back attempt never starts before it is confirmed; confirming twice is one run; a
 *   discarded or expired one is final (`rolled_back`) and is never confirmed.
 * - A compensation never touches the original's receipt; the original leaves `committed` only for
 *   `compensation_requested`, and one compensation is the only one it ever has.
 */

export interface AcceptCommand {
  type: 'accept';
  eventId: string;
  at: number;
  operationKey: string;
  tenant: string;
  actor: string;
  taskId: string;
  tool: string;
  version: number;
  contractDigest: string;
  effect: EffectClass;
  inputDigest: string;
  targetDigest: string;
  intentSeq: number;
  submissionId: string;
  /** The submission's own key and input digest, when it named the target through an alias (FM-10). */
  submitted?: { operationKey: string; inputDigest: string };
  /** The intake decision (policy seam) that allowed this attempt. */
  authorization?: AuthDecision;
  /**
   * Accept and start in one append: the process that accepts the attempt runs it at once (the
   * co-located layout). The state becomes `running` with this event as its run; `authorization` is
   * the decision at the execution instant (docs/lifecycle.md "Accepted and started").
   */
  start?: { executor: string; deadlineAt: number; authorization?: AuthDecision };
  /**
   * Its contract declares `confirm`: the attempt may not start before a confirmation (`start`, and
   * an accept with `start`, are skipped `not_confirmed`).
   */
  awaitsConfirmation?: true;
  /** The operation is a compensation of this original (it is then never compensated in turn). */
  compensates?: { operationKey: string; tool: string; version: number };
  /**
   * W3C `traceparent` of the span that accepted this attempt (docs/tracing.md), when tracing is on:
   * the executor's span of the attempt is its child wherever and whenever it runs.
   */
  traceparent?: string;
}
export interface StartCommand {
  type: 'start';
  eventId: string;
  at: number;
  attempt: number;
  executor: string;
  deadlineAt: number;
  /** The decision re-computed at the execution instant. */
  authorization?: AuthDecision;
}
/**
 * `runId` binds an outcome to the run that produced it: the event id of the `running` it followed.
 * A requeued attempt runs again under the same attempt number, so an outcome of the earlier run
 * that arrives late (a refusal, a commit, a timeout) must not be applied to the new run.
 */
export interface CommitCommand {
  type: 'commit';
  eventId: string;
  at: number;
  attempt: number;
  /**
   * @deprecated Ignored: the receipt binds the operation's own event count (format 2,
   * docs/lifecycle.md "Receipt formats"), never a stream sequence. Accepted so callers that still
   * pass it compile; leave it out.
   */
  prevSeq?: number;
  runId?: string;
  resourceId: string;
  resultDigest: string;
}
export interface RejectCommand {
  type: 'reject';
  eventId: string;
  at: number;
  attempt: number;
  /** Set when the refusal came from a run (the downstream refused it); see {@link CommitCommand}. */
  runId?: string;
  error: ErrorInfo;
  /** Set when the rejection is an authorisation denial at the execution instant. */
  authorization?: AuthDecision;
}
export interface MarkUnknownCommand {
  type: 'mark_unknown';
  eventId: string;
  at: number;
  attempt: number;
  runId?: string;
  evidence: Evidence;
}
export interface RequeueCommand {
  type: 'requeue';
  eventId: string;
  at: number;
  attempt: number;
  /**
   * `stale_accepted`: accepted and never started (reconciler); `probe_not_found`: running or unknown
   * and the probe found nothing where a repeat is safe (reconciler); `late_start`: running, stored
   * too late to be sent, nothing sent (executor, decideSend); `refused_late`: running, and the
   * downstream refused the run's request as past its deadline by its own clock — not applied
   * (executor, `DeadlinePassedError`).
   */
  reason: 'probe_not_found' | 'stale_accepted' | 'late_start' | 'refused_late';
  /**
   * The run being requeued (its `running` event id): a requeue decided about one run never applies
   * to a later run of the same attempt, which may already have sent its request. Required for
   * `late_start` and `refused_late`; the reconciler's `probe_not_found` names the run it probed.
   */
  runId?: string;
}
/** Hand the operation over to a person (FM-14): only from `unknown`, once. */
export interface OpenTakeoverCommand {
  type: 'open_takeover';
  eventId: string;
  at: number;
  attempt: number;
  takeover: TakeoverRecord;
}
/**
 * A person's resolution: `committed` with the resource id they verified, or
 * `not_applied`. Only from `unknown` (with or without an open takeover); the event carries
 * `manual: true` and `resolvedBy`.
 */
export interface ResolveCommand {
  type: 'resolve';
  eventId: string;
  at: number;
  attempt: number;
  /** @deprecated Ignored, as {@link CommitCommand.prevSeq}. */
  prevSeq?: number;
  resolvedBy: string;
  outcome: { kind: 'committed'; resourceId: string; resultDigest: string } | { kind: 'not_applied' };
}
/**
 * A held-back attempt waits for its confirmation until `deadlineAt` (the hold's time plus the
 * contract's `confirm.deadlineMs`): only from `accepted`, of an attempt that awaits confirmation and
 * is not confirmed yet. `previewDigest`: the digest of its prepare step's result, when it ran.
 */
export interface AwaitConfirmationCommand {
  type: 'await_confirmation';
  eventId: string;
  at: number;
  attempt: number;
  deadlineAt: number;
  previewDigest?: string;
}
/**
 * Release a held-back attempt. A second confirm of an attempt already confirmed (accepted, running
 * or ended since) is a `replay`: one run. After a discard or the deadline it is skipped `discarded`
 * (`operation_discarded`, {@link confirmVerdict}); a confirm that arrives after the deadline while
 * the attempt still waits ends it `rolled_back` (`confirmation_expired`) instead of running it.
 * `start`: release and start in one append, as an accept's.
 */
export interface ConfirmCommand {
  type: 'confirm';
  eventId: string;
  at: number;
  by: Requester;
  /** The attempt the caller saw held; absent = the current one. */
  attempt?: number;
  start?: { executor: string; deadlineAt: number; authorization?: AuthDecision };
}
/** Drop a held-back attempt before it ran: `rolled_back`. A second discard is a `replay`. */
export interface DiscardCommand {
  type: 'discard';
  eventId: string;
  at: number;
  by: Requester;
  attempt?: number;
}
/** The confirmation deadline passed (the reconciler): `rolled_back`. Skipped `not_due` before it. */
export interface ExpireConfirmationCommand {
  type: 'expire_confirmation';
  eventId: string;
  at: number;
  attempt: number;
}
/**
 * Record on the committed original that its compensation is registered. A repeat naming the same
 * compensation while it runs or after it ended is a `replay`; another compensation is skipped
 * `compensation_differs`. The pure refusal rules that come first (declaration, allowed states,
 * deadline) are {@link compensationVerdict}'s. `compensation.attempt`: the compensation's attempt
 * this request registers (`compensationAttemptFor`).
 */
export interface RequestCompensationCommand {
  type: 'request_compensation';
  eventId: string;
  at: number;
  compensation: { operationKey: string; tool: string; version: number; attempt?: number };
  requestedBy: Requester;
  reasonDigest: string;
}
/** The compensation committed: `receipt` is its own (its `operationKey` is the compensation's). */
export interface CompleteCompensationCommand {
  type: 'complete_compensation';
  eventId: string;
  at: number;
  compensationKey: string;
  /** The compensation's attempt this outcome is of: another attempt's than the request registered is skipped. */
  compensationAttempt?: number;
  receipt: Receipt;
}
/**
 * The compensation failed: refused after it ran (`rejected`, with its error), or its unknown
 * outcome was handed to a person (`taken_over`, with its last evidence). The event carries the
 * takeover record a person resolves (FM-20), built from the original's state and this failure, so
 * nothing can come between the failure and its takeover.
 */
export interface FailCompensationCommand {
  type: 'fail_compensation';
  eventId: string;
  at: number;
  compensationKey: string;
  compensationAttempt?: number;
  kind: 'rejected' | 'taken_over';
  error?: ErrorInfo;
  evidence?: Evidence;
}
/**
 * A person's resolution of a failed compensation (FM-20): `effect_kept` or `undone_by_hand`. Only
 * from `compensation_failed`; the status stays, the receipt stays, the resolution is recorded with
 * `manual: true` and `resolvedBy`. The same resolution again is a `replay`; another one after it is
 * skipped `resolved`.
 */
export interface ResolveCompensationFailureCommand {
  type: 'resolve_compensation_failure';
  eventId: string;
  at: number;
  resolvedBy: string;
  outcome: 'effect_kept' | 'undone_by_hand';
}
/** The compensation was refused before it ran: the original is `committed` again, the refusal recorded. */
export interface RefuseCompensationCommand {
  type: 'refuse_compensation';
  eventId: string;
  at: number;
  compensationKey: string;
  compensationAttempt?: number;
  error: ErrorInfo;
}
export type OperationCommand =
  | AcceptCommand
  | StartCommand
  | CommitCommand
  | RejectCommand
  | MarkUnknownCommand
  | RequeueCommand
  | OpenTakeoverCommand
  | ResolveCommand
  | AwaitConfirmationCommand
  | ConfirmCommand
  | DiscardCommand
  | ExpireConfirmationCommand
  | RequestCompensationCommand
  | CompleteCompensationCommand
  | FailCompensationCommand
  | RefuseCompensationCommand
  | ResolveCompensationFailureCommand;

/** What the shell must do after a decision. */
export type Decision =
  /** Append this event with the expected last subject sequence of the state it was decided on. */
  | { kind: 'append'; event: OperationEvent }
  /** This command's own event is already the state (a retried append that had landed). */
  | { kind: 'applied'; state: OperationRecord }
  /** Known key, same input: nothing new; answer with the current state (and receipt when committed). */
  | { kind: 'replay'; state: OperationRecord }
  /** Known key, different input digest: `idempotency_conflict`; the operation stays untouched. */
  | { kind: 'conflict'; state: OperationRecord }
  /** The command does not apply to the current state (e.g. another executor already runs it). */
  | { kind: 'skip'; reason: SkipReason; state: OperationState };

export type SkipReason =
  | 'not_registered'
  | 'not_accepted'
  | 'attempt_mismatch'
  | 'not_running'
  | 'final'
  | 'stale_run'
  | 'not_unknown'
  | 'taken_over'
  | 'not_allowed'
  /** A held-back attempt that is not confirmed yet may not start. */
  | 'not_confirmed'
  /** Confirm, discard or await_confirmation of an attempt that does not (or no longer) wait for one. */
  | 'not_awaiting'
  /** Confirm of a held-back attempt that was discarded or expired (`rolled_back`). */
  | 'discarded'
  /** Discard of a held-back attempt already confirmed. */
  | 'confirmed'
  /** expire_confirmation before the deadline. */
  | 'not_due'
  /** A compensation asked of an operation that is not committed (nor being compensated). */
  | 'not_committed'
  /** A compensation asked of an operation that is itself a compensation. */
  | 'is_compensation'
  /** Another compensation than the one registered (request), or an outcome of another one. */
  | 'compensation_differs'
  /** A compensation outcome while no compensation runs. */
  | 'not_compensating'
  /** A resolution of a failed compensation on an operation whose compensation did not fail. */
  | 'not_compensation_failed'
  /** Another resolution than the one a person already recorded. */
  | 'resolved';

export function initialState(): OperationState {
  return { status: 'none' };
}

/**
 * Decides `cmd` on `state`. Throws `Error` when a commit is decided without `ctx.signer` (a
 * receipt is never unsigned). An append whose `from → to` under its event type is not a row of the
 * transition table (transitions.ts, docs/lifecycle.md) is refused here, in one place: `skip`
 * with reason `not_allowed`, nothing appended.
 */
export function decide(cmd: OperationCommand, state: OperationState, ctx: DecideContext = {}): Decision {
  const d = decideCommand(cmd, state, ctx);
  if (
    d.kind === 'append' &&
    !isAllowedTransition(state.status, d.event.type, d.event.state.status, ctx.transitions ?? TRANSITIONS)
  ) {
    return { kind: 'skip', reason: 'not_allowed', state };
  }
  return d;
}

function decideCommand(cmd: OperationCommand, state: OperationState, ctx: DecideContext): Decision {
  if (state.status !== 'none' && state.lastEventId === cmd.eventId) return { kind: 'applied', state };
  if ('runId' in cmd && cmd.runId !== undefined && state.status !== 'none' && state.running?.eventId !== cmd.runId) {
    return { kind: 'skip', reason: 'stale_run', state };
  }
  switch (cmd.type) {
    case 'accept':
      return decideAccept(cmd, state);
    case 'start': {
      if (state.status === 'none') return { kind: 'skip', reason: 'not_registered', state };
      if (state.attempt !== cmd.attempt) return { kind: 'skip', reason: 'attempt_mismatch', state };
      if (state.status !== 'accepted') return { kind: 'skip', reason: 'not_accepted', state };
      if (state.confirmation && !state.confirmation.confirmed) return { kind: 'skip', reason: 'not_confirmed', state };
      return append(state, {
        type: 'running',
        eventId: cmd.eventId,
        at: cmd.at,
        attempt: cmd.attempt,
        executor: cmd.executor,
        deadlineAt: cmd.deadlineAt,
        ...(cmd.authorization ? { authorization: cmd.authorization } : {}),
      });
    }
    case 'open_takeover': {
      const s = requireRunning(state, cmd.attempt, ['unknown']);
      if (s.kind === 'skip') return s.reason === 'not_running' ? { ...s, reason: 'not_unknown' } : s;
      if (s.state.takeover) return { kind: 'skip', reason: 'taken_over', state };
      return append(s.state, {
        type: 'takeover',
        eventId: cmd.eventId,
        at: cmd.at,
        attempt: cmd.attempt,
        takeover: cmd.takeover,
      });
    }
    case 'resolve': {
      const s = requireRunning(state, cmd.attempt, ['unknown']);
      if (s.kind === 'skip') return s.reason === 'not_running' ? { ...s, reason: 'not_unknown' } : s;
      const manual = { manual: true as const, resolvedBy: cmd.resolvedBy };
      if (cmd.outcome.kind === 'not_applied') {
        return append(s.state, {
          type: 'rejected',
          eventId: cmd.eventId,
          at: cmd.at,
          attempt: cmd.attempt,
          error: { class: 'not_applied' },
          ...manual,
        });
      }
      const receipt = signedReceipt(ctx, s.state, { at: cmd.at, attempt: cmd.attempt, ...cmd.outcome }, manual);
      return append(s.state, {
        type: 'committed',
        eventId: cmd.eventId,
        at: cmd.at,
        attempt: cmd.attempt,
        receipt,
        ...manual,
      });
    }
    case 'commit': {
      // From `running`, or from `unknown` once a probe found the effect — never once a
      // person has taken it over (their resolution decides).
      const s = requireRunning(state, cmd.attempt, ['running', 'unknown']);
      if (s.kind === 'skip') return s;
      if (s.state.takeover) return { kind: 'skip', reason: 'taken_over', state };
      const receipt = signedReceipt(ctx, s.state, cmd);
      return append(s.state, { type: 'committed', eventId: cmd.eventId, at: cmd.at, attempt: cmd.attempt, receipt });
    }
    case 'reject': {
      // Rejection is allowed from `accepted` (the executor's re-check refused) and from `running`
      // (the downstream definitively refused). Never from `unknown` or a final state.
      if (state.status === 'none') return { kind: 'skip', reason: 'not_registered', state };
      if (state.attempt !== cmd.attempt) return { kind: 'skip', reason: 'attempt_mismatch', state };
      if (state.status !== 'accepted' && state.status !== 'running') return { kind: 'skip', reason: 'final', state };
      return append(state, {
        type: 'rejected',
        eventId: cmd.eventId,
        at: cmd.at,
        attempt: cmd.attempt,
        error: cmd.error,
        ...(cmd.authorization ? { authorization: cmd.authorization } : {}),
      });
    }
    case 'mark_unknown': {
      const s = requireRunning(state, cmd.attempt);
      if (s.kind === 'skip') return s;
      return append(s.state, {
        type: 'unknown',
        eventId: cmd.eventId,
        at: cmd.at,
        attempt: cmd.attempt,
        evidence: cmd.evidence,
      });
    }
    case 'requeue': {
      if (state.status === 'none') return { kind: 'skip', reason: 'not_registered', state };
      if (state.attempt !== cmd.attempt) return { kind: 'skip', reason: 'attempt_mismatch', state };
      const ofOneRun = cmd.reason === 'late_start' || cmd.reason === 'refused_late';
      if (ofOneRun && cmd.runId === undefined) return { kind: 'skip', reason: 'stale_run', state };
      const from = cmd.reason === 'stale_accepted' ? ['accepted'] : ofOneRun ? ['running'] : ['running', 'unknown'];
      if (!from.includes(state.status)) return { kind: 'skip', reason: 'not_running', state };
      if (state.takeover) return { kind: 'skip', reason: 'taken_over', state };
      return append(state, {
        type: 'requeued',
        eventId: cmd.eventId,
        at: cmd.at,
        attempt: cmd.attempt,
        reason: cmd.reason,
      });
    }
    case 'await_confirmation': {
      const s = requireRunning(state, cmd.attempt, ['accepted']);
      if (s.kind === 'skip') return s.reason === 'not_running' ? { ...s, reason: 'not_accepted' } : s;
      const c = s.state.confirmation;
      if (!c || c.confirmed || c.heldAt !== undefined) return { kind: 'skip', reason: 'not_awaiting', state };
      return append(s.state, {
        type: 'awaiting_confirmation',
        eventId: cmd.eventId,
        at: cmd.at,
        attempt: cmd.attempt,
        deadlineAt: cmd.deadlineAt,
        ...(cmd.previewDigest ? { previewDigest: cmd.previewDigest } : {}),
      });
    }
    case 'confirm': {
      if (state.status === 'none') return { kind: 'skip', reason: 'not_registered', state };
      if (cmd.attempt !== undefined && cmd.attempt !== state.attempt)
        return { kind: 'skip', reason: 'attempt_mismatch', state };
      if (state.confirmation?.confirmed) return { kind: 'replay', state };
      if (state.status === 'rolled_back') return { kind: 'skip', reason: 'discarded', state };
      if (state.status !== 'awaiting_confirmation') return { kind: 'skip', reason: 'not_awaiting', state };
      if (cmd.at >= (state.confirmation?.deadlineAt ?? Number.POSITIVE_INFINITY)) {
        // Too late: the hold ends here, and nothing runs — the deadline is the contract's promise.
        return append(state, {
          type: 'confirmation_expired',
          eventId: cmd.eventId,
          at: cmd.at,
          attempt: state.attempt,
        });
      }
      return append(state, {
        type: 'confirmed',
        eventId: cmd.eventId,
        at: cmd.at,
        attempt: state.attempt,
        by: cmd.by,
        ...(cmd.start ? { started: cmd.start } : {}),
      });
    }
    case 'discard': {
      if (state.status === 'none') return { kind: 'skip', reason: 'not_registered', state };
      if (cmd.attempt !== undefined && cmd.attempt !== state.attempt)
        return { kind: 'skip', reason: 'attempt_mismatch', state };
      if (state.status === 'rolled_back') return { kind: 'replay', state };
      if (state.confirmation?.confirmed) return { kind: 'skip', reason: 'confirmed', state };
      if (state.status !== 'awaiting_confirmation') return { kind: 'skip', reason: 'not_awaiting', state };
      return append(state, { type: 'discarded', eventId: cmd.eventId, at: cmd.at, attempt: state.attempt, by: cmd.by });
    }
    case 'expire_confirmation': {
      const s = requireRunning(state, cmd.attempt, ['awaiting_confirmation']);
      if (s.kind === 'skip') return s.reason === 'not_running' ? { ...s, reason: 'not_awaiting' } : s;
      if (cmd.at < (s.state.confirmation?.deadlineAt ?? Number.POSITIVE_INFINITY))
        return { kind: 'skip', reason: 'not_due', state };
      return append(s.state, { type: 'confirmation_expired', eventId: cmd.eventId, at: cmd.at, attempt: cmd.attempt });
    }
    case 'request_compensation': {
      if (state.status === 'none') return { kind: 'skip', reason: 'not_registered', state };
      if (state.compensates) return { kind: 'skip', reason: 'is_compensation', state };
      if (isCompensationStatus(state.status)) {
        // The same compensation again is that one operation (FM-21); another one is never started (FM-22).
        return state.compensation?.operationKey === cmd.compensation.operationKey
          ? { kind: 'replay', state }
          : { kind: 'skip', reason: 'compensation_differs', state };
      }
      if (state.status !== 'committed') return { kind: 'skip', reason: 'not_committed', state };
      return append(state, {
        type: 'compensation_requested',
        eventId: cmd.eventId,
        at: cmd.at,
        attempt: state.attempt,
        compensation: { ...cmd.compensation, requestedBy: cmd.requestedBy, reasonDigest: cmd.reasonDigest },
      });
    }
    case 'complete_compensation':
    case 'fail_compensation':
    case 'refuse_compensation': {
      if (state.status === 'none') return { kind: 'skip', reason: 'not_registered', state };
      if (state.status === 'compensated' || state.status === 'compensation_failed')
        return { kind: 'skip', reason: 'final', state };
      if (state.status !== 'compensation_requested') return { kind: 'skip', reason: 'not_compensating', state };
      const key = state.compensation?.operationKey;
      if (key !== cmd.compensationKey) return { kind: 'skip', reason: 'compensation_differs', state };
      // Only the attempt this request registered moves the original: a late outcome of an earlier
      // attempt (refused before it ran, the original committed again and asked anew) is not its own.
      const linked = state.compensation?.attempt;
      if (linked !== undefined && cmd.compensationAttempt !== undefined && cmd.compensationAttempt !== linked)
        return { kind: 'skip', reason: 'attempt_mismatch', state };
      const head = { eventId: cmd.eventId, at: cmd.at, attempt: state.attempt };
      if (cmd.type === 'complete_compensation') {
        if (cmd.receipt.operationKey !== key) return { kind: 'skip', reason: 'compensation_differs', state };
        return append(state, {
          type: 'compensated',
          ...head,
          compensation: { operationKey: key, receipt: cmd.receipt },
        });
      }
      if (cmd.type === 'fail_compensation') {
        const failure = {
          kind: cmd.kind,
          ...(cmd.error ? { error: cmd.error } : {}),
          ...(cmd.evidence ? { evidence: cmd.evidence } : {}),
        };
        return append(state, {
          type: 'compensation_failed',
          ...head,
          compensation: { operationKey: key, ...failure },
          takeover: compensationTakeoverRecordOf(state, failure, cmd.at),
        });
      }
      return append(state, {
        type: 'compensation_refused',
        ...head,
        compensation: { operationKey: key, error: cmd.error },
      });
    }
    case 'resolve_compensation_failure': {
      if (state.status === 'none') return { kind: 'skip', reason: 'not_registered', state };
      if (state.status !== 'compensation_failed') return { kind: 'skip', reason: 'not_compensation_failed', state };
      // An earlier resolution of the original's own unknown outcome (`committed`) is not this one.
      const earlier = compensationResolutionOf(state);
      if (earlier)
        return earlier === cmd.outcome ? { kind: 'replay', state } : { kind: 'skip', reason: 'resolved', state };
      return append(state, {
        type: 'compensation_failure_resolved',
        eventId: cmd.eventId,
        at: cmd.at,
        attempt: state.attempt,
        outcome: cmd.outcome,
        manual: true,
        resolvedBy: cmd.resolvedBy,
      });
    }
  }
}

/** The statuses of a committed original whose compensation was requested. */
export function isCompensationStatus(
  status: string,
): status is 'compensation_requested' | 'compensated' | 'compensation_failed' {
  return status === 'compensation_requested' || status === 'compensated' || status === 'compensation_failed';
}

/**
 * The receipt of a commit, signed by `ctx.signer`: what is known before the append, in
 * the current format (docs/lifecycle.md "Receipt formats"). `prevEventCount` is the event count of
 * the state the commit is decided on, so the receipt names the place in the operation's own history
 * it extends without any stream sequence.
 */
function signedReceipt(
  ctx: DecideContext,
  state: OperationRecord,
  c: { at: number; attempt: number; resourceId: string; resultDigest: string },
  manual: { manual?: true; resolvedBy?: string } = {},
): Receipt {
  if (!ctx.signer) throw new Error('a commit needs a receipt signer (DecideContext.signer)');
  const unsigned: UnsignedReceipt = {
    schema: RECEIPT_SCHEMA_VERSION,
    tenant: state.tenant,
    operationKey: state.operationKey,
    tool: state.tool,
    version: state.version,
    state: 'committed',
    resourceId: c.resourceId,
    resultDigest: c.resultDigest,
    committedAt: c.at,
    attempt: c.attempt,
    prevEventCount: eventCountOf(state),
    ...manual,
    keyId: ctx.signer.keyId,
  };
  return { ...unsigned, signature: ctx.signer.sign(unsigned) };
}

function decideAccept(cmd: AcceptCommand, state: OperationState): Decision {
  const held = cmd.awaitsConfirmation ? { awaitsConfirmation: true as const } : {};
  const compensates = cmd.compensates ? { compensates: cmd.compensates } : {};
  const traced = cmd.traceparent ? { traceparent: cmd.traceparent } : {};
  if (state.status === 'none') {
    if (cmd.start && cmd.awaitsConfirmation) return { kind: 'skip', reason: 'not_confirmed', state };
    return append(
      null,
      {
        type: 'accepted',
        eventId: cmd.eventId,
        at: cmd.at,
        attempt: 1,
        actor: cmd.actor,
        intentSeq: cmd.intentSeq,
        submissionId: cmd.submissionId,
        ...(cmd.submitted ? { submitted: cmd.submitted } : {}),
        ...(cmd.authorization ? { authorization: cmd.authorization } : {}),
        ...(cmd.start ? { started: cmd.start } : {}),
        ...held,
        ...compensates,
        ...traced,
      },
      cmd,
    );
  }
  if (state.inputDigest !== cmd.inputDigest) return { kind: 'conflict', state };
  if (state.status !== 'rejected') return { kind: 'replay', state };
  // A redelivered intent that was already decided (its stream sequence is not newer than the
  // current attempt's) must not start another attempt.
  if (cmd.intentSeq <= state.intent.seq) return { kind: 'replay', state };
  if (cmd.start && cmd.awaitsConfirmation) return { kind: 'skip', reason: 'not_confirmed', state };
  // Rejected = definitively not applied: the identical input starts a new attempt.
  return append(
    state,
    {
      type: 'accepted',
      eventId: cmd.eventId,
      at: cmd.at,
      attempt: state.attempt + 1,
      actor: cmd.actor,
      intentSeq: cmd.intentSeq,
      submissionId: cmd.submissionId,
      ...(cmd.submitted ? { submitted: cmd.submitted } : {}),
      ...(cmd.authorization ? { authorization: cmd.authorization } : {}),
      ...(cmd.start ? { started: cmd.start } : {}),
      ...held,
      ...compensates,
      ...traced,
    },
    cmd,
  );
}

function requireRunning(
  state: OperationState,
  attempt: number,
  allowed: OperationRecord['status'][] = ['running'],
): { kind: 'ok'; state: OperationRecord } | { kind: 'skip'; reason: SkipReason; state: OperationState } {
  if (state.status === 'none') return { kind: 'skip', reason: 'not_registered', state };
  if (state.attempt !== attempt) return { kind: 'skip', reason: 'attempt_mismatch', state };
  if (!allowed.includes(state.status)) return { kind: 'skip', reason: 'not_running', state };
  return { kind: 'ok', state };
}

type EventBody = DistributiveOmit<OperationEvent, 'schema' | 'state'>;
type DistributiveOmit<T, K extends keyof T> = T extends unknown ? Omit<T, K> : never;

function append(prev: OperationRecord | null, body: EventBody, accept?: AcceptCommand): Decision {
  const partial = { schema: EVENT_SCHEMA_VERSION, ...body } as OperationEvent;
  const state = fold(prev, partial, accept);
  return { kind: 'append', event: { ...partial, state } as OperationEvent };
}

/**
 * Folds one event onto the previous state. The first `accepted` of an operation needs the accept
 * command's identity fields; every later event derives its state from the previous one. Every
 * event counts one more (`eventCount`; a previous state without a count counts as 1, see
 * {@link eventCountOf}).
 */
function fold(prev: OperationRecord | null, e: Omit<OperationEvent, 'state'>, accept?: AcceptCommand): OperationRecord {
  const common = { lastEventId: e.eventId, updatedAt: e.at, eventCount: (prev ? eventCountOf(prev) : 0) + 1 };
  switch (e.type) {
    case 'accepted': {
      const a = e as Extract<OperationEvent, { type: 'accepted' }>;
      const identity =
        prev ??
        (accept && {
          operationKey: accept.operationKey,
          tenant: accept.tenant,
          taskId: accept.taskId,
          tool: accept.tool,
          version: accept.version,
          contractDigest: accept.contractDigest,
          effect: accept.effect,
          inputDigest: accept.inputDigest,
          targetDigest: accept.targetDigest,
        });
      if (!identity) throw new Error('accepted event without identity');
      // A new attempt starts clean: no running marker, receipt, error or evidence of the previous one.
      // Accepted and started in one append: running at once, this event being the run.
      const started = a.started;
      const authorization =
        a.authorization || started?.authorization
          ? {
              ...(a.authorization ? { intake: a.authorization } : {}),
              ...(started?.authorization ? { execution: started.authorization } : {}),
            }
          : undefined;
      return {
        operationKey: identity.operationKey,
        tenant: identity.tenant,
        taskId: identity.taskId,
        tool: identity.tool,
        version: identity.version,
        contractDigest: identity.contractDigest,
        effect: identity.effect,
        inputDigest: identity.inputDigest,
        targetDigest: identity.targetDigest,
        status: started ? 'running' : 'accepted',
        actor: a.actor,
        attempt: a.attempt,
        intent: {
          seq: a.intentSeq,
          submissionId: a.submissionId,
          ...(a.submitted ? { submitted: a.submitted } : {}),
          ...(a.traceparent ? { traceparent: a.traceparent } : {}),
        },
        acceptedAt: a.at,
        ...(started
          ? { running: { eventId: a.eventId, executor: started.executor, at: a.at, deadlineAt: started.deadlineAt } }
          : {}),
        ...(authorization ? { authorization } : {}),
        // Held back: nothing starts this attempt until it is confirmed (a new attempt is held again).
        ...(a.awaitsConfirmation ? { confirmation: {} } : {}),
        ...((a.compensates ?? prev?.compensates) ? { compensates: a.compensates ?? prev?.compensates } : {}),
        ...common,
      };
    }
    case 'running': {
      const r = e as Extract<OperationEvent, { type: 'running' }>;
      const p = need(prev);
      const authorization = r.authorization ? { ...p.authorization, execution: r.authorization } : p.authorization;
      return {
        ...p,
        status: 'running',
        running: { eventId: r.eventId, executor: r.executor, at: r.at, deadlineAt: r.deadlineAt },
        ...(authorization ? { authorization } : {}),
        ...common,
      };
    }
    case 'committed': {
      const c = e as Extract<OperationEvent, { type: 'committed' }>;
      const resolution =
        c.manual && c.resolvedBy ? { resolution: { by: c.resolvedBy, at: c.at, outcome: 'committed' as const } } : {};
      return { ...need(prev), status: 'committed', receipt: c.receipt, ...resolution, ...common };
    }
    case 'rejected': {
      const r = e as Extract<OperationEvent, { type: 'rejected' }>;
      const p = need(prev);
      const authorization = r.authorization ? { ...p.authorization, execution: r.authorization } : p.authorization;
      const resolution =
        r.manual && r.resolvedBy ? { resolution: { by: r.resolvedBy, at: r.at, outcome: 'not_applied' as const } } : {};
      return {
        ...p,
        status: 'rejected',
        error: r.error,
        ...(authorization ? { authorization } : {}),
        ...resolution,
        ...common,
      };
    }
    case 'takeover': {
      const t = e as Extract<OperationEvent, { type: 'takeover' }>;
      return { ...need(prev), takeover: t.takeover, ...common };
    }
    case 'unknown': {
      const u = e as Extract<OperationEvent, { type: 'unknown' }>;
      return { ...need(prev), status: 'unknown', evidence: u.evidence, ...common };
    }
    case 'requeued': {
      // Same attempt, same key, back to accepted: the running marker goes, the evidence stays.
      const { running: _running, ...p } = need(prev);
      return { ...p, status: 'accepted', requeues: (p.requeues ?? 0) + 1, ...common };
    }
    case 'awaiting_confirmation': {
      const w = e as Extract<OperationEvent, { type: 'awaiting_confirmation' }>;
      const p = need(prev);
      const confirmation = {
        ...p.confirmation,
        heldAt: w.at,
        deadlineAt: w.deadlineAt,
        ...(w.previewDigest ? { previewDigest: w.previewDigest } : {}),
      };
      return { ...p, status: 'awaiting_confirmation', confirmation, ...common };
    }
    case 'confirmed': {
      const c = e as Extract<OperationEvent, { type: 'confirmed' }>;
      const p = need(prev);
      const confirmation = { ...p.confirmation, confirmed: { by: c.by, at: c.at } };
      const started = c.started;
      if (!started) return { ...p, status: 'accepted', confirmation, ...common };
      // Confirmed and started in one append: running at once, this event being the run.
      const authorization = started.authorization
        ? { ...p.authorization, execution: started.authorization }
        : p.authorization;
      return {
        ...p,
        status: 'running',
        confirmation,
        running: { eventId: c.eventId, executor: started.executor, at: c.at, deadlineAt: started.deadlineAt },
        ...(authorization ? { authorization } : {}),
        ...common,
      };
    }
    case 'discarded': {
      const d = e as Extract<OperationEvent, { type: 'discarded' }>;
      const p = need(prev);
      return {
        ...p,
        status: 'rolled_back',
        confirmation: { ...p.confirmation, discarded: { by: d.by, at: d.at } },
        ...common,
      };
    }
    case 'confirmation_expired': {
      const p = need(prev);
      return { ...p, status: 'rolled_back', confirmation: { ...p.confirmation, expiredAt: e.at }, ...common };
    }
    case 'compensation_requested': {
      const r = e as Extract<OperationEvent, { type: 'compensation_requested' }>;
      // A new request replaces an earlier refused one; the original's receipt is kept as it is.
      return {
        ...need(prev),
        status: 'compensation_requested',
        compensation: { ...r.compensation, requestedAt: r.at },
        ...common,
      };
    }
    case 'compensated': {
      const c = e as Extract<OperationEvent, { type: 'compensated' }>;
      const p = need(prev);
      return {
        ...p,
        status: 'compensated',
        compensation: { ...needLink(p), receipt: c.compensation.receipt },
        ...common,
      };
    }
    case 'compensation_failed': {
      const f = e as Extract<OperationEvent, { type: 'compensation_failed' }>;
      const p = need(prev);
      const { operationKey: _key, ...failure } = f.compensation;
      return {
        ...p,
        status: 'compensation_failed',
        compensation: { ...needLink(p), failure: { at: f.at, ...failure } },
        ...(f.takeover ? { takeover: f.takeover } : {}),
        ...common,
      };
    }
    case 'compensation_failure_resolved': {
      const r = e as Extract<OperationEvent, { type: 'compensation_failure_resolved' }>;
      return { ...need(prev), resolution: { by: r.resolvedBy, at: r.at, outcome: r.outcome }, ...common };
    }
    case 'compensation_refused': {
      const r = e as Extract<OperationEvent, { type: 'compensation_refused' }>;
      const p = need(prev);
      return {
        ...p,
        status: 'committed',
        compensation: { ...needLink(p), refusal: { at: r.at, error: r.compensation.error } },
        ...common,
      };
    }
  }
}

function needLink(prev: OperationRecord): NonNullable<OperationRecord['compensation']> {
  if (!prev.compensation) throw new Error('compensation outcome without a compensation request');
  return prev.compensation;
}

function need(prev: OperationRecord | null): OperationRecord {
  if (!prev) throw new Error('event on an unregistered operation');
  return prev;
}

/**
 * Evolve: the state after `event`. Every event carries its folded state, so this is that state;
 * {@link replay} checks the chain when a full history is read.
 */
export function evolve(_state: OperationState, event: OperationEvent): OperationState {
  return event.state;
}

/**
 * Folds a full history from scratch and checks that each event's carried state equals the fold.
 * Throws `Error` naming the first event whose carried state disagrees. An event written before
 * events were counted carries no `eventCount`: its count is not compared, and the next event folds
 * on from it as a live decision did ({@link eventCountOf}).
 */
export function replay(events: OperationEvent[]): OperationState {
  let state: OperationState = initialState();
  for (const e of events) {
    const { state: carried, ...rest } = e;
    const prev = state.status === 'none' ? null : state;
    const accept =
      prev === null && e.type === 'accepted'
        ? ({
            ...carried,
            type: 'accept',
            intentSeq: carried.intent.seq,
            submissionId: carried.intent.submissionId,
          } as unknown as AcceptCommand)
        : undefined;
    const { eventCount, ...uncounted } = fold(prev, rest, accept);
    const folded = carried.eventCount === undefined ? uncounted : { ...uncounted, eventCount };
    if (JSON.stringify(sortKeys(folded)) !== JSON.stringify(sortKeys(carried))) {
      throw new Error(`event ${e.eventId} (${e.type}) carries a state that does not follow from its history`);
    }
    state = carried;
  }
  return state;
}

function sortKeys(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(sortKeys);
  if (v && typeof v === 'object') {
    return Object.fromEntries(
      Object.entries(v)
        .filter(([, x]) => x !== undefined)
        .sort(([a], [b]) => (a < b ? -1 : 1))
        .map(([k, x]) => [k, sortKeys(x)]),
    );
  }
  return v;
}
