/**
 * How often the projections write, end to end: the reconciler's index writer
 * (services/reconciler/src/index-writer.ts) holds an accepted or running event for
 * TOOLTX_RECONCILE_INDEX_DELAY_MS before its operation is indexed, so an operation that ends sooner
 * costs the index nothing; the audit-projector (ProjectionBatcher) writes an operation's in-flight
 * events with its final one, one record write per operation. One process of each (the reconciler's
 * sweep on) on a real nats-server, fed events built with the decider and appended with the event
 * store's expected-sequence appends.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { KV } from '@nats-io/kv';
import { decide, type OperationCommand } from '@tooltx/lifecycle';
import { decode, encode, openBucket } from '@tooltx/nats';
import { Durables } from '@tooltx/streams';
import {
  applyToIndex,
  reconcileValueSchema,
  type IndexEntry,
  type ReconcileValue,
} from '../services/reconciler/src/reconcile-index.js';
import { auditRecordSchema } from '../services/audit-projector/src/audit-record.js';
import { fold, sampleOperation, type LogEntry, type SampleOperation } from './helpers/histories.js';
import { provisioned, type TestNats } from './helpers/nats.js';
import { startService, type ServiceProcess } from './helpers/services.js';
import { TEST_SIGNER } from './helpers/signing.js';

let t: TestNats;
let kv: KV;
let reconciler: ServiceProcess;
let auditor: ServiceProcess;
let auditKv: KV;
// Sample histories advance 100 ms per event: a 3-event operation ends 200 ms after acceptance, under half of this.
const DELAY_MS = 1_000;

async function appendAll(o: SampleOperation): Promise<LogEntry[]> {
  const out: LogEntry[] = [];
  let seq = 0;
  for (const e of o.events) {
    seq = await t.store.append(o.tenant, o.opId, e, seq);
    out.push({ key: t.subjects.projectionKey(o.tenant, o.opId), event: e, seq });
  }
  return out;
}

async function entry(key: string): Promise<ReconcileValue | null> {
  const e = await kv.get(key);
  return e && e.operation === 'PUT' ? decode(reconcileValueSchema, e.value) : null;
}

// Writes ever made to a bucket (its stream keeps one message per key: the last sequence counts them all).
const writes = async (bucket = t.subjects.reconcileBucket) => {
  const last = (await t.jsm.streams.info(`KV_${bucket}`)).state.last_seq;
  // The marker a projector writes once its bucket is known whole (ProjectionGuard) is no projection write.
  const marker = await (await openBucket(t.nc, bucket)).get('_rebuilt');
  return last - (marker ? 1 : 0);
};

/** Until both projectors' durables have delivered and settled everything (held messages count as unacknowledged). */
async function untilSettled(timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (const durable of [Durables.reconciler, Durables.auditProjector]) {
    for (;;) {
      const info = await t.jsm.consumers.info(t.subjects.eventsStream, durable);
      if (info.num_pending === 0 && info.num_ack_pending === 0) break;
      if (Date.now() > deadline)
        throw new Error(`${durable}: ${info.num_pending} pending, ${info.num_ack_pending} unacknowledged`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }
}

async function auditStates(key: string): Promise<string[]> {
  const e = await auditKv.get(key);
  return e && e.operation === 'PUT' ? decode(auditRecordSchema, e.value).states.map((s) => s.event) : [];
}

async function until<T>(read: () => Promise<T>, ok: (v: T) => boolean, what: string, timeoutMs = 15_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await read();
    if (ok(v)) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}; last: ${JSON.stringify(v)}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

beforeAll(async () => {
  t = await provisioned();
  kv = await openBucket(t.nc, t.subjects.reconcileBucket);
  auditKv = await openBucket(t.nc, t.subjects.auditBucket);
  [reconciler, auditor] = await Promise.all([
    startService('reconciler', {
      ...t.env,
      TOOLTX_RECONCILE_INDEX_DELAY_MS: String(DELAY_MS),
      TOOLTX_RECONCILE_INTERVAL_MS: '200',
    }),
    startService('audit-projector', { ...t.env, TOOLTX_AUDIT_BATCH_MS: String(DELAY_MS) }),
  ]);
});

afterAll(async () => {
  const codes = await Promise.all([reconciler?.stop(), auditor?.stop()]);
  await t?.close();
  expect(codes).toEqual([0, 0]);
});

describe('projection writes', () => {
  it('an operation that ends within the hold is never written; one that stays open is indexed from its last state, then tombstoned when it ends', async () => {
    const fast = sampleOperation('committed', 1);
    const slow = sampleOperation('running', 2);
    await appendAll(fast);
    const slowLog = await appendAll(slow);
    await untilSettled();

    expect(await entry(t.subjects.projectionKey(fast.tenant, fast.opId))).toBeNull();
    const slowKey = t.subjects.projectionKey(slow.tenant, slow.opId);
    // Indexed once, from the operation's last state (running), not once per event.
    expect(await entry(slowKey)).toEqual(fold(slowLog, applyToIndex).get(slowKey));
    expect(await writes()).toBe(1);
    // The audit: one record write per operation, every state in it (the slow one's at its hold's end).
    expect(await auditStates(t.subjects.projectionKey(fast.tenant, fast.opId))).toEqual([
      'accepted',
      'running',
      'committed',
    ]);
    expect(await auditStates(slowKey)).toEqual(['accepted', 'running']);
    expect(await writes(t.subjects.auditBucket)).toBe(2);

    // The slow operation ends: its known entry becomes a tombstone.
    const { state, seq } = await t.store.load(slow.tenant, slow.opId);
    if (state.status !== 'running') throw new Error(`expected running, got ${state.status}`);
    const cmd: OperationCommand = {
      type: 'commit',
      eventId: 'evt-slow-commit',
      at: state.updatedAt + 100,
      attempt: state.attempt,
      resourceId: 'note-slow',
      resultDigest: `sha256:${'e'.repeat(64)}`,
    };
    const d = decide(cmd, state, { signer: TEST_SIGNER });
    if (d.kind !== 'append') throw new Error(`expected append, got ${d.kind}`);
    const committedSeq = await t.store.append(slow.tenant, slow.opId, d.event, seq);
    await until(
      () => entry(slowKey),
      (v) => v?.terminal === true,
      'the slow operation is tombstoned',
    );
    expect(await entry(slowKey)).toEqual({ seq: committedSeq, status: 'committed', terminal: true });
    await until(
      () => auditStates(slowKey),
      (v) => v.length === 3,
      'the audit records the commit',
    );
    expect(await writes(t.subjects.auditBucket)).toBe(3);
    expect(reconciler.lines.filter((l) => typeof l.level === 'number' && l.level >= 50)).toEqual([]);
  });

  it('an open entry left for an operation that has ended is closed by the sweep when it is due', async () => {
    const op = sampleOperation('committed', 3);
    const opLog = await appendAll(op);
    await untilSettled();
    const key = t.subjects.projectionKey(op.tenant, op.opId);
    expect(await entry(key)).toBeNull();
    // What a lost race leaves (another instance indexed the operation as running while this one
    // applied its terminal event without knowing the entry): an open entry, due long ago.
    const s = opLog[0]!.event.state;
    const stale: IndexEntry = {
      seq: opLog[0]!.seq,
      terminal: false,
      operationKey: op.operationKey,
      tenant: op.tenant,
      status: 'running',
      attempt: 1,
      tool: 'sink.write',
      version: 1,
      effect: 'create',
      acceptedAt: s.acceptedAt,
      runningAt: s.acceptedAt,
      deadlineAt: s.acceptedAt + 1_000,
      updatedAt: s.acceptedAt,
    };
    await kv.put(key, encode(stale));
    const last = opLog.at(-1)!.seq;
    await until(
      () => entry(key),
      (v) => v?.terminal === true,
      'the sweep closes the stale entry',
    );
    expect(await entry(key)).toEqual({ seq: last, status: 'committed', terminal: true });
    // The sweep closed it (its log line follows its write: read from the process's output, it may come a moment after the entry).
    expect(await reconciler.waitForLog('stale index entry of an ended operation closed', 5_000)).toMatchObject({
      status: 'committed',
    });
  });
});
