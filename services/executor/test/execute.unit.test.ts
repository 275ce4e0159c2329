/**
 * The executor's handler on the in-memory store, with no server: an `accepted` event is handed to
 * it as the consumer would, and the operation's history says what it did. The downstream is an
 * in-process implementation that counts its requests. (The same paths on real processes and a real
 * nats-server: test/lifecycle.e2e.test.ts, test/recovery.e2e.test.ts, test/takeover.e2e.test.ts.)
 */
import { describe, expect, it } from 'vitest';
import type { JsMsg } from '@nats-io/jetstream';
import type { KV } from '@nats-io/kv';
import { defineImplementation, operationIdOf, prepareCall, type Implementation } from '@tooltx/contracts';
import {
  generateReceiptKey,
  handleCommand,
  receiptSigner,
  trustedReceiptKeys,
  verifyReceipt,
  type AcceptCommand,
  type OperationEvent,
} from '@tooltx/lifecycle';
import { encode, EVENT_TYPE_HEADER, Subjects } from '@tooltx/nats';
import { ImplementationRegistry, createLogger, type SampleOffer } from '@tooltx/runtime';
import { MemoryStore } from '@tooltx/store-memory';
import { authorizeNote, noteWrite } from '../../../test/fixtures/note-contract.js';
import { eventHandler } from '../src/execute.js';

const subjects = new Subjects('tunit');
const key = generateReceiptKey();
const signer = receiptSigner(key.privatePem);
const log = createLogger({ service: 'executor', instance: 'unit', level: 'silent' });

/** A downstream in this process: what it was asked, and how it answers. */
function downstream(answer: (n: number) => Promise<{ resourceId: string }>) {
  const requests: string[] = [];
  const impl: Implementation = defineImplementation({
    contract: noteWrite,
    async execute(_input, ctx) {
      requests.push(ctx.downstreamKey);
      const r = await answer(requests.length);
      return { resourceId: r.resourceId, result: {} };
    },
    authorize: authorizeNote,
  }) as unknown as Implementation;
  return { impl, requests };
}

/** A result store in memory: only what the executor writes (a receipt-only result is never stored). */
function results(): KV {
  const m = new Map<string, Uint8Array>();
  return {
    put: async (k: string, v: Uint8Array) => {
      m.set(k, v);
      return 1;
    },
    get: async (k: string) => m.get(k) ?? null,
  } as unknown as KV;
}

/** Registers an operation as the authorizer would (its intent stored first), and the message the executor's consumer would deliver. */
async function accepted(
  store: MemoryStore,
  o: { actor?: string; taskId?: string } = {},
): Promise<{ opId: string; msg: JsMsg; event: OperationEvent }> {
  const actor = o.actor ?? 'alice';
  const taskId = o.taskId ?? `task-${Math.random()}`;
  const input = { title: 'A note', body: 'Its body.' };
  const p = prepareCall(noteWrite, taskId, input);
  const intentSeq = store.addIntent(
    'acme',
    subjects.intent('acme', actor),
    encode({ tool: 'note.write', version: 1, taskId, operationKey: p.operationKey, input }),
    'sub-1',
  );
  const opId = operationIdOf(p.operationKey);
  const cmd: AcceptCommand = {
    type: 'accept',
    eventId: `evt-${Math.random().toString(36).slice(2, 12)}`,
    at: Date.now(),
    operationKey: p.operationKey,
    tenant: 'acme',
    actor,
    taskId,
    tool: 'note.write',
    version: 1,
    contractDigest: noteWrite.digest,
    effect: 'create',
    inputDigest: p.inputDigest,
    targetDigest: p.targetDigest,
    intentSeq,
    submissionId: 'sub-1',
  };
  const h = await handleCommand(store, 'acme', opId, () => cmd);
  if (h.kind !== 'appended') throw new Error('not registered');
  const msg = {
    subject: subjects.op('acme', opId),
    data: encode(h.event),
    seq: h.seq,
    info: { deliveryCount: 1 },
    headers: { get: (k: string) => (k === EVENT_TYPE_HEADER ? h.event.type : '') },
  } as unknown as JsMsg;
  return { opId, msg, event: h.event };
}

function executor(
  store: MemoryStore,
  impl: Implementation,
  frozen = false,
  sampler?: { readonly any: boolean; offer: (o: SampleOffer) => Promise<void> },
) {
  return eventHandler({
    ...(sampler ? { sampler } : {}),
    subjects,
    store,
    results: results(),
    tools: new ImplementationRegistry([impl]),
    log,
    executorId: 'ex-unit',
    signer,
    shutdown: new AbortController().signal,
    frozen: { isFrozen: () => frozen },
  });
}

describe('the executor on the in-memory store', () => {
  it('FM-01: runs an accepted operation once and commits it with a receipt that verifies', async () => {
    const store = new MemoryStore();
    const d = downstream(async (n) => ({ resourceId: `note-${n}` }));
    const { opId, msg } = await accepted(store);
    await executor(store, d.impl)(msg);
    const history = store.history('acme', opId);
    expect(history.map((e) => e.type)).toEqual(['accepted', 'running', 'committed']);
    const last = history.at(-1)!;
    expect(
      last.type === 'committed' && verifyReceipt(last.receipt, trustedReceiptKeys({ [key.keyId]: key.publicPem })),
    ).toBe(true);
    expect(last.type === 'committed' && last.receipt.resourceId).toBe('note-1');
    // The same event delivered again runs nothing: the operation is no longer waiting to run.
    await executor(store, d.impl)(msg);
    expect(d.requests).toHaveLength(1);
  });

  it('FM-12: a side effect whose connection is lost is unknown with evidence, never rejected and never sent twice', async () => {
    const store = new MemoryStore();
    const d = downstream(async () => {
      throw Object.assign(new Error('socket hang up'), { code: 'ECONNRESET' });
    });
    const { opId, msg } = await accepted(store);
    await executor(store, d.impl)(msg);
    const last = store.history('acme', opId).at(-1)!;
    expect(last.type).toBe('unknown');
    expect(last.state.status === 'unknown' && last.state.evidence?.kind).toBe('connection_lost');
    expect(d.requests).toHaveLength(1);
  });

  it('FM-08: authorisation is decided again at the execution instant: a denial then rejects it before anything is sent', async () => {
    const store = new MemoryStore();
    const d = downstream(async (n) => ({ resourceId: `note-${n}` }));
    const { opId, msg } = await accepted(store, { actor: 'blocked' });
    await executor(store, d.impl)(msg);
    const last = store.history('acme', opId).at(-1)!;
    expect(last.type).toBe('rejected');
    expect(last.state.status === 'rejected' && last.state.error?.class).toBe('forbidden');
    expect(last.state.status === 'rejected' && last.state.authorization?.execution).toMatchObject({
      decision: 'deny',
      reason: 'forbidden',
    });
    expect(d.requests).toHaveLength(0);
  });

  it('FM-14: a side effect of a frozen task is rejected task_frozen at the execution instant, nothing sent', async () => {
    const store = new MemoryStore();
    const d = downstream(async (n) => ({ resourceId: `note-${n}` }));
    const { opId, msg } = await accepted(store);
    await executor(store, d.impl, true)(msg);
    const last = store.history('acme', opId).at(-1)!;
    expect(last.state.status === 'rejected' && last.state.error?.class).toBe('task_frozen');
    expect(d.requests).toHaveLength(0);
  });

  it('two executors handed the same accepted event at once: one runs it, the other sends nothing', async () => {
    const store = new MemoryStore();
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    const d = downstream(async (n) => {
      await gate;
      return { resourceId: `note-${n}` };
    });
    const { opId, msg } = await accepted(store);
    const both = Promise.all([executor(store, d.impl)(msg), executor(store, d.impl)(msg)]);
    await new Promise((r) => setTimeout(r, 20));
    release();
    await both;
    expect(d.requests).toHaveLength(1);
    expect(store.history('acme', opId).filter((e) => e.type === 'running')).toHaveLength(1);
  });

  it('debug sampling: with no window open, an attempt offers nothing (an in-memory check); with one, its ended attempt is offered with its input and outcome', async () => {
    const store = new MemoryStore();
    const d = downstream(async (n) => ({ resourceId: `note-${n}` }));
    const offered: SampleOffer[] = [];
    const off = { any: false, offer: async (o: SampleOffer) => void offered.push(o) };
    await executor(store, d.impl, false, off)((await accepted(store)).msg);
    expect(offered).toEqual([]);
    const on = { any: true, offer: async (o: SampleOffer) => void offered.push(o) };
    const other = new MemoryStore();
    const { opId, msg } = await accepted(other);
    await executor(other, d.impl, false, on)(msg);
    expect(offered).toEqual([
      expect.objectContaining({
        contract: 'note.write@1',
        tenant: 'acme',
        opId,
        outcome: 'committed',
        input: { title: 'A note', body: 'Its body.' },
      }),
    ]);
    expect(offered[0]!.result()).toEqual({});
  });
});
