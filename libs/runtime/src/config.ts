import { hostname } from 'node:os';
import { z } from 'zod';

/**
 * Thrown at start-up when the environment is not a valid configuration; lists every problem
 * (`problems`: `NAME: what is wrong`) and the settings they are about (`settings`, same order).
 */
export class ConfigError extends Error {
  readonly problems: string[];
  readonly settings: string[];
  constructor(problems: string[], settings: string[] = problems.map((p) => /^[^:\s]+/.exec(p)?.[0] ?? '')) {
    super(`invalid configuration:\n  - ${problems.join('\n  - ')}`);
    this.name = 'ConfigError';
    this.problems = problems;
    this.settings = settings;
  }
}

const PREFIX = /^[a-z][a-z0-9_]{0,31}$/;

/**
 * Settings every tooltx process reads from the environment (DESIGN.md "Where things live"):
 * - `NATS_URL` — comma-separated server URLs (default `nats://127.0.0.1:4222`).
 * - `NATS_CREDS_FILE` — optional credentials file (never the secret itself in the env).
 * - `NATS_NKEY_FILE` — optional nkey seed file (`tooltx auth generate` writes one per user).
 * - `TOOLTX_PREFIX` — subject prefix, one token `^[a-z][a-z0-9_]{0,31}$` (default `tooltx`).
 * - `LOG_LEVEL` — pino level (default `info`).
 * - `TOOLTX_INSTANCE_ID` — this process in logs and events (default `<host>-<pid>`).
 * - `TOOLTX_LOG_HMAC_KEY_FILE` — optional key file for the HMAC of error messages in logs (issue 9;
 *   without it each process uses a random key, so the HMACs are comparable only within it).
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
  TOOLTX_TOOLS_MODULE: z.string({ error: 'required: the path of the trusted module exporting `implementations`' }).min(1),
  /** Operations handled at once by this process (default 16). */
  TOOLTX_CONCURRENCY: envInt(1, 1024).default(16),
  /** Ed25519 private key file (PKCS#8 PEM) that signs receipts; required by the services that commit (issue 9). */
  TOOLTX_SIGNING_KEY_FILE: z.string().min(1).optional(),
  /**
   * Set by a supervisor (`npm start`, the demo, the bench) to its own pid: the process stops when
   * its parent is no longer that pid (shutdown.ts `exitWithParent`).
   */
  TOOLTX_EXIT_WITH_PARENT: envInt(1).optional(),
});

/**
 * An integer setting read from the environment, `min`..`max`: decimal digits only, surrounding
 * blanks ignored. `z.coerce.number()` took a blank value for 0 (which silently turned a hold or a
 * batch off) and `0x10` or `1e3` for numbers (fresh-user trial).
 */
export function envInt(min: number, max = Number.MAX_SAFE_INTEGER) {
  return z
    .string()
    .trim()
    .regex(/^\d+$/, { error: `expected an integer ${min}..${max} (decimal digits)` })
    .transform(Number)
    .pipe(z.number().int().min(min).max(max));
}

/**
 * Parses `env` once with `schema`; throws {@link ConfigError} naming every bad or missing
 * variable. Empty strings count as unset.
 */
export function loadConfig<S extends z.ZodObject<z.ZodRawShape>>(schema: S, env: NodeJS.ProcessEnv = process.env): z.infer<S> {
  const cleaned = Object.fromEntries(Object.entries(env).filter(([, v]) => v !== undefined && v !== ''));
  const r = schema.safeParse(cleaned);
  if (r.success) return r.data;
  throw new ConfigError(
    r.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`),
    r.error.issues.map((i) => i.path.join('.')),
  );
}
