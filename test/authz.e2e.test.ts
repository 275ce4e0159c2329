/**
 * Authorisation at the execution instant through tooltx end to end: auth on, the
 * authorizer and executor as processes, the real research KB (SQLite, KB_DEDUP=off) as the system of
 * record, a real HTTP hop in between that can hold a write, and a real HTTP server of web pages.
 * Every test asserts the KB's own rows. FM-07, FM-08, FM-09, FM-10, FM-18, FM-19, the quota race and
 * the publishAt window. The services load the sample's trusted module plus one test read tool whose
 * implementation returns fields its output schema does not name (test/fixtures/research-plus-leaky-tools.ts).
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { digestOf, operationIdOf, prepareCall } from '@tooltx/contracts';
import { createTools, newSubmission, publishSubmission, type ExecuteResult, type Tools } from '@tooltx/client';
import type { OperationRecord } from '@tooltx/lifecycle';
import { decode } from '@tooltx/nats';
import { provisioned, resultStore, type TestNats } from './helpers/nats.js';
import { startService, type ServiceProcess } from './helpers/services.js';
import { waitForOperation } from './helpers/ops.js';
import { kbRowsFor, startKb, type TestKb } from './helpers/kb.js';
import { DelayProxy } from './helpers/delay-proxy.js';
import { LEAKED, leakyRead } from './fixtures/leaky-contract.js';
import { researchContracts } from '../examples/research-kb/contracts.js';
import { figure, rowsWhereRefused } from './helpers/figures.js';

const contracts = researchContracts({ kbDedup: false });
const TOOLS_MODULE = join(dirname(fileURLToPath(import.meta.url)), 'fixtures', 'research-plus-leaky-tools.ts');
let t: TestNats;
let kb: TestKb;
let proxy: DelayProxy;
let env: Record<string, string>;
let authorizer: ServiceProcess;
let executor: ServiceProcess;
const agents: Record<string, Tools> = {};
const ids: Record<string, string> = {};

const note = (kbRef: string, title: string, over: Record<string, unknown> = {}) => ({
  kb: kbRef,
  title,
  body: `Notes on ${title}.`,
  sourceUrl: 'https://example.org/src',
  fetchedAt: '2026-11-30T06:00:00Z',
  ...over,
});
const rowsIn = async (kbId: string) => (await kb.client.rowsPerKb({ kbId })).reduce((n, k) => n + k.rows, 0);
const allRows = async () => (await kb.client.rowsPerKb()).reduce((n, k) => n + k.rows, 0);
const keyOf = (taskId: string, input: Record<string, unknown>) =>
  prepareCall(contracts.writeNote, taskId, input).operationKey;

/**
 * A web page much longer than any excerpt: a title, many paragraphs of prose, and a marker deep in
 * the page that an excerpt must not reach. Served by a real HTTP server on loopback, which
 * `web.fetch_page` may fetch because its origin is in WEB_ALLOWED_ORIGINS.
 */
const PAGE_MARKER = 'DEEP-IN-THE-PAGE-7731';
const PAGE = [
  '# Tide tables of the northern coast',
  ...Array.from(
    { length: 40 },
    (_, i) =>
      `Paragraph ${i + 1}: the high and low waters of the harbour follow the moon, and the survey recorded each of them with the time, the height above chart datum and the weather of the day.${i === 35 ? ` ${PAGE_MARKER}` : ''}`,
  ),
].join('\n\n');
let pages: Server;
let pagesUrl: string;
const pageRequests: string[] = [];
const tools = (tenant: string, actor: string) => agents[`${tenant}/${actor}`]!;

beforeAll(async () => {
  t = await provisioned();
  kb = await startKb({
    tenants: [
      { id: 'acme', quota: 10_000 },
      { id: 'globex', quota: 10_000 },
      { id: 'initech', quota: 3 },
    ],
    knowledgeBases: [
      {
        tenant: 'acme',
        name: 'research',
        aliases: ['Research-Notes'],
        members: [
          { actor: 'alice', role: 'writer' },
          { actor: 'bob', role: 'writer' },
        ],
      },
      {
        tenant: 'acme',
        name: 'archive',
        members: [
          { actor: 'alice', role: 'writer' },
          { actor: 'bob', role: 'writer' },
        ],
      },
      { tenant: 'acme', name: 'frozen-kb', members: [{ actor: 'alice', role: 'writer' }] },
      { tenant: 'acme', name: 'gone', members: [{ actor: 'alice', role: 'writer' }] },
      {
        tenant: 'acme',
        name: 'shared',
        members: [
          { actor: 'alice', role: 'writer' },
          { actor: 'bob', role: 'reader' },
        ],
      },
      { tenant: 'globex', name: 'secret', members: [{ actor: 'gina', role: 'writer' }] },
      { tenant: 'initech', name: 'research', defaultRole: 'writer' },
    ],
  });
  for (const k of await kb.admin.list()) ids[`${k.tenant}/${k.name}`] = k.kbId;
  await kb.admin.setState(ids['acme/gone']!, 'deleted');
  proxy = await new DelayProxy(kb.url).start();
  pages = createServer((req, res) => {
    pageRequests.push(req.url ?? '');
    if (req.url !== '/tides') return void res.writeHead(404).end();
    res.writeHead(200, { 'content-type': 'text/markdown; charset=utf-8' }).end(PAGE);
  });
  await new Promise<void>((r) => pages.listen(0, '127.0.0.1', r));
  pagesUrl = `http://127.0.0.1:${(pages.address() as AddressInfo).port}`;
  env = {
    ...t.env,
    TOOLTX_TOOLS_MODULE: TOOLS_MODULE,
    KB_URL: proxy.url,
    KB_DEDUP: 'off',
    WEB_ALLOWED_ORIGINS: pagesUrl,
  };
  [authorizer, executor] = await Promise.all([startService('authorizer', env), startService('executor', env)]);
  for (const [tenant, actor] of [
    ['acme', 'alice'],
    ['acme', 'bob'],
    ['acme', 'noread-eve'],
    ['globex', 'gina'],
    ['initech', 'ivan'],
  ] as const) {
    agents[`${tenant}/${actor}`] = await createTools({
      servers: t.url,
      tenant,
      actor,
      nkeyFile: t.agentSeed(tenant, actor),
      contracts: [...contracts.all, leakyRead],
      prefix: t.subjects.prefix,
      receiptKeys: t.auth.receiptKeysFile,
      budgetMs: 20_000,
    });
  }
});

afterAll(async () => {
  for (const a of Object.values(agents)) await a.close();
  const codes = await Promise.all([authorizer?.stop(), executor?.stop()]);
  await proxy?.stop();
  pages?.closeAllConnections();
  await new Promise((r) => (pages ? pages.close(r) : r(undefined)));
  expect(await kb?.stop()).toBe(0);
  await t?.close();
  expect(codes).toEqual([0, 0]);
});

describe('FM-07: role revoked between acceptance and execution', () => {
  it("a revocation after acceptance is caught by the executor's re-check: rejected, nothing written", async ({
    task,
  }) => {
    await executor.stop();
    const input = note('research', 'Revoked before execution');
    const key = prepareCall(contracts.writeNote, 'fm07-a', input).operationKey;
    await publishSubmission(
      t.js,
      newSubmission(t.subjects, 'acme', 'bob', { tool: 'kb.write_note', version: 1, taskId: 'fm07-a', input }),
    );
    const accepted = (await waitForOperation(t, 'acme', key, (s) => s.status === 'accepted')) as OperationRecord;
    expect(accepted.authorization?.intake).toMatchObject({
      decision: 'allow',
      policyVersion: 'kb-policy@1',
      resources: [{ id: ids['acme/research'] }],
    });
    const before = await rowsIn(ids['acme/research']!);
    await kb.admin.setMember(ids['acme/research']!, { tenant: 'acme', actor: 'bob', role: null });
    executor = await startService('executor', env);
    const s = (await waitForOperation(t, 'acme', key, (x) => x.status === 'rejected')) as OperationRecord;
    expect(s.error?.class).toBe('forbidden');
    expect(s.authorization?.execution).toMatchObject({
      decision: 'deny',
      reason: 'forbidden',
      policyVersion: 'kb-policy@1',
    });
    const after = await rowsIn(ids['acme/research']!);
    figure(task, rowsWhereRefused(after - before));
    expect(after).toBe(before);
    await kb.admin.setMember(ids['acme/research']!, { tenant: 'acme', actor: 'bob', role: 'writer' });
  });

  it("a revocation after the executor's own re-check is caught by the version condition inside the KB: rejected, nothing written", async ({
    task,
  }) => {
    const before = await rowsIn(ids['acme/research']!);
    proxy.hold = (req) => (req.method === 'POST' && req.url === '/v1/notes' ? 1_500 : 0);
    proxy.onHeld = () => void kb.admin.setMember(ids['acme/research']!, { tenant: 'acme', actor: 'bob', role: null });
    try {
      const input = note('research', 'Revoked after re-check');
      const r = await tools('acme', 'bob').execute({ tool: 'kb.write_note', taskId: 'fm07-b', input });
      // The operation was stopped by the version condition inside the KB's transaction…
      const key = prepareCall(contracts.writeNote, 'fm07-b', input).operationKey;
      const s = (await t.store.load('acme', operationIdOf(key))).state as OperationRecord;
      expect(s).toMatchObject({ status: 'rejected', error: { class: 'version_conflict' } });
      // …and bob, no longer a member, may not read it: he is told he needs new authorisation.
      expect(r).toMatchObject({ status: 'rejected', next: 'reauthorise' });
      const after = await rowsIn(ids['acme/research']!);
      figure(task, rowsWhereRefused(after - before));
      expect(after).toBe(before);
    } finally {
      proxy.hold = () => 0;
      proxy.onHeld = () => undefined;
      await kb.admin.setMember(ids['acme/research']!, { tenant: 'acme', actor: 'bob', role: 'writer' });
    }
  });
});

describe('FM-08: resource transferred or frozen between check and commit', () => {
  it('frozen after the check: the version mismatch stops the commit', async ({ task }) => {
    const before = await rowsIn(ids['acme/frozen-kb']!);
    proxy.hold = (req) => (req.method === 'POST' && req.url === '/v1/notes' ? 1_500 : 0);
    proxy.onHeld = () => void kb.admin.setState(ids['acme/frozen-kb']!, 'frozen');
    try {
      const r = await tools('acme', 'alice').execute({
        tool: 'kb.write_note',
        taskId: 'fm08-freeze',
        input: note('frozen-kb', 'Frozen meanwhile'),
      });
      expect(r.status).toBe('rejected');
      if (r.status === 'rejected') expect(['forbidden', 'version_conflict']).toContain(r.error.class);
      const after = await rowsIn(ids['acme/frozen-kb']!);
      figure(task, rowsWhereRefused(after - before));
      expect(after).toBe(before);
    } finally {
      proxy.hold = () => 0;
      proxy.onHeld = () => undefined;
    }
    // Frozen at intake: refused before acceptance, uniform class.
    const again = await tools('acme', 'alice').execute({
      tool: 'kb.write_note',
      taskId: 'fm08-freeze-2',
      input: note('frozen-kb', 'Still frozen'),
    });
    expect(again).toMatchObject({ status: 'rejected', error: { class: 'forbidden' } });
  });

  it('transferred to another tenant after the check: the commit is stopped and the old tenant now sees not_found', async ({
    task,
  }) => {
    const kbId = ids['acme/archive']!;
    const before = await rowsIn(kbId);
    proxy.hold = (req) => (req.method === 'POST' && req.url === '/v1/notes' ? 1_500 : 0);
    proxy.onHeld = () => void kb.admin.transferOwner(kbId, 'globex');
    try {
      const r = await tools('acme', 'alice').execute({
        tool: 'kb.write_note',
        taskId: 'fm08-transfer',
        input: note('archive', 'Transferred meanwhile'),
      });
      expect(r.status).toBe('rejected');
      const after = await rowsIn(kbId);
      figure(task, rowsWhereRefused(after - before));
      expect(after).toBe(before);
    } finally {
      proxy.hold = () => 0;
      proxy.onHeld = () => undefined;
    }
    const later = await tools('acme', 'alice').execute({
      tool: 'kb.write_note',
      taskId: 'fm08-transfer-2',
      input: note('archive', 'After transfer'),
    });
    expect(later).toMatchObject({ status: 'rejected', error: { class: 'not_found' } });
  });
});

describe('FM-09: a batch with one foreign item', () => {
  it("rejects the whole batch at the foreign item's path; nothing is written", async ({ task }) => {
    const before = await rowsIn(ids['acme/research']!);
    const r = await tools('acme', 'alice').execute({
      tool: 'kb.write_notes',
      taskId: 'fm09',
      input: {
        items: [note('research', 'Batch 1'), note(ids['globex/secret']!, 'Smuggled'), note('research', 'Batch 3')],
      },
    });
    expect(r).toMatchObject({
      status: 'rejected',
      error: { class: 'not_found', issues: [{ path: ['input', 'items', 1, 'kb'] }] },
    });
    const after = await rowsIn(ids['acme/research']!);
    figure(task, rowsWhereRefused(after - before));
    expect(after).toBe(before);
    const foreign = await rowsIn(ids['globex/secret']!);
    figure(task, rowsWhereRefused(foreign));
    expect(foreign).toBe(0);
  });

  it('an all-legal batch commits every item under one receipt', async () => {
    const before = await rowsIn(ids['acme/research']!);
    const r = await tools('acme', 'alice').execute({
      tool: 'kb.write_notes',
      taskId: 'fm09-ok',
      input: { items: [note('research', 'Ok 1'), note('Research-Notes', 'Ok 2')] },
    });
    expect(r.status).toBe('committed');
    expect(await rowsIn(ids['acme/research']!)).toBe(before + 2);
  });
});

describe('FM-10: one canonical id for every alias kind; uniform not-found', () => {
  it('name, alias, case, percent-encoding and the internal id all write into the same knowledge base', async () => {
    const kbId = ids['acme/research']!;
    const before = await rowsIn(kbId);
    const refs = ['research', 'RESEARCH', 'Research-Notes', 'research%2Dnotes', kbId];
    const results: ExecuteResult[] = [];
    for (const [i, ref] of refs.entries())
      results.push(
        await tools('acme', 'alice').execute({
          tool: 'kb.write_note',
          taskId: 'fm10',
          input: note(ref, `Alias kind ${i}`),
        }),
      );
    expect(results.map((r) => r.status)).toEqual(refs.map(() => 'committed'));
    for (const r of results) {
      const s = (await t.store.load('acme', operationIdOf(r.operationKey!))).state as OperationRecord;
      expect(s.authorization?.execution?.resources).toEqual([{ id: kbId, version: expect.any(Number) }]);
    }
    expect(await rowsIn(kbId)).toBe(before + refs.length);
  });

  it('a soft-deleted knowledge base, a guessed foreign id and a missing name give one identical answer', async () => {
    const answers = [];
    for (const [i, ref] of [
      ids['acme/gone']!,
      ids['globex/secret']!,
      'no-such-kb',
      'kb_00000000-0000-4000-8000-000000000000',
    ].entries()) {
      const r = await tools('acme', 'alice').execute({
        tool: 'kb.write_note',
        taskId: 'fm10-nf',
        input: note(ref, `Nowhere ${i}`),
      });
      expect(r.status).toBe('rejected');
      answers.push(r.status === 'rejected' ? { error: r.error, next: r.next } : null);
    }
    expect(new Set(answers.map((a) => JSON.stringify(a))).size).toBe(1);
    expect(answers[0]).toEqual({
      error: {
        class: 'not_found',
        issues: [{ path: ['input', 'kb'], code: 'not_found', message: 'no such knowledge base' }],
      },
      next: 'replan',
    });
    expect(await rowsIn(ids['globex/secret']!)).toBe(0);
  });
});

describe('the publishAt window', () => {
  it('publishAt window: before the tolerance or beyond the horizon is refused at intake with nothing written; inside it, exactly one row', async () => {
    const now = Date.now();
    const kbId = ids['acme/research']!;
    const before = await rowsIn(kbId);
    for (const [publishAt, ok] of [
      [new Date(now - 3_600_000).toISOString(), false],
      [new Date(now + 400 * 86_400_000).toISOString(), false],
      [new Date(now + 86_400_000).toISOString(), true],
    ] as const) {
      const taskId = `window-${publishAt}`;
      const input = note('research', `Window ${publishAt}`, { publishAt });
      const r = await tools('acme', 'alice').execute({ tool: 'kb.write_note', taskId, input });
      if (ok) {
        expect(r.status).toBe('committed');
        expect(await kbRowsFor(kb, 'acme', r.operationKey!)).toBe(1);
      } else {
        expect(r).toMatchObject({
          status: 'rejected',
          next: 'replan',
          error: { class: 'invalid_input', issues: [{ path: ['input', 'publishAt'], code: 'out_of_window' }] },
        });
        expect(await kbRowsFor(kb, 'acme', keyOf(taskId, input))).toBe(0);
      }
    }
    // The two refusals wrote nothing; the one inside the window wrote one row.
    expect(await rowsIn(kbId)).toBe(before + 1);
  });
});

describe('FM-18 / FM-19: errors and output', () => {
  it('FM-18: a fixable error names the field, and nothing is written', async () => {
    const kbId = ids['acme/research']!;
    const before = await rowsIn(kbId);
    const input = note('research', '   ');
    const blank = await tools('acme', 'alice').execute({ tool: 'kb.write_note', taskId: 'blank', input });
    expect(blank).toMatchObject({
      status: 'rejected',
      error: { class: 'invalid_input', issues: [{ path: ['input', 'title'] }] },
    });
    expect(await rowsIn(kbId)).toBe(before);
  });

  it('FM-18: a refusal carries a class and nothing else — no stack, no SQL, no body, no internal ids — and nothing is written', async () => {
    const before = { target: await rowsIn(ids['acme/research']!), all: await allRows() };
    const input = note(ids['acme/research']!, 'Probe', { body: 'SECRET-BODY-42' });
    const r = await tools('globex', 'gina').execute({ tool: 'kb.write_note', taskId: 'leak', input });
    const text = JSON.stringify(r);
    expect(r).toMatchObject({ status: 'rejected', error: { class: 'not_found' } });
    for (const leak of ['SECRET-BODY-42', 'SQLITE', 'at ', 'Error', ids['acme/research']!, 'acme'])
      expect(text).not.toContain(leak);
    expect(await kbRowsFor(kb, 'globex', keyOf('leak', input))).toBe(0);
    expect(await rowsIn(ids['acme/research']!)).toBe(before.target);
    expect(await allRows()).toBe(before.all);
  });

  it('FM-19: a write returns its receipt only, and exactly one row is written', async () => {
    const kbId = ids['acme/research']!;
    const before = await rowsIn(kbId);
    const r = await tools('acme', 'alice').execute({
      tool: 'kb.write_note',
      taskId: 'fm19',
      input: note('research', 'Receipt only'),
    });
    expect(r.status).toBe('committed');
    if (r.status === 'committed') {
      expect(r.result).toEqual({});
      expect(Object.keys(r.receipt).sort()).toEqual([
        'attempt',
        'committedAt',
        'keyId',
        'operationKey',
        'prevEventCount',
        'resourceId',
        'resultDigest',
        'schema',
        'signature',
        'state',
        'tenant',
        'tool',
        'version',
      ]);
      expect(await kbRowsFor(kb, 'acme', r.operationKey)).toBe(1);
    }
    expect(await rowsIn(kbId)).toBe(before + 1);
  });

  it('FM-19: a read returns an excerpt and its source — exactly { url, title, excerpt }, the excerpt far shorter than the page — and writes nothing', async () => {
    const before = await allRows();
    const url = `${pagesUrl}/tides`;
    const fetched = pageRequests.length;
    const r = await tools('acme', 'alice').execute<{ url: string; title: string; excerpt: string }>({
      tool: 'web.fetch_page',
      taskId: 'fm19-read',
      input: { url },
    });
    expect(r.status).toBe('committed');
    if (r.status !== 'committed') return;
    expect(Object.keys(r.result as object).sort()).toEqual(['excerpt', 'title', 'url']);
    expect(r.result.url).toBe(url);
    expect(r.result.title).toBe('Tide tables of the northern coast');
    expect(r.result.excerpt.length).toBeGreaterThan(0);
    expect(r.result.excerpt.length).toBeLessThan(PAGE.length / 4);
    expect(PAGE.replace(/\s+/g, ' ')).toContain(r.result.excerpt.replace(/…$/, '').slice(0, 60));
    // Nothing past the excerpt reaches the caller: not the page's later paragraphs, not its marker.
    expect(JSON.stringify(r)).not.toContain(PAGE_MARKER);
    expect(JSON.stringify(r)).not.toContain('Paragraph 40');
    expect(pageRequests.slice(fetched)).toEqual(['/tides']);
    expect(await allRows()).toBe(before);
  });

  it("FM-19: output is filtered by the contract's output schema — fields the implementation added never reach the caller or the result store", async () => {
    const before = await allRows();
    const r = await tools('acme', 'alice').execute<{ topic: string; summary: string }>({
      tool: 'test.summary',
      taskId: 'fm19-filter',
      input: { topic: 'tides' },
    });
    expect(r.status).toBe('committed');
    if (r.status !== 'committed') return;
    expect(r.result).toEqual({ topic: 'tides', summary: 'A short summary of tides.' });
    expect(r.receipt.resultDigest).toBe(digestOf({ topic: 'tides', summary: 'A short summary of tides.' }));
    const status = await tools('acme', 'alice').status({ operationKey: r.operationKey });
    expect(status.result).toEqual(r.result);
    // The result store holds only what the schema allows, too.
    const entry = await (await resultStore(t)).get(t.subjects.resultKey('acme', operationIdOf(r.operationKey)));
    const stored = decode(z.object({ result: z.unknown() }).loose(), entry!.value);
    expect(stored.result).toEqual(r.result);
    for (const leaked of Object.values(LEAKED)) {
      expect(JSON.stringify(r)).not.toContain(leaked);
      expect(JSON.stringify(status)).not.toContain(leaked);
      expect(JSON.stringify(stored)).not.toContain(leaked);
    }
    expect(await allRows()).toBe(before);
  });
});

describe('the status endpoint uses the same resolver', () => {
  it('an actor of the tenant without a role on the knowledge base gets the answer of a never-registered key', async () => {
    const r = await tools('acme', 'alice').execute({
      tool: 'kb.write_note',
      taskId: 'read-policy',
      input: note('research', 'Members only'),
    });
    expect(r.status).toBe('committed');
    const member = await tools('acme', 'bob').status({ operationKey: r.operationKey! });
    expect(member).toMatchObject({ state: 'committed', source: 'operation' });
    const outsider = await tools('acme', 'noread-eve').status({ operationKey: r.operationKey! });
    expect(outsider).toMatchObject({ state: 'not_seen', source: 'none', seq: 0 });
    expect(outsider.receipt).toBeUndefined();
  });

  it('a read allowed once is reused for at most KB_READ_POLICY_CACHE_MS (1 s here): a revoked reader is refused after it, a granted one at once', async () => {
    const r = await tools('acme', 'alice').execute({
      tool: 'kb.write_note',
      taskId: 'read-cache',
      input: note('shared', 'Shared notes'),
    });
    expect(r.status).toBe('committed');
    const key = r.operationKey!;
    expect(await tools('acme', 'bob').status({ operationKey: key })).toMatchObject({
      state: 'committed',
      source: 'operation',
    });
    await kb.admin.setMember(ids['acme/shared']!, { tenant: 'acme', actor: 'bob', role: null });
    await new Promise((res) => setTimeout(res, 1_200));
    const revoked = await tools('acme', 'bob').status({ operationKey: key });
    expect(revoked).toMatchObject({ state: 'not_seen', source: 'none', seq: 0 });
    expect(revoked.receipt).toBeUndefined();
    // A refusal is never kept: the grant is seen by the very next read.
    await kb.admin.setMember(ids['acme/shared']!, { tenant: 'acme', actor: 'bob', role: 'reader' });
    expect(await tools('acme', 'bob').status({ operationKey: key })).toMatchObject({
      state: 'committed',
      source: 'operation',
      receipt: { resourceId: r.status === 'committed' ? r.receipt.resourceId : '' },
    });
  });
});

describe('quotas', () => {
  it('8 concurrent writers with 3 notes of quota left give exactly 3 rows and 5 quota_exceeded with a retry-after', async () => {
    const kbId = ids['initech/research']!;
    const results = await Promise.all(
      Array.from({ length: 8 }, (_, i) =>
        tools('initech', 'ivan').execute({
          tool: 'kb.write_note',
          taskId: 'quota',
          input: note('research', `Quota ${i}`),
        }),
      ),
    );
    const committed = results.filter((r) => r.status === 'committed');
    const refused = results.filter((r) => r.status === 'rejected');
    expect(committed).toHaveLength(3);
    expect(refused).toHaveLength(5);
    for (const r of refused) {
      expect(r).toMatchObject({ error: { class: 'quota_exceeded' }, next: 'wait_or_stop' });
      if (r.status === 'rejected') expect(r.error.retryAfterMs).toBeGreaterThan(0);
    }
    expect(await rowsIn(kbId)).toBe(3);
  });
});
