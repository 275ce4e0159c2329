/**
 * FM-10, idempotency across references: the same note sent to one knowledge base under its name,
 * another case, a percent-encoding, an alias or its internal id is ONE operation — one KB row, one
 * receipt — even though the SDK derives a different key for each spelling (it cannot resolve
 * references; only the trusted side can). The authorizer registers the operation under the key of
 * the canonical input and records each other key as an alias of it; status follows the alias. Auth
 * on, the authorizer and executor as processes, the real research KB with KB_DEDUP=off (a second
 * execution would be a second row).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { operationIdOf, prepareCall } from '@tooltx/contracts';
import type { ExecuteResult, Tools } from '@tooltx/client';
import type { OperationRecord } from '@tooltx/lifecycle';
import { provisioned, type TestNats } from './helpers/nats.js';
import { startService, type ServiceProcess } from './helpers/services.js';
import { history, waitForAlias, waitForOperation } from './helpers/ops.js';
import { kbRowsFor, RESEARCH_TOOLS, startKb, type TestKb } from './helpers/kb.js';
import { researchContracts } from '../examples/research-kb/contracts.js';

const contracts = researchContracts({ kbDedup: false });
let t: TestNats;
let kb: TestKb;
let authorizer: ServiceProcess;
let executor: ServiceProcess;
let alice: Tools;
let env: Record<string, string>;
const ids: Record<string, string> = {};

const note = (kbRef: string, title: string, over: Record<string, unknown> = {}) => ({
  kb: kbRef,
  title,
  body: `Notes on ${title}.`,
  sourceUrl: 'https://example.org/src',
  fetchedAt: '2026-11-30T06:00:00Z',
  ...over,
});
const keyOf = (taskId: string, input: Record<string, unknown>) =>
  prepareCall(contracts.writeNote, taskId, input).operationKey;
const rowsIn = async (kbId: string) => (await kb.client.rowsPerKb({ kbId })).reduce((n, k) => n + k.rows, 0);

beforeAll(async () => {
  t = await provisioned();
  kb = await startKb({
    tenants: [{ id: 'acme', quota: 10_000 }],
    knowledgeBases: [
      { tenant: 'acme', name: 'research', aliases: ['Research-Notes'], members: [{ actor: 'alice', role: 'writer' }] },
      { tenant: 'acme', name: 'archive', members: [{ actor: 'alice', role: 'writer' }] },
    ],
  });
  for (const k of await kb.admin.list()) ids[k.name] = k.kbId;
  env = { ...t.env, TOOLTX_TOOLS_MODULE: RESEARCH_TOOLS, KB_URL: kb.url, KB_DEDUP: 'off' };
  [authorizer, executor] = await Promise.all([startService('authorizer', env), startService('executor', env)]);
  alice = await t.agentTools('acme', 'alice', contracts.all, {
    budgetMs: 20_000,
  });
});

afterAll(async () => {
  await alice?.close();
  const codes = await Promise.all([authorizer?.stop(), executor?.stop()]);
  expect(await kb?.stop()).toBe(0);
  await t?.close();
  expect(codes).toEqual([0, 0]);
});

describe('FM-10: every reference to one knowledge base keys one operation', () => {
  it('FM-10: name, case, percent-encoding, alias and internal id at the same moment: one operation, one row, one receipt', async () => {
    const refs = ['research', 'RESEARCH', 'research%2Dnotes', 'Research-Notes', ids.research!];
    const keys = refs.map((ref) => keyOf('fm10-same', note(ref, 'One note')));
    // The contract's normaliser folds case; encoding, alias and id only the trusted side can resolve.
    expect(new Set(keys).size).toBe(4);
    const before = await rowsIn(ids.research!);

    const results = await Promise.all(
      refs.map((ref) => alice.execute({ tool: 'kb.write_note', taskId: 'fm10-same', input: note(ref, 'One note') })),
    );

    expect(results.map((r) => r.status)).toEqual(refs.map(() => 'committed'));
    const committed = results as Extract<ExecuteResult, { status: 'committed' }>[];
    const canonical = keyOf('fm10-same', note('research', 'One note'));
    for (const r of committed) {
      expect(r.operationKey).toBe(canonical);
      expect(r.receipt).toEqual(committed[0]!.receipt);
      expect(alice.verify(r)).toEqual({ valid: true });
    }
    expect(await rowsIn(ids.research!)).toBe(before + 1);
    expect(await kbRowsFor(kb, 'acme', canonical)).toBe(1);
    const events = await history(t, 'acme', canonical);
    expect(events.map((e) => e.type)).toEqual(['accepted', 'running', 'committed']);
    // The other spellings registered nothing of their own; each is recorded as an alias.
    for (const key of new Set(keys.filter((k) => k !== canonical))) {
      expect(await history(t, 'acme', key)).toEqual([]);
      expect(await waitForAlias(t, 'acme', key, 'alice')).toMatchObject({ canonicalKey: canonical, operationKey: key });
    }
  });

  it('FM-10: a later resubmission through an alias gets the original receipt and writes nothing', async () => {
    const first = await alice.execute({
      tool: 'kb.write_note',
      taskId: 'fm10-later',
      input: note('research', 'Later note'),
    });
    expect(first.status).toBe('committed');
    const before = await rowsIn(ids.research!);
    const again = await alice.execute({
      tool: 'kb.write_note',
      taskId: 'fm10-later',
      input: note(ids.research!, 'Later note'),
    });
    expect(again).toMatchObject({ status: 'committed', operationKey: first.operationKey });
    expect((again as { receipt: unknown }).receipt).toEqual((first as { receipt: unknown }).receipt);
    expect(await rowsIn(ids.research!)).toBe(before);
  });

  it('FM-10: a status long-poll under an alias key that waits from before the alias is known is answered when the canonical operation commits, not when its wait runs out', async () => {
    const input = note('Research-Notes', 'Late alias');
    const aliasKey = keyOf('fm10-late', input);
    // Sent before the intent exists: the alias decision and the canonical operation both arrive while it waits.
    const poll = alice.status({ operationKey: aliasKey, waitMs: 30_000, untilFinal: true });
    await new Promise((r) => setTimeout(r, 300)); // a head start for the request, not an assertion
    const r = await alice.execute({ tool: 'kb.write_note', taskId: 'fm10-late', input });
    expect(r.status).toBe('committed');
    // Its wait is 30 s; the commit is the change that must end it (8 s is far more than the commit takes).
    const first = await Promise.race([
      poll,
      new Promise((res) => setTimeout(() => res('still waiting after 8 s of a 30 s wait'), 8_000)),
    ]);
    expect(first).toMatchObject({
      state: 'committed',
      operationKey: aliasKey,
      canonicalKey: r.operationKey,
      receipt: r.status === 'committed' ? r.receipt : {},
    });
  });

  it('FM-03 through an alias: the same key target with other parameters is an idempotency_conflict; the original is untouched', async () => {
    const first = await alice.execute({
      tool: 'kb.write_note',
      taskId: 'fm10-conflict',
      input: note('research', 'Conflict note'),
    });
    expect(first.status).toBe('committed');
    const before = await rowsIn(ids.research!);
    // fetchedAt is outside the key's intent: another value under the same (canonical) key conflicts.
    const other = await alice.execute({
      tool: 'kb.write_note',
      taskId: 'fm10-conflict',
      input: note('Research-Notes', 'Conflict note', { fetchedAt: '2026-11-29T06:00:00Z' }),
    });
    expect(other).toMatchObject({ status: 'rejected', error: { class: 'idempotency_conflict' } });
    expect(await rowsIn(ids.research!)).toBe(before);
    expect((await history(t, 'acme', first.operationKey!)).map((e) => e.type)).toEqual([
      'accepted',
      'running',
      'committed',
    ]);
  });

  it('FM-10: two knowledge bases are two operations, whatever the spelling', async () => {
    const a = await alice.execute({
      tool: 'kb.write_note',
      taskId: 'fm10-two',
      input: note('Research-Notes', 'Two places'),
    });
    const b = await alice.execute({
      tool: 'kb.write_note',
      taskId: 'fm10-two',
      input: note(ids.archive!, 'Two places'),
    });
    expect([a.status, b.status]).toEqual(['committed', 'committed']);
    expect(a.operationKey).not.toBe(b.operationKey);
    expect(await kbRowsFor(kb, 'acme', a.operationKey!)).toBe(1);
    expect(await kbRowsFor(kb, 'acme', b.operationKey!)).toBe(1);
  });

  it('FM-10/FM-08: an alias moved to another knowledge base between acceptance and execution stops the write: version_conflict, nothing written', async () => {
    await executor.stop();
    await kb.admin.addAlias(ids.research!, 'moving');
    const input = note('moving', 'Moved alias');
    const pending = alice.execute({ tool: 'kb.write_note', taskId: 'fm10-move', input });
    const canonical = keyOf('fm10-move', note('research', 'Moved alias'));
    await waitForOperation(t, 'acme', canonical, (s) => s.status === 'accepted');
    await kb.admin.removeAlias(ids.research!, 'moving');
    await kb.admin.addAlias(ids.archive!, 'moving');
    const [researchBefore, archiveBefore] = [await rowsIn(ids.research!), await rowsIn(ids.archive!)];
    executor = await startService('executor', env);

    const r = await pending;
    expect(r).toMatchObject({ status: 'rejected', error: { class: 'version_conflict' } });
    const s = (await t.store.load('acme', operationIdOf(canonical))).state as OperationRecord;
    expect(s).toMatchObject({ status: 'rejected', error: { class: 'version_conflict' } });
    expect(s.running).toBeUndefined();
    expect([await rowsIn(ids.research!), await rowsIn(ids.archive!)]).toEqual([researchBefore, archiveBefore]);
  });
});
