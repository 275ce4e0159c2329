/**
 * The operation store contract (libs/lifecycle/src/store.ts): what every store guarantees, as one
 * suite that runs against each — the JetStream store on a real nats-server
 * (libs/nats/test/event-store.int.test.ts) and the in-memory store
 * (libs/store-memory/test/event-store.unit.test.ts). A store that passes it can carry the
 * lifecycle: first writer wins, a retried append is the same append, a writer reads back what it
 * wrote, a duplicate answer is believed only when the first copy is still there, and deleting an
 * operation's last event leaves the event before it as the operation's last (as JetStream's
 * `Nats-Expected-Last-Subject-Sequence` is checked against the subject's last stored message).
 * Its other half: a tenant's decisions (their own sequence, deduplicated by event id, the last one
 * per actor) and its intents (read by sequence, deduplicated by submission id, deleted once done
 * with). The duplicate window is read and passed on the store's own clock (`now`,
 * `passDuplicateWindow`): a store on a fake clock never waits, and a case that must stay inside the
 * window says so when it did not.
 */
import { describe, expect, it } from 'vitest';
import { randomUUID } from 'node:crypto';
import {
  ConcurrencyError,
  decide,
  EVENT_SCHEMA_VERSION,
  type AcceptCommand,
  type DecisionRecord,
  type OperationEvent,
  type OperationStore,
} from '@tooltx/lifecycle';

/**
 * The tenants the suite writes for: a store on a server must have their decision and intake
 * streams (`<P>_DECISIONS_<tenant>`, `<P>_INTENTS_<tenant>`) before the suite runs.
 */
export const CONTRACT_TENANTS = ['acme', 'globex'] as const;

/** A store under test, with what the suite needs to look behind it. */
export interface StoreUnderTest {
  store: OperationStore;
  /** Removes the stored event at `seq` (a stream message deletion). */
  deleteEvent(seq: number): Promise<void>;
  /** How many events the operation holds. */
  countEvents(tenant: string, opId: string): Promise<number>;
  /**
   * Stores an intent in the tenant's intake as an agent's publish does (`<p>.intent.<tenant>.<actor>`,
   * the submission id as its msg id); returns its sequence in the intake and the subject it was
   * stored on.
   */
  addIntent(
    tenant: string,
    actor: string,
    data: Uint8Array,
    submissionId?: string,
  ): Promise<{ seq: number; subject: string }>;
  /** The store's duplicate window, ms. */
  duplicateWindowMs: number;
  /** The clock the duplicate window runs on, ms: a fake one for a store that takes one, else the wall clock. */
  now(): number;
  /** Lets the duplicate window pass: a step of a fake clock, or a wait past it on a real server. */
  passDuplicateWindow(): Promise<void>;
}

const D = (c: string) => `sha256:${c.repeat(64)}`;
let ops = 0;
const nextOpId = () => `${(++ops).toString(16).padStart(8, '0')}${randomUUID().replaceAll('-', '').slice(0, 24)}`;

/**
 * An `accepted` event of `sink.write` as the decider makes it (a fresh event id each time), for the
 * store tests: `operationKey` and `at` (ms) default to a fixed key and now.
 */
export function acceptedEvent(o: { operationKey?: string; at?: number } = {}): OperationEvent {
  const cmd: AcceptCommand = {
    type: 'accept',
    eventId: randomUUID(),
    at: o.at ?? Date.now(),
    operationKey: o.operationKey ?? `opk_${'B'.repeat(43)}`,
    tenant: 'acme',
    actor: 'alice',
    taskId: 't',
    tool: 'sink.write',
    version: 1,
    contractDigest: D('1'),
    effect: 'create',
    inputDigest: D('2'),
    targetDigest: D('3'),
    intentSeq: 1,
    submissionId: 's',
  };
  const d = decide(cmd, { status: 'none' });
  if (d.kind !== 'append') throw new Error('expected an append');
  return d.event;
}
const accepted = () => acceptedEvent();

/** `executor`'s `running` on `on` (attempt 1); `at` (ms) defaults to now, its deadline 1 s later. */
export function startedEvent(on: OperationEvent, executor: string, at = Date.now()): OperationEvent {
  const d = decide(
    { type: 'start', eventId: randomUUID(), at, attempt: 1, executor, deadlineAt: at + 1_000 },
    on.state,
  );
  if (d.kind !== 'append') throw new Error('expected an append');
  return d.event;
}
const started = (on: OperationEvent, executor: string) => startedEvent(on, executor);

/** A refusal at intake of `actor`'s submission (a fresh event id each time). */
function refusal(tenant: string, actor: string): DecisionRecord {
  return {
    schema: EVENT_SCHEMA_VERSION,
    type: 'decision',
    eventId: randomUUID(),
    at: Date.now(),
    operationKey: `opk_${'C'.repeat(43)}`,
    tenant,
    actor,
    submissionId: `sub-${randomUUID()}`,
    outcome: 'rejected',
    error: { class: 'forbidden' },
  };
}

const bytes = (s: string) => new TextEncoder().encode(s);
/** The text of an intent's bytes (a store may hand out a Buffer or a plain Uint8Array). */
const text = (b: Uint8Array | undefined) => (b === undefined ? undefined : new TextDecoder().decode(b));

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

    it("answers a retried append (same event id, inside the duplicate window) with the first one's sequence and stores nothing twice", async () => {
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

    it('answers two concurrent appends of the same event (a retry racing its first copy) both with its one sequence', async () => {
      const { store, countEvents } = setup();
      const opId = nextOpId();
      const a = accepted();
      const [s1, s2] = await Promise.all([store.append('acme', opId, a, 0), store.append('acme', opId, a, 0)]);
      expect(s1).toBe(s2);
      expect(await countEvents('acme', opId)).toBe(1);
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

    it('does not take a duplicate answer for an event that is no longer stored as stored (inside the duplicate window)', async () => {
      const { store, deleteEvent, countEvents, now, duplicateWindowMs } = setup();
      const opId = nextOpId();
      const a = accepted();
      const t0 = now();
      const seq = await store.append('acme', opId, a, 0);
      await deleteEvent(seq);
      await expect(store.append('acme', opId, a, 0)).rejects.toBeInstanceOf(ConcurrencyError);
      // Past the window the retry would be a new message, stored: the case is only this one inside it.
      expect(now() - t0, 'the retry ran inside the duplicate window').toBeLessThan(duplicateWindowMs);
      expect(await countEvents('acme', opId)).toBe(0);
      expect((await store.load('acme', opId)).state.status).toBe('none');
    });

    it("falls back to the event before when an operation's last event is deleted: an append expecting the deleted one, or none, is refused; one expecting the one before lands", async () => {
      // Two events, not more: nats-server 2.10 loses an operation's last sequence when the last of
      // three or more is deleted (libs/nats/test/event-store.int.test.ts shows what each version does).
      const { store, deleteEvent, countEvents } = setup();
      const opId = nextOpId();
      const a = accepted();
      const s1 = await store.append('acme', opId, a, 0);
      const s2 = await store.append('acme', opId, started(a, 'x'), s1);
      await deleteEvent(s2);
      expect(await store.load('acme', opId)).toEqual({ state: a.state, seq: s1 });
      await expect(store.append('acme', opId, started(a, 'y'), s2)).rejects.toBeInstanceOf(ConcurrencyError);
      await expect(store.append('acme', opId, started(a, 'z'), 0)).rejects.toBeInstanceOf(ConcurrencyError);
      const w = started(a, 'w');
      const s3 = await store.append('acme', opId, w, s1);
      expect(s3).toBeGreaterThan(s2);
      expect(await store.load('acme', opId)).toEqual({ state: w.state, seq: s3 });
      expect(await countEvents('acme', opId)).toBe(2);
    });

    it('does not take a duplicate answer for an event id another operation squatted: the second operation stays empty and takes a fresh event', async () => {
      const { store, countEvents } = setup();
      const first = nextOpId();
      const second = nextOpId();
      const mine = accepted();
      const s1 = await store.append('acme', first, mine, 0);
      await expect(store.append('acme', second, mine, 0)).rejects.toBeInstanceOf(ConcurrencyError);
      expect(await store.load('acme', second)).toEqual({ state: { status: 'none' }, seq: 0 });
      expect(await countEvents('acme', second)).toBe(0);
      const fresh = accepted();
      const s2 = await store.append('acme', second, fresh, 0);
      expect(await store.load('acme', second)).toEqual({ state: fresh.state, seq: s2 });
      expect(await store.load('acme', first)).toEqual({ state: mine.state, seq: s1 });
      expect(await countEvents('acme', first)).toBe(1);
    });

    it('recognises a retried append after the duplicate window as its own landed append (FM-30)', async () => {
      const { store, countEvents, passDuplicateWindow } = setup();
      const opId = nextOpId();
      const a = accepted();
      const s1 = await store.append('acme', opId, a, 0);
      await passDuplicateWindow();
      expect(await store.append('acme', opId, a, 0)).toBe(s1);
      expect(await countEvents('acme', opId)).toBe(1);
    });
  });

  describe(`operation store contract: ${name}`, () => {
    it("records a decision on its own sequence, never the events': the operation stays empty and the events' sequence does not move", async () => {
      const { store, countEvents } = setup();
      const opId = nextOpId();
      const other = nextOpId();
      const s1 = await store.append('acme', other, accepted(), 0);
      const r = refusal('acme', 'alice');
      const d = await store.recordDecision(r, opId);
      expect(d).toBeGreaterThan(0);
      expect(await store.lastDecision('acme', opId, 'alice')).toEqual(r);
      expect(await store.load('acme', opId)).toEqual({ state: { status: 'none' }, seq: 0 });
      expect(await countEvents('acme', opId)).toBe(0);
      expect(await store.append('acme', other, started(accepted(), 'x'), s1)).toBe(s1 + 1);
      expect(await store.append('acme', opId, accepted(), 0)).toBe(s1 + 2);
    });

    it("keeps each tenant's decisions in its own sequence", async () => {
      const { store } = setup();
      const opId = nextOpId();
      const d1 = await store.recordDecision(refusal('acme', 'alice'), opId);
      await store.recordDecision(refusal('globex', 'alice'), opId);
      await store.recordDecision(refusal('globex', 'alice'), opId);
      expect(await store.recordDecision(refusal('acme', 'alice'), opId)).toBe(d1 + 1);
    });

    it("answers a retried decision (same event id, inside the duplicate window) with the first one's sequence and stores nothing twice", async () => {
      const { store } = setup();
      const opId = nextOpId();
      const r1 = refusal('acme', 'alice');
      const d1 = await store.recordDecision(r1, opId);
      const r2 = refusal('acme', 'alice');
      const d2 = await store.recordDecision(r2, opId);
      expect(await store.recordDecision(r1, opId)).toBe(d1);
      // Had the retry been stored, it would be the newest record, and the next sequence would be one further.
      expect(await store.lastDecision('acme', opId, 'alice')).toEqual(r2);
      expect(await store.recordDecision(refusal('acme', 'alice'), opId)).toBe(d2 + 1);
    });

    it('stores a decision retried after the duplicate window again, as a new record (the window is all that deduplicates)', async () => {
      const { store, passDuplicateWindow } = setup();
      const opId = nextOpId();
      const r1 = refusal('acme', 'alice');
      const d1 = await store.recordDecision(r1, opId);
      const r2 = refusal('acme', 'alice');
      await store.recordDecision(r2, opId);
      await passDuplicateWindow();
      expect(await store.recordDecision(r1, opId)).toBeGreaterThan(d1);
      expect(await store.lastDecision('acme', opId, 'alice')).toEqual(r1);
    });

    it("answers the last decision per tenant, operation and actor: another actor's, operation's or tenant's never hides or stands in for it", async () => {
      const { store } = setup();
      const opId = nextOpId();
      const other = nextOpId();
      const alice1 = refusal('acme', 'alice');
      const alice2 = refusal('acme', 'alice');
      const bob = refusal('acme', 'bob');
      await store.recordDecision(alice1, opId);
      await store.recordDecision(alice2, opId);
      await store.recordDecision(bob, opId);
      await store.recordDecision(refusal('acme', 'alice'), other);
      await store.recordDecision(refusal('globex', 'alice'), opId);
      expect(await store.lastDecision('acme', opId, 'alice')).toEqual(alice2);
      expect(await store.lastDecision('acme', opId, 'bob')).toEqual(bob);
      expect(await store.lastDecision('acme', opId, 'carol')).toBeNull();
      expect(await store.lastDecision('acme', nextOpId(), 'alice')).toBeNull();
    });

    it("answers the newest decision about one of an actor's submissions, behind later records of its other submissions; another actor's or another submission's never stands in for it", async () => {
      const { store } = setup();
      const opId = nextOpId();
      const first = refusal('acme', 'alice');
      const firstAgain = { ...refusal('acme', 'alice'), submissionId: first.submissionId };
      const second = refusal('acme', 'alice');
      const third = refusal('acme', 'alice');
      await store.recordDecision(first, opId);
      await store.recordDecision(refusal('acme', 'bob'), opId);
      await store.recordDecision(firstAgain, opId);
      await store.recordDecision(second, opId);
      await store.recordDecision({ ...refusal('acme', 'bob'), submissionId: second.submissionId }, opId);
      await store.recordDecision(third, opId);
      expect(await store.decisionOf('acme', opId, 'alice', [first.submissionId])).toEqual(firstAgain);
      expect(await store.decisionOf('acme', opId, 'alice', [second.submissionId])).toEqual(second);
      expect(await store.decisionOf('acme', opId, 'alice', [third.submissionId])).toEqual(third);
      expect(await store.decisionOf('acme', opId, 'alice', [first.submissionId, second.submissionId])).toEqual(second);
      expect(await store.decisionOf('acme', opId, 'alice', ['sub-none'])).toBeNull();
      expect(await store.decisionOf('acme', opId, 'carol', [first.submissionId])).toBeNull();
      expect(await store.decisionOf('acme', nextOpId(), 'alice', [first.submissionId])).toBeNull();
    });

    it('hands out a copy of a decision: changing what one read returned does not change the next', async () => {
      const { store } = setup();
      const opId = nextOpId();
      const r = refusal('acme', 'alice');
      await store.recordDecision(r, opId);
      const read = await store.lastDecision('acme', opId, 'alice');
      if (!read) throw new Error('expected the decision');
      read.actor = 'mallory';
      expect(await store.lastDecision('acme', opId, 'alice')).toEqual(r);
    });

    it("reads an intent by its sequence in the tenant's intake: its subject, bytes and submission id; a copy each time", async () => {
      const { store, addIntent } = setup();
      const submissionId = `sub-${randomUUID()}`;
      const { seq, subject } = await addIntent('acme', 'alice', bytes('the intent'), submissionId);
      const read = await store.readIntent('acme', seq);
      if (!read) throw new Error('expected the intent');
      expect({ ...read, data: text(read.data) }).toEqual({ seq, subject, data: 'the intent', submissionId });
      read.data[0] = 0;
      expect(text((await store.readIntent('acme', seq))?.data)).toBe('the intent');
      const bare = await addIntent('acme', 'bob', bytes('no submission id'));
      const back = await store.readIntent('acme', bare.seq);
      expect(back && { ...back, data: text(back.data) }).toEqual({
        seq: bare.seq,
        subject: bare.subject,
        data: 'no submission id',
        submissionId: undefined,
      });
      expect(await store.readIntent('acme', bare.seq + 1_000)).toBeNull();
    });

    it("keeps each tenant's intents in its own intake and sequence", async () => {
      const { store, addIntent } = setup();
      const a1 = await addIntent('acme', 'alice', bytes('acme 1'), `sub-${randomUUID()}`);
      const g = await addIntent('globex', 'alice', bytes('globex'), `sub-${randomUUID()}`);
      const a2 = await addIntent('acme', 'alice', bytes('acme 2'), `sub-${randomUUID()}`);
      expect(a2.seq).toBe(a1.seq + 1);
      expect(text((await store.readIntent('globex', g.seq))?.data)).toBe('globex');
      expect(text((await store.readIntent('globex', a2.seq))?.data)).not.toBe('acme 2');
    });

    it("answers an intent resubmitted inside the duplicate window (same submission id) with the first one's sequence, even once that one is deleted, and stores nothing", async () => {
      const { store, addIntent } = setup();
      const id = `sub-${randomUUID()}`;
      const first = await addIntent('acme', 'alice', bytes('first'), id);
      expect((await addIntent('acme', 'alice', bytes('again'), id)).seq).toBe(first.seq);
      expect(text((await store.readIntent('acme', first.seq))?.data)).toBe('first');
      await store.deleteIntent('acme', first.seq);
      expect((await addIntent('acme', 'alice', bytes('once more'), id)).seq).toBe(first.seq);
      expect(await store.readIntent('acme', first.seq)).toBeNull();
      const next = await addIntent('acme', 'alice', bytes('next'), `sub-${randomUUID()}`);
      expect(next.seq).toBe(first.seq + 1);
    });

    it('deletes an intent: it reads as null after, the others stay, and deleting one never stored is fine', async () => {
      const { store, addIntent } = setup();
      const kept = await addIntent('acme', 'alice', bytes('kept'), `sub-${randomUUID()}`);
      const gone = await addIntent('acme', 'alice', bytes('refused'), `sub-${randomUUID()}`);
      await store.deleteIntent('acme', gone.seq);
      expect(await store.readIntent('acme', gone.seq)).toBeNull();
      // A delete retried after its answer was lost: the intent is already gone, which is fine.
      await store.deleteIntent('acme', gone.seq);
      await store.deleteIntent('acme', gone.seq + 1_000);
      expect(text((await store.readIntent('acme', kept.seq))?.data)).toBe('kept');
    });
  });
}
