/**
 * One key, one execution — the core lifecycle end to end on a real nats-server, with the
 * authorizer and the executor as separate OS processes (two of each) and a real HTTP sink that does
 * NOT deduplicate. Any second sink request for one operation key is a double execution.
 */
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AckPolicy, DeliverPolicy } from '@nats-io/jetstream';
import { nanos } from '@nats-io/transport-node';
import { z } from 'zod';
import { downstreamKeyOf, operationIdOf, prepareCall } from '@tooltx/contracts';
import { createTools, newSubmission, publishSubmission, type Tools } from '@tooltx/client';
import { decode, encode } from '@tooltx/nats';
import type { OperationEvent, OperationRecord } from '@tooltx/lifecycle';
import { provisioned, resultStore, type TestNats } from './helpers/nats.js';
import { runScript, SINK_TOOLS, startService, type ServiceProcess } from './helpers/services.js';
import { history, waitForDecision, waitForOperation } from './helpers/ops.js';
import { Sink } from './helpers/sink.js';
import { contracts, sinkLookup, sinkWrite } from './fixtures/sink-tools.js';
import { beyondOne, figure } from './helpers/figures.js';

const TENANT = 'acme';
let t: TestNats;
let sink: Sink;
let procs: ServiceProcess[] = [];
let env: Record<string, string>;
/** Two submitters of the tenant, each with its own connection (the SDK). */
let alice: Tools;
let bob: Tools;
const EXECUTORS = ['executor-a', 'executor-b'];
const RACE_EXECUTORS = join(dirname(fileURLToPath(import.meta.url)), 'fixtures', 'race-executors.ts');
/** What test/fixtures/race-executors.ts reports of each of its executor instances. */
interface RaceInstance {
  id: string;
  delivered: { seq: number; deliveryCount: number };
  tried: { type: OperationEvent['type']; expectedSeq: number; outcome: 'stored' | 'refused' }[];
  lines: Record<string, unknown>[];
}

const note = (over: Record<string, unknown> = {}) => ({
  bucket: 'kb-main',
  title: 'Tide tables',
  body: 'High water 06:12.',
  at: '2026-11-30T06:00:00.000Z',
  ...over,
});

/** Publishes one intent as its own submission (random msg id) and returns the server-derived key. */
async function submit(
  taskId: string,
  input: Record<string, unknown>,
  opts: { actor?: string; operationKey?: string | null; extra?: Record<string, unknown> } = {},
) {
  const key = prepareCall(sinkWrite, taskId, input).operationKey;
  const envelope = {
    tool: 'sink.write',
    version: 1,
    taskId,
    input,
    ...(opts.operationKey === null ? {} : { operationKey: opts.operationKey ?? key }),
    ...opts.extra,
  };
  const s = newSubmission(t.subjects, TENANT, opts.actor ?? 'alice', envelope as never);
  const ack = await publishSubmission(t.js, s);
  return { key, ack, submissionId: s.submissionId };
}

const committed = (s: { status: string }) => s.status === 'committed';
const sinkWritesFor = (key: string) => sink.writesFor((b) => b.key === downstreamKeyOf(TENANT, key));

beforeAll(async () => {
  t = await provisioned();
  sink = await new Sink().start();
  // A second executor group: every accepted operation is offered to both, so they race for `running`.
  await t.jsm.consumers.add(t.subjects.eventsStream, {
    durable_name: 'executor-b',
    filter_subject: t.subjects.allOps,
    ack_policy: AckPolicy.Explicit,
    deliver_policy: DeliverPolicy.All,
    ack_wait: nanos(30_000),
  });
  env = { ...t.env, SINK_URL: sink.url };
  procs = await Promise.all([
    startService('authorizer', env),
    startService('authorizer', env),
    startService('executor', { ...env, TOOLTX_INSTANCE_ID: EXECUTORS[0]! }),
    startService('executor', { ...env, TOOLTX_EXECUTOR_DURABLE: 'executor-b', TOOLTX_INSTANCE_ID: EXECUTORS[1]! }),
  ]);
  const sdk = (actor: string) =>
    createTools({
      servers: t.url,
      tenant: TENANT,
      actor,
      nkeyFile: t.agentSeed(TENANT, actor),
      contracts,
      prefix: t.subjects.prefix,
      receiptKeys: t.auth.receiptKeysFile,
    });
  [alice, bob] = await Promise.all([sdk('alice'), sdk('bob')]);
});

afterAll(async () => {
  await alice?.close();
  await bob?.close();
  const codes = await Promise.all(procs.map((p) => p.stop()));
  await sink?.stop();
  await t?.close();
  expect(codes).toEqual([0, 0, 0, 0]);
});

describe('one key, one execution', () => {
  it('FM-01: the same intent submitted twice at the same moment gives one record, one sink request and one receipt', async ({
    task,
  }) => {
    const rounds: { key: string; a: string; b: string }[] = [];
    for (let i = 0; i < 10; i++) {
      const input = note({ title: `Race ${i}` });
      // Two submitters of the tenant, at the same moment: alice and bob.
      const [a, b] = await Promise.all([submit(`race-${i}`, input), submit(`race-${i}`, input, { actor: 'bob' })]);
      expect(a.key).toBe(b.key);
      expect(a.ack.duplicate || b.ack.duplicate).toBe(false); // two distinct submissions
      rounds.push({ key: a.key, a: a.submissionId, b: b.submissionId });
    }
    for (const { key, a, b } of rounds) {
      const s = (await waitForOperation(t, TENANT, key, committed)) as OperationRecord;
      const events = await history(t, TENANT, key);
      expect(events.map((e) => e.type)).toEqual(['accepted', 'running', 'committed']);
      // The decisions are bound to the key: at intake and again at the execution instant.
      expect(s.authorization?.intake).toMatchObject({
        decision: 'allow',
        policyVersion: 'sink-policy@1',
        resources: [{ id: 'bucket:kb-main', version: 1 }],
      });
      expect(s.authorization?.execution).toMatchObject({ decision: 'allow', policyVersion: 'sink-policy@1' });
      expect(s.authorization!.execution!.at).toBeGreaterThanOrEqual(s.authorization!.intake!.at);
      const requests = sinkWritesFor(key).length;
      figure(task, { name: 'sink requests per key', value: requests, duplicates: beyondOne(requests) });
      expect(requests).toBe(1);
      expect(s.receipt?.resourceId).toBe(sinkWritesFor(key)[0]!.answeredId);
      // Each submitter, asking about its own submission, ends with the same committed receipt and result.
      const [fromA, fromB] = await Promise.all([
        alice.status({ operationKey: key, submissionIds: [a] }),
        bob.status({ operationKey: key, submissionIds: [b] }),
      ]);
      expect(fromA).toMatchObject({ state: 'committed', source: 'operation' });
      expect(fromB).toMatchObject({ state: 'committed', source: 'operation' });
      expect(fromA.receipt).toEqual(s.receipt);
      expect(fromB.receipt).toEqual(fromA.receipt);
      expect(fromB.result).toEqual(fromA.result);
      expect(alice.verify({ operationKey: key, receipt: fromA.receipt!, result: fromA.result })).toEqual({
        valid: true,
      });
      expect(bob.verify({ operationKey: key, receipt: fromB.receipt!, result: fromB.result })).toEqual({ valid: true });
    }
    // Both executor groups were offered every accepted event and settled it: they raced, one ran.
    for (const durable of ['executor', 'executor-b']) {
      const info = await t.jsm.consumers.info(t.subjects.eventsStream, durable);
      expect(info.num_pending).toBe(0);
      expect(info.num_ack_pending).toBe(0);
      expect(info.delivered.stream_seq).toBeGreaterThanOrEqual(rounds.length * 3);
    }
  });

  it('FM-01: two SDK clients executing the same call at the same moment both return the identical committed receipt', async ({
    task,
  }) => {
    const call = { tool: 'sink.write', taskId: 'race-sdk', input: note({ title: 'Race through the SDK' }) };
    const [fromA, fromB] = await Promise.all([alice.execute(call), bob.execute(call)]);
    expect(fromA.status).toBe('committed');
    expect(fromB).toEqual(fromA);
    const requests = sinkWritesFor(fromA.operationKey!).length;
    figure(task, { name: 'sink requests per key', value: requests, duplicates: beyondOne(requests) });
    expect(requests).toBe(1);
    expect((await history(t, TENANT, fromA.operationKey!)).map((e) => e.type)).toEqual([
      'accepted',
      'running',
      'committed',
    ]);
  });

  it('FM-01: both submitters read the same receipt, and a later replay of the key returns it unchanged', async () => {
    const input = note({ title: 'Replay me' });
    const first = await submit('replay', input);
    const s1 = (await waitForOperation(t, TENANT, first.key, committed)) as OperationRecord;
    await submit('replay', input, { actor: 'bob' });
    await new Promise((r) => setTimeout(r, 500));
    const s2 = (await t.store.load(TENANT, operationIdOf(first.key))).state as OperationRecord;
    expect(s2.receipt).toEqual(s1.receipt);
    expect(await history(t, TENANT, first.key)).toHaveLength(3);
    expect(sinkWritesFor(first.key)).toHaveLength(1);
    // The result store holds the business result the receipt's digest names.
    const kv = await resultStore(t);
    const entry = await kv.get(t.subjects.resultKey(TENANT, operationIdOf(first.key)));
    const stored = decode(z.object({ resultDigest: z.string(), result: z.unknown() }), entry!.value);
    expect(stored.resultDigest).toBe(s1.receipt!.resultDigest);
    expect(stored.result).toEqual({ noteId: s1.receipt!.resourceId });
  });

  it('FM-03: the same key with another field outside target and intent is an explicit conflict; the original is untouched', async () => {
    const input = note({ title: 'Conflict' });
    const first = await submit('conflict', input);
    const before = (await waitForOperation(t, TENANT, first.key, committed)) as OperationRecord;
    const second = await submit('conflict', { ...input, priority: 'high' });
    expect(second.key).toBe(first.key);
    const d = await waitForDecision(t, TENANT, first.key, 'alice');
    expect(d).toMatchObject({
      outcome: 'rejected',
      error: { class: 'idempotency_conflict' },
      submissionId: second.submissionId,
    });
    const after = (await t.store.load(TENANT, operationIdOf(first.key))).state;
    expect(after).toEqual(before);
    expect(await history(t, TENANT, first.key)).toHaveLength(3);
    expect(sinkWritesFor(first.key)).toHaveLength(1);
  });

  it('FM-03: a supplied key that does not match its request is an idempotency_conflict at operationKey; nothing is registered', async () => {
    const real = prepareCall(sinkWrite, 'mismatch', note({ title: 'Real' })).operationKey;
    const other = prepareCall(sinkWrite, 'mismatch', note({ title: 'Other' })).operationKey;
    await submit('mismatch', note({ title: 'Real' }), { operationKey: other });
    const d = await waitForDecision(t, TENANT, other, 'alice');
    expect(d.error).toMatchObject({ class: 'idempotency_conflict', issues: [{ path: ['operationKey'] }] });
    expect(await history(t, TENANT, real)).toEqual([]);
    expect(await history(t, TENANT, other)).toEqual([]);
  });

  it('refuses a per-attempt id offered as the key and registers nothing', async () => {
    const input = note({ title: 'Tool call id' });
    const { key } = await submit('per-attempt', input, { operationKey: 'call_Zx81' });
    const d = await waitForDecision(t, TENANT, key, 'alice');
    expect(d.error).toMatchObject({ class: 'idempotency_conflict', issues: [{ path: ['operationKey'] }] });
    expect(await history(t, TENANT, key)).toEqual([]);
    expect(sinkWritesFor(key)).toHaveLength(0);
  });

  it('FM-04: the same body written to two buckets gives two keys and two records', async () => {
    const a = await submit('two-kb', note({ bucket: 'kb-a', title: 'Same body' }));
    const b = await submit('two-kb', note({ bucket: 'kb-b', title: 'Same body' }));
    expect(a.key).not.toBe(b.key);
    const [sa, sb] = (await Promise.all([
      waitForOperation(t, TENANT, a.key, committed),
      waitForOperation(t, TENANT, b.key, committed),
    ])) as OperationRecord[];
    expect(sa!.receipt!.resourceId).not.toBe(sb!.receipt!.resourceId);
    expect(sinkWritesFor(a.key)).toHaveLength(1);
    expect(sinkWritesFor(b.key)).toHaveLength(1);
  });

  it('FM-05: field order, whitespace and equivalent time forms sent through the authorizer give one key, one sink request, one receipt', async () => {
    const variants = [
      note({ title: 'Variant note', body: 'Line one\nLine two' }),
      {
        at: '2026-11-30T08:00:00+02:00',
        body: 'Line one  \r\nLine two\r\n',
        title: '  Variant   note',
        bucket: 'KB-MAIN',
      },
      { title: 'Variant\tnote ', bucket: 'kb-main ', at: '2026-11-30T06:00:00Z', body: 'Line one\nLine two\n\n' },
    ];
    const subs = await Promise.all(variants.map((v) => submit('variants', v)));
    expect(new Set(subs.map((s) => s.key)).size).toBe(1);
    const key = subs[0]!.key;
    await waitForOperation(t, TENANT, key, committed);
    await new Promise((r) => setTimeout(r, 500));
    expect(sinkWritesFor(key)).toHaveLength(1);
    expect((await history(t, TENANT, key)).map((e) => e.type)).toEqual(['accepted', 'running', 'committed']);
    expect(await t.store.lastDecision(TENANT, operationIdOf(key), 'alice')).toBeNull();
  });

  it('a refusal before acceptance leaves the key unregistered, and is recorded on the decision subject', async () => {
    const input = note({ title: 'Blocked actor' });
    const { key } = await submit('blocked', input, { actor: 'blocked-bob' });
    const d = await waitForDecision(t, TENANT, key, 'blocked-bob');
    expect(d).toMatchObject({
      actor: 'blocked-bob',
      error: { class: 'forbidden' },
      authorization: { decision: 'deny', reason: 'forbidden', policyVersion: 'sink-policy@1' },
    });
    expect(await history(t, TENANT, key)).toEqual([]);
    // The same key from an allowed actor is then accepted normally.
    const again = await submit('blocked', input);
    await waitForOperation(t, TENANT, again.key, committed);
    expect(sinkWritesFor(key)).toHaveLength(1);
  });

  it("status precedence: another actor's later request on the same key never hides an actor's own refusal (decision records per actor)", async () => {
    const input = note({ title: 'Hidden refusal' });
    const refused = await submit('hidden', input, { actor: 'blocked-bob' });
    await waitForDecision(t, TENANT, refused.key, 'blocked-bob');
    // alice then sends a request on the same key that is refused too (a forged actorId).
    await submit('hidden', input, { operationKey: refused.key, extra: { actorId: 'carol' } });
    await waitForDecision(t, TENANT, refused.key, 'alice');
    const nc = await t.connectAs({ kind: 'agent', tenant: TENANT, actor: 'blocked-bob' });
    try {
      const m = await nc.request(
        t.subjects.status(TENANT, 'blocked-bob'),
        encode({ operationKey: refused.key, submissionIds: [refused.submissionId] }),
        { timeout: 10_000 },
      );
      expect(
        decode(
          z.object({ state: z.string(), source: z.string(), error: z.object({ class: z.string() }) }).loose(),
          m.data,
        ),
      ).toMatchObject({ state: 'rejected', source: 'decision', error: { class: 'forbidden' } });
    } finally {
      await nc.close();
    }
    expect(await history(t, TENANT, refused.key)).toEqual([]);
  });

  it('FM-06: a forged actorId or a tenant field in the input is refused on the server side; nothing is written', async () => {
    const forged = await submit('forged', note({ title: 'Forged' }), { extra: { actorId: 'carol' } });
    expect((await waitForDecision(t, TENANT, forged.key, 'alice')).error.class).toBe('forbidden');
    const input = { ...note({ title: 'Tenant field' }), tenantId: 'victim' };
    const key = prepareCall(sinkWrite, 'tenant-field', note({ title: 'Tenant field' })).operationKey;
    await submit('tenant-field', note({ title: 'Tenant field' }), { operationKey: key, extra: { input } });
    const d = await waitForDecision(t, TENANT, key, 'alice');
    expect(d.error).toMatchObject({ class: 'forbidden', issues: [{ path: ['input', 'tenantId'] }] });
    expect(await history(t, TENANT, forged.key)).toEqual([]);
    expect(await history(t, TENANT, key)).toEqual([]);
  });

  it('a side-effecting attempt that times out downstream is never rejected: it is unknown with evidence, one request sent', async () => {
    sink.hang = true;
    try {
      const { key } = await submit('hang', note({ title: 'Hang' }));
      await waitForOperation(t, TENANT, key, (s) => s.status === 'running');
      const s = (await waitForOperation(t, TENANT, key, (x) => x.status === 'unknown')) as OperationRecord;
      // Abandoned by the attempt's own deadline (a timeout, not a lost connection), and that
      // deadline was the contract's timeoutMs after the attempt started.
      expect(s.evidence).toMatchObject({ kind: 'timeout' });
      const running = (await history(t, TENANT, key)).find((e) => e.type === 'running') as Extract<
        OperationEvent,
        { type: 'running' }
      >;
      expect(running.deadlineAt - running.at).toBe(sinkWrite.timing.timeoutMs);
      expect(s.error).toBeUndefined();
      expect(sinkWritesFor(key)).toHaveLength(1);
    } finally {
      sink.hang = false;
    }
  });

  it('a read that times out is rejected as dependency_unavailable, and the identical input starts a new attempt that commits', async () => {
    const input = { name: 'depth' };
    const key = prepareCall(sinkLookup, 'lookup', input).operationKey;
    const send = () =>
      publishSubmission(
        t.js,
        newSubmission(t.subjects, TENANT, 'alice', {
          tool: 'sink.lookup',
          version: 1,
          taskId: 'lookup',
          operationKey: key,
          input,
        }),
      );
    sink.hang = true;
    await send();
    const rejected = await waitForOperation(t, TENANT, key, (s) => s.status === 'rejected');
    sink.hang = false;
    expect(rejected).toMatchObject({ attempt: 1, error: { class: 'dependency_unavailable' } });
    await send();
    const ok = (await waitForOperation(t, TENANT, key, committed)) as OperationRecord;
    expect(ok.attempt).toBe(2);
    expect(ok.receipt).toMatchObject({ attempt: 2, resourceId: 'value:depth' });
    expect((await history(t, TENANT, key)).map((e) => e.type)).toEqual([
      'accepted',
      'running',
      'rejected',
      'accepted',
      'running',
      'committed',
    ]);
  });
});

describe('two executors racing', () => {
  it('two executors racing: both try to append `running` for the same accepted event; the server stores one, refuses the other, and only the winner executes', async () => {
    // Its own server, where a real authorizer accepts the intent and no executor process runs: the
    // two racing executors are test/fixtures/race-executors.ts, each with its own connection and
    // durable, handed their first delivery of the same `accepted` event at once.
    const r = await provisioned();
    let authorizer: ServiceProcess | undefined;
    try {
      await r.jsm.consumers.add(r.subjects.eventsStream, {
        durable_name: 'executor-b',
        filter_subject: r.subjects.allOps,
        ack_policy: AckPolicy.Explicit,
        deliver_policy: DeliverPolicy.All,
        ack_wait: nanos(30_000),
      });
      authorizer = await startService('authorizer', { ...r.env, SINK_URL: sink.url }, { runtime: 'tsx' });
      const input = note({ title: 'Raced by two executors' });
      const key = prepareCall(sinkWrite, 'race-direct', input).operationKey;
      await publishSubmission(
        r.js,
        newSubmission(r.subjects, TENANT, 'alice', { tool: 'sink.write', version: 1, taskId: 'race-direct', input }),
      );
      await waitForOperation(r, TENANT, key, (s) => s.status === 'accepted');
      const acceptedSeq = (await r.store.load(TENANT, operationIdOf(key))).seq;

      const race = runScript(RACE_EXECUTORS, {
        ...r.env,
        SINK_URL: sink.url,
        TOOLTX_TOOLS_MODULE: SINK_TOOLS,
        RACE_INSTANCES: 'executor-a:executor,executor-b:executor-b',
      });
      expect(await race.exited, race.stderr).toBe(0);
      const out = race.lines.find((l) => Array.isArray(l.instances)) as { instances: RaceInstance[] } | undefined;
      expect(out, race.stderr).toBeDefined();
      const instances = out!.instances;
      // Each got the accepted event on its first delivery…
      for (const x of instances) expect(x.delivered).toEqual({ seq: acceptedSeq, deliveryCount: 1 });
      // …and tried `running` under its sequence; the server stored exactly one and refused the other.
      for (const x of instances)
        expect(x.tried.filter((a) => a.type === 'running')).toEqual([
          { type: 'running', expectedSeq: acceptedSeq, outcome: expect.any(String) },
        ]);
      const winners = instances.filter((x) => x.tried.some((a) => a.type === 'running' && a.outcome === 'stored'));
      const losers = instances.filter((x) => x.tried.some((a) => a.type === 'running' && a.outcome === 'refused'));
      expect(winners).toHaveLength(1);
      expect(losers).toHaveLength(1);
      const [winner, loser] = [winners[0]!, losers[0]!];
      // Only the winner went on: it committed; the loser appended nothing more and executed nothing.
      expect(winner.tried.map((a) => [a.type, a.outcome])).toEqual([
        ['running', 'stored'],
        ['committed', 'stored'],
      ]);
      expect(loser.tried.map((a) => [a.type, a.outcome])).toEqual([['running', 'refused']]);
      expect(winner.lines.filter((l) => l.msg === 'committed' && l.operationKey === key)).toHaveLength(1);
      expect(loser.lines.filter((l) => l.msg === 'committed')).toHaveLength(0);
      // The event history names the winner as the one executor that ran; the sink saw one request.
      const events = await history(r, TENANT, key);
      expect(events.map((e) => e.type)).toEqual(['accepted', 'running', 'committed']);
      expect(events[1]).toMatchObject({ type: 'running', executor: winner.id });
      expect(sinkWritesFor(key)).toHaveLength(1);
    } finally {
      const code = await authorizer?.stop();
      await r.close();
      expect(code).toBe(0);
    }
  });

  it('two executors racing: with two executor processes, every operation has one `running` event naming one of them, and only that one logged its commit', async () => {
    const input = note({ title: 'Raced by two processes' });
    const { key } = await submit('race-procs', input);
    await waitForOperation(t, TENANT, key, committed);
    const events = await history(t, TENANT, key);
    const running = events.filter((e) => e.type === 'running');
    expect(running).toHaveLength(1);
    const ran = (running[0] as Extract<OperationEvent, { type: 'running' }>).executor;
    expect(EXECUTORS).toContain(ran);
    const executors = procs.filter((p) => p.name === 'executor');
    const loggedCommit = (p: ServiceProcess) => p.lines.some((l) => l.msg === 'committed' && l.operationKey === key);
    // The winner's log line follows its append; wait for it to come through the pipe.
    for (let i = 0; i < 200 && !executors.some(loggedCommit); i++) await new Promise((res) => setTimeout(res, 50));
    expect(executors.filter(loggedCommit).map((p) => p.lines.find((l) => l.instance)?.instance)).toEqual([ran]);
    expect(sinkWritesFor(key)).toHaveLength(1);
  });
});
