/**
 * What `tools.execute` says about the intake boundary, on real processes (a nats-server with auth on,
 * the authorizer and the executor as processes, a real HTTP sink that does not deduplicate):
 *
 * - a duplicate PubAck is not proof that the intent is stored: the message its msg id names may
 *   have been evicted while the id is still inside the stream's duplicate window (FM-30, FM-31);
 * - a publish the server refused (a stream limit, insufficient resources) stored nothing: when no
 *   other transmission of the call can have been stored, the answer is `rejected`, not `unknown`
 *   (FM-15).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DiscardPolicy, type StreamConfig } from '@nats-io/jetstream';
import { downstreamKeyOf, prepareCall } from '@tooltx/contracts';
import { createTools, type Tools } from '@tooltx/client';
import { decode } from '@tooltx/nats';
import { intentEnvelopeSchema } from '@tooltx/lifecycle';
import { provisioned, type TestNats } from './helpers/nats.js';
import { startService, type ServiceProcess } from './helpers/services.js';
import { readStream } from './helpers/streams.js';
import { Sink } from './helpers/sink.js';
import { TcpProxy } from './helpers/tcp-proxy.js';
import { contracts, sinkWrite } from './fixtures/sink-tools.js';

const TENANT = 'acme';
const ACTOR = 'alice';
let t: TestNats;
let sink: Sink;
let env: Record<string, string>;
let authorizer: ServiceProcess | undefined;
let executor: ServiceProcess;
let tools: Tools;

const note = (title: string) => ({ bucket: 'kb-main', title, body: `Body of ${title}.`, at: '2026-11-30T06:00:00Z' });
const writesFor = (key: string) => sink.writesFor((b) => b.key === downstreamKeyOf(TENANT, key));
const toolsVia = (servers: string) =>
  createTools({
    servers,
    tenant: TENANT,
    actor: ACTOR,
    nkeyFile: t.agentSeed(TENANT, ACTOR),
    contracts,
    prefix: t.subjects.prefix,
    receiptKeys: t.auth.receiptKeysFile,
  });
const startAuthorizer = async () => {
  if (!authorizer || authorizer.child.exitCode !== null || authorizer.child.signalCode !== null)
    authorizer = await startService('authorizer', env);
};
const stopAuthorizer = async () => {
  if (authorizer) expect(await authorizer.stop()).toBe(0);
  authorizer = undefined;
};
/** The intents stream's limits as the provisioner set them, restored after a test that changed them. */
const intentsConfig = async (): Promise<StreamConfig> =>
  (await t.jsm.streams.info(t.subjects.intentsStream('acme'))).config;
const setIntentsLimits = async (limits: Partial<StreamConfig>) => {
  const cfg = await intentsConfig();
  await t.jsm.streams.update(t.subjects.intentsStream('acme'), { ...cfg, ...limits });
};
/** The operation keys of the intents the intents stream holds now, with their msg ids. */
const storedIntents = async () =>
  (await readStream(t, t.subjects.intentsStream('acme'))).map((m) => ({
    seq: m.seq,
    msgId: /^Nats-Msg-Id: (.*)$/m.exec(m.headers)?.[1],
    operationKey: (() => {
      try {
        return decode(intentEnvelopeSchema, m.data).operationKey;
      } catch {
        return undefined;
      }
    })(),
  }));

beforeAll(async () => {
  t = await provisioned();
  sink = await new Sink().start();
  env = { ...t.env, SINK_URL: sink.url };
  [executor] = await Promise.all([startService('executor', env), startAuthorizer()]);
  tools = await toolsVia(t.url);
});

afterAll(async () => {
  await tools?.close();
  await Promise.all([authorizer?.stop(), executor?.stop()]);
  await sink?.stop();
  await t?.close();
});

describe('tools.execute: honest answers at the intake boundary', () => {
  it('dup-ack-not-stored: an intent evicted while its msg id is still in the duplicate window is sent again at once, and the call commits once', async () => {
    const original = await intentsConfig();
    const proxy = await new TcpProxy(t.server.port).start();
    // The agent reaches nats-server through a TCP hop; a second client of the same agent does not.
    const agent = await toolsVia(proxy.url);
    const later = await toolsVia(t.url);
    try {
      const hop = await proxy.waitForConnection({ name: `tooltx-sdk:${TENANT}/${ACTOR}` });
      const input = note('Evicted intent');
      const key = prepareCall(sinkWrite, 'dup-ack', input).operationKey;
      const subject = t.subjects.intent(TENANT, ACTOR);
      const lastBefore = (await t.jsm.streams.info(t.subjects.intentsStream('acme'))).state.last_seq;
      // The authorizer is down, so intents wait in the stream.
      await stopAuthorizer();
      // The PubAck of the first transmission comes back after the SDK's PubAck timeout (2 s): the
      // SDK sends the same submission again, with the same msg id.
      hop.delay(2_500, 'down');
      // Within this budget the SDK before the fix answered `unknown` (it waited 5 s of `not_seen`
      // after the duplicate PubAck before sending again).
      const call = agent.execute({ tool: 'sink.write', taskId: 'dup-ack', input }, { budgetMs: 5_000 });

      // The first transmission is stored…
      let first: { seq: number; msgId: string } | undefined;
      for (let i = 0; i < 200 && !first; i++) {
        const m = await t.jsm.direct
          .getMessage(t.subjects.intentsStream('acme'), { last_by_subj: subject })
          .catch(() => null);
        if (m && m.seq > lastBefore) first = { seq: m.seq, msgId: m.header.get('Nats-Msg-Id') };
        else await new Promise((r) => setTimeout(r, 10));
      }
      expect(first).toBeDefined();
      // …then evicted before anyone read it: the operator lowers the per-subject limit to 1 and the
      // agent's next intent (another call of the same actor) takes its place. Its msg id stays in
      // the stream's duplicate window (2 minutes).
      await setIntentsLimits({ max_msgs_per_subject: 1 });
      const laterCall = later.execute(
        { tool: 'sink.write', taskId: 'dup-ack-later', input: note('Later intent') },
        { budgetMs: 15_000 },
      );
      const stored = () =>
        t.jsm.streams.getMessage(t.subjects.intentsStream('acme'), { seq: first!.seq }).then((m) => m !== null);
      for (let i = 0; i < 200 && (await stored()); i++) await new Promise((r) => setTimeout(r, 10));
      expect(await stored()).toBe(false);
      hop.delay(0, 'down');
      // The limit is put back (the authorizer refuses to start under it) and the authorizer comes
      // back; the evicted intent is not there for it to read.
      await t.jsm.streams.update(t.subjects.intentsStream('acme'), original);
      await startAuthorizer();

      const r = await call;
      // Not "unknown, intent stored" for an intent nobody will ever read: the call commits.
      expect(r, JSON.stringify(r)).toMatchObject({ status: 'committed', operationKey: key, next: 'continue' });
      expect(writesFor(key)).toHaveLength(1);
      // It was sent again under a new msg id (the operation key keeps it one operation).
      const ours = (await storedIntents()).filter((m) => m.operationKey === key);
      expect(ours.length).toBeGreaterThanOrEqual(1);
      expect(ours.every((m) => m.msgId !== first!.msgId)).toBe(true);
      // The other call, whose intent evicted the first, commits once too.
      const l = await laterCall;
      expect(l.status).toBe('committed');
      if (l.status === 'committed') expect(writesFor(l.operationKey)).toHaveLength(1);
      expect(writesFor(key)).toHaveLength(1);
    } finally {
      await t.jsm.streams.update(t.subjects.intentsStream('acme'), original);
      await startAuthorizer();
      await agent.close();
      await later.close();
      await proxy.stop();
    }
  });

  it("refusal-not-unknown: a publish the server refused under the tenant's intake bound is rejected quota_exceeded with a retry-after, nothing stored or run; the same call commits once there is room", async () => {
    await startAuthorizer();
    const original = await intentsConfig();
    // An honest call first, so the stream holds at least one intent.
    const before = await tools.execute(
      { tool: 'sink.write', taskId: 'refusal-before', input: note('Before the limit') },
      { budgetMs: 10_000 },
    );
    expect(before.status).toBe('committed');
    const input = note('Refused intent');
    const key = prepareCall(sinkWrite, 'refusal', input).operationKey;
    try {
      // The operator bounds the intents stream at what it holds, refusing new messages.
      const held = (await t.jsm.streams.info(t.subjects.intentsStream('acme'))).state.messages;
      await setIntentsLimits({ max_msgs: held, discard: DiscardPolicy.New });
      const r = await tools.execute({ tool: 'sink.write', taskId: 'refusal', input }, { budgetMs: 4_000 });
      expect(r, JSON.stringify(r)).toMatchObject({
        status: 'rejected',
        operationKey: key,
        next: 'wait_or_stop',
        error: { class: 'quota_exceeded', retryAfterMs: 1_000 },
      });
      // Nothing was stored, nothing ran, nothing is registered under the key.
      expect((await storedIntents()).filter((m) => m.operationKey === key)).toEqual([]);
      expect(writesFor(key)).toHaveLength(0);
      expect((await tools.status({ operationKey: key })).state).toBe('not_seen');
    } finally {
      await t.jsm.streams.update(t.subjects.intentsStream('acme'), original);
    }
    // `rejected` means not applied: the identical call, once the stream takes intents again, runs once.
    const again = await tools.execute({ tool: 'sink.write', taskId: 'refusal', input }, { budgetMs: 10_000 });
    expect(again.status).toBe('committed');
    expect(writesFor(key)).toHaveLength(1);
  });

  it('refusal-not-unknown, unless an earlier transmission may be stored: a refusal after a transmission that got no answer stays unknown, and the evidence says why', async () => {
    await startAuthorizer();
    const original = await intentsConfig();
    const proxy = await new TcpProxy(t.server.port).start();
    const agent = await toolsVia(proxy.url);
    const input = note('Refused after silence');
    const key = prepareCall(sinkWrite, 'refusal-after-silence', input).operationKey;
    try {
      const hop = await proxy.waitForConnection({ name: `tooltx-sdk:${TENANT}/${ACTOR}` });
      // The first transmission reaches nats-server only after the SDK's PubAck timeout: to the SDK
      // it may have been stored. By the time it (and the retransmission) arrive, the stream is full.
      hop.delay(2_500, 'up');
      const call = agent.execute({ tool: 'sink.write', taskId: 'refusal-after-silence', input }, { budgetMs: 5_000 });
      const held = (await t.jsm.streams.info(t.subjects.intentsStream('acme'))).state.messages;
      expect(held).toBeGreaterThan(0);
      await setIntentsLimits({ max_msgs: held, discard: DiscardPolicy.New });
      hop.delay(0, 'up');
      const r = await call;
      expect(r, JSON.stringify(r)).toMatchObject({
        status: 'unknown',
        operationKey: key,
        next: 'observe',
        error: { class: 'quota_exceeded' },
        evidence: { intentStored: false, refusal: { jsApiCode: 10077, why: 'earlier_transmission_may_be_stored' } },
      });
      expect((await storedIntents()).filter((m) => m.operationKey === key)).toEqual([]);
      expect(writesFor(key)).toHaveLength(0);
    } finally {
      await t.jsm.streams.update(t.subjects.intentsStream('acme'), original);
      await agent.close();
      await proxy.stop();
    }
  });
});
