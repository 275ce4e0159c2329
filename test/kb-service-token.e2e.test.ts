/**
 * The KB's service credential (examples/research-kb/kb-server.ts `KB_SERVICE_TOKEN_FILE`): the
 * identity headers and the role checks built on them mean something only when nobody but
 * tooltx's trusted side — the tools module in the authorizer, executor and reconciler — can call the
 * KB. With the token configured every endpoint but `/healthz` and the operator's answers a request
 * without it, or with another token (the operator's included), 401 `{ error: "unauthorized" }`,
 * writing, reading and revealing nothing; the operator endpoints take only the operator token.
 * Real KB processes on free loopback ports, a real SQLite file read back; no mocks.
 */
import { randomBytes } from 'node:crypto';
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { KbClient, type KbNote } from '../examples/research-kb/kb-client.js';
import { RESEARCH_TOOLS, sampleNote, soon, spawnKbProcess, startKb, type TestKb } from './helpers/kb.js';
import { startService, type ServiceProcess } from './helpers/services.js';

const tmp = mkdtempSync(join(tmpdir(), 'tooltx-kb-token-'));
const ADMIN_TOKEN = `admin-${randomBytes(20).toString('hex')}`;
const ADMIN_FILE = join(tmp, 'admin.token');
const DB = join(tmp, 'kb.sqlite');
const UNAUTHORIZED = { status: 401, text: '{"error":"unauthorized"}' };

let kb: TestKb;
beforeAll(async () => {
  writeFileSync(ADMIN_FILE, ADMIN_TOKEN, { mode: 0o600 });
  kb = await startKb(
    {
      tenants: [
        { id: 'acme', quota: 1_000 },
        { id: 'globex', quota: 1_000 },
      ],
      knowledgeBases: [
        { tenant: 'acme', name: 'research', members: [{ actor: 'alice', role: 'writer' }] },
        { tenant: 'globex', name: 'research', defaultRole: 'writer' },
      ],
    },
    { KB_ADMIN_TOKEN_FILE: ADMIN_FILE, KB_DB: DB, LOG_LEVEL: 'debug' },
  );
});
afterAll(async () => {
  expect(await kb?.stop()).toBe(0);
  rmSync(tmp, { recursive: true, force: true });
});

const note = (over: Partial<KbNote> = {}): KbNote => sampleNote('research', over);
let n = 0;
const key = () => `tx_token-${process.pid}-${++n}`;

/** A raw request with `auth` as the whole `authorization` header (none when undefined). */
async function raw(
  path: string,
  auth: string | undefined,
  init: { method?: string; headers?: Record<string, string>; body?: string } = {},
) {
  const res = await fetch(`${kb.url}${path}`, {
    ...init,
    headers: { ...init.headers, ...(auth === undefined ? {} : { authorization: auth }) },
  });
  return { status: res.status, text: await res.text(), authenticate: res.headers.get('www-authenticate') };
}

/** Every note row in the KB's SQLite file (deleted ones included). */
function allRows(): { downstream_key: string }[] {
  const db = new Database(DB, { readonly: true });
  try {
    return db.prepare('SELECT downstream_key FROM notes').all() as { downstream_key: string }[];
  } finally {
    db.close();
  }
}

/** The credentials that must not pass as the service token: none, a malformed header, a wrong token, the operator's. */
const NOT_THE_SERVICE_TOKEN: [string, string | undefined][] = [
  ['no authorization header', undefined],
  ['an empty bearer', 'Bearer '],
  ['another scheme', `Basic ${Buffer.from('acme:alice').toString('base64')}`],
  ['a wrong token', `Bearer ${randomBytes(32).toString('hex')}`],
  ['the operator token', `Bearer ${ADMIN_TOKEN}`],
];

describe('KB_SERVICE_TOKEN_FILE set: only the trusted side may call the KB', () => {
  it('a write, a batch and a delete without the service token (or with another) answer 401 and write nothing', async () => {
    // One note written with the token: the delete below targets it.
    const mine = await kb.client.resolve({ tenant: 'acme', actor: 'alice', ref: 'research' });
    const written = await kb.client.writeNote({
      tenant: 'acme',
      actor: 'alice',
      ifMatch: mine.authVersion,
      key: key(),
      deadlineAt: soon(),
      note: note(),
    });
    const before = allRows();
    const refusedKeys: string[] = [];
    for (const [what, auth] of NOT_THE_SERVICE_TOKEN) {
      const k = key();
      refusedKeys.push(k);
      const who = {
        'content-type': 'application/json',
        'x-tenant': 'acme',
        'x-actor': 'alice',
        'x-deadline': String(soon()),
      };
      const write = await raw('/v1/notes', auth, {
        method: 'POST',
        headers: { ...who, 'idempotency-key': k, 'if-match': String(mine.authVersion) },
        body: JSON.stringify(note()),
      });
      expect(write, what).toEqual({ ...UNAUTHORIZED, authenticate: 'Bearer' });
      const batch = await raw('/v1/notes:batch', auth, {
        method: 'POST',
        headers: { ...who, 'idempotency-key': k, 'if-match': `${mine.kbId}=${mine.authVersion}` },
        body: JSON.stringify({ items: [note(), note()] }),
      });
      expect(batch, what).toEqual({ ...UNAUTHORIZED, authenticate: 'Bearer' });
      const del = await raw(`/v1/notes/${written.id}`, auth, {
        method: 'DELETE',
        headers: {
          'x-tenant': 'acme',
          'x-actor': 'alice',
          'idempotency-key': key(),
          'if-match': String(mine.authVersion),
        },
      });
      expect(del, what).toEqual({ ...UNAUTHORIZED, authenticate: 'Bearer' });
    }
    // Nothing was written or deleted: the same rows, the note still there, none of the refused keys.
    expect(allRows()).toEqual(before);
    expect(await kb.client.probe({ tenant: 'acme', key: refusedKeys[0]! })).toMatchObject({ found: false });
    expect(await kb.client.rowsPerKb({ kbId: mine.kbId })).toMatchObject([{ rows: 1 }]);

    // With the service token the same requests work.
    const k = key();
    const ok = await raw('/v1/notes', `Bearer ${kb.serviceToken.token}`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        'x-tenant': 'acme',
        'x-actor': 'alice',
        'x-deadline': String(soon()),
        'idempotency-key': k,
        'if-match': String(mine.authVersion),
      },
      body: JSON.stringify(note()),
    });
    expect(ok.status).toBe(201);
    expect(allRows().map((r) => r.downstream_key)).toEqual([...before.map((r) => r.downstream_key), k]);
    expect(
      await kb.client.deleteNote({
        tenant: 'acme',
        actor: 'alice',
        ifMatch: mine.authVersion,
        key: key(),
        id: written.id,
      }),
    ).toEqual({ id: written.id, deleted: true });
  });

  it('a probe, a resolve and stats without the service token answer 401 alike for what exists and what does not', async () => {
    const mine = await kb.client.resolve({ tenant: 'acme', actor: 'alice', ref: 'research' });
    const k = key();
    await kb.client.writeNote({
      tenant: 'acme',
      actor: 'alice',
      ifMatch: mine.authVersion,
      key: k,
      deadlineAt: soon(),
      note: note(),
    });
    for (const [what, auth] of NOT_THE_SERVICE_TOKEN) {
      // The answer says nothing about the key, the knowledge base or the counts: byte-identical.
      for (const path of [
        `/v1/notes/by-key/${k}`,
        `/v1/notes/by-key/${key()}`,
        '/v1/resolve?ref=research',
        '/v1/resolve?ref=nothing-here',
        '/v1/stats',
        '/v1/stats?tenant=acme',
        `/v1/stats?kb=${mine.kbId}`,
        '/v1/nowhere',
      ]) {
        const headers = { 'x-tenant': 'acme', 'x-actor': 'alice' };
        expect(await raw(path, auth, { headers }), `${what}: ${path}`).toEqual({
          ...UNAUTHORIZED,
          authenticate: 'Bearer',
        });
      }
    }
    // The typed client without the token: KbError 401 `unauthorized` for each.
    const anonymous = new KbClient(kb.url);
    const wrong = new KbClient(kb.url, { serviceToken: randomBytes(32).toString('hex') });
    try {
      for (const c of [anonymous, wrong]) {
        await expect(c.probe({ tenant: 'acme', key: k })).rejects.toMatchObject({
          status: 401,
          errorClass: 'unauthorized',
        });
        await expect(c.resolve({ tenant: 'acme', actor: 'alice', ref: 'research' })).rejects.toMatchObject({
          status: 401,
          errorClass: 'unauthorized',
        });
        await expect(c.stats()).rejects.toMatchObject({ status: 401, errorClass: 'unauthorized' });
        await expect(c.rowsPerKb({ tenant: 'acme' })).rejects.toMatchObject({
          status: 401,
          errorClass: 'unauthorized',
        });
        await expect(
          c.writeNote({
            tenant: 'acme',
            actor: 'alice',
            ifMatch: mine.authVersion,
            key: key(),
            deadlineAt: soon(),
            note: note(),
          }),
        ).rejects.toMatchObject({ status: 401, errorClass: 'unauthorized' });
        expect(await c.healthy()).toBe(true); // the health check needs no token
      }
    } finally {
      await anonymous.close();
      await wrong.close();
    }
    // With it: the probe finds the note, the resolver answers, stats count it.
    expect(await kb.client.probe({ tenant: 'acme', key: k })).toMatchObject({ found: true, count: 1 });
    expect(await kb.client.resolve({ tenant: 'acme', actor: 'alice', ref: 'research' })).toMatchObject({
      kbId: mine.kbId,
      role: 'writer',
    });
    expect((await kb.client.stats('acme')).rows).toBeGreaterThanOrEqual(1);
  });

  it('the operator endpoints take the operator token only, never the service token', async () => {
    for (const auth of [`Bearer ${kb.serviceToken.token}`, undefined]) {
      expect(await raw('/v1/admin/kbs', auth)).toEqual({ ...UNAUTHORIZED, authenticate: 'Bearer' });
      const change = await raw('/v1/admin/kbs/kb_00000000-0000-0000-0000-000000000000/state', auth, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ state: 'frozen' }),
      });
      expect(change).toEqual({ ...UNAUTHORIZED, authenticate: 'Bearer' });
    }
    // A client holding only the service token cannot act as the operator through `admin()` either.
    await expect(kb.client.admin(kb.serviceToken.token).list()).rejects.toMatchObject({
      status: 401,
      errorClass: 'unauthorized',
    });
    const views = await kb.client.admin(ADMIN_TOKEN).list('acme');
    expect(views.map((v) => v.name)).toEqual(['research']);
  });

  it('says it requires the token at start, and no log line carries a token', async () => {
    expect(kb.proc.lines.find((l) => l.msg === 'store opened')).toMatchObject({ serviceAuth: true, adminApi: true });
    expect(kb.proc.lines.filter((l) => String(l.msg).startsWith('no service token'))).toEqual([]);
    // The refused requests were logged (debug) by route, never with their credentials.
    expect(kb.proc.lines.some((l) => l.route === 'service unauthorized' && l.status === 401)).toBe(true);
    const logged = JSON.stringify(kb.proc.lines) + kb.proc.stderr;
    expect(logged).not.toContain(kb.serviceToken.token);
    expect(logged).not.toContain(ADMIN_TOKEN);
  });
});

describe('KB_SERVICE_TOKEN_FILE at start', () => {
  const dir = mkdtempSync(join(tmpdir(), 'tooltx-kb-token-start-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  let closedPort: number;
  beforeAll(async () => {
    const s = createServer();
    await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
    closedPort = (s.address() as { port: number }).port;
    await new Promise((r) => s.close(r));
  });

  /** Exit 2 with one `failed to start` line naming KB_SERVICE_TOKEN_FILE and the file; never the token. */
  async function refused(p: ServiceProcess, file: string, says: string, token: string) {
    expect(await p.exited, p.stderr).toBe(2);
    const lines = p.lines.filter((l) => l.msg === 'failed to start');
    expect(lines).toEqual([expect.objectContaining({ setting: 'KB_SERVICE_TOKEN_FILE', value: file })]);
    expect(String(lines[0]!.problem)).toContain(says);
    expect(p.stderr).toContain(`cannot start: KB_SERVICE_TOKEN_FILE=${file}: `);
    expect(JSON.stringify(p.lines) + p.stderr).not.toContain(token);
  }

  const badFiles = () => {
    const open = join(dir, 'open.token');
    const openToken = randomBytes(32).toString('hex');
    writeFileSync(open, openToken, { mode: 0o644 });
    chmodSync(open, 0o644);
    const short = join(dir, 'short.token');
    writeFileSync(short, 'short-token-16chars', { mode: 0o600 });
    return [
      { file: open, token: openToken, says: 'lets others read the key; chmod 600 it' },
      { file: short, token: 'short-token-16chars', says: 'at least 32 characters' },
      { file: join(dir, 'missing.token'), token: 'none', says: 'cannot read the key file (ENOENT)' },
    ];
  };

  it('the KB refuses a token file others can read, a short token, a missing file, and the operator token as the service token', async () => {
    for (const c of badFiles()) {
      await refused(
        spawnKbProcess({ KB_DB: join(dir, 'kb.sqlite'), KB_SERVICE_TOKEN_FILE: c.file }),
        c.file,
        c.says,
        c.token,
      );
    }
    // One token for both doors would let the trusted side act as the operator and vice versa.
    const same = join(dir, 'same.token');
    const token = randomBytes(32).toString('hex');
    writeFileSync(same, token, { mode: 0o600 });
    await refused(
      spawnKbProcess({ KB_DB: join(dir, 'kb.sqlite'), KB_ADMIN_TOKEN_FILE: same, KB_SERVICE_TOKEN_FILE: same }),
      same,
      'the service token must be another one',
      token,
    );
  });

  it("the research tools module refuses the same files at the service's start, naming the setting", async () => {
    for (const c of badFiles()) {
      const p = await startService(
        'authorizer',
        {
          NATS_URL: `nats://127.0.0.1:${closedPort}`,
          TOOLTX_TOOLS_MODULE: RESEARCH_TOOLS,
          KB_SERVICE_TOKEN_FILE: c.file,
        },
        { wait: false },
      );
      await refused(p, c.file, c.says, c.token);
    }
  });

  it('unset, the KB warns once that it trusts any caller, and serves requests without a token', async () => {
    const p = spawnKbProcess({ KB_DB: join(dir, 'open-kb.sqlite'), KB_SEED: 'acme:research', LOG_LEVEL: 'info' });
    try {
      const line = await p.waitForLog('listening');
      const warnings = p.lines.filter((l) => l.level === 40);
      expect(warnings).toEqual([
        expect.objectContaining({
          setting: 'KB_SERVICE_TOKEN_FILE',
          msg: 'no service token: any caller that reaches this port is trusted with any tenant and actor (development only)',
        }),
      ]);
      expect(p.lines.find((l) => l.msg === 'store opened')).toMatchObject({ serviceAuth: false });
      const c = new KbClient(`http://127.0.0.1:${Number(line.port)}`);
      try {
        expect(await c.resolve({ tenant: 'acme', actor: 'anyone', ref: 'research' })).toMatchObject({
          name: 'research',
          role: 'writer',
        });
      } finally {
        await c.close();
      }
    } finally {
      expect(await p.stop()).toBe(0);
    }
  });
});
