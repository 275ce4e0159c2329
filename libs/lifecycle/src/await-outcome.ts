import type { KeyObject } from 'node:crypto';
import { digestOf, ErrorClass, hasSideEffect, NextAction, nextActionFor, type ErrorInfo } from '@tooltx/contracts';
import type {
  AwaitContext,
  AwaitDecision,
  AwaitEvent,
  AwaitOutcome,
  AwaitState,
  ReceiptCheck,
  UnknownEvidence,
} from './await-state.js';
import { IDEMPOTENCY_CONFLICT } from './checks.js';
import { receiptSchema, type Receipt, type TakeoverRecord } from './events.js';
import { ReceiptVerifier } from './signing.js';
import { MAX_STATUS_WAIT_MS, type StatusAnswer, type StatusRequest } from './status.js';

/**
 * How the SDK awaits the outcome of one call, as a pure decider: given what it knows (its
 * submissions' publish outcomes, the status answers or their absence, the time left of the budget,
 * the attempts seen, the contract's effect class), the next step — publish a submission, wait for
 * the pushed answer, ask the status endpoint, pause — or the answer: `committed`, `rejected` or
 * `unknown` with its `next` action (FM-15) and evidence. The SDK performs each step and reports
 * what came of it as the next `AwaitEvent` (await-state.ts). No clock, no I/O: times come in with the context.
 */

/** Longest wait of one status long-poll, ms; also how long a `not_seen` may last after a submission before the SDK submits again. */
export const STATUS_POLL_MS = 5_000;
/**
 * How long a call waits for its pushed answer before it asks the status endpoint, ms. Only once the
 * connection has received a push (services that push are deployed); before that, a call asks the
 * status endpoint at once and takes whichever answer comes first.
 */
export const PUSH_WAIT_MS = 1_000;
/** Attempts of a read or computation rejected as `dependency_unavailable`: resubmitted until this many were rejected. */
export const MAX_RETRYABLE_ATTEMPTS = 5;
/** Budget a status request keeps beyond its wait: its timeout is the wait plus 2 s, ms. */
const STATUS_REQUEST_MARGIN_MS = 2_100;
/** Budget kept beyond a wait for the push alone, ms. */
const PUSH_WAIT_MARGIN_MS = 100;
/** A status request that could wait less than this answers at once: the next one waits this long first, ms. */
const SHORT_WAIT_MS = 250;
/** Pause before asking again after a committed answer whose receipt does not verify, ms. */
const TAMPERED_PAUSE_MS = 500;
/** Pause before asking again after a committed answer whose result is not readable yet, ms. */
const RESULT_PAUSE_MS = 200;
/** First pause after a failed status request or before resubmitting a retryable rejection, ms (doubles each time). */
const BACKOFF_MS = 200;

/**
 * Checks a committed outcome (FM-17): a receipt signed under a key id of `trusted`, for `tenant` and
 * the outcome's operation key, whose result digest matches `result` (when given). Pure, but for
 * what a {@link ReceiptVerifier} remembers of the receipts it verified (which changes no answer).
 */
export function checkReceipt(
  o: { operationKey: string; receipt: Receipt; result?: unknown },
  trusted: ReadonlyMap<string, KeyObject> | ReceiptVerifier,
  tenant: string,
): ReceiptCheck {
  const verifier = trusted instanceof ReceiptVerifier ? trusted : new ReceiptVerifier(trusted, 0);
  const r = receiptSchema.safeParse(o.receipt);
  if (!r.success || !verifier.trusts(r.data.keyId)) return { valid: false, reason: 'untrusted_key' };
  if (!verifier.verifyParsed(r.data)) return { valid: false, reason: 'bad_signature' };
  if (r.data.tenant !== tenant || r.data.operationKey !== o.operationKey)
    return { valid: false, reason: 'other_operation' };
  if (o.result !== undefined && digestOf(o.result) !== r.data.resultDigest)
    return { valid: false, reason: 'result_mismatch' };
  return { valid: true };
}

/**
 * The next step of a call awaiting its outcome. Rules:
 * 1. Start by submitting (the caller's id factory's id).
 * 2. A submission whose first transmission is acked as a duplicate used an id someone else took
 *    (dedup is stream-wide): it stored nothing; submit again under a random id (the operation key
 *    keeps it one operation, FM-31).
 * 3. A duplicate PubAck of a retransmission proves only that the id was stored once (FM-30): ask
 *    status once; stored when it reports the call's own attempt or a refusal of its submission,
 *    else submit again under a random id at once.
 * 4. JetStream refusing to store a publish is `rejected` with its classified error when no
 *    transmission of the call can have been stored; else `unknown` (observe) with `evidence.refusal`.
 * 5. The server refusing the call's first publish of its intent is `rejected` (forbidden); refusing
 *    any later publish, the reply inbox, a status request or the credentials is `unknown`
 *    (reauthorise): an intent may be stored and cannot be observed.
 * 6. Observe while budget is left: a request that could wait under 250 ms is followed by a 250 ms
 *    pause; a new submission's push is waited for alone first (up to 1 s, once a push was seen);
 *    then a status long-poll (up to 5 s, 2.1 s kept for its timeout) raced by that push. A failed
 *    request backs off (200 ms, doubling, up to 3.2 s); a status error other than
 *    `dependency_unavailable` is `rejected` with it.
 * 7. Answers: a refusal of the call's submission (`decision`) is `rejected` (FM-06: a forged actor's
 *    refusal names `actorId`); another input under the key is `rejected` `idempotency_conflict`
 *    (FM-03); `not_seen` is submitted again when nothing was stored or 5 s passed since the last
 *    submission; `unknown` under takeover answers `unknown` with the record, hand over (FM-14).
 * 8. `committed` counts only with a receipt that checks (FM-17): an untrusted key answers `unknown`,
 *    hand over, at once; another failed check is observed on until the budget ends. A person's
 *    resolution without a result answers with the receipt; otherwise only a result matching the
 *    receipt's digest is handed on (it is waited for).
 * 9. An earlier attempt's refusal (`ownAttempt: false`) is waited past: submitted again after 5 s.
 *    A refusal of a read or computation as `dependency_unavailable` is resubmitted after a backoff
 *    (200 ms doubling) until {@link MAX_RETRYABLE_ATTEMPTS} were refused; any other refusal is
 *    `rejected` with its error and attempt.
 * 10. When the budget ends: `unknown`, hand over when the last state was `unknown` or a receipt did
 *    not check, else observe.
 */
export function decideAwait(s: AwaitState, e: AwaitEvent, ctx: AwaitContext): AwaitDecision {
  switch (e.kind) {
    case 'start':
      // A key this caller saw committed: read first; a committed answer needs no submission.
      if (s.readFirst)
        return {
          state: s,
          step: {
            kind: 'ask_status',
            request: { operationKey: s.operationKey, inputDigest: s.inputDigest },
            racePush: false,
          },
        };
      return { state: s, step: { kind: 'submit', delayMs: 0, randomId: false } };
    case 'published':
      return afterPublish(s, e, ctx);
    case 'stored_checked': {
      const a = e.answer;
      if (a && (a.source === 'decision' || (a.source === 'operation' && a.ownAttempt === true)))
        return observe({ ...s, intentStored: true }, ctx, false);
      if (left(s, ctx) <= 0) return observe(s, ctx, false);
      return resubmit({ ...s, idsGivenUp: s.idsGivenUp + 1 }, ctx, 0);
    }
    case 'answered':
      if (s.readFirst) {
        const read = { ...s, readFirst: false };
        const a = e.answer;
        // Only a committed answer of this very operation and input ends the call here; anything else
        // (retention expired, another input, a later state) is submitted as a new call would be.
        if (a.state !== 'committed' || a.source !== 'operation' || a.inputMatches === false || a.canonicalKey)
          return { state: read, step: { kind: 'submit', delayMs: 0, randomId: false } };
        return afterAnswer({ ...read, statusAnswered: true }, a, ctx);
      }
      return afterAnswer(
        { ...s, statusAnswered: true, statusFailures: 0, ...(e.pushed ? { push: 'none' as const } : {}) },
        e.answer,
        ctx,
      );
    case 'status_failed': {
      if (s.readFirst)
        return { state: { ...s, readFirst: false }, step: { kind: 'submit', delayMs: 0, randomId: false } };
      if (e.reauthorise) return answer(s, unknown(s, ctx, { next: NextAction.Reauthorise, error: e.error }));
      if (e.error.class !== ErrorClass.DependencyUnavailable) return answer(s, rejected(s, e.error));
      const ms = Math.min(left(s, ctx), BACKOFF_MS * 2 ** Math.min(s.statusFailures, 4));
      return { state: { ...s, statusFailures: s.statusFailures + 1 }, step: { kind: 'pause', ms, wakeOnPush: false } };
    }
    case 'push_missed':
      return observe(s, ctx, true);
    case 'paused':
      return observe(s, ctx, true);
  }
}

/** Rules 2–5: what a submission's publish outcome means. */
function afterPublish(s0: AwaitState, e: Extract<AwaitEvent, { kind: 'published' }>, ctx: AwaitContext): AwaitDecision {
  const first = s0.submissionIds.length === 0;
  const s: AwaitState = {
    ...s0,
    submissionIds: [...s0.submissionIds, e.submissionId],
    submittedAt: ctx.now,
    push: e.pushable ? 'expected' : 'none',
    mayBeStored: s0.mayBeStored || e.unanswered > 0,
  };
  const r = e.result;
  switch (r.kind) {
    case 'acked':
      if (r.duplicate && e.unanswered === 0) return resubmit({ ...s, idsGivenUp: s.idsGivenUp + 1 }, ctx, 0);
      if (r.duplicate)
        return {
          state: { ...s, mayBeStored: true },
          step: {
            kind: 'confirm_stored',
            request: {
              operationKey: s.operationKey,
              waitMs: 0,
              inputDigest: s.inputDigest,
              submissionIds: s.submissionIds,
            },
          },
        };
      return observe({ ...s, intentStored: true }, ctx, false);
    case 'no_ack':
      return observe(s, ctx, false);
    case 'refused':
      if (!s.mayBeStored && !s.intentStored) return answer(s, rejected(s, r.error));
      return answer(
        s,
        unknown(s, ctx, {
          next: NextAction.Observe,
          error: r.error,
          refusal: { jsApiCode: r.jsApiCode, why: 'earlier_transmission_may_be_stored' },
        }),
      );
    case 'denied':
      if (first && e.unanswered === 0 && r.intentPublish && !s.intentStored) return answer(s, rejected(s, r.error));
      return answer(s, unknown(s, ctx, { next: NextAction.Reauthorise, error: r.error }));
    case 'credentials_refused':
      return answer(s, unknown(s, ctx, { next: NextAction.Reauthorise, error: r.error }));
  }
}

/** Rules 7–9: what a status (or pushed) answer means. */
function afterAnswer(s0: AwaitState, a: StatusAnswer, ctx: AwaitContext): AwaitDecision {
  let s = a.canonicalKey ? { ...s0, outcomeKey: a.canonicalKey } : s0;
  if (a.source === 'decision')
    return answer(s, rejected(s, withActorPath(a.error ?? { class: ErrorClass.Internal }, s.forgedActor)));
  if (a.source === 'operation' && a.inputMatches === false) return answer(s, rejected(s, IDEMPOTENCY_CONFLICT));
  if (a.state === 'not_seen')
    return !s.intentStored || resubmitDue(s, ctx) ? resubmit(s, ctx, 0) : observe(s, ctx, false);
  s = { ...s, lastState: a.state, lastSeq: a.seq, attempt: a.attempt };
  // Held back: the call's answer is its preview; a person decides what follows (tools.confirm or tools.discard).
  if (a.confirmation?.status === 'awaiting_confirmation')
    return answer(s, {
      status: 'awaiting_confirmation',
      operationKey: s.outcomeKey,
      ...(a.confirmation.preview !== undefined ? { preview: a.confirmation.preview } : {}),
      ...(a.confirmation.deadlineAt !== undefined ? { deadlineAt: a.confirmation.deadlineAt } : {}),
      next: NextAction.ConfirmOrDiscard,
    });
  // Discarded, or not confirmed by its deadline: final, whichever submission held it.
  if (a.confirmation?.status === 'rolled_back')
    return answer(s, rejected(s, a.error ?? { class: ErrorClass.OperationDiscarded }));
  if (a.state === 'unknown' && a.takeover)
    return answer(s, unknown(s, ctx, { next: NextAction.HandOver, takeover: a.takeover }));
  if (a.state === 'committed' && a.receipt) {
    const check = ctx.checkReceipt(s.outcomeKey, a.receipt);
    if (!check.valid) {
      // A key we do not trust will not become one by waiting; a tampered answer may be followed by the true one.
      s = { ...s, invalidReceipt: check.reason };
      if (check.reason === 'untrusted_key')
        return answer(s, unknown(s, ctx, { next: NextAction.HandOver, invalidReceipt: check.reason }));
      return pause(s, ctx, TAMPERED_PAUSE_MS);
    }
    // A person resolved it and no business result exists to hand on: the receipt is the outcome.
    if (a.receipt.manual && a.result === undefined)
      return answer(s, {
        status: 'committed',
        operationKey: s.outcomeKey,
        result: undefined,
        receipt: a.receipt,
        next: 'continue',
      });
    if (a.result === undefined || digestOf(a.result) !== a.receipt.resultDigest) return pause(s, ctx, RESULT_PAUSE_MS);
    return answer(s, {
      status: 'committed',
      operationKey: s.outcomeKey,
      result: a.result,
      receipt: a.receipt,
      next: 'continue',
    });
  }
  // An earlier attempt's refusal: the call's identical submission starts a new attempt; wait for it.
  if (a.state === 'rejected' && a.ownAttempt === false)
    return resubmitDue(s, ctx) ? resubmit(s, ctx, 0) : observe(s, ctx, false);
  if (a.state === 'rejected') {
    const error = a.error ?? { class: ErrorClass.Internal };
    const retryable =
      !hasSideEffect(s.effect) &&
      error.class === ErrorClass.DependencyUnavailable &&
      s.retryableRejections + 1 < MAX_RETRYABLE_ATTEMPTS;
    if (!retryable) return answer(s, { ...rejected(s, error), ...(a.attempt ? { attempt: a.attempt } : {}) });
    const n = s.retryableRejections + 1;
    return resubmit({ ...s, retryableRejections: n }, ctx, BACKOFF_MS * 2 ** n);
  }
  return observe(s, ctx, false);
}

/** Rule 6: the next look at the operation, or rule 10 when the budget has ended. `paused`: the step before was a pause or a wait. */
function observe(s: AwaitState, ctx: AwaitContext, paused: boolean): AwaitDecision {
  const l = left(s, ctx);
  if (l <= 0) {
    const next = s.lastState === 'unknown' || s.invalidReceipt ? NextAction.HandOver : NextAction.Observe;
    return answer(s, unknown(s, ctx, { next, ...(s.invalidReceipt ? { invalidReceipt: s.invalidReceipt } : {}) }));
  }
  // A request that could not wait answered at once: pause instead of asking in a tight loop.
  if (!paused && s.askedWaitMs !== undefined && s.askedWaitMs < SHORT_WAIT_MS)
    return { state: s, step: { kind: 'pause', ms: Math.min(l, SHORT_WAIT_MS), wakeOnPush: s.push !== 'none' } };
  if (s.push === 'expected') {
    const waited = { ...s, push: 'waited' as const };
    if (ctx.pushSeen)
      return {
        state: waited,
        step: { kind: 'wait_push', ms: Math.max(0, Math.min(PUSH_WAIT_MS, l - PUSH_WAIT_MARGIN_MS)) },
      };
    s = waited;
  }
  // One long-poll until a final answer (not one per intermediate state).
  const waitMs = Math.max(0, Math.min(STATUS_POLL_MS, MAX_STATUS_WAIT_MS, l - STATUS_REQUEST_MARGIN_MS));
  const request: StatusRequest = {
    operationKey: s.operationKey,
    waitMs,
    afterSeq: s.lastSeq,
    inputDigest: s.inputDigest,
    submissionIds: s.submissionIds,
    untilFinal: true,
  };
  return { state: { ...s, askedWaitMs: waitMs }, step: { kind: 'ask_status', request, racePush: s.push !== 'none' } };
}

function resubmit(s: AwaitState, ctx: AwaitContext, delayMs: number): AwaitDecision {
  return {
    state: s,
    step: { kind: 'submit', delayMs: Math.max(0, Math.min(left(s, ctx), delayMs)), randomId: s.idsGivenUp > 0 },
  };
}

function pause(s: AwaitState, ctx: AwaitContext, ms: number): AwaitDecision {
  return { state: s, step: { kind: 'pause', ms: Math.max(0, Math.min(left(s, ctx), ms)), wakeOnPush: false } };
}

function answer(s: AwaitState, outcome: AwaitOutcome): AwaitDecision {
  return { state: s, step: { kind: 'answer', outcome } };
}

const left = (s: AwaitState, ctx: AwaitContext) => s.deadlineAt - ctx.now;
const resubmitDue = (s: AwaitState, ctx: AwaitContext) => ctx.now - s.submittedAt >= STATUS_POLL_MS;

function rejected(s: AwaitState, error: ErrorInfo): Extract<AwaitOutcome, { status: 'rejected' }> {
  return { status: 'rejected', operationKey: s.operationKey, error, next: nextActionFor[error.class] };
}

function unknown(
  s: AwaitState,
  ctx: AwaitContext,
  o: {
    next: NextAction;
    error?: ErrorInfo;
    takeover?: TakeoverRecord;
    refusal?: UnknownEvidence['refusal'];
    invalidReceipt?: string;
  },
): Extract<AwaitOutcome, { status: 'unknown' }> {
  const evidence: UnknownEvidence = {
    operationKey: s.outcomeKey,
    submissionIds: s.submissionIds,
    intentStored: s.intentStored,
    statusAnswered: s.statusAnswered,
    lastSeq: s.lastSeq,
    ...(s.attempt ? { attempt: s.attempt } : {}),
    elapsedMs: ctx.now - s.startedAt,
    ...(o.takeover ? { takeover: o.takeover } : {}),
    ...(o.refusal ? { refusal: o.refusal } : {}),
    ...(o.invalidReceipt ? { invalidReceipt: o.invalidReceipt } : {}),
  };
  return {
    status: 'unknown',
    operationKey: s.outcomeKey,
    lastServerState: s.lastState,
    evidence,
    next: o.next,
    ...(o.error ? { error: o.error } : {}),
  };
}

/** Adds the `actorId` path to a refusal of a forged actor (FM-06) that carries no path of its own. */
function withActorPath(error: ErrorInfo, forgedActor: boolean): ErrorInfo {
  if (!forgedActor || error.class !== ErrorClass.Forbidden || error.issues?.length) return error;
  return {
    ...error,
    issues: [
      {
        path: ['actorId'],
        code: 'not_authenticated_actor',
        message: 'actorId must be the actor this connection authenticated as',
      },
    ],
  };
}
