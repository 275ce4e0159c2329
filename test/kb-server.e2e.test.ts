/**
 * The research-KB storage service as a real process (examples/research-kb/kb-server.ts) on a free
 * loopback port with a temp SQLite file, driven through its HTTP API and the typed client. No mocks.
 */
import { createHash } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { request } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { KbClient, KbError, type KbNote } from '../examples/research-kb/kb-client.js';
import { KbStore } from '../examples/research-kb/kb-store.js';
import { digestOf, downstreamKeyOf, type ExecutionContext, type Implementation } from '@tooltx/contracts';
import type { ServiceProcess } from './helpers/services.js';
import { sampleNote, soon, spawnKbProcess } from './helpers/kb.js';

const SEED = 'acme:research,acme:archive,globex:research';
const tmp = mkdtempSync(join(tmpdir(), 'kb-server-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

let n = 0;
const freshDb = () => join(tmp, `db-${++n}`, 'nested', 'kb.sqlite');

const spawnKb = (env: Record<string, string>, args: string[] = []): ServiceProcess =>
  spawnKbProcess({ KB_SEED: SEED, ...env }, args);

interface Kb {
  proc: ServiceProcess;
  url: string;
  port: number;
  client: KbClient;
  db: string;
}

async function startKb(env: Record<string, string>): Promise<Kb> {
  const db = env.KB_DB ?? freshDb();
  const proc = spawnKb({ KB_DB: db, ...env });
  const line = await proc.waitForLog('listening');
  const port = Number(line.port);
  expect(port).toBeGreaterThan(0);
  const url = `http://127.0.0.1:${port}`;
  return { proc, url, port, client: new KbClient(url), db };
}

const note = (over: Partial<KbNote> = {}): KbNote => sampleNote('research', over);
/** KB_SEED without actors: every actor of the tenant is a writer; a fresh knowledge base is at authVersion 1. */
const AS = { actor: 'alice', ifMatch: 1 };
const AS_HEADERS = { 'x-actor': 'alice', 'if-match': '1' };
let k = 0;
const key = () => `tx_test-${process.pid}-${++k}`;

/** A raw request, for status codes, headers and exact bodies. */
async function raw(url: string, init: RequestInit & { headers?: Record<string, string> } = {}) {
  const res = await fetch(url, init);
  const text = await res.text();
  return {
    status: res.status,
    type: res.headers.get('content-type'),
    text,
    json: text ? (JSON.parse(text) as Record<string, unknown>) : undefined,
  };
}

describe('kb-server with KB_DEDUP=on', () => {
  let kb: Kb;
  beforeAll(async () => {
    kb = await startKb({ KB_DEDUP: 'on' });
  });
  afterAll(async () => {
    expect(await kb.proc.stop()).toBe(0);
  });

  it('answers the health check', async () => {
    const r = await raw(`${kb.url}/healthz`);
    expect(r).toMatchObject({ status: 200, json: { ok: true } });
    expect(await kb.client.healthy()).toBe(true);
  });

  it('a repeated key returns the same id and stores one row (honoursKey)', async () => {
    const k1 = key();
    const first = await kb.client.writeNote({ ...AS, tenant: 'acme', key: k1, deadlineAt: soon(), note: note() });
    expect(first).toMatchObject({ kb: 'research', created: true });
    expect(first.id).toMatch(/^note_[0-9a-f-]{36}$/);
    expect(Math.abs(first.createdAt - Date.now())).toBeLessThan(10_000);

    const again = await kb.client.writeNote({ ...AS, tenant: 'acme', key: k1, deadlineAt: soon(), note: note() });
    expect(again).toEqual({ ...first, created: false, kbNow: expect.any(Number) });

    // The raw statuses: 201 for the insert, 200 for the replay.
    const headers = {
      'content-type': 'application/json',
      'x-tenant': 'acme',
      ...AS_HEADERS,
      'idempotency-key': k1,
      'x-deadline': String(soon()),
    };
    const replay = await raw(`${kb.url}/v1/notes`, { method: 'POST', headers, body: JSON.stringify(note()) });
    expect(replay).toMatchObject({ status: 200, json: { id: first.id, kb: 'research', createdAt: first.createdAt } });

    expect(await kb.client.probe({ tenant: 'acme', key: k1 })).toEqual({
      found: true,
      id: first.id,
      kb: 'research',
      createdAt: first.createdAt,
      count: 1,
    });
    const rows = new Database(kb.db, { readonly: true });
    try {
      expect(rows.prepare('SELECT COUNT(*) AS c FROM notes WHERE downstream_key = ?').get(k1)).toEqual({ c: 1 });
    } finally {
      rows.close();
    }
  });

  it('concurrent writes of one key make one row and one id', async () => {
    const k1 = key();
    const all = await Promise.all(
      Array.from({ length: 20 }, () =>
        kb.client.writeNote({ ...AS, tenant: 'acme', key: k1, deadlineAt: soon(), note: note() }),
      ),
    );
    expect(new Set(all.map((r) => r.id)).size).toBe(1);
    expect(all.filter((r) => r.created)).toHaveLength(1);
    expect(await kb.client.probe({ tenant: 'acme', key: k1 })).toMatchObject({ found: true, count: 1 });
  });

  it('refuses a write past its deadline with 409 and stores nothing (enforcesDeadline)', async () => {
    const k1 = key();
    const before = await kb.client.stats('acme');
    const err = await kb.client
      .writeNote({ ...AS, tenant: 'acme', key: k1, deadlineAt: Date.now() - 1, note: note() })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(KbError);
    expect(err).toMatchObject({ status: 409, errorClass: 'deadline_passed' });
    const r = await raw(`${kb.url}/v1/notes`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        'x-tenant': 'acme',
        ...AS_HEADERS,
        'idempotency-key': k1,
        'x-deadline': String(Date.now() - 1),
      },
      body: JSON.stringify(note()),
    });
    expect(r).toEqual({
      status: 409,
      type: 'application/json; charset=utf-8',
      text: '{"error":"deadline_passed"}',
      json: { error: 'deadline_passed' },
    });
    expect(await kb.client.probe({ tenant: 'acme', key: k1 })).toMatchObject({ found: false });
    expect(await kb.client.stats('acme')).toEqual(before);
  });

  it('replays a stored key even after the deadline: dedup comes before the deadline check', async () => {
    const k1 = key();
    const first = await kb.client.writeNote({ ...AS, tenant: 'acme', key: k1, deadlineAt: soon(), note: note() });
    const late = await kb.client.writeNote({
      ...AS,
      tenant: 'acme',
      key: k1,
      deadlineAt: Date.now() - 60_000,
      note: note(),
    });
    expect(late).toEqual({ ...first, created: false, kbNow: expect.any(Number) });
  });

  it("another tenant's knowledge base answers exactly like a missing one (404, nothing leaked)", async () => {
    const post = (tenant: string, kbName: string) =>
      raw(`${kb.url}/v1/notes`, {
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          'x-tenant': tenant,
          ...AS_HEADERS,
          'idempotency-key': key(),
          'x-deadline': String(soon()),
        },
        body: JSON.stringify(note({ kb: kbName })),
      });
    const foreign = await post('globex', 'archive'); // acme's
    const missing = await post('globex', 'nope');
    const unknownTenant = await post('initech', 'research');
    expect(foreign).toEqual({
      status: 404,
      type: 'application/json; charset=utf-8',
      text: '{"error":"not_found"}',
      json: { error: 'not_found' },
    });
    expect(missing).toEqual(foreign);
    expect(unknownTenant).toEqual(foreign);
    await expect(
      kb.client.writeNote({ ...AS, tenant: 'globex', key: key(), deadlineAt: soon(), note: note({ kb: 'archive' }) }),
    ).rejects.toMatchObject({
      name: 'KbError',
      status: 404,
      errorClass: 'not_found',
    });
    // globex's own "research" is a different knowledge base from acme's.
    const own = await kb.client.writeNote({ ...AS, tenant: 'globex', key: key(), deadlineAt: soon(), note: note() });
    expect(own).toMatchObject({ created: true, kb: 'research' });
  });

  it('keys are per tenant: the same key of two tenants makes two notes, and probes never cross', async () => {
    const k1 = key();
    const a = await kb.client.writeNote({ ...AS, tenant: 'acme', key: k1, deadlineAt: soon(), note: note() });
    expect(await kb.client.probe({ tenant: 'globex', key: k1 })).toMatchObject({ found: false });
    const g = await kb.client.writeNote({ ...AS, tenant: 'globex', key: k1, deadlineAt: soon(), note: note() });
    expect(g.id).not.toBe(a.id);
    expect(g.created).toBe(true);
    const probe = await raw(`${kb.url}/v1/notes/by-key/${encodeURIComponent('never-written')}`, {
      headers: { 'x-tenant': 'acme' },
    });
    expect(probe).toMatchObject({ status: 404, json: { error: 'not_found', found: false } });
  });

  it('bad input is 400 invalid_input with the exact field paths, and nothing is written', async () => {
    const before = await kb.client.stats();
    const r = await raw(`${kb.url}/v1/notes`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': 'x'.repeat(101), 'x-deadline': 'tomorrow' },
      body: JSON.stringify({
        ...note({ title: '', sourceUrl: 'ftp://example.org/x', fetchedAt: 'yesterday' }),
        tenant: 'acme',
      }),
    });
    expect(r.status).toBe(400);
    expect(r.json!.error).toBe('invalid_input');
    const paths = (r.json!.issues as { path: unknown[]; code: string; message: string }[]).map((i) => i.path.join('.'));
    expect(paths.sort()).toEqual(
      [
        '',
        'fetchedAt',
        'headers.idempotency-key',
        'headers.if-match',
        'headers.x-actor',
        'headers.x-deadline',
        'headers.x-tenant',
        'sourceUrl',
        'title',
      ].sort(),
    );
    const extra = (r.json!.issues as { path: unknown[]; code: string; message: string }[]).find(
      (i) => i.path.length === 0,
    )!;
    expect(extra.code).toBe('unrecognized_keys');
    for (const i of r.json!.issues as { code: unknown; message: unknown }[]) {
      expect(typeof i.code).toBe('string');
      expect(typeof i.message).toBe('string');
    }
    expect(r.text).not.toContain('Leader election'); // the body is never echoed

    // Through the client: a typed KbError with the issues.
    const err = await kb.client
      .writeNote({ ...AS, tenant: 'acme', key: key(), deadlineAt: soon(), note: note({ publishAt: 'soon' }) })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(KbError);
    expect(err).toMatchObject({ status: 400, errorClass: 'invalid_input', issues: [{ path: ['publishAt'] }] });

    const badTenant = await kb.client.probe({ tenant: 'ACME', key: 'k' }).catch((e: unknown) => e);
    expect(badTenant).toMatchObject({
      status: 400,
      errorClass: 'invalid_input',
      issues: [{ path: ['headers', 'x-tenant'] }],
    });

    const notJson = await raw(`${kb.url}/v1/notes`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        'x-tenant': 'acme',
        ...AS_HEADERS,
        'idempotency-key': key(),
        'x-deadline': String(soon()),
      },
      body: '{"kb":',
    });
    expect(notJson).toMatchObject({
      status: 400,
      json: { error: 'invalid_input', issues: [{ path: [], code: 'invalid_json' }] },
    });

    const tooBig = await raw(`${kb.url}/v1/notes`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        'x-tenant': 'acme',
        ...AS_HEADERS,
        'idempotency-key': key(),
        'x-deadline': String(soon()),
      },
      body: JSON.stringify(note({ body: 'x'.repeat(2 * 1024 * 1024) })),
    });
    expect(tooBig).toMatchObject({ status: 400, json: { error: 'invalid_input', issues: [{ code: 'too_big' }] } });
    // Twenty at once, each still writing when the answer goes: every client reads its answer (the
    // server drains, within a bound, before it closes: closing at once reset 39 of 40 of them).
    const many = await Promise.all(
      Array.from({ length: 20 }, () =>
        raw(`${kb.url}/v1/notes`, {
          method: 'POST',
          headers: {
            'content-type': 'application/json',
            'x-tenant': 'acme',
            ...AS_HEADERS,
            'idempotency-key': key(),
            'x-deadline': String(soon()),
          },
          body: JSON.stringify(note({ body: 'x'.repeat(3 * 1024 * 1024) })),
        }),
      ),
    );
    expect(many.map((r) => r.status)).toEqual(many.map(() => 400));

    expect(await kb.client.stats()).toEqual(before);
  });

  it('soft-deletes idempotently, only for the owning tenant', async () => {
    const k1 = key();
    const w = await kb.client.writeNote({ ...AS, tenant: 'acme', key: k1, deadlineAt: soon(), note: note() });
    const before = await kb.client.stats('acme');
    await expect(kb.client.deleteNote({ ...AS, tenant: 'globex', key: key(), id: w.id })).rejects.toMatchObject({
      status: 404,
      errorClass: 'not_found',
    });
    await expect(
      kb.client.deleteNote({ ...AS, tenant: 'acme', key: key(), id: 'note_00000000-0000-0000-0000-000000000000' }),
    ).rejects.toMatchObject({ status: 404 });
    const dk = key();
    expect(await kb.client.deleteNote({ ...AS, tenant: 'acme', key: dk, id: w.id })).toEqual({
      id: w.id,
      deleted: true,
    });
    expect(await kb.client.deleteNote({ ...AS, tenant: 'acme', key: dk, id: w.id })).toEqual({
      id: w.id,
      deleted: true,
    });
    // The write under k1 happened: its probe still finds it, deleted, so recovery never writes it again.
    expect(await kb.client.probe({ tenant: 'acme', key: k1 })).toEqual({
      found: true,
      id: w.id,
      kb: 'research',
      createdAt: w.createdAt,
      count: 1,
      deleted: true,
    });
    expect(await kb.client.stats('acme')).toEqual({
      ...before,
      rows: before.rows - 1,
      distinctKeys: before.distinctKeys - 1,
    });
    const noKey = await raw(`${kb.url}/v1/notes/${w.id}`, {
      method: 'DELETE',
      headers: { 'x-tenant': 'acme', ...AS_HEADERS },
    });
    expect(noKey).toMatchObject({
      status: 400,
      json: { error: 'invalid_input', issues: [{ path: ['headers', 'idempotency-key'] }] },
    });
  });

  it('a delete is stored under its key: replayed, probe-able by key (deleted notes stay out of reads), key_reused for another note', async () => {
    const w = await kb.client.writeNote({ ...AS, tenant: 'acme', key: key(), deadlineAt: soon(), note: note() });
    const other = await kb.client.writeNote({ ...AS, tenant: 'acme', key: key(), deadlineAt: soon(), note: note() });
    const dk = key();
    const d = `sha256:${'a'.repeat(64)}`;
    expect(await kb.client.probeDelete({ tenant: 'acme', key: dk })).toEqual({ found: false, now: expect.any(Number) });
    const before = await kb.client.stats('acme');
    await kb.client.deleteNote({ ...AS, tenant: 'acme', key: dk, id: w.id, inputDigest: d });
    const probed = await kb.client.probeDelete({ tenant: 'acme', key: dk });
    expect(probed).toEqual({ found: true, id: w.id, deletedAt: expect.any(Number), count: 1, inputDigest: d });
    // The same delete again: one stored delete.
    await kb.client.deleteNote({ ...AS, tenant: 'acme', key: dk, id: w.id, inputDigest: d });
    expect(await kb.client.probeDelete({ tenant: 'acme', key: dk })).toEqual(probed);
    for (const reuse of [
      kb.client.deleteNote({ ...AS, tenant: 'acme', key: dk, id: other.id, inputDigest: d }),
      kb.client.deleteNote({ ...AS, tenant: 'acme', key: dk, id: w.id, inputDigest: `sha256:${'b'.repeat(64)}` }),
    ])
      await expect(reuse).rejects.toMatchObject({ status: 422, errorClass: 'key_reused' });
    // Nothing of the refusals changed anything: the other note is live, the counts moved by one.
    expect(await kb.client.stats('acme')).toEqual({
      ...before,
      rows: before.rows - 1,
      distinctKeys: before.distinctKeys - 1,
    });
    // Per tenant: another tenant's probe of the key finds nothing.
    expect(await kb.client.probeDelete({ tenant: 'globex', key: dk })).toMatchObject({ found: false });
    const raw404 = await raw(`${kb.url}/v1/deletes/by-key/never-used`, { headers: { 'x-tenant': 'acme' } });
    expect(raw404).toMatchObject({ status: 404, json: { error: 'not_found', found: false } });
  });

  it('keeps only a digest of the body, and never logs it', async () => {
    const secret = `planted-body-${Date.now()}`;
    const k1 = key();
    const w = await kb.client.writeNote({
      ...AS,
      tenant: 'acme',
      key: k1,
      deadlineAt: soon(),
      note: note({ body: `ünïcode ${secret}`, publishAt: '2024-06-01T00:00:00Z' }),
    });
    const db = new Database(kb.db, { readonly: true });
    try {
      const row = db.prepare('SELECT * FROM notes WHERE id = ?').get(w.id) as Record<string, unknown>;
      expect(row).toMatchObject({
        tenant: 'acme',
        downstream_key: k1,
        title: 'Raft in one page',
        body_digest: `sha256:${createHash('sha256')
          .update(Buffer.from(`ünïcode ${secret}`, 'utf8'))
          .digest('hex')}`,
        source_url: 'https://example.org/raft',
        fetched_at: '2024-05-01T08:00:00.000Z',
        publish_at: '2024-06-01T00:00:00.000Z',
        created_at: w.createdAt,
        deleted_at: null,
      });
      expect(JSON.stringify(row)).not.toContain(secret);
      const cols = (db.prepare('PRAGMA table_info(notes)').all() as { name: string }[]).map((c) => c.name);
      expect(cols).not.toContain('body');
      const idx = db
        .prepare("SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'notes' AND sql IS NOT NULL")
        .all() as { sql: string }[];
      expect(idx.map((i) => i.sql).join()).toMatch(
        /CREATE INDEX (IF NOT EXISTS )?notes_tenant_key ON notes \(tenant, downstream_key\)/,
      );
      expect(idx.map((i) => i.sql).join()).not.toMatch(/UNIQUE/i);
    } finally {
      db.close();
    }
    expect(kb.proc.lines.some((l) => l.msg === 'request' && l.route === 'POST /v1/notes' && l.status === 201)).toBe(
      true,
    );
    expect(JSON.stringify(kb.proc.lines) + kb.proc.stderr).not.toContain(secret);
  });

  it('runs SQLite in WAL mode with synchronous=FULL', async () => {
    // The server's own connection, read back with PRAGMA when the store opened.
    const opened = await kb.proc.waitForLog('store opened');
    expect(opened).toMatchObject({ journalMode: 'wal', synchronous: 2 });
    // journal_mode=WAL is persistent in the file: any connection sees it; the -wal file exists.
    const db = new Database(kb.db, { readonly: true });
    try {
      expect(db.pragma('journal_mode', { simple: true })).toBe('wal');
    } finally {
      db.close();
    }
    expect(existsSync(`${kb.db}-wal`)).toBe(true);
    // The store's connection setting itself (synchronous is per connection).
    const store = new KbStore({ path: freshDb(), dedup: true });
    try {
      expect(store.pragmas()).toEqual({ journalMode: 'wal', synchronous: 2 });
    } finally {
      store.close();
    }
  });

  it("clock-skew: a probe's clock reading holds across a restart on a clock that went back — a request past that deadline is never stored", () => {
    const path = freshDb();
    let clock = 1_000_000;
    const open = () => new KbStore({ path, dedup: false, now: () => clock });
    const a = open();
    const kbId = a.ensureKnowledgeBase('acme', 'research').id;
    const ctx = { tenant: 'acme', actor: 'alice', key: 'tx_late', ifMatch: 1 };
    // The probe finds nothing at its reading (the clock, at least 1_000_000): a request with an
    // earlier deadline may be run again.
    const probed = a.probe('acme', 'tx_late');
    expect(probed).toMatchObject({ found: false });
    const reading = probed.now;
    expect(reading).toBeGreaterThanOrEqual(1_000_000);
    a.close();
    // The KB comes back on a machine whose clock is 10 min behind; the first run's request lands.
    clock = 400_000;
    const b = open();
    try {
      // It goes on from its stored reading at the monotonic clock's pace, never below it.
      expect(b.now()).toBeGreaterThanOrEqual(reading);
      expect(b.now()).toBeLessThan(reading + 60_000);
      expect(
        b.writeNote(
          { ...ctx, deadlineAt: reading - 1 },
          { kb: kbId, title: 't', body: 'b', sourceUrl: 'https://example.org/', fetchedAt: '2026-11-30T06:00:00Z' },
        ),
      ).toEqual({ kind: 'deadline_passed' });
      expect(b.probe('acme', 'tx_late')).toMatchObject({ found: false });
      // Once the machine's clock is past it again, it is read as it is.
      clock = 5_000_000;
      expect(b.now()).toBe(5_000_000);
    } finally {
      b.close();
    }
  });

  it('the kb.delete_note tool: execute deletes under the downstream key with the input digest, its probe finds that delete', async () => {
    process.env.KB_URL = kb.url;
    const tools = await import('../examples/research-kb/tools.js');
    const del = tools.implementations.find((i) => i.contract.id === 'kb.delete_note@1') as Implementation;
    const wk = key();
    const w = await kb.client.writeNote({ ...AS, tenant: 'acme', key: wk, deadlineAt: soon(), note: note() });
    const r = await kb.client.resolve({ tenant: 'acme', actor: 'alice', ref: 'research' });
    const input = { kb: 'research', noteId: w.id };
    const operationKey = `op-${key()}`;
    const ctx: ExecutionContext = {
      tenant: 'acme',
      actor: 'alice',
      operationKey,
      downstreamKey: downstreamKeyOf('acme', operationKey),
      attempt: 1,
      inputDigest: digestOf(input),
      deadlineAt: soon(),
      signal: AbortSignal.timeout(5_000),
      authorization: { resources: [{ id: r.kbId, version: r.authVersion }] },
    };
    expect(await del.probe!(ctx)).toEqual({ found: false });
    expect(await del.execute(input, ctx)).toEqual({ resourceId: w.id, result: {} });
    expect(await del.probe!(ctx)).toEqual({ found: true, resourceId: w.id, inputDigest: ctx.inputDigest });
    expect(await del.execute(input, ctx)).toEqual({ resourceId: w.id, result: {} });
    expect(await kb.client.probeDelete({ tenant: 'acme', key: ctx.downstreamKey })).toMatchObject({ count: 1 });
    // The write it undoes stays found by its own probe, marked deleted.
    expect(await kb.client.probe({ tenant: 'acme', key: wk })).toMatchObject({ found: true, id: w.id, deleted: true });
  });

  it('unknown routes and methods are a uniform 404', async () => {
    expect(await raw(`${kb.url}/v1/nope`)).toMatchObject({ status: 404, text: '{"error":"not_found"}' });
    expect(await raw(`${kb.url}/v1/notes`, { method: 'GET' })).toMatchObject({
      status: 404,
      text: '{"error":"not_found"}',
    });
  });
});

describe('kb-server with KB_DEDUP=off', () => {
  let kb: Kb;
  beforeAll(async () => {
    kb = await startKb({ KB_DEDUP: 'off' });
  });
  afterAll(async () => {
    expect(await kb.proc.stop()).toBe(0);
  });

  it('every request reaching the insert stores a row: a double execution is visible in stats', async () => {
    expect(await kb.client.stats()).toEqual({ rows: 0, distinctKeys: 0, duplicateRows: 0 });
    const k1 = key();
    const a = await kb.client.writeNote({ ...AS, tenant: 'acme', key: k1, deadlineAt: soon(), note: note() });
    const b = await kb.client.writeNote({ ...AS, tenant: 'acme', key: k1, deadlineAt: soon(), note: note() });
    expect(a.created && b.created).toBe(true);
    expect(b.id).not.toBe(a.id);
    await kb.client.writeNote({ ...AS, tenant: 'globex', key: key(), deadlineAt: soon(), note: note() });

    expect(await kb.client.stats('acme')).toEqual({ rows: 2, distinctKeys: 1, duplicateRows: 1 });
    expect(await kb.client.stats('globex')).toEqual({ rows: 1, distinctKeys: 1, duplicateRows: 0 });
    expect(await kb.client.stats()).toEqual({ rows: 3, distinctKeys: 2, duplicateRows: 1 });
    // The probe names the first row and counts both.
    expect(await kb.client.probe({ tenant: 'acme', key: k1 })).toEqual({
      found: true,
      id: a.id,
      kb: 'research',
      createdAt: a.createdAt,
      count: 2,
    });
    // Deletes are not deduplicated either: the same delete twice is two stored deletes under the key.
    const dk = key();
    await kb.client.deleteNote({ ...AS, tenant: 'acme', key: dk, id: a.id });
    await kb.client.deleteNote({ ...AS, tenant: 'acme', key: dk, id: a.id });
    expect(await kb.client.probeDelete({ tenant: 'acme', key: dk })).toMatchObject({ found: true, id: a.id, count: 2 });
    expect(await kb.client.stats('acme')).toEqual({ rows: 1, distinctKeys: 1, duplicateRows: 0 });
    // The deadline still holds with dedup off.
    await expect(
      kb.client.writeNote({ ...AS, tenant: 'acme', key: k1, deadlineAt: Date.now() - 1, note: note() }),
    ).rejects.toMatchObject({ status: 409 });
    expect(await kb.client.stats('acme')).toEqual({ rows: 1, distinctKeys: 1, duplicateRows: 0 });
    const badTenant = await raw(`${kb.url}/v1/stats?tenant=ACME`);
    expect(badTenant).toMatchObject({
      status: 400,
      json: { error: 'invalid_input', issues: [{ path: ['query', 'tenant'] }] },
    });
  });
});

describe('kb-server process', () => {
  it('prints --help and exits 0', async () => {
    const p = spawnKb({}, ['--help']);
    expect(await p.exited).toBe(0);
    const out = JSON.stringify(p.lines);
    for (const name of [
      'KB_PORT',
      'KB_HOST',
      'KB_DB',
      'KB_DEDUP',
      'KB_SEED',
      'KB_SEED_FILE',
      'KB_ADMIN_TOKEN_FILE',
      'LOG_LEVEL',
    ])
      expect(out).toContain(name);
  });

  it('refuses a bad configuration with exit 2, listing every problem', async () => {
    const p = spawnKb({
      KB_DB: freshDb(),
      KB_PORT: 'eighty',
      KB_DEDUP: 'maybe',
      KB_SEED: 'acme:research,broken',
      LOG_LEVEL: 'loud',
    });
    expect(await p.exited).toBe(2);
    for (const name of ['KB_PORT', 'KB_DEDUP', 'KB_SEED', 'LOG_LEVEL']) expect(p.stderr).toContain(name);
    expect(p.stderr).not.toMatch(/\n\s+at /); // no stack
  });

  it('on SIGTERM stops accepting, finishes the in-flight request, closes the DB and exits 0; data and seeds survive a restart', async () => {
    const db = freshDb();
    const kb = await startKb({ KB_DB: db });
    const k1 = key();
    const payload = JSON.stringify(note());
    // An in-flight request: headers and half of the body sent, the rest after the signal.
    const req = request(`${kb.url}/v1/notes`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        'content-length': Buffer.byteLength(payload),
        'x-tenant': 'acme',
        ...AS_HEADERS,
        'idempotency-key': k1,
        'x-deadline': String(soon()),
      },
    });
    const answer = new Promise<{ status: number; body: string }>((resolveAnswer, reject) => {
      req.on('response', (res) => {
        let body = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => (body += c));
        res.on('end', () => resolveAnswer({ status: res.statusCode ?? 0, body }));
      });
      req.on('error', reject);
    });
    req.write(payload.slice(0, 20));
    await new Promise((r) => setTimeout(r, 200));
    kb.proc.child.kill('SIGTERM');
    await kb.proc.waitForLog('shutting down: draining');
    await expect(fetch(`${kb.url}/healthz`)).rejects.toThrow(); // no longer accepting
    expect(kb.proc.child.exitCode).toBeNull(); // still draining the in-flight request
    req.end(payload.slice(20));
    const done = await answer;
    expect(done.status).toBe(201);
    const id = (JSON.parse(done.body) as { id: string }).id;
    expect(await kb.proc.exited).toBe(0);
    expect(kb.proc.lines.some((l) => l.msg === 'stopped cleanly')).toBe(true);
    // Closed cleanly: the WAL was checkpointed into the main file.
    expect(existsSync(`${db}-wal`) ? readFileSync(`${db}-wal`).length : 0).toBe(0);

    const again = await startKb({ KB_DB: db });
    try {
      expect(await again.proc.waitForLog('store opened')).toMatchObject({ knowledgeBases: 3, created: 0 });
      expect(await again.client.probe({ tenant: 'acme', key: k1 })).toMatchObject({ found: true, id, count: 1 });
    } finally {
      expect(await again.proc.stop()).toBe(0);
    }
  });
});
