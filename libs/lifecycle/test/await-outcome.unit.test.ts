/**
 * How the SDK awaits a call's outcome (`decideAwait`), as given/when/then: given what the SDK knows
 * (its submissions' publish outcomes, the answers so far, the time left of its budget), when the
 * next thing happens (a publish ends, a status answer or a push comes, a request fails, a pause
 * ends), then the next step — submit, confirm, wait for the push, ask status, pause — or the answer
 * with its `next` action and evidence. `play` feeds events from the start, each at its time.
 */
import { describe, expect, it } from 'vitest';
import { digestOf, ErrorClass, NextAction, type ErrorInfo } from '@tooltx/contracts';
import {
  checkReceipt,
  decideAwait,
  generateReceiptKey,
  IDEMPOTENCY_CONFLICT,
  initialAwait,
  MAX_RETRYABLE_ATTEMPTS,
  PUSH_WAIT_MS,
  receiptSigner,
  STATUS_POLL_MS,
  trustedReceiptKeys,
  type AwaitCall,
  type AwaitContext,
  type AwaitDecision,
  type AwaitEvent,
  type PublishResult,
  type Receipt,
  type StatusAnswer,
  type TakeoverRecord,
  type UnsignedReceipt,
} from '@tooltx/lifecycle';

const KEY = `opk_${'A'.repeat(43)}`;
const CANONICAL = `opk_${'C'.repeat(43)}`;
const D1 = `sha256:${'1'.repeat(64)}`;
const T0 = 1_000_000;
const BUDGET = 30_000;
const RESULT = { id: 'note-1' };

const key = generateReceiptKey();
const signer = receiptSigner(key.privatePem);
const trusted = trustedReceiptKeys({ [key.keyId]: key.publicPem });
const stranger = receiptSigner(generateReceiptKey().privatePem);

function receiptFor(operationKey: string, over: Partial<UnsignedReceipt> = {}, by = signer): Receipt {
  const unsigned = {
    schema: 2,
    tenant: 'acme',
    operationKey,
    tool: 'kb.write_note',
    version: 1,
    state: 'committed',
    resourceId: 'note-1',
    resultDigest: digestOf(RESULT),
    committedAt: T0,
    attempt: 1,
    keyId: by.keyId,
    prevEventCount: 2,
    ...over,
  } as UnsignedReceipt;
  return { ...unsigned, signature: by.sign(unsigned) } as Receipt;
}

const call = (over: Partial<AwaitCall> = {}): AwaitCall => ({
  operationKey: KEY,
  inputDigest: D1,
  effect: 'create',
  forgedActor: false,
  startedAt: T0,
  deadlineAt: T0 + BUDGET,
  ...over,
});
const ctxAt = (ms: number, over: Partial<AwaitContext> = {}): AwaitContext => ({
  now: T0 + ms,
  pushSeen: false,
  checkReceipt: (operationKey, receipt) => checkReceipt({ operationKey, receipt }, trusted, 'acme'),
  ...over,
});

const start: AwaitEvent = { kind: 'start' };
const published = (
  result: PublishResult,
  o: { id?: string; unanswered?: number; pushable?: boolean } = {},
): AwaitEvent => ({
  kind: 'published',
  submissionId: o.id ?? 'sub-1',
  pushable: o.pushable ?? false,
  unanswered: o.unanswered ?? 0,
  result,
});
const acked = (o: { id?: string; unanswered?: number; pushable?: boolean } = {}) =>
  published({ kind: 'acked', duplicate: false }, o);
const answer = (a: Partial<StatusAnswer>): StatusAnswer => ({
  operationKey: KEY,
  state: 'accepted',
  source: 'operation',
  seq: 1,
  attempt: 1,
  at: T0,
  ...a,
});
const answered = (a: Partial<StatusAnswer>, pushed = false): AwaitEvent => ({
  kind: 'answered',
  answer: answer(a),
  pushed,
});
const committed = (over: Partial<StatusAnswer> = {}) =>
  answered({ state: 'committed', seq: 3, receipt: receiptFor(KEY), result: RESULT, ...over });
const failed = (error: ErrorInfo, reauthorise = false): AwaitEvent => ({ kind: 'status_failed', error, reauthorise });
const paused: AwaitEvent = { kind: 'paused' };

/** Plays `events` (each at its ms after the start) from the start of a call; the decisions, last one last. */
function play(
  events: [number, AwaitEvent][],
  o: { call?: Partial<AwaitCall>; ctx?: Partial<AwaitContext> } = {},
): AwaitDecision[] {
  let state = initialAwait(call(o.call));
  const out: AwaitDecision[] = [];
  for (const [ms, e] of events) {
    const d = decideAwait(state, e, ctxAt(ms, o.ctx));
    out.push(d);
    state = d.state;
  }
  return out;
}
const last = (events: [number, AwaitEvent][], o: Parameters<typeof play>[1] = {}) => play(events, o).at(-1)!;
/** A call whose first submission was stored at 10 ms. */
const stored: [number, AwaitEvent][] = [
  [0, start],
  [10, acked()],
];
const outcome = (d: AwaitDecision) => (d.step.kind === 'answer' ? d.step.outcome : undefined);

describe('submitting: the publish outcome of each submission', () => {
  it("given nothing sent, when the call starts, then submit at once under the id factory's id", () => {
    expect(last([[0, start]]).step).toEqual({ kind: 'submit', delayMs: 0, randomId: false });
  });

  it('given a submission acked, then the intent is stored and the operation is observed: one long-poll until a final answer', () => {
    const d = last(stored);
    expect(d.state).toMatchObject({ intentStored: true, submissionIds: ['sub-1'] });
    expect(d.step).toEqual({
      kind: 'ask_status',
      racePush: false,
      request: {
        operationKey: KEY,
        waitMs: STATUS_POLL_MS,
        afterSeq: 0,
        inputDigest: D1,
        submissionIds: ['sub-1'],
        untilFinal: true,
      },
    });
  });

  it('FM-31: given a first transmission acked as a duplicate (someone else used the id), then submit again at once under a random id', () => {
    const d = last([
      [0, start],
      [10, published({ kind: 'acked', duplicate: true })],
    ]);
    expect(d.step).toEqual({ kind: 'submit', delayMs: 0, randomId: true });
    expect(d.state).toMatchObject({ intentStored: false, idsGivenUp: 1 });
    // Every later submission of the call is random too.
    expect(
      last([
        [0, start],
        [10, published({ kind: 'acked', duplicate: true })],
        [20, acked({ id: 'sub-2' })],
        [STATUS_POLL_MS + 20, answered({ state: 'not_seen', seq: 0 })],
      ]).step,
    ).toMatchObject({ kind: 'submit', randomId: true });
  });

  it('FM-30: given a retransmission acked as a duplicate, then ask status once whether the intent was read', () => {
    const d = last([
      [0, start],
      [2_010, published({ kind: 'acked', duplicate: true }, { unanswered: 1 })],
    ]);
    expect(d.step).toEqual({
      kind: 'confirm_stored',
      request: { operationKey: KEY, waitMs: 0, inputDigest: D1, submissionIds: ['sub-1'] },
    });
    expect(d.state).toMatchObject({ intentStored: false, mayBeStored: true });
  });

  it("FM-30: given that check, when status reports the call's own attempt or a refusal of its submission, then stored; otherwise submit again at once under a random id", () => {
    const dup: [number, AwaitEvent][] = [
      [0, start],
      [2_010, published({ kind: 'acked', duplicate: true }, { unanswered: 1 })],
    ];
    const checked = (a: StatusAnswer | null) => last([...dup, [2_020, { kind: 'stored_checked', answer: a }]]);
    expect(checked(answer({ ownAttempt: true })).state.intentStored).toBe(true);
    expect(checked(answer({ ownAttempt: true })).step.kind).toBe('ask_status');
    expect(checked(answer({ state: 'rejected', source: 'decision', seq: 0 })).state.intentStored).toBe(true);
    for (const a of [answer({ state: 'not_seen', source: 'none', seq: 0 }), answer({ ownAttempt: false }), null]) {
      expect(checked(a).step).toEqual({ kind: 'submit', delayMs: 0, randomId: true });
    }
  });

  it('FM-30: given that check unanswered when the budget has ended, then unknown: observe, the intent not known stored', () => {
    const d = last([
      [0, start],
      [2_010, published({ kind: 'acked', duplicate: true }, { unanswered: 1 })],
      [BUDGET, { kind: 'stored_checked', answer: null }],
    ]);
    expect(outcome(d)).toMatchObject({
      status: 'unknown',
      next: NextAction.Observe,
      evidence: { intentStored: false, submissionIds: ['sub-1'] },
    });
  });

  it('FM-15: given JetStream refused the first transmission (the intake full), then rejected with the classified error: nothing was stored', () => {
    const full: ErrorInfo = { class: ErrorClass.QuotaExceeded, retryAfterMs: 1_000 };
    expect(
      outcome(
        last([
          [0, start],
          [10, published({ kind: 'refused', jsApiCode: 10077, error: full })],
        ]),
      ),
    ).toEqual({ status: 'rejected', operationKey: KEY, error: full, next: NextAction.WaitOrStop });
  });

  it('FM-15: given JetStream refused a publish after a transmission that got no answer, or after a stored submission, then unknown (observe), the evidence saying why', () => {
    const full: ErrorInfo = { class: ErrorClass.QuotaExceeded, retryAfterMs: 1_000 };
    const refused = published({ kind: 'refused', jsApiCode: 10077, error: full }, { unanswered: 1 });
    expect(
      outcome(
        last([
          [0, start],
          [4_000, refused],
        ]),
      ),
    ).toEqual({
      status: 'unknown',
      operationKey: KEY,
      lastServerState: 'not_seen',
      next: NextAction.Observe,
      error: full,
      evidence: {
        operationKey: KEY,
        submissionIds: ['sub-1'],
        intentStored: false,
        statusAnswered: false,
        lastSeq: 0,
        elapsedMs: 4_000,
        refusal: { jsApiCode: 10077, why: 'earlier_transmission_may_be_stored' },
      },
    });
    const later = last([
      ...stored,
      [STATUS_POLL_MS + 10, answered({ state: 'not_seen', seq: 0 })],
      [
        STATUS_POLL_MS + 20,
        published(
          { kind: 'refused', jsApiCode: 10023, error: { class: ErrorClass.DependencyUnavailable } },
          { id: 'sub-2' },
        ),
      ],
    ]);
    expect(outcome(later)).toMatchObject({
      status: 'unknown',
      next: NextAction.Observe,
      evidence: { intentStored: true, refusal: { jsApiCode: 10023 } },
    });
  });

  it('given the server refused the first publish of the intent (permissions), then rejected forbidden, reauthorise: never stored', () => {
    const forbidden: ErrorInfo = {
      class: ErrorClass.Forbidden,
      issues: [{ path: ['nkeyFile'], code: 'permission_violation', message: 'refused' }],
    };
    expect(
      outcome(
        last([
          [0, start],
          [10, published({ kind: 'denied', error: forbidden, intentPublish: true })],
        ]),
      ),
    ).toEqual({ status: 'rejected', operationKey: KEY, error: forbidden, next: NextAction.Reauthorise });
  });

  it('given the server refused the reply inbox, a retransmission or a later submission, or the credentials, then unknown, reauthorise, at once: an intent may be stored', () => {
    const forbidden: ErrorInfo = { class: ErrorClass.Forbidden };
    const unknownReauthorise = { status: 'unknown', next: NextAction.Reauthorise, error: forbidden };
    expect(
      outcome(
        last([
          [0, start],
          [10, published({ kind: 'denied', error: forbidden, intentPublish: false })],
        ]),
      ),
    ).toMatchObject(unknownReauthorise);
    expect(
      outcome(
        last([
          [0, start],
          [2_010, published({ kind: 'denied', error: forbidden, intentPublish: true }, { unanswered: 1 })],
        ]),
      ),
    ).toMatchObject(unknownReauthorise);
    expect(
      outcome(
        last([
          ...stored,
          [STATUS_POLL_MS + 10, answered({ state: 'not_seen', seq: 0 })],
          [STATUS_POLL_MS + 20, published({ kind: 'denied', error: forbidden, intentPublish: true }, { id: 'sub-2' })],
        ]),
      ),
    ).toMatchObject(unknownReauthorise);
    expect(
      outcome(
        last([
          [0, start],
          [10, published({ kind: 'credentials_refused', error: forbidden })],
        ]),
      ),
    ).toMatchObject(unknownReauthorise);
  });

  it('given no PubAck before the budget ended, then unknown, observe: the intent may be stored', () => {
    expect(
      outcome(
        last([
          [0, start],
          [BUDGET, published({ kind: 'no_ack' }, { unanswered: 15 })],
        ]),
      ),
    ).toMatchObject({
      status: 'unknown',
      next: NextAction.Observe,
      lastServerState: 'not_seen',
      evidence: { intentStored: false, statusAnswered: false, submissionIds: ['sub-1'], elapsedMs: BUDGET },
    });
  });
});

describe('observing: pushed answers, status long-polls, pauses', () => {
  it('given a submission whose push may come on a connection that has received pushes, then wait for the push alone first, then ask status raced by it', () => {
    const [, first, second] = play(
      [
        [0, start],
        [10, acked({ pushable: true })],
        [PUSH_WAIT_MS + 10, { kind: 'push_missed' }],
      ],
      { ctx: { pushSeen: true } },
    );
    expect(first!.step).toEqual({ kind: 'wait_push', ms: PUSH_WAIT_MS });
    expect(second!.step).toMatchObject({ kind: 'ask_status', racePush: true });
  });

  it('given a connection that has received no push yet, then ask status at once, raced by the push', () => {
    expect(
      last([
        [0, start],
        [10, acked({ pushable: true })],
      ]).step,
    ).toMatchObject({ kind: 'ask_status', racePush: true });
  });

  it('given a pushed answer taken, then what follows asks status without waiting for that push again', () => {
    const pushedWithoutResult = answered({ state: 'committed', seq: 3, receipt: receiptFor(KEY) }, true);
    const [, , taken, next] = play(
      [
        [0, start],
        [10, acked({ pushable: true })],
        [20, pushedWithoutResult],
        [220, paused],
      ],
      { ctx: { pushSeen: true } },
    );
    expect(taken!.step).toEqual({ kind: 'pause', ms: 200, wakeOnPush: false });
    expect(next!.step).toMatchObject({ kind: 'ask_status', racePush: false });
  });

  it('given under 2.1 s of budget left, then the status request does not wait; the next one is preceded by a 250 ms pause that the push ends', () => {
    const near = BUDGET - 2_000;
    const [, asked, again] = play([
      [0, start],
      [near, acked({ pushable: true })],
      [near + 5, answered({ state: 'running', seq: 2 })],
    ]);
    expect(asked!.step).toMatchObject({ kind: 'ask_status', request: { waitMs: 0 } });
    expect(again!.step).toEqual({ kind: 'pause', ms: 250, wakeOnPush: true });
    expect(
      last([
        [0, start],
        [near, acked()],
        [near + 5, answered({ state: 'running', seq: 2 })],
        [near + 255, paused],
      ]).step,
    ).toMatchObject({ kind: 'ask_status', request: { afterSeq: 2 } });
  });

  it('given the end of the budget near, then the push wait keeps 100 ms and the long-poll 2.1 s of it', () => {
    const [, wait, ask] = play(
      [
        [0, start],
        [BUDGET - 500, acked({ pushable: true })],
        [BUDGET - 100, { kind: 'push_missed' }],
      ],
      { ctx: { pushSeen: true } },
    );
    expect(wait!.step).toEqual({ kind: 'wait_push', ms: 400 });
    expect(ask!.step).toMatchObject({ kind: 'ask_status', request: { waitMs: 0 } });
    expect(
      last([
        [0, start],
        [BUDGET - 4_000, acked()],
      ]).step,
    ).toMatchObject({ request: { waitMs: 1_900 } });
  });

  it('given status requests that get no answer, then back off 200 ms doubling up to 3.2 s; an answer starts over', () => {
    const down = failed({ class: ErrorClass.DependencyUnavailable });
    const events: [number, AwaitEvent][] = [...stored];
    for (let i = 0; i < 6; i++) events.push([100 + i * 5_000, down], [101 + i * 5_000, paused]);
    const pauses = play(events)
      .filter((d) => d.step.kind === 'pause')
      .map((d) => (d.step as { ms: number }).ms);
    expect(pauses).toEqual([200, 400, 800, 1_600, 3_200, 3_200]);
    expect(last([...events, [29_000, answered({ state: 'running', seq: 2 })]]).state.statusFailures).toBe(0);
  });

  it('given a status request refused for another reason than an absent service, then rejected with its error', () => {
    const bad: ErrorInfo = {
      class: ErrorClass.InvalidInput,
      issues: [{ path: ['operationKey'], code: 'invalid', message: 'bad' }],
    };
    expect(outcome(last([...stored, [20, failed(bad)]]))).toEqual({
      status: 'rejected',
      operationKey: KEY,
      error: bad,
      next: NextAction.Replan,
    });
  });

  it('given the server refused a status request or the credentials while observing, then unknown, reauthorise, with what was seen', () => {
    const forbidden: ErrorInfo = { class: ErrorClass.Forbidden };
    expect(
      outcome(last([...stored, [20, answered({ state: 'running', seq: 2 })], [30, failed(forbidden, true)]])),
    ).toEqual({
      status: 'unknown',
      operationKey: KEY,
      lastServerState: 'running',
      next: NextAction.Reauthorise,
      error: forbidden,
      evidence: {
        operationKey: KEY,
        submissionIds: ['sub-1'],
        intentStored: true,
        statusAnswered: true,
        lastSeq: 2,
        attempt: 1,
        elapsedMs: 30,
      },
    });
  });
});

describe('answers: what a status (or pushed) answer means', () => {
  it("FM-06: given a refusal of the call's submission, then rejected with its error; a forged actor's refusal without a path names actorId", () => {
    const refusal = answered({ state: 'rejected', source: 'decision', seq: 0, error: { class: ErrorClass.Forbidden } });
    expect(outcome(last([...stored, [20, refusal]]))).toEqual({
      status: 'rejected',
      operationKey: KEY,
      error: { class: ErrorClass.Forbidden },
      next: NextAction.Reauthorise,
    });
    expect(outcome(last([...stored, [20, refusal]], { call: { forgedActor: true } }))).toMatchObject({
      error: { class: ErrorClass.Forbidden, issues: [{ path: ['actorId'], code: 'not_authenticated_actor' }] },
    });
    const frozen = answered({ state: 'rejected', source: 'decision', seq: 0, error: { class: ErrorClass.TaskFrozen } });
    expect(outcome(last([...stored, [20, frozen]], { call: { forgedActor: true } }))).toMatchObject({
      error: { class: ErrorClass.TaskFrozen },
      next: NextAction.HandOver,
    });
  });

  it('FM-03: given another input registered under the key, then rejected idempotency_conflict', () => {
    expect(outcome(last([...stored, [20, committed({ inputMatches: false, result: undefined })]]))).toEqual({
      status: 'rejected',
      operationKey: KEY,
      error: IDEMPOTENCY_CONFLICT,
      next: NextAction.Replan,
    });
  });

  it('given not_seen after a stored submission, then ask again; 5 s after the submission, submit again', () => {
    const notSeen = answered({ state: 'not_seen', source: 'none', seq: 0 });
    expect(last([...stored, [STATUS_POLL_MS, notSeen]]).step).toMatchObject({
      kind: 'ask_status',
      request: { afterSeq: 0 },
    });
    expect(last([...stored, [STATUS_POLL_MS + 10, notSeen]]).step).toEqual({
      kind: 'submit',
      delayMs: 0,
      randomId: false,
    });
  });

  it('given not_seen when no submission was stored, then submit again at once', () => {
    expect(
      last([
        [0, start],
        [10, published({ kind: 'no_ack' }, { unanswered: 1 })],
        [20, answered({ state: 'not_seen', source: 'none', seq: 0 })],
      ]).step,
    ).toMatchObject({ kind: 'submit' });
  });

  it('FM-17: given committed with a receipt that checks and its result, then committed with the result apart from the receipt', () => {
    expect(outcome(last([...stored, [20, committed()]]))).toEqual({
      status: 'committed',
      operationKey: KEY,
      result: RESULT,
      receipt: receiptFor(KEY),
      next: 'continue',
    });
  });

  it("FM-10: given an answer that names the canonical key, then a commit is the canonical operation's, a refusal names the derived key", () => {
    const viaAlias = committed({ canonicalKey: CANONICAL, receipt: receiptFor(CANONICAL) });
    expect(outcome(last([...stored, [20, viaAlias]]))).toMatchObject({ status: 'committed', operationKey: CANONICAL });
    const refusedViaAlias = answered({
      canonicalKey: CANONICAL,
      state: 'rejected',
      error: { class: ErrorClass.Forbidden },
      ownAttempt: true,
    });
    expect(outcome(last([...stored, [20, refusedViaAlias]]))).toMatchObject({ status: 'rejected', operationKey: KEY });
    expect(
      outcome(
        last([...stored, [20, answered({ canonicalKey: CANONICAL, state: 'running', seq: 2 })], [BUDGET, paused]]),
      ),
    ).toMatchObject({ status: 'unknown', operationKey: CANONICAL, evidence: { operationKey: CANONICAL } });
  });

  it("given committed whose result is not readable yet or does not match the receipt's digest, then pause 200 ms and ask again", () => {
    for (const result of [undefined, { id: 'note-2' }]) {
      expect(last([...stored, [20, committed({ result })]]).step).toEqual({
        kind: 'pause',
        ms: 200,
        wakeOnPush: false,
      });
    }
  });

  it("FM-14: given a person's resolution without a business result, then committed with the receipt as the outcome", () => {
    const manual = receiptFor(KEY, { manual: true, resolvedBy: 'op-1' });
    expect(outcome(last([...stored, [20, committed({ receipt: manual, result: undefined })]]))).toEqual({
      status: 'committed',
      operationKey: KEY,
      result: undefined,
      receipt: manual,
      next: 'continue',
    });
  });

  it('FM-17: given committed with a receipt under a key this SDK does not trust, then unknown, hand over, at once', () => {
    expect(outcome(last([...stored, [20, committed({ receipt: receiptFor(KEY, {}, stranger) })]]))).toMatchObject({
      status: 'unknown',
      lastServerState: 'committed',
      next: NextAction.HandOver,
      evidence: { invalidReceipt: 'untrusted_key', statusAnswered: true, lastSeq: 3 },
    });
  });

  it("FM-17: given committed with a tampered receipt, then pause 500 ms and observe on; at the budget's end, unknown, hand over", () => {
    const tampered = { ...receiptFor(KEY), resourceId: 'note-9' };
    expect(last([...stored, [20, committed({ receipt: tampered })]]).step).toEqual({
      kind: 'pause',
      ms: 500,
      wakeOnPush: false,
    });
    expect(outcome(last([...stored, [20, committed({ receipt: tampered })], [BUDGET, paused]]))).toMatchObject({
      status: 'unknown',
      next: NextAction.HandOver,
      evidence: { invalidReceipt: 'bad_signature' },
    });
  });

  it('FM-14: given unknown under takeover, then unknown, hand over, with the takeover record', () => {
    const takeover = { reason: 'unknown_past_deadline' } as TakeoverRecord;
    expect(outcome(last([...stored, [20, answered({ state: 'unknown', seq: 4, takeover })]]))).toEqual({
      status: 'unknown',
      operationKey: KEY,
      lastServerState: 'unknown',
      next: NextAction.HandOver,
      evidence: {
        operationKey: KEY,
        submissionIds: ['sub-1'],
        intentStored: true,
        statusAnswered: true,
        lastSeq: 4,
        attempt: 1,
        elapsedMs: 20,
        takeover,
      },
    });
  });

  it("given unknown without a takeover, then observe on; at the budget's end, unknown, hand over", () => {
    expect(last([...stored, [20, answered({ state: 'unknown', seq: 3 })]]).step).toMatchObject({
      kind: 'ask_status',
      request: { afterSeq: 3 },
    });
    expect(outcome(last([...stored, [20, answered({ state: 'unknown', seq: 3 })], [BUDGET, paused]]))).toMatchObject({
      status: 'unknown',
      lastServerState: 'unknown',
      next: NextAction.HandOver,
    });
  });

  it("given an earlier attempt's refusal (not the call's own), then wait for the new attempt; 5 s after the submission, submit again", () => {
    const old = answered({ state: 'rejected', seq: 2, ownAttempt: false, error: { class: ErrorClass.Forbidden } });
    expect(last([...stored, [20, old]]).step).toMatchObject({ kind: 'ask_status' });
    expect(last([...stored, [STATUS_POLL_MS + 10, old]]).step).toEqual({ kind: 'submit', delayMs: 0, randomId: false });
  });

  it('FM-15: given a side effect rejected as dependency_unavailable, then rejected with its attempt, back off: never resubmitted by the SDK', () => {
    expect(
      outcome(
        last([
          ...stored,
          [
            20,
            answered({
              state: 'rejected',
              seq: 2,
              attempt: 2,
              ownAttempt: true,
              error: { class: ErrorClass.DependencyUnavailable },
            }),
          ],
        ]),
      ),
    ).toEqual({
      status: 'rejected',
      operationKey: KEY,
      error: { class: ErrorClass.DependencyUnavailable },
      next: NextAction.Backoff,
      attempt: 2,
    });
  });

  it(`FM-15: given a read rejected as dependency_unavailable, then resubmitted after 400 ms doubling, until ${MAX_RETRYABLE_ATTEMPTS} attempts were refused`, () => {
    const down = (attempt: number) =>
      answered({
        state: 'rejected',
        seq: 2 * attempt,
        attempt,
        ownAttempt: true,
        error: { class: ErrorClass.DependencyUnavailable },
      });
    const events: [number, AwaitEvent][] = [...stored];
    const steps: unknown[] = [];
    for (let attempt = 1; attempt <= MAX_RETRYABLE_ATTEMPTS; attempt++) {
      events.push([attempt * 1_000, down(attempt)]);
      steps.push(last(events, { call: { effect: 'read' } }).step);
      events.push([attempt * 1_000 + 500, acked({ id: `sub-${attempt + 1}` })]);
    }
    expect(steps.slice(0, -1)).toEqual(
      [400, 800, 1_600, 3_200].map((delayMs) => ({ kind: 'submit', delayMs, randomId: false })),
    );
    expect(steps.at(-1)).toEqual({
      kind: 'answer',
      outcome: {
        status: 'rejected',
        operationKey: KEY,
        error: { class: ErrorClass.DependencyUnavailable },
        next: NextAction.Backoff,
        attempt: MAX_RETRYABLE_ATTEMPTS,
      },
    });
  });

  it('given a read refused for another reason, then rejected at once; a backoff never outlasts the budget', () => {
    expect(
      outcome(
        last(
          [
            ...stored,
            [20, answered({ state: 'rejected', seq: 2, ownAttempt: true, error: { class: ErrorClass.Forbidden } })],
          ],
          { call: { effect: 'compute' } },
        ),
      ),
    ).toMatchObject({ status: 'rejected', error: { class: ErrorClass.Forbidden } });
    expect(
      last(
        [
          ...stored,
          [
            BUDGET - 100,
            answered({
              state: 'rejected',
              seq: 2,
              ownAttempt: true,
              error: { class: ErrorClass.DependencyUnavailable },
            }),
          ],
        ],
        { call: { effect: 'read' } },
      ).step,
    ).toEqual({ kind: 'submit', delayMs: 100, randomId: false });
  });
});

describe('the budget ends: unknown with what was seen', () => {
  it('given the operation seen running, then unknown, observe, with its last state, seq, attempt and the submissions', () => {
    expect(
      outcome(last([...stored, [20, answered({ state: 'running', seq: 2, attempt: 1 })], [BUDGET + 5, paused]])),
    ).toEqual({
      status: 'unknown',
      operationKey: KEY,
      lastServerState: 'running',
      next: NextAction.Observe,
      evidence: {
        operationKey: KEY,
        submissionIds: ['sub-1'],
        intentStored: true,
        statusAnswered: true,
        lastSeq: 2,
        attempt: 1,
        elapsedMs: BUDGET + 5,
      },
    });
  });

  it('given no status answer at all, then unknown, observe, nothing answered', () => {
    expect(
      outcome(last([...stored, [BUDGET - 1, failed({ class: ErrorClass.DependencyUnavailable })], [BUDGET, paused]])),
    ).toMatchObject({
      status: 'unknown',
      lastServerState: 'not_seen',
      next: NextAction.Observe,
      evidence: { statusAnswered: false, lastSeq: 0, intentStored: true },
    });
  });
});

describe('the receipt check of a committed outcome (FM-17)', () => {
  it('given a receipt signed under a trusted key for the tenant and key, then valid; with its result, valid only when the digest matches', () => {
    expect(checkReceipt({ operationKey: KEY, receipt: receiptFor(KEY) }, trusted, 'acme')).toEqual({ valid: true });
    expect(checkReceipt({ operationKey: KEY, receipt: receiptFor(KEY), result: RESULT }, trusted, 'acme')).toEqual({
      valid: true,
    });
    expect(
      checkReceipt({ operationKey: KEY, receipt: receiptFor(KEY), result: { id: 'note-2' } }, trusted, 'acme'),
    ).toEqual({ valid: false, reason: 'result_mismatch' });
  });

  it('given an untrusted key, a broken signature, another tenant or another key, then not valid, and why', () => {
    expect(checkReceipt({ operationKey: KEY, receipt: receiptFor(KEY, {}, stranger) }, trusted, 'acme')).toEqual({
      valid: false,
      reason: 'untrusted_key',
    });
    expect(checkReceipt({ operationKey: KEY, receipt: { ...receiptFor(KEY), attempt: 2 } }, trusted, 'acme')).toEqual({
      valid: false,
      reason: 'bad_signature',
    });
    expect(checkReceipt({ operationKey: KEY, receipt: receiptFor(KEY) }, trusted, 'globex')).toEqual({
      valid: false,
      reason: 'other_operation',
    });
    expect(checkReceipt({ operationKey: CANONICAL, receipt: receiptFor(KEY) }, trusted, 'acme')).toEqual({
      valid: false,
      reason: 'other_operation',
    });
    expect(
      checkReceipt({ operationKey: KEY, receipt: { not: 'a receipt' } as unknown as Receipt }, trusted, 'acme'),
    ).toEqual({ valid: false, reason: 'untrusted_key' });
  });
});

describe('a repeat of a call this caller saw committed: a read first', () => {
  const known = { call: { knownCommitted: true } };

  it('given the key known committed, when the call starts, then its status is read before anything is submitted', () => {
    expect(last([[0, start]], known).step).toEqual({
      kind: 'ask_status',
      racePush: false,
      request: { operationKey: KEY, inputDigest: D1 },
    });
  });

  it('given the read answers committed with a valid receipt, then that is the outcome: nothing is submitted', () => {
    const d = last(
      [
        [0, start],
        [2, committed()],
      ],
      known,
    );
    expect(outcome(d)).toMatchObject({ status: 'committed', operationKey: KEY, result: RESULT });
    expect(d.state.submissionIds).toEqual([]);
  });

  it('given the read answers anything but committed (gone past retention, another input, an alias), then the call is submitted as usual', () => {
    for (const a of [
      answered({ state: 'not_seen', source: 'none', seq: 0 }),
      committed({ inputMatches: false }),
      committed({ canonicalKey: CANONICAL }),
      answered({ state: 'unknown' }),
    ]) {
      const d = last(
        [
          [0, start],
          [2, a],
        ],
        known,
      );
      expect(d.step).toEqual({ kind: 'submit', delayMs: 0, randomId: false });
      expect(d.state.readFirst).toBe(false);
    }
  });

  it('given the read fails, then the call is submitted as usual', () => {
    const d = last(
      [
        [0, start],
        [2, failed({ class: ErrorClass.DependencyUnavailable })],
      ],
      known,
    );
    expect(d.step).toEqual({ kind: 'submit', delayMs: 0, randomId: false });
  });

  it('FM-17: given the read answers committed under a key nobody trusts, then it is not taken as the outcome', () => {
    const d = last(
      [
        [0, start],
        [2, committed({ receipt: receiptFor(KEY, {}, stranger) })],
      ],
      known,
    );
    expect(outcome(d)).toMatchObject({ status: 'unknown', evidence: { invalidReceipt: 'untrusted_key' } });
  });
});

describe('a held-back call (its contract declares confirm)', () => {
  it('given it waits for its confirmation, then awaiting_confirmation with the preview and its deadline: confirm or discard', () => {
    const d = last([
      ...stored,
      [
        50,
        answered({
          state: 'accepted',
          seq: 2,
          confirmation: { status: 'awaiting_confirmation', deadlineAt: T0 + 60_000, preview: { draftId: 'd-1' } },
        }),
      ],
    ]);
    expect(outcome(d)).toEqual({
      status: 'awaiting_confirmation',
      operationKey: KEY,
      preview: { draftId: 'd-1' },
      deadlineAt: T0 + 60_000,
      next: NextAction.ConfirmOrDiscard,
    });
  });

  it('given it is still preparing, then it is observed on', () => {
    expect(last([...stored, [50, answered({ state: 'accepted', seq: 1 })]]).step.kind).not.toBe('answer');
  });

  it("given it was rolled back, even under another submission's attempt, then rejected operation_discarded at once", () => {
    const d = last([
      ...stored,
      [
        50,
        answered({
          state: 'rejected',
          seq: 3,
          ownAttempt: false,
          error: { class: ErrorClass.OperationDiscarded },
          confirmation: { status: 'rolled_back', reason: 'discarded' },
        }),
      ],
    ]);
    expect(outcome(d)).toMatchObject({ status: 'rejected', error: { class: 'operation_discarded' }, next: 'replan' });
  });
});
