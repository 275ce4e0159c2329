/**
 * What every `tooltx` command shares about failing clearly: a usage error (a bad flag, variable or
 * file the user named: exit 2), connecting as a named identity with a hint when the server wants
 * another one, and the server's permissions violations read from the client's errors.
 */
import { dirname, join } from 'node:path';
import { readFileSync } from 'node:fs';
import { errors, type NatsConnection } from '@nats-io/transport-node';
import { OPERATION_KEY_PATTERN, type ErrorInfo } from '@tooltx/contracts';
import { connectNats, connectProblemOf, displayUrl, type ConnectOptions, type PermissionViolation } from '@tooltx/nats';
import { describeConnectError } from '@tooltx/runtime';

/**
 * Prints a service's refusal as `tooltx <command>: refused: <class>: <path>: <message>; … (retry
 * after N ms)` on stderr and sets exit code 1.
 */
export function writeRefusal(command: string, error: ErrorInfo): void {
  const issues = (error.issues ?? []).map(
    (i) => `${i.path.join('.') || '(request)'}: ${i.message}${i.code ? ` [${i.code}]` : ''}`,
  );
  process.stderr.write(
    `tooltx ${command}: refused: ${error.class}${issues.length ? `: ${issues.join('; ')}` : ''}${error.retryAfterMs ? ` (retry after ${error.retryAfterMs} ms)` : ''}\n`,
  );
  process.exitCode = 1;
}

/** A bad flag, environment variable or file the user named. The CLI prints its message and exits 2. */
export class UsageError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'UsageError';
  }
}

/** A refusal or failure explained in the user's terms (wrong identity, no service). The CLI prints its message and exits 1. */
export class CliRefusal extends Error {
  constructor(message: string, opts?: { cause?: unknown }) {
    super(message, opts);
    this.name = 'CliRefusal';
  }
}

export { permissionViolationOf, type PermissionViolation } from '@tooltx/nats';

/** True for a client error that is, or wraps, the given nats.js error class. */
export function isNatsError(err: unknown, cls: abstract new (...args: never[]) => Error): boolean {
  return err instanceof cls || (err instanceof Error && err.cause instanceof cls);
}

/** The identity a command must connect as: how to name it, and its seed file as `tooltx auth generate` writes it. */
export interface CliIdentity {
  /** e.g. `the provisioner`, `operator oscar`, `auditor audrey of tenant acme`. */
  describe: string;
  /** e.g. `provisioner.nk`, `operator.oscar.nk` (under `<out>/nkeys/`). */
  seedName: string;
}

/**
 * Where the seed of `who` is: `tooltx auth generate --out <dir>` writes every seed to `<dir>/nkeys/`,
 * so next to a seed the user gave when there is one.
 */
function seedHint(who: CliIdentity, seedFile: string | undefined): string {
  return seedFile
    ? `${join(dirname(seedFile), who.seedName)}, next to the one given, as \`tooltx auth generate\` writes them`
    : `nkeys/${who.seedName} in the --out directory of \`tooltx auth generate\``;
}

/** The sentence that says a server refusal means "this seed is not who the command needs". */
export function notThatIdentity(v: PermissionViolation, who: CliIdentity, seedFile: string | undefined): string {
  return `the server refused ${v.operation === 'publish' ? 'publishing to' : 'subscribing to'} ${v.subject}: the identity in NATS_NKEY_FILE${seedFile ? ` (${seedFile})` : ''} is not ${who.describe} (whose seed is ${seedHint(who, seedFile)})`;
}

/**
 * Connects like {@link connectNats}; throws {@link UsageError} naming the variable when the seed or
 * creds file cannot be read, and — when the server refuses the connection (authorisation
 * violation) — saying to set NATS_NKEY_FILE and which identity is needed.
 */
export async function connectCli(
  o: Omit<ConnectOptions, 'nkeySeedFile' | 'credsFile'> & {
    nkeyFile?: string | undefined;
    credsFile?: string | undefined;
    as: CliIdentity;
  },
): Promise<NatsConnection> {
  const files: [string, string | undefined][] = [
    ['NATS_NKEY_FILE', o.nkeyFile],
    ['NATS_CREDS_FILE', o.credsFile],
  ];
  for (const [variable, path] of files) {
    if (!path) continue;
    try {
      readFileSync(path);
    } catch (err) {
      throw new UsageError(`${variable}: cannot read ${path} (${(err as NodeJS.ErrnoException).code ?? String(err)})`);
    }
  }
  const { as, nkeyFile, credsFile, ...rest } = o;
  // The server list as it may be shown: never a URL's user and password.
  const servers = displayUrl(o.servers);
  const given = credsFile ? `NATS_CREDS_FILE=${credsFile}` : nkeyFile ? `NATS_NKEY_FILE=${nkeyFile}` : undefined;
  try {
    return await connectNats({ ...rest, nkeySeedFile: nkeyFile, credsFile });
  } catch (err) {
    const problem = connectProblemOf(err);
    if (problem?.about === 'identity' && given) throw new UsageError(`${given}: ${problem.problem}`);
    if (problem?.about === 'url') throw new UsageError(`NATS_URL=${servers}: ${problem.problem}`);
    if (!isNatsError(err, errors.AuthorizationError)) {
      // No server there (refused, unreachable, unresolvable): named with the URL, as the services name it.
      if (isNatsError(err, errors.ConnectionError) || (err as NodeJS.ErrnoException | undefined)?.code)
        throw new UsageError(`NATS_URL=${servers}: cannot connect: ${describeConnectError(err)}`);
      throw err;
    }
    const need = `${as.describe} (${seedHint(as, nkeyFile)})`;
    if (!given)
      throw new UsageError(
        `the server at ${servers} requires authentication: set NATS_NKEY_FILE to the seed of ${need}`,
      );
    throw new UsageError(
      `the server at ${servers} refused the identity in ${given}: it is not a user of this server; this command needs ${need}`,
    );
  }
}

/**
 * A value the user gave, quoted for a message: at most `max` characters of it (a 100 kB argument is
 * named, not echoed).
 */
export function shown(v: string, max = 80): string {
  return JSON.stringify(v.length > max ? `${v.slice(0, max)}…` : v);
}

/** An operation key as the argument gave it; {@link UsageError} (exit 2) when it is not one (`opk_` + 43 base64url characters). */
export function checkedKey(operationKey: string): string {
  if (!OPERATION_KEY_PATTERN.test(operationKey))
    throw new UsageError(`<operationKey>: expected opk_ and 43 base64url characters, got ${shown(operationKey, 60)}`);
  return operationKey;
}
