/**
 * Where request/reply services may answer (FM-32, and docs/performance.md "nats-server CPU growing
 * with calls"): the generated configuration gives no user nats-server's `allow_responses` — the
 * server kept every JetStream delivery to such a user for 2 minutes and scanned them all on each
 * delivery — and the status service answers into its requester's inbox through an explicit
 * allow-list, never into a subject a requester names outside the requesters' inboxes (with
 * `allow_responses` it could be made to publish into another service's reply inbox). Real
 * nats-server with auth on, the authorizer as a process.
 */
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { NatsConnection } from '@nats-io/transport-node';
import { operationIdOf, prepareCall } from '@tooltx/contracts';
import { decode, encode } from '@tooltx/nats';
import { newSubmission, publishSubmission } from '@tooltx/client';
import { z } from 'zod';
import { provisioned, TEST_IDENTITIES, type TestNats } from './helpers/nats.js';
import { startService, type ServiceProcess } from './helpers/services.js';
import { Sink } from './helpers/sink.js';
import { history, waitForOperation } from './helpers/ops.js';
import { sinkWrite } from './fixtures/sink-tools.js';

let t: TestNats;
let sink: Sink;
let authorizer: ServiceProcess;
let mallory: NatsConnection;
let executorUser: NatsConnection;

const answerSchema = z.object({ state: z.string() }).loose();
const key = prepareCall(sinkWrite, 'fm32-replies', {
  bucket: 'kb-main',
  title: 'Never submitted',
  body: 'x',
  at: '2026-11-30T06:00:00Z',
}).operationKey;

beforeAll(async () => {
  t = await provisioned({}, undefined, {
    identities: { ...TEST_IDENTITIES, operators: ['oscar', { id: 'olga', may: ['compensate'] }] },
  });
  sink = await new Sink().start();
  authorizer = await startService('authorizer', { ...t.env, SINK_URL: sink.url });
  mallory = await t.connectAs({ kind: 'agent', tenant: 'globex', actor: 'mallory' });
  executorUser = await t.connectAs({ kind: 'service', service: 'executor' });
});

afterAll(async () => {
  await mallory?.close();
  await executorUser?.close();
  expect(await authorizer?.stop()).toBe(0);
  await sink?.stop();
  await t?.close();
});

describe("FM-32: services answer only into their requesters' inboxes", () => {
  it("the generated configuration gives no user allow_responses; agents and auditors live in their tenant's account, operators in their own; responders answer only on the server's response subjects", () => {
    const config = readFileSync(t.auth.configFile, 'utf8');
    expect(config).not.toContain('allow_responses');
    const userLine = (name: string) =>
      config.split('\n').find((_l, i, all) => all[i - 1]?.trim() === `# ${name}`) ?? '';
    // The executor answers operators' debug requests (docs/debug-samples.md).
    for (const responder of ['service.authorizer', 'service.audit-projector', 'service.reconciler', 'service.executor'])
      expect(userLine(responder)).toContain('"_R_.>"');
    expect(userLine('service.authorizer')).not.toMatch(/_INBOX\.(acme|globex|initech|_op)\./);
    // Which account each user is in: the block that holds its line.
    const accountOf = (name: string) => {
      const lines = config.split('\n');
      const at = lines.findIndex((l) => l.trim() === `# ${name}`);
      for (let i = at; i >= 0; i--) {
        const m = /^ {2}"([^"]+)": \{$/.exec(lines[i]!);
        if (m) return m[1];
      }
      return null;
    };
    expect(accountOf('service.authorizer')).toBe('TOOLTX');
    expect(accountOf('provisioner')).toBe('TOOLTX');
    expect(accountOf('agent.globex.mallory')).toBe('TENANT_globex');
    expect(accountOf('agent.acme.alice')).toBe('TENANT_acme');
    expect(accountOf('auditor.acme.audrey')).toBe('TENANT_acme');
    expect(accountOf('operator.oscar')).toBe('OPERATOR_oscar');
    expect(accountOf('operator.olga')).toBe('OPERATOR_olga');
  });

  it("a status request is answered in the requester's inbox, and a reply subject in another service's inbox gets nothing", async () => {
    const spied: string[] = [];
    const spy = executorUser.subscribe('_INBOX._svc.executor.fm32', {
      callback: (err, m) => void (err ? undefined : spied.push(m.subject)),
    });
    await executorUser.flush();
    const status = t.subjects.status('globex', 'mallory');
    for (let i = 0; i < 3; i++)
      mallory.publish(status, encode({ operationKey: key }), { reply: '_INBOX._svc.executor.fm32' });
    // Sent after the forged ones, on the same connection: answered in mallory's own inbox.
    const m = await mallory.request(status, encode({ operationKey: key }), { timeout: 10_000 });
    expect(decode(answerSchema, m.data).state).toBe('not_seen');
    await new Promise((r) => setTimeout(r, 1_000));
    await executorUser.flush();
    expect(spied).toEqual([]);
    spy.unsubscribe();
  });

  it("an operator's request whose reply subject is another operator's inbox: the answer never reaches that operator, and the requester still gets its own", async () => {
    const olga = await t.connectAs({ kind: 'operator', operator: 'olga' });
    const oscar = await t.connectAs({ kind: 'operator', operator: 'oscar' });
    try {
      const spied: string[] = [];
      const spy = oscar.subscribe('_INBOX._op.oscar.>', {
        callback: (err, m) => void (err ? undefined : spied.push(m.subject)),
      });
      await oscar.flush();
      const subject = t.subjects.opsCompensate('olga');
      for (let i = 0; i < 3; i++) olga.publish(subject, JSON.stringify({}), { reply: '_INBOX._op.oscar.spy' });
      // Sent after the forged ones, on the same connection: answered in olga's own inbox.
      const m = await olga.request(subject, JSON.stringify({}), { timeout: 10_000 });
      expect(JSON.parse(m.string())).toMatchObject({ status: 'rejected', error: { class: 'invalid_input' } });
      await new Promise((r) => setTimeout(r, 1_000));
      await oscar.flush();
      expect(spied).toEqual([]);
      spy.unsubscribe();
    } finally {
      await Promise.all([olga.close(), oscar.close()]);
    }
  });

  it("FM-31: a status request whose reply subject is another tenant's operation subject writes nothing into that tenant's event log", async () => {
    const victimKey = prepareCall(sinkWrite, 'fm31-reply', {
      bucket: 'kb-main',
      title: 'Victim',
      body: 'x',
      at: '2026-11-30T06:00:00Z',
    }).operationKey;
    const victimSubject = t.subjects.op('acme', operationIdOf(victimKey));
    const status = t.subjects.status('globex', 'mallory');
    for (let i = 0; i < 3; i++) mallory.publish(status, encode({ operationKey: key }), { reply: victimSubject });
    const m = await mallory.request(status, encode({ operationKey: key }), { timeout: 10_000 });
    expect(decode(answerSchema, m.data).state).toBe('not_seen');
    await new Promise((r) => setTimeout(r, 1_000));
    expect(await history(t, 'acme', victimKey)).toEqual([]);
  });

  it("FM-31: an intent published with another tenant's subjects as its reply subject: the server's PubAck lands in none of them — the victim's operation, KV entries and intents stay as they were", async () => {
    // acme/alice registers an operation (only the authorizer runs here: it stays accepted).
    const input = { bucket: 'kb-main', title: 'Victim op', body: 'x', at: '2026-11-30T06:00:00Z' };
    const victimKey = prepareCall(sinkWrite, 'fm31-ack', input).operationKey;
    const opId = operationIdOf(victimKey);
    await publishSubmission(
      t.js,
      newSubmission(t.subjects, 'acme', 'alice', {
        tool: 'sink.write',
        version: 1,
        taskId: 'fm31-ack',
        operationKey: victimKey,
        input,
      }),
    );
    await waitForOperation(t, 'acme', victimKey, (s) => s.status === 'accepted');
    const intentsBefore = (await t.jsm.streams.info(t.subjects.intentsStream('acme'))).state.messages;
    const targets = [
      t.subjects.op('acme', opId),
      t.subjects.decision('acme', opId, 'alice'),
      ...[t.subjects.resultsBucket, t.subjects.reconcileBucket, t.subjects.auditBucket, t.subjects.tasksBucket].map(
        (b) => `$KV.${b}.acme.${opId}`,
      ),
      t.subjects.intent('acme', 'alice'),
    ];
    // mallory publishes only on its own intent subject (allowed), naming acme's subjects as reply.
    for (const reply of targets)
      mallory.publish(t.subjects.intent('globex', 'mallory'), encode({ junk: true }), { reply });
    await mallory.flush();
    await new Promise((r) => setTimeout(r, 1_000));
    expect((await history(t, 'acme', victimKey)).map((e) => e.type)).toEqual(['accepted']);
    expect((await t.store.load('acme', opId)).state.status).toBe('accepted');
    expect(await t.store.lastDecision('acme', opId, 'alice')).toBeNull();
    for (const b of [
      t.subjects.resultsBucket,
      t.subjects.reconcileBucket,
      t.subjects.auditBucket,
      t.subjects.tasksBucket,
    ]) {
      await expect(t.jsm.direct.getMessage(`KV_${b}`, { last_by_subj: `$KV.${b}.acme.${opId}` })).resolves.toBeNull();
    }
    // Mallory's junk went to its own tenant's intake (refused there); nothing landed in acme's.
    const intents = await t.jsm.streams.info(t.subjects.intentsStream('acme'), {
      subjects_filter: t.subjects.intent('acme', 'alice'),
    });
    expect(intents.state.subjects?.[t.subjects.intent('acme', 'alice')]).toBe(1);
    expect((await t.jsm.streams.info(t.subjects.intentsStream('acme'))).state.messages).toBe(intentsBefore);
  });
});
