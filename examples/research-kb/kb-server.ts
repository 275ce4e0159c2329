/**
 * The research-KB sample's storage service: a separate process, the system of record that tooltx's
 * executor writes notes to (DESIGN.md "Sample domain, real parts"). HTTP + JSON over a SQLite store
 * (./kb-store.ts); `tsx examples/research-kb/kb-server.ts --help` lists its settings.
 *
 * Endpoints (times in ms since the epoch):
 * - `POST /v1/notes` — headers `x-tenant`, `idempotency-key` (the downstream key, ≤ 100 printable
 *   ASCII characters), `x-deadline` (absolute deadline); body `{ kb, title, body, sourceUrl,
 *   fetchedAt, publishAt? }` (strict). 201 `{ id, kb, createdAt }` for a new note; 200 with the
 *   same shape for an existing note of the same key when `KB_DEDUP=on`; 404 when the tenant has no
 *   knowledge base of that name; 409 `deadline_passed` when the deadline had passed at the insert
 *   (nothing stored).
 * - `GET /v1/notes/by-key/:key` (`x-tenant`) — read-only probe: 200 `{ found: true, id, kb,
 *   createdAt, count }` or 404 `{ error: "not_found", found: false }`.
 * - `DELETE /v1/notes/:id` (`x-tenant`, `idempotency-key`) — soft delete, idempotent: 200
 *   `{ id, deleted: true }`; 404 when the note is not that tenant's.
 * - `GET /v1/stats[?tenant=]` — operator counts `{ rows, distinctKeys, duplicateRows }` over
 *   non-deleted notes.
 * - `GET /healthz` — `{ ok: true }`.
 *
 * Every error body is `{ error }` with one of `invalid_input` (400, plus `issues: [{ path, code,
 * message }]`; header problems have paths `["headers", name]`, body problems the field's path),
 * `not_found` (404: missing and foreign resources answer identically), `deadline_passed` (409),
 * `internal` (500). Errors never carry a stack, SQL text or the request body; logs never carry
 * bodies or headers.
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { resolve } from 'node:path';
import { Command } from 'commander';
import { z } from 'zod';
import { baseConfigSchema, ConfigError, createLogger, loadConfig, onShutdown } from '@tooltx/runtime';
import { KbStore, type NoteInput } from './kb-store.js';

const NAME = /^[a-z0-9_-]{1,64}$/;
const NAME_RULE = 'must match ^[a-z0-9_-]{1,64}$';
/** Largest request body read, in bytes. */
const MAX_BODY_BYTES = 1024 * 1024;

/**
 * `KB_SEED`: comma-separated `tenant:kb` pairs, each name `^[a-z0-9_-]{1,64}$`; empty items are
 * ignored.
 */
const seedSchema = z
  .string()
  .default('')
  .transform((s, ctx) => {
    const out: { tenant: string; kb: string }[] = [];
    for (const item of s.split(',').map((x) => x.trim()).filter(Boolean)) {
      const [tenant, kb, ...rest] = item.split(':');
      if (rest.length || !tenant || !kb || !NAME.test(tenant) || !NAME.test(kb)) {
        ctx.addIssue({ code: 'custom', message: `"${item}" is not tenant:kb (each ${NAME_RULE})` });
        continue;
      }
      out.push({ tenant, kb });
    }
    return out;
  });

/** The KB server's environment (see `--help`). */
const kbConfigSchema = z.object({
  KB_PORT: z.coerce.number().int().min(0).max(65_535).default(4280),
  KB_HOST: z.string().min(1).default('127.0.0.1'),
  KB_DB: z.string().min(1).default('.state/kb.sqlite'),
  KB_DEDUP: z.enum(['on', 'off']).default('on'),
  KB_SEED: seedSchema,
  LOG_LEVEL: baseConfigSchema.shape.LOG_LEVEL,
});

const ENV_HELP = `
Environment:
  KB_PORT    TCP port (default 4280; 0 = any free port, logged in the "listening" line)
  KB_HOST    address to bind (default 127.0.0.1)
  KB_DB      SQLite file, directories created (default .state/kb.sqlite)
  KB_DEDUP   on|off (default on): on = a repeated idempotency-key returns the existing note;
             off = every write that reaches the insert stores a row (shows double executions)
  KB_SEED    knowledge bases to create if absent: tenant:kb[,tenant:kb...]
             e.g. acme:research,acme:archive,globex:research
  LOG_LEVEL  fatal|error|warn|info|debug|trace|silent (default info)

Exits 2 on a bad configuration (every problem listed on stderr); SIGTERM/SIGINT drain and exit 0.`;

new Command('kb-server')
  .description('the research-KB sample storage service (HTTP + JSON over SQLite)')
  .addHelpText('after', ENV_HELP)
  .parse(process.argv);

let config: z.infer<typeof kbConfigSchema>;
try {
  config = loadConfig(kbConfigSchema);
} catch (err) {
  if (err instanceof ConfigError) {
    process.stderr.write(`kb-server: ${err.message}\n`);
    process.exit(2);
  }
  throw err;
}

const log = createLogger({ service: 'kb-server', instance: `kb-${process.pid}`, level: config.LOG_LEVEL });
const dbPath = config.KB_DB === ':memory:' ? ':memory:' : resolve(config.KB_DB);
const store = new KbStore({ path: dbPath, dedup: config.KB_DEDUP === 'on' });
let seeded = 0;
for (const { tenant, kb } of config.KB_SEED) if (store.ensureKnowledgeBase(tenant, kb).created) seeded++;
log.info({ db: dbPath, dedup: store.dedup, ...store.pragmas(), knowledgeBases: config.KB_SEED.length, created: seeded }, 'store opened');

// ---------------------------------------------------------------------------------------------
// Request parsing

type Issue = { path: (string | number)[]; code: string; message: string };

/** An answer to send: status and JSON body. */
class Reply {
  constructor(readonly status: number, readonly body: Record<string, unknown>) {}
}

const notFound = () => new Reply(404, { error: 'not_found' });
const invalid = (issues: Issue[]) => new Reply(400, { error: 'invalid_input', issues });

function issuesOf(err: z.ZodError, prefix: (string | number)[] = []): Issue[] {
  return err.issues.map((i) => ({
    path: [...prefix, ...i.path.map((p) => (typeof p === 'number' ? p : String(p)))],
    code: i.code,
    message: i.message,
  }));
}

const tenantHeader = z.string().regex(NAME, NAME_RULE);
const keyHeader = z.string().min(1).max(100).regex(/^[\x21-\x7e]+$/, 'printable ASCII without spaces');
const deadlineHeader = z
  .string()
  .regex(/^\d{1,15}$/, 'an absolute deadline in ms since the epoch')
  .transform(Number);

const noteBody = z.strictObject({
  kb: z.string().regex(NAME, NAME_RULE),
  title: z.string().min(1).max(300),
  body: z.string().min(1).max(100_000),
  sourceUrl: z.url({ protocol: /^https?$/ }).max(2_000),
  fetchedAt: z.iso.datetime({ offset: true }),
  publishAt: z.iso.datetime({ offset: true }).optional(),
});

/** Parses the named headers with `shape`; issues under `["headers", name]`. */
function parseHeaders<S extends z.ZodRawShape>(req: IncomingMessage, shape: S): { data?: z.infer<z.ZodObject<S>>; issues: Issue[] } {
  const raw: Record<string, unknown> = {};
  for (const name of Object.keys(shape)) raw[name] = req.headers[name];
  const r = z.object(shape).safeParse(raw);
  return r.success ? { data: r.data, issues: [] } : { issues: issuesOf(r.error, ['headers']) };
}

class BodyTooLarge extends Error {}

/** The raw request body; rejects with {@link BodyTooLarge} past {@link MAX_BODY_BYTES}. */
function readBody(req: IncomingMessage): Promise<Buffer> {
  return new Promise((resolvePromise, reject) => {
    if (Number(req.headers['content-length'] ?? 0) > MAX_BODY_BYTES) return reject(new BodyTooLarge());
    const chunks: Buffer[] = [];
    let size = 0;
    const onData = (chunk: Buffer) => {
      size += chunk.length;
      if (size > MAX_BODY_BYTES) {
        req.off('data', onData);
        req.pause();
        reject(new BodyTooLarge());
      } else chunks.push(chunk);
    };
    req.on('data', onData);
    req.once('end', () => resolvePromise(Buffer.concat(chunks)));
    req.once('error', reject);
    req.once('close', () => {
      if (!req.complete) reject(new Error('request aborted'));
    });
  });
}

/** The request body as JSON; `undefined` plus an issue when it is not JSON. */
async function readJson(req: IncomingMessage): Promise<{ value?: unknown; issues: Issue[] }> {
  const raw = await readBody(req);
  try {
    return { value: JSON.parse(raw.toString('utf8')) as unknown, issues: [] };
  } catch {
    return { issues: [{ path: [], code: 'invalid_json', message: 'the request body is not JSON' }] };
  }
}

// ---------------------------------------------------------------------------------------------
// Handlers

async function postNote(req: IncomingMessage): Promise<Reply> {
  const h = parseHeaders(req, { 'x-tenant': tenantHeader, 'idempotency-key': keyHeader, 'x-deadline': deadlineHeader });
  const body = await readJson(req);
  const issues = [...h.issues, ...body.issues];
  let note: NoteInput | undefined;
  if (body.issues.length === 0) {
    const r = noteBody.safeParse(body.value);
    if (r.success) note = r.data;
    else issues.push(...issuesOf(r.error));
  }
  if (issues.length || !h.data || !note) return invalid(issues);
  const out = store.writeNote(h.data['x-tenant'], h.data['idempotency-key'], h.data['x-deadline'], note);
  switch (out.kind) {
    case 'created':
      return new Reply(201, { ...out.note });
    case 'existing':
      return new Reply(200, { ...out.note });
    case 'not_found':
      return notFound();
    case 'deadline_passed':
      return new Reply(409, { error: 'deadline_passed' });
  }
}

function probe(req: IncomingMessage, rawKey: string): Reply {
  const h = parseHeaders(req, { 'x-tenant': tenantHeader });
  let key: string | undefined;
  const issues = [...h.issues];
  try {
    const k = keyHeader.safeParse(decodeURIComponent(rawKey));
    if (k.success) key = k.data;
    else issues.push(...issuesOf(k.error, ['key']));
  } catch {
    issues.push({ path: ['key'], code: 'invalid_format', message: 'not a percent-encoded key' });
  }
  if (issues.length || !h.data || key === undefined) return invalid(issues);
  const r = store.probe(h.data['x-tenant'], key);
  return r.found ? new Reply(200, { ...r }) : new Reply(404, { error: 'not_found', found: false });
}

function deleteNote(req: IncomingMessage, rawId: string): Reply {
  const h = parseHeaders(req, { 'x-tenant': tenantHeader, 'idempotency-key': keyHeader });
  if (h.issues.length || !h.data) return invalid(h.issues);
  let id: string;
  try {
    id = decodeURIComponent(rawId);
  } catch {
    return notFound();
  }
  const r = store.deleteNote(h.data['x-tenant'], id);
  return r ? new Reply(200, { ...r }) : notFound();
}

function stats(url: URL): Reply {
  const tenant = url.searchParams.get('tenant');
  if (tenant === null) return new Reply(200, { ...store.stats() });
  const t = tenantHeader.safeParse(tenant);
  if (!t.success) return invalid(issuesOf(t.error, ['query', 'tenant']));
  return new Reply(200, { ...store.stats(t.data) });
}

/** Routes one request; `route` names the matched template for the access log. */
async function route(req: IncomingMessage, url: URL): Promise<{ route: string; reply: Reply }> {
  const m = req.method ?? 'GET';
  const p = url.pathname;
  if (p === '/healthz' && m === 'GET') return { route: 'GET /healthz', reply: new Reply(200, { ok: true }) };
  if (p === '/v1/notes' && m === 'POST') return { route: 'POST /v1/notes', reply: await postNote(req) };
  if (p === '/v1/stats' && m === 'GET') return { route: 'GET /v1/stats', reply: stats(url) };
  let hit = /^\/v1\/notes\/by-key\/([^/]+)$/.exec(p);
  if (hit && m === 'GET') return { route: 'GET /v1/notes/by-key/:key', reply: probe(req, hit[1]!) };
  hit = /^\/v1\/notes\/([^/]+)$/.exec(p);
  if (hit && m === 'DELETE') return { route: 'DELETE /v1/notes/:id', reply: deleteNote(req, hit[1]!) };
  return { route: 'unknown', reply: notFound() };
}

// ---------------------------------------------------------------------------------------------
// Server

let stopping = false;

function send(res: ServerResponse, reply: Reply, close = false): void {
  const text = JSON.stringify(reply.body);
  res.writeHead(reply.status, {
    'content-type': 'application/json; charset=utf-8',
    'content-length': Buffer.byteLength(text),
    'cache-control': 'no-store',
    ...(close || stopping ? { connection: 'close' } : {}),
  });
  res.end(text);
}

const server = createServer((req, res) => {
  const started = performance.now();
  const url = new URL(req.url ?? '/', 'http://kb.invalid');
  route(req, url).then(
    ({ route: r, reply }) => {
      send(res, reply);
      log.debug({ route: r, status: reply.status, ms: Math.round(performance.now() - started) }, 'request');
    },
    (err: unknown) => {
      if (err instanceof BodyTooLarge) {
        // Stop reading: answer and close the connection.
        send(res, invalid([{ path: [], code: 'too_big', message: `the request body exceeds ${MAX_BODY_BYTES} bytes` }]), true);
        log.debug({ route: req.method, status: 400, ms: Math.round(performance.now() - started) }, 'request');
        return;
      }
      if (res.headersSent || req.destroyed) {
        log.warn({ err }, 'request aborted');
        return;
      }
      log.error({ err, method: req.method }, 'request failed');
      send(res, new Reply(500, { error: 'internal' }));
    },
  );
});

server.on('error', (err) => {
  log.fatal({ err }, 'server error');
  store.close();
  process.exit(1);
});

await new Promise<void>((r) => server.listen(config.KB_PORT, config.KB_HOST, r));
const address = server.address() as AddressInfo;
log.info({ host: address.address, port: address.port, dedup: store.dedup }, 'listening');

onShutdown(log, async () => {
  stopping = true;
  // Stop accepting; in-flight requests finish (their connections close after the answer); idle
  // keep-alive connections are closed now and as they become idle.
  const idle = setInterval(() => server.closeIdleConnections(), 50);
  await new Promise<void>((r, j) => {
    server.close((err) => (err ? j(err) : r()));
    server.closeIdleConnections();
  }).finally(() => clearInterval(idle));
  store.close();
});
