import { z } from 'zod';
import { ErrorClass, OPERATION_KEY_PATTERN, type Implementation } from '@tooltx/contracts';
import {
  compensationResolutionOutcomes,
  errorInfoSchema,
  eventCountOf,
  receiptSchema,
  takeoverRecordSchema,
  type DecisionRecord,
  type OperationRecord,
  type Receipt,
} from './events.js';
import { compensationResolutionOf } from './recovery.js';

/** Longest long-poll a status request may ask for, ms. */
export const MAX_STATUS_WAIT_MS = 30_000;

/**
 * A status request on `<prefix>.status.<tenant>.<actor>` (request/reply). Read-only and
 * repeatable. `afterSeq`: the answer's `seq` the caller already saw (the operation's own event
 * count) — the answer comes at once when the operation has moved past it or is final, otherwise
 * after the next change or `waitMs`.
 * `inputDigest`: the caller's own input digest, so the answer can say whether the registered
 * operation is the caller's or a conflict, without revealing the registered digest.
 * `submissionIds`: the caller's submissions, so a refusal of one of them can be reported.
 */
export const statusRequestSchema = z.strictObject({
  operationKey: z.string().regex(OPERATION_KEY_PATTERN),
  waitMs: z.number().int().min(0).max(MAX_STATUS_WAIT_MS).optional(),
  afterSeq: z.number().int().min(0).optional(),
  inputDigest: z.string().max(80).optional(),
  submissionIds: z.array(z.string().max(64)).max(32).optional(),
  /**
   * Long-poll until the answer is final — committed, rejected, a refusal of the caller's submission,
   * or a takeover — instead of answering at the first change (saves the SDK a round trip per
   * intermediate state). `waitMs` still bounds the wait.
   */
  untilFinal: z.boolean().optional(),
});
export type StatusRequest = z.infer<typeof statusRequestSchema>;

export const serverStates = ['not_seen', 'accepted', 'running', 'committed', 'rejected', 'unknown'] as const;
export type ServerState = (typeof serverStates)[number];

/**
 * A status answer. Precedence: a registered operation the caller may read is answered from
 * its own subject (state, receipt, permitted result fields); otherwise — never registered, or not
 * readable by this caller, which gets the same uniform answer — from the decision subject when one
 * of the caller's own submissions was refused (`source: 'decision'`), else `not_seen`.
 */
export const statusAnswerSchema = z.object({
  operationKey: z.string(),
  /**
   * Set when `operationKey` named its target through an alias: the key of the operation that holds
   * it (registered under the canonical input), whose state this answer reports and whose key the
   * receipt carries (FM-10).
   */
  canonicalKey: z.string().optional(),
  state: z.enum(serverStates),
  /** `operation`: the registered operation; `decision`: a refusal of the caller's submission; `none`. */
  source: z.enum(['operation', 'decision', 'none']),
  /**
   * The operation's own event count (`eventCount` of its state: 1 after its first event, +1 per
   * event; 0 when not registered or answered from a decision): where the operation is in its own
   * history, to be sent back as `afterSeq`. Never a stream sequence, which would count other
   * tenants' events. An operation whose last event predates counting answers 1 (see `eventCountOf`).
   */
  seq: z.number().int().min(0),
  attempt: z.number().int().min(1).optional(),
  /** Whether the registered input is the caller's (`inputDigest` given): false = idempotency conflict. */
  inputMatches: z.boolean().optional(),
  /**
   * Whether the operation's current attempt was started by one of the caller's `submissionIds`
   * (given). False on a `rejected` answer = an earlier attempt's refusal: the caller's identical
   * resubmission will start a new attempt, so it waits for that instead of taking the old refusal.
   */
  ownAttempt: z.boolean().optional(),
  receipt: receiptSchema.optional(),
  /** The business result the caller may read (committed only). */
  result: z.unknown().optional(),
  error: errorInfoSchema.optional(),
  /**
   * The takeover record when the operation was handed over to a person: an `unknown` one (FM-14),
   * or a committed one whose compensation failed (FM-20; kept after a person resolved it, beside
   * `compensation.resolution`).
   */
  takeover: takeoverRecordSchema.optional(),
  /** Which of the caller's submissions a `decision` answer is about. */
  submissionId: z.string().optional(),
  /** The registered operation's contract, `name@version` (`source: 'operation'`). */
  contract: z.string().optional(),
  /**
   * Where its compensation stands, once one was asked for (docs/compensation.md): `state` is then
   * `committed` (its receipt stays valid) and this tells `compensation_requested`, `compensated` and
   * `compensation_failed` apart, with the compensation's own key (its status answers it), or says a
   * request was refused before it ran (`refused`, back to committed, with its class).
   */
  compensation: z
    .object({
      status: z.enum(['compensation_requested', 'compensated', 'compensation_failed', 'refused']),
      operationKey: z.string(),
      error: errorInfoSchema.optional(),
      /**
       * `compensation_failed` only, once a person resolved it (FM-20): who, when and what they
       * decided. The status stays `compensation_failed` and the receipt stays valid.
       */
      resolution: z
        .object({ by: z.string(), at: z.number().int(), outcome: z.enum(compensationResolutionOutcomes) })
        .optional(),
    })
    .optional(),
  /** Set on a compensation operation: the key of the operation it compensates. */
  compensates: z.string().optional(),
  /**
   * On a compensation another request registered (`ownAttempt` false): true once the caller's own
   * request of it (one of `submissionIds`) was judged and answered with it (the replay); absent
   * while it is still to be judged. A refused one answers its refusal instead.
   */
  replayed: z.literal(true).optional(),
  /**
   * Where a held-back operation stands (its contract declares `confirm`, docs/compensation.md),
   * once it was held: `state` stays the nearest meaning for a caller that does not know holds
   * (`accepted` while it waits, `rejected` with `operation_discarded` once rolled back, the run's own
   * state once confirmed), and this tells them apart:
   * - `awaiting_confirmation`: it waits until `deadlineAt` (ms since the epoch), with the prepare
   *   step's `preview` when it has one (read from the result store, like a result, under the read
   *   policy);
   * - `confirmed`: released; `state` is its run's;
   * - `rolled_back`: discarded (`reason: 'discarded'`) or not confirmed by its deadline
   *   (`'expired'`) before it ran: nothing external happened.
   */
  confirmation: z
    .object({
      status: z.enum(['awaiting_confirmation', 'confirmed', 'rolled_back']),
      deadlineAt: z.number().int().optional(),
      preview: z.unknown().optional(),
      reason: z.enum(['discarded', 'expired']).optional(),
    })
    .optional(),
  /** Server time of the answer, ms since the epoch. */
  at: z.number().int(),
});
export type StatusAnswer = z.infer<typeof statusAnswerSchema>;

/** A refused status request (bad request, or the status service itself failing). */
export const statusErrorSchema = z.object({ error: errorInfoSchema, at: z.number().int() });
export const statusReplySchema = z.union([statusAnswerSchema, statusErrorSchema]);
export type StatusReply = z.infer<typeof statusReplySchema>;

/**
 * What a service pushes to the agent of one submission (`Subjects.push`): the committed
 * answer as the status endpoint would give it to that agent (receipt, permitted result), or `poll`:
 * "the outcome is not pushed — ask the status endpoint now" (a refusal, a replay, an unknown).
 */
export const pushedAnswerSchema = statusAnswerSchema.extend({
  /**
   * Marks an answer a service pushed. The status endpoint never sends it, so an answer another
   * agent made the status endpoint send onto this subject (its reply subject is its own choice)
   * never parses as a push.
   */
  pushed: z.literal(true),
  /** The registered input's digest: the agent takes the answer only for its own input (FM-03). */
  inputDigest: z.string(),
});
export type PushedAnswer = z.infer<typeof pushedAnswerSchema>;
export const pushMessageSchema = z.union([
  pushedAnswerSchema,
  z.object({ poll: z.literal(true), at: z.number().int() }),
]);
export type PushMessage = z.infer<typeof pushMessageSchema>;

/**
 * The committed answer pushed to the agent of `submissionId`: what the status endpoint
 * answers that agent for `submittedKey` — the key its submission derived, which names the
 * operation through an alias when it differs from the registered one (FM-10). `state` must be
 * committed with its receipt; `result` is the business result the agent may read (`{}` for a
 * receipt-only result). `ownAttempt` is relative to this one submission (the status endpoint's
 * compares every submission id the caller lists; the SDK does not use it for a committed answer). Pure.
 */
export function committedAnswer(o: {
  submittedKey: string;
  state: OperationRecord & { receipt: Receipt };
  submissionId: string;
  result: unknown;
  at: number;
}): PushedAnswer {
  const st = o.state;
  return {
    pushed: true,
    inputDigest: st.inputDigest,
    operationKey: o.submittedKey,
    ...(o.submittedKey !== st.operationKey ? { canonicalKey: st.operationKey } : {}),
    state: 'committed',
    source: 'operation',
    seq: eventCountOf(st),
    attempt: st.attempt,
    inputMatches: true,
    ownAttempt: st.intent.submissionId === o.submissionId,
    receipt: st.receipt,
    result: o.result,
    at: o.at,
  };
}

/**
 * Whether `actor` of `tenant` may read operation `state` now, by its tool's read policy seam
 * (`Implementation.authorizeRead`, with the owner and the canonical resources the intake decision
 * saw); true when the tool has none. The one check behind every answer that reveals an outcome: the
 * status endpoint's and each pushed answer. Never throws: a refusal or a failing policy is false.
 */
export async function readAllowed(
  impl: Implementation | undefined,
  tenant: string,
  actor: string,
  state: OperationRecord,
  now: number,
): Promise<boolean> {
  if (!impl?.authorizeRead) return true;
  try {
    const resources = state.authorization?.intake?.resources;
    await impl.authorizeRead({
      tenant,
      actor,
      owner: state.actor,
      operationKey: state.operationKey,
      now,
      ...(resources ? { resources } : {}),
    });
    return true;
  } catch {
    return false;
  }
}

/**
 * Whether a status answer goes back at once rather than wait for a change (a long-poll). `a.seq`
 * and `req.afterSeq` are both the operation's own event count. Pure.
 * - A refusal of the caller's submission is an answer at once.
 * - With `untilFinal`: committed or rejected (not an earlier attempt's refusal: the caller's
 *   resubmission is coming), or a takeover — each unless the caller already saw exactly it.
 * - Otherwise: a final state the caller has not seen, or any move past `afterSeq`.
 */
export function statusSettled(a: StatusAnswer, req: StatusRequest): boolean {
  if (a.source === 'decision') return true;
  const after = req.afterSeq ?? 0;
  if (req.untilFinal) {
    if (a.state === 'unknown' && a.takeover) return a.seq !== after;
    // Held back: nothing more happens until someone confirms or discards it, or its deadline.
    if (a.confirmation?.status === 'awaiting_confirmation' || a.confirmation?.status === 'rolled_back')
      return a.seq !== after;
    if (a.state === 'rejected' && a.ownAttempt === false) return false;
    return (a.state === 'committed' || a.state === 'rejected') && a.seq !== after;
  }
  if ((a.state === 'committed' || a.state === 'rejected') && a.seq !== after) return true;
  return a.seq > after;
}

/**
 * Whether the read policy may be skipped: the submitting actor asking, with its submission id,
 * about its own operation while it is still in flight learns only its state — nothing final is
 * revealed — so the policy (a round trip to the system of record) is not asked at each long-poll
 * step. Pure.
 */
export function ownCallInFlight(state: OperationRecord, actor: string, req: StatusRequest): boolean {
  const inFlight =
    state.status === 'accepted' || state.status === 'running' || (state.status === 'unknown' && !state.takeover);
  return inFlight && actor === state.actor && req.submissionIds?.includes(state.intent.submissionId) === true;
}

/**
 * Status precedence for an operation rejected in an attempt the caller did not start: when the
 * caller's own resubmission was refused at intake since (e.g. `task_frozen`), that refusal — not
 * the earlier attempt's — is the caller's answer. Pure.
 */
export function ownRefusalSupersedes(
  state: OperationRecord,
  actor: string,
  req: StatusRequest,
  decision: DecisionRecord | null,
): decision is DecisionRecord & { outcome: 'rejected' } {
  return (
    decision?.outcome === 'rejected' &&
    decision.actor === actor &&
    req.submissionIds?.includes(decision.submissionId) === true &&
    decision.at >= state.updatedAt
  );
}

/**
 * What the status endpoint has read so far for one request of `actor` ({@link statusStep}).
 * - `operation`: the operation the asked key names — or, following an alias, its canonical key —
 *   when it is registered AND the caller may read it (`ownCallInFlight`, else the read policy
 *   `readAllowed`, both asked by the caller of this function); null when never registered or not
 *   readable: the same answer for both, so an unreadable operation is not told apart from none
 *   (FM-10, FM-31).
 * - `decision`: the caller's decision record on that operation's decision subject that the step
 *   asked for (its newest about the step's `submissionIds` when it names them, else its last);
 *   undefined = not read yet, null = none.
 * - `result`: the committed result the caller may read (as `committedResult` reads it); undefined
 *   = not read yet, null = none readable.
 * - `alias`: set once an alias was followed: the key the caller asked about and the canonical key
 *   whose operation `operation` is (FM-10).
 * - `at`: the answer's server time, ms since the epoch.
 */
export interface StatusReads {
  req: StatusRequest;
  actor: string;
  at: number;
  operation: OperationRecord | null;
  decision?: DecisionRecord | null;
  result?: { result: unknown } | null;
  alias?: { submittedKey: string; canonicalKey: string };
}

/**
 * The next step of a status answer ({@link statusStep}):
 * - `answer`: the answer, to be sent as is.
 * - `read_decision`: read the caller's last decision record on `operationKey`'s decision subject —
 *   with `submissionIds`, its newest about one of those submissions, however many of its other
 *   requests were recorded since (FM-21) — (null when none), then ask again with it as `decision`.
 * - `read_result`: read the committed result of `operationKey` for this receipt's `attempt` and
 *   `resultDigest` (null when none is readable), then ask again with it as `result`.
 * - `follow_alias`: the asked key is an alias (FM-10): load the operation of `alias.canonicalKey`,
 *   apply the read policy to it for `asked` (the request with the caller's digest mapped to the
 *   canonical input's), then ask again with a fresh {@link StatusReads} of `asked`, that operation
 *   (or null) and `alias`.
 */
export type StatusStep =
  | { kind: 'answer'; answer: StatusAnswer }
  | { kind: 'read_decision'; operationKey: string; submissionIds?: readonly string[] }
  | { kind: 'read_result'; operationKey: string; attempt: number; resultDigest: string }
  | { kind: 'follow_alias'; asked: StatusRequest; alias: { submittedKey: string; canonicalKey: string } };

/**
 * Status precedence, one step at a time: what to answer from what was read, or what to read next.
 * Pure: the caller does the reads (the operation's last state, the decision record, the result)
 * and the read policy, and asks again until it gets an `answer`.
 *
 * 1. A registered operation the caller may read answers from its own subject (`source:
 *    'operation'`): its state, `attempt` and `seq` = its own event count (`eventCountOf`, never a
 *    stream sequence); `inputMatches` when the caller gave its `inputDigest` (false = an
 *    idempotency conflict, FM-03: the registered digest itself is never revealed); `ownAttempt`
 *    when it gave `submissionIds`. Then, by state:
 *    - `rejected` in an attempt the caller did not start: its own later refusal at intake answers
 *      instead when there is one (`ownRefusalSupersedes`; needs the decision record);
 *    - `committed`: the receipt, and the result only when the input is not known to differ (FM-03:
 *      a conflicting caller learns that the key is taken, not what it returned; needs the result);
 *    - `rejected`: its error; `unknown` under takeover: the takeover record (FM-14);
 *    - `compensation_failed`: its takeover record, and a person's resolution once there is one (FM-20).
 * 2. Otherwise (never registered, or not readable by this caller — the same answer), from the
 *    caller's last decision record on the key (needs it):
 *    - an alias (FM-10): the answer of the canonical operation, under the asked key with
 *      `canonicalKey` set, the caller's digest mapped to the canonical input's when it is the
 *      alias's own (so `inputMatches` compares like with like); `not_seen` with `canonicalKey` when
 *      that operation is not readable either;
 *    - a refusal of one of the caller's submissions (any, when it lists none): `rejected` from
 *      `decision` with its error and submission id;
 *    - else `not_seen`: another actor's decision, or a refusal of a submission the caller does not
 *      list, is never revealed.
 */
export function statusStep(r: StatusReads): StatusStep {
  const { req, at, alias } = r;
  if (r.operation) {
    const st = r.operation;
    const key = alias?.canonicalKey ?? req.operationKey;
    const fromOperation = operationAnswer(r, st);
    if (fromOperation.kind !== 'answer')
      return fromOperation.kind === 'read_decision'
        ? {
            kind: 'read_decision',
            operationKey: key,
            ...(req.submissionIds ? { submissionIds: req.submissionIds } : {}),
          }
        : { ...fromOperation, operationKey: key };
    return {
      kind: 'answer',
      answer: alias
        ? { ...fromOperation.answer, operationKey: alias.submittedKey, canonicalKey: alias.canonicalKey }
        : fromOperation.answer,
    };
  }
  if (alias)
    return {
      kind: 'answer',
      answer: {
        operationKey: alias.submittedKey,
        canonicalKey: alias.canonicalKey,
        state: 'not_seen',
        source: 'none',
        seq: 0,
        at,
      },
    };
  if (r.decision === undefined) return { kind: 'read_decision', operationKey: req.operationKey };
  // Only the caller's own decisions answer (the store reads them from the caller's own decision
  // subject; checked here too, so the rule holds whatever it is given).
  const d = r.decision?.actor === r.actor ? r.decision : null;
  if (d?.outcome === 'aliased') {
    // The caller's digest is its own input's: the same as the alias's means the canonical one.
    const asked =
      req.inputDigest === undefined
        ? req
        : { ...req, inputDigest: req.inputDigest === d.inputDigest ? d.canonicalInputDigest : req.inputDigest };
    return { kind: 'follow_alias', asked, alias: { submittedKey: req.operationKey, canonicalKey: d.canonicalKey } };
  }
  // A replay record answers nothing on its own: the compensation it names answers, when readable.
  if (d?.outcome === 'rejected' && (req.submissionIds === undefined || req.submissionIds.includes(d.submissionId)))
    return { kind: 'answer', answer: decisionAnswer(req.operationKey, d, at) };
  return { kind: 'answer', answer: { operationKey: req.operationKey, state: 'not_seen', source: 'none', seq: 0, at } };
}

/** The caller's own refusal at intake as its answer (`source: 'decision'`, `seq` 0). Pure. */
function decisionAnswer(operationKey: string, d: DecisionRecord & { outcome: 'rejected' }, at: number): StatusAnswer {
  return {
    operationKey,
    state: 'rejected',
    source: 'decision',
    seq: 0,
    error: d.error,
    submissionId: d.submissionId,
    at,
  };
}

/**
 * Step 1 of {@link statusStep}: the answer from readable operation `st` under the asked key (the
 * alias's keys are set by the caller), or the read it still needs. Pure.
 */
function operationAnswer(
  r: StatusReads,
  st: OperationRecord,
):
  | { kind: 'answer'; answer: StatusAnswer }
  | { kind: 'read_decision' }
  | { kind: 'read_result'; attempt: number; resultDigest: string } {
  const { req, actor, at } = r;
  const a: StatusAnswer = {
    operationKey: req.operationKey,
    state: serverStateOf(st.status),
    source: 'operation',
    seq: eventCountOf(st),
    attempt: st.attempt,
    contract: `${st.tool}@${st.version}`,
    at,
  };
  if (st.compensation) {
    const c = st.compensation;
    const refused = c.refusal !== undefined && st.status === 'committed';
    a.compensation = {
      status: refused ? 'refused' : (st.status as 'compensation_requested' | 'compensated' | 'compensation_failed'),
      operationKey: c.operationKey,
      ...(refused && c.refusal ? { error: c.refusal.error } : c.failure?.error ? { error: c.failure.error } : {}),
    };
    const resolved = compensationResolutionOf(st);
    if (resolved && st.resolution)
      a.compensation.resolution = { by: st.resolution.by, at: st.resolution.at, outcome: resolved };
  }
  if (st.compensates) a.compensates = st.compensates.operationKey;
  const held = st.confirmation;
  if (held && (held.heldAt !== undefined || held.confirmed || st.status === 'rolled_back')) {
    if (st.status === 'awaiting_confirmation') {
      a.confirmation = {
        status: 'awaiting_confirmation',
        ...(held.deadlineAt !== undefined ? { deadlineAt: held.deadlineAt } : {}),
      };
      // The preview is read like a result: the entry of this attempt whose digest the hold recorded
      // (not for a caller whose input differs: it learns that the key is taken, not what it holds).
      const mine = req.inputDigest === undefined || req.inputDigest === st.inputDigest;
      if (held.previewDigest && mine) {
        if (r.result === undefined)
          return { kind: 'read_result', attempt: st.attempt, resultDigest: held.previewDigest };
        if (r.result) a.confirmation.preview = r.result.result;
      }
    } else if (st.status === 'rolled_back') {
      a.confirmation = { status: 'rolled_back', reason: held.discarded ? 'discarded' : 'expired' };
    } else if (held.confirmed) a.confirmation = { status: 'confirmed' };
  }
  if (req.inputDigest !== undefined) a.inputMatches = req.inputDigest === st.inputDigest;
  if (req.submissionIds !== undefined) {
    a.ownAttempt = req.submissionIds.includes(st.intent.submissionId);
    if (st.status === 'rejected' && !a.ownAttempt) {
      // An earlier attempt's refusal: if the caller's own resubmission was refused at intake
      // (e.g. task_frozen), that refusal is the answer it waits for.
      if (r.decision === undefined) return { kind: 'read_decision' };
      if (ownRefusalSupersedes(st, actor, req, r.decision))
        return { kind: 'answer', answer: decisionAnswer(req.operationKey, r.decision, at) };
    }
    // A compensation another requester registered: each requester is authorised on its own, so a
    // caller whose own request of it was refused gets that refusal, never the operation's state.
    if (st.compensates && !a.ownAttempt) {
      if (r.decision === undefined) return { kind: 'read_decision' };
      const d = r.decision;
      const mine = d && d.actor === actor && req.submissionIds.includes(d.submissionId) ? d : null;
      if (mine?.outcome === 'rejected') return { kind: 'answer', answer: decisionAnswer(req.operationKey, mine, at) };
      if (mine?.outcome === 'replayed') a.replayed = true;
    }
  }
  if (a.state === 'committed' && st.receipt) {
    a.receipt = st.receipt;
    if (a.inputMatches !== false) {
      if (r.result === undefined)
        return { kind: 'read_result', attempt: st.attempt, resultDigest: st.receipt.resultDigest };
      if (r.result) a.result = r.result.result;
    }
  }
  if (st.status === 'rejected' && st.error) a.error = st.error;
  if (st.status === 'rolled_back') a.error = { class: ErrorClass.OperationDiscarded };
  if (st.status === 'unknown' && st.takeover) a.takeover = st.takeover;
  if (st.status === 'compensation_failed' && st.takeover?.reason === 'compensation_failed') a.takeover = st.takeover;
  return { kind: 'answer', answer: a };
}

/**
 * The answer's state for an operation's status. The held-back and compensation statuses are
 * answered as their nearest meaning for a caller, so one that knows neither still reads the answer
 * right: a committed operation being compensated, or compensated, is `committed` (its receipt stays
 * valid and is returned); a held-back one waiting is `accepted` (registered, not started); a
 * rolled-back one is `rejected` with `operation_discarded` (nothing happened). The answer's
 * `compensation` and `confirmation` fields tell them apart. Pure.
 */
export function serverStateOf(status: OperationRecord['status']): Exclude<ServerState, 'not_seen'> {
  switch (status) {
    case 'compensation_requested':
    case 'compensated':
    case 'compensation_failed':
      return 'committed';
    case 'awaiting_confirmation':
      return 'accepted';
    case 'rolled_back':
      return 'rejected';
    default:
      return status;
  }
}
