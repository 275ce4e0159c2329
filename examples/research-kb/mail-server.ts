/**
 * The sample's mail outbox: a separate process beside the KB, the system of record of the mail
 * tools (./mail-tools.ts). HTTP + JSON over a SQLite store (./mail-store.ts); nothing leaves the
 * machine — a sent mail is a row. `tsx examples/research-kb/mail-server.ts --help` lists its
 * settings.
 *
 * Identity headers (set by the trusted executor from the authenticated context, never by a model):
 * `x-tenant` and `x-actor`, each `^[a-z0-9_-]{1,64}$`. Every write also carries `idempotency-key`
 * (the downstream key, ≤ 100 printable ASCII characters), `x-deadline` (absolute, ms since the
 * epoch) and optionally `x-tooltx-input-digest` (`sha256:` + 64 hex; stored and answered by the
 * probe). A write is checked and stored in ONE transaction, in this order: the key (dedup on: the
 * same request again → 200 with the first answer; another request under the key → 422
 * `key_reused`), the draft or mail it names (404 `not_found`, identical for another tenant's), its
 * state (409 `draft_discarded` / `draft_sent`), the deadline (409 `deadline_passed`), then 201.
 * Nothing is stored unless 201.
 *
 * Who may call: with `MAIL_SERVICE_TOKEN_FILE` set, every endpoint but `GET /healthz` and the
 * operator endpoints requires `authorization: Bearer <service token>` (401 `unauthorized`
 * otherwise, before anything is read), as the KB does.
 *
 * - `POST /v1/drafts` `{ to: [email…], cc?: [email…], subject, body }` → 201 `{ draftId, state:
 *   "draft", preview: { to, cc, subject, excerpt, bodyBytes }, createdAt }`. No mail leaves.
 * - `POST /v1/drafts/send` `{ draftId } | { draftKey }` (the draft, or the draft created under that
 *   key) → 201 `{ id, kind: "draft", draftId, sentAt }`; a draft already sent → 200 with its first
 *   sent mail (dedup on: a draft leaves once); 409 `draft_discarded`.
 * - `POST /v1/drafts/discard` `{ draftId } | { draftKey }` → 201 `{ draftId, state: "discarded",
 *   discardedAt }` (a discarded draft is never sent; discarding it again answers the same); 409
 *   `draft_sent`.
 * - `POST /v1/mails` `{ to, cc?, subject, body }` → 201 `{ id, kind: "direct", sentAt }`.
 * - `POST /v1/mails/corrections` `{ corrects: <sent mail id>, to, cc?, subject, body }` → 201
 *   `{ id, kind: "correction", corrects, sentAt }`: a new mail that refers to an earlier one, never
 *   an unsend; 404 when `corrects` is not a sent mail of the tenant.
 * - Read-only probes by key (`x-tenant`), each with `count` (rows under the key: > 1 only with
 *   dedup off), `inputDigest` when stored, and `now` (the outbox's clock at the lookup, which never
 *   goes back: a write whose deadline is before it can no longer be stored); 404 `{ error:
 *   "not_found", found: false, now }` when nothing is under the key:
 *   `GET /v1/drafts/by-key/:key` → `{ found: true, draftId, state, preview, createdAt, … }`;
 *   `GET /v1/sent/by-key/:key` → `{ found: true, id, kind, draftId?, corrects?, sentAt, … }`;
 *   `GET /v1/discards/by-key/:key` → `{ found: true, draftId, state, discardedAt, … }`.
 * - `GET /v1/sent/:id` (`x-tenant`) → the sent mail `{ id, kind, draftId?, corrects?, sentAt, to,
 *   cc, subject, bodyDigest, bodyBytes }` (never a body).
 * - `GET /v1/stats[?tenant=]` → `{ drafts: { draft, sent, discarded }, sent: { rows, distinctKeys,
 *   duplicateRows, duplicateDraftSends, byKind }, discards }`: raw counts, nothing deduplicated.
 * - Operator endpoints, only when `MAIL_ADMIN_TOKEN_FILE` is set (else 404), with `authorization:
 *   Bearer <operator token>` (else 401): `POST /v1/admin/faults` `{ operation, count, mode? }`
 *   makes the next `count` calls of `operation` (`drafts.create`, `drafts.send`, `drafts.discard`,
 *   `mails.send`, `mails.correct`) fail — calls that passed the token and input checks, so a test
 *   makes exactly the downstream of one step fail; `count: 0` clears it. `mode`:
 *   `unavailable` (default: 503 `{ error: "unavailable" }`, nothing stored), `refused` (422
 *   `{ error: "refused" }`, nothing stored: a definitive refusal) or `lost_answer` (the write is
 *   stored, then 500 `{ error: "internal" }`: an answer lost after the effect). Answers the faults
 *   armed `{ faults: { [operation]: { count, mode } } }`, as `GET /v1/admin/faults` does.
 * - `GET /healthz` — `{ ok: true }`. Every answer carries `x-mail-now`, the outbox's clock.
 *
 * Errors as the KB's (./http-json.ts): `{ error }`, `invalid_input` with `issues: [{ path, code,
 * message }]`; never a stack, SQL text or the request body; logs never carry bodies, headers,
 * addresses, subjects or a token.
 */
import type { IncomingMessage } from 'node:http';
import type { AddressInfo } from 'node:net';
import { resolve } from 'node:path';
import { Command } from 'commander';
import { z } from 'zod';
import {
  baseConfigSchema,
  createLogger,
  describeError,
  envInt,
  exitWithParent,
  failStartup,
  installProcessHandlers,
  loadConfig,
  type Logger,
  SecretFileError,
  StartupError,
  type StartupReporter,
  serviceConfigSchema,
  usageErrorsExitTwo,
} from '@tooltx/runtime';
import {
  announceListening,
  bearer,
  deadlineHeader,
  inputDigestHeader,
  invalid,
  keyFromPath,
  keySchema,
  loadTokenDigests,
  nameSchema,
  notFound,
  parseHeaders,
  parseRequest,
  Reply,
  serveJson,
  unauthorized,
} from './http-json.js';
import { type DraftRef, MailStore, type MailWriteContext, type Outcome, type Probe } from './mail-store.js';

/** Most recipients of one mail, `to` and `cc` each. */
const MAX_RECIPIENTS = 50;

const mailConfigSchema = z.object({
  MAIL_PORT: envInt(0, 65_535).default(4281),
  MAIL_HOST: z.string().min(1).default('127.0.0.1'),
  MAIL_DB: z.string().min(1).default('.state/mail.sqlite'),
  MAIL_DEDUP: z.enum(['on', 'off']).default('on'),
  MAIL_ADMIN_TOKEN_FILE: z.string().min(1).optional(),
  MAIL_SERVICE_TOKEN_FILE: z.string().min(1).optional(),
  LOG_LEVEL: baseConfigSchema.shape.LOG_LEVEL,
  TOOLTX_LOG_HMAC_KEY_FILE: baseConfigSchema.shape.TOOLTX_LOG_HMAC_KEY_FILE,
  TOOLTX_EXIT_WITH_PARENT: serviceConfigSchema.shape.TOOLTX_EXIT_WITH_PARENT,
});

const ENV_HELP = `
Environment:
  MAIL_PORT  TCP port (default 4281; 0 = any free port, logged in the "listening" line)
  MAIL_HOST  address to bind (default 127.0.0.1)
  MAIL_DB    SQLite file, directories created (default .state/mail.sqlite)
  MAIL_DEDUP on|off (default on): on = a repeated idempotency-key returns the first answer and a
             draft is sent once; off = every request that reaches the insert stores a row (shows
             double executions: a second send of one draft too)
  MAIL_ADMIN_TOKEN_FILE
             file holding the operator token (>= 16 characters) for /v1/admin/* (fault injection)
             with "authorization: Bearer <token>"; unset = operator endpoints disabled (404)
  MAIL_SERVICE_TOKEN_FILE
             file (mode 0600) holding the service token (>= 32 characters, not the operator's)
             that every endpoint but /healthz and /v1/admin/* requires as
             "authorization: Bearer <token>" (else 401); give the same file to the services
             that load the tools module; unset = any caller is trusted (development only)
  LOG_LEVEL  fatal|error|warn|info|debug|trace|silent (default info)
  TOOLTX_LOG_HMAC_KEY_FILE
             key file (mode 0600) for the HMAC of error messages in logs (optional)
  TOOLTX_EXIT_WITH_PARENT
             pid of the supervisor that started this process: the outbox stops when that
             process is gone (optional)

Exits 2 when it cannot start: a bad configuration (every problem listed), a database file it
cannot open (MAIL_DB) or a port it cannot listen on (MAIL_PORT, MAIL_HOST) — named on stderr and in
a "failed to start" log line. SIGTERM/SIGINT drain and exit 0.`;

usageErrorsExitTwo(new Command('mail-server'))
  .description('the sample mail outbox (HTTP + JSON over SQLite; nothing leaves the machine)')
  .addHelpText('after', ENV_HELP)
  .parse(process.argv);

const who: StartupReporter = { program: 'mail-server', service: 'mail-server', instance: `mail-${process.pid}` };
function fail(err: unknown): never {
  failStartup(who, err);
}

let config: z.infer<typeof mailConfigSchema>;
try {
  config = loadConfig(mailConfigSchema);
} catch (err) {
  fail(err);
}

let adminTokenDigest: Buffer | null = null;
let serviceTokenDigest: Buffer | null = null;
try {
  ({ admin: adminTokenDigest, service: serviceTokenDigest } = loadTokenDigests(
    { setting: 'MAIL_ADMIN_TOKEN_FILE', file: config.MAIL_ADMIN_TOKEN_FILE },
    { setting: 'MAIL_SERVICE_TOKEN_FILE', file: config.MAIL_SERVICE_TOKEN_FILE },
  ));
} catch (err) {
  fail(err);
}

let log: Logger;
try {
  log = createLogger({
    service: 'mail-server',
    instance: `mail-${process.pid}`,
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
exitWithParent(log, config.TOOLTX_EXIT_WITH_PARENT);
installProcessHandlers(log);
const dbPath = config.MAIL_DB === ':memory:' ? ':memory:' : resolve(config.MAIL_DB);
let store: MailStore;
try {
  store = new MailStore({ path: dbPath, dedup: config.MAIL_DEDUP === 'on' });
} catch (err) {
  fail(
    new StartupError('MAIL_DB', dbPath, `cannot open or create the database: ${describeError(err)}`, { cause: err }),
  );
}
log.info(
  {
    db: dbPath,
    dedup: store.dedup,
    ...store.pragmas(),
    adminApi: adminTokenDigest !== null,
    serviceAuth: serviceTokenDigest !== null,
  },
  'store opened',
);
if (serviceTokenDigest === null) {
  log.warn(
    { setting: 'MAIL_SERVICE_TOKEN_FILE' },
    'no service token: any caller that reaches this port is trusted with any tenant and actor (development only)',
  );
}

// ---------------------------------------------------------------------------------------------
// Request shapes

const WRITE_HEADERS = {
  'x-tenant': nameSchema,
  'x-actor': nameSchema,
  'idempotency-key': keySchema(100),
  'x-deadline': deadlineHeader,
  'x-tooltx-input-digest': inputDigestHeader,
};
const TENANT_HEADERS = { 'x-tenant': nameSchema };

const recipients = z.array(z.email().max(320)).max(MAX_RECIPIENTS);
const mailFields = {
  to: recipients.min(1),
  cc: recipients.optional(),
  subject: z.string().min(1).max(300),
  body: z.string().min(1).max(100_000),
};
const mailBody = z.strictObject(mailFields);
const correctionBody = z.strictObject({ ...mailFields, corrects: z.string().regex(/^mail_[0-9a-f-]{36}$/) });
const draftRefBody = z.union([
  z.strictObject({ draftId: z.string().regex(/^draft_[0-9a-f-]{36}$/) }),
  z.strictObject({ draftKey: keySchema(100) }),
]);

// ---------------------------------------------------------------------------------------------
// Fault injection (operator only)

const FAULT_OPERATIONS = ['drafts.create', 'drafts.send', 'drafts.discard', 'mails.send', 'mails.correct'] as const;
type FaultOperation = (typeof FAULT_OPERATIONS)[number];
const FAULT_MODES = ['unavailable', 'refused', 'lost_answer'] as const;
type FaultMode = (typeof FAULT_MODES)[number];
const faultBody = z.strictObject({
  operation: z.enum(FAULT_OPERATIONS),
  count: z.number().int().min(0).max(10_000),
  mode: z.enum(FAULT_MODES).optional(),
});
/** The armed faults: how many of the next calls of each operation fail, and how. */
const faults = new Map<FaultOperation, { count: number; mode: FaultMode }>();

/** The fault to apply to this call of `op`, counted down; none when unarmed. */
function takeFault(op: FaultOperation): FaultMode | undefined {
  const f = faults.get(op);
  if (!f) return undefined;
  if (--f.count <= 0) faults.delete(op);
  log.info({ operation: op, mode: f.mode, left: Math.max(0, f.count) }, 'injected fault');
  return f.mode;
}

const faultsView = () => ({ faults: Object.fromEntries(faults) });

// ---------------------------------------------------------------------------------------------
// Handlers

const STATUS = {
  key_reused: 422,
  not_found: 404,
  draft_discarded: 409,
  draft_sent: 409,
  deadline_passed: 409,
} as const;

function answer<T extends object>(out: Outcome<T>): Reply {
  if (out.kind === 'created') return new Reply(201, { ...(out.value as Record<string, unknown>) });
  if (out.kind === 'existing') return new Reply(200, { ...(out.value as Record<string, unknown>) });
  return new Reply(STATUS[out.kind], { error: out.kind });
}

/** A write: headers and body parsed, the fault (if armed) applied, the store's outcome answered. */
async function write<B extends z.ZodType, T extends object>(
  req: IncomingMessage,
  op: FaultOperation,
  body: B,
  apply: (ctx: MailWriteContext, b: z.infer<B>) => Outcome<T>,
): Promise<Reply> {
  const p = await parseRequest(req, WRITE_HEADERS, body);
  if (!p.ok) return p.reply;
  const ctx: MailWriteContext = {
    tenant: p.h['x-tenant'],
    actor: p.h['x-actor'],
    key: p.h['idempotency-key'],
    deadlineAt: p.h['x-deadline'],
    inputDigest: p.h['x-tooltx-input-digest'],
  };
  const fault = takeFault(op);
  if (fault === 'unavailable') return new Reply(503, { error: 'unavailable' });
  if (fault === 'refused') return new Reply(422, { error: 'refused' });
  const out = apply(ctx, p.b);
  if (out.kind === 'created') log.debug({ operation: op }, 'stored');
  if (fault === 'lost_answer') return new Reply(500, { error: 'internal' });
  return answer(out);
}

function probe<T extends object>(
  req: IncomingMessage,
  rawKey: string,
  lookup: (tenant: string, key: string) => Probe<T>,
): Reply {
  const h = parseHeaders(req, TENANT_HEADERS);
  const { key, issues: keyIssues } = keyFromPath(rawKey);
  const issues = [...h.issues, ...keyIssues];
  if (issues.length || !h.data || key === undefined) return invalid(issues);
  const r = lookup(h.data['x-tenant'], key);
  return r.found ? new Reply(200, { ...r }) : new Reply(404, { error: 'not_found', found: false, now: r.now });
}

function sentMail(req: IncomingMessage, rawId: string): Reply {
  const h = parseHeaders(req, TENANT_HEADERS);
  if (h.issues.length || !h.data) return invalid(h.issues);
  let id: string;
  try {
    id = decodeURIComponent(rawId);
  } catch {
    return notFound();
  }
  const m = store.sentMail(h.data['x-tenant'], id);
  return m ? new Reply(200, { ...m }) : notFound();
}

function stats(url: URL): Reply {
  const tenant = url.searchParams.get('tenant');
  if (tenant !== null) {
    const t = nameSchema.safeParse(tenant);
    if (!t.success)
      return invalid([{ path: ['query', 'tenant'], code: 'invalid_format', message: 'must match ^[a-z0-9_-]{1,64}$' }]);
  }
  return new Reply(200, { ...store.stats(tenant ?? undefined) });
}

async function admin(req: IncomingMessage, m: string, p: string): Promise<{ route: string; reply: Reply }> {
  if (adminTokenDigest === null) return { route: 'admin disabled', reply: notFound() };
  if (!bearer(req, adminTokenDigest)) return { route: 'admin', reply: unauthorized() };
  if (p !== '/v1/admin/faults') return { route: 'unknown', reply: notFound() };
  if (m === 'GET') return { route: 'GET /v1/admin/faults', reply: new Reply(200, faultsView()) };
  if (m !== 'POST') return { route: 'unknown', reply: notFound() };
  const r = await parseRequest(req, {}, faultBody);
  if (!r.ok) return { route: 'POST /v1/admin/faults', reply: r.reply };
  if (r.b.count === 0) faults.delete(r.b.operation);
  else faults.set(r.b.operation, { count: r.b.count, mode: r.b.mode ?? 'unavailable' });
  log.info({ operation: r.b.operation, count: r.b.count, mode: r.b.mode ?? 'unavailable' }, 'fault armed');
  return { route: 'POST /v1/admin/faults', reply: new Reply(200, faultsView()) };
}

async function route(req: IncomingMessage, url: URL): Promise<{ route: string; reply: Reply }> {
  const m = req.method ?? 'GET';
  const p = url.pathname;
  if (p === '/healthz' && m === 'GET') return { route: 'GET /healthz', reply: new Reply(200, { ok: true }) };
  if (p === '/v1/admin' || p.startsWith('/v1/admin/')) return admin(req, m, p);
  // Everything else is the trusted side's: nothing is parsed, read or written before the token.
  if (serviceTokenDigest !== null && !bearer(req, serviceTokenDigest))
    return { route: 'service unauthorized', reply: unauthorized() };
  if (m === 'POST') {
    switch (p) {
      case '/v1/drafts':
        return {
          route: 'POST /v1/drafts',
          reply: await write(req, 'drafts.create', mailBody, (ctx, b) => store.createDraft(ctx, b)),
        };
      case '/v1/drafts/send':
        return {
          route: 'POST /v1/drafts/send',
          reply: await write(req, 'drafts.send', draftRefBody, (ctx, b: DraftRef) => store.sendDraft(ctx, b)),
        };
      case '/v1/drafts/discard':
        return {
          route: 'POST /v1/drafts/discard',
          reply: await write(req, 'drafts.discard', draftRefBody, (ctx, b: DraftRef) => store.discardDraft(ctx, b)),
        };
      case '/v1/mails':
        return {
          route: 'POST /v1/mails',
          reply: await write(req, 'mails.send', mailBody, (ctx, b) => store.sendMail(ctx, b)),
        };
      case '/v1/mails/corrections':
        return {
          route: 'POST /v1/mails/corrections',
          reply: await write(req, 'mails.correct', correctionBody, (ctx, b) => store.sendCorrection(ctx, b)),
        };
    }
    return { route: 'unknown', reply: notFound() };
  }
  if (m !== 'GET') return { route: 'unknown', reply: notFound() };
  if (p === '/v1/stats') return { route: 'GET /v1/stats', reply: stats(url) };
  const byKey = /^\/v1\/(drafts|sent|discards)\/by-key\/([^/]+)$/.exec(p);
  if (byKey) {
    const what = byKey[1] as 'drafts' | 'sent' | 'discards';
    const lookup = (tenant: string, key: string): Probe<object> =>
      what === 'drafts'
        ? store.probeDraft(tenant, key)
        : what === 'sent'
          ? store.probeSent(tenant, key)
          : store.probeDiscard(tenant, key);
    return { route: `GET /v1/${what}/by-key/:key`, reply: probe(req, byKey[2]!, lookup) };
  }
  const sent = /^\/v1\/sent\/([^/]+)$/.exec(p);
  if (sent) return { route: 'GET /v1/sent/:id', reply: sentMail(req, sent[1]!) };
  return { route: 'unknown', reply: notFound() };
}

// ---------------------------------------------------------------------------------------------
// Server

let address: AddressInfo;
try {
  address = await serveJson({
    host: config.MAIL_HOST,
    port: config.MAIL_PORT,
    settings: { port: 'MAIL_PORT', host: 'MAIL_HOST' },
    log,
    route,
    // The outbox's clock on every answer: callers learn it to send deadlines on it (docs/clocks.md).
    headers: () => ({ 'x-mail-now': String(store.now()) }),
    close: () => store.close(),
  });
} catch (err) {
  fail(err);
}
announceListening(log, address, { dedup: store.dedup });
