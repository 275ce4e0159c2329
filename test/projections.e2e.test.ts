/**
 * The reconciler's and the audit-projector's projections end to end: two instances of
 * each as OS processes on a real nats-server, fed a log of real events (built with the decider,
 * appended with the event store's expected-sequence appends), then fed the whole log a second time
 * — every event arriving after a newer one of its operation was applied — then new events. The KV
 * projections must equal the in-order fold of the log at every checkpoint, and the second feed
 * must write nothing at all.
 */
import { TEST_SIGNER } from './helpers/signing.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { KV } from '@nats-io/kv';
import type { z } from 'zod';
import { decide, type OperationCommand, type OperationEvent } from '@tooltx/lifecycle';
import { decode, openBucket } from '@tooltx/nats';
import { applyTopology, Durables } from '@tooltx/streams';
import { applyToIndex, reconcileValueSchema, type ReconcileValue } from '../services/reconciler/src/reconcile-index.js';
import { auditRecordSchema, type AuditHmac } from '../services/audit-projector/src/audit-record.js';
import { auditHmacFrom, auditRule } from './helpers/audit.js';
import {
  fold,
  PLANTED_ERROR_TEXT,
  sampleOperations,
  type LogEntry,
  type SampleOperation,
} from './helpers/histories.js';
import { provisioned, type TestNats } from './helpers/nats.js';
import { startService, type ServiceName, type ServiceProcess } from './helpers/services.js';

let t: TestNats;
let env: Record<string, string>;
let procs: ServiceProcess[] = [];
const log: LogEntry[] = [];
let ops: SampleOperation[] = [];

const PROJECTORS: ServiceName[] = ['reconciler', 'reconciler', 'audit-projector', 'audit-projector'];
const startProjectors = () => Promise.all(PROJECTORS.map((n) => startService(n, env)));
const of = (name: ServiceName) => procs.filter((p) => p.name === name);
const countLogs = (ps: ServiceProcess[], msg: string) =>
  ps.reduce((n, p) => n + p.lines.filter((l) => l.msg === msg).length, 0);

/** Appends every history round-robin (so one operation's events are spread over the log), recording stream sequences. */
async function appendInterleaved(histories: SampleOperation[]): Promise<void> {
  const lastSeq = new Map<string, number>();
  const longest = Math.max(...histories.map((o) => o.events.length));
  for (let step = 0; step < longest; step++) {
    for (const o of histories) {
      const e = o.events[step];
      if (e) await append(o, e, lastSeq.get(o.opId) ?? 0).then((seq) => lastSeq.set(o.opId, seq));
    }
  }
}

async function append(o: SampleOperation, event: OperationEvent, expectedSeq: number): Promise<number> {
  const seq = await t.store.append(o.tenant, o.opId, event, expectedSeq);
  log.push({ key: t.subjects.projectionKey(o.tenant, o.opId), event, seq });
  return seq;
}

/** Decides `cmd` on the operation's current state and appends it (the way a service would). */
async function transition(o: SampleOperation, make: (attempt: number, at: number) => OperationCommand): Promise<void> {
  const { state, seq } = await t.store.load(o.tenant, o.opId);
  if (state.status === 'none') throw new Error('operation not registered');
  const d = decide(make(state.attempt, state.updatedAt + 100), state, { signer: TEST_SIGNER });
  if (d.kind !== 'append') throw new Error(`expected append, got ${d.kind}`);
  await append(o, d.event, seq);
}

async function readBucket<S extends z.ZodType>(kv: KV, schema: S): Promise<Map<string, z.infer<S>>> {
  const out = new Map<string, z.infer<S>>();
  for await (const key of await kv.keys()) {
    const e = await kv.get(key);
    if (e && e.operation === 'PUT') out.set(key, decode(schema, e.value));
  }
  return out;
}

/** Polls the bucket until it equals `expected`; on timeout, fails with the difference. */
async function untilBucketEquals<S extends z.ZodType>(
  kv: KV,
  schema: S,
  expected: Map<string, z.infer<S>>,
  timeoutMs = 20_000,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const got = await readBucket(kv, schema);
    const same =
      got.size === expected.size && [...expected].every(([k, v]) => JSON.stringify(got.get(k)) === JSON.stringify(v));
    if (same || Date.now() > deadline) {
      expect(Object.fromEntries(got)).toEqual(Object.fromEntries(expected));
      return;
    }
    await new Promise((r) => setTimeout(r, 100));
  }
}

/**
 * The reconciler's index against the in-order fold: every operation the fold leaves open has
 * exactly the fold's entry; one the fold ends has no entry or the fold's tombstone (an operation
 * that ended before its hold was up is never written: services/reconciler/src/index-writer.ts);
 * nothing else is in the bucket. Polls until so; on timeout, fails with the difference.
 */
async function untilIndexMatches(expected: Map<string, ReconcileValue>, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const got = await readBucket(reconcileKv, reconcileValueSchema);
    const want = new Map([...expected].filter(([k, v]) => !v.terminal || got.has(k)));
    const same =
      got.size === want.size && [...want].every(([k, v]) => JSON.stringify(got.get(k)) === JSON.stringify(v));
    if (same || Date.now() > deadline) {
      expect(Object.fromEntries(got)).toEqual(Object.fromEntries(want));
      return;
    }
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** Waits until a durable has nothing pending and nothing unacknowledged. */
async function untilDrained(durable: string, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const info = await t.jsm.consumers.info(t.subjects.eventsStream, durable);
    if (info.num_pending === 0 && info.num_ack_pending === 0) return;
    if (Date.now() > deadline)
      throw new Error(`${durable}: ${info.num_pending} pending, ${info.num_ack_pending} unacknowledged`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function until(done: () => boolean, what: string, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!done()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

const lastSeqOf = async (bucket: string) => (await t.jsm.streams.info(`KV_${bucket}`)).state.last_seq;

let reconcileKv: KV;
let auditKv: KV;
let applyToAudit: ReturnType<typeof auditRule>;
let hmac: AuditHmac;

beforeAll(async () => {
  t = await provisioned();
  // Projection only: the recovery sweep would act on these synthetic histories (it is tested in
  // recovery.e2e.test.ts).
  env = { ...t.env, TOOLTX_RECONCILE_SWEEP: 'off' };
  reconcileKv = await openBucket(t.nc, t.subjects.reconcileBucket);
  auditKv = await openBucket(t.nc, t.subjects.auditBucket);
  hmac = auditHmacFrom(t.env.TOOLTX_AUDIT_HMAC_KEY_FILE!);
  applyToAudit = auditRule(hmac);
  // 30 operations of every kind in two tenants, ~80 events, all in the log before any projector
  // starts: two instances × 16 in flight take one operation's events in parallel, in any order.
  ops = [...sampleOperations(3, 'acme'), ...sampleOperations(2, 'globex', 100)];
  await appendInterleaved(ops);
  procs = await startProjectors();
});

afterAll(async () => {
  const codes = await Promise.all(procs.map((p) => p.stop()));
  await t?.close();
  expect(codes).toEqual(PROJECTORS.map(() => 0));
});

describe('projections of the event log (two instances of each projector)', () => {
  it('reconciler: the index holds exactly the non-terminal operations; terminal ones are tombstones or absent', async () => {
    const expected = fold(log, applyToIndex);
    await untilIndexMatches(expected);
    const live = [...expected]
      .filter(([, v]) => !v.terminal)
      .map(([k]) => k)
      .sort();
    const watched = ops
      .filter((o) => ['accepted', 'running', 'retried_unknown'].includes(o.kind))
      .map((o) => t.subjects.projectionKey(o.tenant, o.opId))
      .sort();
    expect(live).toEqual(watched);
  });

  it('audit-projector: one record per operation with every state in stream order, and no error text', async () => {
    const expected = fold(log, applyToAudit);
    await untilBucketEquals(auditKv, auditRecordSchema, expected);
    for (const o of ops) {
      const r = expected.get(t.subjects.projectionKey(o.tenant, o.opId))!;
      expect(r.states.map((s) => s.event)).toEqual(o.events.map((e) => e.type));
      // The target is a keyed HMAC, never the plain digest of the (guessable) target.
      expect(r.targetHmac).toBe(hmac('target', o.events[0]!.state.targetDigest));
      expect(JSON.stringify(r)).not.toContain(o.events[0]!.state.targetDigest);
    }
    for await (const key of await auditKv.keys()) {
      expect(Buffer.from((await auditKv.get(key))!.value).toString('latin1')).not.toContain(PLANTED_ERROR_TEXT);
    }
  });

  it('the whole log fed a second time, every event older than its entry, writes nothing; new events still move entries forward', async () => {
    await untilIndexMatches(fold(log, applyToIndex));
    await untilBucketEquals(auditKv, auditRecordSchema, fold(log, applyToAudit));
    const indexBefore = await readBucket(reconcileKv, reconcileValueSchema);
    const before = {
      reconcile: await lastSeqOf(t.subjects.reconcileBucket),
      audit: await lastSeqOf(t.subjects.auditBucket),
    };

    // Both instances of both services stop cleanly on SIGTERM.
    expect(await Promise.all(procs.map((p) => p.stop()))).toEqual(PROJECTORS.map(() => 0));
    // Recreate the durables (as an operator rebuilding a projection would): they deliver from sequence 1.
    for (const d of [Durables.reconciler, Durables.auditProjector])
      await t.jsm.consumers.delete(t.subjects.eventsStream, d);
    await applyTopology(t.nc, t.jsm, t.topo);
    procs = await startProjectors();
    await Promise.all([untilDrained(Durables.reconciler), untilDrained(Durables.auditProjector)]);

    expect({
      reconcile: await lastSeqOf(t.subjects.reconcileBucket),
      audit: await lastSeqOf(t.subjects.auditBucket),
    }).toEqual(before);
    for (const name of ['reconciler', 'audit-projector'] as const) {
      // Each instance logs every apply before its ack; the lines reach us through a pipe, a little later.
      await until(
        () => countLogs(of(name), 'projection unchanged') >= log.length,
        `${name} logged every event as unchanged`,
      );
      expect(countLogs(of(name), 'projected'), name).toBe(0);
    }
    expect(await readBucket(reconcileKv, reconcileValueSchema)).toEqual(indexBefore);
    expect(await readBucket(auditKv, auditRecordSchema)).toEqual(fold(log, applyToAudit));

    // New events after the replay: accepted ones run and commit, running ones commit.
    for (const o of ops.filter((x) => x.kind === 'accepted')) {
      await transition(o, (attempt, at) => ({
        type: 'start',
        eventId: `${o.opId.slice(0, 12)}-start`,
        at,
        attempt,
        executor: 'ex-9',
        deadlineAt: at + 5_000,
      }));
    }
    for (const o of ops.filter((x) => x.kind === 'accepted' || x.kind === 'running')) {
      await transition(o, (attempt, at) => ({
        type: 'commit',
        eventId: `${o.opId.slice(0, 12)}-commit`,
        at,
        attempt,
        resourceId: `note-${o.opId.slice(0, 6)}`,
        resultDigest: `sha256:${'f'.repeat(64)}`,
      }));
    }
    const index = fold(log, applyToIndex);
    await untilIndexMatches(index);
    await untilBucketEquals(auditKv, auditRecordSchema, fold(log, applyToAudit));
    expect([...index.values()].filter((v) => !v.terminal).map((v) => v.status)).toEqual(
      ops.filter((o) => o.kind === 'retried_unknown').map(() => 'unknown'),
    );
  });
});
