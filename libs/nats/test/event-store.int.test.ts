/**
 * The event store contract against the JetStream store on a real nats-server: the events stream
 * exactly as provisioned, except that it allows deleting a message (the contract deletes one) and
 * keeps a 1 s duplicate window (the contract waits past it once).
 */
import { afterAll, beforeAll } from 'vitest';
import { nanos } from '@nats-io/nats-core';
import { JetStreamStore, jetStreamOf, connectNats, Subjects, type NatsConnection } from '@tooltx/nats';
import { spawnNatsServer, type NatsServerHandle } from '@tooltx/dev/nats-server';
import { topology } from '@tooltx/streams';
import type { JetStreamManager } from '@nats-io/jetstream';
import { eventStoreContract } from '../../../test/contracts/event-store.js';

const subjects = new Subjects('tcontract');
let server: NatsServerHandle;
let nc: NatsConnection;
let jsm: JetStreamManager;
let store: JetStreamStore;

beforeAll(async () => {
  server = await spawnNatsServer({});
  nc = await connectNats({ servers: server.url, name: 'event-store-contract', reconnectForever: false });
  const j = await jetStreamOf(nc);
  jsm = j.jsm;
  await jsm.streams.add({ ...topology(subjects).streams.events, deny_delete: false, duplicate_window: nanos(1_000) });
  store = new JetStreamStore(j.js, jsm, subjects);
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
  duplicateWindowMs: 1_000,
}));
