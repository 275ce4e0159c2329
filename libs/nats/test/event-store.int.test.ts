/**
 * The operation store contract against the JetStream store on a real nats-server: the events
 * stream and the contract tenants' decision and intake streams exactly as provisioned
 * (streams/src/topology.ts), except that the events stream allows deleting a message (the contract
 * deletes one), every stream keeps a 1 s duplicate window (the contract waits past it, on the wall
 * clock) and the tenants' bounds are small (nats-server reserves a stream's `max_bytes` when it is
 * created).
 */
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { nanos } from '@nats-io/nats-core';
import { ConcurrencyError, decide, type OperationEvent } from '@tooltx/lifecycle';
import {
  JetStreamStore,
  jetStreamOf,
  connectNats,
  serverVersionAtLeast,
  Subjects,
  type NatsConnection,
} from '@tooltx/nats';
import { spawnNatsServer, type NatsServerHandle } from '@tooltx/dev/nats-server';
import { DEFAULT_TENANT_LIMITS, topology } from '@tooltx/streams';
import type { JetStreamClient, JetStreamManager } from '@nats-io/jetstream';
import { CONTRACT_TENANTS, eventStoreContract } from '../../../test/contracts/event-store.js';

const WINDOW_MS = 1_000;
const MiB = 1024 * 1024;
const subjects = new Subjects('tcontract');
let server: NatsServerHandle;
let nc: NatsConnection;
let js: JetStreamClient;
let jsm: JetStreamManager;
let store: JetStreamStore;

beforeAll(async () => {
  server = await spawnNatsServer({});
  nc = await connectNats({ servers: server.url, name: 'event-store-contract', reconnectForever: false });
  const j = await jetStreamOf(nc);
  js = j.js;
  jsm = j.jsm;
  const limits = { ...DEFAULT_TENANT_LIMITS, intentBytes: MiB, decisionBytes: MiB };
  const t = topology(subjects, {
    duplicateWindowMs: WINDOW_MS,
    tenants: CONTRACT_TENANTS.map((id) => ({ id, limits })),
  });
  await jsm.streams.add({ ...t.streams.events, deny_delete: false, duplicate_window: nanos(WINDOW_MS) });
  for (const tenant of t.tenants ?? []) {
    await jsm.streams.add(tenant.intents);
    await jsm.streams.add(tenant.decisions);
  }
  store = new JetStreamStore(js, jsm, subjects);
});

afterAll(async () => {
  await nc?.close();
  await server?.stop({ removeStore: true });
});

eventStoreContract('JetStream (nats-server)', () => ({
  store,
  deleteEvent: async (seq) => void (await jsm.streams.deleteMessage(subjects.eventsStream, seq, false)),
  countEvents: async (tenant, opId) => {
    const info = await jsm.streams.info(subjects.eventsStream, { subjects_filter: subjects.op(tenant, opId) });
    return info.state.subjects?.[subjects.op(tenant, opId)] ?? 0;
  },
  addIntent: async (tenant, actor, data, submissionId) => {
    const subject = subjects.intent(tenant, actor);
    const ack = await js.publish(subject, data, submissionId === undefined ? {} : { msgID: submissionId });
    return { seq: ack.seq, subject };
  },
  duplicateWindowMs: WINDOW_MS,
  now: Date.now,
  passDuplicateWindow: () => new Promise((r) => setTimeout(r, WINDOW_MS + 300)),
}));

/**
 * What nats-server does when the last of three events of an operation is deleted — the contract
 * deletes the last of two, which every supported version handles. Measured on 2.10.27 (the
 * project's test server) and 2.15.1, file and memory storage alike: 2.10 loses the subject's last
 * sequence once a deletion leaves two or more of its messages (a last-by-subject get finds nothing,
 * and `Nats-Expected-Last-Subject-Sequence` is checked against 0, so an append expecting none lands
 * on an operation that holds two events); 2.11 and later fall back to the message before, as the
 * in-memory store does. tooltx never deletes an event (the events stream denies delete, and max
 * age removes a subject's oldest messages first), so only a deletion by hand meets it.
 */
describe('deleting the last of three events of an operation (nats-server, by version)', () => {
  const start = (on: OperationEvent, executor: string) => {
    const d = decide(
      { type: 'start', eventId: randomUUID(), at: Date.now(), attempt: 1, executor, deadlineAt: Date.now() + 1_000 },
      on.state,
    );
    if (d.kind !== 'append') throw new Error('expected an append');
    return d.event;
  };
  const accept = () => {
    const d = decide(
      {
        type: 'accept',
        eventId: randomUUID(),
        at: Date.now(),
        operationKey: `opk_${'D'.repeat(43)}`,
        tenant: 'acme',
        actor: 'alice',
        taskId: 't',
        tool: 'sink.write',
        version: 1,
        contractDigest: `sha256:${'1'.repeat(64)}`,
        effect: 'create',
        inputDigest: `sha256:${'2'.repeat(64)}`,
        targetDigest: `sha256:${'3'.repeat(64)}`,
        intentSeq: 1,
        submissionId: 's',
      },
      { status: 'none' },
    );
    if (d.kind !== 'append') throw new Error('expected an append');
    return d.event;
  };

  it('falls back to the event before on 2.11 and later; on 2.10 the operation looks empty and an append expecting none lands', async () => {
    const version = nc.info?.version ?? '';
    const opId = randomUUID().replaceAll('-', '');
    const a = accept();
    const s1 = await store.append('acme', opId, a, 0);
    const x = start(a, 'x');
    const s2 = await store.append('acme', opId, x, s1);
    const s3 = await store.append('acme', opId, start(a, 'y'), s2);
    await jsm.streams.deleteMessage(subjects.eventsStream, s3, false);
    await expect(store.append('acme', opId, start(a, 'z'), s3)).rejects.toBeInstanceOf(ConcurrencyError);
    if (serverVersionAtLeast(version, '2.11.0')) {
      expect(await store.load('acme', opId)).toEqual({ state: x.state, seq: s2 });
      await expect(store.append('acme', opId, accept(), 0)).rejects.toBeInstanceOf(ConcurrencyError);
      expect(await store.append('acme', opId, start(a, 'w'), s2)).toBeGreaterThan(s3);
    } else {
      expect(await store.load('acme', opId)).toEqual({ state: { status: 'none' }, seq: 0 });
      await expect(store.append('acme', opId, start(a, 'w'), s2)).rejects.toBeInstanceOf(ConcurrencyError);
      expect(await store.append('acme', opId, accept(), 0)).toBeGreaterThan(s3);
    }
  });
});
