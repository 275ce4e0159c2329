/**
 * The status endpoint in process, on a real nats-server with the deployment's permissions: the
 * authorizer's own connection answers an agent's requests. The operation store is the real one,
 * observed (not replaced) to count the reads an answer costs.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { EMPTY_RESULT_DIGEST, operationIdOf } from '@tooltx/contracts';
import { createTools, type Tools } from '@tooltx/client';
import {
  decide,
  generateReceiptKey,
  receiptSigner,
  type AcceptCommand,
  type OperationCommand,
  type OperationState,
} from '@tooltx/lifecycle';
import type { LoadedOperation } from '@tooltx/lifecycle';
import { jetStreamOf, newEventId, openBucket, JetStreamStore, type NatsConnection } from '@tooltx/nats';
import { createLogger, ImplementationRegistry } from '@tooltx/runtime';
import { StatusService } from '../src/status-service.js';
import { provisioned, type TestNats } from '../../../test/helpers/nats.js';
import { contracts, implementations } from '../../../test/fixtures/sink-tools.js';

const D = (c: string) => `sha256:${c.repeat(64)}`;

/** The real store, counting the operation loads (direct gets) it is asked for. */
class ObservedStore extends JetStreamStore {
  loads = 0;
  override async load(tenant: string, opId: string): Promise<LoadedOperation> {
    this.loads++;
    return super.load(tenant, opId);
  }
}

let t: TestNats;
let nc: NatsConnection;
let store: ObservedStore;
let status: StatusService;
let tools: Tools;
const key = `opk_${'S'.repeat(43)}`;
const signer = receiptSigner(generateReceiptKey().privatePem);

/** Appends `cmd` to the operation's subject under its last sequence, as a service would. */
async function step(cmd: () => OperationCommand, tenant = 'acme', operationKey = key): Promise<void> {
  const opId = operationIdOf(operationKey);
  const { state, seq } = (await t.store.load(tenant, opId)) as { state: OperationState; seq: number };
  const d = decide(cmd(), state, { signer });
  if (d.kind !== 'append') throw new Error(`expected an append, got ${d.kind}`);
  await t.store.append(tenant, opId, d.event, seq);
}

const acceptOf = (tenant: string, operationKey: string, actor: string): AcceptCommand => ({
  type: 'accept',
  eventId: newEventId(),
  at: Date.now(),
  operationKey,
  tenant,
  actor,
  taskId: 't',
  tool: 'sink.write',
  version: 1,
  contractDigest: D('1'),
  effect: 'create',
  inputDigest: D('2'),
  targetDigest: D('3'),
  intentSeq: 1,
  submissionId: `s-${operationKey.slice(4, 8)}`,
});

beforeAll(async () => {
  t = await provisioned();
  nc = await t.connectAs({ kind: 'service', service: 'authorizer' });
  const { js, jsm } = await jetStreamOf(nc);
  store = new ObservedStore(js, jsm, t.subjects);
  const results = await openBucket(nc, t.subjects.resultsBucket);
  status = new StatusService({
    nc,
    js,
    subjects: t.subjects,
    store,
    results,
    tools: new ImplementationRegistry(implementations),
    log: createLogger({ service: 'status-test', instance: 'status-test-1', level: 'silent' }),
  });
  await status.start();
  tools = await createTools({
    servers: t.url,
    tenant: 'acme',
    actor: 'alice',
    nkeyFile: t.agentSeed('acme', 'alice'),
    contracts,
    prefix: t.subjects.prefix,
    receiptKeys: t.auth.receiptKeysFile,
  });
});

afterAll(async () => {
  await tools?.close();
  await status?.stop();
  await nc?.drain();
  await t?.close();
});

describe('status answers', () => {
  it('a committed operation is read once: repeated requests are answered from memory, with the same receipt, and a reader without rights still gets not_seen', async () => {
    const accept: AcceptCommand = {
      type: 'accept',
      eventId: newEventId(),
      at: Date.now(),
      operationKey: key,
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
    await step(() => accept);
    const open = await tools.status({ operationKey: key });
    expect(open).toMatchObject({ state: 'accepted', source: 'operation' });
    const runId = newEventId();
    await step(() => ({
      type: 'start',
      eventId: runId,
      at: Date.now(),
      attempt: 1,
      executor: 'test',
      deadlineAt: Date.now() + 5_000,
    }));
    await step(() => ({
      type: 'commit',
      eventId: newEventId(),
      at: Date.now(),
      attempt: 1,
      runId,
      resourceId: 'value:x',
      resultDigest: EMPTY_RESULT_DIGEST,
    }));

    const before = store.loads;
    const answers = [];
    for (let i = 0; i < 20; i++) answers.push(await tools.status({ operationKey: key }));
    // Open states are read afresh every time; the committed one once.
    expect(store.loads - before).toBe(1);
    for (const a of answers)
      expect(a).toMatchObject({
        state: 'committed',
        source: 'operation',
        seq: answers[0]!.seq,
        receipt: answers[0]!.receipt,
      });
    expect(answers[0]!.receipt).toMatchObject({ operationKey: key, resourceId: 'value:x' });
    // The read policy still runs on every request: the sink's rule lets noread-* see only their own.
    const eve = await createTools({
      servers: t.url,
      tenant: 'acme',
      actor: 'noread-eve',
      nkeyFile: t.agentSeed('acme', 'noread-eve'),
      contracts,
      prefix: t.subjects.prefix,
      receiptKeys: t.auth.receiptKeysFile,
    });
    try {
      const hidden = await eve.status({ operationKey: key });
      expect(hidden).toMatchObject({ state: 'not_seen', source: 'none', seq: 0 });
      expect(hidden.receipt).toBeUndefined();
    } finally {
      await eve.close();
    }
  });

  it("seq is the operation's own event count: another tenant's events between two of ours move neither the answers nor the long-poll", async () => {
    const ours = `opk_${'T'.repeat(43)}`;
    let n = 0;
    /** Another tenant's traffic on the shared event log: a whole operation of globex's. */
    const traffic = async () => {
      const theirs = `opk_${'G'.repeat(42)}${n++}`;
      await step(() => acceptOf('globex', theirs, 'gina'), 'globex', theirs);
      const run = newEventId();
      await step(
        () => ({
          type: 'start',
          eventId: run,
          at: Date.now(),
          attempt: 1,
          executor: 'test',
          deadlineAt: Date.now() + 5_000,
        }),
        'globex',
        theirs,
      );
      await step(
        () => ({
          type: 'reject',
          eventId: newEventId(),
          at: Date.now(),
          attempt: 1,
          runId: run,
          error: { class: 'forbidden' },
        }),
        'globex',
        theirs,
      );
    };
    await traffic();
    await step(() => acceptOf('acme', ours, 'alice'), 'acme', ours);
    const submissionIds = [acceptOf('acme', ours, 'alice').submissionId];
    expect(await tools.status({ operationKey: ours, submissionIds })).toMatchObject({ state: 'accepted', seq: 1 });
    const runId = newEventId();
    await step(
      () => ({
        type: 'start',
        eventId: runId,
        at: Date.now(),
        attempt: 1,
        executor: 'test',
        deadlineAt: Date.now() + 5_000,
      }),
      'acme',
      ours,
    );
    expect(await tools.status({ operationKey: ours, submissionIds })).toMatchObject({ state: 'running', seq: 2 });
    // A long-poll past `running` waits through the other tenant's events and wakes at our next one.
    const poll = tools.status({ operationKey: ours, submissionIds, afterSeq: 2, waitMs: 10_000 });
    await new Promise((r) => setTimeout(r, 200));
    for (let i = 0; i < 3; i++) await traffic();
    await step(
      () => ({
        type: 'commit',
        eventId: newEventId(),
        at: Date.now(),
        attempt: 1,
        runId,
        resourceId: 'value:y',
        resultDigest: EMPTY_RESULT_DIGEST,
      }),
      'acme',
      ours,
    );
    const committed = await poll;
    expect(committed).toMatchObject({ state: 'committed', seq: 3, receipt: { schema: 2, prevEventCount: 2 } });
    expect(committed.receipt).not.toHaveProperty('prevSeq');
    // The events stream's own sequence of that commit is far past 3: that is what an answer must not carry.
    expect((await t.store.load('acme', operationIdOf(ours))).seq).toBeGreaterThan(3);
    // A final answer the caller already saw waits (for a new attempt); one it has not, answers at once.
    const started = Date.now();
    expect(await tools.status({ operationKey: ours, submissionIds, afterSeq: 3, waitMs: 300 })).toMatchObject({
      state: 'committed',
      seq: 3,
    });
    expect(Date.now() - started).toBeGreaterThanOrEqual(250);
    expect(await tools.status({ operationKey: ours, submissionIds, afterSeq: 2, waitMs: 10_000 })).toMatchObject({
      state: 'committed',
      seq: 3,
    });
  });
});
