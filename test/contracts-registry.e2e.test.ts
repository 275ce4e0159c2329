/**
 * The contract registry over a contract's life (docs/contracts.md): versions published by the
 * services at start (a second service with another interface digest under one name@version refuses
 * to start), the current version an unpinned call gets, usage per version from the audit records,
 * deprecate and retire (`contract_retired`, old keys still answer), an automatic revert over a
 * threshold, a manual revert (running tasks keep their version, FM-23) and a revert with
 * `--stop-running` (`contract_withdrawn`). Real nats-server, the authorizer, executor and
 * audit-projector as processes loading `sink.write@1…3` (test/fixtures/sink-tools-v3.ts), a real
 * HTTP sink, the `tooltx contracts` CLI as a process (the other commands through the same request
 * subject, as the operator's own connection).
 */
import { execFile } from 'node:child_process';
import { dirname, join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTools, type Tools } from '@tooltx/client';
import type { ContractsAnswer, VersionRow } from '@tooltx/readside';
import { provisioned, TEST_IDENTITIES, type TestNats } from './helpers/nats.js';
import { ROOT, SINK_TOOLS, startService, type ServiceProcess } from './helpers/services.js';
import { Sink } from './helpers/sink.js';
import { contracts as v3Contracts, sinkWriteV3 } from './fixtures/sink-tools-v3.js';
import { sinkWrite } from './fixtures/sink-tools.js';
import { jetstreamManager } from '@nats-io/jetstream';
import type { NatsConnection } from '@nats-io/transport-node';
import { openBucket, permissionViolationOf } from '@tooltx/nats';

const V3_TOOLS = join(dirname(SINK_TOOLS), 'sink-tools-v3.ts');
const CONFLICT_TOOLS = join(dirname(SINK_TOOLS), 'sink-tools-conflict.ts');
const TENANT = 'acme';
const OPERATOR = 'carla';
let t: TestNats;
let sink: Sink;
let services: ServiceProcess[] = [];
let operatorNc: NatsConnection;
const agents: Tools[] = [];

const note = (title: string, approver?: string) => ({
  bucket: 'kb-reg',
  title,
  body: `Body of ${title}.`,
  at: '2026-12-01T06:00:00Z',
  ...(approver ? { approver } : {}),
});
const agent = async (actor: string) => {
  const tools = await createTools({
    servers: t.url,
    tenant: TENANT,
    actor,
    nkeyFile: t.agentSeed(TENANT, actor),
    contracts: v3Contracts,
    prefix: t.subjects.prefix,
    receiptKeys: t.auth.receiptKeysFile,
  });
  agents.push(tools);
  return tools;
};
/** One request to the contracts service, as the operator granted `contracts`. */
const ask = async (req: Record<string, unknown>): Promise<ContractsAnswer> =>
  JSON.parse(
    (await operatorNc.request(t.subjects.opsContracts(OPERATOR), JSON.stringify(req), { timeout: 10_000 })).string(),
  ) as ContractsAnswer;
const rows = async (name = 'sink.write'): Promise<VersionRow[]> => {
  const a = await ask({ action: 'usage', name });
  if (!a.ok || !('versions' in a)) throw new Error(JSON.stringify(a));
  return a.versions;
};
const row = (rs: VersionRow[], version: number) => rs.find((r) => r.version === version)!;
/** Runs `tooltx contracts <args>` as the operator. */
const cli = (args: string[]): Promise<{ code: number; stdout: string; stderr: string }> =>
  new Promise((resolve) =>
    execFile(
      process.execPath,
      ['--import', 'tsx', join(ROOT, 'bin', 'tooltx.ts'), 'contracts', ...args],
      {
        cwd: ROOT,
        env: {
          PATH: process.env.PATH ?? '',
          NATS_URL: t.url,
          TOOLTX_PREFIX: t.subjects.prefix,
          NATS_NKEY_FILE: t.auth.seedFile({ kind: 'operator', operator: OPERATOR }),
          TOOLTX_OPERATOR: OPERATOR,
        },
      },
      (err, stdout, stderr) =>
        resolve({ code: err ? (typeof err.code === 'number' ? err.code : 1) : 0, stdout, stderr }),
    ),
  );

beforeAll(async () => {
  t = await provisioned({}, undefined, {
    identities: { ...TEST_IDENTITIES, operators: ['oscar', { id: OPERATOR, may: ['contracts'] }] },
  });
  sink = await new Sink().start();
  const env = { ...t.env, SINK_URL: sink.url, TOOLTX_TOOLS_MODULE: V3_TOOLS };
  services = await Promise.all([
    startService('authorizer', env),
    // Held marks renewed hourly: a mark the test deletes stays deleted.
    startService('executor', { ...env, TOOLTX_HELD_MARK_MS: '3600000' }),
    startService('audit-projector', {
      ...env,
      TOOLTX_AUDIT_BATCH_MS: '0',
      TOOLTX_REVERT_THRESHOLD: '0.5',
      TOOLTX_REVERT_MIN_COUNT: '3',
      TOOLTX_REVERT_MIN_TENANTS: '2',
      TOOLTX_REVERT_WINDOW_MS: '60000',
      TOOLTX_REVERT_CHECK_MS: '200',
    }),
  ]);
  operatorNc = await t.connectAs({ kind: 'operator', operator: OPERATOR });
});

afterAll(async () => {
  await Promise.all(agents.map((a) => a.close()));
  await operatorNc?.close();
  const codes = await Promise.all(services.map((s) => s.stop()));
  await sink?.stop();
  await t?.close();
  expect(codes).toEqual(services.map(() => 0));
});

describe('contract registry', () => {
  it("the services published every version, the newest registered is current, and a service whose sink.write@1 has another interface digest refuses to start naming both digests; an agent reads only a name's current version", async () => {
    const rs = await rows();
    // Held: the running executor holds all three.
    expect(rs.map((r) => [r.version, r.current, r.held, r.state, r.interfaceDigest])).toEqual([
      [1, false, true, 'active', sinkWrite.interfaceDigest],
      [2, false, true, 'active', expect.stringMatching(/^sha256:/)],
      [3, true, true, 'active', sinkWriteV3.interfaceDigest],
    ]);
    const other = await startService(
      'authorizer',
      { ...t.env, SINK_URL: sink.url, TOOLTX_TOOLS_MODULE: CONFLICT_TOOLS },
      { wait: false },
    );
    expect(await other.exited, other.stderr).toBe(2);
    const line = other.lines.find((l) => l.msg === 'failed to start');
    expect(line).toMatchObject({ setting: 'TOOLTX_TOOLS_MODULE', problem: expect.stringContaining('sink.write@1') });
    expect(String(line!.problem)).toContain(sinkWrite.interfaceDigest);
    expect(String(line!.problem)).toMatch(/this module's is sha256:[0-9a-f]{64}/);
    // The registry still holds the first one.
    expect(row(await rows(), 1).interfaceDigest).toBe(sinkWrite.interfaceDigest);

    // An agent may read a name's current version, and nothing else of the registry.
    const nc = await t.connectAs({ kind: 'agent', tenant: TENANT, actor: 'alice' });
    try {
      const jsm = await jetstreamManager(nc, { checkAPI: false });
      const bucket = t.subjects.contractsBucket;
      const get = (key: string) => jsm.direct.getMessage(`KV_${bucket}`, { last_by_subj: `$KV.${bucket}.${key}` });
      expect((await get('current.sink.write'))?.data.length).toBeGreaterThan(0);
      const denied = await get('version.sink.write.1').then(
        () => null,
        (err: unknown) => err,
      );
      expect(permissionViolationOf(denied)).not.toBeNull();
    } finally {
      await nc.close();
    }
  });

  it('FM-23: an unpinned call gets the current version; usage counts the tasks and actors on each version (CLI)', async () => {
    const [alice, bob] = await Promise.all([agent('alice'), agent('bob')]);
    // @1: alice's task u1 (two steps) and bob's task u2; @3 (current): alice's task u3, unpinned.
    const calls = await Promise.all([
      alice.execute({ tool: 'sink.write', version: 1, taskId: 'u1', input: note('u1 a') }),
      alice.execute({ tool: 'sink.write', version: 1, taskId: 'u1', input: note('u1 b') }),
      bob.execute({ tool: 'sink.write', version: 1, taskId: 'u2', input: note('u2') }),
      alice.execute({ tool: 'sink.write', taskId: 'u3', input: note('u3', 'bob') }),
    ]);
    expect(calls.map((c) => c.status === 'committed' && c.receipt.version)).toEqual([1, 1, 1, 3]);
    await expect.poll(async () => row(await rows(), 1).usage.operations, { timeout: 10_000 }).toBe(3);
    const run = await cli(['usage', 'sink.write', '--since', '10m']);
    expect(run.code, run.stderr).toBe(0);
    const printed = run.stdout
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as VersionRow);
    expect(row(printed, 1).usage).toMatchObject({ operations: 3, tasks: 2, actors: 2, ratio: 0 });
    expect(row(printed, 3).usage).toMatchObject({ operations: 1, tasks: 1, actors: 1, ratio: 0 });
    expect(row(printed, 2).usage).toMatchObject({ operations: 0, tasks: 0, actors: 0 });
  });

  it('deprecate announces a sunset (intents still admitted); retire refuses new intents contract_retired naming the versions to use, while old keys answer and a resubmission gets its original receipt', async () => {
    const alice = agents[0]!;
    const sunset = new Date(Date.now() + 3_600_000).toISOString();
    expect(await ask({ action: 'deprecate', contract: 'sink.write@1', sunsetAt: Date.parse(sunset) })).toMatchObject({
      ok: true,
      changed: [{ version: 1, deprecated: { sunsetAt: Date.parse(sunset), by: `operator:${OPERATOR}` } }],
    });
    expect(row(await rows(), 1)).toMatchObject({ state: 'deprecated', sunsetAt: Date.parse(sunset) });
    const before = await alice.execute({ tool: 'sink.write', version: 1, taskId: 'd1', input: note('d1') });
    expect(before).toMatchObject({ status: 'committed', receipt: { version: 1 } });

    expect(await ask({ action: 'retire', contract: 'sink.write@3' })).toMatchObject({
      ok: false,
      error: { class: 'invalid_input', issues: [{ path: ['contract'], code: 'current_version' }] },
    });
    expect(await ask({ action: 'retire', contract: 'sink.write@1' })).toMatchObject({ ok: true });
    let n = 0;
    await expect
      .poll(
        async () => alice.execute({ tool: 'sink.write', version: 1, taskId: `r${n++}`, input: note('after retire') }),
        { timeout: 5_000 },
      )
      .toMatchObject({
        status: 'rejected',
        next: 'refresh_contract',
        error: {
          class: 'contract_retired',
          issues: [{ path: ['version'], message: 'sink.write@1 is retired; use sink.write@3, sink.write@2' }],
        },
      });
    const requests = sink.requests.length;
    // The retired version's keys still answer, and their resubmission is the original outcome.
    expect(await alice.status({ operationKey: before.operationKey! })).toMatchObject({ state: 'committed' });
    expect(await alice.execute({ tool: 'sink.write', version: 1, taskId: 'd1', input: note('d1') })).toEqual(before);
    expect(sink.requests.length).toBe(requests);
    expect(row(await rows(), 1).state).toBe('retired');
  });

  it('a threshold of calls gone wrong on the current version reverts it automatically to the previous one, recorded as auto:threshold, once two tenants are over it: one tenant alone never reverts a name for all', async () => {
    const bob = agents[1]!;
    const gina = await t.agentTools('globex', 'gina', v3Contracts);
    agents.push(gina);
    const bad = (tools: Tools, tag: string) =>
      Promise.all(
        ['1', '2', '3'].map((n) =>
          tools.execute({ tool: 'sink.write', taskId: `${tag}${n}`, input: note(`bad ${tag}${n}`, 'alice') }),
        ),
      );
    sink.refuseWritesWith = 403;
    try {
      // acme alone: every call rejected, and the name stays on @3.
      const acme = await bad(bob, 'a');
      expect(acme.map((b) => [b.status, b.status === 'rejected' && b.error?.class])).toEqual([
        ['rejected', 'forbidden'],
        ['rejected', 'forbidden'],
        ['rejected', 'forbidden'],
      ]);
      await expect.poll(async () => row(await rows(), 3).usage.failed, { timeout: 10_000 }).toBe(3);
      // Several checks of the rule (every 200 ms) see acme's three failed calls.
      await new Promise((r) => setTimeout(r, 1_500));
      expect((await rows()).find((r) => r.current)?.version).toBe(3);
      // globex too: two tenants over the threshold.
      const globex = await bad(gina, 'g');
      expect(globex.map((b) => b.status)).toEqual(['rejected', 'rejected', 'rejected']);
    } finally {
      sink.refuseWritesWith = 0;
    }
    await expect.poll(async () => (await rows()).find((r) => r.current)?.version, { timeout: 10_000 }).toBe(2);
    const a = await ask({ action: 'usage', name: 'sink.write' });
    expect(a.ok && 'switches' in a && a.switches?.at(-1)).toMatchObject({
      from: 3,
      to: 2,
      by: 'auto:threshold',
      reason: 'revert',
    });
    expect(row((a as { versions: VersionRow[] }).versions, 3).usage).toMatchObject({ failed: 6, ratio: 6 / 7 });
  });

  it('FM-23: a manual revert makes the previous version current for new tasks while a running task keeps its own; with --stop-running its next step is refused contract_withdrawn naming the version to use', async () => {
    // A task started on @2 (current after the automatic revert).
    const carol = await agent('researcher');
    const r1 = await carol.execute({ tool: 'sink.write', taskId: 'run-1', input: note('run-1 a', 'bob') });
    expect(r1).toMatchObject({ status: 'committed', receipt: { version: 2 } });

    // No running executor holds @3 any more (its held marks gone): a revert to it is refused
    // version_not_held; the operator may insist with --unheld.
    const kv = await openBucket(t.nc, t.subjects.contractsBucket);
    for await (const key of await kv.keys('held.sink.write.3.>')) await kv.delete(key);
    await expect.poll(async () => row(await rows(), 3).held, { timeout: 5_000 }).toBe(false);
    // @2 is current by the automatic revert: a revert must name it to undo that one.
    const unnamed = await cli(['revert', 'sink.write']);
    expect(unnamed.code).toBe(1);
    expect(unnamed.stderr).toContain('[already_reverted]');
    const refused = await cli(['revert', 'sink.write', '--from', '2']);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toContain('name: no running executor holds sink.write@3');
    expect(refused.stderr).toContain('[version_not_held]');
    expect((await rows()).find((r) => r.current)?.version).toBe(2);

    // Manual revert: @3 (the version before @2) is current again, recorded with the operator.
    expect(await ask({ action: 'revert', name: 'sink.write', from: 2, unheld: true })).toMatchObject({
      ok: true,
      current: {
        current: 3,
        switches: expect.arrayContaining([
          { from: 2, to: 3, by: `operator:${OPERATOR}`, at: expect.any(Number), reason: 'revert' },
        ]),
      },
      changed: [],
    });
    // A new host reads the current version at createTools: a new task gets @3.
    const fresh = await agent('mallory');
    expect(await fresh.execute({ tool: 'sink.write', taskId: 'new-1', input: note('new-1', 'bob') })).toMatchObject({
      status: 'committed',
      receipt: { version: 3 },
    });
    // The running task keeps @2.
    expect(await carol.execute({ tool: 'sink.write', taskId: 'run-1', input: note('run-1 b', 'bob') })).toMatchObject({
      status: 'committed',
      receipt: { version: 2 },
    });

    // A task on @3 now, then a revert with --stop-running (CLI): @2 current, @3 withdrawn.
    const s1 = await fresh.execute({ tool: 'sink.write', taskId: 'stop-1', input: note('stop-1 a', 'bob') });
    expect(s1).toMatchObject({ status: 'committed', receipt: { version: 3 } });
    expect(await ask({ action: 'revert', name: 'sink.write', stopRunning: true, from: 3 })).toMatchObject({
      ok: true,
      current: { current: 2 },
      changed: [{ version: 3, withdrawn: { by: `operator:${OPERATOR}` } }],
    });
    let n = 0;
    await expect
      .poll(() => fresh.execute({ tool: 'sink.write', taskId: 'stop-1', input: note(`stop-1 step ${n++}`, 'bob') }), {
        timeout: 5_000,
      })
      .toMatchObject({
        status: 'rejected',
        next: 'replan',
        error: {
          class: 'contract_withdrawn',
          issues: [{ path: ['version'], message: 'sink.write@3 is withdrawn; use sink.write@2' }],
        },
      });
    // Its keys keep answering; the task's next step, re-planned, runs on @2.
    expect(await fresh.status({ operationKey: s1.operationKey! })).toMatchObject({ state: 'committed' });
    expect(
      await fresh.execute({ tool: 'sink.write', taskId: 'stop-1', input: note('stop-1 replanned', 'bob') }),
    ).toMatchObject({
      status: 'committed',
      receipt: { version: 2 },
    });
  });

  it('an executor stopped cleanly removes its held marks: no version is held any more', async () => {
    const executor = services.find((p) => p.name === 'executor')!;
    expect(await executor.stop()).toBe(0);
    await expect.poll(async () => (await rows()).map((r) => r.held), { timeout: 5_000 }).toEqual([false, false, false]);
  });
});
