import { hostname } from 'node:os';
import { z } from 'zod';
import { displayUrl } from '@tooltx/nats';

/**
 * Thrown at start-up when the environment is not a valid configuration; lists every problem
 * (`problems`: `NAME: what is wrong`) and the settings they are about (`settings`, same order).
 */
export class ConfigError extends Error {
  readonly problems: string[];
  readonly settings: string[];
  /** Each problem's value as shown in it (no secrets, a URL without user-info), undefined when unset or not shown. */
  readonly values: (string | undefined)[];
  constructor(
    problems: string[],
    settings: string[] = problems.map((p) => /^[^:\s=]+/.exec(p)?.[0] ?? ''),
    values: (string | undefined)[] = [],
  ) {
    super(`invalid configuration:\n  - ${problems.join('\n  - ')}`);
    this.name = 'ConfigError';
    this.problems = problems;
    this.settings = settings;
    this.values = values;
  }
}

const PREFIX = /^[a-z][a-z0-9_]{0,31}$/;

/**
 * Settings every tooltx process reads from the environment:
 * - `NATS_URL` — comma-separated server URLs (default `nats://127.0.0.1:4222`).
 * - `NATS_CREDS_FILE` — optional credentials file (never the secret itself in the env).
 * - `NATS_NKEY_FILE` — optional nkey seed file (`tooltx auth generate` writes one per user).
 * - `TOOLTX_PREFIX` — subject prefix, one token `^[a-z][a-z0-9_]{0,31}$` (default `tooltx`).
 * - `LOG_LEVEL` — pino level (default `info`).
 * - `TOOLTX_INSTANCE_ID` — this process in logs and events (default `<host>-<pid>`).
 * - `TOOLTX_LOG_HMAC_KEY_FILE` — optional key file for the HMAC of error messages in logs;
 *   without it each process uses a random key, so the HMACs are comparable only within it.
 */
export const baseConfigSchema = z.object({
  NATS_URL: z.string().min(1).default('nats://127.0.0.1:4222'),
  NATS_CREDS_FILE: z.string().min(1).optional(),
  NATS_NKEY_FILE: z.string().min(1).optional(),
  TOOLTX_PREFIX: z.string().regex(PREFIX, 'must match ^[a-z][a-z0-9_]{0,31}$').default('tooltx'),
  LOG_LEVEL: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
  TOOLTX_INSTANCE_ID: z.string().min(1).max(64).default(`${hostname()}-${process.pid}`),
  TOOLTX_LOG_HMAC_KEY_FILE: z.string().min(1).optional(),
});

/** Settings of the services that load the trusted contract implementations. */
export const serviceConfigSchema = baseConfigSchema.extend({
  /** Path of the trusted module exporting `implementations` (never loaded by agents). */
  TOOLTX_TOOLS_MODULE: z
    .string({ error: 'required: the path of the trusted module exporting `implementations`' })
    .min(1),
  /** Operations handled at once by this process (default 16). */
  TOOLTX_CONCURRENCY: envInt(1, 1024).default(16),
  /** Ed25519 private key file (PKCS#8 PEM) that signs receipts; required by the services that commit. */
  TOOLTX_SIGNING_KEY_FILE: z.string().min(1).optional(),
  /**
   * Set by a supervisor (`npm start`, the demo, the bench) to its own pid: the process stops when
   * its parent is no longer that pid (shutdown.ts `exitWithParent`).
   */
  TOOLTX_EXIT_WITH_PARENT: envInt(1).optional(),
  /**
   * How often a service renews its held marks of the contract versions it holds, ms (default 60000);
   * a mark lapses after three intervals, so a revert learns of a crashed service within them
   * (docs/contracts.md "Revert").
   */
  TOOLTX_HELD_MARK_MS: envInt(1_000, 3_600_000).default(60_000),
});

/**
 * An integer setting read from the environment, `min`..`max`: decimal digits only, surrounding
 * blanks ignored. `z.coerce.number()` took a blank value for 0 (which silently turned a hold or a
 * batch off) and `0x10` or `1e3` for numbers.
 */
export function envInt(min: number, max = Number.MAX_SAFE_INTEGER) {
  return (
    z
      .string()
      .trim()
      .regex(/^\d+$/, { error: `expected an integer ${min}..${max} (decimal digits)` })
      .transform(Number)
      // One problem per variable, whatever is wrong with the number (a huge one was both "not an
      // integer" past 2^53 and "too big").
      .pipe(
        z.number().refine((n) => Number.isSafeInteger(n) && n >= min && n <= max, `expected an integer ${min}..${max}`),
      )
  );
}

/**
 * Parses `env` once with `schema`; throws {@link ConfigError} naming every bad or missing
 * variable, each problem as `NAME=value: what is wrong` (docs/operating.md "Configuration": one line naming
 * the setting and its value; the value shown by {@link showValue}, a URL without its user-info).
 * A variable set to the empty string counts as unset (its default applies); one of spaces alone is
 * refused, never read as a value (`NATS_URL='  '` was taken as a server).
 */
export function loadConfig<S extends z.ZodObject<z.ZodRawShape>>(
  schema: S,
  env: NodeJS.ProcessEnv = process.env,
): z.infer<S> {
  const cleaned = Object.fromEntries(Object.entries(env).filter(([, v]) => v !== undefined && v !== '')) as Record<
    string,
    string
  >;
  const blank = Object.keys(schema.shape).filter((name) => cleaned[name] !== undefined && cleaned[name].trim() === '');
  const r = schema.safeParse(cleaned);
  const issues = [
    ...blank.map((name) => ({
      name,
      message: 'spaces alone are not a value: unset it (or set it empty) for the default',
    })),
    ...(r.success ? [] : r.error.issues.map((i) => ({ name: i.path.join('.'), message: i.message }))).filter(
      (i) => !blank.includes(i.name),
    ),
  ];
  if (!issues.length && r.success) return r.data;
  // The value as shown: a URL without its user-info (a password may be in NATS_URL).
  const shownOf = (name: string): string | undefined => {
    const value = cleaned[name];
    return value === undefined ? undefined : name === 'NATS_URL' ? displayUrl(value) : value;
  };
  throw new ConfigError(
    issues.map(({ name, message }) => {
      const value = shownOf(name);
      // Unset, or a message that already quotes the value (a key file's path): not prefixed with it.
      if (value === undefined || message.startsWith(`${value}:`)) return `${name}: ${message}`;
      return `${name}=${showValue(value)}: ${message}`;
    }),
    issues.map((i) => i.name),
    issues.map((i) => shownOf(i.name)),
  );
}

/**
 * A setting's value as shown to the operator in one line: as it is when it is printable ASCII
 * without blanks, else JSON-quoted (so `'  '` and a trailing blank are visible); at most 200
 * characters. Only for values that are not secrets (paths, ports, URLs without user-info).
 */
export function showValue(value: string): string {
  const cut = value.length > 200 ? `${value.slice(0, 200)}…` : value;
  return /^[\x21-\x7e]+$/.test(cut) ? cut : JSON.stringify(cut);
}
