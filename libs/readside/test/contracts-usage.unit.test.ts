/**
 * Usage per contract version from audit records (docs/contracts.md "Usage"), as given/when/then:
 * tasks and actors counted once per tenant, refused calls counted as actors and rejections,
 * conflicts from the decisions, unknowns from the states, and the ratio.
 */
import { describe, expect, it } from 'vitest';
import type { AuditRecord } from '@tooltx/lifecycle';
import { usageOf } from '../src/contracts-service.js';

let n = 0;
const record = (over: Partial<AuditRecord>): AuditRecord => ({
  operationKey: `opk_${String(n++).padStart(43, 'a')}`,
  tenant: 'acme',
  seq: 1,
  decisionSeq: 0,
  actor: 'alice',
  status: 'committed',
  contract: 'sink.write@1',
  sideEffect: 'applied',
  states: [{ seq: 1, event: 'accepted', status: 'accepted', at: 1, attempt: 1, actor: 'alice' }],
  decisions: [],
  firstAt: 1,
  lastAt: 2,
  ...over,
});

describe('usage per version', () => {
  it('given two tasks of alice and one of bob on @1, and one of alice in another tenant, then @1 has 4 operations, 3 tasks and 3 actors', () => {
    const u = usageOf([
      record({ taskId: 't1' }),
      record({ taskId: 't1' }),
      record({ taskId: 't2', actor: 'bob' }),
      record({ taskId: 't1', tenant: 'globex' }),
    ]);
    expect(u.get('sink.write@1')).toEqual({
      operations: 4,
      tasks: 3,
      actors: 3,
      conflicts: 0,
      rejected: 0,
      unknown: 0,
      failed: 0,
      ratio: 0,
    });
    expect(u.byTenant.get('sink.write@1')).toEqual(
      new Map([
        ['acme', { operations: 3, conflicts: 0, rejected: 0, unknown: 0, failed: 0 }],
        ['globex', { operations: 1, conflicts: 0, rejected: 0, unknown: 0, failed: 0 }],
      ]),
    );
  });

  it('given a rejection, a refusal at intake by another actor, a conflict and an unknown, then each is counted and the ratio is the share of calls that went wrong (never above 1)', () => {
    const u = usageOf([
      record({ taskId: 't1', status: 'rejected' }),
      record({ status: 'refused', actor: 'mallory', states: [] }),
      record({
        taskId: 't2',
        decisions: [
          { seq: 5, at: 3, actor: 'bob', contract: 'sink.write@1', errorClass: 'idempotency_conflict', conflict: true },
        ],
      }),
      record({
        taskId: 't3',
        status: 'unknown',
        states: [{ seq: 2, event: 'unknown', status: 'unknown', at: 2, attempt: 1, actor: 'alice' }],
      }),
    ]);
    expect(u.get('sink.write@1')).toEqual({
      operations: 4,
      tasks: 3,
      actors: 3,
      conflicts: 1,
      rejected: 2,
      unknown: 1,
      failed: 3,
      // 4 operations and 1 conflicting request are 5 calls; 3 failed operations and the conflict went wrong.
      ratio: 0.8,
    });
  });
});
