import { describe, expect, it } from 'vitest';
import type { OperationRecord } from '@tooltx/lifecycle';
import { decode, encode } from '@tooltx/nats';
import {
  fold,
  interleave,
  sampleOperation,
  sampleOperations,
  shuffled,
  type LogEntry,
} from '../../../test/helpers/histories.js';
import { applyToIndex, reconcileValueSchema, type ReconcileValue } from '../src/reconcile-index.js';

const ops = sampleOperations(2);
const log = interleave(ops);
const inOrder = fold(log, applyToIndex);
const byKind = (kind: string) => {
  const o = ops.find((x) => x.kind === kind)!;
  return inOrder.get(`${o.tenant}.${o.opId}`);
};
const seqOfLast = (kind: string) => {
  const o = ops.find((x) => x.kind === kind)!;
  return Math.max(...log.filter((e) => e.key === `${o.tenant}.${o.opId}`).map((e) => e.seq));
};

describe('reconciler projection: the index of non-terminal operations', () => {
  it('holds accepted, running and unknown operations with their timing; committed and rejected ones leave a tombstone', () => {
    expect(inOrder.size).toBe(ops.length);
    expect(byKind('accepted')).toMatchObject({
      terminal: false,
      status: 'accepted',
      attempt: 1,
      effect: 'update',
      tool: 'kb.write_note',
      version: 2,
    });
    expect(byKind('accepted')).not.toHaveProperty('runningAt');
    const running = byKind('running');
    expect(running).toMatchObject({ terminal: false, status: 'running', effect: 'charge' });
    expect(running).toHaveProperty('deadlineAt', (running as { runningAt: number }).runningAt + 5_000);
    expect(byKind('retried_unknown')).toMatchObject({
      terminal: false,
      status: 'unknown',
      attempt: 2,
      seq: seqOfLast('retried_unknown'),
    });
    expect(byKind('committed')).toEqual({ seq: seqOfLast('committed'), status: 'committed', terminal: true });
    expect(byKind('read_failed')).toEqual({ seq: seqOfLast('read_failed'), status: 'rejected', terminal: true });
    expect(byKind('refused')).toEqual({ seq: seqOfLast('refused'), status: 'rejected', terminal: true });
  });

  it('gives the same index for the log applied reversed, shuffled and with every event twice', () => {
    const orders: [string, LogEntry[]][] = [
      ['reversed', [...log].reverse()],
      ...[1, 2, 3, 42, 1337].map((seed): [string, LogEntry[]] => [`shuffled #${seed}`, shuffled(log, seed)]),
      ...[7, 99].map((seed): [string, LogEntry[]] => [`duplicated #${seed}`, shuffled([...log, ...log], seed)]),
      ['in order, twice', [...log, ...log]],
    ];
    for (const [name, entries] of orders) expect(fold(entries, applyToIndex), name).toEqual(inOrder);
  });

  it('does not bring a committed operation back when its older running event is redelivered after the commit', () => {
    const [accepted, running, committed] = sampleOperation('committed', 90).events as [never, never, never];
    const tomb = applyToIndex(applyToIndex(applyToIndex(null, accepted, 10), running, 11), committed, 12);
    expect(tomb).toEqual({ seq: 12, status: 'committed', terminal: true });
    expect(applyToIndex(tomb, running, 11)).toBeNull();
    expect(applyToIndex(tomb, accepted, 10)).toBeNull();
    expect(applyToIndex(tomb, committed, 12)).toBeNull();
  });

  it('puts a rejected operation back in the index when a new attempt is accepted after it', () => {
    const events = sampleOperation('retried_unknown', 91).events;
    const rejected = applyToIndex(applyToIndex(null, events[0]!, 1), events[1]!, 2);
    expect(rejected).toEqual({ seq: 2, status: 'rejected', terminal: true });
    expect(applyToIndex(rejected, events[2]!, 3)).toMatchObject({ terminal: false, status: 'accepted', attempt: 2 });
  });

  it('answers no change for an event that is not newer than the entry', () => {
    const [accepted] = sampleOperation('running', 92).events;
    const e = applyToIndex(null, accepted!, 5)!;
    expect(applyToIndex(e, accepted!, 5)).toBeNull();
    expect(applyToIndex(e, accepted!, 4)).toBeNull();
    expect(applyToIndex(e, accepted!, 6)).toMatchObject({ seq: 6 });
  });

  it('stores values that survive msgpack and the schema unchanged', () => {
    for (const v of inOrder.values())
      expect(decode(reconcileValueSchema, encode(v))).toEqual(v satisfies ReconcileValue);
  });
});

describe('reconciler projection: a held-back operation', () => {
  it('stays indexed while it awaits its confirmation, with its deadline, and leaves a tombstone once rolled back', () => {
    const first = sampleOperation('accepted', 0).events[0]!;
    const state = first.state as OperationRecord;
    const held = {
      ...state,
      status: 'awaiting_confirmation' as const,
      confirmation: { heldAt: 2_000, deadlineAt: 9_000 },
    };
    expect(applyToIndex(null, { ...first, state: held }, 7)).toMatchObject({
      terminal: false,
      status: 'awaiting_confirmation',
      confirmDeadlineAt: 9_000,
      seq: 7,
    });
    const rolledBack = { ...held, status: 'rolled_back' as const };
    expect(applyToIndex(null, { ...first, state: rolledBack }, 8)).toEqual({
      seq: 8,
      status: 'rolled_back',
      terminal: true,
    });
  });
});

describe('reconciler projection: a failed compensation (FM-20)', () => {
  it('stays indexed under its takeover until a person resolves it, then leaves a tombstone, so the takeover service lists it while it is open', () => {
    const first = sampleOperation('accepted', 0).events[0]!;
    const state = first.state as OperationRecord;
    const takeover = {
      operationKey: state.operationKey,
      tenant: state.tenant,
      taskId: state.taskId,
      tool: state.tool,
      version: state.version,
      targetDigest: state.targetDigest,
      inputDigest: state.inputDigest,
      reason: 'compensation_failed' as const,
      attempts: { attempt: 1, requeues: 0, probes: 0 },
      times: { acceptedAt: state.acceptedAt, openedAt: 12_000 },
    };
    const failed = { ...state, status: 'compensation_failed' as const, takeover };
    const open = applyToIndex(null, { ...first, state: failed }, 7);
    expect(open).toMatchObject({ terminal: false, status: 'compensation_failed', takeoverAt: 12_000, seq: 7 });
    expect(decode(reconcileValueSchema, encode(open))).toEqual(open);
    const resolved = { ...failed, resolution: { by: 'oscar', at: 13_000, outcome: 'effect_kept' as const } };
    expect(applyToIndex(open, { ...first, state: resolved }, 8)).toEqual({
      seq: 8,
      status: 'compensation_failed',
      terminal: true,
    });
    // Written before the record existed: nothing to list, a tombstone as before.
    const { takeover: _none, ...legacy } = failed;
    expect(applyToIndex(null, { ...first, state: legacy }, 9)).toEqual({
      seq: 9,
      status: 'compensation_failed',
      terminal: true,
    });
  });
});

describe('reconciler projection: an original waiting for its compensation', () => {
  it('is indexed while compensation_requested (the sweep settles it should its link be lost), never as a takeover, and leaves a tombstone once linked', () => {
    const first = sampleOperation('accepted', 0).events[0]!;
    const state = first.state as OperationRecord;
    const link = {
      operationKey: state.operationKey,
      tool: 'kb.delete_note',
      version: 1,
      attempt: 1,
      requestedBy: { kind: 'actor' as const, id: 'alice' },
      reasonDigest: state.inputDigest,
      requestedAt: 11_000,
    };
    // An earlier takeover of its own attempt (resolved committed) is not listed again.
    const takeover = {
      operationKey: state.operationKey,
      tenant: state.tenant,
      taskId: state.taskId,
      tool: state.tool,
      version: state.version,
      targetDigest: state.targetDigest,
      inputDigest: state.inputDigest,
      reason: 'unknown_past_deadline' as const,
      attempts: { attempt: 1, requeues: 0, probes: 3 },
      times: { acceptedAt: state.acceptedAt, openedAt: 5_000 },
    };
    const waiting = { ...state, status: 'compensation_requested' as const, compensation: link, takeover };
    const open = applyToIndex(null, { ...first, state: waiting }, 7);
    expect(open).toMatchObject({ terminal: false, status: 'compensation_requested', seq: 7 });
    expect(open).not.toHaveProperty('takeoverAt');
    expect(decode(reconcileValueSchema, encode(open))).toEqual(open);
    const compensated = { ...waiting, status: 'compensated' as const };
    expect(applyToIndex(open, { ...first, state: compensated }, 8)).toEqual({
      seq: 8,
      status: 'compensated',
      terminal: true,
    });
  });
});
