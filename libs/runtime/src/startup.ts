import { existsSync, mkdirSync, statSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { createLogger, type Logger } from './logger.js';
import { ConfigError, showValue } from './config.js';

/**
 * Start-up failures named for the operator. Error messages are kept out of logs
 * on purpose (logger.ts, FM-16), so a process that could not start used to log only
 * `ENOENT` and an HMAC. A failure to START is the operator's own configuration: the process says
 * which setting (environment variable or flag), its value and the problem — on stderr in one line,
 * and in one structured `fatal` line (`msg: "failed to start"`, `setting`, `value`, `problem`).
 *
 * What a value may be: a path, a port, a host, a prefix, a module path. Never a file's content (a
 * seed, a key, a token), and a URL only without its user-info ({@link displayUrl}). The problem is
 * written from the error's code ({@link describeError}), not copied from its message.
 */
export class StartupError extends Error {
  /** The environment variable or flag, e.g. `TOOLTX_TOOLS_MODULE`, `--kb-port`. */
  readonly setting: string;
  /** The value as shown to the operator (no secrets), or undefined when it is not shown. */
  readonly value: string | undefined;
  /** What is wrong, in words (e.g. `no such file or directory`). */
  readonly problem: string;
  /** The environment variable a flag falls back to (`--port` → `NATS_PORT`). */
  readonly env: string | undefined;
  /** The underlying error's code (`ENOENT`, `EADDRINUSE`, …), when it has one. */
  readonly code: string | undefined;
  constructor(
    setting: string,
    value: string | undefined,
    problem: string,
    opts: { cause?: unknown; env?: string } = {},
  ) {
    super(
      `${showSetting(setting, value, opts.env)}: ${problem}`,
      opts.cause === undefined ? undefined : { cause: opts.cause },
    );
    this.name = 'StartupError';
    this.setting = setting;
    this.value = value;
    this.problem = problem;
    this.env = opts.env;
    this.code = codeOf(opts.cause);
  }
}

/**
 * A failure to start that is no one setting's (a process of a stack that exited or hung before it
 * was ready), in tooltx's own words: its message names the cause and quotes nothing from outside
 * (no error message, no file content), so {@link failStartup} prints it as it is.
 */
export class StartupFailure extends Error {
  constructor(message: string, opts: { cause?: unknown } = {}) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = 'StartupFailure';
  }
}

/** The message a process sends its supervisor over the IPC channel once it is ready ({@link announceReady}). */
export interface ReadyMessage {
  tooltx: 'ready';
  /** The TCP port it listens on, for a process that listens (the KB). */
  port?: number;
}

/**
 * Tells the supervisor that started this process with an IPC channel (`npm start`, the demo:
 * dev/src/stack.ts) that it is ready, then closes the channel. Readiness travels apart
 * from the logs, so it does not depend on LOG_LEVEL (at `LOG_LEVEL=warn` the
 * `started` and `listening` lines a supervisor waited for never came). No channel: nothing happens.
 */
export function announceReady(fields: Omit<ReadyMessage, 'tooltx'> = {}): void {
  if (!process.send || !process.connected) return;
  const message: ReadyMessage = { tooltx: 'ready', ...fields };
  try {
    process.send(message, undefined, {}, () => {
      // Nothing more goes this way: an open channel would only hold a handle.
      if (process.connected) process.disconnect();
    });
  } catch {
    // the supervisor is gone: it waits for nothing any more
  }
}

/** `NAME=value`, or `--flag value (env NAME)` for a flag. */
function showSetting(setting: string, value: string | undefined, env: string | undefined): string {
  const shown =
    value === undefined
      ? setting
      : setting.startsWith('--')
        ? `${setting} ${showValue(value)}`
        : `${setting}=${showValue(value)}`;
  return env ? `${shown} (or env ${env})` : shown;
}

function codeOf(err: unknown): string | undefined {
  const code = (err as { code?: unknown } | undefined)?.code;
  if (typeof code === 'string' && /^[A-Za-z0-9_.:-]{1,64}$/.test(code)) return code;
  const cause = (err as { cause?: unknown } | undefined)?.cause;
  return cause !== undefined && cause !== err ? codeOf(cause) : undefined;
}

const PHRASES: Record<string, string> = {
  ENOENT: 'no such file or directory',
  EACCES: 'permission denied',
  EPERM: 'operation not permitted',
  EISDIR: 'is a directory, not a file',
  ENOTDIR: 'a part of the path is not a directory',
  EROFS: 'read-only file system',
  EEXIST: 'already exists',
  EADDRINUSE: 'the port is already in use: another process listens on it',
  EADDRNOTAVAIL: "the address is not one of this host's",
  ENOTFOUND: 'the host name does not resolve',
  EAI_AGAIN: 'the host name does not resolve: temporary DNS failure',
  ECONNREFUSED: 'connection refused: nothing listens there',
  ECONNRESET: 'the connection was reset',
  ETIMEDOUT: 'timed out',
  EHOSTUNREACH: 'host unreachable',
  ENETUNREACH: 'network unreachable',
  ERR_INVALID_URL: 'not a valid URL',
  SQLITE_CANTOPEN: 'cannot open the database file',
  SQLITE_NOTADB: 'the file is not a SQLite database',
  SQLITE_READONLY: 'the database is read-only',
  SQLITE_BUSY: 'the database is locked by another process',
};

/**
 * The problem an error stands for, from its code (its own or its cause's): `no such file or
 * directory (ENOENT)`. Without a known code, its class and code — never its message, which may
 * quote anything (logger.ts).
 */
export function describeError(err: unknown): string {
  const code = codeOf(err);
  if (code && PHRASES[code]) return `${PHRASES[code]} (${code})`;
  const type = err instanceof Error ? err.name : typeof err;
  return code ? `${type} (${code})` : type;
}

/** Why a connection to NATS failed: the client's own words for its errors, the code for a socket's. */
export function describeConnectError(err: unknown): string {
  const code =
    (err as { cause?: { code?: unknown } } | undefined)?.cause?.code ?? (err as { code?: unknown } | undefined)?.code;
  if (typeof code === 'string' && /^E[A-Z_]+$/.test(code)) return describeError(err);
  return err instanceof Error && isNatsError(err) ? err.message : describeError(err);
}

const NATS_ERROR_NAMES = new Set([
  'ConnectionError',
  'AuthorizationError',
  'ProtocolError',
  'TimeoutError',
  'RequestError',
  'PermissionViolationError',
  'UserAuthenticationExpiredError',
  'InvalidArgumentError',
  'InvalidOperationError',
  'ClosedConnectionError',
  'NoRespondersError',
  'JetStreamApiError',
  'JetStreamError',
  'JetStreamNotEnabled',
]);
/** An error of the NATS client (its message names subjects, codes and server answers, never a payload). */
export function isNatsError(err: Error): boolean {
  return NATS_ERROR_NAMES.has(err.name);
}

export { displayUrl } from '@tooltx/nats';

/**
 * Runs one start-up step; a failure becomes a {@link StartupError} naming `setting` and `value`
 * (the problem from `describe`, default {@link describeError}). A StartupError or ConfigError
 * thrown inside passes through unchanged.
 */
export async function startupStep<T>(
  setting: string,
  value: string | undefined,
  step: () => T | Promise<T>,
  describe: (err: unknown) => string = describeError,
): Promise<T> {
  try {
    return await step();
  } catch (err) {
    if (err instanceof StartupError || err instanceof ConfigError) throw err;
    throw new StartupError(setting, value, describe(err), { cause: err });
  }
}

/** Who reports: the program name on stderr (`tooltx-authorizer`), and its log identity. */
export interface StartupReporter {
  program: string;
  service: string;
  instance: string;
  /** The process's logger, once it has one; before that a default one writes the line. */
  log?: Logger | undefined;
}

/**
 * Reports a failure to start and exits 2: on stderr, `<program>: cannot start: <setting>=<value>:
 * <problem>` (one line; a {@link ConfigError}: `<program>: invalid configuration: …`, several
 * problems one per line), and one `fatal` log line `failed to start` with `setting`, `value`, `problem` (a
 * ConfigError: `setting` = its first, `settings` and `problems` = all). An error that is neither a
 * StartupError nor a ConfigError is not a setting: a {@link StartupFailure} says `failed to start:
 * <its message>` (stderr and `problem`); any other is logged as any error (class, code, HMAC of its
 * message) and stderr says `failed to start: <class> (<code>)`.
 */
export function failStartup(who: StartupReporter, err: unknown): never {
  let text: string;
  let fields: Record<string, unknown>;
  if (err instanceof StartupError) {
    text = `cannot start: ${err.message}`;
    fields = {
      setting: err.setting,
      ...(err.env ? { env: err.env } : {}),
      ...(err.value !== undefined ? { value: err.value } : {}),
      problem: err.problem,
      err,
    };
  } else if (err instanceof StartupFailure) {
    text = `failed to start: ${err.message}`;
    fields = { problem: err.message, err };
  } else if (err instanceof ConfigError) {
    text = err.problems.length === 1 ? `invalid configuration: ${err.problems[0]}` : err.message;
    fields = {
      setting: err.settings[0],
      ...(err.values[0] !== undefined ? { value: err.values[0] } : {}),
      settings: err.settings,
      problems: err.problems,
    };
  } else {
    text = `failed to start: ${describeError(err)}`;
    fields = { err };
  }
  try {
    process.stderr.write(`${who.program}: ${text}\n`);
  } catch {
    // stderr gone: the log line is all there is
  }
  try {
    const log = who.log ?? createLogger({ service: who.service, instance: who.instance });
    log.fatal(fields, 'failed to start');
    log.flush?.();
  } catch {
    // nowhere to write
  }
  process.exit(2);
}

/**
 * `mkdir -p` that fails instead of hanging: creates each missing directory of `dir` in turn (each
 * with `mode`) and returns the first one it created (undefined when `dir` existed), like
 * `mkdirSync(dir, { recursive: true })`. Node 20's recursive mkdir never returns for a path under a
 * pseudo-filesystem that answers ENOENT for the parent it just "created" (`/proc/x`); one level at
 * a time, the same path fails at once with ENOENT. Throws the file system's error (ENOENT,
 * EACCES, ENOTDIR, EROFS, …).
 */
export function makeDirs(dir: string, mode = 0o777): string | undefined {
  const abs = resolve(dir);
  const missing: string[] = [];
  for (let p = abs; !existsSync(p); p = dirname(p)) {
    missing.unshift(p);
    if (dirname(p) === p) break;
  }
  for (const p of missing) mkdirSync(p, { mode });
  if (!statSync(abs).isDirectory())
    throw Object.assign(new Error(`ENOTDIR: not a directory, mkdir '${abs}'`), { code: 'ENOTDIR' });
  return missing[0];
}
