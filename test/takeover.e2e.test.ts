/**
 * When evidence runs out: FM-14 (unknown past the deadline → a complete takeover record,
 * the task frozen at intake and at the execution instant, a person's resolution unfreezes it),
 * FM-11 (nats or the authorizer unreachable before acceptance: the SDK redelivers under the same
 * key, one row), FM-15 (each failure class leads to its next action). Real nats-server with auth,
 * the services as processes, the KB as a process behind a real HTTP hop, the operator CLI.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { downstreamKeyOf, operationIdOf, prepareCall } from '@tooltx/contracts';
import { createTools, type Tools } from '@tooltx/client';
import { MAX_LATE_START_REQUEUES, type OperationRecord, type TakeoverRecord } from '@tooltx/lifecycle';
import { HttpFaultProxy, TcpFaultProxy } from '@tooltx/dev/faults';
import { provisioned, type TestNats } from './helpers/nats.js';
import { startService, type ServiceProcess } from './helpers/services.js';
import { history, waitForOperation, takeoverCli as takeoverCliOf } from './helpers/ops.js';
import { kbRowsFor, RESEARCH_TOOLS, startKb, type TestKb } from './helpers/kb.js';
import { researchContracts } from '../examples/research-kb/contracts.js';
import { beyondOne, figure, takeoverFigure } from './helpers/figures.js';

// A short contract timing: one attempt 1 s, running bound 0.5 s, unknown for 3 s before takeover.
const TIMING = { timeoutMs: 1_000, runningBoundMs: 500, unknownDeadlineMs: 3_000 };
const contracts = researchContracts({ kbDedup: false, timing: TIMING });
const note = (title: string, kb = 'research') => ({
  kb,
  title,
  body: `Notes on ${title}.`,
  sourceUrl: 'https://example.org/src',
  fetchedAt: '2026-11-30T06:00:00Z',
});
const keyOf = (taskId: string, title: string, kb = 'research') =>
  prepareCall(contracts.writeNote, taskId, note(title, kb)).operationKey;

let t: TestNats;
let kb: TestKb;
let proxy: HttpFaultProxy;
let env: Record<string, string>;
let authorizer: ServiceProcess;
let executor: ServiceProcess;
let reconciler: ServiceProcess;
let alice: Tools;

const rowsFor = (key: string) => kbRowsFor(kb, 'acme', key);
/** Makes the write of `key` end `unknown` and keeps every probe of it failing (nothing is ever known). */
const keepUnknown = (key: string) => {
  const dk = downstreamKeyOf('acme', key);
  // Held past the attempt's deadline: the executor gives up (unknown); the KB refuses the late request.
  proxy.inject(dk, { kind: 'delay', ms: TIMING.timeoutMs + 1_500 });
  const prev = proxy.drop;
  proxy.drop = (req) => (req.method === 'GET' && req.url === `/v1/notes/by-key/${encodeURIComponent(dk)}`) || prev(req);
};
/** `tooltx takeover …` as operator `oscar`. */
const takeoverCli = (...args: string[]) => takeoverCliOf(t, ...args);

beforeAll(async () => {
  t = await provisioned();
  kb = await startKb({
    tenants: [
      { id: 'acme', quota: 10_000 },
      { id: 'globex', quota: 1 },
    ],
    knowledgeBases: [
      { tenant: 'acme', name: 'research', defaultRole: 'writer' },
      { tenant: 'acme', name: 'notes2', defaultRole: 'writer' },
      { tenant: 'acme', name: 'board', members: [{ actor: 'bob', role: 'writer' }] },
      { tenant: 'globex', name: 'gkb', defaultRole: 'writer' },
    ],
  });
  proxy = await new HttpFaultProxy(kb.url).start();
  env = {
    ...t.env,
    TOOLTX_TOOLS_MODULE: RESEARCH_TOOLS,
    KB_URL: proxy.url,
    KB_KEEPALIVE: 'off',
    KB_TIMING_MS: `${TIMING.timeoutMs},${TIMING.runningBoundMs},${TIMING.unknownDeadlineMs}`,
    TOOLTX_RECONCILE_INTERVAL_MS: '300',
    // An allowed origin where nothing listens: web.fetch_page's dependency is down (FM-15).
    WEB_ALLOWED_ORIGINS: 'http://127.0.0.1:9',
  };
  [authorizer, executor, reconciler] = await Promise.all([
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
  const codes = await Promise.all([authorizer, executor, reconciler].map((p) => p?.stop()));
  await proxy?.stop();
  await kb?.stop();
  await t?.close();
  expect(codes).toEqual([0, 0, 0]);
});

describe('FM-14: unknown past the deadline', () => {
  it('writes a complete takeover record, freezes the task at intake and at the execution instant, and a manual resolution unfreezes it', async ({
    task,
  }) => {
    const keyA = keyOf('fm14', 'Never known');
    keepUnknown(keyA);
    // The reconciler is down while A goes unknown and C of the same task is accepted; the executor is
    // down while C waits — so C is accepted before the freeze and re-checked after it, in that order.
    await reconciler.stop();
    const started = Date.now();
    const pendingA = alice.execute({ tool: 'kb.write_note', taskId: 'fm14', input: note('Never known') });
    await waitForOperation(t, 'acme', keyA, (s) => s.status === 'unknown', 20_000);
    await executor.stop();
    const keyC = keyOf('fm14', 'Accepted before the freeze');
    const pendingC = alice.execute({
      tool: 'kb.write_note',
      taskId: 'fm14',
      input: note('Accepted before the freeze'),
    });
    await waitForOperation(t, 'acme', keyC, (s) => s.status === 'accepted', 20_000);
    reconciler = await startService('reconciler', env);
    await waitForOperation(t, 'acme', keyA, (s) => s.status === 'unknown' && s.takeover !== undefined, 30_000);
    executor = await startService('executor', env);

    const a = await pendingA;
    expect(a).toMatchObject({ status: 'unknown', lastServerState: 'unknown', next: 'hand_over' });
    const record = (a.status === 'unknown' ? a.evidence.takeover : undefined) as TakeoverRecord;
    const stateA = (await t.store.load('acme', operationIdOf(keyA))).state as OperationRecord;
    // Unknown, then handed over: the takeover record is the operation's convergence.
    figure(task, takeoverFigure(record));
    if (record)
      figure(task, {
        name: 'unknown until the takeover',
        value: record.times.openedAt - (record.times.unknownSince ?? record.times.openedAt),
        unit: 'ms',
      });
    expect(record).toEqual(stateA.takeover);
    expect(record).toMatchObject({
      operationKey: keyA,
      tenant: 'acme',
      taskId: 'fm14',
      tool: 'kb.write_note',
      version: 1,
      targetDigest: stateA.targetDigest,
      inputDigest: stateA.inputDigest,
      reason: 'unknown_past_deadline',
      attempts: { attempt: 1, requeues: 0 },
    });
    expect(record.attempts.probes).toBeGreaterThanOrEqual(1);
    // The executor's own timeout evidence, or the reconciler's failed probe (whichever came first).
    expect(['timeout', 'probe']).toContain(record.lastEvidence?.kind);
    expect(record.times.acceptedAt).toBeGreaterThanOrEqual(started);
    expect(record.times.runningAt).toBeGreaterThanOrEqual(record.times.acceptedAt);
    expect(record.times.unknownSince).toBeGreaterThanOrEqual(record.times.runningAt!);
    expect(record.times.openedAt - record.times.unknownSince!).toBeGreaterThanOrEqual(TIMING.unknownDeadlineMs);
    expect((await history(t, 'acme', keyA)).map((e) => e.type)).toEqual(['accepted', 'running', 'unknown', 'takeover']);

    // Refused at the execution instant: accepted before the freeze, never ran, nothing written.
    const c = await pendingC;
    expect(c).toMatchObject({ status: 'rejected', error: { class: 'task_frozen' }, next: 'hand_over' });
    const typesC = (await history(t, 'acme', keyC)).map((e) => e.type);
    expect(typesC[0]).toBe('accepted');
    expect(typesC.at(-1)).toBe('rejected');
    expect(typesC).not.toContain('running');
    expect(figure(task, { name: 'kb rows of the write refused while frozen', value: await rowsFor(keyC) })).toBe(0);

    // Refused at intake: a new write of the frozen task is never registered.
    const keyB = keyOf('fm14', 'Depends on the unknown one');
    const b = await alice.execute({ tool: 'kb.write_note', taskId: 'fm14', input: note('Depends on the unknown one') });
    expect(b).toMatchObject({ status: 'rejected', error: { class: 'task_frozen' }, next: 'hand_over' });
    expect((await t.store.load('acme', operationIdOf(keyB))).state.status).toBe('none');
    // Another task is not affected.
    expect(
      (await alice.execute({ tool: 'kb.write_note', taskId: 'fm14-other', input: note('Another task') })).status,
    ).toBe('committed');

    // The operator sees it, verifies downstream, and resolves it as not applied.
    const listed = await takeoverCli('list');
    expect(listed).toContainEqual(expect.objectContaining({ operationKey: keyA, taskId: 'fm14', status: 'unknown' }));
    const [shown] = await takeoverCli('show', keyA);
    expect(shown).toMatchObject({ status: 'unknown', takeover: { operationKey: keyA } });
    expect(await rowsFor(keyA)).toBe(0);
    const [resolved] = await takeoverCli('resolve', keyA, '--not-applied');
    expect(resolved).toMatchObject({
      status: 'rejected',
      error: { class: 'not_applied' },
      resolution: { by: 'oscar', outcome: 'not_applied' },
    });
    expect((await history(t, 'acme', keyA)).at(-1)).toMatchObject({
      type: 'rejected',
      manual: true,
      resolvedBy: 'oscar',
    });
    expect(await takeoverCli('list')).not.toContainEqual(expect.objectContaining({ operationKey: keyA }));

    // Unfrozen: the dependent write, the refused one and the resolved one all go through, once each.
    proxy.clear();
    for (const [title, kbName] of [
      ['Depends on the unknown one', 'research'],
      ['Accepted before the freeze', 'research'],
      ['Never known', 'research'],
    ] as const) {
      const r = await alice.execute({ tool: 'kb.write_note', taskId: 'fm14', input: note(title, kbName) });
      expect({ title, r }).toMatchObject({ title, r: { status: 'committed' } });
      const rows = await rowsFor(keyOf('fm14', title, kbName));
      figure(task, { name: 'kb rows per key after the thaw', value: rows, duplicates: beyondOne(rows) });
      expect(rows).toBe(1);
    }
  });

  it('FM-14: a downstream path that swallows every request while the probe finds nothing: the attempt is sent again at most MAX_LATE_START_REQUEUES times, then stays unknown and is handed to a person; no row', async () => {
    const key = keyOf('fm14-swallowed', 'Swallowed');
    const dropped = proxy.inject(downstreamKeyOf('acme', key), { kind: 'drop' }, { times: Number.POSITIVE_INFINITY });
    try {
      const r = await alice.execute({ tool: 'kb.write_note', taskId: 'fm14-swallowed', input: note('Swallowed') });
      expect(r.status).not.toBe('committed');
      await waitForOperation(t, 'acme', key, (s) => s.status === 'unknown' && s.takeover !== undefined, 60_000);
    } finally {
      dropped.cancel();
    }
    const types = (await history(t, 'acme', key)).map((e) => e.type);
    expect(types.filter((x) => x === 'requeued')).toHaveLength(MAX_LATE_START_REQUEUES);
    expect(types.slice(-2)).toEqual(['unknown', 'takeover']);
    const state = (await t.store.load('acme', operationIdOf(key))).state as OperationRecord;
    expect(state.takeover).toMatchObject({
      reason: 'unknown_past_deadline',
      attempts: { attempt: 1, requeues: MAX_LATE_START_REQUEUES },
    });
    expect(await rowsFor(key)).toBe(0);
    // Nothing arrived: the person resolves it not applied, and the task thaws.
    const [resolved] = await takeoverCli('resolve', key, '--not-applied');
    expect(resolved).toMatchObject({ status: 'rejected', error: { class: 'not_applied' } });
  });

  it('a person who verified the effect resolves it committed: the caller gets a manual receipt with the resource id', async ({
    task,
  }) => {
    const key = keyOf('fm14-c', 'Verified by hand');
    keepUnknown(key);
    const first = await alice.execute({ tool: 'kb.write_note', taskId: 'fm14-c', input: note('Verified by hand') });
    const record = first.status === 'unknown' ? first.evidence.takeover : undefined;
    figure(task, takeoverFigure(record));
    expect(first).toMatchObject({
      status: 'unknown',
      next: 'hand_over',
      evidence: { takeover: { operationKey: key } },
    });
    const [resolved] = await takeoverCli('resolve', key, '--committed', 'note-verified-by-oscar');
    expect(resolved).toMatchObject({
      status: 'committed',
      receipt: { resourceId: 'note-verified-by-oscar', manual: true, resolvedBy: 'oscar' },
    });
    // No longer watched: the tenant must be named. Resolving again with the same outcome answers the
    // same state; another outcome is refused.
    await expect(takeoverCli('resolve', key, '--not-applied')).rejects.toThrow(/not_found.*tenant/);
    expect((await takeoverCli('resolve', key, '--committed', 'note-verified-by-oscar', '--tenant', 'acme'))[0]).toEqual(
      resolved,
    );
    await expect(takeoverCli('resolve', key, '--not-applied', '--tenant', 'acme')).rejects.toThrow(
      /idempotency_conflict/,
    );
    const r = await alice.execute({ tool: 'kb.write_note', taskId: 'fm14-c', input: note('Verified by hand') });
    expect(r).toMatchObject({
      status: 'committed',
      receipt: { resourceId: 'note-verified-by-oscar', manual: true, resolvedBy: 'oscar' },
      next: 'continue',
    });
    proxy.clear();
    // The task is thawed: its next write goes through.
    expect(
      (await alice.execute({ tool: 'kb.write_note', taskId: 'fm14-c', input: note('After the resolution') })).status,
    ).toBe('committed');
  });

  it('an agent cannot reach the takeover service, and an operator cannot name someone else as resolver', async () => {
    const asAgent = await t.connectAs({ kind: 'agent', tenant: 'acme', actor: 'alice' });
    try {
      await expect(
        asAgent.request(t.subjects.takeover('oscar'), JSON.stringify({ action: 'list' }), { timeout: 2_000 }),
      ).rejects.toThrow();
    } finally {
      await asAgent.close();
    }
    await expect(takeoverCli('resolve', keyOf('x', 'y'), '--not-applied', '--tenant', 'acme')).rejects.toThrow(
      /not_found/,
    );
  });
});

describe('FM-11: unreachable before acceptance', () => {
  it('the authorizer is down: the SDK redelivers under the same key once it is back; one operation, one row', async () => {
    const key = keyOf('fm11', 'Authorizer down');
    await authorizer.stop();
    const pending = alice.execute({ tool: 'kb.write_note', taskId: 'fm11', input: note('Authorizer down') });
    await new Promise((r) => setTimeout(r, 2_000));
    authorizer = await startService('authorizer', env);
    const r = await pending;
    expect(r.status).toBe('committed');
    expect((await history(t, 'acme', key)).filter((e) => e.type === 'accepted')).toHaveLength(1);
    expect(await rowsFor(key)).toBe(1);
  });

  it('nats-server is unreachable for the agent: its connection is cut and refused for a while; the same key lands once', async () => {
    const hop = await new TcpFaultProxy(t.server.port).start();
    // A long budget: the client waits out its own connection timeout (20 s) when a handshake is cut.
    const agent = await createTools({
      servers: hop.url,
      tenant: 'acme',
      actor: 'alice',
      nkeyFile: t.agentSeed('acme', 'alice'),
      contracts: contracts.all,
      prefix: t.subjects.prefix,
      receiptKeys: t.auth.receiptKeysFile,
      budgetMs: 75_000,
    });
    try {
      const key = keyOf('fm11-nats', 'Nats unreachable');
      // Its connection is cut now, and its next one as soon as it names itself.
      hop.program({ name: 'tooltx-sdk:acme/alice' }, { kind: 'cut' }, { times: 2 });
      hop.cutAll();
      const r = await agent.execute({ tool: 'kb.write_note', taskId: 'fm11-nats', input: note('Nats unreachable') });
      expect(r.status).toBe('committed');
      expect(hop.injected).toHaveLength(2);
      expect((await history(t, 'acme', key)).filter((e) => e.type === 'accepted')).toHaveLength(1);
      expect(await rowsFor(key)).toBe(1);
    } finally {
      await agent.close();
      await hop.stop();
    }
  }, 120_000);
});

describe('FM-15: each failure class leads to its next action', () => {
  it('invalid_input → replan (nothing submitted), forbidden → reauthorise, quota_exceeded → wait_or_stop with its window', async () => {
    const bad = await alice.execute({
      tool: 'kb.write_note',
      taskId: 'fm15',
      input: { ...note('Bad'), tenant: 'globex' },
    });
    expect(bad).toMatchObject({
      status: 'rejected',
      error: { class: 'invalid_input', issues: [expect.objectContaining({ path: ['input', 'tenant'] })] },
      next: 'replan',
    });
    const forbidden = await alice.execute({
      tool: 'kb.write_note',
      taskId: 'fm15',
      input: note('Not my board', 'board'),
    });
    expect(forbidden).toMatchObject({ status: 'rejected', error: { class: 'forbidden' }, next: 'reauthorise' });
    expect(await rowsFor(keyOf('fm15', 'Not my board', 'board'))).toBe(0);

    const gina = await t.agentTools('globex', 'gina', contracts.all);
    try {
      expect(
        (await gina.execute({ tool: 'kb.write_note', taskId: 'fm15', input: note('First of the day', 'gkb') })).status,
      ).toBe('committed');
      const over = await gina.execute({ tool: 'kb.write_note', taskId: 'fm15', input: note('Over quota', 'gkb') });
      expect(over).toMatchObject({ status: 'rejected', error: { class: 'quota_exceeded' }, next: 'wait_or_stop' });
      if (over.status === 'rejected') expect(over.error.retryAfterMs).toBeGreaterThan(0);
    } finally {
      await gina.close();
    }
  });

  it('dependency_unavailable → backoff (a read is retried a bounded number of times first)', async () => {
    const r = await alice.execute({
      tool: 'web.fetch_page',
      taskId: 'fm15',
      input: { url: 'http://127.0.0.1:9/page' },
    });
    expect(r).toMatchObject({ status: 'rejected', error: { class: 'dependency_unavailable' }, next: 'backoff' });
    if (r.status === 'rejected') expect(r.attempt).toBeGreaterThan(1);
  });

  it('running → observe when the budget ends while the attempt runs; unknown past the budget → hand_over; neither is reported as done', async () => {
    // The KB holds the write 800 ms (inside its 1 s attempt); the caller's budget is 400 ms.
    const slowKey = keyOf('fm15', 'Slow write');
    proxy.inject(downstreamKeyOf('acme', slowKey), { kind: 'delay', ms: 800 });
    const slow = await alice.execute(
      { tool: 'kb.write_note', taskId: 'fm15', input: note('Slow write') },
      { budgetMs: 400 },
    );
    expect(slow).toMatchObject({ status: 'unknown', next: 'observe' });
    if (slow.status === 'unknown') expect(['not_seen', 'accepted', 'running']).toContain(slow.lastServerState);
    // Observing again (the same call) gives the receipt; one row.
    expect((await alice.execute({ tool: 'kb.write_note', taskId: 'fm15', input: note('Slow write') })).status).toBe(
      'committed',
    );
    expect(await rowsFor(slowKey)).toBe(1);

    // Unknown (the attempt timed out, probes fail) when the 2.5 s budget ends, before any takeover.
    const unknownKey = keyOf('fm15-u', 'Unknown past the budget');
    keepUnknown(unknownKey);
    const u = await alice.execute(
      { tool: 'kb.write_note', taskId: 'fm15-u', input: note('Unknown past the budget') },
      { budgetMs: 2_500 },
    );
    expect(u).toMatchObject({ status: 'unknown', lastServerState: 'unknown', next: 'hand_over' });
    proxy.clear();
  });
});
