/**
 * The nats.js hooks of libs/nats/src/client-patches.ts on a real, auth'ed nats-server: commands
 * written once per event-loop turn keep their order and arrive complete — across many concurrent
 * publishes and requests, the 32 KiB inline flush, a kill -9 and restart of the server (FM-28: the
 * new socket after the reconnect), `drain()` and `close()`; requests answered without the per-answer
 * Error still resolve and fail as upstream. Socket writes are counted on the connection's real
 * socket (a pass-through wrapper), never replaced.
 */
import type { Socket } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RetentionPolicy, StorageType, type PubAck } from '@nats-io/jetstream';
import { applyClientPatches, clientPatchesOf, type NatsConnection } from '@tooltx/nats';
import { provisioned, type TestNats } from '../../../test/helpers/nats.js';
import { readStream } from '../../../test/helpers/streams.js';

const TE = new TextEncoder();
const TD = new TextDecoder();
let t: TestNats;
let stream: string;
let subjectRoot: string;
let run = 0;

/** The connection's current socket (nats-core ProtocolHandler → NodeTransport; replaced on reconnect). */
const socketOf = (nc: NatsConnection) =>
  (nc as unknown as { protocol: { transport: { socket: Socket } } }).protocol.transport.socket;

/** Counts the writes on `nc`'s current socket that carry PUB/HPUB commands (the socket itself still writes). */
function countPubWrites(nc: NatsConnection) {
  const sock = socketOf(nc);
  const write = sock.write;
  const counter = { sock, n: 0, restore: () => void (sock.write = write) };
  sock.write = function (this: Socket, chunk: unknown, ...rest: unknown[]) {
    const head = typeof chunk === 'string' ? chunk.slice(0, 4) : TD.decode((chunk as Uint8Array).subarray(0, 4));
    if (head.startsWith('PUB ') || head === 'HPUB') counter.n++;
    return (write as (...a: unknown[]) => boolean).call(this, chunk, ...rest);
  } as Socket['write'];
  return counter;
}

/** A fresh subject per test; the stream captures `<root>.>`. */
const nextSubject = () => `${subjectRoot}.r${++run}`;
const body = (i: number, size = 0) => TE.encode(JSON.stringify({ i, pad: 'x'.repeat(size) }));
const indexOf = (data: Uint8Array) => (JSON.parse(TD.decode(data)) as { i: number }).i;
const turn = () => new Promise<void>((r) => setImmediate(r));

/** The indexes stored on `subject`, in stream order. */
async function storedOn(subject: string): Promise<number[]> {
  return (await readStream(t, stream)).filter((m) => m.subject === subject).map((m) => indexOf(m.data));
}

/** Waits until `subject` holds `n` messages (JetStream stores after the server read them); throws after 20 s. */
async function untilStored(subject: string, n: number): Promise<void> {
  let stored = 0;
  for (const deadline = Date.now() + 20_000; Date.now() < deadline; await new Promise((r) => setTimeout(r, 50))) {
    const info = await t.jsm.streams.info(stream, { subjects_filter: subject });
    stored = info.state.subjects?.[subject] ?? 0;
    if (stored >= n) return;
  }
  throw new Error(`${subject}: ${stored} of ${n} messages stored`);
}

/**
 * Publishes base..base+n-1 from n separate promise chains (each after i % 7 microtask hops), like n
 * handlers do; resolves, still in the same turn, with the indexes in the order they were published.
 */
async function publishFromChains(nc: NatsConnection, subject: string, n: number, base = 0): Promise<number[]> {
  const order: number[] = [];
  await Promise.all(
    Array.from({ length: n }, async (_, i) => {
      for (let k = 0; k < i % 7; k++) await Promise.resolve();
      nc.publish(subject, body(base + i));
      order.push(base + i);
    }),
  );
  return order;
}

describe('nats.js write coalescing and request hooks (client-patches.ts, real nats-server)', () => {
  beforeAll(async () => {
    t = await provisioned();
    subjectRoot = `${t.subjects.prefix}.coalesce`;
    stream = `${t.subjects.prefix.toUpperCase()}_COALESCE`;
    await t.jsm.streams.add({
      name: stream,
      subjects: [`${subjectRoot}.>`],
      storage: StorageType.File,
      retention: RetentionPolicy.Limits,
      num_replicas: 1,
    });
  });
  afterAll(() => t?.close());

  it('every connectNats connection has both hooks: the pinned nats.js internals are what the module expects', () => {
    expect(clientPatchesOf(t.nc)).toEqual({ coalescedWrites: true, noCancelErrorAfterAnswer: true });
    // Idempotent: a second application changes nothing.
    expect(applyClientPatches(t.nc)).toEqual({ coalescedWrites: true, noCancelErrorAfterAnswer: true });
  });

  it('an object that is not a nats-core connection is left alone, with a TOOLTX_NATS_PATCH warning', async () => {
    // Node's own listener would print the deliberate warning into the suite's output, where it reads
    // like a real problem: it is set aside while this test takes the warning itself.
    const printers = process.listeners('warning');
    process.removeAllListeners('warning');
    try {
      const warned = new Promise<Error>((r) => process.once('warning', r));
      expect(applyClientPatches({} as NatsConnection).coalescedWrites).toBe(false);
      expect(await warned).toMatchObject({ name: 'Warning', code: 'TOOLTX_NATS_PATCH' });
    } finally {
      for (const l of printers) process.on('warning', l);
    }
  });

  it('publishes from 300 concurrent promise chains leave in one socket write and are stored complete, in publish order', async () => {
    const subject = nextSubject();
    const writes = countPubWrites(t.nc);
    try {
      const order = await publishFromChains(t.nc, subject, 300);
      expect(order).not.toEqual([...order].sort((a, b) => a - b)); // the chains interleave
      expect(writes.n).toBe(0); // nothing written while the turn still runs
      await turn();
      expect(writes.n).toBe(1);
      await t.nc.flush();
      await untilStored(subject, 300);
      expect(await storedOn(subject)).toEqual(order);
    } finally {
      writes.restore();
    }
  });

  it('a turn that queues more than 32 KiB writes it inline (pendingLimit) and keeps the order', async () => {
    const subject = nextSubject();
    const writes = countPubWrites(t.nc);
    try {
      for (let i = 0; i < 10; i++) t.nc.publish(subject, body(i, 20_000));
      expect(writes.n).toBeGreaterThanOrEqual(4); // written within the turn, before any immediate ran
      await t.nc.flush();
      await untilStored(subject, 10);
      expect(await storedOn(subject)).toEqual([...Array(10).keys()]);
    } finally {
      writes.restore();
    }
  });

  it('2,000 concurrent JetStream publishes (requests) get each its own PubAck, in publish order, all stored', async () => {
    const subject = nextSubject();
    const acks = await Promise.all(
      Array.from({ length: 2_000 }, (_, i) => t.js.publish(subject, body(i), { msgID: `${subject}-${i}` })),
    );
    // One connection, one FIFO buffer: the server stored them in call order, so the sequences ascend with i.
    for (let i = 1; i < acks.length; i++) expect(acks[i]!.seq).toBe(acks[i - 1]!.seq + 1);
    expect(acks.every((a) => a.duplicate === false)).toBe(true);
    expect(await storedOn(subject)).toEqual([...Array(2_000).keys()]);
  });

  it('a request answered with an error (no responders) still rejects with the upstream RequestError', async () => {
    const err = await t.nc.request(`${subjectRoot}-nobody.here`, body(0), { timeout: 5_000 }).then(
      () => null,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(Error);
    expect((err as Error).name).toBe('RequestError');
    expect((err as { isNoResponders(): boolean }).isNoResponders()).toBe(true);
  });

  it('FM-28: across a kill -9 and restart of nats-server, acked publishes are stored in order, and the new socket is coalesced too', async () => {
    const subject = nextSubject();
    const reconnected = (async () => {
      for await (const s of t.nc.status()) if (s.type === 'reconnect') return;
    })();
    const oldSocket = socketOf(t.nc);
    // A burst in flight when the server dies: each call either gets its PubAck or fails with a NATS error.
    const before = Array.from({ length: 500 }, (_, i) =>
      t.js.publish(subject, body(i), { msgID: `${subject}-${i}`, timeout: 3_000 }),
    );
    await Promise.all(before.slice(0, 50)); // the first acks are in; the rest may be anywhere
    await t.server.restart!();
    await reconnected;
    expect(socketOf(t.nc)).not.toBe(oldSocket);
    const settled = await Promise.allSettled(before);
    for (const s of settled) if (s.status === 'rejected') expect(s.reason).toBeInstanceOf(Error);
    const ackedBefore = settled.flatMap((s, i) => (s.status === 'fulfilled' ? [i] : []));
    expect(ackedBefore.length).toBeGreaterThanOrEqual(50);

    // After the reconnect: one turn's publishes leave in one write on the new socket …
    const writes = countPubWrites(t.nc);
    let order2: number[];
    try {
      expect(writes.sock).not.toBe(oldSocket);
      order2 = await publishFromChains(t.nc, subject, 200, 500);
      await turn();
      expect(writes.n).toBe(1);
    } finally {
      writes.restore();
    }
    // … and concurrent requests are all answered, in order.
    const after: PubAck[] = await Promise.all(
      Array.from({ length: 1_000 }, (_, i) => t.js.publish(subject, body(10_000 + i), { msgID: `${subject}-a${i}` })),
    );
    for (let i = 1; i < after.length; i++) expect(after[i]!.seq).toBe(after[i - 1]!.seq + 1);

    const stored = await storedOn(subject);
    // Order kept throughout: what was stored is ascending within each burst, bursts in sequence.
    const burst1 = stored.filter((i) => i < 500);
    const burst2 = stored.filter((i) => i >= 500 && i < 10_000);
    const burst3 = stored.filter((i) => i >= 10_000);
    expect(stored).toEqual([...burst1, ...burst2, ...burst3]);
    expect(burst1).toEqual([...burst1].sort((a, b) => a - b));
    // Nothing acknowledged was lost (the server was killed, not the machine: docs/durability.md).
    expect(ackedBefore.every((i) => burst1.includes(i))).toBe(true);
    expect(burst2).toEqual(order2);
    expect(burst3).toEqual([...Array(1_000).keys()].map((i) => 10_000 + i));
  });

  it('drain() right after a turn of publishes writes them all before the connection closes', async () => {
    const subject = nextSubject();
    const nc = await t.connectAs({ kind: 'provisioner' });
    const writes = countPubWrites(nc);
    const order = await publishFromChains(nc, subject, 300);
    expect(writes.n).toBe(0); // all pending in the client when drain starts
    await nc.drain();
    await untilStored(subject, 300);
    expect(await storedOn(subject)).toEqual(order);
  });

  it('close() in the same turn as the publishes still writes them (upstream destroyed the socket before its flush)', async () => {
    const subject = nextSubject();
    const nc = await t.connectAs({ kind: 'provisioner' });
    const writes = countPubWrites(nc);
    for (let i = 0; i < 300; i++) nc.publish(subject, body(i));
    expect(writes.n).toBe(0);
    await nc.close();
    await untilStored(subject, 300);
    expect(await storedOn(subject)).toEqual([...Array(300).keys()]);
  });
});
