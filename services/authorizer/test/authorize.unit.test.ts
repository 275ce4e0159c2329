/**
 * The authorizer's intake handler on the in-memory store, with no server: an intent message is
 * handed to it as the tenant's consumer would, and the operation's history and the decision
 * records say what it did. (The same paths on real processes and a real nats-server:
 * test/lifecycle.e2e.test.ts, test/authz.e2e.test.ts, test/takeover.e2e.test.ts.)
 */
import { describe, expect, it } from 'vitest';
import type { JsMsg } from '@nats-io/jetstream';
import { defineImplementation, ErrorClass, operationIdOf, prepareCall, type Implementation } from '@tooltx/contracts';
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
