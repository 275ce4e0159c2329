/**
 * Verify before acting, by comparing what the probe found with what was asked: the research KB
 * keeps the operation's input digest (`x-tooltx-input-digest`) with each note and its probe by key
 * answers it.
 *
 * - FM-13 / FM-14: the write is held past its deadline (unknown) while ANOTHER effect lands under
 *   our downstream key with another digest (a foreign writer that reused the key, written straight
 *   into the KB, the system of record): the reconciler's probe sees the mismatch and opens a
 *   takeover (`probe_mismatch`, the probed resource id and digest) — never `committed` with that
 *   row — and the task is frozen.
 * - FM-13: the KB committed our own write and the answer was cut: the probe's digest matches →
 *   `committed` with the KB's row id. A row written before the KB kept digests (none recorded) is
 *   committed from the probe as before.
 * - The KB side: the header is validated, a batch keeps it, and a schema-1 file is migrated in place.
 *
 * Real nats-server with auth, the services as processes, the KB as a process behind a real HTTP
 * fault hop (`@tooltx/dev/faults`), KB_DEDUP=off (nothing else dedups), the operator CLI.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { digestOf, downstreamKeyOf, operationIdOf, prepareCall } from '@tooltx/contracts';
import type { Tools } from '@tooltx/client';
import type { OperationRecord, TakeoverRecord } from '@tooltx/lifecycle';
import { HttpFaultProxy } from '@tooltx/dev/faults';
import { provisioned, type TestNats } from './helpers/nats.js';
import { startService, type ServiceProcess } from './helpers/services.js';
import { history, waitForOperation, takeoverCli as takeoverCliOf } from './helpers/ops.js';
import { RESEARCH_TOOLS, startKb, type TestKb } from './helpers/kb.js';
import { KbError } from '../examples/research-kb/kb-client.js';
import { researchContracts } from '../examples/research-kb/contracts.js';
import { beyondOne, convergence, figure, takeoverFigure } from './helpers/figures.js';

// One attempt 1 s, running bound 0.5 s; unknown for 2 min before a deadline takeover — so any
// takeover seen here comes from the probe, not from the deadline.
const TIMING = { timeoutMs: 1_000, runningBoundMs: 500, unknownDeadlineMs: 120_000 };
const contracts = researchContracts({ kbDedup: false, timing: TIMING });
const note = (title: string) => ({
  kb: 'research',
  title,
  body: `Notes on ${title}.`,
  sourceUrl: 'https://example.org/src',
  fetchedAt: '2026-11-30T06:00:00Z',
});
const keyOf = (taskId: string, title: string) => prepareCall(contracts.writeNote, taskId, note(title)).operationKey;
const soon = () => Date.now() + 60_000;

let t: TestNats;
let kb: TestKb;
let proxy: HttpFaultProxy;
let env: Record<string, string>;
let authorizer: ServiceProcess;
let executor: ServiceProcess;
let reconciler: ServiceProcess;
let alice: Tools;

/** `tooltx takeover …` as operator `oscar`. */
const takeoverCli = (...args: string[]) => takeoverCliOf(t, ...args);

/** A note written straight into the KB (not through tooltx, not through the fault hop) under `key`. */
const writeDirect = async (key: string, title: string, inputDigest?: string) => {
  const { authVersion } = await kb.client.resolve({ tenant: 'acme', actor: 'mallory', ref: 'research' });
  return kb.client.writeNote({
    tenant: 'acme',
    actor: 'mallory',
    key,
    deadlineAt: soon(),
    ifMatch: authVersion,
    inputDigest,
    note: note(title),
  });
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
  proxy = await new HttpFaultProxy(kb.url).start();
  env = {
    ...t.env,
    TOOLTX_TOOLS_MODULE: RESEARCH_TOOLS,
    KB_URL: proxy.url,
    KB_KEEPALIVE: 'off',
    KB_TIMING_MS: `${TIMING.timeoutMs},${TIMING.runningBoundMs},${TIMING.unknownDeadlineMs}`,
    TOOLTX_RECONCILE_INTERVAL_MS: '300',
  };
  // One at a time: the machine is small and shared.
  authorizer = await startService('authorizer', env);
  executor = await startService('executor', env);
  reconciler = await startService('reconciler', env);
  alice = await t.agentTools('acme', 'alice', contracts.all, {
    budgetMs: 45_000,
  });
}, 120_000);

afterAll(async () => {
  await alice?.close();
  const codes = [];
  for (const p of [reconciler, executor, authorizer]) codes.push(await p?.stop());
  await proxy?.stop();
  await kb?.stop();
  await t?.close();
  expect(codes).toEqual([0, 0, 0]);
}, 120_000);

describe('FM-13 / FM-14: the probe finds another effect under our key', () => {
  it('opens a takeover (probe_mismatch) with the probed resource id, never commits the foreign row, and freezes the task', async ({
    task,
  }) => {
    const key = keyOf('pm', 'Ours, held past the deadline');
    const dk = downstreamKeyOf('acme', key);
    // The reconciler is down while the write goes unknown and the foreign row lands: its first probe
    // comes after both (in that order, without a race against the sweep).
    await reconciler.stop();
    // Our write is held past the attempt's deadline: the executor gives up (unknown); the KB refuses it when it lands.
    const held = proxy.inject(dk, { kind: 'delay', ms: TIMING.timeoutMs + 1_500 });
    const pending = alice.execute({ tool: 'kb.write_note', taskId: 'pm', input: note('Ours, held past the deadline') });
    const unknown = (await waitForOperation(t, 'acme', key, (s) => s.status === 'unknown', 30_000)) as OperationRecord;
    expect(unknown.evidence?.kind).toBe('timeout');

    // Meanwhile a foreign writer stores something else under our downstream key, with its own digest.
    const foreignDigest = digestOf({ title: 'Someone else', body: 'Not what was asked.' });
    expect(foreignDigest).not.toBe(unknown.inputDigest);
    const foreign = await writeDirect(dk, 'Someone else', foreignDigest);
    expect(foreign.created).toBe(true);
    // Our late request reached the KB after its deadline and was refused: the foreign row is the only one.
    expect((await held.applied).status).toBe(409);
    expect(await kb.client.probe({ tenant: 'acme', key: dk })).toEqual({
      found: true,
      id: foreign.id,
      kb: 'research',
      createdAt: foreign.createdAt,
      count: 1,
      inputDigest: foreignDigest,
    });

    reconciler = await startService('reconciler', env);
    const state = (await waitForOperation(
      t,
      'acme',
      key,
      (s) => s.status === 'unknown' && s.takeover !== undefined,
      30_000,
    )) as OperationRecord;
    const record = state.takeover as TakeoverRecord;
    figure(task, takeoverFigure(record));
    expect(record).toMatchObject({
      operationKey: key,
      tenant: 'acme',
      taskId: 'pm',
      tool: 'kb.write_note',
      inputDigest: unknown.inputDigest,
      reason: 'probe_mismatch',
      probed: { resourceId: foreign.id, inputDigest: foreignDigest },
      attempts: { attempt: 1, requeues: 0 },
    });
    expect(record.lastEvidence?.kind).toBe('timeout');
    // Never committed (with the foreign row or otherwise): accepted, running, unknown, takeover.
    expect((await history(t, 'acme', key)).map((e) => e.type)).toEqual(['accepted', 'running', 'unknown', 'takeover']);
    expect(state.receipt).toBeUndefined();

    const r = await pending;
    expect(r).toMatchObject({
      status: 'unknown',
      lastServerState: 'unknown',
      next: 'hand_over',
      evidence: { takeover: { reason: 'probe_mismatch', probed: { resourceId: foreign.id } } },
    });

    // The task is frozen: a dependent write of the same task is refused and never registered.
    const dependent = keyOf('pm', 'Depends on it');
    expect(await alice.execute({ tool: 'kb.write_note', taskId: 'pm', input: note('Depends on it') })).toMatchObject({
      status: 'rejected',
      error: { class: 'task_frozen' },
      next: 'hand_over',
    });
    expect((await t.store.load('acme', operationIdOf(dependent))).state.status).toBe('none');
    expect(await kb.client.probe({ tenant: 'acme', key: downstreamKeyOf('acme', dependent) })).toMatchObject({
      found: false,
    });

    // The operator sees what was asked and what the KB holds under the key.
    expect(await takeoverCli('list')).toContainEqual(
      expect.objectContaining({ operationKey: key, reason: 'probe_mismatch', status: 'unknown' }),
    );
    const [shown] = await takeoverCli('show', key);
    expect(shown).toMatchObject({
      status: 'unknown',
      inputDigest: unknown.inputDigest,
      takeover: { reason: 'probe_mismatch', probed: { resourceId: foreign.id, inputDigest: foreignDigest } },
    });
    // Our effect was not applied (the KB holds only the foreign row): resolved so, the task thaws.
    const [resolved] = await takeoverCli('resolve', key, '--not-applied');
    expect(resolved).toMatchObject({ status: 'rejected', resolution: { by: 'oscar', outcome: 'not_applied' } });
    expect(await alice.execute({ tool: 'kb.write_note', taskId: 'pm', input: note('Depends on it') })).toMatchObject({
      status: 'committed',
    });
    expect(await kb.client.probe({ tenant: 'acme', key: dk })).toMatchObject({ found: true, id: foreign.id, count: 1 });
  }, 120_000);
});

describe('FM-13: the probe finds our own effect', () => {
  it('the KB committed our write and the answer was cut: the digest matches, committed with the KB row id', async ({
    task,
  }) => {
    const key = keyOf('pm-ok', 'Committed, answer cut');
    const dk = downstreamKeyOf('acme', key);
    const cut = proxy.inject(dk, { kind: 'cut_response' });
    const r = await alice.execute({ tool: 'kb.write_note', taskId: 'pm-ok', input: note('Committed, answer cut') });
    const types = (await history(t, 'acme', key)).map((e) => e.type);
    const probe = await kb.client.probe({ tenant: 'acme', key: dk });
    const rows = probe.found ? probe.count : 0;
    figure(task, { name: 'final state', value: r.status });
    figure(task, { name: 'kb rows for the key', value: rows, duplicates: beyondOne(rows), ...convergence(types) });
    expect((await cut.applied).status).toBe(201);
    expect(r.status).toBe('committed');
    expect(types).toEqual(['accepted', 'running', 'unknown', 'committed']);
    const state = (await t.store.load('acme', operationIdOf(key))).state as OperationRecord;
    // The KB recorded the operation's own input digest with the row.
    expect(probe).toMatchObject({ found: true, count: 1, inputDigest: state.inputDigest });
    if (r.status === 'committed' && probe.found) expect(r.receipt.resourceId).toBe(probe.id);
    expect(state.takeover).toBeUndefined();
  }, 60_000);

  it('a row written before the KB kept digests (none recorded) is committed from the probe as before', async () => {
    const key = keyOf('pm-old', 'Written by an older executor');
    const dk = downstreamKeyOf('acme', key);
    // The row our earlier attempt left without a digest; this attempt is held past its deadline (refused when it lands).
    const old = await writeDirect(dk, 'Written by an older executor');
    expect(await kb.client.probe({ tenant: 'acme', key: dk })).not.toHaveProperty('inputDigest');
    const held = proxy.inject(dk, { kind: 'delay', ms: TIMING.timeoutMs + 1_500 });
    const r = await alice.execute({
      tool: 'kb.write_note',
      taskId: 'pm-old',
      input: note('Written by an older executor'),
    });
    expect(r).toMatchObject({ status: 'committed', receipt: { resourceId: old.id } });
    expect((await history(t, 'acme', key)).map((e) => e.type)).toEqual(['accepted', 'running', 'unknown', 'committed']);
    expect((await held.applied).status).toBe(409);
    expect(await kb.client.probe({ tenant: 'acme', key: dk })).toMatchObject({ found: true, id: old.id, count: 1 });
  }, 60_000);
});

describe('the KB keeps the input digest', () => {
  it('validates x-tooltx-input-digest (nothing stored when malformed) and keeps it with every item of a batch', async () => {
    const key = `k-${Date.now()}`;
    const bad = await writeDirect(key, 'Bad digest', 'sha256:XYZ').catch((e: unknown) => e);
    expect(bad).toBeInstanceOf(KbError);
    expect(bad).toMatchObject({
      status: 400,
      errorClass: 'invalid_input',
      issues: [expect.objectContaining({ path: ['headers', 'x-tooltx-input-digest'] })],
    });
    expect(await kb.client.probe({ tenant: 'acme', key })).toMatchObject({ found: false });

    const { kbId, authVersion } = await kb.client.resolve({ tenant: 'acme', actor: 'mallory', ref: 'research' });
    const d = digestOf({ batch: key });
    const b = await kb.client.writeBatch({
      tenant: 'acme',
      actor: 'mallory',
      key,
      deadlineAt: soon(),
      ifMatch: { [kbId]: authVersion },
      inputDigest: d,
      items: [note('One'), note('Two')],
    });
    expect(b.items).toHaveLength(2);
    expect(await kb.client.probe({ tenant: 'acme', key })).toMatchObject({
      found: true,
      id: b.items[0]!.id,
      inputDigest: d,
      items: b.items.map(({ id }) => ({ id })),
    });
    expect(await kb.client.probe({ tenant: 'acme', key: `${key}#1` })).toMatchObject({
      found: true,
      id: b.items[1]!.id,
      inputDigest: d,
    });
  });

  it('with dedup on, a key reused for another input digest is refused (422 key_reused), the same digest answers the stored note', async () => {
    const onKb = await startKb(
      { tenants: [{ id: 'acme' }], knowledgeBases: [{ tenant: 'acme', name: 'research', defaultRole: 'writer' }] },
      { KB_DEDUP: 'on' },
    );
    try {
      const { authVersion } = await onKb.client.resolve({ tenant: 'acme', actor: 'mallory', ref: 'research' });
      const write = (inputDigest: string | undefined, title: string) =>
        onKb.client.writeNote({
          tenant: 'acme',
          actor: 'mallory',
          key: 'k-reused',
          deadlineAt: soon(),
          ifMatch: authVersion,
          inputDigest,
          note: note(title),
        });
      const first = await write(digestOf({ n: 1 }), 'First');
      expect((await write(digestOf({ n: 1 }), 'First')).id).toBe(first.id);
      const reused = await write(digestOf({ n: 2 }), 'Someone else').catch((e: unknown) => e);
      expect(reused).toMatchObject({ status: 422, errorClass: 'key_reused' });
      // A caller that sends no digest gets the stored note, as before the KB kept digests.
      expect((await write(undefined, 'No digest')).id).toBe(first.id);
      expect(await onKb.client.probe({ tenant: 'acme', key: 'k-reused' })).toMatchObject({
        found: true,
        count: 1,
        id: first.id,
      });
    } finally {
      await onKb.stop();
    }
  });

  it('migrates a schema-1 file in place: the column is added, old notes answer no digest, new ones theirs', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tooltx-kb-v1-'));
    const db = join(dir, 'kb.sqlite');
    const seed = {
      tenants: [{ id: 'acme' }],
      knowledgeBases: [{ tenant: 'acme', name: 'research', defaultRole: 'writer' as const }],
    };
    try {
      // A file as schema 1 left it: the current KB creates it, then the column goes and the version is set back.
      const first = await startKb(seed, { KB_DB: db });
      const before = await first.client.resolve({ tenant: 'acme', actor: 'alice', ref: 'research' });
      const w = await first.client.writeNote({
        tenant: 'acme',
        actor: 'alice',
        key: 'old-key',
        deadlineAt: soon(),
        ifMatch: before.authVersion,
        note: note('Old'),
      });
      expect(await first.stop()).toBe(0);
      const v1 = new Database(db);
      v1.exec('ALTER TABLE notes DROP COLUMN input_digest');
      v1.pragma('user_version = 1');
      v1.close();

      for (let round = 0; round < 2; round++) {
        const again = await startKb(seed, { KB_DB: db });
        try {
          const old = await again.client.probe({ tenant: 'acme', key: 'old-key' });
          expect(old).toMatchObject({ found: true, id: w.id, count: 1 });
          expect(old).not.toHaveProperty('inputDigest');
          const d = digestOf({ round });
          const key = `new-key-${round}`;
          await again.client.writeNote({
            tenant: 'acme',
            actor: 'alice',
            key,
            deadlineAt: soon(),
            ifMatch: before.authVersion,
            inputDigest: d,
            note: note('New'),
          });
          expect(await again.client.probe({ tenant: 'acme', key })).toMatchObject({ found: true, inputDigest: d });
        } finally {
          expect(await again.stop()).toBe(0);
        }
      }
      const conn = new Database(db, { readonly: true });
      try {
        expect(conn.pragma('user_version', { simple: true })).toBe(4);
        expect(conn.prepare('SELECT id, input_digest AS d FROM notes ORDER BY created_at, rowid').all()).toEqual([
          { id: w.id, d: null },
          { id: expect.any(String), d: digestOf({ round: 0 }) },
          { id: expect.any(String), d: digestOf({ round: 1 }) },
        ]);
      } finally {
        conn.close();
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 60_000);
});
