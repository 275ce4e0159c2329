import { describe, expect, it } from 'vitest';
import {
  committedAnswer,
  decide,
  decideRecovery,
  decideSend,
  eventCountOf,
  generateReceiptKey,
  MAX_LATE_START_REQUEUES,
  operationEventSchema,
  RETRY_MARGIN_MS,
  initialState,
  receiptSchema,
  receiptSigner,
  replay,
  trustedReceiptKeys,
  verifyReceipt,
  ReceiptVerifier,
  type AcceptCommand,
  type Decision,
  type OperationEvent,
  type OperationRecord,
  type OperationState,
  type Receipt,
} from '@tooltx/lifecycle';

const KEYPAIR = generateReceiptKey();
const signer = receiptSigner(KEYPAIR.privatePem);

const D1 = `sha256:${'1'.repeat(64)}`;
const D2 = `sha256:${'2'.repeat(64)}`;
const KEY = `opk_${'A'.repeat(43)}`;

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

/** given events → when command → then decision (Emmett-style specification). */
function given(...events: OperationEvent[]) {
  const state: OperationState = events.length ? events[events.length - 1]!.state : initialState();
  return { when: (cmd: Parameters<typeof decide>[0]) => decide(cmd, state, { signer }) };
}
function appended(d: Decision): OperationEvent {
  if (d.kind !== 'append') throw new Error(`expected append, got ${d.kind}`);
  return d.event;
}

const accepted = () => appended(given().when(accept()));
const running = (a = accepted()) =>
  appended(given(a).when({ type: 'start', eventId: id(), at: 2_000, attempt: 1, executor: 'ex-1', deadlineAt: 5_000 }));
const committed = (r = running()) =>
  appended(
    given(r).when({ type: 'commit', eventId: id(), at: 3_000, attempt: 1, resourceId: 'note-1', resultDigest: D2 }),
  );
const rejected = (a = accepted()) =>
  appended(given(a).when({ type: 'reject', eventId: id(), at: 2_500, attempt: 1, error: { class: 'forbidden' } }));

describe('operation decider', () => {
  it('registers a new key as accepted, attempt 1, carrying its identity and digests', () => {
    const e = accepted();
    expect(e.type).toBe('accepted');
    expect(e.state).toMatchObject({
      status: 'accepted',
      attempt: 1,
      operationKey: KEY,
      tenant: 'acme',
      actor: 'alice',
      inputDigest: D1,
      intent: { seq: 10, submissionId: 'sub-1' },
    });
  });

  describe('accepted and started in one append', () => {
    const start: NonNullable<AcceptCommand['start']> = {
      executor: 'host-1',
      deadlineAt: 4_000,
      authorization: { decision: 'allow', policyVersion: 'p1', at: 1_000 },
    };

    it('given a new key, when it is accepted with a start, then one event makes it running, that event being its run', () => {
      const e = appended(given().when(accept({ start })));
      expect(e.type).toBe('accepted');
      expect(e.state).toMatchObject({
        status: 'running',
        attempt: 1,
        running: { eventId: e.eventId, executor: 'host-1', at: e.at, deadlineAt: 4_000 },
        authorization: { execution: start.authorization },
      });
      expect(e.state.eventCount).toBe(1);
    });

    it('given it running, when the run commits, then the receipt extends the one event and the run binds to it', () => {
      const e = appended(given().when(accept({ start })));
      const c = appended(
        given(e).when({
          type: 'commit',
          eventId: id(),
          at: 3_000,
          attempt: 1,
          runId: e.eventId,
          resourceId: 'note-1',
          resultDigest: D2,
        }),
      );
      expect(c.state.status).toBe('committed');
      expect(c.state.receipt).toMatchObject({ prevEventCount: 1 });
      // A later delivery of the start is the same run: nothing new.
      expect(given(c).when(accept({ start, intentSeq: 10 })).kind).toBe('replay');
    });

    it('given a rejection, when the identical input comes again with a start, then attempt 2 runs at once', () => {
      const r = rejected();
      const e = appended(given(r).when(accept({ start, intentSeq: 11, submissionId: 'sub-2' })));
      expect(e.state).toMatchObject({ status: 'running', attempt: 2, running: { eventId: e.eventId } });
      expect(e.state.error).toBeUndefined();
    });

    it('given it running, when an executor tries to start it again, then nothing is appended', () => {
      const e = appended(given().when(accept({ start })));
      const d = given(e).when({
        type: 'start',
        eventId: id(),
        at: 2_100,
        attempt: 1,
        executor: 'ex-2',
        deadlineAt: 5_100,
      });
      expect(d).toMatchObject({ kind: 'skip', reason: 'not_accepted' });
    });

    it('replays: a history with an accepted-and-started event folds to the state it carries', () => {
      const e = appended(given().when(accept({ start })));
      const c = appended(
        given(e).when({
          type: 'mark_unknown',
          eventId: id(),
          at: 9_000,
          attempt: 1,
          runId: e.eventId,
          evidence: { kind: 'timeout', at: 9_000, elapsedMs: 5_000 },
        }),
      );
      expect(replay([e, c])).toEqual(c.state);
    });
  });

  it("FM-10: an attempt submitted through an alias keeps the submission's own key and digest, per attempt, and replays", () => {
    const K2 = `opk_${'B'.repeat(43)}`;
    const a = appended(given().when(accept({ submitted: { operationKey: K2, inputDigest: D2 } })));
    expect(a.state).toMatchObject({
      operationKey: KEY,
      inputDigest: D1,
      intent: { seq: 10, submissionId: 'sub-1', submitted: { operationKey: K2, inputDigest: D2 } },
    });
    const r = rejected(a);
    // The canonical spelling itself starts the next attempt: nothing of the alias is carried over.
    const again = appended(given(r).when(accept({ intentSeq: 11, submissionId: 'sub-2' })));
    expect(again.state.intent).toEqual({ seq: 11, submissionId: 'sub-2' });
    expect(replay([a, r, again])).toEqual(again.state);
  });

  it('replays a known key with the same input in every non-rejected state: nothing new is appended', () => {
    const a = accepted();
    const r = running(a);
    const c = committed(r);
    const u = appended(
      given(r).when({
        type: 'mark_unknown',
        eventId: id(),
        at: 4_000,
        attempt: 1,
        evidence: { kind: 'timeout', at: 4_000 },
      }),
    );
    for (const e of [a, r, c, u]) expect(given(e).when(accept({ intentSeq: 99 })).kind).toBe('replay');
  });

  it('answers a committed key with the original receipt on replay', () => {
    const c = committed();
    const d = given(c).when(accept({ intentSeq: 50, submissionId: 'sub-2', actor: 'bob' }));
    expect(d.kind).toBe('replay');
    if (d.kind === 'replay') expect(d.state.receipt).toEqual(c.state.receipt);
  });

  it('reports a conflict for the same key with another input digest, in every state (FM-03)', () => {
    const a = accepted();
    const r = running(a);
    for (const e of [a, r, committed(r), rejected()])
      expect(given(e).when(accept({ inputDigest: D2, intentSeq: 99 })).kind).toBe('conflict');
  });

  it('starts a new, clean attempt when the identical input comes back after a rejection', () => {
    const rej = rejected();
    const e = appended(given(rej).when(accept({ intentSeq: 11, submissionId: 'sub-2' })));
    expect(e.state).toMatchObject({ status: 'accepted', attempt: 2, intent: { seq: 11, submissionId: 'sub-2' } });
    expect(e.state.error).toBeUndefined();
    expect(e.state.running).toBeUndefined();
  });

  it('does not start another attempt for a redelivered intent that was already decided', () => {
    const rej = rejected();
    expect(given(rej).when(accept({ intentSeq: 10 })).kind).toBe('replay');
  });

  it('lets exactly one start win: a second start on running is skipped, a retried start of the winner is applied', () => {
    const a = accepted();
    const r = running(a);
    expect(
      given(r).when({ type: 'start', eventId: id(), at: 2_100, attempt: 1, executor: 'ex-2', deadlineAt: 5_100 }),
    ).toMatchObject({ kind: 'skip', reason: 'not_accepted' });
    expect(
      given(r).when({ type: 'start', eventId: r.eventId, at: 2_000, attempt: 1, executor: 'ex-1', deadlineAt: 5_000 })
        .kind,
    ).toBe('applied');
  });

  it('commits only a running attempt, with resource id, result digest and server time in the receipt', () => {
    const c = committed();
    expect(c.state.status).toBe('committed');
    expect(c.state.receipt).toEqual({
      schema: 2,
      tenant: 'acme',
      operationKey: KEY,
      tool: 'kb.write_note',
      version: 1,
      state: 'committed',
      resourceId: 'note-1',
      resultDigest: D2,
      committedAt: 3_000,
      attempt: 1,
      prevEventCount: 2,
      keyId: signer.keyId,
      signature: expect.stringMatching(/^[A-Za-z0-9_-]{86}$/),
    });
    expect(
      given(accepted()).when({
        type: 'commit',
        eventId: id(),
        at: 3_000,
        attempt: 1,
        resourceId: 'x',
        resultDigest: D2,
      }),
    ).toMatchObject({ kind: 'skip', reason: 'not_running' });
  });

  it('never rejects or commits a final state, and ignores commands for another attempt', () => {
    const c = committed();
    expect(
      given(c).when({ type: 'reject', eventId: id(), at: 9, attempt: 1, error: { class: 'internal' } }),
    ).toMatchObject({ kind: 'skip', reason: 'final' });
    expect(
      given(running()).when({ type: 'commit', eventId: id(), at: 9, attempt: 2, resourceId: 'x', resultDigest: D2 }),
    ).toMatchObject({ kind: 'skip', reason: 'attempt_mismatch' });
    expect(
      given().when({ type: 'start', eventId: id(), at: 9, attempt: 1, executor: 'x', deadlineAt: 10 }),
    ).toMatchObject({ kind: 'skip', reason: 'not_registered' });
  });

  it('keeps unknown out of reach of a resubmission and of rejection', () => {
    const u = appended(
      given(running()).when({
        type: 'mark_unknown',
        eventId: id(),
        at: 4_000,
        attempt: 1,
        evidence: { kind: 'timeout', at: 4_000, elapsedMs: 3_000 },
      }),
    );
    expect(u.state).toMatchObject({ status: 'unknown', evidence: { kind: 'timeout' } });
    expect(given(u).when(accept({ intentSeq: 500 })).kind).toBe('replay');
    expect(
      given(u).when({ type: 'reject', eventId: id(), at: 9, attempt: 1, error: { class: 'internal' } }),
    ).toMatchObject({ kind: 'skip', reason: 'final' });
  });

  it('replays a full history to the state the last event carries, and refuses a tampered one', () => {
    const a = accepted();
    const r = running(a);
    const c = committed(r);
    expect(replay([a, r, c])).toEqual(c.state);
    const forged = { ...c, state: { ...c.state, receipt: { ...c.state.receipt!, resourceId: 'someone-else' } } };
    expect(() => replay([a, r, forged])).toThrow(/does not follow/);
  });
});

describe('recovery (verify before acting)', () => {
  const unknownOf = () =>
    appended(
      given(running()).when({
        type: 'mark_unknown',
        eventId: id(),
        at: 6_000,
        attempt: 1,
        evidence: { kind: 'timeout', at: 6_000 },
      }),
    );

  it('commits from unknown once a probe found the effect, and requeues the same attempt under the same key', () => {
    const u = unknownOf();
    const c = appended(
      given(u).when({ type: 'commit', eventId: id(), at: 7_000, attempt: 1, resourceId: 'note-9', resultDigest: D2 }),
    );
    expect(c.state).toMatchObject({ status: 'committed', attempt: 1, receipt: { resourceId: 'note-9' } });
    const q = appended(
      given(u).when({ type: 'requeue', eventId: id(), at: 7_000, attempt: 1, reason: 'probe_not_found' }),
    );
    expect(q.state).toMatchObject({ status: 'accepted', attempt: 1, requeues: 1, operationKey: KEY });
    expect(q.state.running).toBeUndefined();
    // A requeued attempt can start again; a stale-accepted requeue needs `accepted`.
    expect(
      given(q).when({ type: 'start', eventId: id(), at: 8_000, attempt: 1, executor: 'ex-2', deadlineAt: 9_000 }).kind,
    ).toBe('append');
    expect(
      given(unknownOf()).when({ type: 'requeue', eventId: id(), at: 1, attempt: 1, reason: 'stale_accepted' }),
    ).toMatchObject({ kind: 'skip' });
  });

  it("decideRecovery: found → commit; not found → requeue only if the key is honoured or the downstream's own clock is past the deadline; unavailable → unknown", () => {
    const r = running().state; // deadlineAt 5_000
    const none = { honoursKey: false, enforcesDeadline: false };
    expect(decideRecovery(r, { kind: 'found', resourceId: 'n1' }, none)).toEqual({ kind: 'commit', resourceId: 'n1' });
    expect(decideRecovery(r, { kind: 'not_found', downstreamAt: 99_000 }, none)).toEqual({ kind: 'mark_unknown' });
    expect(decideRecovery(r, { kind: 'not_found' }, { honoursKey: true, enforcesDeadline: false })).toEqual({
      kind: 'requeue',
    });
    expect(decideRecovery(r, { kind: 'unavailable' }, { honoursKey: true, enforcesDeadline: true })).toEqual({
      kind: 'mark_unknown',
    });
    expect(decideRecovery(unknownOf().state, { kind: 'unavailable' }, none)).toEqual({ kind: 'keep' });
  });

  it("clock-skew: decideRecovery judges the deadline by the downstream's clock in its probe answer, never by a local one", () => {
    const r = running().state; // deadlineAt 5_000
    const fence = { honoursKey: false, enforcesDeadline: true };
    // Given a running attempt whose deadline is 5_000 on the downstream's clock,
    // when the probe finds nothing and the downstream says it is 5_001 → no request of it can land: requeue.
    expect(decideRecovery(r, { kind: 'not_found', downstreamAt: 5_001 }, fence)).toEqual({ kind: 'requeue' });
    // … when it says 4_000 (whatever the caller's clock says) → the request may still land: unknown,
    // probed again in 1 s and a margin (a person's past the contract's unknown deadline).
    expect(decideRecovery(r, { kind: 'not_found', downstreamAt: 4_000 }, fence)).toEqual({
      kind: 'mark_unknown',
      retryInMs: 1_000 + RETRY_MARGIN_MS,
    });
    expect(decideRecovery(r, { kind: 'not_found', downstreamAt: 5_000 }, fence)).toEqual({
      kind: 'mark_unknown',
      retryInMs: RETRY_MARGIN_MS,
    });
    expect(decideRecovery(unknownOf().state, { kind: 'not_found', downstreamAt: 1_000 }, fence)).toEqual({
      kind: 'keep',
      retryInMs: 4_000 + RETRY_MARGIN_MS,
    });
    // … when it does not say → nothing proves a late request cannot land: unknown, never a requeue.
    expect(decideRecovery(r, { kind: 'not_found' }, fence)).toEqual({ kind: 'mark_unknown' });
    expect(decideRecovery(unknownOf().state, { kind: 'not_found' }, fence)).toEqual({ kind: 'keep' });
  });

  it('clock-skew: a run the downstream refused as late is requeued for that run only (refused_late)', () => {
    const r = running();
    const q = appended(
      given(r).when({ type: 'requeue', eventId: id(), at: 1, attempt: 1, runId: r.eventId, reason: 'refused_late' }),
    );
    expect(q).toMatchObject({ type: 'requeued', reason: 'refused_late', state: { status: 'accepted', requeues: 1 } });
    expect(given(r).when({ type: 'requeue', eventId: id(), at: 1, attempt: 1, reason: 'refused_late' })).toMatchObject({
      kind: 'skip',
      reason: 'stale_run',
    });
    expect(
      given(unknownOf()).when({
        type: 'requeue',
        eventId: id(),
        at: 1,
        attempt: 1,
        runId: r.eventId,
        reason: 'refused_late',
      }),
    ).toMatchObject({ kind: 'skip' });
  });

  it('FM-29: decideSend — an attempt stored with at least half its time left is sent; later, requeued (nothing sent), and rejected once requeued too often', () => {
    // startedAt 2_000, deadlineAt 6_000: 4 s of attempt time.
    const at = (now: number, requeues = 0) => decideSend({ startedAt: 2_000, deadlineAt: 6_000, now, requeues });
    expect(at(2_010)).toEqual({ kind: 'send' });
    expect(at(4_000)).toEqual({ kind: 'send' });
    expect(at(4_001)).toEqual({ kind: 'requeue' });
    expect(at(9_000)).toEqual({ kind: 'requeue' });
    expect(at(9_000, MAX_LATE_START_REQUEUES - 1)).toEqual({ kind: 'requeue' });
    expect(at(9_000, MAX_LATE_START_REQUEUES)).toEqual({ kind: 'reject' });
    expect(at(2_010, MAX_LATE_START_REQUEUES)).toEqual({ kind: 'send' });
  });

  it('FM-29: given running, when requeued as a late start of that run, then accepted again for the same attempt and key; never from unknown or accepted', () => {
    const r = running();
    const q = appended(
      given(r).when({ type: 'requeue', eventId: id(), at: 6_500, attempt: 1, runId: r.eventId, reason: 'late_start' }),
    );
    expect(q).toMatchObject({
      type: 'requeued',
      reason: 'late_start',
      state: { status: 'accepted', attempt: 1, requeues: 1, operationKey: KEY },
    });
    expect(q.state).not.toHaveProperty('running');
    // The next run starts with a fresh deadline.
    const r2 = appended(
      given(q).when({ type: 'start', eventId: id(), at: 7_000, attempt: 1, executor: 'ex-1', deadlineAt: 11_000 }),
    );
    expect(r2.state).toMatchObject({ status: 'running', running: { deadlineAt: 11_000 } });
    // A request may have left from unknown: a late start is only what `running` says before anything is sent.
    expect(
      given(unknownOf()).when({
        type: 'requeue',
        eventId: id(),
        at: 1,
        attempt: 1,
        runId: r.eventId,
        reason: 'late_start',
      }),
    ).toMatchObject({ kind: 'skip' });
    expect(
      given(accepted()).when({
        type: 'requeue',
        eventId: id(),
        at: 1,
        attempt: 1,
        runId: r.eventId,
        reason: 'late_start',
      }),
    ).toMatchObject({ kind: 'skip' });
    expect(
      given(r).when({ type: 'requeue', eventId: id(), at: 1, attempt: 2, runId: r.eventId, reason: 'late_start' }),
    ).toMatchObject({ kind: 'skip', reason: 'attempt_mismatch' });
    // Unbound, it could requeue any run: refused.
    expect(given(r).when({ type: 'requeue', eventId: id(), at: 1, attempt: 1, reason: 'late_start' })).toMatchObject({
      kind: 'skip',
      reason: 'stale_run',
    });
  });

  it('FM-29: a late-start requeue decided about one run never requeues a later run of the same attempt (which may have sent its request)', () => {
    // Executor A's `running` stalls; meanwhile the reconciler requeues A's run and executor B starts run 2 and sends.
    const rA = running();
    const q = appended(
      given(rA).when({
        type: 'requeue',
        eventId: id(),
        at: 6_000,
        attempt: 1,
        runId: rA.eventId,
        reason: 'probe_not_found',
      }),
    );
    const rB = appended(
      given(q).when({ type: 'start', eventId: id(), at: 6_100, attempt: 1, executor: 'ex-b', deadlineAt: 10_100 }),
    );
    // A's requeue, reloaded onto B's run, is skipped: B's request stands alone.
    expect(
      given(rB).when({
        type: 'requeue',
        eventId: id(),
        at: 6_200,
        attempt: 1,
        runId: rA.eventId,
        reason: 'late_start',
      }),
    ).toMatchObject({ kind: 'skip', reason: 'stale_run' });
    // And the reconciler's requeue of a probed run likewise.
    expect(
      given(rB).when({
        type: 'requeue',
        eventId: id(),
        at: 6_200,
        attempt: 1,
        runId: rA.eventId,
        reason: 'probe_not_found',
      }),
    ).toMatchObject({ kind: 'skip', reason: 'stale_run' });
  });
});

describe('outcomes are bound to their run', () => {
  it("a late outcome of an earlier run of a requeued attempt is skipped; the current run's is applied", () => {
    const r1 = running();
    const u = appended(
      given(r1).when({
        type: 'mark_unknown',
        eventId: id(),
        at: 6_000,
        attempt: 1,
        runId: r1.eventId,
        evidence: { kind: 'timeout', at: 6_000 },
      }),
    );
    const q = appended(
      given(u).when({ type: 'requeue', eventId: id(), at: 7_000, attempt: 1, reason: 'probe_not_found' }),
    );
    const r2 = appended(
      given(q).when({ type: 'start', eventId: id(), at: 8_000, attempt: 1, executor: 'ex-2', deadlineAt: 9_500 }),
    );
    // The first run's downstream answers late with a refusal: not applied to the second run.
    expect(
      given(r2).when({
        type: 'reject',
        eventId: id(),
        at: 8_100,
        attempt: 1,
        runId: r1.eventId,
        error: { class: 'dependency_unavailable' },
      }),
    ).toMatchObject({ kind: 'skip', reason: 'stale_run' });
    expect(
      given(r2).when({
        type: 'commit',
        eventId: id(),
        at: 8_100,
        attempt: 1,
        runId: r1.eventId,
        resourceId: 'x',
        resultDigest: D2,
      }),
    ).toMatchObject({ kind: 'skip', reason: 'stale_run' });
    expect(
      given(r2).when({
        type: 'commit',
        eventId: id(),
        at: 8_200,
        attempt: 1,
        runId: r2.eventId,
        resourceId: 'note-2',
        resultDigest: D2,
      }).kind,
    ).toBe('append');
  });
});

describe('takeover and manual resolution (FM-14)', () => {
  const unknownOf = () =>
    appended(
      given(running()).when({
        type: 'mark_unknown',
        eventId: id(),
        at: 4_000,
        attempt: 1,
        evidence: { kind: 'timeout', at: 4_000 },
      }),
    );
  const record = (u: OperationEvent) => ({
    operationKey: KEY,
    tenant: 'acme',
    taskId: 'task-1',
    tool: 'kb.write_note',
    version: 1,
    targetDigest: D2,
    inputDigest: D1,
    reason: 'unknown_past_deadline' as const,
    lastEvidence: { kind: 'timeout' as const, at: 4_000 },
    attempts: { attempt: 1, requeues: 0, probes: 3 },
    times: { acceptedAt: 1_000, runningAt: 2_000, unknownSince: u.state.updatedAt, openedAt: 9_000 },
  });

  it('FM-14: a takeover opens only on unknown, once; it keeps the state unknown and stops probes from committing or requeueing', () => {
    const u = unknownOf();
    expect(
      given(running()).when({ type: 'open_takeover', eventId: id(), at: 9_000, attempt: 1, takeover: record(u) }),
    ).toMatchObject({ kind: 'skip', reason: 'not_unknown' });
    const t = appended(
      given(u).when({ type: 'open_takeover', eventId: id(), at: 9_000, attempt: 1, takeover: record(u) }),
    );
    expect(t.type).toBe('takeover');
    expect(t.state).toMatchObject({ status: 'unknown', takeover: record(u) });
    expect(
      given(t).when({ type: 'open_takeover', eventId: id(), at: 9_500, attempt: 1, takeover: record(u) }),
    ).toMatchObject({ kind: 'skip', reason: 'taken_over' });
    expect(
      given(t).when({ type: 'commit', eventId: id(), at: 9_600, attempt: 1, resourceId: 'n', resultDigest: D2 }),
    ).toMatchObject({ kind: 'skip', reason: 'taken_over' });
    expect(
      given(t).when({ type: 'requeue', eventId: id(), at: 9_600, attempt: 1, reason: 'probe_not_found' }),
    ).toMatchObject({ kind: 'skip', reason: 'taken_over' });
    expect(given(t).when(accept({ intentSeq: 99 })).kind).toBe('replay');
  });

  it('FM-14: a person resolves committed (a receipt with manual and resolvedBy) or not applied (rejected, then a new attempt may start)', () => {
    const u = unknownOf();
    const t = appended(
      given(u).when({ type: 'open_takeover', eventId: id(), at: 9_000, attempt: 1, takeover: record(u) }),
    );
    const c = appended(
      given(t).when({
        type: 'resolve',
        eventId: id(),
        at: 10_000,
        attempt: 1,
        resolvedBy: 'oscar',
        outcome: { kind: 'committed', resourceId: 'note-7', resultDigest: D2 },
      }),
    );
    expect(c).toMatchObject({
      type: 'committed',
      manual: true,
      resolvedBy: 'oscar',
      receipt: { resourceId: 'note-7', manual: true, resolvedBy: 'oscar', committedAt: 10_000 },
    });
    expect(c.state).toMatchObject({
      status: 'committed',
      resolution: { by: 'oscar', at: 10_000, outcome: 'committed' },
    });
    const n = appended(
      given(t).when({
        type: 'resolve',
        eventId: id(),
        at: 10_000,
        attempt: 1,
        resolvedBy: 'oscar',
        outcome: { kind: 'not_applied' },
      }),
    );
    expect(n).toMatchObject({ type: 'rejected', manual: true, resolvedBy: 'oscar', error: { class: 'not_applied' } });
    const again = appended(given(n).when(accept({ intentSeq: 99 })));
    expect(again.state).toMatchObject({ status: 'accepted', attempt: 2 });
    expect(again.state.takeover).toBeUndefined();
    expect(again.state.resolution).toBeUndefined();
    // The folded states of a history with a takeover and a resolution follow from its events.
    const a0 = accepted();
    const r0 = running(a0);
    const u0 = appended(
      given(r0).when({
        type: 'mark_unknown',
        eventId: id(),
        at: 4_000,
        attempt: 1,
        evidence: { kind: 'timeout', at: 4_000 },
      }),
    );
    const t0 = appended(
      given(u0).when({ type: 'open_takeover', eventId: id(), at: 9_000, attempt: 1, takeover: record(u0) }),
    );
    const c0 = appended(
      given(t0).when({
        type: 'resolve',
        eventId: id(),
        at: 10_000,
        attempt: 1,
        resolvedBy: 'oscar',
        outcome: { kind: 'committed', resourceId: 'note-7', resultDigest: D2 },
      }),
    );
    expect(replay([a0, r0, u0, t0, c0])).toEqual(c0.state);
    // Nothing but unknown can be resolved by a person.
    expect(
      given(committed()).when({
        type: 'resolve',
        eventId: id(),
        at: 1,
        attempt: 1,
        resolvedBy: 'oscar',
        outcome: { kind: 'not_applied' },
      }).kind,
    ).toBe('skip');
  });

  it('decideRecovery: a probe that finds another input digest under our key is a mismatch, never a commit', () => {
    const u = unknownOf();
    const s = u.state as Extract<OperationState, { status: 'unknown' }>;
    const g = { honoursKey: true, enforcesDeadline: true };
    expect(decideRecovery(s, { kind: 'found', resourceId: 'x', inputDigest: D2 }, g)).toEqual({
      kind: 'mismatch',
      resourceId: 'x',
      inputDigest: D2,
    });
    expect(decideRecovery(s, { kind: 'found', resourceId: 'x', inputDigest: D1 }, g)).toEqual({
      kind: 'commit',
      resourceId: 'x',
    });
    expect(decideRecovery(s, { kind: 'found', resourceId: 'x' }, g)).toEqual({ kind: 'commit', resourceId: 'x' });
  });
});

describe('signed receipts (FM-17)', () => {
  it("a commit carries a receipt signed under the signer's key id; any change to it breaks the signature", () => {
    const c = committed();
    if (c.type !== 'committed') throw new Error('expected committed');
    const r = c.receipt;
    expect(r).toMatchObject({
      schema: 2,
      tenant: 'acme',
      operationKey: KEY,
      attempt: 1,
      prevEventCount: 2,
      keyId: signer.keyId,
      committedAt: 3_000,
    });
    expect(r).not.toHaveProperty('prevSeq');
    const trusted = trustedReceiptKeys({ [KEYPAIR.keyId]: KEYPAIR.publicPem });
    expect(verifyReceipt(r, trusted)).toBe(true);
    expect(verifyReceipt(receiptSchema.parse(r), trusted)).toBe(true);
    const { schema: _schema, prevEventCount, ...common } = r as Extract<Receipt, { schema: 2 }>;
    for (const forged of [
      { ...r, resourceId: 'note-2' },
      { ...r, tenant: 'globex' },
      { ...r, resultDigest: D1 },
      { ...r, prevEventCount: 3 },
      { ...r, manual: true as const },
      // Moved to the other format, with the same position as a stream sequence: not what was signed.
      { ...common, prevSeq: prevEventCount },
      // A format 2 receipt with a stream sequence added to it: not a receipt of either format.
      { ...r, prevSeq: 4 },
    ]) {
      expect(verifyReceipt(forged as Receipt, trusted)).toBe(false);
    }
    // Another key, even a valid one, is not trusted unless configured.
    const other = generateReceiptKey();
    const resigned = {
      ...r,
      keyId: other.keyId,
      signature: receiptSigner(other.privatePem).sign({ ...r, keyId: other.keyId }),
    };
    expect(verifyReceipt(resigned, trusted)).toBe(false);
    expect(verifyReceipt(resigned, trustedReceiptKeys({ [other.keyId]: other.publicPem }))).toBe(true);
    expect(() => trustedReceiptKeys({ [KEYPAIR.keyId]: other.publicPem })).toThrow(/does not match/);
    // No signer, no commit.
    expect(() =>
      decide({ type: 'commit', eventId: id(), at: 1, attempt: 1, resourceId: 'x', resultDigest: D2 }, running().state),
    ).toThrow(/signer/);
  });
});

describe('a verifier that remembers the receipts it verified (FM-17)', () => {
  const trusted = trustedReceiptKeys({ [KEYPAIR.keyId]: KEYPAIR.publicPem });
  const receiptOf = (resourceId: string): Receipt => {
    const c = committed();
    if (c.type !== 'committed') throw new Error('expected committed');
    const { signature: _s, ...unsigned } = { ...c.receipt, resourceId };
    return { ...unsigned, signature: signer.sign(unsigned) } as Receipt;
  };

  it('given a receipt it verified, when an equal copy comes again, then it is valid; a copy changed in any field under the same signature is not', () => {
    const v = new ReceiptVerifier(trusted);
    const r = receiptOf('note-1');
    expect(v.verifyParsed(receiptSchema.parse(r))).toBe(true);
    expect(v.verifyParsed(receiptSchema.parse(structuredClone(r)))).toBe(true);
    for (const forged of [
      { ...r, resourceId: 'note-2' },
      { ...r, tenant: 'globex' },
      { ...r, prevEventCount: 3 },
      { ...r, manual: true as const },
    ])
      expect(v.verifyParsed(forged as Receipt)).toBe(false);
    // What it remembered is the valid receipt, not the forgeries it was shown after it.
    expect(v.verifyParsed(receiptSchema.parse(r))).toBe(true);
  });

  it('given a receipt it verified, when its key is not among the trusted ones, then it is not valid', () => {
    const other = generateReceiptKey();
    const v = new ReceiptVerifier(trustedReceiptKeys({ [other.keyId]: other.publicPem }));
    expect(v.trusts(KEYPAIR.keyId)).toBe(false);
    expect(v.verifyParsed(receiptOf('note-1'))).toBe(false);
  });

  it('given more receipts than it keeps, when the oldest comes again, then it is verified again and still valid; a forgery of it still is not', () => {
    const v = new ReceiptVerifier(trusted, 2);
    const rs = ['a', 'b', 'c'].map(receiptOf);
    for (const r of rs) expect(v.verifyParsed(r)).toBe(true);
    expect(v.verifyParsed(rs[0] as Receipt)).toBe(true);
    expect(v.verifyParsed({ ...(rs[0] as Receipt), resourceId: 'z' })).toBe(false);
  });
});

describe('receipt formats (docs/lifecycle.md "Receipt formats", FM-17)', () => {
  /**
   * A format 1 receipt byte for byte as a format 1 signer wrote it: the decider that signed format 1,
   * a commit with `prevSeq: 4711`, under a key made for this test (only its public half is here).
   */
  const V1 = {
    publicPem:
      '-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEA79ohmB9HWd7zzLMiEJTsxeat+zvnFuHe9z8Xm3kieWA=\n-----END PUBLIC KEY-----\n',
    keyId: 'ed25519:ODJqs7l_1Bntyv2eT-f4bw',
    receipt: {
      tenant: 'acme',
      operationKey: KEY,
      tool: 'kb.write_note',
      version: 1,
      state: 'committed' as const,
      resourceId: 'note-1',
      resultDigest: D2,
      committedAt: 3_000,
      attempt: 1,
      prevSeq: 4711,
      keyId: 'ed25519:ODJqs7l_1Bntyv2eT-f4bw',
      signature: '6bnaYhr5GDN-MMNffG8La_-zfCokNwOzPVScyv3i0CC51AqqaDw62vO3yn515NTwjDHsH0p5F-c7s_lxOTEIAg',
    },
  };
  const trustedV1 = trustedReceiptKeys({ [V1.keyId]: V1.publicPem });

  it("a receipt signed in format 1 (with the event log's prevSeq) still parses and verifies, as stored and as an agent receives it", () => {
    expect(verifyReceipt(V1.receipt, trustedV1)).toBe(true);
    const parsed = receiptSchema.parse(V1.receipt);
    expect(parsed).toEqual(V1.receipt);
    expect(verifyReceipt(parsed, trustedV1)).toBe(true);
    // A committed event of the time, carrying it, still reads (its state has no event count).
    const c = committed();
    const { eventCount: _n, ...uncountedState } = c.state;
    const stored = { ...c, receipt: V1.receipt, state: { ...uncountedState, receipt: V1.receipt } };
    expect(operationEventSchema.parse(stored)).toMatchObject({ receipt: V1.receipt, state: { receipt: V1.receipt } });
    // Only under its own key.
    expect(verifyReceipt(V1.receipt, trustedReceiptKeys({ [KEYPAIR.keyId]: KEYPAIR.publicPem }))).toBe(false);
  });

  it('tampering with a format 1 receipt fails: any field, the sequence, the signature, or dressing it up as format 2', () => {
    const r = V1.receipt;
    const { prevSeq, ...common } = r;
    for (const forged of [
      { ...r, resourceId: 'note-2' },
      { ...r, tenant: 'globex' },
      { ...r, resultDigest: D1 },
      { ...r, attempt: 2 },
      { ...r, committedAt: 3_001 },
      { ...r, prevSeq: 4712 },
      { ...r, manual: true as const },
      { ...r, resolvedBy: 'oscar' },
      { ...r, signature: `${r.signature.slice(0, 85)}${r.signature.endsWith('A') ? 'B' : 'A'}` },
      { schema: 2, ...common, prevEventCount: prevSeq },
      { ...r, schema: 2 },
    ]) {
      expect(verifyReceipt(forged as Receipt, trustedV1)).toBe(false);
    }
  });

  it('a signer writes format 2; both formats pass the same verification, an unknown format none', () => {
    const v2 = committed().state.receipt!;
    const trusted = new Map([...trustedV1, ...trustedReceiptKeys({ [KEYPAIR.keyId]: KEYPAIR.publicPem })]);
    expect([v2, V1.receipt].map((r) => verifyReceipt(r, trusted))).toEqual([true, true]);
    expect(receiptSchema.safeParse({ ...v2, schema: 3 }).success).toBe(false);
    expect(verifyReceipt({ ...v2, schema: 3 } as unknown as Receipt, trusted)).toBe(false);
  });
});

describe("the operation's own event count (tenant isolation: no stream sequence reaches an agent)", () => {
  const unknownAfter = (r: OperationEvent) =>
    appended(
      given(r).when({
        type: 'mark_unknown',
        eventId: id(),
        at: 4_000,
        attempt: r.state.attempt,
        evidence: { kind: 'timeout', at: 4_000 },
      }),
    );
  /** The event as written before events were counted: its state has no `eventCount`. */
  const uncounted = (e: OperationEvent): OperationEvent => {
    const { eventCount: _n, ...state } = e.state;
    return { ...e, state } as OperationEvent;
  };

  it('given no event, when accepted, then the count is 1; each later event counts one more', () => {
    expect(eventCountOf(initialState())).toBe(0);
    const a = accepted();
    const r = running(a);
    const c = committed(r);
    expect([a, r, c].map((e) => e.state.eventCount)).toEqual([1, 2, 3]);
    expect(replay([a, r, c])).toEqual(c.state);
  });

  it('given running, when committed, then the receipt binds the count before the commit (prevEventCount), not any stream sequence', () => {
    const r = running();
    const c = committed(r);
    expect(c.state.receipt).toMatchObject({ schema: 2, prevEventCount: r.state.eventCount });
    expect(c.state.receipt).not.toHaveProperty('prevSeq');
    expect(c.state.eventCount).toBe(3);
  });

  it('given a rejection, when the identical input starts the next attempt, then the count goes on across attempts', () => {
    const a = accepted();
    const rej = rejected(a);
    const a2 = appended(given(rej).when(accept({ intentSeq: 11, submissionId: 'sub-2' })));
    const r2 = appended(
      given(a2).when({ type: 'start', eventId: id(), at: 3_000, attempt: 2, executor: 'ex-1', deadlineAt: 6_000 }),
    );
    expect([a, rej, a2, r2].map((e) => [e.state.attempt, e.state.eventCount])).toEqual([
      [1, 1],
      [1, 2],
      [2, 3],
      [2, 4],
    ]);
    expect(replay([a, rej, a2, r2])).toEqual(r2.state);
  });

  it('given unknown, when requeued, run again, taken over and resolved, then every event counts, whatever its type', () => {
    const u = unknownAfter(running());
    const q = appended(
      given(u).when({ type: 'requeue', eventId: id(), at: 5_000, attempt: 1, reason: 'probe_not_found' }),
    );
    const r2 = appended(
      given(q).when({ type: 'start', eventId: id(), at: 6_000, attempt: 1, executor: 'ex-2', deadlineAt: 9_000 }),
    );
    const u2 = unknownAfter(r2);
    const takeover = {
      operationKey: KEY,
      tenant: 'acme',
      taskId: 'task-1',
      tool: 'kb.write_note',
      version: 1,
      targetDigest: D2,
      inputDigest: D1,
      reason: 'unknown_past_deadline' as const,
      attempts: { attempt: 1, requeues: 1, probes: 2 },
      times: { acceptedAt: 1_000, openedAt: 9_000 },
    };
    const t = appended(given(u2).when({ type: 'open_takeover', eventId: id(), at: 9_000, attempt: 1, takeover }));
    const res = appended(
      given(t).when({
        type: 'resolve',
        eventId: id(),
        at: 10_000,
        attempt: 1,
        resolvedBy: 'oscar',
        outcome: { kind: 'committed', resourceId: 'note-7', resultDigest: D2 },
      }),
    );
    expect([u, q, r2, u2, t, res].map((e) => e.state.eventCount)).toEqual([3, 4, 5, 6, 7, 8]);
    expect(res.state.receipt).toMatchObject({ schema: 2, manual: true, resolvedBy: 'oscar', prevEventCount: 7 });
  });

  it('given a state, when a command is replayed, conflicts, is skipped or was already applied, then nothing is appended and the count stays', () => {
    const r = running();
    const c = committed(r);
    const cases: [Decision, number][] = [
      [given(c).when(accept({ intentSeq: 99 })), 3],
      [given(c).when(accept({ inputDigest: D2, intentSeq: 99 })), 3],
      [given(r).when({ type: 'start', eventId: id(), at: 2_100, attempt: 1, executor: 'ex-2', deadlineAt: 5_100 }), 2],
      [
        given(r).when({
          type: 'start',
          eventId: r.eventId,
          at: 2_000,
          attempt: 1,
          executor: 'ex-1',
          deadlineAt: 5_000,
        }),
        2,
      ],
    ];
    for (const [d, count] of cases) {
      expect(d.kind).not.toBe('append');
      expect(d.kind !== 'append' && eventCountOf(d.state)).toBe(count);
    }
  });

  it('given events written before counting (no eventCount), then they parse, the last counts as 1, the next event counts 2 — also in its receipt — and the history replays', () => {
    const a = uncounted(accepted());
    const r = uncounted(running(a));
    expect(operationEventSchema.parse(r).state.eventCount).toBeUndefined();
    expect(eventCountOf(r.state)).toBe(1);
    const c = committed(r);
    expect(c.state.eventCount).toBe(2);
    expect(c.state.receipt).toMatchObject({ schema: 2, prevEventCount: 1 });
    expect(verifyReceipt(c.state.receipt!, trustedReceiptKeys({ [KEYPAIR.keyId]: KEYPAIR.publicPem }))).toBe(true);
    // The history folds as it was decided: the uncounted events are not compared on their count…
    expect(replay([a, r, c])).toEqual(c.state);
    // … but a count that does not follow is refused.
    expect(() => replay([a, r, { ...c, state: { ...c.state, eventCount: 3 } }])).toThrow(/does not follow/);
    const a2 = accepted();
    const r2 = running(a2);
    expect(() => replay([a2, { ...r2, state: { ...r2.state, eventCount: 5 } }])).toThrow(/does not follow/);
  });

  it("the committed answer pushed to an agent carries the operation's event count as its seq", () => {
    const st = committed().state as OperationRecord & { receipt: Receipt };
    expect(committedAnswer({ submittedKey: KEY, state: st, submissionId: 'sub-1', result: {}, at: 5 })).toMatchObject({
      seq: 3,
      state: 'committed',
      receipt: st.receipt,
    });
    const { eventCount: _n, ...legacy } = st;
    expect(committedAnswer({ submittedKey: KEY, state: legacy, submissionId: 'sub-1', result: {}, at: 5 }).seq).toBe(1);
  });
});
