/**
 * Held-back commits and compensation as given/when/then (docs/compensation.md): the decider's
 * commands on the original's record, and the pure rules that come before them — which compensation
 * may be asked for (FM-20, FM-21, FM-22), what the original takes from its compensation's state,
 * and what a confirmation or a discard gets.
 */
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineContract, deriveCompensationKey, type ContractSpec } from '@tooltx/contracts';
import {
  compensationAttemptFor,
  compensationOutcomeOf,
  compensationSettlement,
  lookDue,
  sweepAction,
  compensationResolutionOf,
  compensationVerdict,
  confirmationDeadlineOf,
  confirmationExpired,
  confirmVerdict,
  decide,
  discardVerdict,
  freezeBacked,
  generateReceiptKey,
  initialState,
  isFinalStatus,
  openTakeoverOf,
  receiptSigner,
  replay,
  resolutionVerdict,
  serverStateOf,
  sideEffectOf,
  verifyReceipt,
  trustedReceiptKeys,
  type AcceptCommand,
  type Decision,
  type OperationCommand,
  type OperationEvent,
  type OperationRecord,
  type OperationState,
  type Receipt,
  type RequestCompensationCommand,
} from '@tooltx/lifecycle';

const KEYPAIR = generateReceiptKey();
const signer = receiptSigner(KEYPAIR.privatePem);
const D1 = `sha256:${'1'.repeat(64)}`;
const D2 = `sha256:${'2'.repeat(64)}`;
const D3 = `sha256:${'3'.repeat(64)}`;
const KEY = `opk_${'A'.repeat(43)}`;
const COMP_KEY = deriveCompensationKey(KEY, { tool: 'kb.delete_note', version: 1 });
const OTHER_COMP_KEY = deriveCompensationKey(KEY, { tool: 'kb.delete_note', version: 2 });
const bob = { kind: 'actor' as const, id: 'bob' };
const oscar = { kind: 'operator' as const, id: 'oscar' };

let n = 0;
const id = () => `evt-${String(++n).padStart(8, '0')}`;

function accept(over: Partial<AcceptCommand> = {}): AcceptCommand {
  return {
    type: 'accept',
    eventId: id(),
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
    ...over,
  };
}

/** given events → when command → then decision. */
function given(...events: OperationEvent[]) {
  const state: OperationState = events.length ? events[events.length - 1]!.state : initialState();
  return { when: (cmd: OperationCommand) => decide(cmd, state, { signer }) };
}
function appended(d: Decision): OperationEvent {
  if (d.kind !== 'append')
    throw new Error(`expected append, got ${d.kind}${d.kind === 'skip' ? ` (${d.reason})` : ''}`);
  return d.event;
}
const record = (e: OperationEvent): OperationRecord => e.state;

// A held-back operation, step by step.
const heldAccepted = () => appended(given().when(accept({ awaitsConfirmation: true })));
const awaiting = (a = heldAccepted(), deadlineAt = 61_000) =>
  appended(
    given(a).when({ type: 'await_confirmation', eventId: id(), at: 1_500, attempt: 1, deadlineAt, previewDigest: D3 }),
  );
const confirm = (at = 2_000, over: Partial<Extract<OperationCommand, { type: 'confirm' }>> = {}) =>
  ({ type: 'confirm', eventId: id(), at, by: bob, ...over }) as const;
const start = (at = 2_100) =>
  ({ type: 'start', eventId: id(), at, attempt: 1, executor: 'ex-1', deadlineAt: at + 5_000 }) as const;
const commit = (at = 3_000, runId?: string) =>
  ({
    type: 'commit',
    eventId: id(),
    at,
    attempt: 1,
    ...(runId ? { runId } : {}),
    resourceId: 'note-1',
    resultDigest: D2,
  }) as const;

// A committed operation and its compensation.
const committed = (over: Partial<AcceptCommand> = {}) => {
  const a = appended(given().when(accept(over)));
  const r = appended(given(a).when(start()));
  return appended(given(r).when(commit()));
};
const request = (over: Partial<RequestCompensationCommand> = {}): RequestCompensationCommand => ({
  type: 'request_compensation',
  eventId: id(),
  at: 10_000,
  compensation: { operationKey: COMP_KEY, tool: 'kb.delete_note', version: 1 },
  requestedBy: bob,
  reasonDigest: D3,
  ...over,
});
const requested = (c = committed()) => appended(given(c).when(request()));
/** The compensation operation's own receipt, signed as its executor would. */
function compReceipt(operationKey = COMP_KEY): Receipt {
  const comp = committed({ operationKey, tool: 'kb.delete_note' });
  return comp.state.receipt!;
}
const complete = (operationKey = COMP_KEY, receipt = compReceipt(operationKey)) =>
  ({ type: 'complete_compensation', eventId: id(), at: 12_000, compensationKey: operationKey, receipt }) as const;
/** The events of an original whose compensation was refused after it ran (its downstream refused the delete). */
const failedHistory = (before?: OperationEvent) => {
  const a = appended(given().when(accept()));
  const r = appended(given(a).when(start()));
  const c = before ?? appended(given(r).when(commit()));
  const q = appended(given(c).when(request()));
  const f = appended(
    given(q).when({
      type: 'fail_compensation',
      eventId: id(),
      at: 12_000,
      compensationKey: COMP_KEY,
      kind: 'rejected',
      error: { class: 'forbidden' },
    }),
  );
  return [a, r, c, q, f];
};
const failed = (before?: OperationEvent) => failedHistory(before).at(-1)!;
const resolveFailure = (outcome: 'effect_kept' | 'undone_by_hand') =>
  ({ type: 'resolve_compensation_failure', eventId: id(), at: 20_000, resolvedBy: 'oscar', outcome }) as const;

describe('a held-back commit (the contract declares confirm)', () => {
  it('given its acceptance, nothing starts it: start and an accept with start are skipped not_confirmed', () => {
    const a = heldAccepted();
    expect(a.state).toMatchObject({ status: 'accepted', confirmation: {} });
    expect(given(a).when(start())).toMatchObject({ kind: 'skip', reason: 'not_confirmed' });
    expect(given().when(accept({ awaitsConfirmation: true, start: { executor: 'h', deadlineAt: 9 } }))).toMatchObject({
      kind: 'skip',
      reason: 'not_confirmed',
    });
  });

  it('given it accepted, when its prepare step is done, then it waits until its deadline with the preview digest', () => {
    const w = awaiting();
    expect(w.type).toBe('awaiting_confirmation');
    expect(w.state).toMatchObject({
      status: 'awaiting_confirmation',
      confirmation: { heldAt: 1_500, deadlineAt: 61_000, previewDigest: D3 },
    });
    // Held once; an operation that holds nothing back is never held.
    const again = { type: 'await_confirmation', eventId: id(), at: 1_600, attempt: 1, deadlineAt: 9 } as const;
    expect(given(w).when(again)).toMatchObject({ kind: 'skip', reason: 'not_accepted' });
    const plain = appended(given().when(accept()));
    expect(given(plain).when(again)).toMatchObject({ kind: 'skip', reason: 'not_awaiting' });
  });

  it('given it waits, when confirmed, then it is accepted and free to start; a second confirm is a replay at every later state (one run)', () => {
    const a = heldAccepted();
    const w = awaiting(a);
    const c = appended(given(w).when(confirm()));
    expect(c.state).toMatchObject({ status: 'accepted', confirmation: { confirmed: { by: bob, at: 2_000 } } });
    expect(given(c).when(confirm(2_050, { by: oscar })).kind).toBe('replay');
    const r = appended(given(c).when(start()));
    expect(r.state.status).toBe('running');
    expect(given(r).when(confirm()).kind).toBe('replay');
    const done = appended(given(r).when(commit()));
    expect(given(done).when(confirm()).kind).toBe('replay');
    expect(replay([a, w, c, r, done])).toEqual(done.state);
  });

  it('given it waits, when confirmed with a start, then it runs at once, the confirmation being its run', () => {
    const w = awaiting();
    const c = appended(given(w).when(confirm(2_000, { start: { executor: 'host-1', deadlineAt: 7_000 } })));
    expect(c.state).toMatchObject({ status: 'running', running: { eventId: c.eventId, executor: 'host-1' } });
    const done = appended(given(c).when(commit(3_000, c.eventId)));
    expect(done.state.receipt).toMatchObject({ resourceId: 'note-1' });
  });

  it('given it waits, when discarded, then it is rolled back — nothing ran, no receipt — and a confirm is skipped discarded (operation_discarded)', () => {
    const w = awaiting();
    const d = appended(given(w).when({ type: 'discard', eventId: id(), at: 2_000, by: oscar }));
    expect(d.state).toMatchObject({ status: 'rolled_back', confirmation: { discarded: { by: oscar, at: 2_000 } } });
    expect(d.state.running).toBeUndefined();
    expect(d.state.receipt).toBeUndefined();
    expect(given(d).when(confirm())).toMatchObject({ kind: 'skip', reason: 'discarded' });
    expect(given(d).when({ type: 'discard', eventId: id(), at: 2_100, by: bob }).kind).toBe('replay');
    // Final: the same input under the key replays it, never a new attempt.
    expect(given(d).when(accept({ intentSeq: 99, awaitsConfirmation: true })).kind).toBe('replay');
    expect(confirmVerdict(d.state, 2_200)).toEqual({ kind: 'refuse', error: { class: 'operation_discarded' } });
  });

  it('given it confirmed, a discard is skipped: it may already have run', () => {
    const c = appended(given(awaiting()).when(confirm()));
    expect(given(c).when({ type: 'discard', eventId: id(), at: 2_100, by: bob })).toMatchObject({
      kind: 'skip',
      reason: 'confirmed',
    });
  });

  it('given it waits, no confirmation by the deadline rolls it back; a confirm that comes late rolls it back instead of running it', () => {
    const w = awaiting(heldAccepted(), 5_000);
    const early = { type: 'expire_confirmation', eventId: id(), at: 4_999, attempt: 1 } as const;
    expect(given(w).when(early)).toMatchObject({ kind: 'skip', reason: 'not_due' });
    const x = appended(given(w).when({ ...early, eventId: id(), at: 5_000 }));
    expect(x).toMatchObject({
      type: 'confirmation_expired',
      state: { status: 'rolled_back', confirmation: { expiredAt: 5_000 } },
    });
    const late = appended(given(w).when(confirm(5_001)));
    expect(late.type).toBe('confirmation_expired');
    expect(late.state.status).toBe('rolled_back');
    expect(late.state.confirmation?.confirmed).toBeUndefined();
  });

  it('replays: a held-back history folds to the state it carries', () => {
    const a = heldAccepted();
    const w = awaiting(a);
    const d = appended(given(w).when({ type: 'discard', eventId: id(), at: 2_000, by: bob }));
    expect(replay([a, w, d])).toEqual(d.state);
  });
});

describe('the compensation of a committed operation, on its own record', () => {
  it('given it committed, when a compensation is registered, then it is compensation_requested, linked, and its receipt is untouched', () => {
    const c = committed();
    const r = appended(given(c).when(request()));
    expect(r.type).toBe('compensation_requested');
    expect(record(r)).toMatchObject({
      status: 'compensation_requested',
      compensation: {
        operationKey: COMP_KEY,
        tool: 'kb.delete_note',
        version: 1,
        requestedBy: bob,
        reasonDigest: D3,
        requestedAt: 10_000,
      },
    });
    expect(r.state.receipt).toEqual(c.state.receipt);
    expect(verifyReceipt(r.state.receipt!, trustedReceiptKeys({ [KEYPAIR.keyId]: KEYPAIR.publicPem }))).toBe(true);
    // Resubmitting the original replays it with its receipt and the current state; it never runs again.
    const again = given(r).when(accept({ intentSeq: 99 }));
    expect(again).toMatchObject({
      kind: 'replay',
      state: { status: 'compensation_requested', receipt: c.state.receipt },
    });
  });

  it('FM-21: the same compensation asked again — by another requester, for another reason — is a replay, in every compensation state', () => {
    const r = requested();
    const same = () => request({ requestedBy: oscar, reasonDigest: D1 });
    expect(given(r).when(same()).kind).toBe('replay');
    const done = appended(given(r).when(complete()));
    expect(given(done).when(same()).kind).toBe('replay');
  });

  it('FM-22: another compensation of an operation being compensated, compensated or whose compensation failed is skipped', () => {
    const other = () => request({ compensation: { operationKey: OTHER_COMP_KEY, tool: 'kb.delete_note', version: 2 } });
    const r = requested();
    const done = appended(given(r).when(complete()));
    const failed = appended(
      given(requested()).when({
        type: 'fail_compensation',
        eventId: id(),
        at: 12_000,
        compensationKey: COMP_KEY,
        kind: 'rejected',
        error: { class: 'not_found' },
      }),
    );
    for (const e of [r, done, failed])
      expect(given(e).when(other()), e.state.status).toMatchObject({ kind: 'skip', reason: 'compensation_differs' });
  });

  it('FM-22: is never registered from a state other than committed', () => {
    const a = appended(given().when(accept()));
    const running = appended(given(a).when(start()));
    const unknown = appended(
      given(running).when({
        type: 'mark_unknown',
        eventId: id(),
        at: 4_000,
        attempt: 1,
        evidence: { kind: 'timeout', at: 4_000 },
      }),
    );
    const rejected = appended(
      given(a).when({ type: 'reject', eventId: id(), at: 2_000, attempt: 1, error: { class: 'forbidden' } }),
    );
    const rolledBack = appended(given(awaiting()).when({ type: 'discard', eventId: id(), at: 2_000, by: bob }));
    for (const e of [a, running, unknown, rejected, rolledBack, awaiting()])
      expect(given(e).when(request()), e.state.status).toMatchObject({ kind: 'skip', reason: 'not_committed' });
    expect(given().when(request())).toMatchObject({ kind: 'skip', reason: 'not_registered' });
  });

  it('given it requested, when the compensation commits, then compensated links its receipt, beside the original receipt', () => {
    const r = requested();
    const receipt = compReceipt();
    const done = appended(given(r).when(complete(COMP_KEY, receipt)));
    expect(done.state).toMatchObject({ status: 'compensated', compensation: { operationKey: COMP_KEY, receipt } });
    expect(done.state.receipt).toEqual(r.state.receipt);
    expect(done.state.receipt?.operationKey).toBe(KEY);
    // Final: no outcome changes it again.
    expect(given(done).when(complete())).toMatchObject({ kind: 'skip', reason: 'final' });
  });

  it('FM-20: given it requested, when the compensation is taken over, then compensation_failed keeps the receipt and the last evidence, is never compensated in turn, and holds its takeover record in the same event', () => {
    const r = requested();
    const evidence = { kind: 'timeout' as const, at: 11_000, elapsedMs: 5_000 };
    const f = appended(
      given(r).when({
        type: 'fail_compensation',
        eventId: id(),
        at: 12_000,
        compensationKey: COMP_KEY,
        kind: 'taken_over',
        evidence,
      }),
    );
    expect(f.state).toMatchObject({
      status: 'compensation_failed',
      receipt: r.state.receipt,
      compensation: { operationKey: COMP_KEY, failure: { at: 12_000, kind: 'taken_over', evidence } },
    });
    const receipt = r.state.receipt!;
    const takeover = {
      operationKey: KEY,
      tenant: 'acme',
      taskId: 'task-1',
      tool: 'kb.write_note',
      version: 1,
      reason: 'compensation_failed',
      lastEvidence: evidence,
      receipt: {
        operationKey: KEY,
        resourceId: 'note-1',
        committedAt: receipt.committedAt,
        resultDigest: receipt.resultDigest,
        keyId: receipt.keyId,
        signature: receipt.signature,
      },
      compensation: { operationKey: COMP_KEY, tool: 'kb.delete_note', version: 1, kind: 'taken_over', evidence },
      times: { openedAt: 12_000 },
    };
    expect(f).toMatchObject({ type: 'compensation_failed', takeover, state: { takeover } });
    expect(openTakeoverOf(f.state)).toEqual(f.state.takeover);
    expect(freezeBacked(f.state)).toBe(true);
    expect(given(f).when(complete())).toMatchObject({ kind: 'skip', reason: 'final' });
    expect(given(f).when(request()).kind).toBe('replay');
    // Not final until a person resolved it: its one row records that resolution.
    expect(isFinalStatus('compensation_failed', { compensable: true })).toBe(false);
    expect(isFinalStatus('compensation_failed', { compensable: true, resolved: true })).toBe(true);
  });

  it('FM-20: given the compensation refused after it ran, the takeover record holds its error class and no body', () => {
    const f = failed();
    expect(f.state.takeover).toMatchObject({
      reason: 'compensation_failed',
      compensation: { operationKey: COMP_KEY, kind: 'rejected', error: { class: 'forbidden' } },
    });
    expect(f.state.takeover?.lastEvidence).toBeUndefined();
    expect(Object.keys(f.state.takeover?.receipt ?? {}).sort()).toEqual(
      ['committedAt', 'keyId', 'operationKey', 'resourceId', 'resultDigest', 'signature'].sort(),
    );
  });

  it('FM-20: given it compensation_failed, when a person resolves it effect_kept, then the status and the receipt stay, the resolution is recorded, and the takeover no longer backs a freeze', () => {
    const events = failedHistory();
    const f = events.at(-1)!;
    const d = given(f).when(resolveFailure('effect_kept'));
    const e = appended(d);
    expect(e).toMatchObject({
      type: 'compensation_failure_resolved',
      outcome: 'effect_kept',
      manual: true,
      resolvedBy: 'oscar',
      state: {
        status: 'compensation_failed',
        receipt: f.state.receipt,
        takeover: f.state.takeover,
        resolution: { by: 'oscar', at: 20_000, outcome: 'effect_kept' },
      },
    });
    expect(compensationResolutionOf(e.state)).toBe('effect_kept');
    expect(openTakeoverOf(e.state)).toBeUndefined();
    expect(freezeBacked(e.state)).toBe(false);
    // The same resolution again is a replay; another one is skipped; nothing is compensated in turn.
    expect(given(e).when(resolveFailure('effect_kept')).kind).toBe('replay');
    expect(given(e).when(resolveFailure('undone_by_hand'))).toMatchObject({ kind: 'skip', reason: 'resolved' });
    expect(given(e).when(request()).kind).toBe('replay');
    expect(replay([...events, e])).toEqual(e.state);
  });

  it('FM-20: a resolution of a failed compensation is skipped on any other status', () => {
    expect(given().when(resolveFailure('undone_by_hand'))).toMatchObject({ kind: 'skip', reason: 'not_registered' });
    const c = committed();
    for (const e of [c, requested(c), appended(given(requested()).when(complete()))])
      expect(given(e).when(resolveFailure('undone_by_hand')), e.state.status).toMatchObject({
        kind: 'skip',
        reason: 'not_compensation_failed',
      });
  });

  it("FM-20: the takeover service's verdict fits the outcome to the takeover: an unknown one's outcomes are refused on a failed compensation, and the other way round", () => {
    const f = failed();
    expect(resolutionVerdict(f.state, { kind: 'effect_kept' })).toBe('resolve_compensation');
    expect(resolutionVerdict(f.state, { kind: 'undone_by_hand' })).toBe('resolve_compensation');
    expect(resolutionVerdict(f.state, { kind: 'committed', resourceId: 'note-1' })).toBe('outcome_mismatch');
    expect(resolutionVerdict(f.state, { kind: 'not_applied' })).toBe('outcome_mismatch');
    const kept = appended(given(f).when(resolveFailure('effect_kept'))).state;
    expect(resolutionVerdict(kept, { kind: 'effect_kept' })).toBe('already');
    expect(resolutionVerdict(kept, { kind: 'undone_by_hand' })).toBe('not_unknown');
    const a = appended(given().when(accept()));
    const r = appended(given(a).when(start()));
    const u = appended(
      given(r).when({
        type: 'mark_unknown',
        eventId: id(),
        at: 4_000,
        attempt: 1,
        evidence: { kind: 'timeout', at: 4_000 },
      }),
    );
    expect(resolutionVerdict(u.state, { kind: 'effect_kept' })).toBe('outcome_mismatch');
    expect(resolutionVerdict(u.state, { kind: 'not_applied' })).toBe('resolve');
    expect(resolutionVerdict(committed().state, { kind: 'undone_by_hand' })).toBe('not_unknown');
  });

  it("FM-20: an original a person resolved committed earlier, whose compensation then failed, still waits for the failure's own resolution", () => {
    const a = appended(given().when(accept()));
    const r = appended(given(a).when(start()));
    const u = appended(
      given(r).when({
        type: 'mark_unknown',
        eventId: id(),
        at: 4_000,
        attempt: 1,
        evidence: { kind: 'timeout', at: 4_000 },
      }),
    );
    const c = appended(
      given(u).when({
        type: 'resolve',
        eventId: id(),
        at: 5_000,
        attempt: 1,
        resolvedBy: 'oscar',
        outcome: { kind: 'committed', resourceId: 'note-1', resultDigest: D2 },
      }),
    );
    const f = failed(c);
    expect(f.state.resolution?.outcome).toBe('committed');
    expect(compensationResolutionOf(f.state)).toBeUndefined();
    expect(freezeBacked(f.state)).toBe(true);
    expect(openTakeoverOf(f.state)?.reason).toBe('compensation_failed');
    expect(appended(given(f).when(resolveFailure('undone_by_hand'))).state.resolution?.outcome).toBe('undone_by_hand');
  });

  it('given it requested, when the compensation is refused before it ran, then the original is committed again with the refusal recorded, and may be asked again', () => {
    const r = requested();
    const back = appended(
      given(r).when({
        type: 'refuse_compensation',
        eventId: id(),
        at: 11_000,
        compensationKey: COMP_KEY,
        error: { class: 'forbidden' },
      }),
    );
    expect(back).toMatchObject({
      type: 'compensation_refused',
      state: {
        status: 'committed',
        receipt: r.state.receipt,
        compensation: { operationKey: COMP_KEY, refusal: { at: 11_000, error: { class: 'forbidden' } } },
      },
    });
    const again = appended(given(back).when(request({ at: 13_000 })));
    expect(again.state.compensation).toMatchObject({ operationKey: COMP_KEY, requestedAt: 13_000 });
    expect(again.state.compensation?.refusal).toBeUndefined();
  });

  it("skips an outcome of another compensation, or one whose receipt is another operation's", () => {
    const r = requested();
    expect(given(r).when(complete(OTHER_COMP_KEY))).toMatchObject({ kind: 'skip', reason: 'compensation_differs' });
    expect(given(r).when(complete(COMP_KEY, compReceipt(OTHER_COMP_KEY)))).toMatchObject({
      kind: 'skip',
      reason: 'compensation_differs',
    });
    expect(given(committed()).when(complete())).toMatchObject({ kind: 'skip', reason: 'not_compensating' });
  });

  it('FM-20: a compensation operation is never compensated in turn', () => {
    const comp = committed({
      operationKey: COMP_KEY,
      tool: 'kb.delete_note',
      compensates: { operationKey: KEY, tool: 'kb.write_note', version: 1 },
    });
    expect(comp.state.compensates).toEqual({ operationKey: KEY, tool: 'kb.write_note', version: 1 });
    expect(given(comp).when(request())).toMatchObject({ kind: 'skip', reason: 'is_compensation' });
  });

  it('replays: a compensated history folds to the state it carries', () => {
    const a = appended(given().when(accept()));
    const r = appended(given(a).when(start()));
    const c = appended(given(r).when(commit()));
    const q = appended(given(c).when(request()));
    const x = appended(
      given(q).when({
        type: 'refuse_compensation',
        eventId: id(),
        at: 11_000,
        compensationKey: COMP_KEY,
        error: { class: 'forbidden' },
      }),
    );
    const q2 = appended(given(x).when(request({ at: 13_000 })));
    const done = appended(given(q2).when(complete()));
    expect(replay([a, r, c, q, x, q2, done])).toEqual(done.state);
  });
});

const noteInput = z.strictObject({ kb: z.string(), body: z.string() });
const spec = {
  name: 'kb.write_note',
  version: 1,
  description: 'Write a note.',
  effect: 'create' as const,
  input: noteInput,
  output: z.object({}),
  target: (i: z.infer<typeof noteInput>) => ({ kb: i.kb }),
  intent: (i: z.infer<typeof noteInput>) => ({ body: i.body }),
  key: { scope: 'tenant' as const, retentionMs: 86_400_000 },
  timing: { timeoutMs: 5_000, runningBoundMs: 15_000, unknownDeadlineMs: 60_000 },
  downstream: { honoursKey: true, enforcesDeadline: true },
} satisfies ContractSpec<typeof noteInput>;
const DAY = 86_400_000;
const compensable = defineContract({
  ...spec,
  compensation: {
    tool: 'kb.delete_note@1',
    deadlineMs: DAY,
    permission: 'kb.delete',
    input: (o) => ({ noteId: o.receipt.resourceId }),
  },
});
const compensableByV2 = defineContract({
  ...spec,
  compensation: { ...compensable.compensation!, tool: 'kb.delete_note@2' },
});
const plain = defineContract(spec);

describe('which compensation may be asked for (compensationVerdict)', () => {
  // committedAt of the receipt: 3 000.
  const c = () => committed().state;

  it('a committed operation within the deadline: request the declared compensation under the derived key', () => {
    expect(compensationVerdict(compensable, c(), 3_000 + DAY)).toEqual({
      kind: 'request',
      compensation: { operationKey: COMP_KEY, tool: 'kb.delete_note', version: 1 },
    });
  });

  it('FM-22: compensation_expired past the declared deadline after the commit', () => {
    expect(compensationVerdict(compensable, c(), 3_001 + DAY)).toEqual({
      kind: 'refuse',
      error: { class: 'compensation_expired' },
    });
  });

  it('FM-22: compensation_not_allowed without a declaration, or from rejected, unknown, running, accepted, awaiting_confirmation, rolled_back', () => {
    const refused = { kind: 'refuse', error: { class: 'compensation_not_allowed' } };
    expect(compensationVerdict(plain, c(), 4_000)).toEqual(refused);
    expect(compensationVerdict(undefined, c(), 4_000)).toEqual(refused);
    const a = appended(given().when(accept()));
    const running = appended(given(a).when(start()));
    const unknown = appended(
      given(running).when({
        type: 'mark_unknown',
        eventId: id(),
        at: 4_000,
        attempt: 1,
        evidence: { kind: 'timeout', at: 4_000 },
      }),
    );
    const rejected = appended(
      given(a).when({ type: 'reject', eventId: id(), at: 2_000, attempt: 1, error: { class: 'forbidden' } }),
    );
    const w = awaiting();
    const rolledBack = appended(given(w).when({ type: 'discard', eventId: id(), at: 2_000, by: bob }));
    for (const e of [a, running, unknown, rejected, w, rolledBack])
      expect(compensationVerdict(compensable, e.state, 4_000), e.state.status).toEqual(refused);
  });

  it('FM-21: the same compensation of an operation being compensated or compensated is a replay, even past the deadline', () => {
    const r = requested();
    expect(compensationVerdict(compensable, r.state, 4_000)).toMatchObject({
      kind: 'replay',
      compensationKey: COMP_KEY,
    });
    const done = appended(given(r).when(complete()));
    expect(compensationVerdict(compensable, done.state, 10 * DAY)).toMatchObject({ kind: 'replay' });
  });

  it('FM-22: a different compensation of an operation already compensated or being compensated is compensation_not_allowed', () => {
    const r = requested();
    const done = appended(given(r).when(complete()));
    for (const e of [r, done])
      expect(compensationVerdict(compensableByV2, e.state, 4_000)).toEqual({
        kind: 'refuse',
        error: { class: 'compensation_not_allowed' },
      });
  });

  it('FM-20: a compensation is never compensated in turn, whatever its own contract declares', () => {
    const comp = committed({
      operationKey: COMP_KEY,
      tool: 'kb.delete_note',
      compensates: { operationKey: KEY, tool: 'kb.write_note', version: 1 },
    });
    expect(compensationVerdict(compensable, comp.state, 4_000)).toEqual({
      kind: 'refuse',
      error: { class: 'compensation_not_allowed' },
    });
  });

  it('an operation never registered is not_found, as one the caller may not read', () => {
    expect(compensationVerdict(compensable, initialState(), 4_000)).toEqual({
      kind: 'refuse',
      error: { class: 'not_found' },
    });
  });
});

describe("what the original takes from its compensation's state (compensationOutcomeOf)", () => {
  const comp = (over: Partial<AcceptCommand> = {}) =>
    appended(given().when(accept({ operationKey: COMP_KEY, ...over })));

  it('committed → complete with its receipt; accepted or running → pending', () => {
    const a = comp();
    expect(compensationOutcomeOf(a.state)).toEqual({ kind: 'pending' });
    const r = appended(given(a).when(start()));
    expect(compensationOutcomeOf(r.state)).toEqual({ kind: 'pending' });
    const c = appended(given(r).when(commit()));
    expect(compensationOutcomeOf(c.state)).toEqual({ kind: 'complete', receipt: c.state.receipt });
  });

  it('FM-20: refused by its downstream after it ran → fail (rejected); its unknown handed to a person → fail (taken over) with its last evidence', () => {
    const r = appended(given(comp()).when(start()));
    const refused = appended(
      given(r).when({ type: 'reject', eventId: id(), at: 3_000, attempt: 1, error: { class: 'not_found' } }),
    );
    expect(compensationOutcomeOf(refused.state)).toEqual({
      kind: 'fail',
      failure: 'rejected',
      error: { class: 'not_found' },
    });
    const evidence = { kind: 'timeout' as const, at: 4_000 };
    const u = appended(given(r).when({ type: 'mark_unknown', eventId: id(), at: 4_000, attempt: 1, evidence }));
    expect(compensationOutcomeOf(u.state)).toEqual({ kind: 'pending' });
    const t = appended(
      given(u).when({
        type: 'open_takeover',
        eventId: id(),
        at: 9_000,
        attempt: 1,
        takeover: {
          operationKey: COMP_KEY,
          tenant: 'acme',
          taskId: 'task-1',
          tool: 'kb.delete_note',
          version: 1,
          targetDigest: D2,
          inputDigest: D1,
          reason: 'unknown_past_deadline',
          lastEvidence: evidence,
          attempts: { attempt: 1, requeues: 0, probes: 3 },
          times: { acceptedAt: 1_000, openedAt: 9_000 },
        },
      }),
    );
    expect(compensationOutcomeOf(t.state)).toEqual({ kind: 'fail', failure: 'taken_over', evidence });
  });

  it('refused before it ran (its permission refused at the execution instant) → refuse, the original is committed again', () => {
    const refused = appended(
      given(comp()).when({ type: 'reject', eventId: id(), at: 2_000, attempt: 1, error: { class: 'forbidden' } }),
    );
    expect(compensationOutcomeOf(refused.state)).toEqual({ kind: 'refuse', error: { class: 'forbidden' } });
  });
});

describe('a compensation tied to its attempt: the original never stays compensation_requested for good (compensationAttemptFor, compensationSettlement)', () => {
  const compensates = { operationKey: KEY, tool: 'kb.write_note', version: 1 };
  /** The compensation's accept: its first request's, or a later request's (another intent) after a refusal. */
  const compAccepted = (before?: OperationEvent) =>
    appended(
      given(...(before ? [before] : [])).when(
        accept({
          operationKey: COMP_KEY,
          tool: 'kb.delete_note',
          compensates,
          submissionId: before ? 'sub-c2' : 'sub-c1',
          intentSeq: before ? 20 : 19,
        }),
      ),
    );
  const refusedBeforeRun = (a: OperationEvent) =>
    appended(
      given(a).when({
        type: 'reject',
        eventId: id(),
        at: 11_000,
        attempt: a.attempt,
        error: { class: 'forbidden' },
      }),
    );
  const ask = (c: OperationEvent, attempt: number) =>
    appended(
      given(c).when(request({ compensation: { operationKey: COMP_KEY, tool: 'kb.delete_note', version: 1, attempt } })),
    );
  const none: OperationState = { status: 'none' };

  it('given no compensation yet, then a request registers its attempt 1; given one refused before it ran, the next; given one there, that one', () => {
    expect(compensationAttemptFor(none)).toBe(1);
    const a = compAccepted();
    expect(compensationAttemptFor(a.state)).toBe(1);
    const refused = refusedBeforeRun(a);
    expect(compensationAttemptFor(refused.state)).toBe(2);
    const again = compAccepted(refused);
    expect(again.state).toMatchObject({ status: 'accepted', attempt: 2 });
    expect(compensationAttemptFor(again.state)).toBe(2);
  });

  it('given the request recorded on the original and no accept of its compensation (the process died between the two appends), then register: a repeat completes the accept; its request_compensation is a replay', () => {
    const q = ask(committed(), 1);
    expect(q.state).toMatchObject({ status: 'compensation_requested', compensation: { attempt: 1 } });
    expect(compensationSettlement(q.state, none)).toEqual({ kind: 'register' });
    expect(given(q).when(request()).kind).toBe('replay');
    const a = compAccepted();
    expect(compensationSettlement(q.state, a.state)).toEqual({ kind: 'wait' });
    const r = appended(given(a).when(start()));
    const c = appended(given(r).when(commit()));
    expect(compensationSettlement(q.state, c.state)).toEqual({ kind: 'link' });
    // Ended: nothing more to settle.
    const done = appended(given(q).when({ ...complete(COMP_KEY, c.state.receipt!), compensationAttempt: 1 }));
    expect(done.state.status).toBe('compensated');
    expect(compensationSettlement(done.state, c.state)).toEqual({ kind: 'none' });
  });

  it('given a compensation refused before it ran and asked again (attempt 2), when the late refusal of attempt 1 is linked, then it is skipped and the original waits for attempt 2, whose accept a repeat completes and whose commit is linked', () => {
    const a1 = compAccepted();
    const refused1 = refusedBeforeRun(a1);
    const q1 = ask(committed(), 1);
    const back = appended(
      given(q1).when({
        type: 'refuse_compensation',
        eventId: id(),
        at: 11_500,
        compensationKey: COMP_KEY,
        compensationAttempt: 1,
        error: { class: 'forbidden' },
      }),
    );
    expect(back.state.status).toBe('committed');
    const q2 = ask(back, compensationAttemptFor(refused1.state));
    expect(q2.state).toMatchObject({ status: 'compensation_requested', compensation: { attempt: 2 } });
    // The late refusal of attempt 1 is not attempt 2's outcome.
    const late = {
      type: 'refuse_compensation',
      eventId: id(),
      at: 12_000,
      compensationKey: COMP_KEY,
      compensationAttempt: 1,
      error: { class: 'forbidden' },
    } as const;
    expect(given(q2).when(late)).toMatchObject({ kind: 'skip', reason: 'attempt_mismatch' });
    // Only attempt 1 is there: the accept of attempt 2 is missing, not a refusal to answer.
    expect(compensationSettlement(q2.state, refused1.state)).toEqual({ kind: 'register' });
    const a2 = compAccepted(refused1);
    expect(compensationSettlement(q2.state, a2.state)).toEqual({ kind: 'wait' });
    const r2 = appended(given(a2).when({ ...start(), attempt: 2 }));
    const c2 = appended(given(r2).when({ ...commit(), attempt: 2 }));
    expect(compensationSettlement(q2.state, c2.state)).toEqual({ kind: 'link' });
    const done = appended(given(q2).when({ ...complete(COMP_KEY, c2.state.receipt!), compensationAttempt: 2 }));
    expect(done.state.status).toBe('compensated');
  });

  it('given a request recorded before attempts were, then whichever attempt is there answers; given another operation, or an original not being compensated, then none', () => {
    const q = appended(given(committed()).when(request()));
    expect(q.state.status === 'compensation_requested' && q.state.compensation?.attempt).toBeUndefined();
    const refused = refusedBeforeRun(compAccepted());
    expect(compensationSettlement(q.state, refused.state)).toEqual({ kind: 'link' });
    expect(given(q).when({ ...complete(), compensationAttempt: 3 }).kind).toBe('append');
    const other = appended(given().when(accept({ operationKey: OTHER_COMP_KEY, compensates })));
    expect(compensationSettlement(q.state, other.state)).toEqual({ kind: 'none' });
    expect(compensationSettlement(committed().state, refused.state)).toEqual({ kind: 'none' });
  });

  it("given an original waiting for its compensation in the reconciler's index, then the sweep looks at it once its contract's running bound passed and settles it", () => {
    const q = ask(committed(), 1);
    const timing = { timeoutMs: 1_000, runningBoundMs: 5_000 };
    const entry = { status: 'compensation_requested', updatedAt: 10_000 };
    expect(lookDue(entry, timing, { seenForMs: 100, wallNow: 10_100, probeDue: true })).toBe(false);
    expect(lookDue(entry, timing, { seenForMs: 5_001, wallNow: 10_100, probeDue: true })).toBe(true);
    expect(lookDue(entry, timing, { seenForMs: 0, wallNow: 15_001, probeDue: true })).toBe(true);
    // Looked at and found nothing to link: not again before its backoff.
    expect(lookDue(entry, timing, { seenForMs: 5_001, wallNow: 15_001, probeDue: false })).toBe(false);
    expect(sweepAction({ status: 'compensation_requested', seq: 4 }, q.state, 4)).toBe('settle_compensation');
  });
});

describe('what a confirmation or a discard gets (confirmVerdict, discardVerdict)', () => {
  it('a waiting operation is confirmed; a confirmed one (accepted, running, committed) is a replay: confirming twice runs once', () => {
    const w = awaiting();
    expect(confirmVerdict(w.state, 2_000)).toEqual({ kind: 'confirm' });
    const c = appended(given(w).when(confirm()));
    const r = appended(given(c).when(start()));
    const done = appended(given(r).when(commit()));
    for (const e of [c, r, done]) expect(confirmVerdict(e.state, 2_000).kind, e.state.status).toBe('replay');
  });

  it('after a discard or the deadline: operation_discarded; at the deadline while still waiting: expire', () => {
    const w = awaiting(heldAccepted(), 5_000);
    expect(confirmVerdict(w.state, 5_000)).toEqual({ kind: 'expire' });
    expect(confirmationExpired(w.state, 4_999)).toBe(false);
    expect(confirmationExpired(w.state, 5_000)).toBe(true);
    const x = appended(given(w).when({ type: 'expire_confirmation', eventId: id(), at: 5_000, attempt: 1 }));
    expect(confirmVerdict(x.state, 5_001)).toEqual({ kind: 'refuse', error: { class: 'operation_discarded' } });
    expect(confirmationExpired(x.state, 9_000)).toBe(false);
  });

  it('an operation that holds nothing back, or whose prepare step has not finished, does not wait: nothing changes', () => {
    expect(confirmVerdict(committed().state, 4_000).kind).toBe('not_awaiting');
    expect(confirmVerdict(heldAccepted().state, 4_000).kind).toBe('not_awaiting');
    expect(confirmVerdict(initialState(), 4_000)).toEqual({ kind: 'refuse', error: { class: 'not_found' } });
  });

  it('a discard drops a waiting operation once; a confirmed one is never discarded', () => {
    const w = awaiting();
    expect(discardVerdict(w.state)).toEqual({ kind: 'discard' });
    const d = appended(given(w).when({ type: 'discard', eventId: id(), at: 2_000, by: bob }));
    expect(discardVerdict(d.state).kind).toBe('replay');
    expect(discardVerdict(appended(given(w).when(confirm())).state).kind).toBe('not_awaiting');
    expect(discardVerdict(initialState())).toEqual({ kind: 'refuse', error: { class: 'not_found' } });
  });

  it("the deadline is the hold's time plus the contract's confirm.deadlineMs", () => {
    const held = defineContract({ ...spec, confirm: { permission: 'kb.confirm', deadlineMs: 60_000 } });
    expect(confirmationDeadlineOf(held, 1_500)).toBe(61_500);
    expect(confirmationDeadlineOf(plain, 1_500)).toBeNull();
  });
});

describe('how the other readers see the new statuses', () => {
  it('committed is final only when its contract declares no compensation; the three outcomes are final, compensation_failed once a person resolved it', () => {
    expect(isFinalStatus('committed', { compensable: false })).toBe(true);
    expect(isFinalStatus('committed', { compensable: true })).toBe(false);
    for (const s of ['compensated', 'rolled_back'] as const)
      expect(isFinalStatus(s, { compensable: true }), s).toBe(true);
    expect(isFinalStatus('compensation_failed', { compensable: true })).toBe(false);
    expect(isFinalStatus('compensation_failed', { compensable: true, resolved: true })).toBe(true);
    for (const s of ['rejected', 'compensation_requested', 'awaiting_confirmation', 'unknown'] as const)
      expect(isFinalStatus(s, { compensable: false }), s).toBe(false);
  });

  it("the status answer's nearest state, and whether the effect happened", () => {
    expect(serverStateOf('compensated')).toBe('committed');
    expect(serverStateOf('awaiting_confirmation')).toBe('accepted');
    expect(serverStateOf('rolled_back')).toBe('rejected');
    expect(serverStateOf('unknown')).toBe('unknown');
    expect(sideEffectOf('create', 'compensated')).toBe('applied');
    expect(sideEffectOf('create', 'compensation_failed')).toBe('applied');
    expect(sideEffectOf('send', 'rolled_back')).toBe('none');
    expect(sideEffectOf('send', 'awaiting_confirmation')).toBe('none');
  });
});
