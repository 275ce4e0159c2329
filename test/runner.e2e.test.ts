/**
 * The task runner and receipts the workflow can trust: FM-14 (the runner stops
 * at an unknown write, freezes what depends on it and returns the takeover evidence), FM-17 (a
 * forged "success" — a model's claim or a tampered status answer — without a valid receipt never
 * counts as done). Real nats-server with auth, services as processes, the KB behind a real hop.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { downstreamKeyOf, prepareCall } from '@tooltx/contracts';
import { runTask, type Tools } from '@tooltx/client';
import {
  generateReceiptKey,
  loadReceiptSigner,
  receiptSigner,
  type Receipt,
  type ReceiptV2,
  type StatusAnswer,
} from '@tooltx/lifecycle';
import { encode } from '@tooltx/nats';
import { HttpFaultProxy } from '@tooltx/dev/faults';
import { provisioned, type TestNats } from './helpers/nats.js';
import { startService, type ServiceProcess } from './helpers/services.js';
import { kbRowsFor, RESEARCH_TOOLS, startKb, type TestKb } from './helpers/kb.js';
import { researchContracts } from '../examples/research-kb/contracts.js';

const TIMING = { timeoutMs: 1_000, runningBoundMs: 500, unknownDeadlineMs: 3_000 };
const contracts = researchContracts({ kbDedup: false, timing: TIMING });
const note = (title: string, body = `Notes on ${title}.`) => ({
  kb: 'research',
  title,
  body,
  sourceUrl: 'https://example.org/src',
  fetchedAt: '2026-11-30T06:00:00Z',
});
const keyOf = (taskId: string, title: string) => prepareCall(contracts.writeNote, taskId, note(title)).operationKey;

let t: TestNats;
let kb: TestKb;
let proxy: HttpFaultProxy;
let env: Record<string, string>;
let procs: ServiceProcess[] = [];
let alice: Tools;

const rowsFor = (key: string) => kbRowsFor(kb, 'acme', key);

beforeAll(async () => {
  t = await provisioned();
  kb = await startKb({
    tenants: [{ id: 'acme', quota: 10_000 }],
    knowledgeBases: [{ tenant: 'acme', name: 'research', defaultRole: 'writer' }],
  });
  proxy = await new HttpFaultProxy(kb.url).start();
  env = {
    ...t.env,
    TOOLTX_TOOLS_MODULE: RESEARCH_TOOLS,
    KB_URL: proxy.url,
    KB_KEEPALIVE: 'off',
    KB_TIMING_MS: `${TIMING.timeoutMs},${TIMING.runningBoundMs},${TIMING.unknownDeadlineMs}`,
    TOOLTX_RECONCILE_INTERVAL_MS: '300',
  };
  procs = await Promise.all([
    startService('authorizer', env),
    startService('executor', env),
    startService('reconciler', env),
  ]);
  alice = await t.agentTools('acme', 'alice', contracts.all, {
    budgetMs: 30_000,
  });
});

afterAll(async () => {
  await alice?.close();
  const codes = await Promise.all(procs.map((p) => p.stop()));
  await proxy?.stop();
  await kb?.stop();
  await t?.close();
  expect(codes).toEqual(procs.map(() => 0));
});

describe('the task runner', () => {
  it('runs steps after their dependencies, feeds a receipt into the next input, and is done only with verified receipts', async () => {
    const run = await runTask(alice, {
      taskId: 'runner-ok',
      steps: [
        { id: 'outline', tool: 'kb.write_note', input: note('Outline') },
        {
          id: 'draft',
          tool: 'kb.write_note',
          dependsOn: ['outline'],
          inputFrom: (d) => note('Draft', `Builds on ${d.outline!.receipt.resourceId}.`),
        },
        {
          id: 'summary',
          tool: 'kb.write_note',
          dependsOn: ['outline', 'draft'],
          inputFrom: (d) => note('Summary', `From ${d.draft!.receipt.resourceId}.`),
        },
      ],
    });
    expect(run.status).toBe('done');
    const seq = ['outline', 'draft', 'summary'].map((id) => run.steps[id]!);
    for (const s of seq) expect(s.status).toBe('committed');
    // Dependencies ran first: their receipts' commit times are ordered.
    const at = seq.map((s) => (s.status === 'committed' ? s.receipt.committedAt : 0));
    expect([...at].sort((a, b) => a - b)).toEqual(at);
    expect(await rowsFor(keyOf('runner-ok', 'Outline'))).toBe(1);
  });

  it('refuses a bad task: a cycle, an unknown dependency, a duplicate id — with the field path', async () => {
    await expect(
      runTask(alice, {
        taskId: 'x',
        steps: [
          { id: 'a', tool: 'kb.write_note', dependsOn: ['b'], input: {} },
          { id: 'b', tool: 'kb.write_note', dependsOn: ['a'], input: {} },
        ],
      }),
    ).rejects.toMatchObject({ class: 'invalid_input', issues: [{ code: 'cycle' }] });
    await expect(
      runTask(alice, { taskId: 'x', steps: [{ id: 'a', tool: 'kb.write_note', dependsOn: ['zz'], input: {} }] }),
    ).rejects.toMatchObject({ class: 'invalid_input', issues: [{ path: ['steps', 0, 'dependsOn', 0] }] });
    await expect(
      runTask(alice, {
        taskId: 'x',
        steps: [
          { id: 'a', tool: 'kb.write_note', input: {} },
          { id: 'a', tool: 'kb.write_note', input: {} },
        ],
      }),
    ).rejects.toMatchObject({ class: 'invalid_input', issues: [{ path: ['steps', 1, 'id'] }] });
  });

  it('FM-14: stops at an unknown write, freezes the steps that depend on it, and returns the takeover evidence instead of going on', async () => {
    const unknownKey = keyOf('runner-fm14', 'Charge the card');
    const dk = downstreamKeyOf('acme', unknownKey);
    proxy.inject(dk, { kind: 'delay', ms: TIMING.timeoutMs + 1_500 });
    proxy.drop = (req) => req.method === 'GET' && req.url === `/v1/notes/by-key/${encodeURIComponent(dk)}`;
    try {
      const run = await runTask(alice, {
        taskId: 'runner-fm14',
        concurrency: 1,
        steps: [
          { id: 'quote', tool: 'kb.write_note', input: note('Quote') },
          { id: 'charge', tool: 'kb.write_note', dependsOn: ['quote'], input: note('Charge the card') },
          { id: 'receipt', tool: 'kb.write_note', dependsOn: ['charge'], input: note('Mail the receipt') },
          { id: 'later', tool: 'kb.write_note', dependsOn: ['quote'], input: note('Unrelated but later') },
        ],
      });
      expect(run.status).toBe('handed_over');
      expect(run.steps.quote!.status).toBe('committed');
      expect(run.steps.charge).toMatchObject({ status: 'unknown', next: 'hand_over' });
      expect(run.steps.receipt).toEqual({ status: 'frozen', blockedBy: 'charge' });
      expect(run.steps.later).toEqual({ status: 'not_started' });
      expect(run.handover).toMatchObject({
        step: 'charge',
        operationKey: unknownKey,
        reason: 'unknown',
        takeover: { operationKey: unknownKey, taskId: 'runner-fm14', reason: 'unknown_past_deadline' },
      });
      // Nothing after the unknown write reached the KB.
      expect(await rowsFor(keyOf('runner-fm14', 'Mail the receipt'))).toBe(0);
      expect(await rowsFor(keyOf('runner-fm14', 'Unrelated but later'))).toBe(0);
    } finally {
      proxy.clear();
    }
  });
});

describe('FM-17: only a valid server receipt counts', () => {
  it("a model's claim of success, a receipt under an untrusted key, and another operation's genuine receipt never make a step done", async () => {
    const genuine = await alice.execute({ tool: 'kb.write_note', taskId: 'fm17', input: note('Genuine') });
    expect(genuine.status).toBe('committed');
    if (genuine.status !== 'committed') return;
    const rogue = generateReceiptKey();
    const rogueSigner = receiptSigner(rogue.privatePem);
    const claims: Record<string, (key: string) => Receipt> = {
      // The model "says" it committed: a receipt-shaped object with a made-up signature.
      model: (key) => ({
        ...genuine.receipt,
        operationKey: key,
        resourceId: 'note-i-promise',
        signature: 'A'.repeat(86),
      }),
      // Correctly signed, but by a key nobody configured.
      untrusted: (key) => {
        const r = { ...genuine.receipt, operationKey: key, keyId: rogueSigner.keyId };
        return { ...r, signature: rogueSigner.sign(r) };
      },
      // A real receipt, replayed for another operation.
      replayed: () => genuine.receipt,
    };
    const expected = { model: 'bad_signature', untrusted: 'untrusted_key', replayed: 'other_operation' } as const;
    for (const [kind, forge] of Object.entries(claims)) {
      const taskId = `fm17-${kind}`;
      // The "tools" the runner was handed claim success for the payment step without a server.
      const liar: Pick<Tools, 'execute' | 'verify'> = {
        verify: (o) => alice.verify(o),
        execute: (async (req: Parameters<Tools['execute']>[0], o?: Parameters<Tools['execute']>[1]) => {
          if ((req.input as { title: string }).title !== 'Pay') return alice.execute(req, o);
          const key = prepareCall(contracts.writeNote, req.taskId, req.input).operationKey;
          return { status: 'committed', operationKey: key, result: {}, receipt: forge(key), next: 'continue' };
        }) as Tools['execute'],
      };
      const run = await runTask(liar, {
        taskId,
        steps: [
          { id: 'pay', tool: 'kb.write_note', input: note('Pay') },
          { id: 'ship', tool: 'kb.write_note', dependsOn: ['pay'], input: note('Ship') },
        ],
      });
      expect(run, kind).toMatchObject({ status: 'handed_over', handover: { step: 'pay', reason: 'unverified' } });
      expect(run.steps.pay, kind).toMatchObject({
        status: 'unverified',
        reason: expected[kind as keyof typeof expected],
        next: 'hand_over',
      });
      expect(run.steps.ship, kind).toEqual({ status: 'frozen', blockedBy: 'pay' });
      expect(await rowsFor(keyOf(taskId, 'Ship'))).toBe(0);
    }
  });

  it('a tampered status answer claiming committed is never taken for done by the SDK; the genuine one is', async () => {
    const key = keyOf('fm17-wire', 'Wire');
    const first = await alice.execute({ tool: 'kb.write_note', taskId: 'fm17-wire', input: note('Wire') });
    expect(first.status).toBe('committed');
    if (first.status !== 'committed') return;
    // The status service goes away; an impostor holding a service identity answers instead.
    const authorizer = procs[0]!;
    await authorizer.stop();
    const impostor = await t.connectAs({ kind: 'service', service: 'authorizer' });
    let answer: (r: Receipt) => StatusAnswer = () => ({
      operationKey: key,
      state: 'committed',
      source: 'operation',
      seq: 9,
      at: Date.now(),
    });
    const sub = impostor.subscribe(t.subjects.status('acme', 'alice'), {
      callback: (_e, m) => void m.respond(encode(answer(first.receipt))),
    });
    try {
      const tampered = (r: Receipt): StatusAnswer => ({
        operationKey: key,
        state: 'committed',
        source: 'operation',
        seq: 9,
        attempt: 1,
        ownAttempt: true,
        inputMatches: true,
        receipt: { ...r, resourceId: 'note-redirected' },
        result: {},
        at: Date.now(),
      });
      answer = tampered;
      const r = await alice.execute(
        { tool: 'kb.write_note', taskId: 'fm17-wire', input: note('Wire') },
        { budgetMs: 2_500 },
      );
      expect(r).toMatchObject({ status: 'unknown', next: 'hand_over', evidence: { invalidReceipt: 'bad_signature' } });
      answer = (rc) => ({ ...tampered(rc), receipt: rc });
      const ok = await alice.execute(
        { tool: 'kb.write_note', taskId: 'fm17-wire', input: note('Wire') },
        { budgetMs: 2_500 },
      );
      expect(ok).toMatchObject({ status: 'committed', receipt: first.receipt });
      // A receipt of format 1 (the events stream's prevSeq; docs/lifecycle.md "Receipt formats"), as
      // stored operations still carry: genuine, it counts; tampered, it never does.
      expect(first.receipt).toMatchObject({ schema: 2 });
      const executorKey = loadReceiptSigner(t.auth.signingKeyFile('executor'));
      const { schema: _schema, prevEventCount: _count, signature: _signature, ...common } = first.receipt as ReceiptV2;
      const unsignedV1 = { ...common, prevSeq: 4711, keyId: executorKey.keyId };
      const v1: Receipt = { ...unsignedV1, signature: executorKey.sign(unsignedV1) };
      answer = (rc) => ({ ...tampered(rc), receipt: v1 });
      expect(
        await alice.execute({ tool: 'kb.write_note', taskId: 'fm17-wire', input: note('Wire') }, { budgetMs: 2_500 }),
      ).toMatchObject({ status: 'committed', receipt: v1 });
      answer = (rc) => ({ ...tampered(rc), receipt: { ...v1, prevSeq: 4712 } });
      expect(
        await alice.execute({ tool: 'kb.write_note', taskId: 'fm17-wire', input: note('Wire') }, { budgetMs: 2_500 }),
      ).toMatchObject({ status: 'unknown', evidence: { invalidReceipt: 'bad_signature' } });
    } finally {
      sub.unsubscribe();
      await impostor.close();
      procs[0] = await startService('authorizer', env);
    }
    expect(await rowsFor(key)).toBe(1);
  });
});
