/**
 * What the in-memory store does beyond the operation store contract (test/contracts/event-store.ts):
 * appends that really race, the duplicate windows forgotten as they pass, the events' max age, and
 * a deletion of the last of three events (nats-server 2.11+'s fallback; 2.10's differs, see
 * libs/nats/test/event-store.int.test.ts). All on a fake clock.
 */
import { randomUUID } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { ConcurrencyError, EVENT_SCHEMA_VERSION, type DecisionRecord, type OperationEvent } from '@tooltx/lifecycle';
import { MemoryStore } from '@tooltx/store-memory';
import { acceptedEvent, startedEvent } from '../../../test/contracts/event-store.js';

const accepted = () => acceptedEvent({ at: 1 });
const started = (on: OperationEvent, executor: string) => startedEvent(on, executor, 2);

function refusal(): DecisionRecord {
  return {
    schema: EVENT_SCHEMA_VERSION,
    type: 'decision',
    eventId: randomUUID(),
    at: 1,
    operationKey: `opk_${'C'.repeat(43)}`,
    tenant: 'acme',
    actor: 'alice',
    submissionId: 's',
    outcome: 'rejected',
    error: { class: 'forbidden' },
  };
}

function fakeClock() {
  const c = { t: 1_700_000_000_000, now: () => c.t };
  return c;
}

describe('the in-memory store: racing appends', () => {
  it('lets ten concurrent first appends all reach the check before any of them writes; exactly one wins', async () => {
    let arrived = 0;
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    const store = new MemoryStore({
      beforeAppend: async () => {
        arrived++;
        await gate;
      },
    });
    const pending = Promise.allSettled(Array.from({ length: 10 }, () => store.append('acme', 'op1', accepted(), 0)));
    while (arrived < 10) await new Promise((r) => setImmediate(r));
    expect(await store.load('acme', 'op1')).toEqual({ state: { status: 'none' }, seq: 0 });
    release();
    const results = await pending;
    expect(results.filter((r) => r.status === 'fulfilled')).toHaveLength(1);
    for (const r of results) if (r.status === 'rejected') expect(r.reason).toBeInstanceOf(ConcurrencyError);
    expect(store.history('acme', 'op1')).toHaveLength(1);
  });

  it('lets the writer released first win when two writers decided on the same load, whichever started first', async () => {
    const held = new Map<string, () => void>();
    const store = new MemoryStore({ beforeAppend: (_t, _o, e) => new Promise<void>((r) => held.set(e.eventId, r)) });
    const until = async (...ids: string[]) => {
      while (!ids.every((id) => held.has(id))) await new Promise((r) => setImmediate(r));
    };
    const a = accepted();
    const pa = store.append('acme', 'op2', a, 0);
    await until(a.eventId);
    held.get(a.eventId)!();
    const s1 = await pa;
    const ex = started(a, 'x');
    const ey = started(a, 'y');
    const x = store.append('acme', 'op2', ex, s1);
    const y = store.append('acme', 'op2', ey, s1);
    await until(ex.eventId, ey.eventId);
    held.get(ey.eventId)!();
    const sy = await y;
    held.get(ex.eventId)!();
    await expect(x).rejects.toBeInstanceOf(ConcurrencyError);
    expect(await store.load('acme', 'op2')).toEqual({ state: ey.state, seq: sy });
  });

  it('without a hook still yields once before the check: an append just started is not yet visible to a load', async () => {
    const store = new MemoryStore();
    const p = store.append('acme', 'op3', accepted(), 0);
    expect(await store.load('acme', 'op3')).toEqual({ state: { status: 'none' }, seq: 0 });
    const seq = await p;
    expect((await store.load('acme', 'op3')).seq).toBe(seq);
  });
});

describe('the in-memory store: windows and ages', () => {
  it('forgets the message ids of every stream once they are older than the duplicate window (on the next write)', async () => {
    const clock = fakeClock();
    const store = new MemoryStore({ duplicateWindowMs: 1_000, now: clock.now });
    for (let i = 0; i < 5; i++) await store.append('acme', `op${i}`, accepted(), 0);
    await store.recordDecision(refusal(), 'op0');
    store.addIntent('acme', 'p.intent.acme.alice', new Uint8Array([1]), 'sub-1');
    expect(store.rememberedIds()).toBe(7);
    clock.t += 500;
    await store.append('acme', 'op5', accepted(), 0);
    expect(store.rememberedIds()).toBe(8);
    clock.t += 600;
    await store.append('acme', 'op6', accepted(), 0);
    await store.recordDecision(refusal(), 'op0');
    store.addIntent('acme', 'p.intent.acme.alice', new Uint8Array([1]), 'sub-2');
    // Left: op5's (500 ms old) and the three just written.
    expect(store.rememberedIds()).toBe(4);
  });

  it('drops events older than maxAgeMs: an operation whose events all expired loads as none and takes a first append again', async () => {
    const clock = fakeClock();
    const store = new MemoryStore({ duplicateWindowMs: 100, maxAgeMs: 10_000, now: clock.now });
    const a = accepted();
    const s1 = await store.append('acme', 'op1', a, 0);
    clock.t += 6_000;
    const x = started(a, 'x');
    const s2 = await store.append('acme', 'op1', x, s1);
    clock.t += 5_000;
    // The first event is gone; the operation's last is still there.
    expect(store.history('acme', 'op1')).toEqual([x]);
    expect(await store.load('acme', 'op1')).toEqual({ state: x.state, seq: s2 });
    clock.t += 5_000;
    expect(await store.load('acme', 'op1')).toEqual({ state: { status: 'none' }, seq: 0 });
    expect(store.history('acme', 'op1')).toEqual([]);
    expect(await store.append('acme', 'op1', accepted(), 0)).toBeGreaterThan(s2);
  });

  it('keeps events for ever without maxAgeMs', async () => {
    const clock = fakeClock();
    const store = new MemoryStore({ now: clock.now });
    const a = accepted();
    const s1 = await store.append('acme', 'op1', a, 0);
    clock.t += 365 * 24 * 3_600_000;
    expect(await store.load('acme', 'op1')).toEqual({ state: a.state, seq: s1 });
  });
});

describe('the in-memory store: deletions', () => {
  it('falls back to the second event when the last of three is deleted (as nats-server 2.11 and later do)', async () => {
    const store = new MemoryStore();
    const a = accepted();
    const s1 = await store.append('acme', 'op1', a, 0);
    const x = started(a, 'x');
    const s2 = await store.append('acme', 'op1', x, s1);
    const s3 = await store.append('acme', 'op1', started(a, 'y'), s2);
    store.deleteEvent(s3);
    expect(await store.load('acme', 'op1')).toEqual({ state: x.state, seq: s2 });
    await expect(store.append('acme', 'op1', started(a, 'z'), s3)).rejects.toBeInstanceOf(ConcurrencyError);
    await expect(store.append('acme', 'op1', accepted(), 0)).rejects.toBeInstanceOf(ConcurrencyError);
    expect(await store.append('acme', 'op1', started(a, 'w'), s2)).toBeGreaterThan(s3);
  });

  it('keeps what it stored apart from what it was given and what it handed out', async () => {
    const store = new MemoryStore();
    const data = new Uint8Array([1, 2, 3]);
    const seq = store.addIntent('acme', 'p.intent.acme.alice', data, 'sub-1');
    data[0] = 9;
    expect((await store.readIntent('acme', seq))?.data).toEqual(new Uint8Array([1, 2, 3]));
  });
});
