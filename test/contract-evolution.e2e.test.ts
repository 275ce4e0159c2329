/**
 * Contract evolution: a new version registered while a task runs
 * on the old one (FM-23), recorded histories replayed across it (FM-26) — also the committed
 * lifecycles of each version recorded on another deployment (test/fixtures/lifecycles) — and a new version that
 * adds a required authorisation field (FM-24). Real
 * nats-server, the authorizer and the executor as processes, first loading only `sink.write@1`
 * (test/fixtures/sink-tools.ts), then restarted with `sink.write@2` registered beside it
 * (test/fixtures/sink-tools-v2.ts); a real HTTP sink that records every request.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { downstreamKeyOf, operationIdOf, prepareCall } from '@tooltx/contracts';
import { createTools, newSubmission, publishSubmission, type Tools } from '@tooltx/client';
import { jetStreamOf } from '@tooltx/nats';
import { provisioned, type TestNats } from './helpers/nats.js';
import { SINK_TOOLS, startService, type ServiceProcess } from './helpers/services.js';
import { waitForOperation } from './helpers/ops.js';
import { Sink } from './helpers/sink.js';
import { contracts as v1Contracts, sinkWrite } from './fixtures/sink-tools.js';
import { contracts as v2Contracts, sinkWriteV2 } from './fixtures/sink-tools-v2.js';
import { dirname, join } from 'node:path';
import { readFileSync } from 'node:fs';
import { loadLifecycles, replayLifecycles } from './helpers/lifecycles.js';

const V2_TOOLS = join(dirname(SINK_TOOLS), 'sink-tools-v2.ts');
const TENANT = 'acme';
let t: TestNats;
let sink: Sink;
let env: Record<string, string>;
let authorizer: ServiceProcess;
let executor: ServiceProcess | undefined;
/** An agent that knows only v1 (its task started before v2 existed), and one that knows both. */
let agentV1: Tools;
let agentV2: Tools;

const note = (title: string) => ({ bucket: 'kb-evo', title, body: `Body of ${title}.`, at: '2026-12-01T06:00:00Z' });
const sinkBodyOf = (key: string) => sink.writesFor((b) => b.key === downstreamKeyOf(TENANT, key)).map((r) => r.body);
const connect = (contracts: typeof v1Contracts) =>
  createTools({
    servers: t.url,
    tenant: TENANT,
    actor: 'alice',
    nkeyFile: t.agentSeed(TENANT, 'alice'),
    contracts,
    prefix: t.subjects.prefix,
    receiptKeys: t.auth.receiptKeysFile,
  });

beforeAll(async () => {
  t = await provisioned();
  sink = await new Sink().start();
  env = { ...t.env, SINK_URL: sink.url };
  [authorizer, executor] = await Promise.all([startService('authorizer', env), startService('executor', env)]);
  agentV1 = await connect(v1Contracts);
});

afterAll(async () => {
  await agentV1?.close();
  await agentV2?.close();
  const codes = await Promise.all([authorizer?.stop(), executor?.stop()]);
  await sink?.stop();
  await t?.close();
  expect(codes).toEqual([0, 0]);
});

describe('contract evolution', () => {
  it("FM-23: v2 registered while a task runs on v1 — the operation accepted under v1 runs on v1, and the task's next step stays on v1", async () => {
    const task = 'evo-task';
    const first = await agentV1.execute({ tool: 'sink.write', taskId: task, input: note('Step 1') });
    expect(first).toMatchObject({ status: 'committed', receipt: { version: 1 } });

    // Step 2 is accepted under v1 while no executor runs.
    expect(await executor!.stop()).toBe(0);
    executor = undefined;
    const step2 = note('Step 2');
    const key2 = prepareCall(sinkWrite, task, step2).operationKey;
    const pending = await agentV1.execute({ tool: 'sink.write', taskId: task, input: step2 }, { budgetMs: 1_500 });
    expect(pending).toMatchObject({ status: 'unknown', lastServerState: 'accepted' });
    const accepted = await waitForOperation(t, TENANT, key2, (s) => s.status === 'accepted');
    const v1Digest = accepted.status === 'accepted' ? accepted.contractDigest : '';

    // v2 is registered: both services restart with a module holding sink.write@1 and @2.
    expect(await authorizer.stop()).toBe(0);
    [authorizer, executor] = await Promise.all([
      startService('authorizer', { ...env, TOOLTX_TOOLS_MODULE: V2_TOOLS }),
      startService('executor', { ...env, TOOLTX_TOOLS_MODULE: V2_TOOLS }),
    ]);

    // The accepted operation runs on the contract it was accepted under: v1, by v1's implementation.
    const done = await waitForOperation(t, TENANT, key2, (s) => s.status === 'committed');
    expect(done).toMatchObject({ status: 'committed', version: 1, contractDigest: v1Digest });
    expect(done.status === 'committed' && done.receipt?.version).toBe(1);
    expect(sinkBodyOf(key2)).toEqual([expect.not.objectContaining({ contract: expect.anything() })]);
    expect(await agentV1.execute({ tool: 'sink.write', taskId: task, input: step2 })).toMatchObject({
      status: 'committed',
      operationKey: key2,
      receipt: { version: 1 },
    });

    // The task's next step, from the agent that knows only v1, is still v1 — not upgraded to v2.
    const third = await agentV1.execute({ tool: 'sink.write', taskId: task, input: note('Step 3') });
    expect(third).toMatchObject({ status: 'committed', receipt: { version: 1 } });
    expect(sinkBodyOf(third.operationKey!)).toEqual([expect.not.objectContaining({ approver: expect.anything() })]);

    // A new caller asks for v2 explicitly and gets it.
    agentV2 = await connect(v2Contracts);
    const v2 = await agentV2.execute({
      tool: 'sink.write',
      version: 2,
      taskId: 'evo-v2',
      input: { ...note('V2 note'), approver: 'bob' },
    });
    expect(v2).toMatchObject({ status: 'committed', receipt: { version: 2 } });
    expect(sinkBodyOf(v2.operationKey!)).toEqual([
      expect.objectContaining({ contract: 'sink.write@2', approver: 'bob' }),
    ]);
  }, 90_000);

  it("FM-26: recorded committed, rejected and unknown histories, replayed after the services restart with v2 registered — each key's status and resubmission give its original receipt or outcome, and nothing runs again", async () => {
    agentV2 ??= await connect(v2Contracts);
    // Three histories under v1: a success, a refusal by the downstream (nothing applied), and a
    // write whose outcome is not known (the sink never answers; no reconciler runs to probe it).
    const ok = await agentV1.execute({ tool: 'sink.write', taskId: 'replay-ok', input: note('Replay ok') });
    sink.refuseWritesWith = 403;
    const refused = await agentV1.execute({
      tool: 'sink.write',
      taskId: 'replay-refused',
      input: note('Replay refused'),
    });
    sink.refuseWritesWith = 0;
    sink.hang = true;
    const unknownInput = note('Replay unknown');
    const unknownKey = prepareCall(sinkWrite, 'replay-unknown', unknownInput).operationKey;
    await agentV1.execute({ tool: 'sink.write', taskId: 'replay-unknown', input: unknownInput }, { budgetMs: 1_000 });
    await waitForOperation(t, TENANT, unknownKey, (s) => s.status === 'unknown', 20_000);
    sink.hang = false;
    expect(ok).toMatchObject({ status: 'committed' });
    expect(refused).toMatchObject({ status: 'rejected', error: { class: 'forbidden' } });
    const keys = [ok.operationKey!, refused.operationKey!, unknownKey];
    const recorded = await Promise.all(keys.map((k) => agentV1.status({ operationKey: k })));
    expect(recorded.map((a) => a.state)).toEqual(['committed', 'rejected', 'unknown']);
    const requestsBefore = sink.requests.length;

    // Every cache gone: fresh processes, with v2 registered beside v1.
    expect(await Promise.all([authorizer.stop(), executor!.stop()])).toEqual([0, 0]);
    [authorizer, executor] = await Promise.all([
      startService('authorizer', { ...env, TOOLTX_TOOLS_MODULE: V2_TOOLS }),
      startService('executor', { ...env, TOOLTX_TOOLS_MODULE: V2_TOOLS }),
    ]);

    for (const [i, key] of keys.entries()) {
      const { at: _then, ...before } = recorded[i]!;
      const { at: _now, ...after } = await agentV2.status({ operationKey: key });
      expect(after, key).toEqual(before);
    }
    // Resubmitted as recorded: the committed call returns its original receipt and the unknown one
    // stays unknown; the refused one is only queried (after `forbidden` a new attempt is the
    // caller's choice, not a replay's). None reaches the sink again.
    expect(await agentV1.execute({ tool: 'sink.write', taskId: 'replay-ok', input: note('Replay ok') })).toEqual(ok);
    expect(await agentV1.status({ operationKey: refused.operationKey! })).toMatchObject({
      state: 'rejected',
      error: { class: 'forbidden' },
    });
    expect(
      await agentV1.execute({ tool: 'sink.write', taskId: 'replay-unknown', input: unknownInput }, { budgetMs: 1_500 }),
    ).toMatchObject({ status: 'unknown', lastServerState: 'unknown' });
    expect(sink.requests.length).toBe(requestsBefore);
  }, 90_000);

  it("FM-26: each version's recorded lifecycles (test/fixtures/lifecycles: committed, rejected, unknown then resolved), replayed into this deployment's event log — every key answers its recorded status, a committed key's resubmission returns its recorded receipt, and nothing runs", async () => {
    const fixtures = ['sink.write@1', 'sink.write@2'].map(loadLifecycles);
    const replayer = await createTools({
      servers: t.url,
      tenant: TENANT,
      actor: 'alice',
      nkeyFile: t.agentSeed(TENANT, 'alice'),
      contracts: v2Contracts,
      prefix: t.subjects.prefix,
      // The recording deployment's receipt keys are trusted too: its receipts are the recorded ones.
      receiptKeys: {
        ...(JSON.parse(readFileSync(t.auth.receiptKeysFile, 'utf8')) as Record<string, string>),
        ...Object.assign({}, ...fixtures.map((f) => f.receiptKeys)),
      },
    });
    // Replayed records are history, not work: no executor takes the replayed `accepted` events
    // meanwhile (one started afterwards finds each operation already ended).
    expect(await executor!.stop()).toBe(0);
    executor = undefined;
    try {
      const requestsBefore = sink.requests.length;
      for (const f of fixtures) {
        // The contract the fixture was recorded with is the one this deployment holds.
        expect(v2Contracts.find((c) => c.id === f.contract)?.interfaceDigest, f.contract).toBe(f.interfaceDigest);
        await replayLifecycles(t, f);
        for (const l of f.lifecycles) {
          const { at: _now, ...answer } = await replayer.status({ operationKey: l.operationKey });
          expect(answer, `${f.contract} ${l.kind}`).toEqual(l.status);
          if (l.kind !== 'committed') continue;
          const again = await replayer.execute({
            tool: 'sink.write',
            version: Number(f.contract.split('@')[1]),
            taskId: l.taskId,
            input: l.input,
          });
          expect(again).toMatchObject({ status: 'committed', operationKey: l.operationKey, receipt: l.status.receipt });
        }
      }
      expect(sink.requests.length).toBe(requestsBefore);
      executor = await startService('executor', { ...env, TOOLTX_TOOLS_MODULE: V2_TOOLS });
      const keys = fixtures.flatMap((f) => f.lifecycles.map((l) => l.operationKey));
      for (const k of keys)
        expect((await replayer.status({ operationKey: k })).state).toBe(
          fixtures.flatMap((f) => f.lifecycles).find((l) => l.operationKey === k)!.status.state,
        );
      expect(sink.requests.length).toBe(requestsBefore);
    } finally {
      await replayer.close();
    }
  }, 60_000);

  it("FM-24: v2's required authorisation field never gets a permissive default — a v2 intent without it is refused at its path and nothing runs; the field is checked, not assumed", async () => {
    agentV2 ??= await connect(v2Contracts);
    // Sent raw, past the SDK's own check: the server refuses it at input.approver.
    const input = note('No approver');
    const claimed = prepareCall(sinkWriteV2, 'evo-noapprover', { ...input, approver: 'bob' }).operationKey;
    const nc = await t.connectAs({ kind: 'agent', tenant: TENANT, actor: 'alice' });
    try {
      const { js } = await jetStreamOf(nc);
      const before = sink.requests.length;
      await publishSubmission(
        js,
        newSubmission(t.subjects, TENANT, 'alice', {
          tool: 'sink.write',
          version: 2,
          taskId: 'evo-noapprover',
          operationKey: claimed,
          input,
        }),
      );
      const answer = await agentV2.status({ operationKey: claimed, waitMs: 5_000 });
      expect(answer).toMatchObject({
        state: 'rejected',
        source: 'decision',
        error: { class: 'invalid_input', issues: [{ path: ['input', 'approver'] }] },
      });
      expect(sink.requests.length).toBe(before);
      expect((await t.store.load(TENANT, operationIdOf(claimed))).state.status).toBe('none');
    } finally {
      await nc.close();
    }
    // Through the SDK: refused before anything is sent, at the same path.
    expect(await agentV2.execute({ tool: 'sink.write', version: 2, taskId: 'evo-noapprover', input })).toMatchObject({
      status: 'rejected',
      next: 'replan',
      error: { class: 'invalid_input', issues: [{ path: ['input', 'approver'] }] },
    });
    // The new field is checked by v2's authorisation: an actor approving its own write is refused.
    expect(
      await agentV2.execute({
        tool: 'sink.write',
        version: 2,
        taskId: 'evo-selfapproved',
        input: { ...note('Self'), approver: 'alice' },
      }),
    ).toMatchObject({
      status: 'rejected',
      error: { class: 'forbidden' },
    });
  }, 60_000);
});
