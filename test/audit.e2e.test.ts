/**
 * The audit projection and the auditors' query service end to end: a real nats-server
 * with auth on, the authorizer, executor and two audit-projector instances as processes, a workload
 * with commits, an idempotency conflict, a refusal at intake and an unknown; auditors use
 * `tooltx audit` as their own identity. Every refusal is the server's (permission violations).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { NatsConnection } from '@nats-io/transport-node';
import { Kvm, type KV } from '@nats-io/kv';
import { operationIdOf, prepareCall } from '@tooltx/contracts';
import { createTools, type ExecuteResult, type Tools } from '@tooltx/client';
import {
  auditAnswerSchema,
  auditRecordForAuditor,
  auditQueryRecordSchema,
  auditRecordSchema,
  type AuditRecord,
} from '@tooltx/lifecycle';
import { decode, encode, openBucket } from '@tooltx/nats';
import { applyTopology, Durables } from '@tooltx/streams';
import {
  applyDecisionToAudit,
  applyEventToAudit,
  auditedDecisionSchema,
  auditedEventSchema,
  type AuditHmac,
} from '../services/audit-projector/src/audit-record.js';
import { auditCli } from './helpers/audit-cli.js';
import { auditHmacFrom } from './helpers/audit.js';
import { provisioned, type TestNats } from './helpers/nats.js';
import { permissionError } from './helpers/permissions.js';
import { startService, type ServiceProcess } from './helpers/services.js';
import { waitForOperation } from './helpers/ops.js';
import { readStream } from './helpers/streams.js';
import { Sink } from './helpers/sink.js';
import { contracts, sinkWrite } from './fixtures/sink-tools.js';

let t: TestNats;
let sink: Sink;
let env: Record<string, string>;
let procs: ServiceProcess[] = [];
let projectors: ServiceProcess[] = [];
let alice: Tools;
let blockedBob: Tools;
let kv: KV;
let hmac: AuditHmac;
let startedAt: number;
const results: Record<string, ExecuteResult> = {};

const BODY_CANARY = 'CANARY-audit-body-7c1d2e';
const note = (title: string, over: Record<string, unknown> = {}) => ({
  bucket: 'kb-main',
  title,
  body: `${BODY_CANARY} ${title}`,
  at: '2026-11-30T06:00:00Z',
  ...over,
});
const keyOf = (taskId: string, title: string) => prepareCall(sinkWrite, taskId, note(title)).operationKey;
const auditor = (...args: string[]) => auditCli(t, 'acme', 'audrey', args);

async function readBucket(): Promise<Map<string, AuditRecord>> {
  const out = new Map<string, AuditRecord>();
  for await (const key of await kv.keys()) {
    const e = await kv.get(key);
    if (e && e.operation === 'PUT') out.set(key, decode(auditRecordSchema, e.value));
  }
  return out;
}

async function until<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs = 30_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await probe();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function untilDrained(stream: string, durable: string): Promise<void> {
  await until(`${durable} drained`, async () => {
    const i = await t.jsm.consumers.info(stream, durable);
    return i.num_pending === 0 && i.num_ack_pending === 0 ? true : undefined;
  });
}

/** Replays the event log and the decision stream, read raw, through the pure rules: the projection rebuilt in memory. */
async function replay(): Promise<Map<string, AuditRecord>> {
  const out = new Map<string, AuditRecord>();
  for (const [stream, kind] of [
    [t.subjects.eventsStream, 'op'] as const,
    ...t.tenants.map((x) => [t.subjects.decisionsStream(x), 'decision'] as const),
  ]) {
    for (const m of await readStream(t, stream)) {
      const where = t.subjects.parseOpSubject(kind, m.subject)!;
      const key = t.subjects.projectionKey(where.tenant, where.opId);
      const cur = out.get(key) ?? null;
      const next =
        kind === 'op'
          ? applyEventToAudit(cur, decode(auditedEventSchema, m.data), m.seq, hmac)
          : applyDecisionToAudit(cur, decode(auditedDecisionSchema, m.data), m.seq);
      if (next) out.set(key, next);
    }
  }
  return out;
}

/** Two instances, one after the other (several tsx start-ups at once can starve each other on a loaded 2-core machine). */
const startProjectors = async () => [
  await startService('audit-projector', env),
  await startService('audit-projector', env),
];

beforeAll(async () => {
  t = await provisioned();
  sink = await new Sink().start();
  env = { ...t.env, SINK_URL: sink.url };
  hmac = auditHmacFrom(env.TOOLTX_AUDIT_HMAC_KEY_FILE!);
  kv = await openBucket(t.nc, t.subjects.auditBucket);
  procs = [await startService('authorizer', env), await startService('executor', env)];
  projectors = await startProjectors();
  const open = (actor: string) =>
    createTools({
      servers: t.url,
      tenant: 'acme',
      actor,
      nkeyFile: t.agentSeed('acme', actor),
      contracts,
      prefix: t.subjects.prefix,
      receiptKeys: t.auth.receiptKeysFile,
      budgetMs: 20_000,
    });
  [alice, blockedBob] = await Promise.all([open('alice'), open('blocked-bob')]);
  startedAt = Date.now();

  for (const title of ['First', 'Second', 'Third'])
    results[title] = await alice.execute({ tool: 'sink.write', taskId: 'audit', input: note(title) });
  // The same key with another field outside target and intent: an idempotency conflict (FM-03).
  results.conflict = await alice.execute({
    tool: 'sink.write',
    taskId: 'audit',
    input: note('First', { priority: 'high' }),
  });
  // Refused at intake by the policy seam: a decision, no operation.
  results.blocked = await blockedBob.execute({ tool: 'sink.write', taskId: 'audit', input: note('Blocked') });
  // The downstream never answers: the attempt times out after its request left — unknown.
  sink.hang = true;
  results.hung = await alice.execute({ tool: 'sink.write', taskId: 'audit', input: note('Hung') }, { budgetMs: 1_500 });
  await waitForOperation(t, 'acme', keyOf('audit', 'Hung'), (s) => s.status === 'unknown');
  sink.hang = false;
  await until('the audit records are complete', async () => {
    const b = await readBucket();
    const first = b.get(t.subjects.projectionKey('acme', operationIdOf(keyOf('audit', 'First'))));
    const hung = b.get(t.subjects.projectionKey('acme', operationIdOf(keyOf('audit', 'Hung'))));
    return b.size === 5 &&
      first?.decisions.length === 1 &&
      hung?.status === 'unknown' &&
      [...b.values()].filter((r) => r.status === 'committed').length === 3
      ? b
      : undefined;
  });
}, 240_000);

afterAll(async () => {
  await alice?.close();
  await blockedBob?.close();
  const all = [...procs, ...projectors];
  const codes = await Promise.all(all.map((p) => p.stop()));
  all.forEach((p, i) => {
    if (codes[i] !== 0)
      console.log(
        p.name,
        codes[i],
        p.stderr,
        JSON.stringify(p.lines.filter((l) => Number(l.level) >= 40).slice(-20), null, 1),
      );
  });
  await sink?.stop();
  await t?.close();
  expect(codes).toEqual(all.map(() => 0));
}, 120_000);

describe('the audit record of an operation', { timeout: 180_000 }, () => {
  it('the workload ran as expected', () => {
    expect(['First', 'Second', 'Third'].map((k) => results[k]!.status)).toEqual([
      'committed',
      'committed',
      'committed',
    ]);
    expect(results.conflict).toMatchObject({ status: 'rejected', error: { class: 'idempotency_conflict' } });
    expect(results.blocked).toMatchObject({ status: 'rejected', error: { class: 'forbidden' } });
    expect(results.hung!.status).toBe('unknown');
  });

  it('`tooltx audit show` prints who, which contract, a keyed HMAC of the target, the decision and policy version, the side effect, every state with its time and an HMAC of the result — never the body', async () => {
    const key = keyOf('audit', 'First');
    const run = await auditor('show', key);
    expect(run.code, run.stderr).toBe(0);
    const r = auditRecordSchema.parse(run.json[0]);
    const last = (await t.store.load('acme', operationIdOf(key))).state;
    if (last.status !== 'committed') throw new Error('expected committed');
    expect(r).toMatchObject({
      operationKey: key,
      tenant: 'acme',
      actor: 'alice',
      status: 'committed',
      tool: 'sink.write',
      contract: 'sink.write@1',
      contractDigest: last.contractDigest,
      effect: 'create',
      targetHmac: hmac('target', last.targetDigest),
      resultHmac: hmac('result', last.receipt!.resultDigest),
      sideEffect: 'applied',
      attempt: 1,
      authorization: {
        intake: {
          decision: 'allow',
          policyVersion: 'sink-policy@1',
          resources: [{ idHmac: hmac('resource', 'bucket:kb-main'), version: 1 }],
        },
        execution: { decision: 'allow', policyVersion: 'sink-policy@1' },
      },
    });
    expect(r.states.map((s) => [s.event, s.actor])).toEqual([
      ['accepted', 'alice'],
      ['running', 'alice'],
      ['committed', 'alice'],
    ]);
    for (const s of r.states) expect(s.at).toBeGreaterThanOrEqual(startedAt - 1_000);
    // The conflicting request is evidence on the same record: who, when, which class.
    expect(r.decisions).toEqual([
      expect.objectContaining({
        actor: 'alice',
        errorClass: 'idempotency_conflict',
        conflict: true,
        contract: 'sink.write@1',
      }),
    ]);
    expect(run.stdout).not.toContain(BODY_CANARY);
    expect(run.stdout).not.toContain(last.targetDigest);
    expect(run.stdout).not.toContain('bucket:kb-main');
  });

  it('a refusal at intake and an unknown are recorded too; `list --state` filters; `counts` counts per contract version', async () => {
    const all = await auditor('list', '--since', '1h');
    expect(all.code, all.stderr).toBe(0);
    expect(all.json).toHaveLength(5);
    const blocked = all.json.find((r) => r.operationKey === keyOf('audit', 'Blocked'));
    expect(blocked).toMatchObject({
      status: 'refused',
      actor: 'blocked-bob',
      sideEffect: 'none',
      states: [],
      decisions: [
        expect.objectContaining({ errorClass: 'forbidden', policyVersion: 'sink-policy@1', conflict: false }),
      ],
    });
    expect(all.json.find((r) => r.operationKey === keyOf('audit', 'Hung'))).toMatchObject({
      status: 'unknown',
      sideEffect: 'possible',
    });
    // Oldest first.
    const firsts = all.json.map((r) => r.firstAt as number);
    expect(firsts).toEqual([...firsts].sort((a, b) => a - b));

    const committed = await auditor('list', '--state', 'committed', '--limit', '2');
    expect(committed.json.map((r) => r.status)).toEqual(['committed', 'committed']);
    const rest = await auditor('list', '--state', 'committed');
    expect(rest.json).toHaveLength(3);
    expect(rest.stderr).toContain('3 record(s)');

    const counts = await auditor('counts', '--since', '1h');
    expect(counts.code, counts.stderr).toBe(0);
    expect(counts.json).toEqual([
      {
        contract: 'sink.write@1',
        operations: 5,
        accepted: 4,
        committed: 3,
        rejected: {},
        refused: { forbidden: 1 },
        conflicts: 1,
        unknown: 1,
        unresolved: 1,
        takeovers: 0,
        manual: 0,
      },
    ]);
  });

  it('`tooltx audit export --format jsonl` gives every record of the range, as stored; each page is one recorded query of one export', async () => {
    const run = await auditor('export', '--since', new Date(startedAt - 60_000).toISOString(), '--format', 'jsonl');
    expect(run.code, run.stderr).toBe(0);
    expect(run.stderr).toMatch(/exported 5 record\(s\) in 1 page\(s\), export id [0-9a-f-]{36}/);
    const bucket = await readBucket();
    // As stored, with the shared event log's positions made the operation's own (docs/tenancy.md).
    expect(
      new Map(
        run.json.map((r) => [
          t.subjects.projectionKey('acme', operationIdOf(r.operationKey as string)),
          auditRecordSchema.parse(r),
        ]),
      ),
    ).toEqual(new Map([...bucket].map(([k, v]) => [k, auditRecordForAuditor(v)])));
    expect(run.stdout).not.toContain(BODY_CANARY);
    const none = await auditor(
      'export',
      '--since',
      new Date(Date.now() + 3_600_000).toISOString(),
      '--format',
      'jsonl',
    );
    expect(none.json).toEqual([]);
    const bad = await auditor('export', '--since', 'yesterday', '--format', 'jsonl');
    expect(bad.code).toBe(2); // a bad flag: usage error
    expect(bad.stderr).toContain('--since');
  });

  it('`show` of an operation key of another tenant, or of no operation, answers nothing (exit 1)', async () => {
    const run = await auditor('show', keyOf('audit', 'Never written'));
    expect(run.code).toBe(1);
    expect(run.stderr).toContain('no audit record');
  });
});

describe('every query is recorded before it is answered', { timeout: 180_000 }, () => {
  it('the audit log holds who, when, what, which range and how many records for every query and export page', async () => {
    const before = (await readStream(t, t.subjects.auditLogStream)).length;
    const run = await auditor('list', '--since', '1h', '--state', 'unknown');
    expect(run.json).toHaveLength(1);
    const log = (await readStream(t, t.subjects.auditLogStream)).map((m) => ({
      subject: m.subject,
      r: decode(auditQueryRecordSchema, m.data),
    }));
    expect(log.length).toBe(before + 1);
    const last = log.at(-1)!;
    expect(last.subject).toBe(t.subjects.auditLog('acme', 'audrey'));
    expect(last.r).toMatchObject({ tenant: 'acme', auditor: 'audrey', kind: 'list', state: 'unknown', count: 1 });
    expect(last.r.since).toBeGreaterThan(Date.now() - 2 * 3_600_000);
    // Every earlier query of this file is there as well: shows, lists, counts, export pages.
    const kinds = new Set(log.map((x) => x.r.kind));
    for (const k of ['show', 'list', 'counts', 'export']) expect(kinds).toContain(k);
    expect(log.filter((x) => x.r.kind === 'export' && x.r.count === 5)).toHaveLength(1);
  });

  it('when the record cannot be stored, the auditor gets no data: dependency_unavailable', async () => {
    const info = await t.jsm.streams.info(t.subjects.auditLogStream);
    const audrey = await t.connectAs({ kind: 'auditor', tenant: 'acme', actor: 'audrey' });
    try {
      // The stream refuses every new message for a moment (as a full or broken stream would).
      await t.jsm.streams.update(t.subjects.auditLogStream, {
        ...info.config,
        max_msgs: info.state.messages,
        discard: 'new' as never,
      });
      const m = await audrey.request(t.subjects.audit('acme', 'audrey'), encode({ kind: 'list' }), { timeout: 20_000 });
      const a = decode(auditAnswerSchema, m.data);
      expect(a).toEqual({ error: { class: 'dependency_unavailable' } });
      expect((await t.jsm.streams.info(t.subjects.auditLogStream)).state.messages).toBe(info.state.messages);
    } finally {
      await t.jsm.streams.update(t.subjects.auditLogStream, info.config);
    }
    const m = await audrey.request(t.subjects.audit('acme', 'audrey'), encode({ kind: 'list' }), { timeout: 20_000 });
    const a = decode(auditAnswerSchema, m.data);
    expect('records' in a && Array.isArray(a.records) ? a.records.length : -1).toBe(5);
    await audrey.close();
  });

  it('an invalid query is recorded and refused with field paths', async () => {
    const audrey = await t.connectAs({ kind: 'auditor', tenant: 'acme', actor: 'audrey' });
    try {
      const m = await audrey.request(t.subjects.audit('acme', 'audrey'), encode({ kind: 'list', tenant: 'globex' }), {
        timeout: 20_000,
      });
      expect(decode(auditAnswerSchema, m.data)).toMatchObject({
        error: { class: 'invalid_input', issues: [{ path: ['tenant'], code: 'unrecognized_key' }] },
      });
    } finally {
      await audrey.close();
    }
    const last = (await readStream(t, t.subjects.auditLogStream))
      .map((x) => decode(auditQueryRecordSchema, x.data))
      .at(-1)!;
    expect(last).toMatchObject({ kind: 'invalid', auditor: 'audrey', count: 0 });
  });
});

describe('rebuildable, idempotent, several instances', { timeout: 180_000 }, () => {
  it('replaying the event log and the decision stream into an empty projection gives the same records', async () => {
    const live = await readBucket();
    expect(live.size).toBe(5);
    // The same rules over the raw streams, in memory.
    expect(await replay()).toEqual(live);
    // And for real: stop both instances, drop the bucket and the durables, provision again, start two new instances.
    expect(await Promise.all(projectors.map((p) => p.stop()))).toEqual([0, 0]);
    await t.jsm.streams.delete(`KV_${t.subjects.auditBucket}`);
    await t.jsm.consumers.delete(t.subjects.eventsStream, Durables.auditProjector);
    for (const x of t.tenants) await t.jsm.consumers.delete(t.subjects.decisionsStream(x), Durables.auditDecisions);
    await applyTopology(t.nc, t.jsm, t.topo);
    kv = await new Kvm(t.nc).open(t.subjects.auditBucket);
    expect((await readBucket()).size).toBe(0);
    projectors = await startProjectors();
    await untilDrained(t.subjects.eventsStream, Durables.auditProjector);
    for (const x of t.tenants) await untilDrained(t.subjects.decisionsStream(x), Durables.auditDecisions);
    expect(await readBucket()).toEqual(live);
  });

  it('the projection ignores events it already applied: re-delivering the whole log writes nothing', async () => {
    const before = (await t.jsm.streams.info(`KV_${t.subjects.auditBucket}`)).state.last_seq;
    expect(await Promise.all(projectors.map((p) => p.stop()))).toEqual([0, 0]);
    await t.jsm.consumers.delete(t.subjects.eventsStream, Durables.auditProjector);
    for (const x of t.tenants) await t.jsm.consumers.delete(t.subjects.decisionsStream(x), Durables.auditDecisions);
    await applyTopology(t.nc, t.jsm, t.topo);
    projectors = await startProjectors();
    await untilDrained(t.subjects.eventsStream, Durables.auditProjector);
    for (const x of t.tenants) await untilDrained(t.subjects.decisionsStream(x), Durables.auditDecisions);
    expect((await t.jsm.streams.info(`KV_${t.subjects.auditBucket}`)).state.last_seq).toBe(before);
  });
});

describe('who may reach the audit service, and what auditors may not read (refused by the server)', {
  timeout: 180_000,
}, () => {
  let aliceNc: NatsConnection;
  let audrey: NatsConnection;
  beforeAll(async () => {
    aliceNc = await t.connectAs({ kind: 'agent', tenant: 'acme', actor: 'alice' });
    audrey = await t.connectAs({ kind: 'auditor', tenant: 'acme', actor: 'audrey' });
  });
  afterAll(async () => {
    await aliceNc?.close();
    await audrey?.close();
  });

  it('an agent cannot request any audit subject, its own-named one included', async () => {
    for (const subject of [t.subjects.audit('acme', 'audrey'), t.subjects.audit('acme', 'alice')]) {
      const err = await permissionError(aliceNc, () =>
        aliceNc.request(subject, encode({ kind: 'list' }), { timeout: 2_000 }),
      );
      expect(err.operation).toBe('publish');
      expect(err.subject).toBe(subject);
    }
    const run = await auditCli(t, 'acme', 'audrey', ['list'], {
      NATS_NKEY_FILE: t.agentSeed('acme', 'alice'),
      TOOLTX_AUDITOR: 'audrey',
    });
    expect(run.code).toBe(1);
    expect(run.stdout).toBe('');
  });

  it("an auditor can request only its own subject: not another auditor's, not another tenant's", async () => {
    for (const subject of [t.subjects.audit('acme', 'someone'), t.subjects.audit('globex', 'audrey')]) {
      const err = await permissionError(audrey, () =>
        audrey.request(subject, encode({ kind: 'list' }), { timeout: 2_000 }),
      );
      expect(err.subject).toBe(subject);
    }
    const run = await auditCli(t, 'globex', 'audrey', ['list'], {
      NATS_NKEY_FILE: t.auth.seedFile({ kind: 'auditor', tenant: 'acme', actor: 'audrey' }),
    });
    expect(run.code).toBe(1);
    expect(run.stderr).toContain('refused');
  });

  it('an auditor cannot read intents, inputs, events, decisions, results, the audit bucket or the audit log directly, nor listen to queries', async () => {
    const opId = operationIdOf(keyOf('audit', 'First'));
    const api = '$JS.API';
    const publishes = [
      `${api}.DIRECT.GET.${t.subjects.intentsStream('acme')}`,
      `${api}.STREAM.MSG.GET.${t.subjects.intentsStream('acme')}`,
      `${api}.DIRECT.GET.${t.subjects.eventsStream}.${t.subjects.op('acme', opId)}`,
      `${api}.DIRECT.GET.${t.subjects.decisionsStream('acme')}.${t.subjects.decision('acme', opId, 'alice')}`,
      `${api}.DIRECT.GET.KV_${t.subjects.resultsBucket}.$KV.${t.subjects.resultsBucket}.acme.${opId}`,
      `${api}.DIRECT.GET.KV_${t.subjects.auditBucket}.$KV.${t.subjects.auditBucket}.acme.${opId}`,
      `${api}.DIRECT.GET.${t.subjects.auditLogStream}`,
      `${api}.CONSUMER.CREATE.${t.subjects.eventsStream}`,
      `${api}.STREAM.INFO.${t.subjects.auditLogStream}`,
    ];
    for (const subject of publishes) {
      const err = await permissionError(audrey, () => audrey.request(subject, encode({ seq: 1 }), { timeout: 2_000 }));
      expect(err.operation, subject).toBe('publish');
      expect(err.subject).toBe(subject);
    }
    for (const subject of [
      t.subjects.allAudit,
      `${t.subjects.prefix}.auditlog.>`,
      t.subjects.allIntents,
      t.subjects.allOps,
      '_INBOX.>',
      `$KV.${t.subjects.resultsBucket}.>`,
    ]) {
      const err = await permissionError(audrey, () => audrey.subscribe(subject));
      expect(err.operation, subject).toBe('subscription');
    }
  });
});
