import { describe, expect, it } from 'vitest';
import {
  countsOf,
  decide,
  operationEventSchema,
  type OperationCommand,
  type OperationEvent,
  type OperationRecord,
} from '@tooltx/lifecycle';
import { keyedDigest } from '@tooltx/runtime';
import { decode, encode } from '@tooltx/nats';
import {
  interleave,
  PLANTED_ERROR_TEXT,
  sampleOperation,
  sampleOperations,
  shuffled,
} from '../../../test/helpers/histories.js';
import {
  MAX_AUDIT_DECISIONS,
  applyDecisionToAudit,
  applyEventToAudit,
  auditRecordSchema,
  auditedDecisionSchema,
  auditedEventSchema,
  type AuditedDecision,
  type AuditedEvent,
  type AuditHmac,
  type AuditRecord,
} from '../src/audit-record.js';

const KEY = Buffer.from('k'.repeat(64));
const h: AuditHmac = (purpose, value) => keyedDigest(KEY, `audit-${purpose}`, value);

/** One message of either stream, as the projector sees it. */
type Entry = { key: string; seq: number } & (
  | { kind: 'event'; event: AuditedEvent }
  | { kind: 'decision'; decision: AuditedDecision }
);

function foldAll(entries: readonly Entry[]): Map<string, AuditRecord> {
  const out = new Map<string, AuditRecord>();
  for (const e of entries) {
    const cur = out.get(e.key) ?? null;
    const next =
      e.kind === 'event' ? applyEventToAudit(cur, e.event, e.seq, h) : applyDecisionToAudit(cur, e.decision, e.seq);
    if (next) out.set(e.key, next);
  }
  return out;
}

const ops = sampleOperations(2);
const decisionOf = (o: (typeof ops)[number], i: number, cls: string, actor = 'mallory'): AuditedDecision => ({
  type: 'decision',
  at: 1_760_000_000_000 + i,
  operationKey: o.operationKey,
  tenant: o.tenant,
  actor,
  tool: 'kb.write_note',
  version: 2,
  error: { class: cls },
  ...(cls === 'forbidden'
    ? {
        authorization: {
          decision: 'deny',
          policyVersion: 'kb-policy@1',
          reason: 'forbidden',
          at: 1_760_000_000_000 + i,
        },
      }
    : {}),
});
const committedOp = ops.find((x) => x.kind === 'committed')!;
const refusedOnly = sampleOperation('accepted', 77); // its events are never appended: refused at intake only
const log: Entry[] = [
  ...interleave(ops).map((x): Entry => ({ kind: 'event', key: x.key, seq: x.seq, event: x.event })),
  // Decisions live on their own stream: their sequences are their own.
  {
    kind: 'decision',
    key: `acme.${committedOp.opId}`,
    seq: 1,
    decision: decisionOf(committedOp, 1, 'idempotency_conflict'),
  },
  {
    kind: 'decision',
    key: `acme.${committedOp.opId}`,
    seq: 3,
    decision: decisionOf(committedOp, 3, 'idempotency_conflict', 'alice'),
  },
  { kind: 'decision', key: `acme.${refusedOnly.opId}`, seq: 2, decision: decisionOf(refusedOnly, 2, 'forbidden') },
];
const inOrder = foldAll(log);
const recordOf = (kind: string) => {
  const o = ops.find((x) => x.kind === kind)!;
  return inOrder.get(`${o.tenant}.${o.opId}`)!;
};

describe('audit projection: one record per operation', () => {
  it('records who, which task, which contract, a keyed HMAC of the target, the decisions, every state with its time, the outcome and an HMAC of its result', () => {
    const o = committedOp;
    const r = recordOf('committed');
    const seqs = log.filter((e) => e.kind === 'event' && e.key === `${o.tenant}.${o.opId}`).map((e) => e.seq);
    const s = o.events[2]!.state;
    expect(r).toEqual({
      operationKey: o.operationKey,
      tenant: 'acme',
      seq: seqs[2],
      decisionSeq: 3,
      actor: 'alice',
      taskId: s.taskId,
      status: 'committed',
      tool: 'kb.write_note',
      contract: 'kb.write_note@2',
      contractDigest: s.contractDigest,
      effect: 'create',
      targetHmac: h('target', s.targetDigest),
      attempt: 1,
      sideEffect: 'applied',
      resultHmac: h('result', s.receipt!.resultDigest),
      states: o.events.map((e, i) => ({
        seq: seqs[i],
        event: e.type,
        status: e.type,
        at: e.at,
        attempt: 1,
        actor: 'alice',
      })),
      decisions: [
        {
          seq: 1,
          at: 1_760_000_000_001,
          actor: 'mallory',
          contract: 'kb.write_note@2',
          errorClass: 'idempotency_conflict',
          conflict: true,
        },
        {
          seq: 3,
          at: 1_760_000_000_003,
          actor: 'alice',
          contract: 'kb.write_note@2',
          errorClass: 'idempotency_conflict',
          conflict: true,
        },
      ],
      firstAt: o.events[0]!.at,
      lastAt: 1_760_000_000_003,
    });
    // Neither the plain target digest nor the plain result digest is in the record.
    expect(JSON.stringify(r)).not.toContain(s.targetDigest);
    expect(JSON.stringify(r)).not.toContain(s.receipt!.resultDigest);
  });

  it('keeps both attempts of a retried operation; the head follows the newest event', () => {
    const r = recordOf('retried_unknown');
    expect(r.states.map((s) => [s.event, s.attempt, s.actor])).toEqual([
      ['accepted', 1, 'alice'],
      ['rejected', 1, 'alice'],
      ['accepted', 2, 'bob'],
      ['running', 2, 'bob'],
      ['unknown', 2, 'bob'],
    ]);
    expect(r.states[1]).toMatchObject({ errorClass: 'quota_exceeded' });
    expect(r).toMatchObject({ status: 'unknown', attempt: 2, actor: 'bob', sideEffect: 'possible' });
    expect(r).not.toHaveProperty('errorClass');
  });

  it('says whether the side effect happened: applied, possible or none', () => {
    expect(recordOf('read_failed')).toMatchObject({
      status: 'rejected',
      errorClass: 'dependency_unavailable',
      sideEffect: 'none',
    });
    expect(recordOf('refused')).toMatchObject({ status: 'rejected', errorClass: 'invalid_input', sideEffect: 'none' });
    expect(recordOf('accepted').sideEffect).toBe('none');
    expect(recordOf('running').sideEffect).toBe('possible');
  });

  it('an operation refused at intake only has a record of its refusals, with the denying policy version', () => {
    const r = inOrder.get(`acme.${refusedOnly.opId}`)!;
    expect(r).toEqual({
      operationKey: refusedOnly.operationKey,
      tenant: 'acme',
      seq: 0,
      decisionSeq: 2,
      actor: 'mallory',
      status: 'refused',
      contract: 'kb.write_note@2',
      tool: 'kb.write_note',
      sideEffect: 'none',
      errorClass: 'forbidden',
      states: [],
      decisions: [
        {
          seq: 2,
          at: 1_760_000_000_002,
          actor: 'mallory',
          contract: 'kb.write_note@2',
          errorClass: 'forbidden',
          conflict: false,
          policyVersion: 'kb-policy@1',
        },
      ],
      firstAt: 1_760_000_000_002,
      lastAt: 1_760_000_000_002,
    });
  });

  it('gives the same records for both streams applied reversed, shuffled and with every message twice (a rebuild, several instances)', () => {
    const orders: [string, Entry[]][] = [
      ['reversed', [...log].reverse()],
      ...[1, 2, 3, 42, 1337].map((seed): [string, Entry[]] => [`shuffled #${seed}`, shuffled(log, seed)]),
      ...[7, 99].map((seed): [string, Entry[]] => [`duplicated #${seed}`, shuffled([...log, ...log], seed)]),
      ['in order, twice', [...log, ...log]],
    ];
    for (const [name, entries] of orders) expect(foldAll(entries), name).toEqual(inOrder);
  });

  it('records an event type or status it does not know with its time; a manual resolution names who resolved it', () => {
    const [accepted, running, unknown] = sampleOperation('running', 91).events as unknown as [
      AuditedEvent,
      AuditedEvent,
      AuditedEvent?,
    ];
    const at = running.at + 1_000;
    const marked: AuditedEvent = { ...running, type: 'unknown', at, state: { ...running.state, status: 'unknown' } };
    const takeover: AuditedEvent = {
      ...marked,
      type: 'takeover',
      at: at + 1,
      state: { ...marked.state, takeover: { reason: 'unknown_past_deadline' } },
    };
    // A status of a later version (what this one knows, compensation included, is not this).
    const compensating: AuditedEvent = {
      ...marked,
      type: 'escalated',
      at: at + 2,
      state: { ...marked.state, status: 'escalated' },
    };
    const resolved: AuditedEvent = {
      ...marked,
      type: 'rejected',
      at: at + 3,
      manual: true,
      resolvedBy: 'oscar',
      state: { ...marked.state, status: 'rejected', error: { class: 'not_applied' }, resolution: { by: 'oscar' } },
    };
    expect(unknown).toBeUndefined();
    let r: AuditRecord | null = null;
    for (const [e, seq] of [
      [accepted, 1],
      [running, 2],
      [marked, 3],
      [takeover, 4],
      [compensating, 5],
    ] as const)
      r = applyEventToAudit(r, e, seq, h) ?? r;
    expect(r!.states.map((s) => [s.event, s.status])).toEqual([
      ['accepted', 'accepted'],
      ['running', 'running'],
      ['unknown', 'unknown'],
      ['takeover', 'unknown'],
      ['escalated', 'escalated'],
    ]);
    expect(r).toMatchObject({ status: 'escalated', sideEffect: 'possible' });
    r = applyEventToAudit(r, resolved, 6, h)!;
    expect(r).toMatchObject({ status: 'rejected', errorClass: 'not_applied', resolvedBy: 'oscar', sideEffect: 'none' });
    expect(r.states.at(-1)).toEqual({
      seq: 6,
      event: 'rejected',
      status: 'rejected',
      at: at + 3,
      attempt: 1,
      actor: 'alice',
      errorClass: 'not_applied',
      resolvedBy: 'oscar',
    });
    const counts = countsOf([r]);
    expect(counts[0]).toMatchObject({
      unknown: 1,
      unresolved: 0,
      takeovers: 1,
      manual: 1,
      rejected: { not_applied: 1 },
    });
  });

  it('a takeover and a person\'s "not applied" resolution, decided by the real decider, are recorded with who resolved it', () => {
    const o = sampleOperation('running', 93);
    let state = o.events.at(-1)!.state as OperationRecord;
    const events: OperationEvent[] = [...o.events];
    const next = (cmd: OperationCommand) => {
      const d = decide(cmd, state);
      if (d.kind !== 'append') throw new Error(`expected append, got ${d.kind}`);
      events.push(d.event);
      state = d.event.state;
    };
    const at = state.updatedAt;
    next({
      type: 'mark_unknown',
      eventId: 'evt-93-unknown',
      at: at + 100,
      attempt: 1,
      runId: state.running!.eventId,
      evidence: { kind: 'timeout', at: at + 100, elapsedMs: 5_000 },
    });
    next({
      type: 'open_takeover',
      eventId: 'evt-93-takeover',
      at: at + 200,
      attempt: 1,
      takeover: {
        operationKey: o.operationKey,
        tenant: 'acme',
        taskId: 'task-93',
        tool: state.tool,
        version: state.version,
        targetDigest: state.targetDigest,
        inputDigest: state.inputDigest,
        reason: 'unknown_past_deadline',
        attempts: { attempt: 1, requeues: 0, probes: 3 },
        times: { acceptedAt: state.acceptedAt, unknownSince: at + 100, openedAt: at + 200 },
      },
    });
    next({
      type: 'resolve',
      eventId: 'evt-93-resolve',
      at: at + 300,
      attempt: 1,
      prevSeq: 4,
      resolvedBy: 'oscar',
      outcome: { kind: 'not_applied' },
    });
    let r: AuditRecord | null = null;
    events.forEach((e, i) => {
      r = applyEventToAudit(r, e, i + 1, h) ?? r;
    });
    const rec = r as unknown as AuditRecord;
    expect(rec.states.map((s) => [s.event, s.status, s.resolvedBy ?? null])).toEqual([
      ['accepted', 'accepted', null],
      ['running', 'running', null],
      ['unknown', 'unknown', null],
      ['takeover', 'unknown', null],
      ['rejected', 'rejected', 'oscar'],
    ]);
    expect(rec).toMatchObject({
      status: 'rejected',
      errorClass: 'not_applied',
      resolvedBy: 'oscar',
      sideEffect: 'none',
      takeover: { reason: 'unknown_past_deadline' },
    });
    expect(JSON.stringify(rec)).not.toContain(state.inputDigest);
    expect(countsOf([rec])[0]).toMatchObject({
      unknown: 1,
      unresolved: 0,
      takeovers: 1,
      manual: 1,
      rejected: { not_applied: 1 },
    });
  });

  it("FM-20: a failed compensation's takeover and a person's resolution of it, decided by the real decider, are counted as a takeover and a manual outcome, with no receipt signature", () => {
    const o = sampleOperation('committed', 94);
    let state = o.events.at(-1)!.state as OperationRecord;
    const events: OperationEvent[] = [...o.events];
    const next = (cmd: OperationCommand) => {
      const d = decide(cmd, state);
      if (d.kind !== 'append') throw new Error(`expected append, got ${d.kind}`);
      events.push(d.event);
      state = d.event.state;
    };
    const at = state.updatedAt;
    const compensationKey = `opk_${'C'.repeat(43)}`;
    next({
      type: 'request_compensation',
      eventId: 'evt-94-request',
      at: at + 100,
      compensation: { operationKey: compensationKey, tool: 'kb.delete_note', version: 1 },
      requestedBy: { kind: 'actor', id: 'alice' },
      reasonDigest: `sha256:${'d'.repeat(64)}`,
    });
    next({
      type: 'fail_compensation',
      eventId: 'evt-94-failed',
      at: at + 200,
      compensationKey,
      kind: 'rejected',
      error: { class: 'forbidden' },
    });
    next({
      type: 'resolve_compensation_failure',
      eventId: 'evt-94-resolved',
      at: at + 300,
      resolvedBy: 'oscar',
      outcome: 'undone_by_hand',
    });
    let r: AuditRecord | null = null;
    events.forEach((e, i) => {
      r = applyEventToAudit(r, e, i + 1, h) ?? r;
    });
    const rec = r as unknown as AuditRecord;
    expect(rec.states.slice(-3).map((s) => [s.event, s.status, s.resolvedBy ?? null])).toEqual([
      ['compensation_requested', 'compensation_requested', null],
      ['compensation_failed', 'compensation_failed', null],
      ['compensation_failure_resolved', 'compensation_failed', 'oscar'],
    ]);
    expect(rec).toMatchObject({
      status: 'compensation_failed',
      resolvedBy: 'oscar',
      sideEffect: 'applied',
      takeover: { reason: 'compensation_failed' },
      compensation: { operationKey: compensationKey, errorClass: 'forbidden' },
    });
    expect(JSON.stringify(rec)).not.toContain(state.receipt!.signature);
    expect(countsOf([rec])[0]).toMatchObject({ takeovers: 1, manual: 1 });
  });

  it('counts per contract version: accepted attempts, committed, rejected by class, refusals, conflicts, unknowns', () => {
    const counts = countsOf(inOrder.values());
    expect(counts).toEqual([
      {
        contract: 'kb.write_note@2',
        operations: ops.length + 1,
        // Two operations of each kind; the retried one was accepted twice.
        accepted: ops.length + 2,
        committed: 2,
        rejected: { quota_exceeded: 2, dependency_unavailable: 2, invalid_input: 2 },
        refused: { forbidden: 1 },
        conflicts: 2,
        unknown: 2,
        unresolved: 2,
        takeovers: 0,
        manual: 0,
      },
    ]);
  });

  it('never carries an input, a body, a plain digest of the target or raw error text', () => {
    for (const r of inOrder.values()) {
      const bytes = Buffer.from(encode(r)).toString('latin1');
      expect(bytes).not.toContain(PLANTED_ERROR_TEXT);
      for (const o of ops) expect(bytes).not.toContain(o.events[0]!.state.targetDigest);
      expect(Object.keys(r).filter((k) => !auditRecordSchema.shape[k as keyof typeof auditRecordSchema.shape])).toEqual(
        [],
      );
    }
  });

  it('stores records that survive msgpack and the schema unchanged', () => {
    for (const r of inOrder.values()) expect(decode(auditRecordSchema, encode(r))).toEqual(r);
  });
});

describe('an event this process appended, read as validated (decodeMsg impliedBy)', () => {
  it('given every kind of history the decider writes, then the strict event schema implies the lenient one, and the rule gives the same record from either reading', () => {
    let n = 0;
    for (const o of sampleOperations(2)) {
      let fromStrict: AuditRecord | null = null;
      let fromLenient: AuditRecord | null = null;
      o.events.forEach((event, i) => {
        const strict = operationEventSchema.parse(event);
        const lenient = auditedEventSchema.safeParse(strict);
        expect(lenient.success, `${o.operationKey} ${event.type}`).toBe(true);
        if (!lenient.success) return;
        fromStrict = applyEventToAudit(fromStrict, strict as unknown as AuditedEvent, i + 1, h) ?? fromStrict;
        fromLenient = applyEventToAudit(fromLenient, lenient.data, i + 1, h) ?? fromLenient;
        n++;
      });
      expect(fromStrict, o.operationKey).toEqual(fromLenient);
    }
    expect(n).toBeGreaterThan(20);
  });
});

describe('a key refused again and again (docs/tenancy.md)', () => {
  it('given more refusals under one key than a record keeps, when projected, then the record keeps the newest and counts the rest, in any order', () => {
    const o = ops[1]!;
    const n = MAX_AUDIT_DECISIONS + 40;
    const apply = (seqs: number[]) =>
      seqs.reduce<AuditRecord | null>(
        (cur, seq) => applyDecisionToAudit(cur, decisionOf(o, seq, 'invalid_input'), seq) ?? cur,
        null,
      )!;
    const inOrder = apply(Array.from({ length: n }, (_, i) => i + 1));
    expect(inOrder.decisions.map((d) => d.seq)).toEqual(
      Array.from({ length: MAX_AUDIT_DECISIONS }, (_, i) => n - MAX_AUDIT_DECISIONS + i + 1),
    );
    expect(inOrder.decisionsDropped).toBe(40);
    // Delivered out of order: the same record.
    expect(
      apply(
        shuffled(
          Array.from({ length: n }, (_, i) => i + 1),
          7,
        ),
      ),
    ).toEqual(inOrder);
    // A redelivery of a decision it keeps changes nothing.
    expect(applyDecisionToAudit(inOrder, decisionOf(o, n, 'invalid_input'), n)).toBeNull();
  });
});

describe('every requester of a compensation on record', () => {
  it('given a later request answered with the replay, when projected, then the record lists who asked and its reason digest, counted as no refusal, and a redelivery changes nothing', () => {
    const o = committedOp;
    const base = inOrder.get(`${o.tenant}.${o.opId}`)!;
    const replay: AuditedDecision = {
      type: 'decision',
      outcome: 'replayed',
      at: 1_760_000_000_009,
      operationKey: o.operationKey,
      tenant: o.tenant,
      actor: '_op-olga',
      tool: 'kb.write_note',
      version: 2,
      requestedBy: { kind: 'operator', id: 'olga' },
      reasonDigest: `sha256:${'5'.repeat(64)}`,
    };
    const r = applyDecisionToAudit(base, replay, 9)!;
    expect(r.decisions.at(-1)).toEqual({
      seq: 9,
      at: 1_760_000_000_009,
      actor: '_op-olga',
      contract: 'kb.write_note@2',
      replayed: { requestedBy: { kind: 'operator', id: 'olga' }, reasonDigest: `sha256:${'5'.repeat(64)}` },
      conflict: false,
    });
    // The head (status, actor, outcome) stays the operation's own.
    expect({ ...r, decisions: base.decisions, decisionSeq: base.decisionSeq, lastAt: base.lastAt }).toEqual(base);
    expect(decode(auditRecordSchema, encode(r))).toEqual(r);
    expect(countsOf([r])).toEqual(countsOf([base]));
    expect(applyDecisionToAudit(r, replay, 9)).toBeNull();
    // As it is read from the decision stream: the replay record's own fields.
    expect(
      decode(auditedDecisionSchema, encode({ ...replay, schema: 1, eventId: 'evt-1', submissionId: 's' })),
    ).toEqual(replay);
  });
});

describe('audit of a held-back operation', () => {
  it('records who confirmed it, beside the actor of its attempt', () => {
    const first = sampleOperation('accepted', 7).events[0]!;
    let state = { ...(first.state as OperationRecord), confirmation: {} } as OperationRecord;
    const events: OperationEvent[] = [{ ...first, state }];
    const step = (cmd: OperationCommand) => {
      const d = decide(cmd, state);
      if (d.kind !== 'append') throw new Error(`expected append, got ${d.kind}`);
      events.push(d.event);
      state = d.event.state as OperationRecord;
    };
    step({
      type: 'await_confirmation',
      eventId: 'evt-held-0001',
      at: first.at + 1,
      attempt: 1,
      deadlineAt: first.at + 9,
    });
    step({ type: 'confirm', eventId: 'evt-held-0002', at: first.at + 2, by: { kind: 'actor', id: 'bob' } });
    let rec: AuditRecord | null = null;
    events.forEach((e, i) => {
      rec = applyEventToAudit(rec, e as unknown as AuditedEvent, i + 1, h) ?? rec;
    });
    expect(rec!.states.map((s) => [s.event, s.status, s.actor, s.by])).toEqual([
      ['accepted', 'accepted', first.state.actor, undefined],
      ['awaiting_confirmation', 'awaiting_confirmation', first.state.actor, undefined],
      ['confirmed', 'accepted', first.state.actor, { kind: 'actor', id: 'bob' }],
    ]);
    expect(auditRecordSchema.parse(rec)).toEqual(rec);
  });
});
