/**
 * The co-located layout (`tooltx serve`): every role in one process, the authorizer handing what it
 * accepts and starts in one append to the executor of the same process (docs/performance.md). Real
 * nats-server, the real KB with KB_DEDUP=off (every request that reaches its insert path is a row:
 * tooltx alone prevents duplicates), a real HTTP hop that holds or cuts a request, and SIGKILL of
 * the whole process (FM-27): a restarted instance converges with exactly one row.
 */
import { afterAll, beforeAll, describe, expect, it, type TaskMeta } from 'vitest';
import { downstreamKeyOf, operationIdOf, prepareCall } from '@tooltx/contracts';
import { Kvm } from '@nats-io/kv';
import type { Tools } from '@tooltx/client';
import type { OperationRecord } from '@tooltx/lifecycle';
import { provisioned, type TestNats } from './helpers/nats.js';
import { startHost, type ServiceProcess } from './helpers/services.js';
import { history } from './helpers/ops.js';
import { kbRowsFor, RESEARCH_TOOLS, startKb, type TestKb } from './helpers/kb.js';
import { DelayProxy } from './helpers/delay-proxy.js';
import { burstAcrossServerRestart, cutAfterCommit, isNotesPost, note, RECOVERY_TIMING } from './helpers/kb-faults.js';
import { beyondOne, convergence, figure } from './helpers/figures.js';
import { researchContracts } from '../examples/research-kb/contracts.js';

const TIMING = RECOVERY_TIMING;
/** A killed call's budget, ms: a redelivery after the reconciler durable's ack_wait (30 s), and the probe after it. */
const KILLED_BUDGET_MS = 75_000;
const contracts = researchContracts({ kbDedup: false, timing: TIMING });
let t: TestNats;
let kb: TestKb;
let proxy: DelayProxy;
let env: Record<string, string>;
let host: ServiceProcess;
let alice: Tools;

const keyOf = (taskId: string, title: string) => prepareCall(contracts.writeNote, taskId, note(title)).operationKey;
/** What the shared fault scenarios (helpers/kb-faults.ts) need of this file's deployment. */
const faults = (task: { meta: TaskMeta }) => ({
  t,
  kb,
  proxy,
  writeNote: contracts.writeNote,
  contracts: contracts.all,
  task,
  alice,
});
/** A supervisor's restart: the killed process's successor, on the same deployment. */
const restart = async () => {
  await host.kill();
  host = await startHost(env);
};

beforeAll(async () => {
  t = await provisioned();
  kb = await startKb(
    {
      tenants: [{ id: 'acme', quota: 10_000 }],
      knowledgeBases: [{ tenant: 'acme', name: 'research', defaultRole: 'writer' }],
    },
    { KB_DEDUP: 'off' },
  );
  proxy = await new DelayProxy(kb.url).start();
  env = {
    ...t.env,
    TOOLTX_TOOLS_MODULE: RESEARCH_TOOLS,
    KB_URL: proxy.url,
    KB_KEEPALIVE: 'off',
    KB_DEDUP: 'off',
    KB_TIMING_MS: `${TIMING.timeoutMs},${TIMING.runningBoundMs},${TIMING.unknownDeadlineMs}`,
    TOOLTX_RECONCILE_INTERVAL_MS: '300',
    // Indexed at once: a process killed right after the start leaves its operation in the index for
    // the next instance's sweep (a held index write would wait out the durable's ack wait first).
    TOOLTX_RECONCILE_INDEX_DELAY_MS: '0',
  };
  host = await startHost(env);
  alice = await t.agentTools('acme', 'alice', contracts.all, {
    budgetMs: 30_000,
  });
});

afterAll(async () => {
  await alice?.close();
  const code = await host?.stop();
  if (code !== 0)
    console.log(code, host?.stderr, JSON.stringify(host?.lines.filter((l) => Number(l.level) >= 40).slice(-30)));
  await proxy?.stop();
  await kb?.stop();
  await t?.close();
  expect(code).toBe(0);
});

describe('co-located layout: every role in one process', () => {
  it('a call is accepted and started in one append, runs in the same process, and commits once with a signed receipt; a repeat reads it back without submitting', async () => {
    // The first call to a downstream that tells its clock goes through the event log's path, which
    // asks the downstream's clock first; every later one is started in the same append.
    await alice.execute({ tool: 'kb.write_note', taskId: 'colo-0', input: note('Learns the clock') });
    const key = keyOf('colo-1', 'One process');
    const r = await alice.execute({ tool: 'kb.write_note', taskId: 'colo-1', input: note('One process') });
    expect(r.status).toBe('committed');
    const events = await history(t, 'acme', key);
    expect(events.map((e) => e.type)).toEqual(['accepted', 'committed']);
    expect(events[0]!.state).toMatchObject({ status: 'running', running: { eventId: events[0]!.eventId } });
    // One check at the execution instant served both the acceptance and the start.
    expect((events[0]!.state as OperationRecord).authorization?.execution).toBeDefined();
    // A repeat of a call this client saw committed is a read: no intent is stored for it.
    const intents = async () => (await t.jsm.streams.info(t.subjects.intentsStream('acme'))).state.messages;
    const before = await intents();
    const again = await alice.execute({ tool: 'kb.write_note', taskId: 'colo-1', input: note('One process') });
    expect(again).toMatchObject({ status: 'committed', operationKey: key });
    expect(await intents()).toBe(before);
    if (r.status === 'committed' && again.status === 'committed') expect(again.receipt).toEqual(r.receipt);
    expect(await kbRowsFor(kb, 'acme', key)).toBe(1);
    // The process reads the event log once, on its own durable, for its three consuming roles.
    const delivered = async (d: string) =>
      (await t.jsm.consumers.info(t.subjects.eventsStream, d)).delivered.stream_seq;
    expect(await delivered('host')).toBeGreaterThan(0);
    for (const d of ['executor', 'reconciler', 'audit-projector']) expect(await delivered(d)).toBe(0);
  });

  it('FM-01: the same call submitted twice at the same moment, by two clients: one KB row, both get the same receipt', async ({
    task,
  }) => {
    const bob = await t.agentTools('acme', 'alice', contracts.all, {
      budgetMs: 30_000,
    });
    try {
      const call = { tool: 'kb.write_note', taskId: 'colo-01', input: note('Twice at once') };
      const [a, b] = await Promise.all([alice.execute(call), bob.execute(call)]);
      const rows = await kbRowsFor(kb, 'acme', keyOf('colo-01', 'Twice at once'));
      figure(task, { name: 'kb rows for the key', value: rows, duplicates: beyondOne(rows) });
      expect([a.status, b.status]).toEqual(['committed', 'committed']);
      if (a.status === 'committed' && b.status === 'committed') expect(b.receipt).toEqual(a.receipt);
      expect(rows).toBe(1);
    } finally {
      await bob.close();
    }
  });

  it("FM-02: the agent's connection is cut after the commit, before the reply: the retry gets the original receipt and writes nothing", async ({
    task,
  }) => {
    await cutAfterCommit(faults(task), 'colo-02');
  });

  it('FM-28: a burst of writes across a kill -9 and restart of nats-server (store intact): every one committed, one row each, and the projections on memory storage are rebuilt', async ({
    task,
  }) => {
    const { titles, keys, results, rowsPerKey } = await burstAcrossServerRestart(faults(task), 'colo-28');
    expect(results.map((r) => r.status)).toEqual(titles.map(() => 'committed'));
    expect(rowsPerKey).toEqual(titles.map(() => 1));
    // The audit projection (memory storage, lost with the server) holds every one of them again.
    // Read until it does: the provisioner's own connection may still be reconnecting (a read then
    // times out) and the bucket may still be rebuilt.
    const deadline = Date.now() + 20_000;
    const missing = async (): Promise<string[]> => {
      try {
        const kv = await new Kvm(t.nc).open(t.subjects.auditBucket);
        const out: string[] = [];
        for (const key of keys) {
          const e = await kv.get(t.subjects.projectionKey('acme', operationIdOf(key)));
          if (e?.operation !== 'PUT') out.push(key);
        }
        return out;
      } catch {
        return keys;
      }
    };
    let left = await missing();
    while (left.length && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 250));
      left = await missing();
    }
    expect(left).toEqual([]);
    expect((await t.jsm.streams.info(`KV_${t.subjects.auditBucket}`)).config.storage).toBe('memory');
  });

  describe('FM-27: the whole process killed mid-operation (kill -9)', { timeout: 240_000 }, () => {
    it("killed after the KB committed, before `committed` was appended: the restarted process probes and commits with the KB's row id, one row", async ({
      task,
    }) => {
      // Under heavy load the write can reach the KB after its 1.5 s deadline and be refused: then that
      // round did not test a commit (it still converges to one row) and the next round does.
      let committedByKb = false;
      for (let round = 0; round < 3 && !committedByKb; round++) {
        const title = `Host killed after the commit ${round}`;
        const key = keyOf('colo-27c', title);
        const held = proxy.inject(downstreamKeyOf('acme', key), { kind: 'hold_response', ms: 120_000 });
        const killed = held.applied.then(async (f) => {
          await restart();
          return f;
        });
        const r = await alice.execute(
          { tool: 'kb.write_note', taskId: 'colo-27c', input: note(title) },
          { budgetMs: KILLED_BUDGET_MS },
        );
        const answered = await killed;
        const probe = await kb.client.probe({ tenant: 'acme', key: downstreamKeyOf('acme', key) });
        const types = (await history(t, 'acme', key)).map((e) => e.type);
        figure(task, { name: 'final state', value: r.status });
        figure(task, {
          name: 'kb rows for the key',
          value: probe.found ? probe.count : 0,
          duplicates: beyondOne(probe.found ? probe.count : 0),
          ...convergence(types),
        });
        expect(r.status, JSON.stringify({ r, events: types })).toBe('committed');
        expect(probe).toMatchObject({ found: true, count: 1 });
        if (answered.status !== 201) continue;
        committedByKb = true;
        if (r.status === 'committed' && probe.found) expect(r.receipt.resourceId).toBe(probe.id);
        // Accepted and started in one append, never started again: the probe found the effect.
        expect(types[0]).toBe('accepted');
        expect(types).not.toContain('running');
        expect(types).not.toContain('requeued');
        expect(types.at(-1)).toBe('committed');
      }
      expect(committedByKb).toBe(true);
    });

    it('killed before its request reached the KB: the restarted process finds nothing after the deadline, requeues under the same key, commits once', async ({
      task,
    }) => {
      const key = keyOf('colo-27b', 'Host never arrived');
      let cut = 0;
      proxy.hold = (req) => (isNotesPost(req) && cut === 0 ? 300 : 0);
      proxy.drop = (req) => isNotesPost(req) && cut++ === 0;
      proxy.onHeld = () => void restart();
      try {
        // A process killed before its index write of the operation leaves the restarted instance to
        // learn of it when the event comes back, after the reconciler durable's ack_wait (30 s):
        // the budget covers that path too.
        const r = await alice.execute(
          { tool: 'kb.write_note', taskId: 'colo-27b', input: note('Host never arrived') },
          { budgetMs: KILLED_BUDGET_MS },
        );
        const events = await history(t, 'acme', key);
        const rows = await kbRowsFor(kb, 'acme', key);
        figure(task, { name: 'final state', value: r.status });
        figure(task, {
          name: 'kb rows for the key',
          value: rows,
          duplicates: beyondOne(rows),
          ...convergence(events.map((e) => e.type)),
        });
        expect(r.status, JSON.stringify({ r, events: events.map((e) => e.type) })).toBe('committed');
        expect(rows).toBe(1);
        expect(events.map((e) => e.type)).toContain('requeued');
        const s = (await t.store.load('acme', operationIdOf(key))).state as OperationRecord;
        expect(s).toMatchObject({ status: 'committed', attempt: 1 });
      } finally {
        proxy.hold = () => 0;
        proxy.drop = () => false;
        proxy.onHeld = () => undefined;
      }
    });
  });
});
