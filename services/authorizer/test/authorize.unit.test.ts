/**
 * The authorizer's intake handler on the in-memory store, with no server: an intent message is
 * handed to it as the tenant's consumer would, and the operation's history and the decision
 * records say what it did. (The same paths on real processes and a real nats-server:
 * test/lifecycle.e2e.test.ts, test/authz.e2e.test.ts, test/takeover.e2e.test.ts.)
 */
import { describe, expect, it } from 'vitest';
import type { JsMsg } from '@nats-io/jetstream';
import { z } from 'zod';
import {
  defineContract,
  defineImplementation,
  ErrorClass,
  operationIdOf,
  prepareCall,
  TooltxError,
  type Implementation,
} from '@tooltx/contracts';
import { handleCommand, keylessRefusalKey } from '@tooltx/lifecycle';
import { encode, Subjects } from '@tooltx/nats';
import { ImplementationRegistry, createLogger } from '@tooltx/runtime';
import { MemoryStore } from '@tooltx/store-memory';
import { authorizeNote, noteWrite, NOTES_POLICY } from '../../../test/fixtures/note-contract.js';
import { intentHandler } from '../src/authorize.js';

const subjects = new Subjects('tunit');
const log = createLogger({ service: 'authorizer', instance: 'unit', level: 'silent' });

const impl = defineImplementation({
  contract: noteWrite,
  policyVersion: NOTES_POLICY,
  async execute() {
    return { resourceId: 'unused', result: {} };
  },
  authorize: authorizeNote,
}) as unknown as Implementation;

let sub = 0;
/** Stores an intent as the tenant's intake would and returns the message its consumer delivers. */
function intent(
  store: MemoryStore,
  o: { actor?: string; taskId?: string; input?: Record<string, unknown>; operationKey?: string } = {},
): { msg: JsMsg; key: string; seq: number; submissionId: string } {
  const actor = o.actor ?? 'alice';
  const taskId = o.taskId ?? 'task-1';
  const input = o.input ?? { title: 'A note', body: 'Its body.' };
  const key = o.operationKey ?? prepareCall(noteWrite, taskId, input).operationKey;
  const subject = subjects.intent('acme', actor);
  const data = encode({ tool: 'note.write', version: 1, taskId, operationKey: key, input });
  const submissionId = `sub-${++sub}`;
  const seq = store.addIntent('acme', subject, data, submissionId);
  const msg = {
    subject,
    data,
    seq,
    info: { deliveryCount: 1 },
    headers: { get: (k: string) => (k === 'Nats-Msg-Id' ? submissionId : '') },
  } as unknown as JsMsg;
  return { msg, key, seq, submissionId };
}

function authorizer(store: MemoryStore, frozen = false) {
  return intentHandler({
    subjects,
    store,
    tools: new ImplementationRegistry([impl]),
    log,
    frozen: { isFrozen: () => frozen },
  });
}

describe('the authorizer on the in-memory store', () => {
  it('FM-01: registers a new key once; the same intent again is a replay that appends nothing', async () => {
    const store = new MemoryStore();
    const a = intent(store);
    await authorizer(store)(a.msg);
    const b = intent(store);
    await authorizer(store)(b.msg);
    const history = store.history('acme', operationIdOf(a.key));
    expect(history.map((e) => e.type)).toEqual(['accepted']);
    expect(history[0]!.state).toMatchObject({
      status: 'accepted',
      actor: 'alice',
      intent: { seq: a.seq, submissionId: a.submissionId },
      authorization: { intake: { decision: 'allow', policyVersion: 'notes@1' } },
    });
  });

  it('FM-03: the same key with another field outside target and intent is refused idempotency_conflict, recorded for the submitter; the operation is untouched', async () => {
    const store = new MemoryStore();
    const a = intent(store);
    await authorizer(store)(a.msg);
    const b = intent(store, { actor: 'bob', input: { title: 'A note', body: 'Its body.', priority: 'high' } });
    expect(b.key).toBe(a.key);
    await authorizer(store)(b.msg);
    expect(store.history('acme', operationIdOf(a.key)).map((e) => e.type)).toEqual(['accepted']);
    expect(await store.lastDecision('acme', operationIdOf(a.key), 'bob')).toMatchObject({
      outcome: 'rejected',
      submissionId: b.submissionId,
      error: { class: ErrorClass.IdempotencyConflict, issues: [{ path: ['input'], code: 'input_differs' }] },
    });
  });

  it("FM-03: a supplied key that is not the request's own is refused at the key, and nothing is registered under it", async () => {
    const store = new MemoryStore();
    const other = prepareCall(noteWrite, 'task-9', { title: 'Other', body: '' }).operationKey;
    const a = intent(store, { operationKey: other });
    await authorizer(store)(a.msg);
    expect(store.history('acme', operationIdOf(other))).toEqual([]);
    expect(await store.lastDecision('acme', operationIdOf(other), 'alice')).toMatchObject({
      error: { class: ErrorClass.IdempotencyConflict },
    });
  });

  it("FM-07: a policy denial registers nothing and is recorded with the denial; the refused intent leaves the tenant's intake", async () => {
    const store = new MemoryStore();
    const a = intent(store, { actor: 'blocked' });
    await authorizer(store)(a.msg);
    expect(store.history('acme', operationIdOf(a.key))).toEqual([]);
    const d = await store.lastDecision('acme', operationIdOf(a.key), 'blocked');
    expect(d).toMatchObject({
      outcome: 'rejected',
      error: { class: 'forbidden' },
      authorization: { decision: 'deny', policyVersion: NOTES_POLICY, reason: 'forbidden' },
    });
    expect(await store.readIntent('acme', a.seq)).toBeNull();
  });

  it('FM-14: a side effect on a frozen task is refused task_frozen before the key is looked up', async () => {
    const store = new MemoryStore();
    const a = intent(store);
    await authorizer(store, true)(a.msg);
    expect(store.history('acme', operationIdOf(a.key))).toEqual([]);
    expect(await store.lastDecision('acme', operationIdOf(a.key), 'alice')).toMatchObject({
      error: { class: 'task_frozen' },
    });
  });

  it('ten submissions of one new key at once register it exactly once', async () => {
    const store = new MemoryStore();
    const msgs = Array.from({ length: 10 }, () => intent(store));
    await Promise.all(msgs.map((m) => authorizer(store)(m.msg)));
    expect(store.history('acme', operationIdOf(msgs[0]!.key)).map((e) => e.type)).toEqual(['accepted']);
  });
});

describe('the authorizer and a held-back contract (docs/compensation.md "Held-back commits")', () => {
  const heldSend = defineContract({
    name: 'note.send',
    version: 1,
    description: 'Send a note, once confirmed.',
    effect: 'send',
    input: z.strictObject({ to: z.string().min(1), body: z.string() }),
    output: z.object({}),
    target: (i) => ({ to: i.to }),
    intent: (i) => ({ body: i.body }),
    key: { scope: 'tenant', retentionMs: 24 * 3600_000 },
    timing: { timeoutMs: 1_000, runningBoundMs: 5_000, unknownDeadlineMs: 60_000 },
    downstream: { honoursKey: false, enforcesDeadline: false },
    confirm: { permission: 'note.confirm', deadlineMs: 60_000 },
  });
  const asked: unknown[] = [];
  const heldImpl = defineImplementation({
    contract: heldSend,
    async execute() {
      return { resourceId: 'unused', result: {} };
    },
    // Eve may not read these operations; nor may an actor the tenant does not list (an operator's
    // token): such a read policy is not asked of an operator's request.
    async authorizeRead(ctx) {
      if (ctx.actor === 'eve' || ctx.actor.startsWith('_op-')) throw new TooltxError(ErrorClass.Forbidden, 'no');
    },
    // Grants note.confirm to the drafter only; an operator's request holds the grant instead.
    async authorize(_input, ctx) {
      if (ctx.confirms) asked.push(ctx.confirms);
      if (ctx.confirms && ctx.confirms.requestedBy?.kind !== 'operator' && ctx.actor !== ctx.confirms.owner)
        throw new TooltxError(ErrorClass.Forbidden, 'no');
    },
  }) as unknown as Implementation;
  const input = { to: 'ops', body: 'Hello' };
  const key = prepareCall(heldSend, 'task-h', input).operationKey;
  const handler = (store: MemoryStore) =>
    intentHandler({
      subjects,
      store,
      tools: new ImplementationRegistry([impl, heldImpl]),
      log,
      frozen: { isFrozen: () => false },
    });
  const publish = (store: MemoryStore, body: Record<string, unknown>, actor = 'alice') => {
    const subject = subjects.intent('acme', actor);
    const data = encode(body);
    const submissionId = `sub-${++sub}`;
    const seq = store.addIntent('acme', subject, data, submissionId);
    const msg = {
      subject,
      data,
      seq,
      info: { deliveryCount: 1 },
      headers: { get: (k: string) => (k === 'Nats-Msg-Id' ? submissionId : '') },
    } as unknown as JsMsg;
    return { msg, submissionId };
  };
  const refusalOf = (store: MemoryStore, submissionId: string, actor = 'alice') =>
    store.lastDecision('acme', operationIdOf(keylessRefusalKey('acme', submissionId)), actor);
  const hold = async (store: MemoryStore) => {
    const h = handler(store);
    await h(publish(store, { tool: 'note.send', version: 1, taskId: 'task-h', input }).msg);
    const opId = operationIdOf(key);
    const { state, seq } = await store.load('acme', opId);
    await handleCommand(
      store,
      'acme',
      opId,
      () => ({
        type: 'await_confirmation',
        eventId: 'evt-hold-0001',
        at: Date.now(),
        attempt: 1,
        deadlineAt: Date.now() + 60_000,
      }),
      { known: { state, seq } },
    );
    return h;
  };

  it('accepts it alone, awaiting its confirmation; a confirmation while it still prepares is taken again later', async () => {
    const store = new MemoryStore();
    const h = handler(store);
    await h(publish(store, { tool: 'note.send', version: 1, taskId: 'task-h', input }).msg);
    expect(store.history('acme', operationIdOf(key)).map((e) => e.state)).toMatchObject([
      { status: 'accepted', confirmation: {} },
    ]);
    expect(await h(publish(store, { confirms: { operationKey: key } }).msg)).toEqual({ kind: 'nak', delayMs: 500 });
  });

  it('confirms it once for an actor the policy grants the permission; another actor is refused forbidden under its request key', async () => {
    const store = new MemoryStore();
    const h = await hold(store);
    const bob = publish(store, { confirms: { operationKey: key } }, 'bob');
    await h(bob.msg);
    expect(await refusalOf(store, bob.submissionId, 'bob')).toMatchObject({ error: { class: 'forbidden' } });
    expect(asked.at(-1)).toEqual({
      operationKey: key,
      permission: 'note.confirm',
      owner: 'alice',
      action: 'confirm',
      requestedBy: { kind: 'actor', id: 'bob' },
    });
    await h(publish(store, { confirms: { operationKey: key } }).msg);
    await h(publish(store, { confirms: { operationKey: key } }).msg);
    expect(store.history('acme', operationIdOf(key)).map((e) => e.type)).toEqual([
      'accepted',
      'awaiting_confirmation',
      'confirmed',
    ]);
    const late = publish(store, { discards: { operationKey: key } });
    await h(late.msg);
    expect(await refusalOf(store, late.submissionId)).toMatchObject({
      error: { class: 'invalid_input', issues: [{ path: ['discards', 'operationKey'], code: 'already_confirmed' }] },
    });
  });

  it('discards it: rolled back; a confirmation afterwards is refused operation_discarded', async () => {
    const store = new MemoryStore();
    const h = await hold(store);
    await h(publish(store, { discards: { operationKey: key } }).msg);
    const c = publish(store, { confirms: { operationKey: key } });
    await h(c.msg);
    expect(await refusalOf(store, c.submissionId)).toMatchObject({ error: { class: 'operation_discarded' } });
    expect(store.history('acme', operationIdOf(key)).map((e) => e.type)).toEqual([
      'accepted',
      'awaiting_confirmation',
      'discarded',
    ]);
  });

  it("an operator's request (under _op-<operator>, stored by the operator service) is judged as any: the policy is told the operator asks, the event records the operator", async () => {
    const store = new MemoryStore();
    const h = await hold(store);
    await h(publish(store, { confirms: { operationKey: key } }, '_op-carl').msg);
    expect(asked.at(-1)).toEqual({
      operationKey: key,
      permission: 'note.confirm',
      owner: 'alice',
      action: 'confirm',
      requestedBy: { kind: 'operator', id: 'carl' },
    });
    const { state } = await store.load('acme', operationIdOf(key));
    expect(state).toMatchObject({
      actor: 'alice',
      confirmation: { confirmed: { by: { kind: 'operator', id: 'carl' } } },
    });
    // A discard by an operator of a confirmed one: refused as any, under the request's key.
    const late = publish(store, { discards: { operationKey: key } }, '_op-carl');
    await h(late.msg);
    expect(await refusalOf(store, late.submissionId, '_op-carl')).toMatchObject({
      error: { class: 'invalid_input', issues: [{ code: 'already_confirmed' }] },
    });

    const other = new MemoryStore();
    const h2 = await hold(other);
    await h2(publish(other, { discards: { operationKey: key } }, '_op-carl').msg);
    expect((await other.load('acme', operationIdOf(key))).state).toMatchObject({
      status: 'rolled_back',
      confirmation: { discarded: { by: { kind: 'operator', id: 'carl' } } },
    });
  });

  it('refuses a confirmation of a contract that holds nothing back, of an operation the actor may not read, and of an unknown key', async () => {
    const store = new MemoryStore();
    const h = handler(store);
    const w = intent(store);
    await h(w.msg);
    const c = publish(store, { confirms: { operationKey: w.key } });
    await h(c.msg);
    expect(await refusalOf(store, c.submissionId)).toMatchObject({
      error: { class: 'invalid_input', issues: [{ code: 'not_held_back' }] },
    });
    // One the actor may not read is answered as one that does not exist.
    await hold(store);
    const eve = publish(store, { discards: { operationKey: key } }, 'eve');
    await h(eve.msg);
    expect(await refusalOf(store, eve.submissionId, 'eve')).toMatchObject({ error: { class: 'not_found' } });
    const nowhere = publish(store, { confirms: { operationKey: `opk_${'Z'.repeat(43)}` } });
    await h(nowhere.msg);
    expect(await refusalOf(store, nowhere.submissionId)).toMatchObject({ error: { class: 'not_found' } });
  });
});
