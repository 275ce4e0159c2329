/**
 * The projections on memory storage, end to end: the reconciler's index and the audit records are
 * kept in memory (no fsync per write; streams/src/topology.ts), so a nats-server restart loses them,
 * and their services rebuild them from the event log and the tenants' decision streams
 * (ProjectionGuard in @tooltx/runtime). One process of each projector on a real nats-server, fed
 * histories built with the decider (committed, rejected, unknown, still open) and refusal records;
 * then nats-server is killed (SIGKILL) and started again on the same store: the streams and the
 * durables come back, the two buckets do not.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { KV } from '@nats-io/kv';
import type { z } from 'zod';
import { operationIdOf } from '@tooltx/contracts';
import { auditAnswerSchema, decide, type OperationCommand, type OperationEvent } from '@tooltx/lifecycle';
import { decode, encode, jetStreamOf, openBucket } from '@tooltx/nats';
import { AuditService, REBUILDING_RETRY_MS } from '@tooltx/readside';
import { createLogger } from '@tooltx/runtime';
import { createBucket, Durables } from '@tooltx/streams';
import { applyToIndex, reconcileValueSchema, type ReconcileValue } from '../services/reconciler/src/reconcile-index.js';
import { auditRecordSchema } from '../services/audit-projector/src/audit-record.js';
import { auditHmacFrom, auditRule } from './helpers/audit.js';
import { fold, sampleOperations, type LogEntry, type SampleOperation } from './helpers/histories.js';
import { provisioned, type TestNats } from './helpers/nats.js';
import { startService, type ServiceProcess } from './helpers/services.js';
import { TEST_SIGNER } from './helpers/signing.js';

let t: TestNats;
let reconciler: ServiceProcess;
let auditor: ServiceProcess;
let reconcileKv: KV;
let auditKv: KV;
const log: LogEntry[] = [];

async function append(o: SampleOperation, event: OperationEvent, expectedSeq: number): Promise<number> {
  const seq = await t.store.append(o.tenant, o.opId, event, expectedSeq);
  log.push({ key: t.subjects.projectionKey(o.tenant, o.opId), event, seq });
  return seq;
}

async function appendAll(ops: SampleOperation[]): Promise<void> {
  for (const o of ops) {
    let seq = 0;
    for (const e of o.events) seq = await append(o, e, seq);
  }
}

/** A refusal at intake as the authorizer records it, on the tenant's decision stream. */
async function refusal(i: number): Promise<void> {
  const operationKey = `opk_refusal${'x'.repeat(20)}${String(i).padStart(16, '0')}`;
  await t.js.publish(
    t.subjects.decision('acme', operationIdOf(operationKey), 'alice'),
    encode({
      type: 'decision',
      at: 1_750_000_000_000 + i,
      operationKey,
      tenant: 'acme',
      actor: 'alice',
      tool: 'kb.write_note',
      version: 2,
      error: { class: 'forbidden' },
      authorization: { decision: 'deny', policyVersion: 'p1', at: 1_750_000_000_000 + i },
    }),
  );
}

/** Every value of a bucket, decoded (a deleted or purged key counts as absent). */
async function readBucket<S extends z.ZodType>(kv: KV, schema: S): Promise<Record<string, z.infer<S>>> {
  const out: Record<string, z.infer<S>> = {};
  for await (const key of await kv.keys()) {
    const e = await kv.get(key);
    if (e && e.operation === 'PUT') out[key] = decode(schema, e.value);
  }
  return out;
}

async function until<T>(read: () => Promise<T>, ok: (v: T) => boolean, what: string, timeoutMs = 15_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await read().catch((err: unknown) => err as T);
    if (!(v instanceof Error) && ok(v)) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}; last: ${String(v)}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** Until every durable of both projectors has delivered and settled everything. */
async function untilSettled(): Promise<void> {
  const durables: [string, string][] = [
    [t.subjects.eventsStream, Durables.reconciler],
    [t.subjects.eventsStream, Durables.auditProjector],
    [t.subjects.decisionsStream('acme'), Durables.auditDecisions],
  ];
  for (const [stream, durable] of durables)
    await until(
      () => t.jsm.consumers.info(stream, durable),
      (i) => i.num_pending === 0 && i.num_ack_pending === 0,
      `${stream}/${durable} settled`,
    );
}

/** Both buckets, once two reads 300 ms apart agree (the writers batch: a settled durable may still be writing). */
async function stableBuckets(): Promise<{ reconcile: Record<string, ReconcileValue>; audit: Record<string, unknown> }> {
  await untilSettled();
  const read = async () => ({
    reconcile: await readBucket(reconcileKv, reconcileValueSchema),
    audit: await readBucket(auditKv, auditRecordSchema),
  });
  let prev = await read();
  for (;;) {
    await new Promise((r) => setTimeout(r, 300));
    const next = await read();
    if (JSON.stringify(next) === JSON.stringify(prev)) return next;
    prev = next;
  }
}

/** Decides `cmd` on the operation's current state and appends it. */
async function transition(o: SampleOperation, make: (attempt: number, at: number) => OperationCommand): Promise<void> {
  const { state, seq } = await t.store.load(o.tenant, o.opId);
  if (state.status === 'none') throw new Error('operation not registered');
  const d = decide(make(state.attempt, state.updatedAt + 100), state, { signer: TEST_SIGNER });
  if (d.kind !== 'append') throw new Error(`expected append, got ${d.kind}`);
  await append(o, d.event, seq);
}

beforeAll(async () => {
  t = await provisioned();
  reconcileKv = await openBucket(t.nc, t.subjects.reconcileBucket);
  auditKv = await openBucket(t.nc, t.subjects.auditBucket);
  // The sweep off: it would act on these synthetic histories (recovery.e2e.test.ts tests it).
  [reconciler, auditor] = await Promise.all([
    startService('reconciler', { ...t.env, TOOLTX_RECONCILE_SWEEP: 'off' }),
    startService('audit-projector', { ...t.env, TOOLTX_AUDIT_BATCH_MS: '200' }),
  ]);
});

afterAll(async () => {
  const codes = await Promise.all([reconciler?.stop(), auditor?.stop()]);
  await t?.close();
  expect(codes).toEqual([0, 0]);
});

describe('projections on memory storage', () => {
  it('are rebuilt identical after the server restarts, and new operations still project', async () => {
    for (const b of [t.subjects.reconcileBucket, t.subjects.auditBucket])
      expect((await t.jsm.streams.info(`KV_${b}`)).config.storage).toBe('memory');
    const ops = [...sampleOperations(2, 'acme'), ...sampleOperations(1, 'globex', 100)];
    await appendAll(ops);
    for (let i = 0; i < 3; i++) await refusal(i);
    const before = await stableBuckets();
    // Committed, rejected, unknown and open operations in both; refusals in the audit records.
    expect(Object.values(before.reconcile).some((v) => !v.terminal && v.status === 'unknown')).toBe(true);
    expect(Object.keys(before.audit)).toHaveLength(ops.length + 3);

    await t.server.restart!('SIGKILL');
    for (const p of [reconciler, auditor]) {
      // The bucket was gone (not merely empty): the service created it again, then rebuilt it.
      const lost = await p.waitForLog('projection bucket lost: creating it and rebuilding it from the log');
      expect(lost.missing).toBe(true);
      const rebuilt = await p.waitForLog('projection rebuilt from the log');
      expect(rebuilt.messages).toBe(p === reconciler ? log.length : log.length + 3);
    }
    const after = await stableBuckets();
    expect(after.reconcile).toEqual(before.reconcile);
    expect(after.audit).toEqual(before.audit);

    // New operations project; an operation indexed before the restart and ending now is taken out
    // of the rebuilt index (the reconciler's watch of its bucket follows the new bucket).
    const running = ops.find((o) => o.kind === 'running' && o.tenant === 'acme')!;
    await transition(running, (attempt, at) => ({
      type: 'commit',
      eventId: `${running.opId.slice(0, 12)}-commit`,
      at,
      attempt,
      resourceId: 'note-after',
      resultDigest: `sha256:${'f'.repeat(64)}`,
    }));
    const fresh = sampleOperations(1, 'acme', 200);
    await appendAll(fresh);
    const index = fold(log, applyToIndex);
    const audit = fold(log, auditRule(auditHmacFrom(t.env.TOOLTX_AUDIT_HMAC_KEY_FILE!)));
    const now = await stableBuckets();
    const runningKey = t.subjects.projectionKey(running.tenant, running.opId);
    expect(now.reconcile[runningKey]).toEqual(index.get(runningKey));
    expect(now.audit[runningKey]).toEqual(audit.get(runningKey));
    for (const o of fresh) {
      const key = t.subjects.projectionKey(o.tenant, o.opId);
      expect(now.audit[key], o.kind).toEqual(audit.get(key));
      const v = index.get(key)!;
      if (!v.terminal) expect(now.reconcile[key], o.kind).toEqual(v);
    }
  });

  it('while the audit records are rebuilt, a query is answered "retry later" (dependency_unavailable with retryAfterMs), never from them', async () => {
    // Only this instance answers (the process's own audit service stopped): one whose bucket is being rebuilt.
    expect(await auditor.stop()).toBe(0);
    const nc = await t.connectAs({ kind: 'service', service: 'audit-projector' });
    const audrey = await t.connectAs({ kind: 'auditor', tenant: 'acme', actor: 'audrey' });
    let rebuilding = true;
    const service = new AuditService({
      nc,
      js: (await jetStreamOf(nc)).js,
      kv: await openBucket(nc, t.subjects.auditBucket),
      subjects: t.subjects,
      log: createLogger({ service: 'test', instance: 'test', level: 'silent' }),
      instance: 'test',
      rebuilding: () => rebuilding,
    });
    service.start();
    const ask = async () =>
      decode(
        auditAnswerSchema,
        (await audrey.request(t.subjects.audit('acme', 'audrey'), encode({ kind: 'counts' }), { timeout: 10_000 }))
          .data,
      );
    try {
      await nc.flush();
      expect(await ask()).toEqual({ error: { class: 'dependency_unavailable', retryAfterMs: REBUILDING_RETRY_MS } });
      rebuilding = false;
      expect(await ask()).toMatchObject({ kind: 'counts', records: expect.any(Number) });
    } finally {
      await service.stop();
      await audrey.close();
      await nc.close();
    }
  });
});

describe('a rebuild that died half way', () => {
  it('leaves a bucket without the marker of a finished rebuild: the next start rebuilds it, never trusting what it holds', async () => {
    const before = await stableBuckets();
    await reconciler.stop();
    // What a rebuild killed after its first write leaves: the bucket made again, one entry of many.
    await t.jsm.streams.delete(`KV_${t.subjects.reconcileBucket}`);
    reconcileKv = await createBucket(t.nc, t.topo.projections.reconcile);
    const [key, value] = Object.entries(before.reconcile).find(([, v]) => !v.terminal)!;
    await reconcileKv.put(key, encode(value));
    reconciler = await startService('reconciler', { ...t.env, TOOLTX_RECONCILE_SWEEP: 'off' });
    await reconciler.waitForLog('projection rebuilt from the log');
    // Every open operation is back in the index (a tombstone of an ended one is written only where
    // the times say it may have been indexed: mayHaveBeenIndexed).
    const open = (r: Record<string, ReconcileValue>) => Object.entries(r).filter(([, v]) => !v.terminal);
    expect(open((await stableBuckets()).reconcile)).toEqual(open(before.reconcile));
    expect(open(before.reconcile).length).toBeGreaterThan(1);
    // Finished, it is marked: the next start trusts it and reads nothing again.
    await reconciler.stop();
    reconciler = await startService('reconciler', { ...t.env, TOOLTX_RECONCILE_SWEEP: 'off' });
    await new Promise((r) => setTimeout(r, 1_000));
    expect(reconciler.lines.some((l) => String(l.msg).startsWith('projection bucket'))).toBe(false);
  });
});
