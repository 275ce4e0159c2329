/**
 * The research-KB service as the sample domain's system of record for authorisation (the KB
 * side): one resolver, writes under a version condition, roles, state, transfer, quotas,
 * all-or-nothing batches, operator endpoints, seeding and the migration of a file from before roles.
 * A real server process (examples/research-kb/kb-server.ts) on a free loopback port with a temp
 * SQLite file, `KB_DEDUP=off`; every refusal is checked against the KB's own rows. No mocks.
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { randomUUID } from 'node:crypto';
import Database from 'better-sqlite3';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { KbClient, KbError, type KbAdmin, type KbAdminView, type KbNote } from '../examples/research-kb/kb-client.js';
import type { KbSeedFile } from '../examples/research-kb/kb-seed.js';
import { canonicalRef } from '../examples/research-kb/kb-store.js';
import type { ServiceProcess } from './helpers/services.js';
import { sampleNote, soon, spawnKbProcess } from './helpers/kb.js';

const tmp = mkdtempSync(join(tmpdir(), 'kb-authz-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));
const TOKEN = `op-${randomUUID()}`;
const TOKEN_FILE = join(tmp, 'admin.token');
writeFileSync(TOKEN_FILE, `${TOKEN}\n`, { mode: 0o600 });

let n = 0;
const freshDb = () => join(tmp, `db-${++n}`, 'kb.sqlite');

const SEED: KbSeedFile = {
  tenants: [
    { id: 'acme', quota: 10_000 },
    { id: 'globex', quota: 10_000 },
    { id: 'tiny', quota: 3 },
  ],
  knowledgeBases: [
    {
      tenant: 'acme',
      name: 'research',
      aliases: ['Research-Notes', 'Café-Notes'],
      members: [
        { actor: 'alice', role: 'writer' },
        { actor: 'bob', role: 'reader' },
        { actor: 'root', role: 'admin' },
      ],
    },
    { tenant: 'acme', name: 'archive', members: [{ actor: 'alice', role: 'writer' }] },
    { tenant: 'acme', name: 'readonly', members: [{ actor: 'alice', role: 'reader' }] },
    {
      tenant: 'acme',
      name: 'legacy',
      aliases: ['Old-Stuff'],
      members: [{ actor: 'alice', role: 'writer' }],
      state: 'deleted',
    },
    { tenant: 'acme', name: 'moving', aliases: ['Moving-Box'], members: [{ actor: 'alice', role: 'writer' }] },
    { tenant: 'acme', name: 'icebox', members: [{ actor: 'alice', role: 'writer' }] },
    { tenant: 'acme', name: 'churn', members: [{ actor: 'alice', role: 'writer' }] },
    { tenant: 'acme', name: 'versions', members: [{ actor: 'alice', role: 'writer' }] },
    { tenant: 'globex', name: 'secret', aliases: ['Secret-Notes'], members: [{ actor: 'gina', role: 'writer' }] },
    { tenant: 'globex', name: 'research', members: [{ actor: 'gina', role: 'writer' }] },
    { tenant: 'tiny', name: 'inbox', defaultRole: 'writer' },
  ],
};

function writeSeed(doc: unknown): string {
  const p = join(tmp, `seed-${++n}.json`);
  writeFileSync(p, JSON.stringify(doc));
  return p;
}

const spawnKb = (env: Record<string, string>): ServiceProcess => spawnKbProcess(env);

interface Kb {
  proc: ServiceProcess;
  url: string;
  client: KbClient;
  admin: KbAdmin;
  db: string;
}

async function startKb(env: Record<string, string>): Promise<Kb> {
  const db = env.KB_DB ?? freshDb();
  const proc = spawnKb({ KB_DB: db, ...env });
  const line = await proc.waitForLog('listening');
  const url = `http://127.0.0.1:${Number(line.port)}`;
  const client = new KbClient(url);
  return { proc, url, client, admin: client.admin(TOKEN), db };
}

const note = sampleNote;
let k = 0;
const key = () => `tx_authz-${process.pid}-${++k}`;

/** A raw request: status, the headers that matter, exact body text. */
async function raw(url: string, init: RequestInit & { headers?: Record<string, string> } = {}) {
  const res = await fetch(url, init);
  const text = await res.text();
  // `date` and `x-kb-now` carry the instant of the answer, the same for every answer at that instant.
  const headers = Object.fromEntries(
    [...res.headers].filter(([h]) => h !== 'date' && h !== 'x-kb-now' && h !== 'keep-alive' && h !== 'connection'),
  );
  return { status: res.status, headers, text, json: text ? (JSON.parse(text) as Record<string, unknown>) : undefined };
}

/** The KB's own rows, read from its SQLite file. */
function rows(db: string, where: string, ...args: unknown[]): number {
  const conn = new Database(db, { readonly: true });
  try {
    return (conn.prepare(`SELECT COUNT(*) AS c FROM notes WHERE ${where}`).get(...args) as { c: number }).c;
  } finally {
    conn.close();
  }
}
function authVersionInDb(db: string, kbId: string): number {
  const conn = new Database(db, { readonly: true });
  try {
    return (conn.prepare('SELECT auth_version AS v FROM knowledge_bases WHERE id = ?').get(kbId) as { v: number }).v;
  } finally {
    conn.close();
  }
}

describe('kb-server as the system of record for authorisation (KB_DEDUP=off)', () => {
  let kb: Kb;
  const ids: Record<string, string> = {};
  const post = (tenant: string, actor: string, ifMatch: string, body: unknown, k1 = key()) =>
    raw(`${kb.url}/v1/notes`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        'x-tenant': tenant,
        'x-actor': actor,
        'idempotency-key': k1,
        'x-deadline': String(soon()),
        'if-match': ifMatch,
      },
      body: JSON.stringify(body),
    });
  const resolveRaw = (tenant: string, actor: string, ref: string) =>
    raw(`${kb.url}/v1/resolve?ref=${encodeURIComponent(ref)}`, { headers: { 'x-tenant': tenant, 'x-actor': actor } });
  const version = async (tenant: string, ref: string) =>
    (await kb.client.resolve({ tenant, actor: 'alice', ref })).authVersion;

  beforeAll(async () => {
    kb = await startKb({
      KB_DEDUP: 'off',
      KB_SEED_FILE: writeSeed(SEED),
      KB_SEED: 'initech:lab,initech:vault:ian+ivy',
      KB_ADMIN_TOKEN_FILE: TOKEN_FILE,
    });
    for (const v of await kb.admin.list()) ids[`${v.tenant}/${v.name}`] = v.kbId;
  });
  afterAll(async () => {
    await kb.client.close();
    expect(await kb.proc.stop()).toBe(0);
  });

  it('seeds tenants, knowledge bases, aliases, members and states; the operator list shows them', async () => {
    const opened = await kb.proc.waitForLog('store opened');
    expect(opened).toMatchObject({ knowledgeBases: 13, created: 13, tenants: 3, adminApi: true });
    const all = await kb.admin.list();
    expect(all).toHaveLength(13);
    for (const v of all) expect(v.kbId).toMatch(/^kb_[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}$/);
    const research = all.find((v) => v.kbId === ids['acme/research'])!;
    expect(research).toEqual({
      kbId: ids['acme/research'],
      tenant: 'acme',
      name: 'research',
      state: 'active',
      authVersion: 1,
      quotaUsed: 0,
      quotaLimit: 10_000,
      aliases: ['café-notes', 'research-notes'],
      defaultRole: null,
      members: [
        { tenant: 'acme', actor: 'alice', role: 'writer' },
        { tenant: 'acme', actor: 'bob', role: 'reader' },
        { tenant: 'acme', actor: 'root', role: 'admin' },
      ],
    });
    expect(all.find((v) => v.kbId === ids['acme/legacy'])).toMatchObject({ state: 'deleted', aliases: ['old-stuff'] });
    expect((await kb.admin.list('globex')).map((v) => v.name)).toEqual(['research', 'secret']);
    // KB_SEED without actors: every actor of the tenant writes; with actors: only those.
    expect(await kb.admin.get(ids['initech/lab']!)).toMatchObject({
      defaultRole: 'writer',
      members: [],
      quotaLimit: null,
    });
    expect((await kb.client.resolve({ tenant: 'initech', actor: 'anyone', ref: 'lab' })).role).toBe('writer');
    expect((await kb.client.resolve({ tenant: 'initech', actor: 'ivy', ref: 'vault' })).role).toBe('writer');
    expect((await kb.client.resolve({ tenant: 'initech', actor: 'zed', ref: 'vault' })).role).toBeNull();
  });

  it('FM-10: every reference kind — case, percent-encoding, NFC/NFD, alias, kb_ id — resolves to one id, and writes land there', async () => {
    const id = ids['acme/research']!;
    const refs = [
      'research',
      'RESEARCH',
      '  Research\t',
      '%52esearch',
      'research%20', // name: case, percent-encoding, whitespace
      'Research-Notes',
      'research-notes',
      'Research%2DNotes',
      ' RESEARCH-NOTES ', // alias
      'Café-Notes',
      'Cafe\u0301-Notes',
      'CAFE\u0301-NOTES',
      'caf%C3%A9-notes',
      'cafe%CC%81-notes', // NFC, NFD, percent-encoded UTF-8 of both
      id,
      id.toUpperCase(),
      ` ${id} `,
      encodeURIComponent(id).replace('_', '%5F'), // internal id
    ];
    for (const ref of refs) {
      const r = await kb.client.resolve({ tenant: 'acme', actor: 'alice', ref });
      expect({ ref, r }).toEqual({
        ref,
        r: { kbId: id, name: 'research', state: 'active', authVersion: 1, role: 'writer' },
      });
    }
    // The raw answer: 200 with the version as an ETag.
    const r = await resolveRaw('acme', 'bob', 'research-notes');
    expect(r).toMatchObject({ status: 200, headers: { etag: '"1"' }, json: { kbId: id, role: 'reader' } });
    // The exported canonicalisation is the one the KB uses.
    expect(canonicalRef('Cafe\u0301-Notes')).toBe('café-notes');
    expect(canonicalRef('%ZZ')).toBeNull();
    expect(canonicalRef('research%252D')).toBe('research%2d');

    const before = rows(kb.db, 'kb_id = ?', id);
    const writes = await Promise.all(
      refs.map((ref) =>
        kb.client.writeNote({
          tenant: 'acme',
          actor: 'alice',
          ifMatch: 1,
          key: key(),
          deadlineAt: soon(),
          note: note(ref),
        }),
      ),
    );
    for (const w of writes) expect(w).toMatchObject({ kb: 'research', kbId: id, created: true });
    expect(rows(kb.db, 'kb_id = ?', id)).toBe(before + refs.length);
  });

  it('FM-10/FM-18: missing, foreign (by name, alias or guessed id), deleted and undecodable references give byte-identical 404s, and nothing is written', async () => {
    const missing = await resolveRaw('acme', 'alice', 'no-such-kb');
    expect(missing).toEqual({
      status: 404,
      headers: {
        'content-type': 'application/json; charset=utf-8',
        'content-length': '21',
        'cache-control': 'no-store',
      },
      text: '{"error":"not_found"}',
      json: { error: 'not_found' },
    });
    const refs = [
      'secret',
      'Secret-Notes',
      ids['globex/secret']!,
      ids['globex/secret']!.toUpperCase(), // globex's
      'legacy',
      'Old-Stuff',
      ids['acme/legacy']!, // acme's own, soft-deleted
      `kb_${randomUUID()}`,
      '%ZZ',
      'research%252D',
      '',
      ' ', // guessed, invalid encoding, double-encoded, empty
    ];
    for (const ref of refs) expect({ ref, r: await resolveRaw('acme', 'alice', ref) }).toEqual({ ref, r: missing });
    // globex has its own "research", but acme's id is not globex's, whatever its actor's name.
    expect(await resolveRaw('globex', 'gina', ids['acme/research']!)).toEqual(missing);
    expect(await resolveRaw('globex', 'alice', 'research-notes')).toEqual(missing);

    // Writes: the same 404 body, for the owner's version and any other, and never a 403 to a foreign caller.
    const before = rows(kb.db, '1');
    const write404 = await post('acme', 'alice', '1', note('no-such-kb'));
    expect(write404).toEqual({ ...missing, headers: write404.headers });
    for (const ref of refs.filter((r) => r !== '')) {
      for (const ifMatch of ['1', '2'])
        expect({ ref, r: await post('acme', 'alice', ifMatch, note(ref)) }).toEqual({ ref, r: write404 });
    }
    expect(await post('globex', 'gina', '1', note(ids['acme/research']!))).toEqual(write404);
    expect(await post('globex', 'bob', '1', note(ids['acme/readonly']!))).toEqual(write404); // bob is no one at globex
    expect(rows(kb.db, '1')).toBe(before);
  });

  it('roles are current: a reader or a non-member gets 403 from its own tenant, and nothing is written', async () => {
    const id = ids['acme/research']!;
    const before = rows(kb.db, 'kb_id = ?', id);
    const forbidden = await post('acme', 'bob', '1', note('research'));
    expect(forbidden).toMatchObject({ status: 403, text: '{"error":"forbidden"}' });
    expect(await post('acme', 'nobody', '1', note('research'))).toMatchObject({
      status: 403,
      text: '{"error":"forbidden"}',
    });
    await expect(
      kb.client.writeNote({
        tenant: 'acme',
        actor: 'alice',
        ifMatch: 1,
        key: key(),
        deadlineAt: soon(),
        note: note('readonly'),
      }),
    ).rejects.toMatchObject({
      name: 'KbError',
      status: 403,
      errorClass: 'forbidden',
    });
    // An admin writes.
    expect(
      await kb.client.writeNote({
        tenant: 'acme',
        actor: 'root',
        ifMatch: 1,
        key: key(),
        deadlineAt: soon(),
        note: note('research'),
      }),
    ).toMatchObject({ created: true });
    expect(rows(kb.db, 'kb_id = ?', id)).toBe(before + 1);
  });

  it('FM-07: a role revoked after the caller read authVersion stops the write with 412, nothing written; the new version then gets 403', async () => {
    const id = ids['acme/archive']!;
    const seen = await kb.client.resolve({ tenant: 'acme', actor: 'alice', ref: 'archive' });
    expect(seen.role).toBe('writer');
    const revoked = await kb.admin.setMember(id, { tenant: 'acme', actor: 'alice', role: null });
    expect(revoked).toMatchObject({ changed: true, authVersion: seen.authVersion + 1, members: [] });
    const before = rows(kb.db, 'kb_id = ?', id);
    const k1 = key();
    const err = await kb.client
      .writeNote({
        tenant: 'acme',
        actor: 'alice',
        ifMatch: seen.authVersion,
        key: k1,
        deadlineAt: soon(),
        note: note('archive'),
      })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(KbError);
    expect(err).toMatchObject({ status: 412, errorClass: 'version_conflict' });
    expect((await post('acme', 'alice', String(seen.authVersion), note('archive'))).text).toBe(
      '{"error":"version_conflict"}',
    );
    expect(rows(kb.db, 'kb_id = ?', id)).toBe(before);
    expect(await kb.client.probe({ tenant: 'acme', key: k1 })).toMatchObject({ found: false });

    // Re-checked with the new version: the role is gone.
    const now = await kb.client.resolve({ tenant: 'acme', actor: 'alice', ref: 'archive' });
    expect(now).toMatchObject({ role: null, authVersion: seen.authVersion + 1 });
    await expect(
      kb.client.writeNote({
        tenant: 'acme',
        actor: 'alice',
        ifMatch: now.authVersion,
        key: key(),
        deadlineAt: soon(),
        note: note('archive'),
      }),
    ).rejects.toMatchObject({
      status: 403,
      errorClass: 'forbidden',
    });
    expect(rows(kb.db, 'kb_id = ?', id)).toBe(before);

    // Granted again: another version, and the write goes through under it.
    const granted = await kb.admin.setMember(id, { tenant: 'acme', actor: 'alice', role: 'writer' });
    expect(granted.authVersion).toBe(now.authVersion + 1);
    expect(
      await kb.client.writeNote({
        tenant: 'acme',
        actor: 'alice',
        ifMatch: granted.authVersion,
        key: key(),
        deadlineAt: soon(),
        note: note('archive'),
      }),
    ).toMatchObject({
      created: true,
      kbId: id,
    });
    expect(rows(kb.db, 'kb_id = ?', id)).toBe(before + 1);
  });

  it('FM-07 race: writes under the old version racing a revocation are each either stored (before it) or 412 (after it) — never stored after', async () => {
    const id = ids['acme/churn']!;
    const v = await version('acme', 'churn');
    const before = rows(kb.db, 'kb_id = ?', id);
    const writes = Array.from({ length: 24 }, (_, i) =>
      new Promise((r) => setTimeout(r, i * 3)).then(() => post('acme', 'alice', String(v), note('churn'))),
    );
    await new Promise((r) => setTimeout(r, 30));
    const revoke = kb.admin.setMember(id, { tenant: 'acme', actor: 'alice', role: null });
    const results = await Promise.all(writes);
    await revoke;
    const statuses = results.map((r) => r.status);
    for (const s of statuses) expect([201, 412]).toContain(s);
    const created = results.filter((r) => r.status === 201);
    expect(rows(kb.db, 'kb_id = ?', id)).toBe(before + created.length);
    // Every stored note was created before the revocation committed: none after.
    const after = await post('acme', 'alice', String(v), note('churn'));
    expect(after.status).toBe(412);
    expect(rows(kb.db, 'kb_id = ?', id)).toBe(before + created.length);
  });

  it('FM-08: a frozen knowledge base refuses writes and deletes with 409 frozen (whatever the version), nothing written; unfrozen it writes again', async () => {
    const id = ids['acme/icebox']!;
    const v0 = await version('acme', 'icebox');
    const w = await kb.client.writeNote({
      tenant: 'acme',
      actor: 'alice',
      ifMatch: v0,
      key: key(),
      deadlineAt: soon(),
      note: note('icebox'),
    });
    const frozen = await kb.admin.setState(id, 'frozen');
    expect(frozen).toMatchObject({ state: 'frozen', authVersion: v0 + 1, changed: true });
    expect(await kb.client.resolve({ tenant: 'acme', actor: 'alice', ref: 'icebox' })).toMatchObject({
      state: 'frozen',
      authVersion: v0 + 1,
      role: 'writer',
    });
    const before = rows(kb.db, 'kb_id = ?', id);
    for (const ifMatch of [v0, v0 + 1]) {
      const r = await post('acme', 'alice', String(ifMatch), note('icebox'));
      expect(r).toMatchObject({ status: 409, text: '{"error":"frozen"}' });
    }
    await expect(
      kb.client.writeNote({
        tenant: 'acme',
        actor: 'alice',
        ifMatch: v0 + 1,
        key: key(),
        deadlineAt: soon(),
        note: note('icebox'),
      }),
    ).rejects.toMatchObject({
      status: 409,
      errorClass: 'frozen',
    });
    await expect(
      kb.client.deleteNote({ tenant: 'acme', actor: 'alice', ifMatch: v0 + 1, key: key(), id: w.id }),
    ).rejects.toMatchObject({ status: 409, errorClass: 'frozen' });
    expect(rows(kb.db, 'kb_id = ? AND deleted_at IS NULL', id)).toBe(before);
    const thawed = await kb.admin.setState(id, 'active');
    expect(thawed.authVersion).toBe(v0 + 2);
    await expect(
      kb.client.writeNote({
        tenant: 'acme',
        actor: 'alice',
        ifMatch: v0 + 1,
        key: key(),
        deadlineAt: soon(),
        note: note('icebox'),
      }),
    ).rejects.toMatchObject({
      status: 412,
    });
    expect(
      await kb.client.writeNote({
        tenant: 'acme',
        actor: 'alice',
        ifMatch: v0 + 2,
        key: key(),
        deadlineAt: soon(),
        note: note('icebox'),
      }),
    ).toMatchObject({ created: true });
    expect(rows(kb.db, 'kb_id = ?', id)).toBe(before + 1);
  });

  it('FM-08: after a transfer the old tenant gets the uniform 404 by name, alias and id; the new owner grants roles explicitly', async () => {
    const id = ids['acme/moving']!;
    const v0 = await version('acme', 'moving');
    const mine = await kb.client.writeNote({
      tenant: 'acme',
      actor: 'alice',
      ifMatch: v0,
      key: key(),
      deadlineAt: soon(),
      note: note('Moving-Box'),
    });
    // A transfer to a tenant that already has the name is refused and changes nothing.
    const clash = await raw(`${kb.url}/v1/admin/kbs/${ids['globex/research']}/owner`, {
      method: 'POST',
      headers: { authorization: `Bearer ${TOKEN}`, 'content-type': 'application/json' },
      body: JSON.stringify({ tenant: 'acme' }),
    });
    expect(clash).toMatchObject({ status: 409, json: { error: 'conflict' } });
    expect((await kb.admin.get(ids['globex/research']!)).authVersion).toBe(1);

    const moved = await kb.admin.transferOwner(id, 'globex');
    expect(moved).toMatchObject({
      tenant: 'globex',
      authVersion: v0 + 1,
      aliases: ['moving-box'],
      members: [],
      defaultRole: null,
      changed: true,
    });
    const missing = await resolveRaw('acme', 'alice', 'no-such-kb');
    for (const ref of ['moving', 'Moving-Box', id]) expect(await resolveRaw('acme', 'alice', ref)).toEqual(missing);
    const before = rows(kb.db, 'kb_id = ?', id);
    for (const ifMatch of [v0, v0 + 1])
      expect((await post('acme', 'alice', String(ifMatch), note('moving'))).text).toBe('{"error":"not_found"}');
    await expect(
      kb.client.deleteNote({ tenant: 'acme', actor: 'alice', ifMatch: v0 + 1, key: key(), id: mine.id }),
    ).rejects.toMatchObject({ status: 404, errorClass: 'not_found' });
    expect(rows(kb.db, 'kb_id = ? AND deleted_at IS NULL', id)).toBe(before);

    // The new owner resolves it under the same name and alias, with no role until granted.
    expect(await kb.client.resolve({ tenant: 'globex', actor: 'gina', ref: 'MOVING-BOX' })).toEqual({
      kbId: id,
      name: 'moving',
      state: 'active',
      authVersion: v0 + 1,
      role: null,
    });
    const granted = await kb.admin.setMember(id, { tenant: 'globex', actor: 'gina', role: 'writer' });
    expect(
      await kb.client.writeNote({
        tenant: 'globex',
        actor: 'gina',
        ifMatch: granted.authVersion,
        key: key(),
        deadlineAt: soon(),
        note: note('moving'),
      }),
    ).toMatchObject({ kbId: id });
    // A member of another tenant is refused.
    await expect(kb.admin.setMember(id, { tenant: 'acme', actor: 'alice', role: 'writer' })).rejects.toMatchObject({
      status: 409,
      errorClass: 'conflict',
    });

    // The stats the demo uses: rows acme wrote in a knowledge base whose owner is not acme.
    const perKb = await kb.client.rowsPerKb({ tenant: 'acme' });
    expect(perKb.find((r) => r.kbId === id)).toEqual({
      kbId: id,
      owner: 'globex',
      name: 'moving',
      state: 'active',
      rows: 1,
    });
    expect(perKb.filter((r) => r.owner !== 'acme').reduce((s, r) => s + r.rows, 0)).toBe(1);
    expect(await kb.client.rowsPerKb({ kbId: id })).toEqual([
      { kbId: id, owner: 'globex', name: 'moving', state: 'active', rows: 2 },
    ]);
    expect(await kb.client.stats('globex')).toMatchObject({ rows: 1 });
  });

  it('quota race: 3 notes of quota left and 8 concurrent writers give exactly 3 rows and 5 × 429 quota_exceeded with retry-after to the next UTC midnight', async () => {
    const id = ids['tiny/inbox']!;
    const v = await version('tiny', 'inbox');
    expect(await kb.admin.get(id)).toMatchObject({ quotaUsed: 0, quotaLimit: 3 });
    const started = Date.now();
    const results = await Promise.all(Array.from({ length: 8 }, () => post('tiny', 'tess', String(v), note('inbox'))));
    const nextMidnight = (Math.floor(started / 86_400_000) + 1) * 86_400_000;
    const ok = results.filter((r) => r.status === 201);
    const refused = results.filter((r) => r.status === 429);
    expect(ok).toHaveLength(3);
    expect(refused).toHaveLength(5);
    for (const r of refused) {
      expect(r.json).toEqual({ error: 'quota_exceeded', retryAfterMs: expect.any(Number) });
      expect(Math.abs(Number(r.json!.retryAfterMs) - (nextMidnight - started))).toBeLessThan(30_000);
      expect(r.headers['retry-after']).toBe(String(Math.max(1, Math.ceil(Number(r.json!.retryAfterMs) / 1000))));
    }
    expect(rows(kb.db, 'kb_id = ?', id)).toBe(3);
    expect(await kb.admin.get(id)).toMatchObject({ quotaUsed: 3, quotaLimit: 3, authVersion: v });
    // Through the client: a typed error with retryAfterMs; a batch needs room for every item.
    const err = await kb.client
      .writeNote({ tenant: 'tiny', actor: 'tess', ifMatch: v, key: key(), deadlineAt: soon(), note: note('inbox') })
      .catch((e: unknown) => e);
    expect(err).toMatchObject({
      name: 'KbError',
      status: 429,
      errorClass: 'quota_exceeded',
      retryAfterMs: expect.any(Number),
    });
    await expect(
      kb.client.writeBatch({
        tenant: 'tiny',
        actor: 'tess',
        key: key(),
        deadlineAt: soon(),
        ifMatch: { [id]: v },
        items: [note('inbox'), note('inbox')],
      }),
    ).rejects.toMatchObject({ status: 429, errorClass: 'quota_exceeded', index: 0 });
    expect(rows(kb.db, 'kb_id = ?', id)).toBe(3);
    expect(authVersionInDb(kb.db, id)).toBe(v);
  });

  it('FM-09: a batch is authorised item by item; one foreign, forbidden, frozen or stale item refuses it all and nothing is written', async () => {
    const r = ids['acme/research']!;
    const a = ids['acme/archive']!;
    const vr = await version('acme', 'research');
    const va = await version('acme', 'archive');
    const ifMatch = { [r]: vr, [a]: va };
    const total = rows(kb.db, '1');
    const batch = (items: KbNote[], over: Partial<{ actor: string; ifMatch: Record<string, number> }> = {}) =>
      kb.client
        .writeBatch({ tenant: 'acme', actor: 'alice', key: key(), deadlineAt: soon(), ifMatch, items, ...over })
        .catch((e: unknown) => e);

    // A foreign item (globex's id, guessed) in the middle: 404, its index, nothing written.
    const foreign = await batch([note('research'), note('archive'), note(ids['globex/secret']!), note('research')]);
    expect(foreign).toMatchObject({
      status: 404,
      errorClass: 'not_found',
      index: 2,
      issues: [{ path: ['items', 2], code: 'not_found' }],
    });
    // The raw answer is the uniform not_found plus the item's index, nothing about whose it is.
    const rawForeign = await raw(`${kb.url}/v1/notes:batch`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        'x-tenant': 'acme',
        'x-actor': 'alice',
        'idempotency-key': key(),
        'x-deadline': String(soon()),
        'if-match': `${r}=${vr}`,
      },
      body: JSON.stringify({ items: [note('research'), note('secret')] }),
    });
    const rawMissing = await raw(`${kb.url}/v1/notes:batch`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        'x-tenant': 'acme',
        'x-actor': 'alice',
        'idempotency-key': key(),
        'x-deadline': String(soon()),
        'if-match': `${r}=${vr}`,
      },
      body: JSON.stringify({ items: [note('research'), note('nothing-here')] }),
    });
    expect(rawForeign).toEqual(rawMissing);
    expect(rawForeign).toMatchObject({
      status: 404,
      json: { error: 'not_found', issues: [{ path: ['items', 1], code: 'not_found' }] },
    });

    expect(
      await batch([note('research'), note('readonly')], { ifMatch: { ...ifMatch, [ids['acme/readonly']!]: 1 } }),
    ).toMatchObject({ status: 403, errorClass: 'forbidden', index: 1 });
    expect(await batch([note('archive'), note('research')], { actor: 'bob' })).toMatchObject({
      status: 403,
      errorClass: 'forbidden',
      index: 0,
    });
    expect(await batch([note('research'), note('archive')], { ifMatch: { [r]: vr } })).toMatchObject({
      status: 412,
      errorClass: 'version_conflict',
      index: 1,
    });
    expect(await batch([note('research'), note('archive')], { ifMatch: { [r]: vr, [a]: va + 7 } })).toMatchObject({
      status: 412,
      index: 1,
    });
    await kb.admin.setState(ids['acme/icebox']!, 'frozen');
    const vi = (await kb.admin.get(ids['acme/icebox']!)).authVersion;
    expect(
      await batch([note('research'), note('icebox')], { ifMatch: { ...ifMatch, [ids['acme/icebox']!]: vi } }),
    ).toMatchObject({ status: 409, errorClass: 'frozen', index: 1 });
    await kb.admin.setState(ids['acme/icebox']!, 'active');
    expect(rows(kb.db, '1')).toBe(total);

    // An honest batch: every item stored under <key>#<i>, one transaction; the probe by the batch key finds it.
    const bk = key();
    const ok = await kb.client.writeBatch({
      tenant: 'acme',
      actor: 'alice',
      key: bk,
      deadlineAt: soon(),
      ifMatch,
      items: [note('research'), note('ARCHIVE'), note('research-notes')],
    });
    expect(ok.created).toBe(true);
    expect(ok.items.map((i) => i.kbId)).toEqual([r, a, r]);
    expect(rows(kb.db, '1')).toBe(total + 3);
    for (let i = 0; i < 3; i++)
      expect(rows(kb.db, 'downstream_key = ? AND id = ?', `${bk}#${i}`, ok.items[i]!.id)).toBe(1);
    const probe = await kb.client.probe({ tenant: 'acme', key: bk });
    expect(probe).toEqual({
      found: true,
      id: ok.items[0]!.id,
      kb: 'research',
      createdAt: ok.items[0]!.createdAt,
      count: 1,
      items: ok.items.map(({ id, kb: name, createdAt }) => ({ id, kb: name, createdAt })),
    });
    expect(await kb.client.probe({ tenant: 'globex', key: bk })).toMatchObject({ found: false });
    // Past the deadline: 409 and nothing.
    await expect(
      kb.client.writeBatch({
        tenant: 'acme',
        actor: 'alice',
        key: key(),
        deadlineAt: Date.now() - 1,
        ifMatch,
        items: [note('research')],
      }),
    ).rejects.toMatchObject({
      status: 409,
      errorClass: 'deadline_passed',
    });
    expect(rows(kb.db, '1')).toBe(total + 3);
  });

  it('bad batch input is 400 with field paths: too many items, a bad item field, a malformed if-match', async () => {
    const r = ids['acme/research']!;
    const send = (body: unknown, ifMatch: string) =>
      raw(`${kb.url}/v1/notes:batch`, {
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          'x-tenant': 'acme',
          'x-actor': 'alice',
          'idempotency-key': key(),
          'x-deadline': String(soon()),
          'if-match': ifMatch,
        },
        body: JSON.stringify(body),
      });
    const before = rows(kb.db, '1');
    const tooMany = await send({ items: Array.from({ length: 51 }, () => note('research')) }, `${r}=1`);
    expect(tooMany).toMatchObject({
      status: 400,
      json: { error: 'invalid_input', issues: [{ path: ['items'], code: 'too_big' }] },
    });
    const badItem = await send({ items: [note('research'), note('research', { title: '' })] }, `${r}=1`);
    expect(badItem).toMatchObject({ status: 400, json: { issues: [{ path: ['items', 1, 'title'] }] } });
    for (const bad of ['1', `${r}`, `${r}=x`, `${r}=1,${r}=2`, '{"a":1}']) {
      expect(await send({ items: [note('research')] }, bad)).toMatchObject({
        status: 400,
        json: { issues: [{ path: ['headers', 'if-match'] }] },
      });
    }
    const single = await post('acme', 'alice', 'W/"1"', note('research'));
    expect(single).toMatchObject({ status: 400, json: { issues: [{ path: ['headers', 'if-match'] }] } });
    expect((await post('acme', 'alice', '"1"', note('research'))).status).not.toBe(400); // quoted like an ETag is fine
    expect(rows(kb.db, '1')).toBe(before + 1);
  });

  it('deletes are checked like writes: 404 to another tenant, 403 to a reader, 412 on a stale version, idempotent when allowed', async () => {
    const v = await version('acme', 'research');
    const w = await kb.client.writeNote({
      tenant: 'acme',
      actor: 'alice',
      ifMatch: v,
      key: key(),
      deadlineAt: soon(),
      note: note('research'),
    });
    const del = (tenant: string, actor: string, ifMatch: number) =>
      kb.client.deleteNote({ tenant, actor, ifMatch, key: key(), id: w.id }).catch((e: unknown) => e);
    expect(await del('globex', 'gina', v)).toMatchObject({ status: 404, errorClass: 'not_found' });
    expect(await del('acme', 'bob', v)).toMatchObject({ status: 403, errorClass: 'forbidden' });
    expect(await del('acme', 'alice', v + 1)).toMatchObject({ status: 412, errorClass: 'version_conflict' });
    expect(rows(kb.db, 'id = ? AND deleted_at IS NULL', w.id)).toBe(1);
    expect(await del('acme', 'alice', v)).toEqual({ id: w.id, deleted: true });
    expect(await del('acme', 'alice', v)).toEqual({ id: w.id, deleted: true });
    expect(rows(kb.db, 'id = ? AND deleted_at IS NULL', w.id)).toBe(0);
    const noActor = await raw(`${kb.url}/v1/notes/${w.id}`, {
      method: 'DELETE',
      headers: { 'x-tenant': 'acme', 'idempotency-key': key() },
    });
    expect(noActor).toMatchObject({
      status: 400,
      json: { issues: [{ path: ['headers', 'x-actor'] }, { path: ['headers', 'if-match'] }] },
    });
  });

  it('auth_version does not change on inserts, batches, deletes or quota counting, and changes by exactly one on each operator change', async () => {
    const id = ids['acme/versions']!;
    const v0 = authVersionInDb(kb.db, id);
    const quota0 = (await kb.admin.get(id)).quotaUsed;
    const ws = [];
    for (let i = 0; i < 5; i++)
      ws.push(
        await kb.client.writeNote({
          tenant: 'acme',
          actor: 'alice',
          ifMatch: v0,
          key: key(),
          deadlineAt: soon(),
          note: note('versions'),
        }),
      );
    await kb.client.writeBatch({
      tenant: 'acme',
      actor: 'alice',
      key: key(),
      deadlineAt: soon(),
      ifMatch: { [id]: v0 },
      items: [note('versions'), note('versions')],
    });
    await kb.client.deleteNote({ tenant: 'acme', actor: 'alice', ifMatch: v0, key: key(), id: ws[0]!.id });
    expect(authVersionInDb(kb.db, id)).toBe(v0);
    expect((await kb.admin.get(id)).quotaUsed).toBe(quota0 + 7);
    expect((await kb.client.resolve({ tenant: 'acme', actor: 'alice', ref: 'versions' })).authVersion).toBe(v0);

    let expected = v0;
    const step = async (change: () => Promise<KbAdminView & { changed: boolean }>, changes: boolean) => {
      const out = await change();
      if (changes) expected++;
      expect(out).toMatchObject({ changed: changes, authVersion: expected });
      expect(authVersionInDb(kb.db, id)).toBe(expected);
      // The owner resolves it at the new version (the other tenant would get 404).
      expect((await kb.client.resolve({ tenant: out.tenant, actor: 'alice', ref: id })).authVersion).toBe(expected);
    };
    await step(() => kb.admin.setMember(id, { tenant: 'acme', actor: 'carol', role: 'reader' }), true); // membership
    await step(() => kb.admin.setMember(id, { tenant: 'acme', actor: 'carol', role: 'reader' }), false); // the same again: no change
    await step(() => kb.admin.setMember(id, { tenant: 'acme', actor: 'carol', role: 'admin' }), true); // role
    await step(() => kb.admin.setMember(id, { tenant: 'acme', actor: 'carol', role: null }), true); // revoke
    await step(() => kb.admin.setMember(id, { tenant: 'acme', actor: 'carol', role: null }), false);
    await step(() => kb.admin.setDefaultRole(id, 'reader'), true); // default role
    await step(() => kb.admin.addAlias(id, 'Version-Notes'), true); // alias
    await step(() => kb.admin.addAlias(id, 'VERSION-NOTES'), false);
    await step(() => kb.admin.removeAlias(id, 'version-notes'), true);
    await step(() => kb.admin.setState(id, 'frozen'), true); // state
    await step(() => kb.admin.setState(id, 'active'), true);
    await step(() => kb.admin.transferOwner(id, 'initech'), true); // owner
    await step(() => kb.admin.transferOwner(id, 'acme'), true);
    // Back at acme, with roles reset: alice's old grant went with the first transfer.
    expect((await kb.client.resolve({ tenant: 'acme', actor: 'alice', ref: 'versions' })).role).toBeNull();
    // A deleted knowledge base is gone for everyone, the operator can bring it back.
    const deleted = await kb.admin.setState(id, 'deleted');
    expect(deleted).toMatchObject({ changed: true, authVersion: ++expected, state: 'deleted' });
    await expect(kb.client.resolve({ tenant: 'acme', actor: 'alice', ref: id })).rejects.toMatchObject({
      status: 404,
      errorClass: 'not_found',
    });
    const undeleted = await kb.admin.setState(id, 'active');
    expect(undeleted.authVersion).toBe(expected + 1);
  });

  it('a revoked member of a knowledge base with a default role stays revoked', async () => {
    const id = ids['initech/lab']!;
    expect((await kb.client.resolve({ tenant: 'initech', actor: 'ian', ref: 'lab' })).role).toBe('writer');
    const out = await kb.admin.setMember(id, { tenant: 'initech', actor: 'ian', role: null });
    expect(out.members).toEqual([{ tenant: 'initech', actor: 'ian', role: 'none' }]);
    expect((await kb.client.resolve({ tenant: 'initech', actor: 'ian', ref: 'lab' })).role).toBeNull();
    expect((await kb.client.resolve({ tenant: 'initech', actor: 'ivy', ref: 'lab' })).role).toBe('writer');
  });

  it('operator endpoints need the bearer token; aliases are validated and unique per tenant; nothing secret is logged', async () => {
    const list = (headers: Record<string, string>) => raw(`${kb.url}/v1/admin/kbs`, { headers });
    expect(await list({})).toMatchObject({
      status: 401,
      json: { error: 'unauthorized' },
      headers: { 'www-authenticate': 'Bearer' },
    });
    expect(await list({ authorization: `Bearer ${TOKEN}x` })).toMatchObject({ status: 401 });
    expect(await list({ authorization: TOKEN })).toMatchObject({ status: 401 });
    expect(await list({ authorization: `Bearer ${TOKEN}` })).toMatchObject({ status: 200 });
    const id = ids['acme/research']!;
    await expect(kb.admin.addAlias(id, 'archive')).rejects.toMatchObject({ status: 409, errorClass: 'conflict' }); // another KB's name
    await expect(kb.admin.addAlias(id, 'old-stuff')).rejects.toMatchObject({ status: 409 }); // a deleted KB's alias
    await expect(kb.admin.addAlias(id, 'kb_mine')).rejects.toMatchObject({
      status: 400,
      errorClass: 'invalid_input',
      issues: [{ path: ['alias'] }],
    });
    await expect(kb.admin.addAlias(id, '100%25')).rejects.toMatchObject({ status: 400 });
    // globex may use the alias acme uses: aliases are per tenant.
    expect(await kb.admin.addAlias(ids['globex/research']!, 'Research-Notes')).toMatchObject({
      aliases: ['research-notes'],
    });
    expect((await kb.client.resolve({ tenant: 'globex', actor: 'gina', ref: 'research-notes' })).kbId).toBe(
      ids['globex/research'],
    );
    expect((await kb.client.resolve({ tenant: 'acme', actor: 'alice', ref: 'research-notes' })).kbId).toBe(id);
    await expect(kb.admin.get(`kb_${randomUUID()}`)).rejects.toMatchObject({ status: 404 });
    expect(kb.proc.lines.some((l) => l.msg === 'knowledge base changed' && l.change === 'member')).toBe(true);
    expect(JSON.stringify(kb.proc.lines) + kb.proc.stderr).not.toContain(TOKEN);
    expect(JSON.stringify(kb.proc.lines)).not.toContain('Leader election');
  });
});

describe('kb-server with KB_DEDUP=on and no operator token', () => {
  let kb: Kb;
  beforeAll(async () => {
    kb = await startKb({ KB_DEDUP: 'on', KB_SEED_FILE: writeSeed(SEED) });
  });
  afterAll(async () => {
    await kb.client.close();
    expect(await kb.proc.stop()).toBe(0);
  });

  it('operator endpoints are disabled: the uniform 404', async () => {
    const r = await raw(`${kb.url}/v1/admin/kbs`, { headers: { authorization: `Bearer ${TOKEN}` } });
    expect(r).toMatchObject({ status: 404, text: '{"error":"not_found"}' });
    expect(await kb.proc.waitForLog('store opened')).toMatchObject({ adminApi: false });
  });

  it('a batch replayed under its key returns the stored batch (200) and stores nothing more', async () => {
    const res = await kb.client.resolve({ tenant: 'acme', actor: 'alice', ref: 'research' });
    const bk = key();
    const args = {
      tenant: 'acme',
      actor: 'alice',
      key: bk,
      deadlineAt: soon(),
      ifMatch: { [res.kbId]: res.authVersion },
      items: [note('research'), note('research')],
    };
    const first = await kb.client.writeBatch(args);
    const again = await kb.client.writeBatch({ ...args, deadlineAt: Date.now() - 1 }); // dedup comes before the deadline
    expect(first.created).toBe(true);
    expect(again).toEqual({ ...first, created: false });
    expect(rows(kb.db, 'downstream_key LIKE ?', `${bk}#%`)).toBe(2);
    expect(await kb.client.probe({ tenant: 'acme', key: bk })).toMatchObject({
      found: true,
      count: 1,
      items: first.items.map(({ id }) => ({ id })),
    });
    // A single write replayed returns the stored note even with a stale version (dedup before the checks).
    const k1 = key();
    const w = await kb.client.writeNote({
      tenant: 'acme',
      actor: 'alice',
      ifMatch: res.authVersion,
      key: k1,
      deadlineAt: soon(),
      note: note('research'),
    });
    expect(
      await kb.client.writeNote({
        tenant: 'acme',
        actor: 'alice',
        ifMatch: res.authVersion + 5,
        key: k1,
        deadlineAt: soon(),
        note: note('Research-Notes'),
      }),
    ).toEqual({ ...w, created: false, kbNow: expect.any(Number) });
  });
});

describe('kb-server migration and seeding', () => {
  it('migrates a file from before roles in place (idempotently): old knowledge bases stay writable by every actor of their tenant, old notes keep their keys', async () => {
    const db = freshDb();
    mkdirSync(dirname(db), { recursive: true });
    const old = new Database(db);
    old.pragma('journal_mode = WAL');
    old.exec(`
      CREATE TABLE knowledge_bases (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, name TEXT NOT NULL, created_at INTEGER NOT NULL, UNIQUE (tenant, name));
      CREATE TABLE notes (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, kb_id TEXT NOT NULL REFERENCES knowledge_bases(id), downstream_key TEXT NOT NULL,
        title TEXT NOT NULL, body_digest TEXT NOT NULL, source_url TEXT NOT NULL, fetched_at TEXT NOT NULL, publish_at TEXT NULL,
        created_at INTEGER NOT NULL, deleted_at INTEGER NULL);
      CREATE INDEX notes_tenant_key ON notes (tenant, downstream_key);`);
    const kbId = `kb_${randomUUID()}`;
    old.prepare('INSERT INTO knowledge_bases VALUES (?, ?, ?, ?)').run(kbId, 'acme', 'research', 1);
    old
      .prepare(
        `INSERT INTO notes VALUES ('note_old', 'acme', ?, 'old-key', 't', 'sha256:00', 'https://example.org', '2024-01-01T00:00:00.000Z', NULL, 2, NULL)`,
      )
      .run(kbId);
    old.close();

    for (let round = 0; round < 2; round++) {
      const kb = await startKb({ KB_DB: db, KB_SEED: 'acme:research,globex:research' });
      try {
        expect(await kb.proc.waitForLog('store opened')).toMatchObject({
          knowledgeBases: 2,
          created: round === 0 ? 1 : 0,
        });
        expect(await kb.client.resolve({ tenant: 'acme', actor: 'anyone', ref: 'Research' })).toEqual({
          kbId,
          name: 'research',
          state: 'active',
          authVersion: 1,
          role: 'writer',
        });
        // An old note has no input digest: the probe answers none, and recovery commits it as before.
        const old = await kb.client.probe({ tenant: 'acme', key: 'old-key' });
        expect(old).toMatchObject({ found: true, id: 'note_old', kb: 'research', count: 1 });
        expect(old).not.toHaveProperty('inputDigest');
        const w = await kb.client.writeNote({
          tenant: 'acme',
          actor: 'anyone',
          ifMatch: 1,
          key: key(),
          deadlineAt: soon(),
          note: note(kbId),
        });
        expect(w).toMatchObject({ created: true, kbId });
      } finally {
        await kb.client.close();
        expect(await kb.proc.stop()).toBe(0);
      }
    }
    const conn = new Database(db, { readonly: true });
    try {
      expect(conn.pragma('user_version', { simple: true })).toBe(4);
      const cols = (conn.prepare('PRAGMA table_info(knowledge_bases)').all() as { name: string }[]).map((c) => c.name);
      expect(cols).toEqual(['id', 'tenant', 'name', 'created_at', 'state', 'auth_version', 'default_role']);
      expect((conn.prepare('PRAGMA table_info(notes)').all() as { name: string }[]).map((c) => c.name).at(-1)).toBe(
        'input_digest',
      );
      expect(conn.prepare(`SELECT input_digest AS d FROM notes WHERE id = 'note_old'`).get()).toEqual({ d: null });
      expect(conn.prepare('SELECT COUNT(*) AS c FROM notes').get()).toEqual({ c: 3 });
    } finally {
      conn.close();
    }
  });

  it('refuses a bad seed file, a taken alias and a short operator token with exit 2, listing the problems', async () => {
    const bad = spawnKb({
      KB_DB: freshDb(),
      KB_SEED_FILE: writeSeed({
        tenants: [{ id: 'ACME', quota: -1 }],
        knowledgeBases: [{ tenant: 'acme', name: 'x', members: [{ actor: 'a', role: 'owner' }] }],
        extra: 1,
      }),
    });
    expect(await bad.exited).toBe(2);
    for (const s of ['tenants.0.id', 'tenants.0.quota', 'knowledgeBases.0.members.0.role', 'extra'])
      expect(bad.stderr).toContain(s);
    expect(bad.stderr).not.toMatch(/\n\s+at /);

    const taken = spawnKb({
      KB_DB: freshDb(),
      KB_SEED_FILE: writeSeed({
        knowledgeBases: [
          { tenant: 'acme', name: 'a', aliases: ['Notes'] },
          { tenant: 'acme', name: 'b', aliases: ['NOTES'] },
        ],
      }),
    });
    expect(await taken.exited).toBe(2);
    expect(taken.stderr).toContain('alias "NOTES" is taken');

    const notJson = spawnKb({ KB_DB: freshDb(), KB_SEED_FILE: join(tmp, 'missing.json') });
    expect(await notJson.exited).toBe(2);
    expect(notJson.stderr).toContain('KB_SEED_FILE');

    const shortToken = join(tmp, 'short.token');
    writeFileSync(shortToken, 'abc');
    const weak = spawnKb({ KB_DB: freshDb(), KB_ADMIN_TOKEN_FILE: shortToken });
    expect(await weak.exited).toBe(2);
    expect(weak.stderr).toContain('KB_ADMIN_TOKEN_FILE');
    expect(weak.stderr).not.toContain('abc');

    const pairs = spawnKb({ KB_DB: freshDb(), KB_SEED: 'acme:kb:alice+', LOG_LEVEL: 'info' });
    expect(await pairs.exited).toBe(2);
    expect(pairs.stderr).toContain('KB_SEED');
  });
});
