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
 * - `DELETE /v1/notes/:id` (`x-tenant`, `x-actor`, `idempotency-key`, `if-match`, optionally
 *   `x-tooltx-input-digest`) — soft delete of a note of a knowledge base the tenant owns: it stays
 *   (its write's probe finds it, `deleted: true`), reads and counts leave it out. Idempotent: an
 *   already deleted note answers 200 `{ id, deleted: true, deletedAt }` again, and with
 *   `KB_DEDUP=on` a repeat under the key answers before any other check (422 `key_reused` when the
 *   key deleted another note or carried another input digest); 404 / 409 `frozen` / 412 / 403 as
 *   for a write. Every delete answered 200 is stored under its key.
 * - `GET /v1/deletes/by-key/:key` (`x-tenant`) — read-only probe of a delete: 200 `{ found: true,
 *   id, deletedAt, count, inputDigest?, now }` (`id` = the note; `count` = deletes under the key) or
 *   404 `{ error: "not_found", found: false, now }`.
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
import type { IncomingMessage } from 'node:http';
import type { AddressInfo } from 'node:net';
import { resolve } from 'node:path';
import { Command } from 'commander';
import { z } from 'zod';
import {
  baseConfigSchema,
  ConfigError,
  createLogger,
  describeError,
  envInt,
  exitWithParent,
  failStartup,
  installProcessHandlers,
  loadConfig,
  SecretFileError,
  serviceConfigSchema,
  StartupError,
  type Logger,
  type StartupReporter,
  usageErrorsExitTwo,
} from '@tooltx/runtime';
import {
  announceListening,
  bearer,
  deadlineHeader,
  inputDigestHeader,
  invalid,
  type Issue,
  issuesOf,
  keyFromPath,
  keySchema,
  loadTokenDigests,
  NAME_RULE,
  nameSchema,
  notFound,
  parseHeaders,
  parseRequest,
  Reply,
  serveJson,
  unauthorized,
} from './http-json.js';
import { applySeed, loadSeedFile, SeedError, seedPairsSchema, type KbSeed } from './kb-seed.js';
import { KB_ID, KB_NAME, KB_ROLES, KB_STATES, KbStore, type AdminOutcome, type NoteInput } from './kb-store.js';

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

/**
 * SHA-256 digests of the operator token (null: the operator endpoints are off) and of the service
 * token (null: any caller is trusted), compared in constant time.
 */
let adminTokenDigest: Buffer | null = null;
let serviceTokenDigest: Buffer | null = null;
try {
  ({ admin: adminTokenDigest, service: serviceTokenDigest } = loadTokenDigests(
    { setting: 'KB_ADMIN_TOKEN_FILE', file: config.KB_ADMIN_TOKEN_FILE },
    { setting: 'KB_SERVICE_TOKEN_FILE', file: config.KB_SERVICE_TOKEN_FILE },
  ));
} catch (err) {
  fail(err);
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

const tenantHeader = nameSchema;
const actorHeader = nameSchema;
const keyHeader = keySchema(100);
const batchKeyHeader = keySchema(96);
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
  'x-tooltx-input-digest': inputDigestHeader,
};
const NO_HEADERS = {};

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
  const { key, issues: keyIssues } = keyFromPath(rawKey);
  const issues = [...h.issues, ...keyIssues];
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
  const r = store.deleteNote({
    tenant: h.data['x-tenant'],
    actor: h.data['x-actor'],
    id,
    ifMatch: h.data['if-match'],
    key: h.data['idempotency-key'],
    inputDigest: h.data['x-tooltx-input-digest'],
  });
  return r.kind === 'deleted' ? new Reply(200, { id: r.id, deleted: true, deletedAt: r.deletedAt }) : refuse(r.kind);
}

function probeDelete(req: IncomingMessage, rawKey: string): Reply {
  const h = parseHeaders(req, TENANT_HEADERS);
  const { key, issues: keyIssues } = keyFromPath(rawKey);
  const issues = [...h.issues, ...keyIssues];
  if (issues.length || !h.data || key === undefined) return invalid(issues);
  const r = store.probeDelete(h.data['x-tenant'], key);
  return r.found ? new Reply(200, { ...r }) : new Reply(404, { error: 'not_found', found: false, now: r.now });
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

/** Whether the request carries the operator token. */
function operator(req: IncomingMessage): boolean {
  return bearer(req, adminTokenDigest);
}

/** Whether the request may use the service endpoints: it carries the service token, or none is configured. */
function trustedService(req: IncomingMessage): boolean {
  return serviceTokenDigest === null || bearer(req, serviceTokenDigest);
}

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
  hit = /^\/v1\/deletes\/by-key\/([^/]+)$/.exec(p);
  if (hit && m === 'GET') return { route: 'GET /v1/deletes/by-key/:key', reply: probeDelete(req, hit[1]!) };
  hit = /^\/v1\/notes\/([^/]+)$/.exec(p);
  if (hit && m === 'DELETE') return { route: 'DELETE /v1/notes/:id', reply: deleteNote(req, hit[1]!) };
  return { route: 'unknown', reply: notFound() };
}

// ---------------------------------------------------------------------------------------------
// Server

let address: AddressInfo;
try {
  address = await serveJson({
    host: config.KB_HOST,
    port: config.KB_PORT,
    settings: { port: 'KB_PORT', host: 'KB_HOST' },
    log,
    route,
    // The KB's clock (ms since the epoch) on every answer: callers learn it to send deadlines on it.
    headers: () => ({ 'x-kb-now': String(store.now()) }),
    close: () => store.close(),
  });
} catch (err) {
  fail(err);
}
announceListening(log, address, { dedup: store.dedup });
