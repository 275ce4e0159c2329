/**
 * The research-KB sample's storage service: a separate process, the system of record that tooltx's
 * executor writes notes to, and the sample domain's system of record for AUTHORISATION (FM-07,
 * FM-08, FM-10). HTTP + JSON over a SQLite store (./kb-store.ts), seeded by
 * ./kb-seed.ts; `tsx examples/research-kb/kb-server.ts --help` lists its settings.
 *
 * Identity headers (set by the trusted executor from the authenticated context, never by a model):
 * `x-tenant` and `x-actor`, each `^[a-z0-9_-]{1,64}$`. Times are ms since the epoch.
 *
 * Who may send them: with `KB_SERVICE_TOKEN_FILE` set, every endpoint below except `GET /healthz`
 * and the operator endpoints (which take the operator token) requires `authorization: Bearer
 * <service token>` — the credential of tooltx's trusted side (the tools module in the authorizer,
 * executor and reconciler; ./tools.ts) — compared in constant time; without it, or with another
 * token (the operator's included), 401 `{ error: "unauthorized" }` and nothing is read, written or
 * revealed. The headers and the role check built on them mean something only then: unset, the KB
 * trusts any caller that reaches its port (it says so once at start; development only).
 *
 * - `GET /v1/resolve?ref=<reference>` (`x-tenant`, `x-actor`) — THE resolver: the reference (name,
 *   alias or `kb_<uuid>` id; percent-decoded once, NFC, trimmed, lower-cased) → 200 `{ kbId, name,
 *   state, authVersion, role }` (`role` of that actor: `reader | writer | admin | null`) with
 *   `etag: "<authVersion>"`; 404 `{ error: "not_found" }` — byte-identical — for a missing, another
 *   tenant's and a soft-deleted knowledge base.
 * - `POST /v1/notes` — headers `x-tenant`, `x-actor`, `idempotency-key` (the downstream key, ≤ 100
 *   printable ASCII characters), `x-deadline` (absolute deadline), `if-match` (the `authVersion`
 *   the caller checked: `7` or `"7"`), optionally `x-tooltx-input-digest` (`sha256:` + 64 lower-case
 *   hex: the caller's digest of what it asked — tooltx sends the operation's input digest — stored
 *   with the note and answered by the probe); body `{ kb, title, body, sourceUrl, fetchedAt, publishAt? }`
 *   (strict; `kb` any reference). In ONE transaction, in this order: resolve → 404 `not_found`;
 *   with `KB_DEDUP=on` an existing note of the key → 200 with it (422 `key_reused` when it was written
 *   with another `x-tooltx-input-digest`); frozen → 409 `frozen`; version ≠
 *   if-match → 412 `version_conflict`; the actor's current role not writer/admin → 403 `forbidden`;
 *   the tenant's quota used up → 429 `{ error: "quota_exceeded", retryAfterMs }` + `retry-after`
 *   (seconds, to the next UTC midnight); deadline passed → 409 `deadline_passed`; else 201 `{ id,
 *   kb, kbId, createdAt }` (`kb` = the knowledge base's name). Nothing is stored unless 201.
 * - `POST /v1/notes:batch` — the same headers, except `if-match` is a comma-separated list of
 *   `<kbId>=<authVersion>` pairs, one per knowledge base the batch writes to (e.g.
 *   `kb_1…=3, kb_2…=7`; extra pairs are ignored, a missing one is a `version_conflict`), and the
 *   optional `x-tooltx-input-digest` stored with every item; body
 *   `{ items: [note, …] }` (1..50). Item `i` is stored under key `<idempotency-key>#<i>` (so the key
 *   is ≤ 96 characters). Every item is resolved and authorised; the first refused item refuses the
 *   whole batch — nothing is written — with the single-write status and `issues: [{ path: ["items",
 *   i], code: <class>, message }]`; quota needs room for every item. 201 `{ items: [{ id, kb, kbId,
 *   createdAt }] }`, or 200 with the stored batch when `KB_DEDUP=on` and the key was used.
 * - `GET /v1/notes/by-key/:key` (`x-tenant`) — read-only probe: 200 `{ found: true, id, kb,
 *   createdAt, count, inputDigest?, now }` (`inputDigest` only when the note was written with one; for
 *   a batch key also `items: [{ id, kb, createdAt }]` in index order; `id` etc. are item 0's) or
 *   404 `{ error: "not_found", found: false, now }`. Deleted notes are found too (`deleted: true`;
 *   `count` counts every row ever written under the key). `now` is the KB's clock at the lookup (ms since
 *   the epoch; it never goes back): a write whose `x-deadline` is before it can no longer be stored.
 * - Every answer carries `x-kb-now`, the KB's clock when it answered (ms since the epoch).
 * - `DELETE /v1/notes/:id` (`x-tenant`, `x-actor`, `idempotency-key`, `if-match`) — soft delete of
 *   a note of a knowledge base the tenant owns, idempotent (an already deleted note answers 200
 *   `{ id, deleted: true }` again); 404 / 409 `frozen` / 412 / 403 as for a write.
 * - `GET /v1/stats[?tenant=][&kb=<kbId>]` — read-only counts `{ rows, distinctKeys, duplicateRows,
 *   knowledgeBases: [{ kbId, owner, name, state, rows }] }` over non-deleted notes (written by that
 *   tenant / in that knowledge base); with `tenant`, `knowledgeBases` lists those it owns or wrote
 *   into, so rows in a knowledge base whose `owner` is not that tenant are visible.
 * - Operator endpoints, only when `KB_ADMIN_TOKEN_FILE` is set (else 404), with `authorization:
 *   Bearer <token>` (else 401 `unauthorized`); every change bumps `authVersion` exactly when it
 *   changes something and answers 200 with the knowledge base's view `{ kbId, tenant, name, state,
 *   authVersion, quotaUsed, quotaLimit, aliases, defaultRole, members, changed }` (404 unknown id):
 *   - `GET /v1/admin/kbs[?tenant=]` → `{ knowledgeBases: [view…] }` (deleted ones included);
 *     `GET /v1/admin/kbs/:kbId` → view;
 *   - `POST /v1/admin/kbs/:kbId/members` `{ tenant, actor, role: "reader"|"writer"|"admin"|null }`
 *     (null = revoke; `tenant` must be the owner → else 409 `conflict`);
 *   - `POST /v1/admin/kbs/:kbId/default-role` `{ role | null }` (every actor of the owner tenant);
 *   - `POST /v1/admin/kbs/:kbId/state` `{ state: "active"|"frozen"|"deleted" }`;
 *   - `POST /v1/admin/kbs/:kbId/owner` `{ tenant }` — transfer (409 `conflict` when the new owner
 *     has the name or an alias already); other tenants' members go, the default role resets to null;
 *   - `POST /v1/admin/kbs/:kbId/aliases` `{ alias, remove?: true }` (409 `conflict` when taken).
 * - `GET /healthz` — `{ ok: true }`.
 *
 * Every error body is `{ error }` with one of `invalid_input` (400, plus `issues: [{ path, code,
 * message }]`; header problems have paths `["headers", name]`, query problems `["query", name]`,
 * body problems the field's path), `unauthorized` (401), `forbidden` (403), `not_found` (404:
 * missing, foreign and deleted resources answer identically), `frozen`, `deadline_passed`,
 * `conflict` (409), `version_conflict` (412), `quota_exceeded` (429), `internal` (500). A caller of
 * another tenant always gets 404, never 403. Errors never carry a stack, SQL text or the request
 * body; logs never carry bodies, headers or a token.
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { resolve } from 'node:path';
import { Command } from 'commander';
import { z } from 'zod';
import { boundIssues } from '@tooltx/contracts';
import {
  announceReady,
  baseConfigSchema,
  ConfigError,
  createLogger,
  describeError,
  envInt,
  exitWithParent,
  failStartup,
  installProcessHandlers,
  loadConfig,
  onShutdown,
  readKeyFile,
  SecretFileError,
  serviceConfigSchema,
  StartupError,
  type Logger,
  type StartupReporter,
  usageErrorsExitTwo,
} from '@tooltx/runtime';
import { applySeed, loadSeedFile, SeedError, seedPairsSchema, type KbSeed } from './kb-seed.js';
import { KB_ID, KB_NAME, KB_ROLES, KB_STATES, KbStore, type AdminOutcome, type NoteInput } from './kb-store.js';

const NAME_RULE = 'must match ^[a-z0-9_-]{1,64}$';
/** Largest request body read, in bytes. */
const MAX_BODY_BYTES = 1024 * 1024;
/** Most notes in one batch. */
const MAX_BATCH = 50;
/** Longest reference accepted (before canonicalisation). */
const MAX_REF = 512;

/** The KB server's environment (see `--help`). */
const kbConfigSchema = z.object({
  KB_PORT: envInt(0, 65_535).default(4280),
  KB_HOST: z.string().min(1).default('127.0.0.1'),
  KB_DB: z.string().min(1).default('.state/kb.sqlite'),
  KB_DEDUP: z.enum(['on', 'off']).default('on'),
  KB_SEED: seedPairsSchema,
  KB_SEED_FILE: z.string().min(1).optional(),
  KB_ADMIN_TOKEN_FILE: z.string().min(1).optional(),
  KB_SERVICE_TOKEN_FILE: z.string().min(1).optional(),
  LOG_LEVEL: baseConfigSchema.shape.LOG_LEVEL,
  TOOLTX_LOG_HMAC_KEY_FILE: baseConfigSchema.shape.TOOLTX_LOG_HMAC_KEY_FILE,
  TOOLTX_EXIT_WITH_PARENT: serviceConfigSchema.shape.TOOLTX_EXIT_WITH_PARENT,
});

const ENV_HELP = `
Environment:
  KB_PORT    TCP port (default 4280; 0 = any free port, logged in the "listening" line)
  KB_HOST    address to bind (default 127.0.0.1)
  KB_DB      SQLite file, directories created and migrated (default .state/kb.sqlite)
  KB_DEDUP   on|off (default on): on = a repeated idempotency-key returns the existing note;
             off = every write that reaches the insert stores a row (shows double executions)
  KB_SEED    knowledge bases to create if absent: tenant:kb[:actor1+actor2][,...]
             without actors every actor of the tenant is a writer; with actors only they are
             e.g. acme:research,acme:archive:alice+researcher,globex:research
  KB_SEED_FILE
             JSON seed applied on every start (tenants' quotas; knowledge bases with aliases,
             members, defaultRole and state created if absent):
             {"tenants":[{"id":"acme","quota":10000}],"knowledgeBases":[{"tenant":"acme",
              "name":"research","aliases":["Research-Notes"],"members":[{"actor":"alice",
              "role":"writer"}],"state":"active"}]}
             quotas are notes per UTC day, counted per tenant; absent = unlimited
  KB_ADMIN_TOKEN_FILE
             file holding the operator token (>= 16 characters) for /v1/admin/* with
             "authorization: Bearer <token>"; unset = operator endpoints disabled (404)
  KB_SERVICE_TOKEN_FILE
             file (mode 0600) holding the service token (>= 32 characters, not the operator's)
             that every endpoint but /healthz and /v1/admin/* requires as
             "authorization: Bearer <token>" (else 401); give the same file to the services
             that load the tools module; unset = any caller is trusted (development only)
  LOG_LEVEL  fatal|error|warn|info|debug|trace|silent (default info)
  TOOLTX_LOG_HMAC_KEY_FILE
             key file (mode 0600) for the HMAC of error messages in logs (optional; logs never
             carry bodies, headers, the tokens or an error's message)
  TOOLTX_EXIT_WITH_PARENT
             pid of the supervisor that started this process (set by \`npm start\`): the KB
             stops when that process is gone (optional)

Exits 2 when it cannot start: a bad configuration or seed (every problem listed), a database file
it cannot open (KB_DB) or a port it cannot listen on (KB_PORT, KB_HOST) — named on stderr and in a
"failed to start" log line. SIGTERM/SIGINT drain and exit 0.`;

usageErrorsExitTwo(new Command('kb-server'))
  .description('the research-KB sample storage service (HTTP + JSON over SQLite)')
  .addHelpText('after', ENV_HELP)
  .parse(process.argv);

const who: StartupReporter = { program: 'kb-server', service: 'kb-server', instance: `kb-${process.pid}` };
/** A failure to start: named on stderr and in a `failed to start` line (libs/runtime startup.ts), exit 2. */
function fail(err: unknown): never {
  failStartup(who, err);
}

let config: z.infer<typeof kbConfigSchema>;
try {
  config = loadConfig(kbConfigSchema);
} catch (err) {
  fail(err);
}

/** SHA-256 of the operator token (compared in constant time), or null when the endpoints are off. */
let adminTokenDigest: Buffer | null = null;
if (config.KB_ADMIN_TOKEN_FILE !== undefined) {
  let token: string;
  try {
    token = readFileSync(config.KB_ADMIN_TOKEN_FILE, 'utf8').trim();
  } catch (err) {
    fail(
      new StartupError(
        'KB_ADMIN_TOKEN_FILE',
        config.KB_ADMIN_TOKEN_FILE,
        `cannot read the file: ${describeError(err)}`,
        { cause: err },
      ),
    );
  }
  if (token.length < 16 || /\s/.test(token))
    fail(
      new StartupError(
        'KB_ADMIN_TOKEN_FILE',
        config.KB_ADMIN_TOKEN_FILE,
        'the token must be at least 16 characters without whitespace',
      ),
    );
  adminTokenDigest = createHash('sha256').update(token, 'utf8').digest();
}

/**
 * SHA-256 of the service token (compared in constant time), or null when any caller is trusted.
 * The file is checked as every key file is (libs/runtime secrets.ts: mode 0600, >= 32 characters).
 */
let serviceTokenDigest: Buffer | null = null;
if (config.KB_SERVICE_TOKEN_FILE !== undefined) {
  try {
    serviceTokenDigest = createHash('sha256').update(readKeyFile(config.KB_SERVICE_TOKEN_FILE)).digest();
  } catch (err) {
    fail(
      err instanceof SecretFileError
        ? new StartupError('KB_SERVICE_TOKEN_FILE', err.file, err.problem, { cause: err })
        : err,
    );
  }
  // One credential must not open the other's endpoints.
  if (adminTokenDigest !== null && timingSafeEqual(serviceTokenDigest, adminTokenDigest)) {
    fail(
      new StartupError(
        'KB_SERVICE_TOKEN_FILE',
        config.KB_SERVICE_TOKEN_FILE,
        'holds the operator token of KB_ADMIN_TOKEN_FILE; the service token must be another one',
      ),
    );
  }
}

let seed: KbSeed = { tenants: [], knowledgeBases: [] };
try {
  if (config.KB_SEED_FILE !== undefined) seed = loadSeedFile(config.KB_SEED_FILE);
} catch (err) {
  if (err instanceof SeedError) fail(new ConfigError(err.problems));
  throw err;
}
// The file first, then KB_SEED: the first definition of a knowledge base creates it.
seed = { tenants: seed.tenants, knowledgeBases: [...seed.knowledgeBases, ...config.KB_SEED] };

let log: Logger;
try {
  log = createLogger({
    service: 'kb-server',
    instance: `kb-${process.pid}`,
    level: config.LOG_LEVEL,
    hmacKeyFile: config.TOOLTX_LOG_HMAC_KEY_FILE,
  });
} catch (err) {
  fail(
    err instanceof SecretFileError
      ? new StartupError('TOOLTX_LOG_HMAC_KEY_FILE', err.file, err.problem, { cause: err })
      : err,
  );
}
who.log = log;
// Started by a supervisor (npm start): stop when it is gone, even after a SIGKILL of it.
exitWithParent(log, config.TOOLTX_EXIT_WITH_PARENT);
// A crash is one fatal log line, never Node's print of a message and stack.
installProcessHandlers(log);
const dbPath = config.KB_DB === ':memory:' ? ':memory:' : resolve(config.KB_DB);
let store: KbStore;
try {
  store = new KbStore({ path: dbPath, dedup: config.KB_DEDUP === 'on' });
} catch (err) {
  fail(new StartupError('KB_DB', dbPath, `cannot open or create the database: ${describeError(err)}`, { cause: err }));
}
let seeded: { knowledgeBases: number; created: number };
try {
  seeded = applySeed(store, seed);
} catch (err) {
  store.close();
  if (err instanceof SeedError) fail(new ConfigError(err.problems));
  throw err;
}
log.info(
  {
    db: dbPath,
    dedup: store.dedup,
    ...store.pragmas(),
    ...seeded,
    tenants: seed.tenants.length,
    adminApi: adminTokenDigest !== null,
    serviceAuth: serviceTokenDigest !== null,
  },
  'store opened',
);
if (serviceTokenDigest === null) {
  log.warn(
    { setting: 'KB_SERVICE_TOKEN_FILE' },
    'no service token: any caller that reaches this port is trusted with any tenant and actor (development only)',
  );
}

// ---------------------------------------------------------------------------------------------
// Request parsing

type Issue = { path: (string | number)[]; code: string; message: string };

/** An answer to send: status, JSON body and extra headers. */
class Reply {
  constructor(
    readonly status: number,
    readonly body: Record<string, unknown>,
    readonly headers: Record<string, string> = {},
  ) {}
}

const notFound = () => new Reply(404, { error: 'not_found' });
const invalid = (issues: Issue[]) => new Reply(400, { error: 'invalid_input', issues });

/** The issues of a zod error, bounded (boundIssues): zod names every unknown field in one message. */
function issuesOf(err: z.ZodError, prefix: (string | number)[] = []): Issue[] {
  return boundIssues(
    err.issues.map((i) => ({
      path: [...prefix, ...i.path.map((p) => (typeof p === 'number' ? p : String(p)))],
      code: i.code,
      message: i.message,
    })),
  );
}

const nameSchema = z.string().regex(KB_NAME, NAME_RULE);
const tenantHeader = nameSchema;
const actorHeader = nameSchema;
const keyHeader = z
  .string()
  .min(1)
  .max(100)
  .regex(/^[\x21-\x7e]+$/, 'printable ASCII without spaces');
const batchKeyHeader = z
  .string()
  .min(1)
  .max(96)
  .regex(/^[\x21-\x7e]+$/, 'printable ASCII without spaces');
/** `x-tooltx-input-digest`: the caller's digest of what it asked (tooltx: RFC 8785 + SHA-256, libs/contracts digest.ts). */
const inputDigestHeader = z
  .string()
  .regex(/^sha256:[0-9a-f]{64}$/, 'sha256: followed by 64 lower-case hex digits')
  .optional();
const deadlineHeader = z
  .string()
  .regex(/^\d{1,15}$/, 'an absolute deadline in ms since the epoch')
  .transform(Number);
/** `if-match` of a single write or delete: the authorisation version, bare or quoted like an ETag. */
const ifMatchHeader = z
  .string()
  .regex(/^(?:\d{1,15}|"\d{1,15}")$/, 'the authorisation version the caller checked (an integer, optionally quoted)')
  .transform((s) => Number(s.replaceAll('"', '')));
/** `if-match` of a batch: `<kbId>=<version>` pairs, comma-separated. */
const batchIfMatchHeader = z
  .string()
  .max(8_192)
  .transform((s, ctx) => {
    const out = new Map<string, number>();
    for (const part of s.split(',').map((p) => p.trim())) {
      const m = /^(kb_[0-9a-f-]{36})=(?:(\d{1,15})|"(\d{1,15})")$/.exec(part);
      if (!m || !KB_ID.test(m[1]!) || out.has(m[1]!)) {
        ctx.addIssue({ code: 'custom', message: 'comma-separated <kbId>=<authVersion> pairs, one per knowledge base' });
        return z.NEVER;
      }
      out.set(m[1]!, Number(m[2] ?? m[3]));
    }
    return out as ReadonlyMap<string, number>;
  });

const noteBody = z.strictObject({
  kb: z.string().min(1).max(MAX_REF),
  title: z.string().min(1).max(300),
  body: z.string().min(1).max(100_000),
  sourceUrl: z.url({ protocol: /^https?$/ }).max(2_000),
  fetchedAt: z.iso.datetime({ offset: true }),
  publishAt: z.iso.datetime({ offset: true }).optional(),
});
const batchBody = z.strictObject({ items: z.array(noteBody).min(1).max(MAX_BATCH) });

/** Parses the named headers with `shape`; issues under `["headers", name]`. */
// The header shapes of each endpoint, defined once (their schemas are compiled once, below).
const WHO_HEADERS = { 'x-tenant': tenantHeader, 'x-actor': actorHeader };
const TENANT_HEADERS = { 'x-tenant': tenantHeader };
const NOTE_HEADERS = {
  'x-tenant': tenantHeader,
  'x-actor': actorHeader,
  'idempotency-key': keyHeader,
  'x-deadline': deadlineHeader,
  'if-match': ifMatchHeader,
  'x-tooltx-input-digest': inputDigestHeader,
};
const BATCH_HEADERS = {
  'x-tenant': tenantHeader,
  'x-actor': actorHeader,
  'idempotency-key': batchKeyHeader,
  'x-deadline': deadlineHeader,
  'if-match': batchIfMatchHeader,
  'x-tooltx-input-digest': inputDigestHeader,
};
const DELETE_HEADERS = {
  'x-tenant': tenantHeader,
  'x-actor': actorHeader,
  'idempotency-key': keyHeader,
  'if-match': ifMatchHeader,
};
const NO_HEADERS = {};

/** The header schemas, built once per shape (a request must not pay for compiling one). */
const headerSchemas = new WeakMap<z.ZodRawShape, z.ZodObject<z.ZodRawShape>>();

function parseHeaders<S extends z.ZodRawShape>(
  req: IncomingMessage,
  shape: S,
): { data?: z.infer<z.ZodObject<S>>; issues: Issue[] } {
  const raw: Record<string, unknown> = {};
  for (const name of Object.keys(shape)) raw[name] = req.headers[name];
  let schema = headerSchemas.get(shape);
  if (!schema) headerSchemas.set(shape, (schema = z.object(shape)));
  const r = (schema as z.ZodObject<S>).safeParse(raw);
  return r.success ? { data: r.data, issues: [] } : { issues: issuesOf(r.error, ['headers']) };
}

class BodyTooLarge extends Error {}

/** What a refused request may still send before its connection is closed, bytes and ms. */
const LINGER_BYTES = 8 * MAX_BODY_BYTES;
const LINGER_MS = 2_000;

/**
 * Reads and discards the rest of a refused request's body — at most {@link LINGER_BYTES} or
 * {@link LINGER_MS}, then the socket is destroyed — so the answer reaches a client still writing.
 */
function lingerThenClose(req: IncomingMessage): void {
  let drained = 0;
  const stop = () => req.socket.destroy();
  const timer = setTimeout(stop, LINGER_MS);
  timer.unref();
  req.on('data', (chunk: Buffer) => {
    drained += chunk.length;
    if (drained > LINGER_BYTES) stop();
  });
  req.once('end', () => clearTimeout(timer));
  req.once('close', () => clearTimeout(timer));
  req.resume();
}

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

/** Headers and JSON body parsed together, every problem of both listed. */
async function parseRequest<S extends z.ZodRawShape, B extends z.ZodType>(
  req: IncomingMessage,
  headers: S,
  body: B,
): Promise<{ ok: true; h: z.infer<z.ZodObject<S>>; b: z.infer<B> } | { ok: false; reply: Reply }> {
  const h = parseHeaders(req, headers);
  const json = await readJson(req);
  const issues = [...h.issues, ...json.issues];
  let parsed: { data: z.infer<B> } | undefined;
  if (json.issues.length === 0) {
    const r = body.safeParse(json.value);
    if (r.success) parsed = { data: r.data };
    else issues.push(...issuesOf(r.error));
  }
  if (issues.length || !h.data || !parsed) return { ok: false, reply: invalid(issues) };
  return { ok: true, h: h.data, b: parsed.data };
}

// ---------------------------------------------------------------------------------------------
// Refusals

/** The status of each refusal class. */
const STATUS = {
  not_found: 404,
  forbidden: 403,
  frozen: 409,
  version_conflict: 412,
  quota_exceeded: 429,
  deadline_passed: 409,
  key_reused: 422,
} as const;
type Refusal = keyof typeof STATUS;

/** A refusal answer; `retryAfterMs` adds the body field and a `retry-after` header in whole seconds. */
function refuse(error: Refusal, extra: { retryAfterMs?: number; index?: number } = {}): Reply {
  const body: Record<string, unknown> = { error };
  const headers: Record<string, string> = {};
  if (extra.retryAfterMs !== undefined) {
    body.retryAfterMs = extra.retryAfterMs;
    headers['retry-after'] = String(Math.max(1, Math.ceil(extra.retryAfterMs / 1000)));
  }
  if (extra.index !== undefined)
    body.issues = [{ path: ['items', extra.index], code: error, message: `item ${extra.index} refused: ${error}` }];
  return new Reply(STATUS[error], body, headers);
}

// ---------------------------------------------------------------------------------------------
// Handlers

function resolveRef(req: IncomingMessage, url: URL): Reply {
  const h = parseHeaders(req, WHO_HEADERS);
  const issues = [...h.issues];
  const ref = url.searchParams.get('ref');
  if (ref === null)
    issues.push({ path: ['query', 'ref'], code: 'invalid_type', message: 'the reference to resolve is required' });
  else if (ref.length > MAX_REF)
    issues.push({ path: ['query', 'ref'], code: 'too_big', message: `longer than ${MAX_REF} characters` });
  if (issues.length || !h.data || ref === null) return invalid(issues);
  const r = store.resolveFor(h.data['x-tenant'], h.data['x-actor'], ref);
  return r ? new Reply(200, { ...r }, { etag: `"${r.authVersion}"` }) : notFound();
}

async function postNote(req: IncomingMessage): Promise<Reply> {
  const p = await parseRequest(req, NOTE_HEADERS, noteBody);
  if (!p.ok) return p.reply;
  const note: NoteInput = p.b;
  const out = store.writeNote(
    {
      tenant: p.h['x-tenant'],
      actor: p.h['x-actor'],
      key: p.h['idempotency-key'],
      deadlineAt: p.h['x-deadline'],
      ifMatch: p.h['if-match'],
      inputDigest: p.h['x-tooltx-input-digest'],
    },
    note,
  );
  switch (out.kind) {
    case 'created':
      return new Reply(201, { ...out.note });
    case 'existing':
      return new Reply(200, { ...out.note });
    case 'quota_exceeded':
      return refuse('quota_exceeded', { retryAfterMs: out.retryAfterMs });
    default:
      return refuse(out.kind);
  }
}

async function postBatch(req: IncomingMessage): Promise<Reply> {
  const p = await parseRequest(req, BATCH_HEADERS, batchBody);
  if (!p.ok) return p.reply;
  const notes: NoteInput[] = p.b.items;
  const out = store.writeBatch(
    {
      tenant: p.h['x-tenant'],
      actor: p.h['x-actor'],
      key: p.h['idempotency-key'],
      deadlineAt: p.h['x-deadline'],
      ifMatch: p.h['if-match'],
      inputDigest: p.h['x-tooltx-input-digest'],
    },
    notes,
  );
  switch (out.kind) {
    case 'created':
      return new Reply(201, { items: out.notes });
    case 'existing':
      return new Reply(200, { items: out.notes });
    case 'quota_exceeded':
      return refuse('quota_exceeded', { retryAfterMs: out.retryAfterMs, index: out.index });
    case 'deadline_passed':
      return refuse('deadline_passed');
    default:
      return refuse(out.kind, { index: out.index });
  }
}

function probe(req: IncomingMessage, rawKey: string): Reply {
  const h = parseHeaders(req, TENANT_HEADERS);
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
  // `now`: the store's clock at the lookup — a caller may run a request again once it is past its deadline.
  return r.found ? new Reply(200, { ...r }) : new Reply(404, { error: 'not_found', found: false, now: r.now });
}

function deleteNote(req: IncomingMessage, rawId: string): Reply {
  const h = parseHeaders(req, DELETE_HEADERS);
  if (h.issues.length || !h.data) return invalid(h.issues);
  let id: string;
  try {
    id = decodeURIComponent(rawId);
  } catch {
    return notFound();
  }
  const r = store.deleteNote({ tenant: h.data['x-tenant'], actor: h.data['x-actor'], id, ifMatch: h.data['if-match'] });
  return r.kind === 'deleted' ? new Reply(200, { id: r.id, deleted: true }) : refuse(r.kind);
}

function stats(url: URL): Reply {
  const tenant = url.searchParams.get('tenant');
  const kb = url.searchParams.get('kb');
  const issues: Issue[] = [];
  if (tenant !== null) {
    const t = tenantHeader.safeParse(tenant);
    if (!t.success) issues.push(...issuesOf(t.error, ['query', 'tenant']));
  }
  if (kb !== null && !KB_ID.test(kb))
    issues.push({ path: ['query', 'kb'], code: 'invalid_format', message: 'an internal knowledge-base id kb_<uuid>' });
  if (issues.length) return invalid(issues);
  const filter = { tenant: tenant ?? undefined, kbId: kb ?? undefined };
  return new Reply(200, { ...store.stats(filter), knowledgeBases: store.rowsPerKb(filter) });
}

// ---------------------------------------------------------------------------------------------
// Operator endpoints

/** Whether the request's bearer token is the one of `digest` (constant-time comparison of SHA-256 digests). */
function bearer(req: IncomingMessage, digest: Buffer | null): boolean {
  if (digest === null) return false;
  const m = /^Bearer ([\x21-\x7e]{1,1024})$/.exec(req.headers.authorization ?? '');
  if (!m) return false;
  return timingSafeEqual(createHash('sha256').update(m[1]!, 'utf8').digest(), digest);
}

/** Whether the request carries the operator token. */
function operator(req: IncomingMessage): boolean {
  return bearer(req, adminTokenDigest);
}

/** Whether the request may use the service endpoints: it carries the service token, or none is configured. */
function trustedService(req: IncomingMessage): boolean {
  return serviceTokenDigest === null || bearer(req, serviceTokenDigest);
}

const unauthorized = () => new Reply(401, { error: 'unauthorized' }, { 'www-authenticate': 'Bearer' });

const memberBody = z.strictObject({ tenant: nameSchema, actor: nameSchema, role: z.enum(KB_ROLES).nullable() });
const defaultRoleBody = z.strictObject({ role: z.enum(KB_ROLES).nullable() });
const stateBody = z.strictObject({ state: z.enum(KB_STATES) });
const ownerBody = z.strictObject({ tenant: nameSchema });
const aliasBody = z.strictObject({ alias: z.string().min(1).max(MAX_REF), remove: z.boolean().optional() });

/** An admin change: parse the body with `schema`, apply `change`, answer with the view. */
async function adminChange<B extends z.ZodType>(
  req: IncomingMessage,
  kbId: string,
  what: string,
  schema: B,
  change: (b: z.infer<B>) => AdminOutcome,
): Promise<Reply> {
  const p = await parseRequest(req, NO_HEADERS, schema);
  if (!p.ok) return p.reply;
  const out = change(p.b);
  switch (out.kind) {
    case 'ok':
      if (out.changed) log.info({ kbId, change: what, authVersion: out.kb.authVersion }, 'knowledge base changed');
      return new Reply(200, { ...out.kb, changed: out.changed });
    case 'not_found':
      return notFound();
    case 'conflict':
      return new Reply(409, { error: 'conflict', message: out.reason });
    case 'invalid':
      return invalid([{ path: [out.path], code: 'custom', message: out.reason }]);
  }
}

async function admin(req: IncomingMessage, url: URL, m: string, p: string): Promise<{ route: string; reply: Reply }> {
  if (adminTokenDigest === null) return { route: 'admin disabled', reply: notFound() };
  if (!operator(req)) return { route: 'admin', reply: unauthorized() };
  if (p === '/v1/admin/kbs' && m === 'GET') {
    const tenant = url.searchParams.get('tenant');
    if (tenant !== null && !KB_NAME.test(tenant))
      return {
        route: 'GET /v1/admin/kbs',
        reply: invalid([{ path: ['query', 'tenant'], code: 'invalid_format', message: NAME_RULE }]),
      };
    return {
      route: 'GET /v1/admin/kbs',
      reply: new Reply(200, { knowledgeBases: store.listKnowledgeBases(tenant ?? undefined) }),
    };
  }
  const hit = /^\/v1\/admin\/kbs\/(kb_[0-9a-f-]{36})(?:\/([a-z-]+))?$/.exec(p);
  if (!hit) return { route: 'unknown', reply: notFound() };
  const kbId = hit[1]!;
  const action = hit[2];
  if (action === undefined && m === 'GET') {
    const v = store.knowledgeBase(kbId);
    return { route: 'GET /v1/admin/kbs/:kbId', reply: v ? new Reply(200, { ...v }) : notFound() };
  }
  if (m !== 'POST') return { route: 'unknown', reply: notFound() };
  const route = `POST /v1/admin/kbs/:kbId/${action}`;
  switch (action) {
    case 'members':
      return {
        route,
        reply: await adminChange(req, kbId, 'member', memberBody, (b) =>
          store.setMember(kbId, b.tenant, b.actor, b.role),
        ),
      };
    case 'default-role':
      return {
        route,
        reply: await adminChange(req, kbId, 'default-role', defaultRoleBody, (b) => store.setDefaultRole(kbId, b.role)),
      };
    case 'state':
      return { route, reply: await adminChange(req, kbId, 'state', stateBody, (b) => store.setState(kbId, b.state)) };
    case 'owner':
      return {
        route,
        reply: await adminChange(req, kbId, 'owner', ownerBody, (b) => store.transferOwner(kbId, b.tenant)),
      };
    case 'aliases':
      return {
        route,
        reply: await adminChange(req, kbId, 'alias', aliasBody, (b) =>
          store.setAlias(kbId, b.alias, b.remove === true),
        ),
      };
    default:
      return { route: 'unknown', reply: notFound() };
  }
}

/** Routes one request; `route` names the matched template for the access log. */
async function route(req: IncomingMessage, url: URL): Promise<{ route: string; reply: Reply }> {
  const m = req.method ?? 'GET';
  const p = url.pathname;
  if (p === '/healthz' && m === 'GET') return { route: 'GET /healthz', reply: new Reply(200, { ok: true }) };
  if (p === '/v1/admin' || p.startsWith('/v1/admin/')) return admin(req, url, m, p);
  // Everything else is the trusted side's: nothing is parsed, read or written before the token.
  if (!trustedService(req)) return { route: 'service unauthorized', reply: unauthorized() };
  if (p === '/v1/resolve' && m === 'GET') return { route: 'GET /v1/resolve', reply: resolveRef(req, url) };
  if (p === '/v1/notes' && m === 'POST') return { route: 'POST /v1/notes', reply: await postNote(req) };
  if (p === '/v1/notes:batch' && m === 'POST') return { route: 'POST /v1/notes:batch', reply: await postBatch(req) };
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
    // The KB's clock (ms since the epoch) on every answer: callers learn it to send deadlines on it.
    'x-kb-now': String(store.now()),
    ...reply.headers,
    ...(close || stopping ? { connection: 'close' } : {}),
  });
  res.end(text);
}

const server = createServer((req, res) => {
  const started = performance.now();
  let url: URL;
  try {
    url = new URL(req.url ?? '/', 'http://kb.invalid');
  } catch {
    // An absolute-form target that is no URL (`GET http://[ HTTP/1.1`): thrown here, outside any
    // handler, it ended the process.
    return send(
      res,
      invalid([{ path: ['url'], code: 'invalid_format', message: 'the request target is not a URL' }]),
      true,
    );
  }
  route(req, url).then(
    ({ route: r, reply }) => {
      send(res, reply);
      log.debug({ route: r, status: reply.status, ms: Math.round(performance.now() - started) }, 'request');
    },
    (err: unknown) => {
      if (err instanceof BodyTooLarge) {
        // Answer, then drain what the client is still sending, within a bound, before the
        // connection closes ("lingering close", as HTTP servers do): closing at once resets a
        // connection the client is still writing to, and it never reads the answer (EPIPE).
        lingerThenClose(req);
        // Not `connection: close`: the server would close right after the answer, mid-drain.
        send(
          res,
          invalid([{ path: [], code: 'too_big', message: `the request body exceeds ${MAX_BODY_BYTES} bytes` }]),
        );
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

try {
  await new Promise<void>((r, j) => {
    server.once('error', j);
    server.listen(config.KB_PORT, config.KB_HOST, () => {
      server.off('error', j);
      r();
    });
  });
} catch (err) {
  store.close();
  const code = (err as NodeJS.ErrnoException).code;
  // The port is taken or not ours to bind; the host is not an address of this machine.
  if (code === 'EADDRNOTAVAIL' || code === 'ENOTFOUND' || code === 'EAI_AGAIN')
    fail(new StartupError('KB_HOST', config.KB_HOST, describeError(err), { cause: err }));
  fail(
    new StartupError(
      'KB_PORT',
      String(config.KB_PORT),
      `cannot listen on ${config.KB_HOST}:${config.KB_PORT}: ${describeError(err)}`,
      { cause: err },
    ),
  );
}
server.on('error', (err) => {
  log.fatal({ err }, 'server error');
  store.close();
  process.exit(1);
});
const address = server.address() as AddressInfo;

// Installed before the "listening" line and the readiness message: whoever acts on them (a
// supervisor, a test) may send SIGTERM at once, and a handler installed after them left a window in
// which a preempted KB died by the signal's default action (seen as a CI flake).
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
log.info({ host: address.address, port: address.port, dedup: store.dedup }, 'listening');
// A supervisor (npm start) learns the port over IPC, whatever LOG_LEVEL hides.
announceReady({ port: address.port });
