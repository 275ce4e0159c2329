/**
 * The event store contract (libs/lifecycle/src/store.ts): what every store guarantees, as one suite
 * that runs against each — the JetStream store on a real nats-server and the in-memory store. A
 * store that passes it can carry the lifecycle: first writer wins, a retried append is the same
 * append, a writer reads back what it wrote, and a duplicate answer is believed only when the first
 * copy is still there.
 */
import { describe, expect, it } from 'vitest';
import { randomUUID } from 'node:crypto';
import { ConcurrencyError, decide, type AcceptCommand, type EventStore, type OperationEvent } from '@tooltx/lifecycle';

/** A store under test, with what the suite needs to look behind it. */
export interface StoreUnderTest {
  store: EventStore;
  /** Removes the stored event at `seq` (a stream message deletion). */
  deleteEvent(seq: number): Promise<void>;
  /** How many events the operation holds. */
  countEvents(tenant: string, opId: string): Promise<number>;
  /** The store's duplicate window, ms (the suite waits past it once). */
  duplicateWindowMs: number;
}

const D = (c: string) => `sha256:${c.repeat(64)}`;
let ops = 0;
const nextOpId = () => `${(++ops).toString(16).padStart(8, '0')}${randomUUID().replaceAll('-', '').slice(0, 24)}`;

function accepted(): OperationEvent {
  const cmd: AcceptCommand = {
    type: 'accept', eventId: randomUUID(), at: Date.now(), operationKey: `opk_${'B'.repeat(43)}`, tenant: 'acme', actor: 'alice',
    taskId: 't', tool: 'sink.write', version: 1, contractDigest: D('1'), effect: 'create', inputDigest: D('2'), targetDigest: D('3'),
    intentSeq: 1, submissionId: 's',
  };
  const d = decide(cmd, { status: 'none' });
  if (d.kind !== 'append') throw new Error('expected an append');
  return d.event;
}

function started(on: OperationEvent, executor: string): OperationEvent {
  const d = decide({ type: 'start', eventId: randomUUID(), at: Date.now(), attempt: 1, executor, deadlineAt: Date.now() + 1_000 }, on.state);
  if (d.kind !== 'append') throw new Error('expected an append');
  return d.event;
}

export function eventStoreContract(name: string, setup: () => StoreUnderTest): void {
  describe(`event store contract: ${name}`, () => {
    it('refuses an append with the wrong expected sequence (ConcurrencyError; on JetStream error 10071)', async () => {
      const { store, countEvents } = setup();
      const opId = nextOpId();
      const a = accepted();
      const seq = await store.append('acme', opId, a, 0);
      await store.append('acme', opId, started(a, 'x'), seq);
      await expect(store.append('acme', opId, started(a, 'y'), seq)).rejects.toBeInstanceOf(ConcurrencyError);
      await expect(store.append('acme', nextOpId(), accepted(), 5)).rejects.toBeInstanceOf(ConcurrencyError);
      expect(await countEvents('acme', opId)).toBe(2);
    });

    it('answers a retried append (same event id, inside the duplicate window) with the first one\'s sequence and stores nothing twice', async () => {
      const { store, countEvents } = setup();
      const opId = nextOpId();
      const a = accepted();
      const s1 = await store.append('acme', opId, a, 0);
      expect(await store.append('acme', opId, a, 0)).toBe(s1);
      expect(await countEvents('acme', opId)).toBe(1);
      const loaded = await store.load('acme', opId);
      expect(loaded.seq).toBe(s1);
    });

    it('lets exactly one of ten concurrent first appends on one operation win; the nine others get ConcurrencyError', async () => {
      const { store, countEvents } = setup();
      const opId = nextOpId();
      const events = Array.from({ length: 10 }, () => accepted());
      const results = await Promise.allSettled(events.map((e) => store.append('acme', opId, e, 0)));
      const won = results.flatMap((r, i) => (r.status === 'fulfilled' ? [{ seq: r.value, event: events[i]! }] : []));
      expect(won).toHaveLength(1);
      for (const r of results) if (r.status === 'rejected') expect(r.reason).toBeInstanceOf(ConcurrencyError);
      expect(await countEvents('acme', opId)).toBe(1);
      const loaded = await store.load('acme', opId);
      expect(loaded).toEqual({ state: won[0]!.event.state, seq: won[0]!.seq });
    });

    it('lets a writer read back its own append: the state it appended, at the sequence it was told', async () => {
      const { store } = setup();
      const opId = nextOpId();
      expect(await store.load('acme', opId)).toEqual({ state: { status: 'none' }, seq: 0 });
      const a = accepted();
      const s1 = await store.append('acme', opId, a, 0);
      expect(await store.load('acme', opId)).toEqual({ state: a.state, seq: s1 });
      const r = started(a, 'x');
      const s2 = await store.append('acme', opId, r, s1);
      expect(s2).toBeGreaterThan(s1);
      const back = await store.load('acme', opId);
      expect(back).toEqual({ state: r.state, seq: s2 });
      expect(back.state.status !== 'none' && back.state.lastEventId).toBe(r.eventId);
    });

    it('does not take a duplicate answer for an event that is no longer stored as stored', async () => {
      const { store, deleteEvent, countEvents } = setup();
      const opId = nextOpId();
      const a = accepted();
      const seq = await store.append('acme', opId, a, 0);
      await deleteEvent(seq);
      await expect(store.append('acme', opId, a, 0)).rejects.toBeInstanceOf(ConcurrencyError);
      expect(await countEvents('acme', opId)).toBe(0);
      expect((await store.load('acme', opId)).state.status).toBe('none');
    });

    it('does not take a duplicate answer for an event id another operation squatted', async () => {
      const { store } = setup();
      const mine = accepted();
      await store.append('acme', nextOpId(), mine, 0);
      await expect(store.append('acme', nextOpId(), mine, 0)).rejects.toBeInstanceOf(ConcurrencyError);
    });

    it('recognises a retried append after the duplicate window as its own landed append (FM-30)', async () => {
      const { store, countEvents, duplicateWindowMs } = setup();
      const opId = nextOpId();
      const a = accepted();
      const s1 = await store.append('acme', opId, a, 0);
      await new Promise((r) => setTimeout(r, duplicateWindowMs + 300));
      expect(await store.append('acme', opId, a, 0)).toBe(s1);
      expect(await countEvents('acme', opId)).toBe(1);
    });
  });
}
