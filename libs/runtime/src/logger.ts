import pino, { type Logger, type LoggerOptions } from 'pino';

export type { Logger } from 'pino';

/**
 * Paths pino removes from every log line: credentials, cookies, authorisation headers, request and
 * note bodies, page text, inputs and results (DESIGN.md "Audit evidence is not a copy of sensitive
 * content", FM-16). Wildcards cover one level of nesting.
 */
export const REDACT_PATHS = [
  'password', 'token', 'secret', 'cookie', 'authorization', 'creds', 'seed', 'nkey', 'jwt',
  'body', 'text', 'page', 'input', 'result', 'headers', 'excerpt',
  '*.password', '*.token', '*.secret', '*.cookie', '*.authorization', '*.creds', '*.seed', '*.nkey', '*.jwt',
  '*.body', '*.text', '*.page', '*.input', '*.result', '*.headers', '*.excerpt',
  'req.headers', 'res.headers',
];

/**
 * The one pino set-up for every tooltx process: JSON lines on stdout, level from config, `service`
 * and `instance` on every line, errors under `err` with their class and code only — never their
 * message, which may quote a downstream's body.
 */
export function createLogger(opts: { service: string; instance: string; level?: string }): Logger {
  const options: LoggerOptions = {
    level: opts.level ?? 'info',
    base: { service: opts.service, instance: opts.instance },
    redact: { paths: REDACT_PATHS, censor: '[redacted]' },
    serializers: { err: safeError },
    timestamp: pino.stdTimeFunctions.isoTime,
  };
  return pino(options);
}

/** An error reduced to what is safe to log: name, tooltx class, code. */
export function safeError(err: unknown): Record<string, unknown> {
  if (!(err instanceof Error)) return { type: typeof err };
  const e = err as Error & { class?: unknown; code?: unknown };
  const out: Record<string, unknown> = { type: e.name };
  if (typeof e.class === 'string') out.class = e.class;
  if (typeof e.code === 'string' || typeof e.code === 'number') out.code = e.code;
  if (e.name === 'TooltxError' || e.name === 'ConfigError' || e.name === 'ConcurrencyError' || e.name === 'StreamConfigError') out.message = e.message;
  return out;
}
