/**
 * No tenant can stall, fill or watch the system for another (docs/tenancy.md), on real processes:
 * a nats-server with a 48 MB store (`max_file_store`), the authorizer, the executor and the
 * audit-projector as processes, a sink that does not deduplicate, 50 tenants. While the `flood`
 * tenant poisons or floods its own intake, every other tenant's calls commit: 0 failed calls. Their
 * latency with and without each flood is measured by `npm run matrix` (test/matrix/tenancy.matrix.test.ts),
 * never asserted here.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Tools } from '@tooltx/client';
import { operationIdOf } from '@tooltx/contracts';
import { createConnection } from 'node:net';
import { readFileSync } from 'node:fs';
import { fromSeed } from '@nats-io/nkeys';
import { connectNats, decodeRaw, openBucket } from '@tooltx/nats';
import { jetstream } from '@nats-io/jetstream';
import { inboxPrefixOf } from '@tooltx/nats';
import { figure } from './helpers/figures.js';
import { provisioned, type TestNats } from './helpers/nats.js';
import { startService, type ServiceProcess } from './helpers/services.js';
import { Sink } from './helpers/sink.js';
import { amplifier, callRun, flood, manyTenants, note, toolsOf, validIntent } from './helpers/tenancy.js';

const _MiB = 1024 * 1024;
/**
 * Small bounds, so that the scaled-down floods meet them: 50 tenants reserve 50 × 576 KiB of the
 * 48 MB store, which a 50 MB flood would fill were it not bounded.
 */
const LIMITS = {
  intentBytes: 512 * 1024,
  intentMessages: 2_000,
  decisionBytes: 64 * 1024,
  maxIntentBytes: 256 * 1024,
  connections: 4,
  subscriptions: 64,
  // Five times the default pace: the flooding tenant's own call waits behind its stored junk for
  // less of the suite's time; what is asserted (bounds, 0 failed calls) does not depend on it.
  intentsPerSecond: 100,
};
const OTHERS = 49;

let t: TestNats;
let sink: Sink;
let services: ServiceProcess[] = [];
/** One agent of each of the first `n` other tenants. */
const agents: { tenant: string; tools: Tools }[] = [];
const others = (n: number) => agents.slice(0, n);

beforeAll(async () => {
  t = await provisioned({}, undefined, {
    identities: manyTenants(OTHERS, LIMITS),
    jetstreamExtra: 'max_file_store: 48MB',
  });
  sink = await new Sink().start();
  const env = { ...t.env, SINK_URL: sink.url };
  services = await Promise.all(
    (['authorizer', 'executor', 'audit-projector'] as const).map((n) => startService(n, env)),
  );
  for (let i = 1; i <= OTHERS; i++) {
    const tenant = `t${String(i).padStart(2, '0')}`;
    agents.push({ tenant, tools: await toolsOf(t, tenant, 'agent') });
  }
}, 120_000);

afterAll(async () => {
  await Promise.all(agents.map((a) => a.tools.close()));
  await Promise.all(services.map((s) => s.stop()));
  await sink?.stop();
  await t?.close();
});

/** The flood tenant's intake stream and its authorizer durable, as the server reports them. */
async function floodIntake() {
  const stream = t.subjects.intentsStream('flood');
  const [info, consumer] = await Promise.all([t.jsm.streams.info(stream), t.jsm.consumers.info(stream, 'authorizer')]);
  return {
    messages: info.state.messages,
    bytes: info.state.bytes,
    pending: consumer.num_pending,
    ackPending: consumer.num_ack_pending,
    redelivered: consumer.num_redelivered,
  };
}

async function until<T>(read: () => Promise<T>, ok: (v: T) => boolean, ms = 30_000): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await read();
    if (ok(v) || Date.now() > end) return v;
    await new Promise((r) => setTimeout(r, 200));
  }
}

/**
 * A raw TCP session as the flooding tenant's agent: reads INFO, answers with a signed CONNECT and
 * `after`, and returns everything the server sent until it closed the connection (or 5 s passed).
 */
async function rawAgentSession(after: string): Promise<string> {
  const kp = fromSeed(new TextEncoder().encode(readFileSync(t.agentSeed('flood', 'mallory'), 'utf8').trim()));
  const sock = createConnection(t.server.port, '127.0.0.1');
  let got = '';
  const closed = new Promise<void>((r) => sock.once('close', () => r()));
  sock.on('error', () => undefined);
  sock.on('data', (d: Buffer) => {
    const first = got === '';
    got += d.toString();
    if (!first) return;
    const { nonce } = JSON.parse(got.slice(5, got.indexOf('\r\n'))) as { nonce: string };
    const sig = Buffer.from(kp.sign(new TextEncoder().encode(nonce))).toString('base64url');
    sock.write(
      `CONNECT ${JSON.stringify({ nkey: kp.getPublicKey(), sig, verbose: false, pedantic: false, headers: true })}\r\n${after}`,
    );
  });
  const timer = setTimeout(() => sock.destroy(), 5_000);
  await closed;
  clearTimeout(timer);
  return got;
}

describe('tenant isolation (docs/tenancy.md)', () => {
  it('poison-intake: 100 amplifiers of 25,000 unknown fields each stall no other tenant; each refusal is recorded bounded, once, with an audit record, and its intent is deleted', async ({
    task,
  }) => {
    let done = false;
    // Built once: the sink answering the executor lives in this process too.
    const amp = amplifier(1, 25_000);
    const poison = flood(t, 'flood', 'mallory', () => amp, {
      until: () => done,
      maxBytes: 100 * amp.byteLength,
      window: 16,
    });
    const run = await callRun(others(6), 3, 20_000, 'poison');
    done = true;
    const sent = await poison;
    figure(task, { name: "other tenants' failed calls during 100 amplifiers", value: run.failed });
    expect(run.failures).toEqual([]);
    expect(sent.sent).toBe(100);
    // Past the tenant's 512 KiB intake bound a publish is refused; what was stored is worked through.
    expect(sent.stored).toBeGreaterThan(0);

    // Worked through, never redelivered, nothing left counting against the tenant's bound.
    const intake = await until(floodIntake, (x) => x.pending === 0 && x.ackPending === 0 && x.messages === 0);
    expect(intake).toMatchObject({ pending: 0, ackPending: 0, redelivered: 0, messages: 0 });
    // One bounded refusal record per amplifier, on the tenant's own decision stream.
    const decisions = await t.jsm.streams.info(t.subjects.decisionsStream('flood'));
    expect(decisions.state.messages).toBe(sent.stored);
    expect(decisions.state.bytes / decisions.state.messages).toBeLessThan(4_096);
    const first = await t.jsm.direct.getMessage(t.subjects.decisionsStream('flood'), {
      seq: decisions.state.first_seq,
    });
    const refusal = decodeRaw(first!.data) as { operationKey: string; error: { class: string; issues: unknown[] } };
    expect(refusal.error.class).toBe('invalid_input');
    expect(refusal.error.issues.length).toBeLessThanOrEqual(21);
    // The audit has each refusal (the audit-projector's record of the first amplifier's key).
    const kv = await openBucket(t.nc, t.subjects.auditBucket);
    const audited = await until(
      () => kv.get(t.subjects.projectionKey('flood', operationIdOf(refusal.operationKey))),
      (e) => e?.operation === 'PUT',
      15_000,
    );
    expect(audited?.operation).toBe('PUT');
  });

  it("tenant-flood: 50 MB of 200 KB junk intents stay inside the flooding tenant's own 512 KiB bound (refused quota_exceeded past it); no other tenant's write fails", async ({
    task,
  }) => {
    let done = false;
    // Under the tenant's largest intent (a larger one never leaves the agent's client: below).
    const junk = new Uint8Array(200_000).fill(0xc1); // 0xc1 is never msgpack
    const flooded = flood(t, 'flood', 'mallory', () => junk, { until: () => done, maxBytes: 250 * 200_000, window: 8 });
    const run = await callRun(others(6), 3, 20_000, 'junk');
    const sent = await flooded;
    done = true;
    // The flooding tenant's own SDK call while its intake is full is refused quota_exceeded, or commits once room is made.
    const ownTools = await toolsOf(t, 'flood', 'mallory');
    const own = await ownTools.execute(
      { tool: 'sink.write', taskId: 'own', input: note('own call') },
      { budgetMs: 10_000 },
    );
    await ownTools.close();
    figure(task, { name: "other tenants' failed calls during a 50 MB junk flood", value: run.failed });
    figure(task, {
      name: 'bytes the flooding tenant holds in its intake stream (bound 512 KiB)',
      value: (await floodIntake()).bytes,
    });
    expect(run.failures).toEqual([]);
    expect(sent.refused['10077'] ?? 0, JSON.stringify(sent)).toBeGreaterThan(0);
    expect(['committed', 'rejected']).toContain(own.status);
    if (own.status === 'rejected')
      expect(own.error).toMatchObject({ class: 'quota_exceeded', retryAfterMs: expect.any(Number) });
    // Every junk intent is refused, recorded and deleted: nothing of the flood stays stored.
    // (The tenant's own call may have been sent twice, both kept: an accepted intent's input is read from it.)
    const intake = await until(floodIntake, (x) => x.pending === 0 && x.ackPending === 0 && x.bytes < junk.byteLength);
    expect(intake).toMatchObject({ pending: 0, ackPending: 0 });
    expect(intake.bytes).toBeLessThan(junk.byteLength);
    expect(intake.bytes).toBeLessThanOrEqual(LIMITS.intentBytes);
  });

  it("sequence-isolation: nothing an agent receives — PubAck sequences, receipts, status — counts another tenant's calls", async () => {
    const [a, b] = others(2) as [{ tenant: string; tools: Tools }, { tenant: string; tools: Tools }];
    const nc = await connectNats({
      servers: t.url,
      name: 'seq-agent',
      nkeySeedFile: t.agentSeed(a.tenant, 'agent'),
      inboxPrefix: inboxPrefixOf({ kind: 'agent', tenant: a.tenant, actor: 'agent' }),
      reconnectForever: false,
    });
    const js = jetstream(nc);
    // What tenant `a` sees of one round: one call of its own (receipt, status) and one raw publish (PubAck).
    const round = async (i: number) => {
      const r = await a.tools.execute(
        { tool: 'sink.write', taskId: `seq-${i}`, input: note(`seq ${i}`) },
        { budgetMs: 10_000 },
      );
      expect(r.status).toBe('committed');
      if (r.status !== 'committed') throw new Error('not committed');
      const st = await a.tools.status({ operationKey: r.operationKey });
      const ack = await js.publish(t.subjects.intent(a.tenant, 'agent'), validIntent(1_000 + i));
      return {
        pubAck: ack.seq,
        receipt: r.receipt as unknown as Record<string, unknown>,
        status: st as unknown as Record<string, unknown>,
      };
    };
    const numbers = (o: Record<string, unknown>, skip: string[]) =>
      Object.fromEntries(Object.entries(o).filter(([k, v]) => typeof v === 'number' && !skip.includes(k)));
    // Times are not counters; attempts are the operation's own.
    const clocks = ['committedAt', 'at', 'updatedAt', 'elapsedMs'];
    const delta = (x: Awaited<ReturnType<typeof round>>, y: Awaited<ReturnType<typeof round>>) => ({
      pubAck: y.pubAck - x.pubAck,
      receipt: Object.fromEntries(
        Object.entries(numbers(y.receipt, clocks)).map(([k, v]) => [
          k,
          (v as number) - ((x.receipt[k] as number) ?? 0),
        ]),
      ),
      status: Object.fromEntries(
        Object.entries(numbers(y.status, clocks)).map(([k, v]) => [k, (v as number) - ((x.status[k] as number) ?? 0)]),
      ),
    });
    try {
      const r1 = await round(1);
      const r2 = await round(2);
      // Another tenant's calls between two rounds of `a`: 7 of them.
      for (let i = 0; i < 7; i++)
        expect(
          (
            await b.tools.execute(
              { tool: 'sink.write', taskId: `between-${i}`, input: note(`between ${i}`) },
              { budgetMs: 10_000 },
            )
          ).status,
        ).toBe('committed');
      const r3 = await round(3);
      // Between r1 and r2 nobody else called; between r2 and r3 another tenant called 7 times: `a` cannot tell.
      expect(delta(r2, r3)).toEqual(delta(r1, r2));
    } finally {
      await nc.close();
    }
  });

  it("fairness across 50 tenants: while one tenant publishes valid calls as fast as one connection can, the 49 others' calls all commit", async ({
    task,
  }) => {
    let done = false;
    // 5,000 intents, past the tenant's bound of 2,000: a backlog of its own and refusals past it
    // (the full-speed 30 s flood is the matrix's: here it would slow the suite's other worker).
    const flooded = flood(t, 'flood', 'mallory', validIntent, {
      until: () => done,
      maxBytes: 5_000 * validIntent(0).byteLength,
      window: 64,
    });
    const run = await callRun(others(OTHERS), 2, 30_000, 'fair');
    done = true;
    const sent = await flooded;
    figure(task, { name: "other tenants' failed calls (49 tenants) during a flood of valid calls", value: run.failed });
    expect(run.calls).toBe(OTHERS * 2);
    expect(run.failures).toEqual([]);
    expect(sent.sent).toBeGreaterThan(0);
    // The flooding tenant's backlog stays in its own bounded stream.
    expect((await floodIntake()).bytes).toBeLessThanOrEqual(LIMITS.intentBytes);
  });

  it("an intent that fails for good is recorded as internal and terminated after a few deliveries, never redelivered for minutes; the tenant's next call commits", async () => {
    const [a] = others(1) as [{ tenant: string; tools: Tools }];
    const r = await a.tools.execute(
      { tool: 'sink.write', taskId: 'policy-bug', input: { ...note('policy bug'), bucket: 'policy-bug' } },
      { budgetMs: 15_000 },
    );
    expect(r).toMatchObject({ status: 'rejected', error: { class: 'internal' } });
    const c = await t.jsm.consumers.info(t.subjects.intentsStream(a.tenant), 'authorizer');
    expect({ pending: c.num_pending, ackPending: c.num_ack_pending, redelivered: c.num_redelivered }).toEqual({
      pending: 0,
      ackPending: 0,
      redelivered: 0,
    });
    expect(
      (
        await a.tools.execute(
          { tool: 'sink.write', taskId: 'after-bug', input: note('after the bug') },
          { budgetMs: 15_000 },
        )
      ).status,
    ).toBe('committed');
  });

  it("tenant-flood: admission at the connection — a message over the tenant's largest intent is refused before the server reads it (a raw client is disconnected), and the tenant's connections and subscriptions are bounded", async () => {
    const before = await floodIntake();
    // A raw client, authenticated as the flooding tenant's agent, announces a publish over its
    // account's max_payload (maxIntentBytes): the server refuses it at the header and closes.
    const oversize = await rawAgentSession(
      `PUB ${t.subjects.prefix}.intent.flood.mallory.x ${LIMITS.maxIntentBytes + 1}\r\n`,
    );
    expect(oversize).toContain("-ERR 'Maximum Payload Violation'");
    expect(await floodIntake()).toMatchObject({ messages: before.messages, bytes: before.bytes });

    // Subscriptions: at most the tenant's bound across its connections; one more closes the connection.
    const inbox = inboxPrefixOf({ kind: 'agent', tenant: 'flood', actor: 'mallory' });
    const subs = Array.from({ length: LIMITS.subscriptions + 1 }, (_, i) => `SUB ${inbox}.s${i} ${i + 1}\r\n`).join('');
    expect(await rawAgentSession(`${subs}PING\r\n`)).toContain("-ERR 'maximum subscriptions exceeded'");

    // Connections: at most the tenant's bound at once; one more is refused at connect, and only
    // that tenant's (another tenant's next call still commits).
    const held = [];
    try {
      for (let i = 0; i < LIMITS.connections; i++)
        held.push(
          await connectNats({
            servers: t.url,
            name: `held-${i}`,
            nkeySeedFile: t.agentSeed('flood', 'mallory'),
            inboxPrefix: inboxPrefixOf({ kind: 'agent', tenant: 'flood', actor: 'mallory' }),
            reconnectForever: false,
          }),
        );
      // An authenticated connection is told the tenant's limit, not the server's 1 MiB: the SDK refuses
      // a larger intent before sending it (invalid_input, too_large).
      expect(held[0]!.info?.max_payload).toBe(LIMITS.maxIntentBytes);
      // One more (a raw client, so that the refusal is read at once, not after nats.js's connect timeout).
      expect(await rawAgentSession('PING\r\n')).toContain("-ERR 'maximum account active connections exceeded'");
      const [a] = others(1) as [{ tenant: string; tools: Tools }];
      expect(
        (
          await a.tools.execute(
            { tool: 'sink.write', taskId: 'while-held', input: note('while connections are held') },
            { budgetMs: 15_000 },
          )
        ).status,
      ).toBe('committed');
    } finally {
      await Promise.all(held.map((nc) => nc.close()));
    }
  });
});
