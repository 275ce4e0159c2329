import { randomBytes } from 'node:crypto';
import pino, { type Logger, type LoggerOptions } from 'pino';
import { JetStreamApiError, JetStreamError } from '@nats-io/jetstream';
import { errors as natsErrors } from '@nats-io/transport-node';
import { keyedDigest, readKeyFile } from './secrets.js';

export type { Logger } from 'pino';

/**
 * The one pino set-up of every tooltx process — services, the KB storage service, `npm start`, the
 * demo (FM-16: no planted credential or body in any log).
 *
 * What never reaches a log line:
 * - a value under a key named like a credential, cookie, authorisation header, body, page text,
 *   input or result ({@link isSensitiveKey}), at any depth, in the line and in child bindings;
 * - a part of a string that looks like a credential ({@link scrubString}), wherever it is;
 * - an error's message: every `Error`, at any depth, is reduced by {@link safeError} to its class
 *   name, tooltx class, code, HTTP status and an HMAC of its message (so equal messages can be
 *   matched across lines and processes sharing the key, and one can be confirmed by someone who
 *   holds both the key and the text — never read back);
 * - printf-style arguments (`log.info('x %s', v)` logs `x %s`), and an error's message taken as
 *   the line's `msg` (pino does that for `log.error(err)` and `log.error({ err })`).
 */

/** Key names (lower case, letters and digits only) whose values are removed whole. */
const SENSITIVE_NAMES = new Set([
  // Credentials.
  'pwd',
  'pin',
  'otp',
  'ssn',
  'cvv',
  'cvc',
  'auth',
  'creds',
  'seed',
  'nkey',
  'jwt',
  'session',
  'sessionid',
  // Content: bodies, pages, inputs and results.
  'body',
  'text',
  'page',
  'pages',
  'html',
  'markdown',
  'content',
  'input',
  'inputs',
  'result',
  'results',
  'headers',
  'rawheaders',
  'excerpt',
  'note',
  'notes',
  'data',
  'payload',
]);
/** Parts of a key name (lower case, letters and digits only) that make it a credential's wherever they occur. */
const SENSITIVE_PARTS = [
  'password',
  'passwd',
  'passphrase',
  'token',
  'secret',
  'apikey',
  'privatekey',
  'credential',
  'cookie',
  'authorization',
  'bearer',
  'cardnumber',
  'accesskey',
];

/**
 * Whether the value under key `k` is removed whole (replaced by `[redacted]`): its name, in lower
 * case with everything but letters and digits dropped (`X-Auth-Token`, `api_key`, `Set-Cookie `
 * and `token` with a zero-width space alike), is one of the content or short credential names, or
 * contains a credential's (`authToken`, `aws_secret_access_key`, `private-key`).
 */
export function isSensitiveKey(k: string): boolean {
  const n = k.toLowerCase().replace(/[^a-z0-9]/g, '');
  return SENSITIVE_NAMES.has(n) || SENSITIVE_PARTS.some((p) => n.includes(p));
}

/**
 * Parts of any string that are credentials, whatever key they sit under ({@link scrubString}): an
 * authorisation scheme and its credential (`Bearer …`, `basic …`, `Token …`, any case), a
 * `name=value`, or a `name: value` of 8 characters or more, whose name is a credential's
 * (`password=…`, `access_token=…` in a URL; not the prose of "no token: any caller"), and JSON
 * Web Tokens — in any case; nkey seeds (also run into other characters) and the key
 * formats of common providers (AWS access key ids, GitHub, Slack, `sk-…`) — as they are written.
 */
const SECRET_ANY_CASE = new RegExp(
  [
    String.raw`\b(?:bearer|basic|token|digest)\s+[A-Za-z0-9._~+/=-]{8,}`,
    String.raw`\b(?:pass(?:word|wd|phrase)?|pwd|secret|client_?secret|token|access_?token|refresh_?token|id_?token|api[_-]?key|private[_-]?key|auth)(?:\s*=\s*[^\s&"',;]+|\s*:\s*[^\s&"',;]{8,})`,
    String.raw`\beyJ[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]{6,}`,
  ].join('|'),
  'gi',
);
const SECRET_AS_WRITTEN = new RegExp(
  [
    '(?<![A-Z2-7])S[UANOCPX][A-Z2-7]{56}(?![A-Z2-7])',
    String.raw`\b(?:AKIA|ASIA)[0-9A-Z]{16}\b`,
    String.raw`\bgh[oprsu]_[A-Za-z0-9]{20,}`,
    String.raw`\bxox[abpors]-[A-Za-z0-9-]{10,}`,
    String.raw`\b(?:sk|pk|rk)-[A-Za-z0-9_-]{16,}`,
  ].join('|'),
  'g',
);

/** `s` with every part that looks like a credential replaced by `[redacted]`. */
export function scrubString(s: string): string {
  return s.replace(SECRET_ANY_CASE, CENSOR).replace(SECRET_AS_WRITTEN, CENSOR);
}

export const CENSOR = '[redacted]';
const MAX_DEPTH = 8;

/** Options of {@link createLogger}. */
export interface LoggerSetup {
  service: string;
  instance: string;
  /** pino level (default `info`). */
  level?: string;
  /**
   * Key file for the HMAC of error messages (`TOOLTX_LOG_HMAC_KEY_FILE`). Without one, a random
   * key per process: the HMACs are still irreversible, but only comparable within the process.
   * Throws `SecretFileError` when the file is given but unusable.
   */
  hmacKeyFile?: string | undefined;
  /** Where lines go (default stdout, see {@link stdoutDestination}); tests pass a stream they read. */
  destination?: pino.DestinationStream;
}

/**
 * The logger of a process: JSON lines on stdout, level from config, `service` and `instance` on
 * every line, ISO times, and everything above removed before a line is written.
 */
export function createLogger(opts: LoggerSetup): Logger {
  const key = opts.hmacKeyFile ? readKeyFile(opts.hmacKeyFile) : randomBytes(32);
  const scrub = scrubber(key);
  const options: LoggerOptions = {
    level: opts.level ?? 'info',
    base: { service: opts.service, instance: opts.instance },
    formatters: { log: (o) => scrub(o) as Record<string, unknown> },
    // The formatter has already reduced every error; pino's default `err` serializer would reshape it.
    serializers: { err: (v: unknown) => v },
    hooks: {
      logMethod(args, method) {
        const [first, second] = args as unknown[];
        // An Error as the first argument: pino would log its message as `msg`.
        if (first instanceof Error)
          return method.apply(this, [{ err: first }, typeof second === 'string' ? second : 'error']);
        if (typeof first === 'string') return method.apply(this, [scrubString(first)]);
        if (first && typeof first === 'object') {
          // `log.error({ err })` without a message: pino would take the error's message.
          const msg = typeof second === 'string' ? scrubString(second) : 'err' in first ? 'error' : undefined;
          return method.apply(this, (msg === undefined ? [first] : [first, msg]) as never);
        }
        return method.apply(this, args.slice(0, 1) as never);
      },
    },
    timestamp: pino.stdTimeFunctions.isoTime,
  };
  const root = pino(options, opts.destination ?? stdoutDestination());
  // pino applies no formatter to child bindings: scrub them on the way in. Children are created
  // from their parent's prototype, so every descendant's `child` is this one.
  const child = root.child;
  root.child = function (this: Logger, bindings, childOpts) {
    return child.call(this, scrub(bindings) as typeof bindings, childOpts);
  } as Logger['child'];
  return root;
}

/** Longest a write waits for a full pipe (EAGAIN: its reader is slow) before the process goes on, ms. */
const BLOCKED_WRITE_MS = 2_000;
/** Most bytes queued for a pipe whose reader does not keep up; later lines are dropped. */
const MAX_QUEUED_BYTES = 16 * 1024 * 1024;

/**
 * stdout (fd 1) as a log destination that never keeps a process from stopping (why:
 * an orphaned KB whose supervisor had been killed ignored SIGTERM for good).
 *
 * pino's default destination writes asynchronously and registers a synchronous flush for process
 * exit; sonic-boom 4.2.1's `flushSync` retries EVERY error code, EPIPE included, every 100 ms
 * forever — so a process whose stdout pipe had lost its reader hung inside `process.exit()`, past
 * every grace timer. Here:
 * - writes are synchronous (`sync: true`): a line is written before the call returns, nothing is
 *   left to flush at exit, and no exit-time flush is registered;
 * - a broken pipe (EPIPE) or any other write error but EAGAIN/EBUSY ends logging for the process
 *   (pino's own handler does that for EPIPE; ours for the rest — an unhandled `error` would throw);
 * - a full pipe (EAGAIN/EBUSY) is retried for at most {@link BLOCKED_WRITE_MS} ms after the first
 *   such error, then the line stays queued and the process goes on (the queue is written with the
 *   next line; beyond {@link MAX_QUEUED_BYTES} lines are dropped).
 */
export function stdoutDestination(fd = 1): pino.DestinationStream {
  let blockedSince = 0;
  const dest = pino.destination({
    dest: fd,
    sync: true,
    minLength: 0,
    maxLength: MAX_QUEUED_BYTES,
    retryEAGAIN: () => {
      const now = Date.now();
      if (blockedSince === 0) blockedSince = now;
      return now - blockedSince < BLOCKED_WRITE_MS;
    },
  });
  dest.on('write', () => (blockedSince = 0));
  dest.on('error', (err: NodeJS.ErrnoException) => {
    if (err.code === 'EAGAIN' || err.code === 'EBUSY') return;
    // Nowhere to write any more: later lines go nowhere instead of throwing or retrying.
    dest.write = () => true;
    dest.flushSync = () => undefined;
  });
  return dest;
}

/**
 * A function that copies a log object with every sensitive key censored, every error reduced by
 * {@link safeError} under `key`, and credential-looking strings censored. Exported for tests.
 */
export function scrubber(key: Buffer): (value: unknown) => unknown {
  const walk = (v: unknown, depth: number, seen: WeakSet<object>): unknown => {
    if (typeof v === 'string') return scrubString(v);
    if (v === null || typeof v !== 'object') return v;
    if (v instanceof Error) return safeError(v, key);
    if (seen.has(v) || depth > MAX_DEPTH) return '[elided]';
    seen.add(v);
    if (Array.isArray(v)) return v.map((x) => walk(x, depth + 1, seen));
    if (v instanceof Uint8Array || v instanceof ArrayBuffer) return `[${v.byteLength} bytes]`;
    if (v instanceof Date) return v.toISOString();
    if (v instanceof Map || v instanceof Set) return `[${v.constructor.name} of ${v.size}]`;
    const out: Record<string, unknown> = {};
    for (const [k, x] of Object.entries(v)) out[k] = isSensitiveKey(k) ? CENSOR : walk(x, depth + 1, seen);
    return out;
  };
  return (v) => walk(v, 0, new WeakSet());
}

/**
 * Our own infrastructure errors, whose messages are written by tooltx and never quote a downstream
 * or an input. A `TooltxError` is not among them: implementations write its message, often around
 * a downstream's answer; its class and issue paths say what went wrong.
 */
const OWN_ERRORS = new Set([
  'ConfigError',
  'ConcurrencyError',
  'StreamConfigError',
  'SecretFileError',
  'ProjectionCorruptError',
  'StartupError',
  'ToolsModuleError',
]);
/** The NATS client's errors: their messages name subjects, codes and server answers, never a payload. */
const NATS_ERRORS: (new (...args: never[]) => Error)[] = [
  ...Object.values(natsErrors),
  JetStreamApiError,
  JetStreamError,
] as never;
const CODE = /^[A-Za-z0-9_.:-]{1,64}$/;

/**
 * An error reduced to what is safe to log: `type` (class name), `class` (tooltx error class),
 * `code`, `status` (HTTP), `messageHmac` (HMAC-SHA256 of the message under `key`, purpose
 * `log-error-message`) and the same for its `cause`, three levels deep. tooltx's own error types
 * and the NATS client's keep their message (written by us or the client, never quoting a body).
 * Without `key`, a random one.
 */
export function safeError(err: unknown, key: Buffer = fallbackKey(), depth = 0): Record<string, unknown> {
  if (!(err instanceof Error)) return { type: typeof err };
  const e = err as Error & {
    class?: unknown;
    code?: unknown;
    status?: unknown;
    statusCode?: unknown;
    errorClass?: unknown;
    cause?: unknown;
  };
  const out: Record<string, unknown> = { type: e.name };
  if (typeof e.class === 'string' && CODE.test(e.class)) out.class = e.class;
  if (typeof e.errorClass === 'string' && CODE.test(e.errorClass)) out.class ??= e.errorClass;
  if ((typeof e.code === 'string' && CODE.test(e.code)) || typeof e.code === 'number') out.code = e.code;
  const status = typeof e.status === 'number' ? e.status : typeof e.statusCode === 'number' ? e.statusCode : undefined;
  if (status !== undefined) out.status = status;
  const issues = (e as { issues?: unknown }).issues;
  if (Array.isArray(issues))
    out.issues = issues.slice(0, 10).map((i: { path?: unknown; code?: unknown }) => ({
      path: Array.isArray(i?.path) ? i.path.map(String).slice(0, 8) : [],
      code: typeof i?.code === 'string' && CODE.test(i.code) ? i.code : '?',
    }));
  if (OWN_ERRORS.has(e.name) || NATS_ERRORS.some((c) => e instanceof c)) out.message = e.message;
  else if (e.message) out.messageHmac = keyedDigest(key, 'log-error-message', e.message);
  if (e.cause !== undefined && depth < 3) out.cause = safeError(e.cause, key, depth + 1);
  return out;
}

let fallback: Buffer | undefined;
function fallbackKey(): Buffer {
  return (fallback ??= randomBytes(32));
}

/**
 * Replaces Node's default report of an uncaught exception or unhandled rejection (which prints the
 * error's message and stack on stderr) with one fatal log line through `log`, then exits 1.
 */
export function installProcessHandlers(log: Logger): void {
  const die = (kind: string) => (err: unknown) => {
    log.fatal({ err }, kind);
    log.flush?.();
    process.exit(1);
  };
  process.on('uncaughtException', die('uncaught exception'));
  process.on('unhandledRejection', die('unhandled rejection'));
}
