import { describe, expect, it } from 'vitest';
import { decode, encode } from '@tooltx/nats';
import { fold, interleave, PLANTED_ERROR_TEXT, sampleOperation, sampleOperations, shuffled, type LogEntry } from '../../../test/helpers/histories.js';
import { applyToAudit, auditRecordSchema } from '../src/projection.js';

const ops = sampleOperations(2);
const log = interleave(ops);
const inOrder = fold(log, applyToAudit);
const recordOf = (kind: string) => {
  const o = ops.find((x) => x.kind === kind)!;
  return inOrder.get(`${o.tenant}.${o.opId}`)!;
};

describe('audit projection: one record per operation', () => {
  it('records who, which contract and target, every state with its time, the final state and its digests', () => {
    const o = ops.find((x) => x.kind === 'committed')!;
    const r = recordOf('committed');
    const seqs = log.filter((e) => e.key === `${o.tenant}.${o.opId}`).map((e) => e.seq);
    expect(r).toEqual({
      seq: seqs[2],
      operationKey: o.operationKey,
      tenant: 'acme',
      actor: 'alice',
      tool: 'kb.write_note',
      contract: 'kb.write_note@2',
      contractDigest: o.events[0]!.state.contractDigest,
      effect: 'create',
      targetDigest: o.events[0]!.state.targetDigest,
      attempt: 1,
      status: 'committed',
      states: o.events.map((e, i) => ({ seq: seqs[i], status: e.type, at: e.at, attempt: 1 })),
      resultDigest: o.events[2]!.state.receipt!.resultDigest,
      sideEffect: true,
    });
  });

  it('keeps both attempts of a retried operation; the head follows the newest event', () => {
    const r = recordOf('retried_unknown');
    expect(r.states.map((s) => [s.status, s.attempt])).toEqual([['accepted', 1], ['rejected', 1], ['accepted', 2], ['running', 2], ['unknown', 2]]);
    expect(r).toMatchObject({ status: 'unknown', attempt: 2, actor: 'bob', sideEffect: true });
    expect(r).not.toHaveProperty('errorClass');
  });

  it('marks a side effect only for side-effecting contracts that reached running', () => {
    expect(recordOf('read_failed')).toMatchObject({ status: 'rejected', errorClass: 'dependency_unavailable', sideEffect: false });
    expect(recordOf('refused')).toMatchObject({ status: 'rejected', errorClass: 'invalid_input', sideEffect: false });
    expect(recordOf('accepted').sideEffect).toBe(false);
    expect(recordOf('running').sideEffect).toBe(true);
  });

  it('gives the same records for the log applied reversed, shuffled and with every event twice', () => {
    const orders: [string, LogEntry[]][] = [
      ['reversed', [...log].reverse()],
      ...[1, 2, 3, 42, 1337].map((seed): [string, LogEntry[]] => [`shuffled #${seed}`, shuffled(log, seed)]),
      ...[7, 99].map((seed): [string, LogEntry[]] => [`duplicated #${seed}`, shuffled([...log, ...log], seed)]),
      ['in order, twice', [...log, ...log]],
    ];
    for (const [name, entries] of orders) expect(fold(entries, applyToAudit), name).toEqual(inOrder);
  });

  it('sees the side effect of a running event that arrives after the commit skipped it', () => {
    const [accepted, running, committed] = sampleOperation('committed', 90).events as [never, never, never];
    const head = applyToAudit(applyToAudit(null, accepted, 1), committed, 3)!;
    expect(head.sideEffect).toBe(true); // the committed state carries the running marker
    const full = applyToAudit(head, running, 2)!;
    expect(full.states.map((s) => s.status)).toEqual(['accepted', 'running', 'committed']);
    expect(full.status).toBe('committed');
    expect(applyToAudit(full, running, 2)).toBeNull();
  });

  it('never carries an input, a body or raw error text', () => {
    for (const r of inOrder.values()) {
      const bytes = Buffer.from(encode(r)).toString('latin1');
      expect(bytes).not.toContain(PLANTED_ERROR_TEXT);
      expect(Object.keys(r).sort()).toEqual(
        expect.arrayContaining(['actor', 'attempt', 'contract', 'contractDigest', 'effect', 'operationKey', 'seq', 'sideEffect', 'states', 'status', 'targetDigest', 'tenant', 'tool']),
      );
      expect(Object.keys(r).filter((k) => !auditRecordSchema.shape[k as keyof typeof auditRecordSchema.shape])).toEqual([]);
    }
  });

  it('stores records that survive msgpack and the schema unchanged', () => {
    for (const r of inOrder.values()) expect(decode(auditRecordSchema, encode(r))).toEqual(r);
  });
});
