/**
 * Verify before acting: real processes, the real KB in both dedup modes (with off, every
 * request that reaches its insert path makes a row), a real HTTP hop that can hold or cut a request,
 * SIGKILL of the executor. Each test asserts the KB's own rows for the key: exactly one.
 * FM-12 / FM-13 (a timeout around the commit), FM-27 (executor killed mid-operation).
 * The hop is `@tooltx/dev/faults`' HTTP proxy (keyed faults by the write's downstream key, or predicates
 * for requests without one); the tools run with keep-alive off, so one cut touches one request.
 */
import { execFile } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { downstreamKeyOf, operationIdOf, prepareCall } from '@tooltx/contracts';
import { newSubmission, publishSubmission, type Tools } from '@tooltx/client';
import type { OperationRecord } from '@tooltx/lifecycle';
import { jetStreamOf } from '@tooltx/nats';
import { provisioned, type TestNats } from './helpers/nats.js';
import { startService, type ServiceProcess } from './helpers/services.js';
import { history, waitForOperation } from './helpers/ops.js';
import { kbRowsFor, RESEARCH_TOOLS, startKb, type TestKb } from './helpers/kb.js';
import { DelayProxy } from './helpers/delay-proxy.js';
import { burstAcrossServerRestart, cutAfterCommit, isNotesPost, note, RECOVERY_TIMING } from './helpers/kb-faults.js';
import { beyondOne, convergence, figure } from './helpers/figures.js';
import { researchContracts } from '../examples/research-kb/contracts.js';

const TIMING = RECOVERY_TIMING;
let t: TestNats;
let kb: TestKb;
let proxy: DelayProxy;
let env: Record<string, string>;
let procs: ServiceProcess[] = [];
let executor: ServiceProcess;
let alice: Tools;

const rowsFor = (key: string) => kbRowsFor(kb, 'acme', key);

// Every fault test runs against the KB in both modes: with KB_DEDUP=off (every request that
// reaches the insert path is a row: tooltx alone prevents duplicates) and on (the KB honours the key).
for (const dedup of [false, true]) {
  describe(`KB_DEDUP=${dedup ? 'on' : 'off'}`, () => {
    const contracts = researchContracts({ kbDedup: dedup, timing: TIMING });
    const keyOf = (taskId: string, title: string) => prepareCall(contracts.writeNote, taskId, note(title)).operationKey;

    beforeAll(async () => {
      t = await provisioned();
      kb = await startKb(
        {
          tenants: [{ id: 'acme', quota: 10_000 }],
          knowledgeBases: [{ tenant: 'acme', name: 'research', defaultRole: 'writer' }],
        },
        { KB_DEDUP: dedup ? 'on' : 'off' },
      );
      proxy = await new DelayProxy(kb.url).start();
      env = {
        ...t.env,
        TOOLTX_TOOLS_MODULE: RESEARCH_TOOLS,
        KB_URL: proxy.url,
        KB_KEEPALIVE: 'off',
        KB_DEDUP: dedup ? 'on' : 'off',
        KB_TIMING_MS: `${TIMING.timeoutMs},${TIMING.runningBoundMs},${TIMING.unknownDeadlineMs}`,
        TOOLTX_RECONCILE_INTERVAL_MS: '300',
      };
      procs = await Promise.all([startService('authorizer', env), startService('reconciler', env)]);
      executor = await startService('executor', env);
      alice = await t.agentTools('acme', 'alice', contracts.all, {
        budgetMs: 30_000,
      });
    });

    afterAll(async () => {
      await alice?.close();
      const all = [...procs, executor];
      const codes = await Promise.all(all.map((p) => p.stop()));
      all.forEach((p, i) => {
        if (codes[i] !== 0)
          console.log(
            p.name,
            codes[i],
            p.stderr,
            JSON.stringify(p.lines.filter((l) => Number(l.level) >= 40).slice(-30), null, 1),
          );
      });
      await proxy?.stop();
      await kb?.stop();
      await t?.close();
      expect(codes).toEqual([0, 0, 0]);
    });

    describe('FM-27: executor killed mid-operation', () => {
      it('killed before `running` (during its re-check): the operation stays accepted, is re-driven, commits once', async ({
        task,
      }) => {
        const key = keyOf('fm27-0', 'Killed before running');
        let resolves = 0;
        // The first resolve is the authorizer's intake check; the second, the executor's re-check.
        proxy.hold = (req) =>
          req.method === 'GET' && req.url?.startsWith('/v1/resolve') && ++resolves === 2 ? 800 : 0;
        proxy.onHeld = () => void executor.kill().then(async () => (executor = await startService('executor', env)));
        try {
          const r = await alice.execute({
            tool: 'kb.write_note',
            taskId: 'fm27-0',
            input: note('Killed before running'),
          });
          const types = (await history(t, 'acme', key)).map((e) => e.type);
          const rows = await rowsFor(key);
          figure(task, { name: 'final state', value: r.status });
          figure(task, {
            name: 'kb rows for the key',
            value: rows,
            duplicates: beyondOne(rows),
            ...convergence(types),
          });
          expect(r.status).toBe('committed');
          expect(types[0]).toBe('accepted');
          expect(types.filter((x) => x === 'running')).toHaveLength(1);
          expect(types.at(-1)).toBe('committed');
          expect(rows).toBe(1);
        } finally {
          proxy.hold = () => 0;
          proxy.onHeld = () => undefined;
        }
      });

      it("killed while its request was on the way; the KB committed it anyway: the reconciler probes and commits with the KB's row id, one row", async ({
        task,
      }) => {
        const key = keyOf('fm27-a', 'Killed in flight');
        let held = 0;
        proxy.hold = (req) => (isNotesPost(req) && held++ === 0 ? 800 : 0);
        // Killed while its request waits in the hop; a new executor comes up (as a supervisor would).
        proxy.onHeld = () => void executor.kill().then(async () => (executor = await startService('executor', env)));
        try {
          const r = await alice.execute({ tool: 'kb.write_note', taskId: 'fm27-a', input: note('Killed in flight') });
          const probe = await kb.client.probe({ tenant: 'acme', key: downstreamKeyOf('acme', key) });
          const types = (await history(t, 'acme', key)).map((e) => e.type);
          const rows = probe.found ? probe.count : 0;
          figure(task, { name: 'final state', value: r.status });
          figure(task, {
            name: 'kb rows for the key',
            value: rows,
            duplicates: beyondOne(rows),
            ...convergence(types),
          });
          expect(r.status).toBe('committed');
          expect(probe).toMatchObject({ found: true, count: 1 });
          if (r.status === 'committed' && probe.found) expect(r.receipt.resourceId).toBe(probe.id);
          expect(types.slice(0, 2)).toEqual(['accepted', 'running']);
          expect(types.at(-1)).toBe('committed');
        } finally {
          proxy.hold = () => 0;
          proxy.onHeld = () => undefined;
        }
      });

      it("killed after the KB committed but before `committed` was appended: the reconciler probes and commits with the KB's row id, one row", async ({
        task,
      }) => {
        // Forward the write, let the KB commit it, hold its answer; once the KB has answered, the
        // executor is SIGKILLed (and a new one comes up, as a supervisor would). Under heavy load the
        // write can reach the KB after its 1.5 s deadline and be refused: then that round did not
        // test a commit (it still converges to one row) and the next round does.
        let committedByKb = false;
        for (let round = 0; round < 3 && !committedByKb; round++) {
          const title = `Killed after the commit ${round}`;
          const key = keyOf('fm27-c', title);
          const held = proxy.inject(downstreamKeyOf('acme', key), { kind: 'hold_response', ms: 120_000 });
          const killed = held.applied.then(async (f) => {
            await executor.kill();
            executor = await startService('executor', env);
            return f;
          });
          const r = await alice.execute({ tool: 'kb.write_note', taskId: 'fm27-c', input: note(title) });
          const answered = await killed;
          const probe = await kb.client.probe({ tenant: 'acme', key: downstreamKeyOf('acme', key) });
          const rows = probe.found ? probe.count : 0;
          figure(task, { name: 'final state', value: r.status });
          figure(task, {
            name: 'kb rows for the key',
            value: rows,
            duplicates: beyondOne(rows),
            ...convergence((await history(t, 'acme', key)).map((e) => e.type)),
          });
          expect(answered).toMatchObject({ kind: 'hold_response', method: 'POST' });
          expect(r.status).toBe('committed');
          expect(probe).toMatchObject({ found: true, count: 1 });
          if (answered.status !== 201) continue;
          committedByKb = true;
          if (r.status === 'committed' && probe.found) expect(r.receipt.resourceId).toBe(probe.id);
          const types = (await history(t, 'acme', key)).map((e) => e.type);
          expect(types[0]).toBe('accepted');
          // One run, found by the probe after the kill: never re-driven once it was running. (Before
          // it ran, a stale-accepted re-drive may happen when the executor the previous test
          // restarted came up slower than the 1 s running bound.)
          expect(types.filter((x) => x === 'running')).toHaveLength(1);
          expect(types.slice(types.indexOf('running'))).not.toContain('requeued');
          expect(types.at(-1)).toBe('committed');
        }
        expect(committedByKb).toBe(true);
      });

      it('killed before its request reached the KB: nothing found after the deadline, requeued under the same key, committed once', async ({
        task,
      }) => {
        const key = keyOf('fm27-b', 'Never arrived');
        let cut = 0;
        proxy.hold = (req) => (isNotesPost(req) && cut === 0 ? 300 : 0);
        proxy.drop = (req) => isNotesPost(req) && cut++ === 0;
        proxy.onHeld = () => void executor.kill().then(async () => (executor = await startService('executor', env)));
        try {
          const r = await alice.execute({ tool: 'kb.write_note', taskId: 'fm27-b', input: note('Never arrived') });
          const events = await history(t, 'acme', key);
          const rows = await rowsFor(key);
          figure(task, { name: 'final state', value: r.status });
          figure(task, {
            name: 'kb rows for the key',
            value: rows,
            duplicates: beyondOne(rows),
            ...convergence(events.map((e) => e.type)),
          });
          expect(r.status).toBe('committed');
          expect(rows).toBe(1);
          expect(events.map((e) => e.type)).toContain('requeued');
          const s = (await t.store.load('acme', operationIdOf(key))).state as OperationRecord;
          // Requeued once after the probe; once more if the new executor came up slower than the
          // running bound (stale accepted). Either way one row, one attempt.
          expect(s).toMatchObject({ status: 'committed', attempt: 1 });
          expect(s.requeues).toBeGreaterThanOrEqual(1);
        } finally {
          proxy.hold = () => 0;
          proxy.drop = () => false;
          proxy.onHeld = () => undefined;
        }
      });
    });

    describe('FM-12 / FM-13: timeouts around the commit', () => {
      it('a request held past its deadline: the executor records unknown (never rejected), the KB refuses the late request, the reconciler re-drives it once', async ({
        task,
      }) => {
        const key = keyOf('fm12', 'Held past the deadline');
        let held = 0;
        proxy.hold = (req) => (isNotesPost(req) && held++ === 0 ? TIMING.timeoutMs + 700 : 0);
        try {
          const r = await alice.execute({
            tool: 'kb.write_note',
            taskId: 'fm12',
            input: note('Held past the deadline'),
          });
          const types = (await history(t, 'acme', key)).map((e) => e.type);
          const rows = await rowsFor(key);
          figure(task, { name: 'final state', value: r.status });
          figure(task, {
            name: 'kb rows for the key',
            value: rows,
            duplicates: beyondOne(rows),
            ...convergence(types),
          });
          expect(r.status).toBe('committed');
          if (!dedup) expect(types).toEqual(['accepted', 'running', 'unknown', 'requeued', 'running', 'committed']);
          else expect(types.slice(0, 3)).toEqual(['accepted', 'running', 'unknown']);
          expect(types.at(-1)).toBe('committed');
          expect(rows).toBe(1);
        } finally {
          proxy.hold = () => 0;
        }
      });

      it('a slow commit inside the deadline: the caller observes running, then committed, one row', async ({
        task,
      }) => {
        const key = keyOf('fm12-slow', 'Slow but in time');
        proxy.hold = (req) => (isNotesPost(req) ? 900 : 0);
        try {
          const pending = alice.execute({
            tool: 'kb.write_note',
            taskId: 'fm12-slow',
            input: note('Slow but in time'),
          });
          await waitForOperation(t, 'acme', key, (s) => s.status === 'running');
          const r = await pending;
          const types = (await history(t, 'acme', key)).map((e) => e.type);
          const rows = await rowsFor(key);
          figure(task, { name: 'states observed', value: types.join(' → ') });
          figure(task, { name: 'kb rows for the key', value: rows, duplicates: beyondOne(rows) });
          expect(r.status).toBe('committed');
          expect(types).toEqual(['accepted', 'running', 'committed']);
          expect(rows).toBe(1);
        } finally {
          proxy.hold = () => 0;
        }
      });
    });

    describe('FM-13: the downstream committed, the answer came too late', () => {
      it('the executor times out after the KB committed: unknown, then the probe finds the row and the caller gets its receipt', async ({
        task,
      }) => {
        const key = keyOf('fm13', 'Answer too late');
        let held = 0;
        proxy.holdResponse = (req) => (isNotesPost(req) && held++ === 0 ? TIMING.timeoutMs + 1_000 : 0);
        try {
          const r = await alice.execute({ tool: 'kb.write_note', taskId: 'fm13', input: note('Answer too late') });
          const types = (await history(t, 'acme', key)).map((e) => e.type);
          const probe = await kb.client.probe({ tenant: 'acme', key: downstreamKeyOf('acme', key) });
          const rows = probe.found ? probe.count : 0;
          figure(task, { name: 'final state', value: r.status });
          figure(task, {
            name: 'kb rows for the key',
            value: rows,
            duplicates: beyondOne(rows),
            ...convergence(types),
          });
          expect(r.status).toBe('committed');
          expect(types.slice(0, 3)).toEqual(['accepted', 'running', 'unknown']);
          expect(types.at(-1)).toBe('committed');
          expect(probe).toMatchObject({ found: true, count: 1 });
          if (r.status === 'committed' && probe.found) expect(r.receipt.resourceId).toBe(probe.id);
        } finally {
          proxy.holdResponse = () => 0;
        }
      });
    });

    describe("FM-02: the server commits, the agent's connection is cut before the reply", () => {
      it('status returns the original resource id and a retry writes nothing', async ({ task }) => {
        await cutAfterCommit({ t, kb, proxy, writeNote: contracts.writeNote, contracts: contracts.all, task }, 'fm02');
      });
    });

    describe('FM-28: nats-server restarted mid-run', () => {
      it('a burst of writes across a kill -9 and restart of nats-server (store intact): every one committed, exactly one row each', async ({
        task,
      }) => {
        const { titles, keys, results, rowsPerKey } = await burstAcrossServerRestart(
          { t, kb, proxy, writeNote: contracts.writeNote, contracts: contracts.all, task, alice },
          'fm28',
        );
        expect(results.map((r) => r.status)).toEqual(titles.map(() => 'committed'));
        for (const [i, key] of keys.entries())
          if (rowsPerKey[i] !== 1)
            console.log(
              'DUP',
              titles[i],
              rowsPerKey[i],
              JSON.stringify(
                (await history(t, 'acme', key)).map((e) => ({
                  type: e.type,
                  at: e.at,
                  attempt: e.attempt,
                  ev: 'evidence' in e ? e.evidence : undefined,
                  err: 'error' in e ? e.error : undefined,
                  exec: e.type === 'running' ? e.executor : undefined,
                  dl: e.type === 'running' ? e.deadlineAt : undefined,
                  reason: e.type === 'requeued' ? e.reason : undefined,
                })),
              ),
              JSON.stringify(results.map((r) => r.status)),
            );
        expect(rowsPerKey).toEqual(titles.map(() => 1));
      });
    });

    describe('a stale accepted operation is re-driven', () => {
      it('an accepted operation the executor never got (its message lost) is requeued by the reconciler and committed once', async () => {
        await executor.stop();
        const input = note('Lost dispatch');
        const key = keyOf('stale', 'Lost dispatch');
        await publishSubmission(
          t.js,
          newSubmission(t.subjects, 'acme', 'alice', { tool: 'kb.write_note', version: 1, taskId: 'stale', input }),
        );
        await waitForOperation(t, 'acme', key, (s) => s.status === 'accepted');
        // The executor's copy of the event is lost: settled on its durable by someone else (connected
        // as the executor: only it may ack there; the provisioner's ack would be refused).
        const asExecutor = await t.connectAs({ kind: 'service', service: 'executor' });
        const c = await (await jetStreamOf(asExecutor)).js.consumers.get(t.subjects.eventsStream, 'executor');
        for (let i = 0; i < 50; i++) {
          const m = await c.next({ expires: 1_000 });
          if (!m) break;
          const mine = m.subject === t.subjects.op('acme', operationIdOf(key));
          if (mine) await m.ackAck();
          else m.ack();
          if (mine) break;
        }
        await asExecutor.close();
        // The operator sees it waiting (once the reconciler's index has caught up with the log).
        const pending = () =>
          new Promise<string>((resolve, reject) =>
            execFile(
              process.execPath,
              ['--import', 'tsx', 'bin/tooltx.ts', 'ops', 'pending'],
              { env: { ...process.env, ...t.env, NATS_NKEY_FILE: t.auth.seedFile({ kind: 'provisioner' }) } },
              (err, out) => (err ? reject(err) : resolve(out)),
            ),
          ).then((out) =>
            out
              .split('\n')
              .filter(Boolean)
              .map((l) => JSON.parse(l) as { operationKey: string; status: string }),
          );
        let listed = await pending();
        for (let i = 0; i < 10 && !listed.some((x) => x.operationKey === key); i++) listed = await pending();
        expect(listed).toContainEqual(expect.objectContaining({ operationKey: key }));
        executor = await startService('executor', env);
        const s = (await waitForOperation(t, 'acme', key, (x) => x.status === 'committed', 20_000)) as OperationRecord;
        // Requeued at least once (again if the new executor was slower than the running bound);
        // only one `running` can win, so it ran once.
        expect(s.requeues).toBeGreaterThanOrEqual(1);
        const types = (await history(t, 'acme', key)).map((e) => e.type);
        expect(types[0]).toBe('accepted');
        expect(types.filter((x) => x === 'requeued').length).toBe(s.requeues);
        expect(types.filter((x) => x === 'running')).toHaveLength(1);
        expect(types.slice(-2)).toEqual(['running', 'committed']);
        expect(await rowsFor(key)).toBe(1);
      });
    });
  });
}
