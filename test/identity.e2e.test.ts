/**
 * Identity the server enforces (issue 5): generated nkey users with allow-lists, on a real
 * nats-server with auth on. FM-06 (forged identity), FM-31 (squatted ids, guessed keys, cross-tenant
 * status), FM-32 (other users' reply inboxes), plus the id-collision and wildcard cases.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { errors, type NatsConnection, type PermissionViolationError } from '@nats-io/transport-node';
import { jetstream, jetstreamManager } from '@nats-io/jetstream';
import { downstreamKeyOf, prepareCall } from '@tooltx/contracts';
import { createTools, newSubmission, publishSubmission, type Tools } from '@tooltx/client';
import { Subjects, encode } from '@tooltx/nats';
import { generateAuth, topology } from '@tooltx/streams';
import { provisioned, type TestNats } from './helpers/nats.js';
import { startService, type ServiceProcess } from './helpers/services.js';
import { history, waitForDecision } from './helpers/ops.js';
import { Sink } from './helpers/sink.js';
import { contracts, sinkWrite } from './fixtures/sink-tools.js';

let t: TestNats;
let sink: Sink;
let procs: ServiceProcess[] = [];
let alice: Tools;
let mallory: NatsConnection;

const note = (title: string) => ({ bucket: 'kb-main', title, body: `Body of ${title}.`, at: '2026-11-30T06:00:00Z' });
const agent = (tenant: string, actor: string) => ({ kind: 'agent' as const, tenant, actor });

/** Resolves with the permission error the server raises for `fn`, or fails the test. */
async function permissionError(nc: NatsConnection, fn: () => unknown): Promise<PermissionViolationError> {
  const seen = new Promise<PermissionViolationError>((resolve) => {
    void (async () => {
      for await (const s of nc.status()) {
        if (s.type === 'error' && s.error instanceof errors.PermissionViolationError) return resolve(s.error);
      }
    })();
  });
  try {
    await fn();
  } catch (err) {
    if (err instanceof errors.PermissionViolationError) return err;
  }
  return Promise.race([seen, new Promise<never>((_, reject) => setTimeout(() => reject(new Error('no permission violation')), 3_000))]);
}

beforeAll(async () => {
  t = await provisioned();
  sink = await new Sink().start();
  const env = { ...t.env, SINK_URL: sink.url };
  procs = await Promise.all([startService('authorizer', env), startService('executor', env)]);
  alice = await createTools({ servers: t.url, tenant: 'acme', actor: 'alice', nkeyFile: t.agentSeed('acme', 'alice'), contracts, prefix: t.subjects.prefix, receiptKeys: t.auth.receiptKeysFile });
  mallory = await t.connectAs(agent('globex', 'mallory'));
});

afterAll(async () => {
  await alice?.close();
  await mallory?.close();
  expect(await Promise.all(procs.map((p) => p.stop()))).toEqual([0, 0]);
  await sink?.stop();
  await t?.close();
});

describe('FM-06: forged tenant or actor', () => {
  it('refuses publishing on another actor\'s intent subject at the server', async () => {
    const js = jetstream(mallory);
    const err = await permissionError(mallory, () => js.publish(t.subjects.intent('acme', 'alice'), encode({ tool: 'sink.write' }), { timeout: 1_000 }));
    expect(err.operation).toBe('publish');
    expect(err.subject).toBe(t.subjects.intent('acme', 'alice'));
  });

  it('records a payload naming another actor as forbidden on the decision subject; nothing is written', async () => {
    const r = await alice.execute({ tool: 'sink.write', taskId: 'fm06', actorId: 'bob', input: note('Forged actor') });
    expect(r).toMatchObject({ status: 'rejected', error: { class: 'forbidden' } });
    const key = prepareCall(sinkWrite, 'fm06', note('Forged actor')).operationKey;
    expect((await waitForDecision(t, 'acme', key)).error.class).toBe('forbidden');
    expect(await history(t, 'acme', key)).toEqual([]);
    expect(sink.writesFor((b) => b.title === 'Forged actor')).toHaveLength(0);
  });
});

describe('FM-31: another tenant cannot suppress, hijack or read the victim\'s operation', () => {
  it('a squatted submission id does not suppress the victim\'s call: it still runs, exactly once', async () => {
    const squatted = 'victim-submission-1';
    // The attacker publishes first, on its own subject, under the id the victim will use.
    const ack = await publishSubmission(jetstream(mallory), newSubmission(t.subjects, 'globex', 'mallory', { tool: 'sink.write', version: 1, taskId: 'x', input: {} }, squatted));
    expect(ack.duplicate).toBe(false);
    const victim = await createTools({ servers: t.url, tenant: 'acme', actor: 'alice', nkeyFile: t.agentSeed('acme', 'alice'), contracts, prefix: t.subjects.prefix, receiptKeys: t.auth.receiptKeysFile, submissionIdFactory: () => squatted });
    try {
      const r = await victim.execute({ tool: 'sink.write', taskId: 'fm31-squat', input: note('Squat') });
      expect(r.status).toBe('committed');
      expect(sink.writesFor((b) => b.key === downstreamKeyOf('acme', r.operationKey!))).toHaveLength(1);
      if (r.status === 'committed') expect(r.receipt.attempt).toBe(1);
    } finally {
      await victim.close();
    }
  });

  it('sending the victim\'s derived key from another tenant touches nothing of the victim', async () => {
    const input = note('Victim note');
    const victim = await alice.execute({ tool: 'sink.write', taskId: 'fm31-key', input });
    expect(victim.status).toBe('committed');
    const before = await history(t, 'acme', victim.operationKey!);
    const js = jetstream(mallory);
    // (a) the victim's key with the attacker's own input: a conflict in the attacker's own scope.
    await publishSubmission(js, newSubmission(t.subjects, 'globex', 'mallory', { tool: 'sink.write', version: 1, taskId: 'fm31-key', operationKey: victim.operationKey!, input: note('Hijack') }));
    expect((await waitForDecision(t, 'globex', victim.operationKey!)).error.class).toBe('idempotency_conflict');
    // (b) the victim's very request: that is the attacker's own operation, in the attacker's tenant.
    await publishSubmission(js, newSubmission(t.subjects, 'globex', 'mallory', { tool: 'sink.write', version: 1, taskId: 'fm31-key', operationKey: victim.operationKey!, input }));
    for (let i = 0; i < 100 && sink.writesFor((b) => b.key === downstreamKeyOf('globex', victim.operationKey!)).length === 0; i++) await new Promise((r) => setTimeout(r, 50));
    expect(await history(t, 'acme', victim.operationKey!)).toEqual(before);
    expect(sink.writesFor((b) => b.key === downstreamKeyOf('acme', victim.operationKey!))).toHaveLength(1);
    expect(sink.writesFor((b) => b.key === downstreamKeyOf('globex', victim.operationKey!))).toHaveLength(1);
    expect(downstreamKeyOf('globex', victim.operationKey!)).not.toBe(downstreamKeyOf('acme', victim.operationKey!));
  });

  it('status for the victim\'s key from another tenant reveals nothing, and its status subject is refused', async () => {
    const victim = await alice.execute({ tool: 'sink.write', taskId: 'fm31-status', input: note('Status secret') });
    expect(victim.status).toBe('committed');
    const gina = await createTools({ servers: t.url, tenant: 'globex', actor: 'gina', nkeyFile: t.agentSeed('globex', 'gina'), contracts, prefix: t.subjects.prefix, receiptKeys: t.auth.receiptKeysFile });
    try {
      const a = await gina.status({ operationKey: victim.operationKey! });
      expect(a).toMatchObject({ state: 'not_seen', source: 'none', seq: 0 });
      expect(JSON.stringify(a)).not.toContain(victim.status === 'committed' ? victim.receipt.resourceId : '-');
    } finally {
      await gina.close();
    }
    const err = await permissionError(mallory, () => mallory.request(t.subjects.status('acme', 'alice'), encode({ operationKey: victim.operationKey }), { timeout: 1_000 }));
    expect(err.subject).toBe(t.subjects.status('acme', 'alice'));
  });
});

describe('FM-32: reply inboxes are private', () => {
  it('refuses a subscription to another user\'s inbox prefix, or to all inboxes', async () => {
    for (const subject of ['_INBOX.acme.alice.>', '_INBOX.>', '_INBOX._svc.authorizer.>']) {
      const err = await permissionError(mallory, () => mallory.subscribe(subject));
      expect(err.operation).toBe('subscription');
      expect(err.subject).toBe(subject);
    }
  });

  it('an eavesdropper receives nothing of the victim\'s replies', async () => {
    const eve = await t.connectAs(agent('globex', 'gina'));
    const got: string[] = [];
    const refusals: unknown[] = [];
    const sub = eve.subscribe('_INBOX.>', { callback: (e, m) => void (e ? refusals.push(e) : got.push(m.subject)) });
    await eve.flush().catch(() => undefined);
    const r = await alice.execute({ tool: 'sink.write', taskId: 'fm32-eaves', input: note('Eavesdrop') });
    expect(r.status).toBe('committed');
    expect(got).toEqual([]);
    expect(refusals[0]).toBeInstanceOf(errors.PermissionViolationError);
    sub.unsubscribe();
    await eve.close().catch(() => undefined);
  });

  it('a restricted user cannot create a stream or a consumer that captures inboxes or intents', async () => {
    for (const role of [agent('globex', 'mallory'), { kind: 'service' as const, service: 'executor' as const }]) {
      const nc = await t.connectAs(role);
      try {
        const jsm = await jetstreamManager(nc, { checkAPI: false, timeout: 1_000 });
        const s = await permissionError(nc, () => jsm.streams.add({ name: 'SPY', subjects: ['_INBOX.>'] }));
        expect(s.subject).toBe('$JS.API.STREAM.CREATE.SPY');
        const c = await permissionError(nc, () => jsm.consumers.add(t.subjects.intentsStream, { durable_name: 'spy', filter_subject: t.subjects.allIntents, ack_policy: 'explicit' as never }));
        expect(c.subject).toMatch(/^\$JS\.API\.CONSUMER\.(CREATE|DURABLE\.CREATE)\./);
      } finally {
        await nc.close();
      }
    }
    await expect(t.jsm.streams.info('SPY')).rejects.toThrow();
  });
});

describe('ids are one subject token', () => {
  it('the generator refuses wildcard, dotted and empty ids', () => {
    const s = new Subjects('tcheck');
    const base = { subjects: s, topology: topology(s), outDir: '/tmp/tooltx-never-written', listen: '127.0.0.1:-1', storeDir: '/tmp/x' };
    for (const actors of [['>'], ['*'], ['b.c'], [''], ['UPPER']]) {
      expect(() => generateAuth({ tenants: [{ id: 'a', actors }] }, base)).toThrow(/\^\[a-z0-9_-\]\{1,64\}\$/);
    }
    expect(() => generateAuth({ tenants: [{ id: 'a.b', actors: ['c'] }] }, base)).toThrow();
  });

  it('tenant a + actor b.c can never equal tenant a.b + actor c', () => {
    const s = new Subjects('tcheck');
    expect(() => s.intent('a', 'b.c')).toThrow(TypeError);
    expect(() => s.intent('a.b', 'c')).toThrow(TypeError);
    expect(s.parseActorSubject('intent', 'tcheck.intent.a.b.c')).toBeNull();
    expect(s.parseActorSubject('intent', 'tcheck.intent.a.*')).toBeNull();
  });
});
