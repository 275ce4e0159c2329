/**
 * Recorded lifecycles of one contract version (docs/contracts.md "Replay fixtures"): the event-log
 * records of a committed, a rejected and an unknown-then-resolved operation, each with its input,
 * its stored result and the status answer it gave, recorded from a real stack and committed under
 * test/fixtures/lifecycles/<name@version>.json. A replay appends the records to another stack's
 * event log (and the results to its result store); its status answers and resubmissions must
 * give the recorded outcomes, running nothing again (FM-26).
 *
 * Recording (a real nats-server, authorizer and executor, the HTTP sink):
 *   node --import tsx test/helpers/lifecycles.ts
 * writes test/fixtures/lifecycles/sink.write@1.json and sink.write@2.json.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createTools, type Tools } from '@tooltx/client';
import { operationIdOf, prepareCall, type Contract } from '@tooltx/contracts';
import { handleCommand, operationEventSchema, type OperationEvent, type StatusAnswer } from '@tooltx/lifecycle';
import { decodeRaw, encode, newEventId, openBucket } from '@tooltx/nats';
import { history, waitForOperation } from './ops.js';
import type { TestNats } from './nats.js';

export const LIFECYCLES_DIR = join(dirname(fileURLToPath(import.meta.url)), '..', 'fixtures', 'lifecycles');

export type LifecycleKind = 'committed' | 'rejected' | 'resolved';

/** One recorded operation. */
export interface RecordedLifecycle {
  kind: LifecycleKind;
  taskId: string;
  input: Record<string, unknown>;
  operationKey: string;
  /** The event-log records of the operation, in order, as stored. */
  events: OperationEvent[];
  /** The result store's entry of a committed operation (msgpack value as JSON). */
  result?: unknown;
  /** The status answer it gave, without its `at`. */
  status: Omit<StatusAnswer, 'at'>;
}

/** One fixture file: a contract version's recorded lifecycles. */
export interface LifecycleFixture {
  contract: string;
  interfaceDigest: string;
  tenant: string;
  actor: string;
  /** The recording stack's receipt keys (key id → public PEM): a replay trusts them too. */
  receiptKeys: Record<string, string>;
  lifecycles: RecordedLifecycle[];
}

const fileOf = (contract: string) => join(LIFECYCLES_DIR, `${contract}.json`);

/** The committed fixture of `contract` (`name@version`). */
export function loadLifecycles(contract: string): LifecycleFixture {
  const f = JSON.parse(readFileSync(fileOf(contract), 'utf8')) as LifecycleFixture;
  for (const l of f.lifecycles) l.events = l.events.map((e) => operationEventSchema.parse(e));
  return f;
}

/**
 * Records the three lifecycles of `contract` on the stack of `t` (its authorizer and executor
 * running, `sink` the HTTP sink they write to), through the SDK of `tenant`/`actor`.
 */
export async function recordLifecycles(
  t: TestNats,
  sink: { refuseWritesWith: number; hang: boolean },
  contract: Contract,
  inputOf: (title: string) => Record<string, unknown>,
  who = { tenant: 'acme', actor: 'alice' },
): Promise<LifecycleFixture> {
  const tools: Tools = await createTools({
    servers: t.url,
    tenant: who.tenant,
    actor: who.actor,
    nkeyFile: t.agentSeed(who.tenant, who.actor),
    contracts: [contract],
    prefix: t.subjects.prefix,
    receiptKeys: t.auth.receiptKeysFile,
  });
  const results = await openBucket(t.nc, t.subjects.resultsBucket);
  const lifecycles: RecordedLifecycle[] = [];
  const tag = `v${contract.version}`;
  try {
    const call = (taskId: string, input: Record<string, unknown>, budgetMs?: number) =>
      tools.execute({ tool: contract.name, version: contract.version, taskId, input }, budgetMs ? { budgetMs } : {});
    const keep = async (kind: LifecycleKind, taskId: string, input: Record<string, unknown>) => {
      const operationKey = prepareCall(contract, taskId, input).operationKey;
      const e = await results.get(t.subjects.resultKey(who.tenant, operationIdOf(operationKey)));
      const { at: _at, ...status } = await tools.status({ operationKey });
      lifecycles.push({
        kind,
        taskId,
        input,
        operationKey,
        events: await history(t, who.tenant, operationKey),
        ...(e?.operation === 'PUT' && e.length ? { result: decodeRaw(e.value) } : {}),
        status,
      });
    };
    const ok = inputOf(`Recorded committed ${tag}`);
    await call(`fixture-ok-${tag}`, ok);
    await keep('committed', `fixture-ok-${tag}`, ok);

    sink.refuseWritesWith = 403;
    const refused = inputOf(`Recorded rejected ${tag}`);
    await call(`fixture-rejected-${tag}`, refused);
    sink.refuseWritesWith = 0;
    await keep('rejected', `fixture-rejected-${tag}`, refused);

    // Unknown (the sink never answers), then resolved by a person as not applied.
    sink.hang = true;
    const lost = inputOf(`Recorded unknown ${tag}`);
    const lostKey = prepareCall(contract, `fixture-resolved-${tag}`, lost).operationKey;
    await call(`fixture-resolved-${tag}`, lost, 1_000);
    const unknown = await waitForOperation(t, who.tenant, lostKey, (s) => s.status === 'unknown', 20_000);
    sink.hang = false;
    await handleCommand(t.store, who.tenant, operationIdOf(lostKey), () => ({
      type: 'resolve',
      eventId: newEventId(),
      at: Date.now(),
      attempt: unknown.status === 'unknown' ? unknown.attempt : 1,
      resolvedBy: 'oscar',
      outcome: { kind: 'not_applied' },
    }));
    await keep('resolved', `fixture-resolved-${tag}`, lost);
  } finally {
    await tools.close();
  }
  return {
    contract: contract.id,
    interfaceDigest: contract.interfaceDigest,
    tenant: who.tenant,
    actor: who.actor,
    receiptKeys: JSON.parse(readFileSync(t.auth.receiptKeysFile, 'utf8')) as Record<string, string>,
    lifecycles,
  };
}

/**
 * Appends a fixture's records to the event log of `t` (each operation's events under their
 * expected subject sequence, as the services append them) and its results to the result store.
 */
export async function replayLifecycles(t: TestNats, f: LifecycleFixture): Promise<void> {
  const results = await openBucket(t.nc, t.subjects.resultsBucket);
  for (const l of f.lifecycles) {
    const opId = operationIdOf(l.operationKey);
    let seq = 0;
    for (const e of l.events) seq = await t.store.append(f.tenant, opId, e, seq);
    if (l.result !== undefined) await results.put(t.subjects.resultKey(f.tenant, opId), encode(l.result));
  }
}

// Run as a script: record the sink.write fixtures on a stack of its own.
if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const { provisioned } = await import('./nats.js');
  const { Sink } = await import('./sink.js');
  const { SINK_TOOLS, startService } = await import('./services.js');
  const { sinkWrite } = await import('../fixtures/sink-tools.js');
  const { sinkWriteV2 } = await import('../fixtures/sink-tools-v2.js');
  const t = await provisioned();
  const sink = await new Sink().start();
  const env = {
    ...t.env,
    SINK_URL: sink.url,
    TOOLTX_TOOLS_MODULE: join(dirname(SINK_TOOLS), 'sink-tools-v2.ts'),
  };
  const services = await Promise.all([startService('authorizer', env), startService('executor', env)]);
  try {
    const note = (title: string) => ({
      bucket: 'kb-fixture',
      title,
      body: `Body of ${title}.`,
      at: '2026-12-01T06:00:00Z',
    });
    for (const [c, inputOf] of [
      [sinkWrite, note],
      [sinkWriteV2, (title: string) => ({ ...note(title), approver: 'bob' })],
    ] as const) {
      const f = await recordLifecycles(t, sink, c, inputOf);
      writeFileSync(fileOf(c.id), `${JSON.stringify(f, null, 2)}\n`);
      process.stdout.write(`recorded ${f.lifecycles.length} lifecycles of ${c.id}\n`);
    }
  } finally {
    await Promise.all(services.map((s) => s.stop()));
    await sink.stop();
    await t.close();
  }
}
