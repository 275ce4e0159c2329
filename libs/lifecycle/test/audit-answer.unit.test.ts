import { describe, expect, it } from 'vitest';
import { auditRecordForAuditor, type AuditRecord } from '../src/audit.js';

const state = (seq: number, event: string) => ({ seq, event, status: event, at: 1_000, attempt: 1, actor: 'alice' });
const record = (seqs: number[]): AuditRecord => ({
  operationKey: `opk_${'a'.repeat(43)}`,
  tenant: 'acme',
  seq: seqs.at(-1)!,
  decisionSeq: 0,
  actor: 'alice',
  status: 'committed',
  sideEffect: 'applied',
  states: [state(seqs[0]!, 'accepted'), state(seqs[1]!, 'running'), state(seqs[2]!, 'committed')],
  decisions: [],
  firstAt: 1_000,
  lastAt: 2_000,
});

describe('an audit record as an auditor receives it (docs/tenancy.md)', () => {
  it("given the same operation logged among few or many other tenants' events, when answered, then the auditor reads the same positions", () => {
    const quiet = auditRecordForAuditor(record([10, 11, 12]));
    const busy = auditRecordForAuditor(record([10, 517, 9_204]));
    expect(busy).toEqual(quiet);
    expect(busy.seq).toBe(3);
    expect(busy.states.map((s) => s.seq)).toEqual([1, 2, 3]);
  });

  it('given states out of log order, when answered, then they are numbered in log order', () => {
    const r = record([30, 20, 40]);
    expect(auditRecordForAuditor(r).states.map((s) => [s.event, s.seq])).toEqual([
      ['running', 1],
      ['accepted', 2],
      ['committed', 3],
    ]);
  });
});
