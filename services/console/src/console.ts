/**
 * The console (docs/console.md): web pages for operators and auditors over the services they may
 * use — operations by state across tenants (the operations query; an auditor: its tenant's audit
 * service), one operation's timeline (its audit record, and for an operator its folded state with
 * the receipt's signature checked, through the takeover service), the takeover queue with the
 * resolutions `tooltx takeover resolve` records. A login is an operator or an auditor of the
 * identity list (`tooltx auth generate` writes each one's password and the hashes); the console acts
 * as that identity with its nkey seed, so the server's permissions bound every page.
 *
 * HTTP: fastify, sessions in server memory behind an HttpOnly SameSite=Strict cookie
 * (@fastify/session over @fastify/cookie), stored only once someone has logged in; a CSRF token in
 * every form (@fastify/csrf-protection: the login form's secret in a signed cookie, every other
 * form's in the session), logins limited per client address (@fastify/rate-limit; the address a
 * trusted proxy forwards, when one is configured); pages from escaping templates (./views.ts) with
 * a Content-Security-Policy that allows only the console's own script.
 */
import { readFileSync } from 'node:fs';
import { isIP, type AddressInfo } from 'node:net';
import { join, resolve } from 'node:path';
import fastifyCookie from '@fastify/cookie';
import fastifyCsrf from '@fastify/csrf-protection';
import fastifyFormbody from '@fastify/formbody';
import fastifyRateLimit from '@fastify/rate-limit';
import fastifySession from '@fastify/session';
import { Command } from 'commander';
import Fastify, { type FastifyInstance, type FastifyReply, type FastifyRequest, type Session } from 'fastify';
import { LRUCache } from 'lru-cache';
import { z } from 'zod';
import {
  consoleLoginName,
  consoleLoginsSchema,
  verifyConsoleLogin,
  type ConsoleLogin,
  type ConsoleLogins,
} from '@tooltx/auth';
import {
  ErrorClass,
  fieldIssues,
  idSchema,
  operationKeySchema,
  toErrorInfo,
  TooltxError,
  type ErrorInfo,
} from '@tooltx/contracts';
import { operationStatuses, type AuditRecord, type OperationRecord } from '@tooltx/lifecycle';
import { Subjects } from '@tooltx/nats';
import {
  announceReady,
  baseConfigSchema,
  createLogger,
  envInt,
  exitWithParent,
  failStartup,
  installProcessHandlers,
  loadConfig,
  readKeyFile,
  SecretFileError,
  serviceConfigSchema,
  StartupError,
  timeSpecOf,
  usageErrorsExitTwo,
  type Logger,
  type StartupReporter,
} from '@tooltx/runtime';
import { Backend, MAX_ROWS, type CheckedReceipt, type OpsFilter } from './backend.js';
import { CONSOLE_CSS, CONSOLE_JS, ConsoleViews, type Template } from './views.js';

declare module 'fastify' {
  interface Session {
    /** The login name of the person logged in on this session. */
    login?: string;
  }
}

/** Settings (validated at start; a bad one is named and the process exits 2). */
export const consoleConfigSchema = z
  .object({
    NATS_URL: baseConfigSchema.shape.NATS_URL,
    TOOLTX_PREFIX: baseConfigSchema.shape.TOOLTX_PREFIX,
    LOG_LEVEL: baseConfigSchema.shape.LOG_LEVEL,
    TOOLTX_INSTANCE_ID: baseConfigSchema.shape.TOOLTX_INSTANCE_ID,
    TOOLTX_LOG_HMAC_KEY_FILE: baseConfigSchema.shape.TOOLTX_LOG_HMAC_KEY_FILE,
    TOOLTX_EXIT_WITH_PARENT: serviceConfigSchema.shape.TOOLTX_EXIT_WITH_PARENT,
    TOOLTX_AUTH_DIR: z
      .string({
        error:
          'required: the directory `tooltx auth generate` wrote (console/logins.json, nkeys/*.nk, receipt-keys.json)',
      })
      .min(1),
    TOOLTX_CONSOLE_PORT: envInt(0, 65_535).default(4290),
    TOOLTX_CONSOLE_HOST: z.string().min(1).default('127.0.0.1'),
    TOOLTX_CONSOLE_SESSION_KEY_FILE: z.string().min(1).optional(),
    TOOLTX_CONSOLE_SECURE_COOKIE: z.enum(['on', 'off']).default('off'),
    TOOLTX_CONSOLE_REFRESH_MS: envInt(500, 60_000).default(2_000),
    TOOLTX_CONSOLE_AUDITOR_REFRESH_MS: envInt(500, 3_600_000).default(30_000),
    TOOLTX_CONSOLE_LOGINS_PER_MINUTE: envInt(1, 10_000).default(20),
    TOOLTX_CONSOLE_MAX_SESSIONS: envInt(1, 1_000_000).default(10_000),
    TOOLTX_CONSOLE_TRUST_PROXY: z
      .string()
      .default('off')
      .transform((v, ctx) => {
        if (v.trim() === 'off') return false as const;
        const entries = v.split(',').map((e) => e.trim());
        const bad = entries.find((e) => !isAddressOrCidr(e));
        if (bad === undefined) return entries;
        ctx.addIssue({
          code: 'custom',
          message: `"${bad.slice(0, 60)}" is not an IP address or CIDR: give off, or the proxies' addresses, comma-separated (127.0.0.1,10.0.0.0/8)`,
        });
        return z.NEVER;
      }),
  })
  .superRefine((c, ctx) => {
    // The console serves HTTP; it learns that a request came over HTTPS only from a proxy it trusts.
    if (c.TOOLTX_CONSOLE_SECURE_COOKIE === 'on' && c.TOOLTX_CONSOLE_TRUST_PROXY === false)
      ctx.addIssue({
        code: 'custom',
        path: ['TOOLTX_CONSOLE_SECURE_COOKIE'],
        message:
          'on needs TOOLTX_CONSOLE_TRUST_PROXY: the TLS proxy in front must be trusted for its X-Forwarded-Proto, or no login would ever get its cookie',
      });
  });

/** An IPv4/IPv6 address, or one with a prefix length (`10.0.0.0/8`, `fd00::/8`). */
function isAddressOrCidr(v: string): boolean {
  const [addr, len, ...rest] = v.split('/');
  const family = isIP(addr ?? '');
  if (family === 0 || rest.length > 0) return false;
  if (len === undefined) return true;
  return /^\d{1,3}$/.test(len) && Number(len) <= (family === 4 ? 32 : 128);
}
export type ConsoleConfig = z.infer<typeof consoleConfigSchema>;

export const CONSOLE_ENV_HELP = `
Environment:
  NATS_URL          server URL(s), comma-separated (default nats://127.0.0.1:4222)
  TOOLTX_PREFIX     subject prefix of the deployment (default tooltx)
  TOOLTX_AUTH_DIR   the directory \`tooltx auth generate\` wrote: console/logins.json (the logins'
                    scrypt hashes), nkeys/<user>.nk (the console acts as the logged-in identity),
                    receipt-keys.json (receipts are checked against them) (required)
  TOOLTX_CONSOLE_PORT  TCP port (default 4290; 0 = any free port, logged in the "listening" line)
  TOOLTX_CONSOLE_HOST  address to bind (default 127.0.0.1)
  TOOLTX_CONSOLE_SESSION_KEY_FILE  key file (>= 32 characters, mode 0600) signing the session
                    cookie (optional; default a random key per process: a restart logs everyone out)
  TOOLTX_CONSOLE_SECURE_COOKIE  on|off (default off): on = the cookie is sent over HTTPS only (set
                    it behind a TLS proxy, named in TOOLTX_CONSOLE_TRUST_PROXY)
  TOOLTX_CONSOLE_REFRESH_MS  how often a live page reads its data again, ms: 500..60000 (default 2000)
  TOOLTX_CONSOLE_AUDITOR_REFRESH_MS  the same for an auditor's pages, never more often than the
                    above: each read is a query the audit log records (default 30000)
  TOOLTX_CONSOLE_LOGINS_PER_MINUTE  login attempts per client address and minute (default 20)
  TOOLTX_CONSOLE_MAX_SESSIONS  logged-in sessions kept at most; past it the least recently used
                    is logged out (default 10000; only a login makes a session)
  TOOLTX_CONSOLE_TRUST_PROXY  off, or the proxies' addresses or CIDRs, comma-separated: a
                    request from one of them counts as the client address it forwards
                    (X-Forwarded-For), for the login limit and in logs (default off)
  TOOLTX_INSTANCE_ID  name of this instance in logs (default host-pid)
  LOG_LEVEL         fatal|error|warn|info|debug|trace|silent (default info)
  TOOLTX_LOG_HMAC_KEY_FILE  key file for the HMAC of error messages in logs (optional)
  TOOLTX_EXIT_WITH_PARENT   pid of the supervisor that started this process (optional)

Exits 2 when it cannot start (a setting, the logins file, the port), naming the setting on stderr
and in a "failed to start" log line. SIGTERM/SIGINT: stops taking requests, answers those in
flight, closes the NATS connections, exit 0.`;

/** A value of a form or query field: empty means absent. */
const field = <T extends z.ZodType>(s: T) => z.preprocess((v) => (v === '' ? undefined : v), s.optional());
/** A time: a duration ago (`30m`, `24h`, `7d`) or ISO-8601, with an offset or in UTC without one. */
const timeSchema = z
  .string()
  .max(40)
  .refine((v) => timeSpecOf(v, Date.now(), { local: 'utc' }) !== null, {
    message: 'a duration ago (30m, 24h, 7d) or an ISO-8601 time (UTC without an offset), from 1970 on',
  });
const CONTRACT = /^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*@[1-9]\d{0,8}$/;
const STATES = [...operationStatuses, 'refused'] as const;

const opsQuerySchema = z.strictObject({
  tenant: field(idSchema),
  contract: field(z.string().regex(CONTRACT, 'a contract name@version, e.g. kb.write_note@1')),
  state: field(z.enum(STATES)),
  since: field(timeSchema),
  until: field(timeSchema),
});
const opParamsSchema = z.strictObject({ tenant: idSchema, operationKey: operationKeySchema });
const loginSchema = z.strictObject({
  _csrf: z.string().max(200),
  login: z.string().min(1).max(130),
  password: z.string().min(1).max(200),
});
const resolveSchema = z
  .strictObject({
    _csrf: z.string().max(200),
    tenant: idSchema,
    operationKey: operationKeySchema,
    outcome: z.enum(['committed', 'not_applied', 'effect_kept', 'undone_by_hand']),
    resourceId: field(z.string().trim().min(1).max(200)),
  })
  .refine((r) => r.outcome !== 'committed' || r.resourceId !== undefined, {
    path: ['resourceId'],
    message: 'the resource id you verified downstream is required to resolve committed',
  });
const logoutSchema = z.strictObject({ _csrf: z.string().max(200) });

/** Parses a request part; an `invalid_input` TooltxError with the field issues otherwise. */
function parsed<S extends z.ZodType>(schema: S, value: unknown): z.infer<S> {
  const r = schema.safeParse(value ?? {});
  if (!r.success)
    throw new TooltxError(ErrorClass.InvalidInput, 'invalid request', {
      // The password is never echoed, not even as a field issue's message.
      issues: fieldIssues(r.error).map((i) => (i.path[0] === 'password' ? { ...i, message: 'invalid' } : i)),
    });
  return r.data;
}

/** How long a request's headers and body may take to arrive, ms. */
const REQUEST_TIMEOUT_MS = 30_000;

/** Headers on every answer: only the console's own script and style, nothing cached or framed. */
function securityHeaders(reply: FastifyReply): void {
  reply.header(
    'content-security-policy',
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
  );
  reply.header('x-content-type-options', 'nosniff');
  reply.header('referrer-policy', 'no-referrer');
  reply.header('cache-control', 'no-store');
}

/**
 * The client's address, as the login limit counts it and the logs name it: the address a trusted
 * proxy forwards when it is one (a port some proxies append is dropped), else the peer's. A
 * forwarded value that is no address counts as the proxy itself: a trusted sender cannot mint a
 * fresh limit per request with junk.
 */
function clientOf(req: FastifyRequest): string {
  const peer = req.socket?.remoteAddress ?? 'unknown';
  const ip = req.ip ?? peer;
  if (isIP(ip)) return ip;
  const withPort = /^\[?([0-9a-fA-F:.]+?)\]?:\d{1,5}$/.exec(ip)?.[1];
  return withPort && isIP(withPort) ? withPort : peer;
}

/** The session cookie's name. */
const SESSION_COOKIE = 'tooltx_console';
/** The login form's CSRF secret, signed, sent only to `/login`. */
const LOGIN_CSRF_COOKIE = 'tooltx_login_csrf';

const HTTP_STATUS: Partial<Record<string, number>> = {
  invalid_input: 400,
  forbidden: 403,
  not_found: 404,
  idempotency_conflict: 409,
  dependency_unavailable: 503,
};

/** ISO-8601 of a time in ms; one no date can show (beyond year 275760) as its number. */
const iso = (ms: number | undefined) =>
  ms === undefined ? '' : Number.isFinite(new Date(ms).getTime()) ? new Date(ms).toISOString() : String(ms);

/** One row of the operations table. */
function rowOf(r: AuditRecord) {
  return {
    operationKey: r.operationKey,
    tenant: r.tenant,
    contract: r.contract,
    status: r.status,
    actor: r.actor,
    sideEffect: r.sideEffect,
    firstAt: iso(r.firstAt),
    takeover: r.takeover?.reason,
    compensationOf: r.compensates,
  };
}

/** The parts of the folded state an operator's timeline shows (no bodies: none are in it). */
function operationView(state: OperationRecord, checked: CheckedReceipt | undefined) {
  const t = state.takeover;
  const c = state.compensation;
  return {
    receipt: checked
      ? {
          valid: checked.valid,
          keyId: checked.receipt.keyId,
          fields: Object.entries(checked.receipt)
            .filter(([k]) => k !== 'signature' && k !== 'keyId')
            .map(([k, v]) => [k, k.endsWith('At') && typeof v === 'number' ? iso(v) : String(v)]),
        }
      : undefined,
    takeover: t
      ? [
          ['reason', t.reason],
          ['opened', iso(t.times.openedAt)],
          ['task', t.taskId],
          ...(t.compensation
            ? [
                ['compensation', t.compensation.operationKey],
                ['how it failed', `${t.compensation.kind}${t.compensation.error ? ` (${t.compensation.error})` : ''}`],
              ]
            : []),
          state.resolution
            ? ['resolved', `${state.resolution.outcome} by ${state.resolution.by} at ${iso(state.resolution.at)}`]
            : ['resolved', 'not yet: open'],
        ]
      : undefined,
    compensation: c
      ? [
          ['operation', c.operationKey],
          ['contract', `${c.tool}@${c.version}`],
          ['asked by', `${c.requestedBy.kind} ${c.requestedBy.id} at ${iso(c.requestedAt)}`],
          ...(c.receipt ? [['receipt', `committed at ${iso(c.receipt.committedAt)}`]] : []),
          ...(c.failure
            ? [
                [
                  'failure',
                  `${c.failure.kind}${c.failure.error ? ` (${c.failure.error.class})` : ''} at ${iso(c.failure.at)}`,
                ],
              ]
            : []),
          ...(c.refusal ? [['refused', `${c.refusal.error.class} at ${iso(c.refusal.at)}`]] : []),
          ...(state.resolution
            ? [['resolved', `${state.resolution.outcome} by ${state.resolution.by} at ${iso(state.resolution.at)}`]]
            : []),
        ]
      : undefined,
  };
}

export interface RunningConsole {
  url: string;
  close(): Promise<void>;
}

/** Builds and starts the console on the configured address. Throws `StartupError` for a setting that cannot work. */
export async function startConsole(config: ConsoleConfig, log: Logger): Promise<RunningConsole> {
  const authDir = resolve(config.TOOLTX_AUTH_DIR);
  let logins: ConsoleLogins;
  const loginsFile = join(authDir, 'console', 'logins.json');
  try {
    logins = consoleLoginsSchema.parse(JSON.parse(readFileSync(loginsFile, 'utf8')));
  } catch (err) {
    throw new StartupError(
      'TOOLTX_AUTH_DIR',
      authDir,
      `${loginsFile} is missing or not a console logins file: run \`tooltx auth generate\` for this deployment`,
      { cause: err },
    );
  }
  let sessionKey: string;
  try {
    sessionKey = config.TOOLTX_CONSOLE_SESSION_KEY_FILE
      ? readKeyFile(config.TOOLTX_CONSOLE_SESSION_KEY_FILE).toString('hex')
      : (await import('node:crypto')).randomBytes(32).toString('hex');
  } catch (err) {
    if (err instanceof SecretFileError)
      throw new StartupError('TOOLTX_CONSOLE_SESSION_KEY_FILE', err.file, err.problem, { cause: err });
    throw err;
  }
  let backend: Backend;
  try {
    backend = new Backend({
      natsUrl: config.NATS_URL,
      authDir,
      subjects: new Subjects(config.TOOLTX_PREFIX),
      log,
      receiptKeysFile: join(authDir, 'receipt-keys.json'),
    });
  } catch (err) {
    throw new StartupError('TOOLTX_AUTH_DIR', authDir, 'receipt-keys.json is missing or not receipt keys', {
      cause: err,
    });
  }
  const views = new ConsoleViews();
  const app = Fastify({
    logger: false,
    bodyLimit: 16 * 1024,
    trustProxy: config.TOOLTX_CONSOLE_TRUST_PROXY,
    // A request (headers and body) must arrive within this: a body trickled in byte by byte would
    // otherwise hold its socket for good (fastify's default is no limit).
    requestTimeout: REQUEST_TIMEOUT_MS,
    // A URL fastify's router refuses (bad percent-encoding, a parameter over its length) gets the
    // console's page and headers like any refusal, not fastify's JSON.
    frameworkErrors: (err, req, res) => {
      const reply = res as FastifyReply;
      const status = err.statusCode && err.statusCode >= 400 && err.statusCode < 500 ? err.statusCode : 400;
      log.info({ class: ErrorClass.InvalidInput, code: err.code, client: clientOf(req) }, 'console request refused');
      securityHeaders(reply);
      reply.code(status);
      void page(reply, 'error', { title: 'Refused', error: { class: ErrorClass.InvalidInput } });
    },
  });
  // An absolute-form request line (`POST http://host/login`) is for proxies; the session plugin does
  // not recognise its path and would leave the request without a session.
  app.addHook('onRequest', async (req) => {
    if (!req.raw.url?.startsWith('/'))
      throw new TooltxError(ErrorClass.InvalidInput, 'request target not in origin form', {
        issues: [{ path: [], code: 'request_target', message: 'the request target must be a path (origin form)' }],
      });
  });
  // A browser says where a request comes from (Fetch Metadata): a write from any other origin — a
  // sibling subdomain or port that could plant cookies included — is refused before its token is
  // looked at. Clients that send no such header rely on the token alone.
  app.addHook('onRequest', async (req) => {
    const site = req.headers['sec-fetch-site'];
    if (req.method !== 'GET' && req.method !== 'HEAD' && site !== undefined && site !== 'same-origin')
      throw new TooltxError(ErrorClass.Forbidden, 'cross-origin write', {
        issues: [{ path: [], code: 'cross_origin', message: 'a write must come from a console page' }],
      });
  });
  const secure = config.TOOLTX_CONSOLE_SECURE_COOKIE === 'on';
  // Its secret signs the login form's CSRF cookie.
  await app.register(fastifyCookie, { secret: sessionKey });
  const SESSION_MS = 8 * 3_600_000;
  await app.register(fastifySession, {
    secret: sessionKey,
    // In memory, bounded, and forgotten once expired: the plugin's own store keeps every session.
    store: new fastifySession.MemoryStore(
      new LRUCache<string, object>({ max: config.TOOLTX_CONSOLE_MAX_SESSIONS, ttl: SESSION_MS }) as unknown as Map<
        string,
        Session
      >,
    ),
    cookieName: SESSION_COOKIE,
    // Stored only once someone has logged in: the login form's CSRF secret lives in a cookie, so
    // nobody without a password can fill the bounded store and log everyone else out.
    saveUninitialized: false,
    cookie: { httpOnly: true, sameSite: 'strict', secure, path: '/', maxAge: SESSION_MS },
  });
  await app.register(fastifyFormbody);
  await app.register(fastifyRateLimit, { global: false, keyGenerator: clientOf });

  app.addHook('onSend', async (_req, reply) => {
    securityHeaders(reply);
  });

  const whoOf = (login: ConsoleLogin) =>
    login.role.kind === 'operator'
      ? { kind: 'operator', login: consoleLoginName(login.role) }
      : { kind: 'auditor', login: consoleLoginName(login.role), tenant: login.role.tenant };
  /** The logged-in person, or null (a session of a login no longer listed counts as none). */
  const loginOf = (req: FastifyRequest): ConsoleLogin | null => {
    const name = (req.session as Session | undefined)?.login;
    return name && Object.hasOwn(logins, name) ? logins[name]! : null;
  };
  const page = (reply: FastifyReply, template: Template, values: Record<string, unknown>) =>
    reply.type('text/html; charset=utf-8').send(views.render(template, values));
  /** A live section alone when the page's script asks for it, else the whole page. */
  const live = (req: FastifyRequest) => req.headers['x-console-live'] === '1';
  const base = (req: FastifyRequest, reply: FastifyReply, login: ConsoleLogin, title: string) => ({
    title,
    who: whoOf(login),
    csrf: reply.generateCsrf(),
    now: new Date().toISOString(),
    // An auditor's every read is recorded in the audit log before it is answered: an open tab
    // polling every 2 s would write ~1,800 records an hour.
    refreshMs:
      login.role.kind === 'auditor'
        ? Math.max(config.TOOLTX_CONSOLE_REFRESH_MS, config.TOOLTX_CONSOLE_AUDITOR_REFRESH_MS)
        : config.TOOLTX_CONSOLE_REFRESH_MS,
    live: live(req),
  });

  app.setErrorHandler(async (err, req, reply) => {
    const csrfFailed = (err as { code?: string }).code?.startsWith('FST_CSRF');
    const limited = (err as { statusCode?: number }).statusCode === 429;
    const code = (err as { statusCode?: number }).statusCode;
    // A request fastify refused before any handler (a body over the limit: 413, one that does not
    // parse: 400, a media type it does not take: 415), or one its client abandoned mid-body
    // (ECONNRESET, 400): the caller's, answered with that status.
    const clientError =
      !limited && !(err instanceof TooltxError) && code !== undefined && code >= 400 && code < 500 ? code : undefined;
    const info: ErrorInfo = csrfFailed
      ? {
          class: ErrorClass.Forbidden,
          issues: [{ path: ['_csrf'], code: 'csrf', message: 'the form is stale: reload the page' }],
        }
      : limited
        ? { class: ErrorClass.QuotaExceeded, retryAfterMs: 60_000 }
        : err instanceof TooltxError
          ? toErrorInfo(err)
          : (err as { validation?: unknown }).validation || clientError !== undefined
            ? { class: ErrorClass.InvalidInput }
            : toErrorInfo(err);
    const status = csrfFailed ? 403 : limited ? 429 : (clientError ?? HTTP_STATUS[info.class] ?? 500);
    const where = { method: req.method, route: req.routeOptions.url, client: clientOf(req) };
    if (status >= 500) log.error({ err, ...where }, 'console request failed');
    else log.info({ class: info.class, ...where }, 'console request refused');
    reply.code(status);
    const shown = info.class === ErrorClass.Internal ? { class: ErrorClass.Internal } : info;
    // No way back to the page that was itself refused (an operator without the grant `query`).
    const back = req.routeOptions.url !== '/operations';
    return page(reply, 'error', { title: 'Refused', error: shown, back, ...loggedInOf(req, reply) });
  });
  /** The logged-in person and a logout form's token for a page outside the pages' own scope, or nothing. */
  const loggedInOf = (req: FastifyRequest, reply: FastifyReply) => {
    const login = loginOf(req);
    if (!login) return {};
    // Outside the pages' scope (the login form's signs its tokens with another secret; an unknown
    // path has none) no logout form could carry a token the logout would take: none is shown.
    if (req.routeOptions.url === '/login' || typeof reply.generateCsrf !== 'function') return { who: whoOf(login) };
    return { who: whoOf(login), csrf: reply.generateCsrf() };
  };
  // An unknown path: the same page as any refusal, not fastify's JSON.
  app.setNotFoundHandler(async (req, reply) => {
    reply.code(404);
    const error: ErrorInfo = {
      class: ErrorClass.NotFound,
      issues: [{ path: [], code: 'not_found', message: 'no such page' }],
    };
    return page(reply, 'error', { title: 'Not found', error, back: true, ...loggedInOf(req, reply) });
  });

  app.get('/healthz', async () => ({ ok: true }));
  app.get('/static/console.css', async (_req, reply) => reply.type('text/css; charset=utf-8').send(CONSOLE_CSS));
  app.get('/static/console.js', async (_req, reply) => reply.type('text/javascript; charset=utf-8').send(CONSOLE_JS));

  // The login form: its CSRF secret in a signed cookie of its own (double submit), so a visitor
  // holds no stored session before logging in (OWASP CSRF cheat sheet, "signed double-submit").
  await app.register(async (scope) => {
    await scope.register(fastifyCsrf, {
      sessionPlugin: '@fastify/cookie',
      cookieKey: LOGIN_CSRF_COOKIE,
      cookieOpts: { httpOnly: true, sameSite: 'strict', secure, path: '/login', signed: true },
    });
    scope.get('/login', async (req, reply) => {
      if (loginOf(req)) return reply.redirect('/operations', 303);
      return page(reply, 'login', { title: 'Log in', csrf: reply.generateCsrf() });
    });
    scope.post(
      '/login',
      {
        config: { rateLimit: { max: config.TOOLTX_CONSOLE_LOGINS_PER_MINUTE, timeWindow: 60_000 } },
        preHandler: scope.csrfProtection,
      },
      async (req, reply) => {
        const body = parsed(loginSchema, req.body);
        const login = await verifyConsoleLogin(logins, body.login, body.password);
        if (!login) {
          // Not the name typed: a password typed into the wrong field would land in the log.
          log.warn({ knownLogin: Object.hasOwn(logins, body.login), client: clientOf(req) }, 'console login refused');
          reply.code(401);
          return page(reply, 'login', { title: 'Log in', failed: true, csrf: reply.generateCsrf() });
        }
        // A Secure cookie is never set on a request that did not come over HTTPS (@fastify/session):
        // the login would look done and hold nothing. Say so instead.
        if (secure && req.protocol !== 'https')
          throw new TooltxError(ErrorClass.InvalidInput, 'login over http with secure cookies', {
            issues: [
              {
                path: [],
                code: 'https_required',
                message:
                  'this console sends its cookie over HTTPS only: log in through the TLS proxy (it must send X-Forwarded-Proto: https)',
              },
            ],
          });
        // A new session id at login: one known before it (fixation) is worthless after.
        await req.session.regenerate();
        req.session.login = body.login;
        log.info({ login: body.login, kind: login.role.kind, client: clientOf(req) }, 'console login');
        reply.clearCookie(LOGIN_CSRF_COOKIE, { path: '/login' });
        return reply.redirect('/operations', 303);
      },
    );
  });

  /** The pages behind a login, on `app`: a scope whose forms' CSRF secret is in the session. */
  const pages = (app: FastifyInstance) => {
    const required = async (req: FastifyRequest, reply: FastifyReply) => {
      if (!loginOf(req)) {
        if (live(req)) return reply.code(401).send('');
        return reply.redirect('/login', 303);
      }
    };
    const operatorOnly = (login: ConsoleLogin) => {
      if (login.role.kind !== 'operator')
        throw new TooltxError(ErrorClass.Forbidden, 'operators only', {
          issues: [{ path: [], code: 'operators_only', message: 'auditors read; only an operator may act' }],
        });
    };

    app.post('/logout', { preHandler: [required, app.csrfProtection] }, async (req, reply) => {
      parsed(logoutSchema, req.body);
      await req.session.destroy();
      reply.clearCookie(SESSION_COOKIE, { path: '/' });
      return reply.redirect('/login', 303);
    });

    app.get('/', { preHandler: required }, async (_req, reply) => reply.redirect('/operations', 303));

    app.get('/operations', { preHandler: required }, async (req, reply) => {
      const login = loginOf(req)!;
      const q = parsed(opsQuerySchema, req.query);
      const now = Date.now();
      const filter: OpsFilter = {
        tenant: login.role.kind === 'auditor' ? login.role.tenant : q.tenant,
        contract: q.contract,
        state: q.state,
        since: q.since === undefined ? undefined : (timeSpecOf(q.since, now, { local: 'utc' }) ?? undefined),
        until: q.until === undefined ? undefined : (timeSpecOf(q.until, now, { local: 'utc' }) ?? undefined),
      };
      // Newest first: the records come oldest first.
      const rows = (await backend.operations(login, filter)).map(rowOf).reverse();
      const values = {
        ...base(req, reply, login, 'Operations'),
        filter: q,
        states: STATES,
        rows,
        maxRows: MAX_ROWS,
      };
      return page(reply, live(req) ? 'ops-live' : 'operations', values);
    });

    app.get('/operations/:tenant/:operationKey', { preHandler: required }, async (req, reply) => {
      const login = loginOf(req)!;
      const p = parsed(opParamsSchema, req.params);
      const notice = parsed(z.object({ resolved: field(z.enum(['1'])) }).loose(), req.query).resolved
        ? 'Resolution recorded.'
        : undefined;
      const [record, op] = await Promise.all([
        backend.record(login, p.tenant, p.operationKey),
        backend.operation(login, p.tenant, p.operationKey),
      ]);
      if (!record && !op)
        throw new TooltxError(ErrorClass.NotFound, 'no such operation', {
          issues: [
            { path: ['operationKey'], code: 'not_found', message: 'no operation with this key that you may see' },
          ],
        });
      const values = {
        ...base(req, reply, login, 'Operation'),
        tenant: p.tenant,
        operationKey: p.operationKey,
        notice,
        record: record
          ? {
              ...record,
              states: record.states.map((s) => ({ ...s, at: iso(s.at) })),
              decisions: record.decisions.map((d) => ({ ...d, at: iso(d.at) })),
            }
          : null,
        recordJson: record ? JSON.stringify(record, null, 2) : '',
        op: op ? operationView(op.state, op.receipt) : undefined,
      };
      return page(reply, live(req) ? 'op-live' : 'operation', values);
    });

    app.get('/takeovers', { preHandler: required }, async (req, reply) => {
      const login = loginOf(req)!;
      operatorOnly(login);
      const rows = (await backend.takeovers(login)).map((t) => ({
        operationKey: t.operationKey,
        tenant: t.tenant,
        contract: `${t.tool}@${t.version}`,
        status: t.status,
        reason: t.reason,
        openedAt: iso(t.times.openedAt),
      }));
      const values = { ...base(req, reply, login, 'Takeovers'), rows };
      return page(reply, live(req) ? 'takeovers-live' : 'takeovers', values);
    });

    app.get('/contracts', { preHandler: required }, async (req, reply) => {
      const login = loginOf(req)!;
      operatorOnly(login);
      const rows = (await backend.contracts(login)).map((v) => ({
        ...v,
        sunset: v.sunsetAt === undefined ? '' : iso(v.sunsetAt),
        lastSeen: iso(v.lastSeenAt),
        ratio: `${Math.round(v.usage.ratio * 100)} %`,
      }));
      const values = { ...base(req, reply, login, 'Contracts'), rows };
      return page(reply, 'contracts', values);
    });

    app.post('/takeovers/resolve', { preHandler: [required, app.csrfProtection] }, async (req, reply) => {
      const login = loginOf(req)!;
      operatorOnly(login);
      const r = parsed(resolveSchema, req.body);
      await backend.resolve(login, r);
      return reply.redirect(`/operations/${r.tenant}/${r.operationKey}?resolved=1`, 303);
    });
  };
  await app.register(async (scope) => {
    await scope.register(fastifyCsrf, { sessionPlugin: '@fastify/session' });
    pages(scope);
  });

  await app.listen({ port: config.TOOLTX_CONSOLE_PORT, host: config.TOOLTX_CONSOLE_HOST }).catch((err: unknown) => {
    throw new StartupError(
      'TOOLTX_CONSOLE_PORT',
      String(config.TOOLTX_CONSOLE_PORT),
      `cannot listen on ${config.TOOLTX_CONSOLE_HOST}:${config.TOOLTX_CONSOLE_PORT} (${(err as NodeJS.ErrnoException).code ?? 'error'})`,
      { cause: err },
    );
  });
  const address = app.server.address() as AddressInfo;
  const host = address.family === 'IPv6' ? `[${address.address}]` : address.address;
  return {
    url: `http://${host}:${address.port}`,
    async close() {
      await app.close();
      await backend.close();
    },
  };
}

/** `tooltx console` and `services/console/src/main.ts`: reads the environment, starts, drains on SIGTERM. */
export async function runConsole(argv: string[]): Promise<void> {
  usageErrorsExitTwo(new Command(argv[1] ?? 'console'))
    .description(
      'the console: web pages for operators and auditors (operations by state, timelines, takeovers), acting as the logged-in identity',
    )
    .addHelpText('after', CONSOLE_ENV_HELP)
    .parse(argv);
  const who: StartupReporter = { program: 'console', service: 'console', instance: `console-${process.pid}` };
  let config: ConsoleConfig;
  let log: Logger;
  try {
    config = loadConfig(consoleConfigSchema);
    try {
      log = createLogger({
        service: 'console',
        instance: config.TOOLTX_INSTANCE_ID,
        level: config.LOG_LEVEL,
        hmacKeyFile: config.TOOLTX_LOG_HMAC_KEY_FILE,
      });
    } catch (err) {
      throw err instanceof SecretFileError
        ? new StartupError('TOOLTX_LOG_HMAC_KEY_FILE', err.file, err.problem, { cause: err })
        : err;
    }
  } catch (err) {
    failStartup(who, err);
  }
  who.log = log;
  exitWithParent(log, config.TOOLTX_EXIT_WITH_PARENT);
  installProcessHandlers(log);
  let running: RunningConsole;
  try {
    running = await startConsole(config, log);
  } catch (err) {
    failStartup(who, err);
  }
  log.info({ url: running.url }, 'listening');
  announceReady({ port: Number(new URL(running.url).port) });
  let stopping = false;
  const stop = (signal: string) => {
    if (stopping) return;
    stopping = true;
    log.info({ signal }, 'stopping: draining');
    running.close().then(
      () => {
        log.info('stopped');
        process.exit(0);
      },
      (err: unknown) => {
        log.error({ err }, 'stop failed');
        process.exit(1);
      },
    );
  };
  process.once('SIGTERM', () => stop('SIGTERM'));
  process.once('SIGINT', () => stop('SIGINT'));
}
