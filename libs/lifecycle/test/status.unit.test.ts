/**
 * Status precedence (`statusStep`), as given/when/then: given what the status endpoint read (the
 * operation the caller may read or null, the caller's last decision record, the readable result),
 * when it asks for the next step, then the answer — or what it must read next. `answerOf` plays
 * the endpoint's reads against a fixed world, as the read side does against the store.
 */
import { describe, expect, it } from 'vitest';
import {
  decide,
  decisionRecordSchema,
  EVENT_SCHEMA_VERSION,
  eventCountOf,
  generateReceiptKey,
  receiptSigner,
  statusAnswerSchema,
  statusSettled,
  statusStep,
  takeoverRecordOf,
  type AcceptCommand,
  type DecisionRecord,
  type OperationEvent,
  type OperationRecord,
  type OperationState,
  type StatusAnswer,
  type StatusReads,
  type StatusRequest,
} from '@tooltx/lifecycle';

const signer = receiptSigner(generateReceiptKey().privatePem);
const D1 = `sha256:${'1'.repeat(64)}`;
const D2 = `sha256:${'2'.repeat(64)}`;
const D3 = `sha256:${'3'.repeat(64)}`;
const KEY = `opk_${'A'.repeat(43)}`;
const ALIAS_KEY = `opk_${'B'.repeat(43)}`;
const AT = 50_000;

let n = 0;
const id = () => `evt-${String(++n).padStart(8, '0')}`;
function after(state: OperationState, cmd: Parameters<typeof decide>[0]): OperationRecord {
  const d = decide(cmd, state, { signer });
  if (d.kind !== 'append') throw new Error(`expected append, got ${d.kind}`);
  return (d.event as OperationEvent).state;
}
const accept: AcceptCommand = {
  type: 'accept',
  eventId: 'evt-a0000000',
  at: 1_000,
  operationKey: KEY,
  tenant: 'acme',
  actor: 'alice',
  taskId: 'task-1',
  tool: 'kb.write_note',
  version: 1,
  contractDigest: D1,
  effect: 'create',
  inputDigest: D1,
  targetDigest: D2,
  intentSeq: 10,
  submissionId: 'sub-1',
};
const accepted = () => after({ status: 'none' }, accept);
const running = () =>
  after(accepted(), { type: 'start', eventId: id(), at: 2_000, attempt: 1, executor: 'ex-1', deadlineAt: 5_000 });
const committed = () =>
  after(running(), { type: 'commit', eventId: id(), at: 3_000, attempt: 1, resourceId: 'note-1', resultDigest: D3 });
const rejected = () =>
  after(accepted(), { type: 'reject', eventId: id(), at: 2_500, attempt: 1, error: { class: 'forbidden' } });
const unknown = () =>
  after(running(), {
    type: 'mark_unknown',
    eventId: id(),
    at: 6_000,
    attempt: 1,
    evidence: { kind: 'timeout', at: 6_000, elapsedMs: 4_000 },
  });
const underTakeover = () => {
  const u = unknown();
  return after(u, {
    type: 'open_takeover',
    eventId: id(),
    at: 9_000,
    attempt: 1,
    takeover: takeoverRecordOf(u, { reason: 'unknown_past_deadline', probes: 3 }, 9_000),
  });
};

/** The caller's refusal at intake of `sub-2` (after the operation's refusal at 2,500). */
const refusal = (over: { at?: number; actor?: string } = {}): DecisionRecord =>
  decisionRecordSchema.parse({
    schema: EVENT_SCHEMA_VERSION,
    type: 'decision',
    eventId: id(),
    at: 10_000,
    operationKey: KEY,
    tenant: 'acme',
    actor: 'alice',
    submissionId: 'sub-2',
    outcome: 'rejected',
    error: { class: 'task_frozen' },
    ...over,
  });
/** `sub-1` named its target through an alias: its key ALIAS_KEY (digest D2) names KEY (digest D1). */
const alias = (over: { actor?: string } = {}): DecisionRecord =>
  decisionRecordSchema.parse({
    schema: EVENT_SCHEMA_VERSION,
    type: 'decision',
    eventId: id(),
    at: 900,
    operationKey: ALIAS_KEY,
    tenant: 'acme',
    actor: 'alice',
    submissionId: 'sub-1',
    outcome: 'aliased',
    canonicalKey: KEY,
    inputDigest: D2,
    canonicalInputDigest: D1,
    ...over,
  });

/**
 * The world the endpoint reads: operations the caller may read by key, the caller's decisions by
 * key (one, or several oldest first), the results by key. Returns the answer and the reads it took.
 */
function answerOf(
  req: StatusRequest,
  world: {
    readable?: Record<string, OperationRecord>;
    decisions?: Record<string, DecisionRecord | DecisionRecord[]>;
    results?: Record<string, unknown>;
  },
  actor = 'alice',
): { answer: StatusAnswer; reads: string[] } {
  const done: string[] = [];
  let reads: StatusReads = { req, actor, at: AT, operation: world.readable?.[req.operationKey] ?? null };
  for (let i = 0; i < 10; i++) {
    const step = statusStep(reads);
    if (step.kind === 'answer') return { answer: step.answer, reads: done };
    if (step.kind === 'read_decision') {
      done.push(`decision ${step.operationKey}${step.submissionIds ? ` of ${step.submissionIds.join(',')}` : ''}`);
      const all = [world.decisions?.[step.operationKey] ?? []].flat();
      const ids = step.submissionIds;
      reads = {
        ...reads,
        decision: (ids ? all.findLast((d) => ids.includes(d.submissionId)) : all.at(-1)) ?? null,
      };
    } else if (step.kind === 'read_result') {
      done.push(`result ${step.operationKey}@${step.attempt}`);
      reads = {
        ...reads,
        result: step.operationKey in (world.results ?? {}) ? { result: world.results![step.operationKey] } : null,
      };
    } else {
      done.push(`alias ${step.alias.canonicalKey}`);
      reads = {
        req: step.asked,
        actor,
        at: AT,
        operation: world.readable?.[step.alias.canonicalKey] ?? null,
        alias: step.alias,
      };
    }
  }
  throw new Error('statusStep did not settle');
}

describe('status precedence: a readable operation answers from its own subject', () => {
  it("given a committed operation and the caller's own input, then the receipt and the result, seq = its own event count", () => {
    const st = committed();
    const { answer, reads } = answerOf(
      { operationKey: KEY, inputDigest: D1, submissionIds: ['sub-1'] },
      { readable: { [KEY]: st }, results: { [KEY]: { id: 'note-1' } } },
    );
    expect(answer).toEqual({
      operationKey: KEY,
      state: 'committed',
      source: 'operation',
      contract: 'kb.write_note@1',
      seq: eventCountOf(st),
      attempt: 1,
      at: AT,
      inputMatches: true,
      ownAttempt: true,
      receipt: st.receipt,
      result: { id: 'note-1' },
    });
    expect(reads).toEqual([`result ${KEY}@1`]);
    expect(statusAnswerSchema.parse(answer)).toEqual(answer);
  });

  it('FM-03: given a committed operation and another input under the key, then inputMatches false and the receipt, never the result (not even read)', () => {
    const { answer, reads } = answerOf(
      { operationKey: KEY, inputDigest: D2 },
      { readable: { [KEY]: committed() }, results: { [KEY]: { secret: 1 } } },
    );
    expect(answer).toMatchObject({ state: 'committed', inputMatches: false, receipt: expect.any(Object) });
    expect(answer).not.toHaveProperty('result');
    expect(reads).toEqual([]);
  });

  it("given a committed operation whose result is not readable (not stored yet, another attempt's), then the receipt without a result", () => {
    const { answer } = answerOf({ operationKey: KEY }, { readable: { [KEY]: committed() } });
    expect(answer).toMatchObject({ state: 'committed', receipt: expect.any(Object) });
    expect(answer).not.toHaveProperty('result');
    expect(answer).not.toHaveProperty('inputMatches');
    expect(answer).not.toHaveProperty('ownAttempt');
  });

  it('given an operation in flight, then its state and nothing final; inputMatches and ownAttempt only when asked', () => {
    expect(answerOf({ operationKey: KEY }, { readable: { [KEY]: running() } }).answer).toEqual({
      operationKey: KEY,
      state: 'running',
      source: 'operation',
      contract: 'kb.write_note@1',
      seq: 2,
      attempt: 1,
      at: AT,
    });
    expect(
      answerOf({ operationKey: KEY, inputDigest: D1, submissionIds: ['sub-9'] }, { readable: { [KEY]: accepted() } })
        .answer,
    ).toMatchObject({ state: 'accepted', seq: 1, inputMatches: true, ownAttempt: false });
  });

  it('given a rejected operation the caller started, then its error', () => {
    expect(answerOf({ operationKey: KEY, submissionIds: ['sub-1'] }, { readable: { [KEY]: rejected() } })).toEqual({
      answer: {
        operationKey: KEY,
        state: 'rejected',
        source: 'operation',
        contract: 'kb.write_note@1',
        seq: 2,
        attempt: 1,
        at: AT,
        ownAttempt: true,
        error: { class: 'forbidden' },
      },
      reads: [],
    });
  });

  it("given an operation rejected in an earlier attempt and the caller's own later refusal at intake, then that refusal answers from `decision`", () => {
    const { answer, reads } = answerOf(
      { operationKey: KEY, submissionIds: ['sub-2'] },
      { readable: { [KEY]: rejected() }, decisions: { [KEY]: refusal() } },
    );
    expect(answer).toEqual({
      operationKey: KEY,
      state: 'rejected',
      source: 'decision',
      seq: 0,
      error: { class: 'task_frozen' },
      submissionId: 'sub-2',
      at: AT,
    });
    expect(reads).toEqual([`decision ${KEY} of sub-2`]);
  });

  it("given an operation rejected in an earlier attempt and no later refusal of the caller's, then the old refusal with ownAttempt false", () => {
    const { answer } = answerOf(
      { operationKey: KEY, submissionIds: ['sub-2'] },
      { readable: { [KEY]: rejected() }, decisions: { [KEY]: refusal({ at: 100 }) } },
    );
    expect(answer).toMatchObject({
      state: 'rejected',
      source: 'operation',
      contract: 'kb.write_note@1',
      ownAttempt: false,
      error: { class: 'forbidden' },
    });
  });

  it("given a compensation another requester registered, then a caller whose own request of it was refused gets that refusal, never the compensation's state; one not refused gets the replay", () => {
    const compensation = after(
      after(
        after(
          { status: 'none' },
          { ...accept, compensates: { operationKey: ALIAS_KEY, tool: 'kb.write_note', version: 1 } },
        ),
        {
          type: 'start',
          eventId: id(),
          at: 2_000,
          attempt: 1,
          executor: 'ex-1',
          deadlineAt: 5_000,
        },
      ),
      { type: 'commit', eventId: id(), at: 3_000, attempt: 1, resourceId: 'note-1', resultDigest: D3 },
    );
    const refusedBob = refusal({ actor: 'bob', at: 2_000 });
    const bob = answerOf(
      { operationKey: KEY, submissionIds: ['sub-2'] },
      { readable: { [KEY]: compensation }, decisions: { [KEY]: refusedBob } },
      'bob',
    );
    expect(bob.answer).toEqual({
      operationKey: KEY,
      state: 'rejected',
      source: 'decision',
      seq: 0,
      error: { class: 'task_frozen' },
      submissionId: 'sub-2',
      at: AT,
    });
    // Bob's request answered with the replay: the compensation answers, saying so.
    const replayedBob = decisionRecordSchema.parse({
      ...refusedBob,
      eventId: id(),
      submissionId: 'sub-3',
      outcome: 'replayed',
      error: undefined,
      requestedBy: { kind: 'actor', id: 'bob' },
      reasonDigest: D2,
    });
    expect(
      answerOf(
        { operationKey: KEY, submissionIds: ['sub-3'] },
        { readable: { [KEY]: compensation }, decisions: { [KEY]: replayedBob }, results: { [KEY]: {} } },
        'bob',
      ).answer,
    ).toMatchObject({ state: 'committed', source: 'operation', ownAttempt: false, replayed: true });
    // Another submission of bob's, not judged yet: the compensation answers, not saying it was replayed.
    const replay = answerOf(
      { operationKey: KEY, submissionIds: ['sub-3'] },
      { readable: { [KEY]: compensation }, decisions: { [KEY]: refusedBob }, results: { [KEY]: {} } },
      'bob',
    );
    expect(replay.answer).toMatchObject({
      state: 'committed',
      source: 'operation',
      ownAttempt: false,
      compensates: ALIAS_KEY,
    });
    expect(replay.answer).not.toHaveProperty('replayed');
    // Three requests of bob's at once: each is answered by its own record, however many of its
    // other requests were recorded after it (FM-21).
    const sub4 = { ...replayedBob, eventId: id(), submissionId: 'sub-4' };
    const sub5 = { ...refusedBob, eventId: id(), submissionId: 'sub-5' };
    const world = {
      readable: { [KEY]: compensation },
      decisions: { [KEY]: [replayedBob, sub4, sub5] },
      results: { [KEY]: {} },
    };
    const third = answerOf({ operationKey: KEY, submissionIds: ['sub-3'] }, world, 'bob');
    expect(third.answer).toMatchObject({ state: 'committed', ownAttempt: false, replayed: true });
    expect(third.reads).toContain(`decision ${KEY} of sub-3`);
    expect(answerOf({ operationKey: KEY, submissionIds: ['sub-4'] }, world, 'bob').answer).toMatchObject({
      state: 'committed',
      replayed: true,
    });
    expect(answerOf({ operationKey: KEY, submissionIds: ['sub-5'] }, world, 'bob').answer).toMatchObject({
      state: 'rejected',
      source: 'decision',
      submissionId: 'sub-5',
    });
  });

  it('FM-14: given an unknown operation under takeover, then the takeover record; without one, none', () => {
    const t = underTakeover();
    expect(answerOf({ operationKey: KEY }, { readable: { [KEY]: t } }).answer).toMatchObject({
      state: 'unknown',
      takeover: t.takeover,
    });
    expect(answerOf({ operationKey: KEY }, { readable: { [KEY]: unknown() } }).answer).not.toHaveProperty('takeover');
  });
});

describe("status precedence: no readable operation answers from the caller's decision, else not_seen", () => {
  it('given nothing registered and no decision, then not_seen after one decision read', () => {
    expect(answerOf({ operationKey: KEY }, {})).toEqual({
      answer: { operationKey: KEY, state: 'not_seen', source: 'none', seq: 0, at: AT },
      reads: [`decision ${KEY}`],
    });
  });

  it("given a refusal of one of the caller's submissions, then rejected from `decision` with its error and submission id", () => {
    const answer = {
      operationKey: KEY,
      state: 'rejected',
      source: 'decision',
      seq: 0,
      error: { class: 'task_frozen' },
      submissionId: 'sub-2',
      at: AT,
    };
    expect(
      answerOf({ operationKey: KEY, submissionIds: ['sub-1', 'sub-2'] }, { decisions: { [KEY]: refusal() } }).answer,
    ).toEqual(answer);
    // A caller that lists no submissions is answered with its own last refusal.
    expect(answerOf({ operationKey: KEY }, { decisions: { [KEY]: refusal() } }).answer).toEqual(answer);
  });

  it('given a refusal of a submission the caller does not list, then not_seen', () => {
    expect(
      answerOf({ operationKey: KEY, submissionIds: ['sub-1'] }, { decisions: { [KEY]: refusal() } }).answer,
    ).toMatchObject({ state: 'not_seen', source: 'none' });
  });

  it("given another actor's refusal, then it is not revealed: not_seen", () => {
    const answer = answerOf({ operationKey: KEY }, { decisions: { [KEY]: refusal({ actor: 'mallory' }) } }).answer;
    expect(answer).toEqual({ operationKey: KEY, state: 'not_seen', source: 'none', seq: 0, at: AT });
    // Nor another actor's alias.
    expect(
      answerOf(
        { operationKey: ALIAS_KEY },
        { readable: { [KEY]: committed() }, decisions: { [ALIAS_KEY]: alias({ actor: 'mallory' }) } },
      ).answer,
    ).toEqual({ operationKey: ALIAS_KEY, state: 'not_seen', source: 'none', seq: 0, at: AT });
  });
});

describe('status precedence: an alias answers from the canonical operation (FM-10)', () => {
  it("given an alias, when asked with the alias's own digest, then follow it with the digest mapped to the canonical input's", () => {
    expect(
      statusStep({
        req: { operationKey: ALIAS_KEY, inputDigest: D2, waitMs: 5 },
        actor: 'alice',
        at: AT,
        operation: null,
        decision: alias(),
      }),
    ).toEqual({
      kind: 'follow_alias',
      asked: { operationKey: ALIAS_KEY, inputDigest: D1, waitMs: 5 },
      alias: { submittedKey: ALIAS_KEY, canonicalKey: KEY },
    });
    // Another digest stays as it is (a conflict under the canonical key); none stays none.
    expect(
      statusStep({
        req: { operationKey: ALIAS_KEY, inputDigest: D3 },
        actor: 'alice',
        at: AT,
        operation: null,
        decision: alias(),
      }),
    ).toMatchObject({ asked: { inputDigest: D3 } });
    expect(
      statusStep({ req: { operationKey: ALIAS_KEY }, actor: 'alice', at: AT, operation: null, decision: alias() }),
    ).toMatchObject({ asked: { operationKey: ALIAS_KEY } });
  });

  it('given an alias of a committed operation, then its answer under the submitted key with canonicalKey, the result read from the canonical key', () => {
    const st = committed();
    const { answer, reads } = answerOf(
      { operationKey: ALIAS_KEY, inputDigest: D2, submissionIds: ['sub-1'] },
      { readable: { [KEY]: st }, decisions: { [ALIAS_KEY]: alias() }, results: { [KEY]: { id: 'note-1' } } },
    );
    expect(answer).toEqual({
      operationKey: ALIAS_KEY,
      state: 'committed',
      source: 'operation',
      contract: 'kb.write_note@1',
      seq: eventCountOf(st),
      attempt: 1,
      at: AT,
      inputMatches: true,
      ownAttempt: true,
      receipt: st.receipt,
      result: { id: 'note-1' },
      canonicalKey: KEY,
    });
    expect(answer.receipt?.operationKey).toBe(KEY);
    expect(reads).toEqual([`decision ${ALIAS_KEY}`, `alias ${KEY}`, `result ${KEY}@1`]);
  });

  it("given an alias and another input than the alias's (FM-03), then the canonical receipt without the result", () => {
    const { answer } = answerOf(
      { operationKey: ALIAS_KEY, inputDigest: D3 },
      { readable: { [KEY]: committed() }, decisions: { [ALIAS_KEY]: alias() }, results: { [KEY]: { id: 'note-1' } } },
    );
    expect(answer).toMatchObject({
      operationKey: ALIAS_KEY,
      canonicalKey: KEY,
      inputMatches: false,
      receipt: expect.any(Object),
    });
    expect(answer).not.toHaveProperty('result');
  });

  it("given an alias of an operation rejected in an earlier attempt, then the caller's own later refusal under the canonical key answers, still under the submitted key", () => {
    const { answer, reads } = answerOf(
      { operationKey: ALIAS_KEY, submissionIds: ['sub-2'] },
      { readable: { [KEY]: rejected() }, decisions: { [ALIAS_KEY]: alias(), [KEY]: refusal() } },
    );
    expect(answer).toEqual({
      operationKey: ALIAS_KEY,
      state: 'rejected',
      source: 'decision',
      seq: 0,
      error: { class: 'task_frozen' },
      submissionId: 'sub-2',
      at: AT,
      canonicalKey: KEY,
    });
    expect(reads).toEqual([`decision ${ALIAS_KEY}`, `alias ${KEY}`, `decision ${KEY} of sub-2`]);
  });

  it('given an alias whose canonical operation the caller may not read (or is not registered), then not_seen with canonicalKey', () => {
    expect(answerOf({ operationKey: ALIAS_KEY }, { decisions: { [ALIAS_KEY]: alias() } })).toEqual({
      answer: { operationKey: ALIAS_KEY, canonicalKey: KEY, state: 'not_seen', source: 'none', seq: 0, at: AT },
      reads: [`decision ${ALIAS_KEY}`, `alias ${KEY}`],
    });
  });
});

describe('status of a held-back operation: waiting, confirmed and rolled back told apart', () => {
  const heldAccepted = () => after({ status: 'none' }, { ...accept, awaitsConfirmation: true });
  const held = () =>
    after(heldAccepted(), {
      type: 'await_confirmation',
      eventId: id(),
      at: 2_000,
      attempt: 1,
      deadlineAt: 9_000,
      previewDigest: D3,
    });
  const by = { kind: 'actor' as const, id: 'alice' };

  it('given it waits, then accepted with confirmation awaiting_confirmation, its deadline and the preview read like a result', () => {
    const { answer, reads } = answerOf(
      { operationKey: KEY, inputDigest: D1 },
      { readable: { [KEY]: held() }, results: { [KEY]: { draftId: 'd-1' } } },
    );
    expect(answer).toMatchObject({
      state: 'accepted',
      confirmation: { status: 'awaiting_confirmation', deadlineAt: 9_000, preview: { draftId: 'd-1' } },
    });
    expect(reads).toEqual([`result ${KEY}@1`]);
    expect(statusSettled(answer, { operationKey: KEY, untilFinal: true, afterSeq: 1 })).toBe(true);
  });

  it('given another input under the key, then no preview is read', () => {
    const { answer, reads } = answerOf(
      { operationKey: KEY, inputDigest: D2 },
      { readable: { [KEY]: held() }, results: { [KEY]: { draftId: 'd-1' } } },
    );
    expect(answer.confirmation).toEqual({ status: 'awaiting_confirmation', deadlineAt: 9_000 });
    expect(reads).toEqual([]);
  });

  it('given it is still preparing, then accepted with no confirmation field', () => {
    expect(answerOf({ operationKey: KEY }, { readable: { [KEY]: heldAccepted() } }).answer).not.toHaveProperty(
      'confirmation',
    );
  });

  it('given it was discarded or expired, then rejected operation_discarded with the reason; given it was confirmed, then confirmed', () => {
    const discarded = after(held(), { type: 'discard', eventId: id(), at: 3_000, by });
    expect(answerOf({ operationKey: KEY }, { readable: { [KEY]: discarded } }).answer).toMatchObject({
      state: 'rejected',
      error: { class: 'operation_discarded' },
      confirmation: { status: 'rolled_back', reason: 'discarded' },
    });
    const expired = after(held(), { type: 'expire_confirmation', eventId: id(), at: 9_500, attempt: 1 });
    expect(answerOf({ operationKey: KEY }, { readable: { [KEY]: expired } }).answer.confirmation).toEqual({
      status: 'rolled_back',
      reason: 'expired',
    });
    const confirmed = after(held(), { type: 'confirm', eventId: id(), at: 3_000, by });
    expect(answerOf({ operationKey: KEY }, { readable: { [KEY]: confirmed } }).answer).toMatchObject({
      state: 'accepted',
      confirmation: { status: 'confirmed' },
    });
  });
});
