/**
 * The status endpoint in process, on a real nats-server with the deployment's permissions: the
 * authorizer's own connection answers an agent's requests. The operation store is the real one,
 * observed (not replaced) to count the reads an answer costs.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { EMPTY_RESULT_DIGEST, operationIdOf } from '@tooltx/contracts';
import { createTools, type Tools } from '@tooltx/client';
import { decide, generateReceiptKey, receiptSigner, type AcceptCommand, type OperationCommand, type OperationState } from '@tooltx/lifecycle';
import { jetStreamOf, newEventId, openBucket, OperationStore, type LoadedOperation, type NatsConnection } from '@tooltx/nats';
import { createLogger, ImplementationRegistry } from '@tooltx/runtime';
import { StatusService } from '../src/status.js';
import { provisioned, type TestNats } from '../../../test/helpers/nats.js';
import { contracts, implementations } from '../../../test/fixtures/sink-tools.js';

const D = (c: string) => `sha256:${c.repeat(64)}`;

/** The real store, counting the operation loads (direct gets) it is asked for. */
class ObservedStore extends OperationStore {
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
async function step(cmd: (seq: number) => OperationCommand): Promise<void> {
  const opId = operationIdOf(key);
  const { state, seq } = (await t.store.load('acme', opId)) as { state: OperationState; seq: number };
  const d = decide(cmd(seq), state, { signer });
  if (d.kind !== 'append') throw new Error(`expected an append, got ${d.kind}`);
  await t.store.append('acme', opId, d.event, seq);
}

beforeAll(async () => {
  t = await provisioned();
  nc = await t.connectAs({ kind: 'service', service: 'authorizer' });
  const { js, jsm } = await jetStreamOf(nc);
  store = new ObservedStore(js, jsm, t.subjects);
  const results = await openBucket(nc, t.subjects.resultsBucket);
  status = new StatusService({ nc, js, subjects: t.subjects, store, results, tools: new ImplementationRegistry(implementations), log: createLogger({ service: 'status-test', instance: 'status-test-1', level: 'silent' }) });
  await status.start();
  tools = await createTools({ servers: t.url, tenant: 'acme', actor: 'alice', nkeyFile: t.agentSeed('acme', 'alice'), contracts, prefix: t.subjects.prefix, receiptKeys: t.auth.receiptKeysFile });
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
      type: 'accept', eventId: newEventId(), at: Date.now(), operationKey: key, tenant: 'acme', actor: 'alice', taskId: 't', tool: 'sink.write', version: 1,
      contractDigest: D('1'), effect: 'create', inputDigest: D('2'), targetDigest: D('3'), intentSeq: 1, submissionId: 's',
    };
    await step(() => accept);
    const open = await tools.status({ operationKey: key });
    expect(open).toMatchObject({ state: 'accepted', source: 'operation' });
    const runId = newEventId();
    await step(() => ({ type: 'start', eventId: runId, at: Date.now(), attempt: 1, executor: 'test', deadlineAt: Date.now() + 5_000 }));
    await step((prevSeq) => ({ type: 'commit', eventId: newEventId(), at: Date.now(), attempt: 1, prevSeq, runId, resourceId: 'value:x', resultDigest: EMPTY_RESULT_DIGEST }));

    const before = store.loads;
    const answers = [];
    for (let i = 0; i < 20; i++) answers.push(await tools.status({ operationKey: key }));
    // Open states are read afresh every time; the committed one once.
    expect(store.loads - before).toBe(1);
    for (const a of answers) expect(a).toMatchObject({ state: 'committed', source: 'operation', seq: answers[0]!.seq, receipt: answers[0]!.receipt });
    expect(answers[0]!.receipt).toMatchObject({ operationKey: key, resourceId: 'value:x' });
    // The read policy still runs on every request: the sink's rule lets noread-* see only their own.
    const eve = await createTools({ servers: t.url, tenant: 'acme', actor: 'noread-eve', nkeyFile: t.agentSeed('acme', 'noread-eve'), contracts, prefix: t.subjects.prefix, receiptKeys: t.auth.receiptKeysFile });
    try {
      const hidden = await eve.status({ operationKey: key });
      expect(hidden).toMatchObject({ state: 'not_seen', source: 'none', seq: 0 });
      expect(hidden.receipt).toBeUndefined();
    } finally {
      await eve.close();
    }
  });
});
