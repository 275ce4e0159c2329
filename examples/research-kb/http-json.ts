/**
 * The HTTP + JSON plumbing the sample's downstream services share (the KB, ./kb-server.ts, and the
 * mail outbox, ./mail-server.ts): answers, header and body parsing with field paths, bearer tokens
 * compared in constant time, and the server's life — listen, log each request, drain on SIGTERM.
 * No framework: node:http, zod for every header and body.
 *
 * Conventions both services keep: every error body is `{ error }` (plus `issues: [{ path, code,
 * message }]` for `invalid_input`; header problems have paths `["headers", name]`, query problems
 * `["query", name]`, body problems the field's path); errors never carry a stack, SQL text or the
 * request body; logs never carry bodies, headers or a token.
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { z } from 'zod';
import { boundIssues } from '@tooltx/contracts';
import {
  announceReady,
  describeError,
  type Logger,
  onShutdown,
  readKeyFile,
  SecretFileError,
  StartupError,
} from '@tooltx/runtime';

/** Largest request body read, in bytes. */
export const MAX_BODY_BYTES = 1024 * 1024;

export type Issue = { path: (string | number)[]; code: string; message: string };

/** An answer to send: status, JSON body and extra headers. */
export class Reply {
  constructor(
    readonly status: number,
    readonly body: Record<string, unknown>,
    readonly headers: Record<string, string> = {},
  ) {}
}

export const notFound = () => new Reply(404, { error: 'not_found' });
export const invalid = (issues: Issue[]) => new Reply(400, { error: 'invalid_input', issues });
export const unauthorized = () => new Reply(401, { error: 'unauthorized' }, { 'www-authenticate': 'Bearer' });

/** The issues of a zod error, bounded (boundIssues): zod names every unknown field in one message. */
export function issuesOf(err: z.ZodError, prefix: (string | number)[] = []): Issue[] {
  return boundIssues(
    err.issues.map((i) => ({
      path: [...prefix, ...i.path.map((p) => (typeof p === 'number' ? p : String(p)))],
      code: i.code,
      message: i.message,
    })),
  );
}

// ---------------------------------------------------------------------------------------------
// Shared header shapes

export const NAME_RULE = 'must match ^[a-z0-9_-]{1,64}$';
/** A tenant or actor name (`x-tenant`, `x-actor`). */
export const nameSchema = z.string().regex(/^[a-z0-9_-]{1,64}$/, NAME_RULE);
/** `idempotency-key`: tooltx's downstream key (or any caller's), ≤ `max` printable ASCII characters. */
export const keySchema = (max = 100) =>
  z
    .string()
    .min(1)
    .max(max)
    .regex(/^[\x21-\x7e]+$/, 'printable ASCII without spaces');
/** `x-tooltx-input-digest`: the caller's digest of what it asked (tooltx: RFC 8785 + SHA-256, libs/contracts digest.ts). */
export const inputDigestHeader = z
  .string()
  .regex(/^sha256:[0-9a-f]{64}$/, 'sha256: followed by 64 lower-case hex digits')
  .optional();
/** `x-deadline`: an absolute deadline in ms since the epoch. */
export const deadlineHeader = z
  .string()
  .regex(/^\d{1,15}$/, 'an absolute deadline in ms since the epoch')
  .transform(Number);

/** The header schemas, built once per shape (a request must not pay for compiling one). */
const headerSchemas = new WeakMap<z.ZodRawShape, z.ZodObject<z.ZodRawShape>>();

/** Parses the named headers with `shape`; issues under `["headers", name]`. Define each shape once. */
export function parseHeaders<S extends z.ZodRawShape>(
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

/** A key taken from a path segment (percent-decoded once), or its issues under `["key"]`. */
export function keyFromPath(rawKey: string, max = 100): { key?: string; issues: Issue[] } {
  try {
    const k = keySchema(max).safeParse(decodeURIComponent(rawKey));
    return k.success ? { key: k.data, issues: [] } : { issues: issuesOf(k.error, ['key']) };
  } catch {
    return { issues: [{ path: ['key'], code: 'invalid_format', message: 'not a percent-encoded key' }] };
  }
}

// ---------------------------------------------------------------------------------------------
// Bodies

export class BodyTooLarge extends Error {}

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
export async function parseRequest<S extends z.ZodRawShape, B extends z.ZodType>(
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
// Tokens

/** Whether the request's bearer token is the one of `digest` (constant-time comparison of SHA-256 digests). */
export function bearer(req: IncomingMessage, digest: Buffer | null): boolean {
  if (digest === null) return false;
  const m = /^Bearer ([\x21-\x7e]{1,1024})$/.exec(req.headers.authorization ?? '');
  if (!m) return false;
  return timingSafeEqual(createHash('sha256').update(m[1]!, 'utf8').digest(), digest);
}

/**
 * The SHA-256 digests of a service's two credentials, read at start: the operator token of
 * `admin.file` (≥ 16 characters without whitespace; absent = operator endpoints off) and the
 * service token of `service.file` (checked as every key file is, libs/runtime secrets.ts: mode
 * 0600, ≥ 32 characters; absent = any caller is trusted). Throws {@link StartupError} naming the
 * setting; the two must differ, so one credential never opens the other's endpoints.
 */
export function loadTokenDigests(
  admin: { setting: string; file: string | undefined },
  service: { setting: string; file: string | undefined },
): { admin: Buffer | null; service: Buffer | null } {
  let adminDigest: Buffer | null = null;
  if (admin.file !== undefined) {
    let token: string;
    try {
      token = readFileSync(admin.file, 'utf8').trim();
    } catch (err) {
      throw new StartupError(admin.setting, admin.file, `cannot read the file: ${describeError(err)}`, { cause: err });
    }
    if (token.length < 16 || /\s/.test(token))
      throw new StartupError(admin.setting, admin.file, 'the token must be at least 16 characters without whitespace');
    adminDigest = createHash('sha256').update(token, 'utf8').digest();
  }
  let serviceDigest: Buffer | null = null;
  if (service.file !== undefined) {
    try {
      serviceDigest = createHash('sha256').update(readKeyFile(service.file)).digest();
    } catch (err) {
      throw err instanceof SecretFileError
        ? new StartupError(service.setting, err.file, err.problem, { cause: err })
        : err;
    }
    if (adminDigest !== null && timingSafeEqual(serviceDigest, adminDigest)) {
      throw new StartupError(
        service.setting,
        service.file,
        `holds the operator token of ${admin.setting}; the service token must be another one`,
      );
    }
  }
  return { admin: adminDigest, service: serviceDigest };
}

// ---------------------------------------------------------------------------------------------
// Serving

export interface JsonServerOptions {
  host: string;
  port: number;
  /** The settings that name the port and host, for the startup error (e.g. `KB_PORT`, `KB_HOST`). */
  settings: { port: string; host: string };
  log: Logger;
  /** Routes one request; `route` names the matched template for the access log. */
  route(req: IncomingMessage, url: URL): Promise<{ route: string; reply: Reply }>;
  /** Extra headers of every answer (the service's clock, read when the answer is sent). */
  headers(): Record<string, string>;
  /** Called once the server has stopped accepting and in-flight requests have finished. */
  close(): void;
}

/**
 * Listens and serves `route` until SIGTERM/SIGINT: then it stops accepting, lets in-flight
 * requests finish (their connections close after the answer), closes idle keep-alive connections,
 * calls `close` and exits 0 (libs/runtime shutdown.ts). Logs `listening` with the port and tells a
 * supervisor over IPC. Throws {@link StartupError} naming the port or host setting when it cannot
 * listen (`close` was called).
 */
export async function serveJson(opts: JsonServerOptions): Promise<AddressInfo> {
  const { log } = opts;
  let stopping = false;

  const send = (res: ServerResponse, reply: Reply, close = false): void => {
    const text = JSON.stringify(reply.body);
    res.writeHead(reply.status, {
      'content-type': 'application/json; charset=utf-8',
      'content-length': Buffer.byteLength(text),
      'cache-control': 'no-store',
      ...opts.headers(),
      ...reply.headers,
      ...(close || stopping ? { connection: 'close' } : {}),
    });
    res.end(text);
  };

  const server = createServer((req, res) => {
    const started = performance.now();
    let url: URL;
    try {
      url = new URL(req.url ?? '/', 'http://service.invalid');
    } catch {
      // An absolute-form target that is no URL (`GET http://[ HTTP/1.1`): thrown here, outside any
      // handler, it ended the process.
      return send(
        res,
        invalid([{ path: ['url'], code: 'invalid_format', message: 'the request target is not a URL' }]),
        true,
      );
    }
    opts.route(req, url).then(
      ({ route: r, reply }) => {
        send(res, reply);
        // A traced request (W3C `traceparent`, docs/tracing.md) names its trace: the log line is
        // where this server's part of a call's trace is found.
        const traceId = traceIdOf(req.headers.traceparent);
        if (traceId)
          log.info({ route: r, status: reply.status, traceId, ms: Math.round(performance.now() - started) }, 'request');
        else log.debug({ route: r, status: reply.status, ms: Math.round(performance.now() - started) }, 'request');
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
      server.listen(opts.port, opts.host, () => {
        server.off('error', j);
        r();
      });
    });
  } catch (err) {
    opts.close();
    const code = (err as NodeJS.ErrnoException).code;
    // The port is taken or not ours to bind; the host is not an address of this machine.
    if (code === 'EADDRNOTAVAIL' || code === 'ENOTFOUND' || code === 'EAI_AGAIN')
      throw new StartupError(opts.settings.host, opts.host, describeError(err), { cause: err });
    throw new StartupError(
      opts.settings.port,
      String(opts.port),
      `cannot listen on ${opts.host}:${opts.port}: ${describeError(err)}`,
      { cause: err },
    );
  }
  server.on('error', (err) => {
    log.fatal({ err }, 'server error');
    opts.close();
    process.exit(1);
  });
  const address = server.address() as AddressInfo;

  // Installed before the "listening" line and the readiness message: whoever acts on them (a
  // supervisor, a test) may send SIGTERM at once, and a handler installed after them left a window in
  // which a preempted service died by the signal's default action (seen as a CI flake).
  onShutdown(log, async () => {
    stopping = true;
    // Stop accepting; in-flight requests finish (their connections close after the answer); idle
    // keep-alive connections are closed now and as they become idle.
    const idle = setInterval(() => server.closeIdleConnections(), 50);
    await new Promise<void>((r, j) => {
      server.close((err) => (err ? j(err) : r()));
      server.closeIdleConnections();
    }).finally(() => clearInterval(idle));
    opts.close();
  });
  return address;
}

/** Logs `listening` (with `fields`) and tells a supervisor (npm start) the port over IPC, whatever LOG_LEVEL hides. */
export function announceListening(log: Logger, address: AddressInfo, fields: Record<string, unknown> = {}): void {
  log.info({ host: address.address, port: address.port, ...fields }, 'listening');
  announceReady({ port: address.port });
}

/** The trace id of a well-formed W3C `traceparent` header (version 00 layout), else undefined. */
export function traceIdOf(header: string | string[] | undefined): string | undefined {
  if (typeof header !== 'string') return undefined;
  const m = /^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$/.exec(header.trim());
  return m && !/^0+$/.test(m[1]!) ? m[1] : undefined;
}
