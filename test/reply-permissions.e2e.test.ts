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
import { z } from 'zod';
import { provisioned, type TestNats } from './helpers/nats.js';
import { startService, type ServiceProcess } from './helpers/services.js';
import { Sink } from './helpers/sink.js';
import { history } from './helpers/ops.js';
import { sinkWrite } from './fixtures/sink-tools.js';

let t: TestNats;
let sink: Sink;
let authorizer: ServiceProcess;
let mallory: NatsConnection;
let executorUser: NatsConnection;

const answerSchema = z.object({ state: z.string() }).loose();
const key = prepareCall(sinkWrite, 'fm32-replies', { bucket: 'kb-main', title: 'Never submitted', body: 'x', at: '2026-11-30T06:00:00Z' }).operationKey;

beforeAll(async () => {
  t = await provisioned();
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

describe('FM-32: services answer only into their requesters\' inboxes', () => {
  it('the generated configuration gives no user allow_responses; each responder lists its requesters\' inboxes', () => {
    const config = readFileSync(t.auth.configFile, 'utf8');
    expect(config).not.toContain('allow_responses');
    const userLine = (name: string) => config.split('\n').find((l, i, all) => all[i - 1]?.trim() === `# ${name}`) ?? '';
    expect(userLine('service.authorizer')).toContain('"_INBOX.globex.mallory.>"');
    expect(userLine('service.authorizer')).not.toContain('"_INBOX.acme.audrey.>"'); // an auditor sends no status requests
    expect(userLine('service.audit-projector')).toContain('"_INBOX.acme.audrey.>"');
    expect(userLine('service.reconciler')).toContain('"_INBOX._op.oscar.>"');
    expect(userLine('service.executor')).not.toMatch(/_INBOX\.(acme|globex|initech|_op)\./);
  });

  it('a status request is answered in the requester\'s inbox, and a reply subject in another service\'s inbox gets nothing', async () => {
    const spied: string[] = [];
    const spy = executorUser.subscribe('_INBOX._svc.executor.fm32', { callback: (err, m) => void (err ? undefined : spied.push(m.subject)) });
    await executorUser.flush();
    const status = t.subjects.status('globex', 'mallory');
    for (let i = 0; i < 3; i++) mallory.publish(status, encode({ operationKey: key }), { reply: '_INBOX._svc.executor.fm32' });
    // Sent after the forged ones, on the same connection: answered in mallory's own inbox.
    const m = await mallory.request(status, encode({ operationKey: key }), { timeout: 10_000 });
    expect(decode(answerSchema, m.data).state).toBe('not_seen');
    await new Promise((r) => setTimeout(r, 1_000));
    await executorUser.flush();
    expect(spied).toEqual([]);
    spy.unsubscribe();
  });

  it('FM-31: a status request whose reply subject is another tenant\'s operation subject is not answered: nothing lands in that tenant\'s event log', async () => {
    const victimKey = prepareCall(sinkWrite, 'fm31-reply', { bucket: 'kb-main', title: 'Victim', body: 'x', at: '2026-11-30T06:00:00Z' }).operationKey;
    const victimSubject = t.subjects.op('acme', operationIdOf(victimKey));
    const status = t.subjects.status('globex', 'mallory');
    // The authorizer may publish on every operation subject; only its own check stops this.
    for (let i = 0; i < 3; i++) mallory.publish(status, encode({ operationKey: key }), { reply: victimSubject });
    const m = await mallory.request(status, encode({ operationKey: key }), { timeout: 10_000 });
    expect(decode(answerSchema, m.data).state).toBe('not_seen');
    await new Promise((r) => setTimeout(r, 1_000));
    expect(await history(t, 'acme', victimKey)).toEqual([]);
    expect(authorizer.lines.filter((l) => String(l.msg).includes('outside the requester')).length).toBeGreaterThanOrEqual(3);
  });
});
