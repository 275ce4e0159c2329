/**
 * The state rules outside the operation decider, each as given/when/then: the policy verdict and
 * the frozen-task refusal (intake and execution instant), the effect-class failure mapping of a
 * run's outcome, the decision records, status precedence, the reconciler's look and takeover
 * timing, and the takeover record.
 */
import { describe, expect, it } from 'vitest';
import { DeadlinePassedError, ErrorClass, TooltxError } from '@tooltx/contracts';
import { z } from 'zod';
import {
  aliasRecord,
  attemptEnded,
  freezeBacked,
  receiptOnlyResult,
  resolutionVerdict,
  runOutcomeOf,
  sendAfterStart,
  waitingToRun,
  sideEffectOf,
  takeoverOpenable,
  boundedRefusal,
  decide,
  decideAfterRun,
  decideIntakeFailure,
  executorAction,
  decisionRecordSchema,
  frozenTaskRefusal,
  IDEMPOTENCY_CONFLICT,
  lookDue,
  MAX_LATE_START_REQUEUES,
  nextProbeDelayMs,
  nextProbeInMs,
  ownCallInFlight,
  ownRefusalSupersedes,
  planRecovery,
  policyVerdict,
  redeliveredRunWaitMs,
  REDELIVERED_RUN_MARGIN_MS,
  referenceMovedRefusal,
  registrationOf,
  refusalRecord,
  refusedIntentDeletable,
  RUNNING_GRACE_MS,
  statusSettled,
  sweepAction,
  takeoverDue,
  takeoverRecordOf,
  takeoverRecordSchema,
  TERMINAL_AFTER_DELIVERIES,
  type AcceptCommand,
  type DecisionRecord,
  type OperationEvent,
  type OperationRecord,
  type StatusAnswer,
} from '@tooltx/lifecycle';

const D1 = `sha256:${'1'.repeat(64)}`;
const D2 = `sha256:${'2'.repeat(64)}`;
const KEY = `opk_${'A'.repeat(43)}`;
const who = { tenant: 'acme', actor: 'alice', submissionId: 'sub-1' };

function appended(cmd: Parameters<typeof decide>[0], on: OperationRecord | null): OperationEvent {
  const d = decide(cmd, on ?? { status: 'none' });
  if (d.kind !== 'append') throw new Error(`expected append, got ${d.kind}`);
  return d.event;
}
const accept: AcceptCommand = {
  type: 'accept',
  eventId: 'evt-e1-0000000',
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
const acceptedState = () => appended(accept, null).state;
const runningState = () =>
  appended(
    { type: 'start', eventId: 'evt-e2-0000000', at: 2_000, attempt: 1, executor: 'x', deadlineAt: 5_000 },
    acceptedState(),
  ).state;
const unknownState = () =>
  appended(
    {
      type: 'mark_unknown',
      eventId: 'evt-e3-0000000',
      at: 6_000,
      attempt: 1,
      evidence: { kind: 'timeout', at: 6_000, elapsedMs: 4_000 },
    },
    runningState(),
  ).state;

describe('policy verdict (intake and execution instant)', () => {
  it('given an allow, then the decision records the policy version, the time and the resources', () => {
    expect(policyVerdict(undefined, { policyVersion: 'p1', at: 5, resources: [{ id: 'kb-1', version: 3 }] })).toEqual({
      kind: 'allow',
      authorization: { decision: 'allow', policyVersion: 'p1', at: 5, resources: [{ id: 'kb-1', version: 3 }] },
    });
  });
  it('given a denial, then a refusal with the denial recorded under the policy version', () => {
    expect(policyVerdict({ class: 'forbidden' }, { policyVersion: 'p1', at: 5 })).toEqual({
      kind: 'refuse',
      error: { class: 'forbidden' },
      authorization: { decision: 'deny', policyVersion: 'p1', reason: 'forbidden', at: 5 },
    });
  });
  it('given invalid input, then a refusal with no denial: the input, not the policy, refused', () => {
    expect(policyVerdict({ class: 'invalid_input', issues: [] }, { policyVersion: 'p1', at: 5 })).toEqual({
      kind: 'refuse',
      error: { class: 'invalid_input', issues: [] },
    });
  });
  it("given the policy's dependency away or a failure of its own, then no refusal: the message is retried", () => {
    expect(policyVerdict({ class: 'dependency_unavailable' }, { policyVersion: 'p1', at: 5 })).toEqual({
      kind: 'retry',
    });
    expect(policyVerdict({ class: 'internal' }, { policyVersion: 'p1', at: 5 })).toEqual({ kind: 'retry' });
  });
});

describe('FM-14: a frozen task', () => {
  it('refuses side effects (task_frozen) and lets reads and computations through', () => {
    for (const effect of ['create', 'update', 'delete', 'send', 'charge'] as const)
      expect(frozenTaskRefusal(effect, true)).toEqual({ class: 'task_frozen' });
    for (const effect of ['read', 'compute'] as const) expect(frozenTaskRefusal(effect, true)).toBeNull();
    expect(frozenTaskRefusal('create', false)).toBeNull();
  });
});

describe("a run's outcome (effect-class failure mapping)", () => {
  it('given the downstream applied it, then commit', () => {
    expect(decideAfterRun('create', { kind: 'ok' }, 0)).toEqual({ kind: 'commit' });
  });
  it('FM-15: given a side effect refused as late, then the same attempt runs again — rejected as dependency_unavailable once requeued too often', () => {
    const late = { kind: 'late' as const, error: { class: ErrorClass.DependencyUnavailable } };
    expect(decideAfterRun('create', late, 0)).toEqual({ kind: 'requeue', reason: 'refused_late' });
    expect(decideAfterRun('create', late, MAX_LATE_START_REQUEUES)).toEqual({
      kind: 'reject',
      error: { class: 'dependency_unavailable' },
      reason: 'late_again',
    });
    expect(decideAfterRun('read', late, 0)).toEqual({
      kind: 'reject',
      error: { class: 'dependency_unavailable' },
      reason: 'read_failed',
    });
  });
  it('given a typed refusal of the downstream, then reject with its error, whatever the effect', () => {
    expect(decideAfterRun('create', { kind: 'refused', error: { class: ErrorClass.QuotaExceeded } }, 0)).toEqual({
      kind: 'reject',
      error: { class: 'quota_exceeded' },
      reason: 'refused',
    });
  });
  it('FM-12, FM-13: given a timeout or a lost connection, then a side effect is unknown with that evidence, never rejected; a read is rejected as dependency_unavailable', () => {
    expect(decideAfterRun('create', { kind: 'failed', aborted: true }, 0)).toEqual({
      kind: 'mark_unknown',
      evidence: 'timeout',
    });
    expect(decideAfterRun('charge', { kind: 'failed', aborted: false }, 0)).toEqual({
      kind: 'mark_unknown',
      evidence: 'connection_lost',
    });
    expect(decideAfterRun('read', { kind: 'failed', aborted: true }, 0)).toEqual({
      kind: 'reject',
      error: { class: 'dependency_unavailable' },
      reason: 'read_failed',
    });
    expect(decideAfterRun('compute', { kind: 'failed', aborted: false }, 0)).toEqual({
      kind: 'reject',
      error: { class: 'dependency_unavailable' },
      reason: 'read_failed',
    });
  });
});

describe('decision records', () => {
  it("a refusal under the submission's key carries the tool, the denial and no keyless mark; a readable record", () => {
    const r = refusalRecord(who, {
      eventId: 'evt-d1-0000000',
      at: 7,
      key: KEY,
      keylessKey: 'unused',
      error: IDEMPOTENCY_CONFLICT,
      tool: 'kb.write_note',
      version: 1,
    });
    expect(decisionRecordSchema.parse(r)).toEqual(r);
    expect(r).toMatchObject({
      operationKey: KEY,
      outcome: 'rejected',
      error: { class: 'idempotency_conflict' },
      tool: 'kb.write_note',
      version: 1,
      submissionId: 'sub-1',
    });
    expect(r).not.toHaveProperty('keyless');
  });
  it('a refusal before any key is known goes under the keyless key, marked keyless', () => {
    const r = refusalRecord(who, {
      eventId: 'evt-d1-0000000',
      at: 7,
      key: null,
      keylessKey: `opk_${'K'.repeat(43)}`,
      error: { class: 'invalid_input' },
    });
    expect(decisionRecordSchema.parse(r)).toMatchObject({ operationKey: `opk_${'K'.repeat(43)}`, keyless: true });
  });
  it('a bounded refusal keeps only the class and says the details were not stored', () => {
    const big = {
      class: ErrorClass.InvalidInput,
      issues: Array.from({ length: 500 }, (_, i) => ({ path: [`f${i}`], code: 'unrecognized_keys', message: 'x' })),
    };
    expect(boundedRefusal(big)).toEqual({
      class: 'invalid_input',
      issues: [{ path: [], code: 'record_not_stored', message: "the refusal's details could not be stored" }],
    });
  });
  it("FM-10: an alias record names the submission's key and digest and the canonical ones", () => {
    const r = aliasRecord(who, {
      eventId: 'evt-d2-0000000',
      at: 8,
      key: KEY,
      inputDigest: D1,
      canonicalKey: `opk_${'C'.repeat(43)}`,
      canonicalInputDigest: D2,
      tool: 'kb.write_note',
      version: 1,
    });
    expect(decisionRecordSchema.parse(r)).toMatchObject({
      outcome: 'aliased',
      operationKey: KEY,
      canonicalKey: `opk_${'C'.repeat(43)}`,
      inputDigest: D1,
      canonicalInputDigest: D2,
    });
  });
});

describe('status precedence', () => {
  const answer = (a: Partial<StatusAnswer>): StatusAnswer => ({
    operationKey: KEY,
    state: 'accepted',
    source: 'operation',
    seq: 1,
    at: 1,
    ...a,
  });
  it("given a refusal of the caller's submission, then it answers at once", () => {
    expect(
      statusSettled(answer({ source: 'decision', state: 'rejected', seq: 0 }), { operationKey: KEY, afterSeq: 0 }),
    ).toBe(true);
  });
  it('given a final state the caller has not seen, then at once; one it has seen, then it waits', () => {
    expect(statusSettled(answer({ state: 'committed', seq: 3 }), { operationKey: KEY, afterSeq: 2 })).toBe(true);
    expect(statusSettled(answer({ state: 'committed', seq: 3 }), { operationKey: KEY, afterSeq: 3 })).toBe(false);
  });
  it("given untilFinal, then an intermediate move waits, an earlier attempt's refusal waits, a takeover answers", () => {
    expect(
      statusSettled(answer({ state: 'running', seq: 2 }), { operationKey: KEY, afterSeq: 1, untilFinal: true }),
    ).toBe(false);
    expect(
      statusSettled(answer({ state: 'rejected', seq: 2, ownAttempt: false }), { operationKey: KEY, untilFinal: true }),
    ).toBe(false);
    expect(
      statusSettled(
        answer({
          state: 'unknown',
          seq: 4,
          takeover: takeoverRecordOf(
            unknownState() as OperationRecord,
            { reason: 'unknown_past_deadline', probes: 3 },
            9_000,
          ),
        }),
        { operationKey: KEY, afterSeq: 3, untilFinal: true },
      ),
    ).toBe(true);
  });
  it('given no untilFinal, then any move past afterSeq answers', () => {
    expect(statusSettled(answer({ state: 'running', seq: 2 }), { operationKey: KEY, afterSeq: 1 })).toBe(true);
    expect(statusSettled(answer({ state: 'running', seq: 2 }), { operationKey: KEY, afterSeq: 2 })).toBe(false);
  });
  it('the submitting actor, naming its submission, skips the read policy only while its call is in flight', () => {
    const req = { operationKey: KEY, submissionIds: ['sub-1'] };
    expect(ownCallInFlight(acceptedState() as OperationRecord, 'alice', req)).toBe(true);
    expect(ownCallInFlight(unknownState() as OperationRecord, 'alice', req)).toBe(true);
    expect(ownCallInFlight(acceptedState() as OperationRecord, 'bob', req)).toBe(false);
    expect(ownCallInFlight(acceptedState() as OperationRecord, 'alice', { operationKey: KEY })).toBe(false);
    const rejected = appended(
      { type: 'reject', eventId: 'evt-e9-0000000', at: 3_000, attempt: 1, error: { class: 'forbidden' } },
      runningState(),
    ).state as OperationRecord;
    expect(ownCallInFlight(rejected, 'alice', req)).toBe(false);
  });
  it("given an earlier attempt's refusal and the caller's own resubmission refused since, then the caller's refusal answers", () => {
    const rejected = appended(
      { type: 'reject', eventId: 'evt-e4-0000000', at: 2_500, attempt: 1, error: { class: 'forbidden' } },
      acceptedState(),
    ).state as OperationRecord;
    const mine: DecisionRecord = refusalRecord(
      { tenant: 'acme', actor: 'bob', submissionId: 'sub-9' },
      { eventId: 'evt-d-0000000', at: 3_000, key: KEY, keylessKey: '', error: { class: 'task_frozen' } },
    );
    expect(ownRefusalSupersedes(rejected, 'bob', { operationKey: KEY, submissionIds: ['sub-9'] }, mine)).toBe(true);
    expect(ownRefusalSupersedes(rejected, 'bob', { operationKey: KEY, submissionIds: ['sub-8'] }, mine)).toBe(false);
    expect(
      ownRefusalSupersedes(rejected, 'bob', { operationKey: KEY, submissionIds: ['sub-9'] }, { ...mine, at: 2_000 }),
    ).toBe(false);
    expect(ownRefusalSupersedes(rejected, 'bob', { operationKey: KEY, submissionIds: ['sub-9'] }, null)).toBe(false);
  });
});

describe("the reconciler's look and takeover timing (docs/clocks.md)", () => {
  const timing = { timeoutMs: 2_000, runningBoundMs: 10_000 };
  it('an accepted operation is looked at past runningBoundMs by either clock', () => {
    expect(
      lookDue({ status: 'accepted', updatedAt: 0 }, timing, { seenForMs: 10_001, wallNow: 0, probeDue: false }),
    ).toBe(true);
    expect(
      lookDue({ status: 'accepted', updatedAt: 0 }, timing, { seenForMs: 0, wallNow: 10_001, probeDue: false }),
    ).toBe(true);
    expect(
      lookDue({ status: 'accepted', updatedAt: 0 }, timing, { seenForMs: 9_000, wallNow: 9_000, probeDue: false }),
    ).toBe(false);
  });
  it('a running operation is looked at past its deadline plus the grace and its bound, only when a probe is due', () => {
    const e = { status: 'running' as const, updatedAt: 0, runningAt: 0, deadlineAt: 2_000 };
    expect(lookDue(e, timing, { seenForMs: 10_001, wallNow: 0, probeDue: true })).toBe(true);
    expect(lookDue(e, timing, { seenForMs: 0, wallNow: 10_001, probeDue: true })).toBe(true);
    expect(lookDue(e, timing, { seenForMs: 0, wallNow: 2_000 + RUNNING_GRACE_MS + 1, probeDue: true })).toBe(false);
    expect(lookDue(e, timing, { seenForMs: 99_999, wallNow: 99_999, probeDue: false })).toBe(false);
  });
  it("an unknown operation is looked at whenever a probe is due; it goes to a person past unknownDeadlineMs of this process's own clock", () => {
    expect(lookDue({ status: 'unknown', updatedAt: 0 }, timing, { seenForMs: 0, wallNow: 0, probeDue: true })).toBe(
      true,
    );
    expect(takeoverDue('unknown', 60_001, 60_000)).toBe(true);
    expect(takeoverDue('unknown', 60_000, 60_000)).toBe(false);
    expect(takeoverDue('running', 99_999, 60_000)).toBe(false);
  });
  it('the probe backoff doubles from 1 s to a 60 s cap, with ±50 % jitter', () => {
    expect(nextProbeDelayMs(0, () => 0.5)).toBe(1_000);
    expect(nextProbeDelayMs(3, () => 0.5)).toBe(8_000);
    expect(nextProbeDelayMs(20, () => 0.5)).toBe(60_000);
    expect(nextProbeDelayMs(20, () => 0)).toBe(30_000);
    expect(nextProbeDelayMs(20, () => 0.999)).toBeLessThan(90_000);
  });
});

describe('FM-14: the takeover record', () => {
  it('names the target, the last evidence, what a probe found, the attempts and the times', () => {
    const u = unknownState() as OperationRecord;
    const t = takeoverRecordOf(
      u,
      { reason: 'probe_mismatch', probes: 2, probed: { resourceId: 'r-9', inputDigest: D2 } },
      9_000,
    );
    expect(takeoverRecordSchema.parse(t)).toEqual(t);
    expect(t).toMatchObject({
      operationKey: KEY,
      tenant: 'acme',
      taskId: 'task-1',
      targetDigest: D2,
      inputDigest: D1,
      reason: 'probe_mismatch',
      lastEvidence: { kind: 'timeout', at: 6_000 },
      probed: { resourceId: 'r-9', inputDigest: D2 },
      attempts: { attempt: 1, requeues: 0, probes: 2 },
      times: { acceptedAt: 1_000, runningAt: 2_000, unknownSince: 6_000, openedAt: 9_000 },
    });
  });
});

describe('an intent whose handling threw', () => {
  it("given the store, the server or a lost race, or the policy's dependency away, then it is retried on every delivery", () => {
    for (const deliveryCount of [1, 3, 40]) {
      expect(decideIntakeFailure({ retryable: true, dependencyAway: false, deliveryCount })).toBe('retry');
      expect(decideIntakeFailure({ retryable: false, dependencyAway: true, deliveryCount })).toBe('retry');
    }
  });
  it('given a failure that will fail again, then it is retried a few times and then terminal (recorded as internal, never redelivered for minutes)', () => {
    expect(decideIntakeFailure({ retryable: false, dependencyAway: false, deliveryCount: 1 })).toBe('retry');
    expect(
      decideIntakeFailure({ retryable: false, dependencyAway: false, deliveryCount: TERMINAL_AFTER_DELIVERIES - 1 }),
    ).toBe('retry');
    expect(
      decideIntakeFailure({ retryable: false, dependencyAway: false, deliveryCount: TERMINAL_AFTER_DELIVERIES }),
    ).toBe('terminal');
  });
  it("a refused intent is deleted from the tenant's intake only on its first delivery (a redelivered one may have registered an operation whose ack was lost)", () => {
    expect(refusedIntentDeletable(1)).toBe(true);
    expect(refusedIntentDeletable(2)).toBe(false);
  });
});

describe('FM-10: references', () => {
  const own = { operationKey: 'opk_own', inputDigest: D1, targetDigest: D2 };
  it("given a canonical input with another key, then the operation is registered under the canonical key and the submission's own is kept", () => {
    const canonical = { operationKey: 'opk_canonical', inputDigest: D2, targetDigest: D2 };
    expect(registrationOf(own, canonical)).toEqual({
      registered: canonical,
      submitted: { operationKey: 'opk_own', inputDigest: D1 },
    });
  });
  it("given no canonical input, or one with the same key, then the submission's own call is registered", () => {
    expect(registrationOf(own, null)).toEqual({ registered: own });
    expect(registrationOf(own, { ...own })).toEqual({ registered: own });
  });
  it('at the execution instant, a reference that now names another resource (or no longer parses) is refused version_conflict with a denial', () => {
    const op = { operationKey: 'opk_a', inputDigest: D1, compensation: false };
    const o = { policyVersion: 'p', at: 1 };
    expect(referenceMovedRefusal(op, { operationKey: 'opk_a', inputDigest: D2 }, o)).toBeNull();
    expect(referenceMovedRefusal(op, { operationKey: 'opk_b', inputDigest: D1 }, o)).toEqual({
      error: { class: 'version_conflict' },
      authorization: { decision: 'deny', policyVersion: 'p', reason: 'version_conflict', at: 1 },
    });
    expect(referenceMovedRefusal(op, null, o)?.error.class).toBe('version_conflict');
  });
  it("given a compensation (its key derived from its original's, never from its input), then its canonical input's digest must be the registered one, whatever key that input would derive", () => {
    const comp = { operationKey: 'opk_c', inputDigest: D1, compensation: true };
    const o = { policyVersion: 'p', at: 1 };
    expect(referenceMovedRefusal(comp, { operationKey: 'opk_other', inputDigest: D1 }, o)).toBeNull();
    expect(referenceMovedRefusal(comp, { operationKey: 'opk_c', inputDigest: D2 }, o)?.error.class).toBe(
      'version_conflict',
    );
    expect(referenceMovedRefusal(comp, null, o)?.error.class).toBe('version_conflict');
  });
});

describe('FM-27: a running operation redelivered to another executor', () => {
  it("waits until the attempt's deadline has passed on the downstream's clock as far as known, plus a margin; then verifies", () => {
    expect(redeliveredRunWaitMs(10_000, 9_000, 0)).toBe(1_000 + REDELIVERED_RUN_MARGIN_MS);
    expect(redeliveredRunWaitMs(10_000, 9_000, 500)).toBe(500 + REDELIVERED_RUN_MARGIN_MS);
    expect(redeliveredRunWaitMs(10_000, 10_000, 0)).toBe(0);
    expect(redeliveredRunWaitMs(10_000, 12_000, -1_000)).toBe(0);
  });
});

describe('FM-14: takeover and resolution', () => {
  it("a takeover opens only on an unknown operation, once; an open takeover backs its task's freeze", () => {
    const u = unknownState() as OperationRecord;
    expect(takeoverOpenable(u)).toBe('open');
    expect(takeoverOpenable(runningState())).toBe('not_unknown');
    expect(takeoverOpenable({ status: 'none' })).toBe('not_unknown');
    const taken = appended(
      {
        type: 'open_takeover',
        eventId: 'evt-t-0000000',
        at: 9_000,
        attempt: 1,
        takeover: takeoverRecordOf(u, { reason: 'unknown_past_deadline', probes: 1 }, 9_000),
      },
      u,
    ).state;
    expect(takeoverOpenable(taken)).toBe('already');
    expect(freezeBacked(taken)).toBe(true);
    expect(freezeBacked(u)).toBe(false);
    const resolved = appended(
      {
        type: 'resolve',
        eventId: 'evt-r-0000000',
        at: 9_500,
        attempt: 1,
        resolvedBy: 'oscar',
        outcome: { kind: 'not_applied' },
      },
      taken as OperationRecord,
    ).state;
    expect(freezeBacked(resolved)).toBe(false);
  });
  it('a resolution applies to an unknown operation; the same one again answers the state; anything else is refused', () => {
    const u = unknownState() as OperationRecord;
    expect(resolutionVerdict(u, { kind: 'not_applied' })).toBe('resolve');
    const resolved = appended(
      {
        type: 'resolve',
        eventId: 'evt-r-0000001',
        at: 9_500,
        attempt: 1,
        resolvedBy: 'oscar',
        outcome: { kind: 'not_applied' },
      },
      u,
    ).state;
    expect(resolutionVerdict(resolved, { kind: 'not_applied' })).toBe('already');
    expect(resolutionVerdict(resolved, { kind: 'committed', resourceId: 'r-1' })).toBe('not_unknown');
    expect(resolutionVerdict(runningState(), { kind: 'not_applied' })).toBe('not_unknown');
  });
});

describe("FM-19: a write's result is its receipt", () => {
  it("a commit no run returned stores the empty result when the contract's output takes one, and nothing else", () => {
    expect(receiptOnlyResult({ output: z.object({}) })).toEqual({
      result: {},
      digest: expect.stringMatching(/^sha256:/),
    });
    expect(receiptOnlyResult({ output: z.object({ noteId: z.string() }) })).toBeNull();
  });
});

describe('audit: whether the effect happened', () => {
  it('none for reads and computations, and when rejected or accepted; applied when committed; possible while running or unknown', () => {
    expect(sideEffectOf('read', 'committed')).toBe('none');
    expect(sideEffectOf('compute', 'running')).toBe('none');
    expect(sideEffectOf('create', 'committed')).toBe('applied');
    expect(sideEffectOf('charge', 'rejected')).toBe('none');
    expect(sideEffectOf('send', 'accepted')).toBe('none');
    expect(sideEffectOf('update', 'running')).toBe('possible');
    expect(sideEffectOf('delete', 'unknown')).toBe('possible');
    // An effect class this version does not know is never taken for "none".
    expect(sideEffectOf('teleport', 'unknown')).toBe('possible');
  });
  it('an attempt has ended when committed or rejected', () => {
    expect(['committed', 'rejected'].every((s) => attemptEnded(s))).toBe(true);
    expect(['none', 'accepted', 'running', 'unknown'].some((s) => attemptEnded(s))).toBe(false);
  });
});

describe('FM-12, FM-13, FM-19, FM-27: the recovery verdict', () => {
  const keyed = { honoursKey: true, enforcesDeadline: false };
  const plain = { honoursKey: false, enforcesDeadline: false };
  it('found under our key with the same input: commit when the result is the receipt; else unknown for a person (marked if running)', () => {
    const r = runningState() as OperationRecord;
    expect(planRecovery(r, { kind: 'found', resourceId: 'n-1' }, { downstream: plain, receiptOnly: true })).toEqual({
      kind: 'commit',
      resourceId: 'n-1',
    });
    expect(planRecovery(r, { kind: 'found', resourceId: 'n-1' }, { downstream: plain, receiptOnly: false })).toEqual({
      kind: 'unknown',
      reason: 'result_not_recoverable',
      markEvidence: 'probe',
    });
    expect(
      planRecovery(
        unknownState() as OperationRecord,
        { kind: 'found', resourceId: 'n-1' },
        { downstream: plain, receiptOnly: false },
      ),
    ).toEqual({ kind: 'unknown', reason: 'result_not_recoverable' });
  });
  it('another effect under our key: a person takes over, with what the probe found', () => {
    expect(
      planRecovery(
        runningState() as OperationRecord,
        { kind: 'found', resourceId: 'n-9', inputDigest: D2 },
        { downstream: plain, receiptOnly: true },
      ),
    ).toEqual({
      kind: 'unknown',
      reason: 'mismatch',
      markEvidence: 'probe',
      probed: { resourceId: 'n-9', inputDigest: D2 },
    });
  });
  it('nothing found where a repeat is safe: requeue; where it is not: unknown (probe again)', () => {
    expect(
      planRecovery(runningState() as OperationRecord, { kind: 'not_found' }, { downstream: keyed, receiptOnly: true }),
    ).toEqual({ kind: 'requeue' });
    expect(
      planRecovery(runningState() as OperationRecord, { kind: 'not_found' }, { downstream: plain, receiptOnly: true }),
    ).toEqual({ kind: 'unknown', reason: 'unresolved', markEvidence: 'executor_lost' });
    expect(
      planRecovery(
        unknownState() as OperationRecord,
        { kind: 'unavailable' },
        { downstream: keyed, receiptOnly: true },
      ),
    ).toEqual({ kind: 'unknown', reason: 'unresolved' });
    expect(
      planRecovery(
        runningState() as OperationRecord,
        { kind: 'unavailable' },
        { downstream: keyed, receiptOnly: true },
      ),
    ).toEqual({ kind: 'unknown', reason: 'unresolved', markEvidence: 'probe' });
  });
  it('FM-14: given an attempt requeued the most times allowed, when the probe finds nothing again, then it stays unknown for a person instead of being sent forever', () => {
    const requeued = (n: number) => ({ ...(unknownState() as OperationRecord), requeues: n });
    expect(
      planRecovery(
        requeued(MAX_LATE_START_REQUEUES - 1),
        { kind: 'not_found' },
        { downstream: keyed, receiptOnly: true },
      ),
    ).toEqual({ kind: 'requeue' });
    expect(
      planRecovery(requeued(MAX_LATE_START_REQUEUES), { kind: 'not_found' }, { downstream: keyed, receiptOnly: true }),
    ).toEqual({ kind: 'unknown', reason: 'requeue_limit' });
    expect(
      planRecovery(
        { ...(runningState() as OperationRecord), requeues: MAX_LATE_START_REQUEUES },
        { kind: 'not_found' },
        { downstream: keyed, receiptOnly: true },
      ),
    ).toEqual({ kind: 'unknown', reason: 'requeue_limit', markEvidence: 'probe' });
  });
  it('a contract with no probe: a running attempt whose executor is gone is unknown for a person', () => {
    expect(
      planRecovery(runningState() as OperationRecord, { kind: 'no_probe' }, { downstream: keyed, receiptOnly: true }),
    ).toEqual({ kind: 'unknown', reason: 'no_probe', markEvidence: 'executor_lost' });
    expect(
      planRecovery(unknownState() as OperationRecord, { kind: 'no_probe' }, { downstream: keyed, receiptOnly: true }),
    ).toEqual({ kind: 'unknown', reason: 'no_probe' });
  });
});

describe("the reconciler's sweep action", () => {
  it("closes the entry of an ended operation, skips a lagging index or a person's operation, requeues a stale accepted one, verifies a running or unknown one", () => {
    const a = acceptedState() as OperationRecord;
    const r = runningState() as OperationRecord;
    const u = unknownState() as OperationRecord;
    const rejected = appended(
      { type: 'reject', eventId: 'evt-x-0000000', at: 3_000, attempt: 1, error: { class: 'forbidden' } },
      r,
    ).state;
    expect(sweepAction({ status: 'running', seq: 5 }, { status: 'none' }, 0)).toBe('skip');
    expect(sweepAction({ status: 'running', seq: 5 }, rejected, 6)).toBe('close_entry');
    expect(sweepAction({ status: 'running', seq: 5 }, r, 7)).toBe('verify');
    expect(sweepAction({ status: 'accepted', seq: 5 }, r, 7)).toBe('skip');
    expect(sweepAction({ status: 'accepted', seq: 5 }, a, 5)).toBe('requeue_stale');
    expect(sweepAction({ status: 'unknown', seq: 5 }, u, 5)).toBe('verify');
    const taken = appended(
      {
        type: 'open_takeover',
        eventId: 'evt-t-0000009',
        at: 9_000,
        attempt: 1,
        takeover: takeoverRecordOf(u, { reason: 'unknown_past_deadline', probes: 1 }, 9_000),
      },
      u,
    ).state;
    expect(sweepAction({ status: 'unknown', seq: 5 }, taken, 6)).toBe('skip');
  });
  it('ends a held-back operation still awaiting its confirmation (the index entry is due past its deadline)', () => {
    const held = appended(
      { type: 'await_confirmation', eventId: 'evt-h-0000001', at: 2_000, attempt: 1, deadlineAt: 9_000 },
      appended({ ...accept, awaitsConfirmation: true }, null).state,
    ).state;
    expect(sweepAction({ status: 'awaiting_confirmation', seq: 5 }, held, 5)).toBe('expire_confirmation');
    const timing = { timeoutMs: 2_000, runningBoundMs: 10_000 };
    const e = { status: 'awaiting_confirmation', updatedAt: 2_000, confirmDeadlineAt: 9_000 };
    expect(lookDue(e, timing, { seenForMs: 99_999, wallNow: 8_999, probeDue: true })).toBe(false);
    expect(lookDue(e, timing, { seenForMs: 0, wallNow: 9_000, probeDue: false })).toBe(true);
  });
  it("probes again on the backoff, or sooner when the downstream's clock said when a late request can no longer land", () => {
    expect(nextProbeInMs(1, {}, () => 0.5)).toBe(2_000);
    expect(nextProbeInMs(1, { retryInMs: 300 }, () => 0.5)).toBe(300);
    expect(nextProbeInMs(1, { retryInMs: 9_000 }, () => 0.5)).toBe(2_000);
  });
  it('FM-14: probes again just past the unknown deadline when the backoff would come later, so the takeover opens at the deadline', () => {
    // Given six unresolved probes (a backoff of 64 s capped at 60 s) and 5 s left before the deadline,
    expect(nextProbeInMs(6, { untilDeadlineMs: 5_000 }, () => 0.5)).toBe(5_001);
    // when the backoff comes first, it is kept;
    expect(nextProbeInMs(1, { untilDeadlineMs: 5_000 }, () => 0.5)).toBe(2_000);
    // and once the deadline has passed (the takeover is due at this probe), the backoff alone counts.
    expect(nextProbeInMs(6, { untilDeadlineMs: -1 }, () => 0.5)).toBe(60_000);
    expect(nextProbeInMs(6, { retryInMs: 700, untilDeadlineMs: 5_000 }, () => 0.5)).toBe(700);
  });
});

describe("the executor's verdicts around a run", () => {
  it('runs an accepted operation of this attempt, recovers a running one delivered again (FM-27), ignores the rest', () => {
    expect(executorAction(acceptedState(), 1, 1)).toBe('run');
    expect(executorAction(acceptedState(), 2, 1)).toBe('ignore');
    expect(executorAction(runningState(), 1, 2)).toBe('recover');
    expect(executorAction(runningState(), 1, 1)).toBe('ignore');
    expect(executorAction(unknownState(), 1, 3)).toBe('ignore');
    expect(executorAction({ status: 'none' }, 1, 1)).toBe('ignore');
  });
  it('a refusal before running holds only while the operation waits to run in the same attempt', () => {
    expect(waitingToRun(acceptedState(), 1)).toBe(true);
    expect(waitingToRun(acceptedState(), 2)).toBe(false);
    expect(waitingToRun(runningState(), 1)).toBe(false);
  });
  it("what the downstream threw becomes the run's outcome", () => {
    expect(runOutcomeOf(undefined, false)).toEqual({ kind: 'ok' });
    expect(runOutcomeOf(new DeadlinePassedError(5), false)).toMatchObject({
      kind: 'late',
      error: { class: 'dependency_unavailable' },
    });
    expect(runOutcomeOf(new TooltxError(ErrorClass.Forbidden, 'no'), false)).toMatchObject({
      kind: 'refused',
      error: { class: 'forbidden' },
    });
    expect(runOutcomeOf(new Error('socket hang up'), true)).toEqual({ kind: 'failed', aborted: true });
  });
  it('a side effect stored too late is not sent (FM-29); a read always is', () => {
    expect(sendAfterStart({ effect: 'create', timeoutMs: 1_000, elapsedMs: 100, requeues: 0 })).toEqual({
      kind: 'send',
    });
    expect(sendAfterStart({ effect: 'create', timeoutMs: 1_000, elapsedMs: 900, requeues: 0 })).toEqual({
      kind: 'requeue',
    });
    expect(sendAfterStart({ effect: 'read', timeoutMs: 1_000, elapsedMs: 900, requeues: 0 })).toEqual({ kind: 'send' });
  });
});
