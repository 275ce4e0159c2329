/**
 * The status endpoint and the SDK end to end: real nats-server, the services as processes, a real
 * HTTP sink that does not deduplicate. `tools.execute` never mistakes silence for failure.
 */
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { defineContract, downstreamKeyOf, operationIdOf, prepareCall } from '@tooltx/contracts';
import { createTools, newSubmission, publishSubmission, type Tools } from '@tooltx/client';
import { provisioned, reloadConfig, type TestNats } from './helpers/nats.js';
import { startService, type ServiceProcess } from './helpers/services.js';
import { history, waitForOperation } from './helpers/ops.js';
import { Sink } from './helpers/sink.js';
import { contracts, sinkLookup, sinkWrite } from './fixtures/sink-tools.js';
import {
  eventCountOf,
  pushMessageSchema,
  type IntentEnvelope,
  type PushMessage,
  type Receipt,
} from '@tooltx/lifecycle';
import { decode, encode, jetStreamOf } from '@tooltx/nats';

const TENANT = 'acme';
let t: TestNats;
let sink: Sink;
let env: Record<string, string>;
let procs: ServiceProcess[] = [];
let tools: Tools;

const note = (title: string, over: Record<string, unknown> = {}) => ({
  bucket: 'kb-main',
  title,
  body: `Body of ${title}.`,
  at: '2026-11-30T06:00:00Z',
  ...over,
});
const startServices = async () => {
  procs = await Promise.all([startService('authorizer', env), startService('executor', env)]);
};
const stopServices = async () => {
  expect(await Promise.all(procs.map((p) => p.stop()))).toEqual([0, 0]);
};
const writesFor = (key: string) => sink.writesFor((b) => b.key === downstreamKeyOf(TENANT, key));

beforeAll(async () => {
  // FM-30 needs short dedup windows on the intent stream and the event log.
  t = await provisioned({ duplicateWindowMs: 1_000 });
  sink = await new Sink().start();
  env = { ...t.env, SINK_URL: sink.url, TOOLTX_DUPLICATE_WINDOW_MS: '1000' };
  await startServices();
  tools = await createTools({
    servers: t.url,
    tenant: TENANT,
    actor: 'alice',
    nkeyFile: t.agentSeed(TENANT, 'alice'),
    contracts,
    prefix: t.subjects.prefix,
    receiptKeys: t.auth.receiptKeysFile,
  });
});

afterAll(async () => {
  await tools?.close();
  await stopServices();
  await sink?.stop();
  await t?.close();
});

describe('tools.execute', () => {
  it('commits and returns the business result apart from the receipt, the result matching its digest', async () => {
    const r = await tools.execute({ tool: 'sink.write', taskId: 'sdk-1', actorId: 'alice', input: note('First') });
    expect(r.status).toBe('committed');
    if (r.status !== 'committed') return;
    expect(r.result).toEqual({ noteId: r.receipt.resourceId });
    expect(r.receipt).toMatchObject({
      operationKey: r.operationKey,
      tool: 'sink.write',
      version: 1,
      state: 'committed',
      attempt: 1,
    });
    expect(writesFor(r.operationKey)).toHaveLength(1);
  });

  it('returns rejected with field paths for fixable input, without sending anything', async () => {
    const before = sink.requests.length;
    const r = await tools.execute({
      tool: 'sink.write',
      taskId: 'sdk-bad',
      input: { ...note('Bad'), tenantId: 'other' },
    });
    expect(r).toMatchObject({
      status: 'rejected',
      next: 'replan',
      error: { class: 'invalid_input', issues: [{ path: ['input', 'tenantId'] }] },
    });
    expect(sink.requests.length).toBe(before);
  });

  it('reports a server-side refusal of its own submission from the decision subject (forged actorId)', async () => {
    const r = await tools.execute({
      tool: 'sink.write',
      taskId: 'sdk-forged',
      actorId: 'mallory',
      input: note('Forged'),
    });
    expect(r).toMatchObject({ status: 'rejected', next: 'reauthorise', error: { class: 'forbidden' } });
    expect(await history(t, TENANT, prepareCall(sinkWrite, 'sdk-forged', note('Forged')).operationKey)).toEqual([]);
  });

  it("FM-25: a write made with a cached contract that differs from the server's (same name@version, another digest) is refused contract_mismatch and nothing runs; the server's contract commits it; a read with the stale contract still runs", async () => {
    const { id: _w, digest: _wd, interfaceDigest: _wi, ...writeSpec } = sinkWrite;
    const { id: _l, digest: _ld, interfaceDigest: _li, ...lookupSpec } = sinkLookup;
    const staleWrite = defineContract({
      ...writeSpec,
      description: 'Write a note to the test sink (an older wording).',
    });
    const staleLookup = defineContract({
      ...lookupSpec,
      description: 'Read a value from the test sink (an older wording).',
    });
    expect(staleWrite.interfaceDigest).not.toBe(sinkWrite.interfaceDigest);
    const stale = await t.agentTools(TENANT, 'alice', [staleWrite, staleLookup]);
    try {
      const input = note('Stale contract');
      const key = prepareCall(sinkWrite, 'fm25-write', input).operationKey;
      const before = sink.requests.length;
      const refused = await stale.execute({ tool: 'sink.write', taskId: 'fm25-write', input });
      expect(refused).toMatchObject({
        status: 'rejected',
        operationKey: key,
        next: 'refresh_contract',
        error: { class: 'contract_mismatch', issues: [{ path: ['interfaceDigest'], code: 'contract_mismatch' }] },
      });
      // Refused at intake: no operation, no request to the sink.
      expect(await history(t, TENANT, key)).toEqual([]);
      expect(sink.requests.length).toBe(before);

      // With the server's contract the same call is a new, valid submission: it commits once.
      const done = await tools.execute({ tool: 'sink.write', taskId: 'fm25-write', input });
      expect(done).toMatchObject({ status: 'committed', operationKey: key });
      expect(writesFor(key)).toHaveLength(1);

      // A read has no side effect to protect: it runs under the server's contract.
      const read = await stale.execute({ tool: 'sink.lookup', taskId: 'fm25-read', input: { name: 'fm25' } });
      expect(read).toMatchObject({ status: 'committed', result: { value: 'v-fm25' } });
    } finally {
      await stale.close();
    }
  });

  it('precedence: a conflicting resubmission is told conflict, and the original caller still sees its committed receipt', async () => {
    const first = await tools.execute({ tool: 'sink.write', taskId: 'sdk-conflict', input: note('Orig') });
    expect(first.status).toBe('committed');
    const bob = await createTools({
      servers: t.url,
      tenant: TENANT,
      actor: 'bob',
      nkeyFile: t.agentSeed(TENANT, 'bob'),
      contracts,
      prefix: t.subjects.prefix,
      receiptKeys: t.auth.receiptKeysFile,
    });
    try {
      const second = await bob.execute({
        tool: 'sink.write',
        taskId: 'sdk-conflict',
        input: note('Orig', { priority: 'high' }),
      });
      expect(second).toMatchObject({ status: 'rejected', error: { class: 'idempotency_conflict' } });
    } finally {
      await bob.close();
    }
    const again = await tools.execute({ tool: 'sink.write', taskId: 'sdk-conflict', input: note('Orig') });
    expect(again).toEqual(first);
    const answer = await tools.status({ operationKey: first.operationKey!, submissionIds: [] });
    expect(answer).toMatchObject({ state: 'committed', source: 'operation' });
    expect(writesFor(first.operationKey!)).toHaveLength(1);
  });

  it('the read policy seam runs before anything is revealed: an actor without rights gets the same answer as for a never-registered key', async () => {
    const done = await tools.execute({ tool: 'sink.write', taskId: 'sdk-private', input: note('Private') });
    expect(done.status).toBe('committed');
    const eve = await createTools({
      servers: t.url,
      tenant: TENANT,
      actor: 'noread-eve',
      nkeyFile: t.agentSeed(TENANT, 'noread-eve'),
      contracts,
      prefix: t.subjects.prefix,
      receiptKeys: t.auth.receiptKeysFile,
    });
    try {
      const registered = await eve.status({ operationKey: done.operationKey! });
      const never = await eve.status({
        operationKey: prepareCall(sinkWrite, 'sdk-private', note('Never written')).operationKey,
      });
      const { at: _a, operationKey: _k1, ...r } = registered;
      const { at: _b, operationKey: _k2, ...n } = never;
      expect(r).toEqual({ state: 'not_seen', source: 'none', seq: 0 });
      expect(r).toEqual(n);
      expect(JSON.stringify(registered)).not.toContain(done.status === 'committed' ? done.receipt.resourceId : 'x');
    } finally {
      await eve.close();
    }
  });

  it('the committed answer is pushed to the agent, so a call accepted before the status endpoint stopped still returns its verified receipt', async () => {
    // A first call on this connection shows the SDK that answers are pushed here.
    expect((await tools.execute({ tool: 'sink.write', taskId: 'push-warm', input: note('Warm') })).status).toBe(
      'committed',
    );
    sink.delayMs = 1_500;
    const input = note('Pushed');
    const key = prepareCall(sinkWrite, 'push-1', input).operationKey;
    try {
      const call = tools.execute({ tool: 'sink.write', taskId: 'push-1', input }, { budgetMs: 15_000 });
      await waitForOperation(t, TENANT, key, (x) => x.status === 'running');
      // The authorizer also serves status: from here on no status request can be answered.
      expect(await procs[0]!.stop()).toBe(0);
      const r = await call;
      expect(r).toMatchObject({ status: 'committed', operationKey: key });
      if (r.status === 'committed') {
        expect(tools.verify(r)).toEqual({ valid: true });
        const stored = (await t.store.load(TENANT, operationIdOf(key))).state;
        expect(stored.status === 'committed' && stored.receipt).toEqual(r.receipt);
      }
      expect(writesFor(key)).toHaveLength(1);
    } finally {
      sink.delayMs = 0;
      procs[0] = await startService('authorizer', env);
    }
  });

  it('what is pushed to a submission\'s agent: the committed answer (executor), the original receipt and result for a resubmission (authorizer), "poll" for a refusal', async () => {
    // The agent's own connection, listening where its answers are pushed.
    const nc = await t.connectAs({ kind: 'agent', tenant: TENANT, actor: 'alice' });
    const pushed = new Map<string, PushMessage>();
    nc.subscribe(t.subjects.pushesOf(TENANT, 'alice'), {
      callback: (e, m) =>
        void (e ? undefined : pushed.set(m.subject.split('.').at(-1)!, decode(pushMessageSchema, m.data))),
    });
    const { js } = await jetStreamOf(nc);
    const submit = async (envelope: IntentEnvelope) => {
      const s = newSubmission(t.subjects, TENANT, 'alice', envelope);
      await publishSubmission(js, s);
      await vi.waitFor(() => expect(pushed.get(s.submissionId)).toBeDefined(), { timeout: 10_000, interval: 20 });
      return pushed.get(s.submissionId)!;
    };
    try {
      const lookup = { tool: 'sink.lookup', version: 1, taskId: 'push-what', input: { name: 'pushed-read' } };
      const key = prepareCall(sinkLookup, 'push-what', lookup.input).operationKey;
      const first = await submit(lookup);
      expect(first).toMatchObject({
        operationKey: key,
        state: 'committed',
        source: 'operation',
        ownAttempt: true,
        inputMatches: true,
        result: { value: 'v-pushed-read' },
      });
      const again = await submit(lookup);
      expect(again).toMatchObject({
        operationKey: key,
        state: 'committed',
        ownAttempt: false,
        result: { value: 'v-pushed-read' },
      });
      expect('receipt' in again && again.receipt).toEqual('receipt' in first && first.receipt);
      expect(tools.verify({ operationKey: key, ...(first as { receipt: Receipt; result: unknown }) })).toEqual({
        valid: true,
      });
      // A forged actorId is refused at intake: its answer is the status endpoint's (a decision), pushed as "poll".
      expect(await submit({ ...lookup, taskId: 'push-forged', actorId: 'bob' })).toMatchObject({ poll: true });
    } finally {
      await nc.close();
    }
  });

  it('an agent whose identity may not subscribe to its push subject (an older auth configuration) still gets its answers, from the status endpoint', async () => {
    const pushes = `"${t.subjects.pushesOf(TENANT, 'bob')}"`;
    await reloadConfig(t, (c) => c.replace(pushes, `"${t.subjects.pushesOf(TENANT, 'nobody')}"`));
    const bob = await createTools({
      servers: t.url,
      tenant: TENANT,
      actor: 'bob',
      nkeyFile: t.agentSeed(TENANT, 'bob'),
      contracts,
      prefix: t.subjects.prefix,
      receiptKeys: t.auth.receiptKeysFile,
    });
    try {
      for (const title of ['Unpushed 1', 'Unpushed 2']) {
        const r = await bob.execute({ tool: 'sink.write', taskId: 'no-push', input: note(title) });
        expect(r.status).toBe('committed');
        if (r.status === 'committed') expect(bob.verify(r)).toEqual({ valid: true });
      }
    } finally {
      await bob.close();
      await reloadConfig(t, (c) => c.replace(`"${t.subjects.pushesOf(TENANT, 'nobody')}"`, pushes));
    }
  });

  it("FM-32: another agent of the tenant can make the status service answer onto an agent's push subject; the agent takes only a committed answer for its own key, so its call still returns its own receipt", async () => {
    // What alice can relay: her own committed receipt, her own refusal (a forged actorId), a never-registered key.
    const own = await tools.execute({ tool: 'sink.write', taskId: 'inject-own', input: note('Alice own') });
    expect(own.status).toBe('committed');
    const refused = await tools.execute({
      tool: 'sink.write',
      taskId: 'inject-refused',
      actorId: 'bob',
      input: note('Alice refused'),
    });
    expect(refused.status).toBe('rejected');
    const relayed = [
      own.operationKey!,
      refused.operationKey!,
      prepareCall(sinkWrite, 'inject-never', note('Never')).operationKey,
    ];
    let n = 0;
    const bob = await createTools({
      servers: t.url,
      tenant: TENANT,
      actor: 'bob',
      nkeyFile: t.agentSeed(TENANT, 'bob'),
      contracts,
      prefix: t.subjects.prefix,
      receiptKeys: t.auth.receiptKeysFile,
      submissionIdFactory: () => `bob-sub-${n++}`,
    });
    const alice = await t.connectAs({ kind: 'agent', tenant: TENANT, actor: 'alice' });
    let injecting = true;
    let injected = 0;
    try {
      // A first call, so bob's connection has seen a push and waits for one first.
      expect((await bob.execute({ tool: 'sink.write', taskId: 'inject-warm', input: note('Bob warm') })).status).toBe(
        'committed',
      );
      // Its next submission's id is predictable (bob-sub-1): alice answers onto its push subject, over and over.
      const target = t.subjects.push(TENANT, 'bob', 'bob-sub-1')!;
      const injector = (async () => {
        while (injecting) {
          for (const k of relayed)
            alice.publish(t.subjects.status(TENANT, 'alice'), encode({ operationKey: k }), { reply: target });
          injected += relayed.length;
          await new Promise((r) => setTimeout(r, 5));
        }
      })();
      await new Promise((r) => setTimeout(r, 200)); // the relays are flowing before bob's call starts
      sink.delayMs = 300;
      const input = note('Bob own');
      const key = prepareCall(sinkWrite, 'inject-dst', input).operationKey;
      const r = await bob.execute({ tool: 'sink.write', taskId: 'inject-dst', input }, { budgetMs: 15_000 });
      injecting = false;
      await injector;
      expect(injected).toBeGreaterThan(0);
      expect(r).toMatchObject({ status: 'committed', operationKey: key });
      if (r.status === 'committed') {
        expect(r.receipt.operationKey).toBe(key);
        expect(bob.verify(r)).toEqual({ valid: true });
      }
      expect(writesFor(key)).toHaveLength(1);

      // The same key with another input (priority is outside the key) is a conflict: a relayed
      // committed answer for that key — genuine receipt and all — must not turn it into a success.
      const conflicting = note('Bob own', { priority: 'high' });
      expect(prepareCall(sinkWrite, 'inject-dst', conflicting).operationKey).toBe(key);
      const target2 = t.subjects.push(TENANT, 'bob', `bob-sub-${n}`)!;
      injecting = true;
      const injector2 = (async () => {
        // Dense: a relayed answer must be on its way whenever bob's call starts waiting.
        while (injecting) {
          for (let i = 0; i < 20; i++)
            alice.publish(t.subjects.status(TENANT, 'alice'), encode({ operationKey: key, waitMs: 0 }), {
              reply: target2,
            });
          await new Promise((r) => setTimeout(r, 1));
        }
      })();
      await new Promise((r) => setTimeout(r, 100));
      const c = await bob.execute(
        { tool: 'sink.write', taskId: 'inject-dst', input: conflicting },
        { budgetMs: 15_000 },
      );
      injecting = false;
      await injector2;
      expect(c).toMatchObject({ status: 'rejected', error: { class: 'idempotency_conflict' } });
      expect(writesFor(key)).toHaveLength(1);
    } finally {
      injecting = false;
      sink.delayMs = 0;
      await alice.close();
      await bob.close();
    }
  });

  it('calls with under 2.1 s of budget (no room for a status long-poll) commit with their verified receipts', async () => {
    for (let i = 0; i < 5; i++) {
      const r = await tools.execute(
        { tool: 'sink.write', taskId: 'short-budget', input: note(`Short ${i}`) },
        { budgetMs: 1_500 },
      );
      // A loaded machine may spend the budget before the commit: then the honest answer is
      // `unknown`, and the same call again (a repeat by key) gets the commit and its receipt.
      const done =
        r.status === 'unknown'
          ? await tools.execute({ tool: 'sink.write', taskId: 'short-budget', input: note(`Short ${i}`) })
          : r;
      expect(done.status).toBe('committed');
      expect(done.operationKey).toBe(r.operationKey);
      if (done.status === 'committed') expect(tools.verify(done)).toEqual({ valid: true });
    }
  });

  it('an executor with as many attempts in flight as its concurrency writes nothing to stderr (no listener warning outside the JSON logs)', async () => {
    sink.delayMs = 300;
    try {
      const rs = await Promise.all(
        Array.from({ length: 20 }, (_, i) =>
          tools.execute({ tool: 'sink.write', taskId: 'many-in-flight', input: note(`Many ${i}`) }),
        ),
      );
      expect(rs.map((r) => r.status)).toEqual(rs.map(() => 'committed'));
    } finally {
      sink.delayMs = 0;
    }
    expect(procs[1]!.stderr).toBe('');
  });

  it('resubmits a read rejected as dependency_unavailable and returns the committed later attempt', async () => {
    sink.hang = true;
    setTimeout(() => (sink.hang = false), 800);
    const r = await tools.execute(
      { tool: 'sink.lookup', taskId: 'sdk-retry', input: { name: 'depth' } },
      { budgetMs: 20_000 },
    );
    expect(r).toMatchObject({
      status: 'committed',
      result: { value: 'v-depth' },
      receipt: { resourceId: 'value:depth' },
    });
    if (r.status === 'committed') expect(r.receipt.attempt).toBeGreaterThanOrEqual(2);
  });

  it('long-poll: a status request waiting on a running operation is answered with the change that ended its wait, not a later one', async () => {
    // Attempt 1 is held by the sink, then refused (rejected: definitively not applied). Once that
    // refusal is stored, the same input is resubmitted and attempt 2 commits. A request that waited
    // past attempt 1's `running` must be answered with attempt 1's refusal, the first change: an
    // answer given only when its 30 s window ran out (or at any later change) would report attempt 2.
    sink.delayMs = 1_500;
    sink.refuseWritesWith = 403;
    try {
      const input = note('Slow');
      const key = prepareCall(sinkWrite, 'sdk-slow', input).operationKey;
      const send = () =>
        publishSubmission(
          t.js,
          newSubmission(t.subjects, TENANT, 'alice', { tool: 'sink.write', version: 1, taskId: 'sdk-slow', input }),
        );
      await send();
      await waitForOperation(t, TENANT, key, (x) => x.status === 'running');
      // What the caller saw: the operation's own event count at `running` (the answer's `seq`).
      const runningSeq = eventCountOf((await t.store.load(TENANT, operationIdOf(key))).state);
      expect(runningSeq).toBe(2);
      const poll = tools.status({ operationKey: key, waitMs: 30_000, afterSeq: runningSeq });
      await waitForOperation(t, TENANT, key, (x) => x.status === 'rejected');
      sink.delayMs = 0;
      sink.refuseWritesWith = 0;
      // Give a working long-poll the chance to answer before anything else changes (a pause, not an assertion).
      await Promise.race([poll.catch(() => undefined), new Promise((r) => setTimeout(r, 5_000))]);
      await send();
      const done = await waitForOperation(t, TENANT, key, (x) => x.status === 'committed');
      expect(done).toMatchObject({ attempt: 2 });
      const a = await poll;
      expect(a).toMatchObject({
        state: 'rejected',
        source: 'operation',
        seq: runningSeq + 1,
        attempt: 1,
        error: { class: 'forbidden' },
      });
      expect(a.receipt).toBeUndefined();
      // The operation went on past that answer: the later change exists, and was not what the waiting request got.
      expect((await history(t, TENANT, key)).map((e) => e.type)).toEqual([
        'accepted',
        'running',
        'rejected',
        'accepted',
        'running',
        'committed',
      ]);
      expect(writesFor(key)).toHaveLength(2);
    } finally {
      sink.delayMs = 0;
      sink.refuseWritesWith = 0;
    }
  });

  it('a never-seen key is answered not_seen after the wait, and a bad status request gets field paths', async () => {
    const key = prepareCall(sinkWrite, 'never', note('Never')).operationKey;
    expect(await tools.status({ operationKey: key, waitMs: 200 })).toMatchObject({
      state: 'not_seen',
      source: 'none',
      seq: 0,
    });
    await expect(tools.status({ operationKey: 'nope' } as never)).rejects.toMatchObject({
      class: 'invalid_input',
      issues: [{ path: ['operationKey'] }],
    });
  });

  it('FM-30: a retransmission after the dedup windows is stored again, yet the operation runs once and the caller gets the original receipt', async () => {
    const input = note('Late retransmission');
    const key = prepareCall(sinkWrite, 'fm30', input).operationKey;
    const s = newSubmission(t.subjects, TENANT, 'alice', {
      tool: 'sink.write',
      version: 1,
      taskId: 'fm30',
      operationKey: key,
      input,
    });
    const ack1 = await publishSubmission(t.js, s);
    const done = await waitForOperation(t, TENANT, key, (x) => x.status === 'committed');
    await new Promise((r) => setTimeout(r, 1_500)); // past both 1 s windows
    const ack2 = await publishSubmission(t.js, s); // the same submission, same msg id
    expect(ack2.duplicate).toBe(false);
    expect(ack2.seq).toBeGreaterThan(ack1.seq);
    // Wait until the authorizer has consumed the retransmission.
    for (let i = 0; i < 100; i++) {
      const c = await t.jsm.consumers.info(t.subjects.intentsStream('acme'), 'authorizer');
      if (c.ack_floor.stream_seq >= ack2.seq) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    const a = await tools.status({ operationKey: key, submissionIds: [s.submissionId] });
    expect(a.state).toBe('committed');
    expect(a.receipt).toEqual((done as { receipt?: unknown }).receipt);
    expect(writesFor(key)).toHaveLength(1);
    expect(await history(t, TENANT, key)).toHaveLength(3);
  });

  it('returns unknown with the last server state when the services are down, and after they return the same call yields the one committed receipt', async () => {
    await stopServices();
    const input = note('While down');
    const r1 = await tools.execute({ tool: 'sink.write', taskId: 'sdk-down', input }, { budgetMs: 3_000 });
    expect(r1.status).toBe('unknown');
    if (r1.status !== 'unknown') return;
    expect(r1.lastServerState).toBe('not_seen');
    expect(r1.evidence).toMatchObject({ intentStored: true, statusAnswered: false, lastSeq: 0 });
    expect(r1.next).toBe('observe');
    await startServices();
    const r2 = await tools.execute({ tool: 'sink.write', taskId: 'sdk-down', input });
    expect(r2.status).toBe('committed');
    expect(r2.operationKey).toBe(r1.operationKey);
    expect(writesFor(r1.operationKey)).toHaveLength(1);
    expect(await history(t, TENANT, r1.operationKey)).toHaveLength(3);
  });
});

describe('tools.execute never throws', () => {
  it('returns invalid_input with the path for a bad budget, and unknown (not an exception) when the intent stream is missing', async () => {
    const bad = await tools.execute({ tool: 'sink.write', taskId: 'x', input: note('Budget') }, { budgetMs: -5 });
    // Paths are relative to the argument the caller passed: the option's own name.
    expect(bad).toMatchObject({
      status: 'rejected',
      error: { class: 'invalid_input', issues: [{ path: ['budgetMs'] }] },
    });
    // An agent of a prefix the server authorises but nobody provisioned: nothing is known to be stored, nothing thrown.
    const bare = await provisioned({}, undefined, { apply: false });
    const lost = await createTools({
      servers: bare.url,
      tenant: TENANT,
      actor: 'alice',
      nkeyFile: bare.agentSeed(TENANT, 'alice'),
      contracts,
      prefix: bare.subjects.prefix,
      receiptKeys: bare.auth.receiptKeysFile,
    });
    try {
      const r = await lost.execute({ tool: 'sink.write', taskId: 'x', input: note('Nowhere') }, { budgetMs: 2_000 });
      expect(r.status).toBe('unknown');
      if (r.status === 'unknown') expect(r.evidence.intentStored).toBe(false);
    } finally {
      await lost.close();
      await bare.close();
    }
  });
});
