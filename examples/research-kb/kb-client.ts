/**
 * A small typed HTTP client of the research-KB storage service (./kb-server.ts), for the trusted
 * tool implementations, the demo and tests. HTTP via undici with one connection pool per client;
 * `keepAlive: false` closes the connection after every request, so a fault proxy that cuts one
 * connection touches exactly one request (issue 7).
 *
 * Error convention: an HTTP answer of 4xx/5xx throws {@link KbError} (the KB answered, with a
 * class); network errors, aborts (the caller's `signal`) and a reply that cannot be read propagate
 * unchanged or as {@link KbProtocolError} — callers treat those as "outcome unknown".
 */

import { Agent, request, type Dispatcher } from 'undici';

/** The error classes the KB answers with (`{ error }` bodies). */
export type KbErrorClass = 'invalid_input' | 'not_found' | 'deadline_passed' | 'internal';

/** A field problem of an `invalid_input` answer: `path` is `["headers", name]` or the body field's path. */
export interface KbIssue {
  path: (string | number)[];
  code: string;
  message: string;
}

/**
 * The KB answered 4xx/5xx. `errorClass` is the answer's `error` class, or `unexpected` when the
 * body carried none (e.g. a proxy's page). `issues` is set for `invalid_input`.
 */
export class KbError extends Error {
  readonly status: number;
  readonly errorClass: KbErrorClass | 'unexpected';
  readonly issues: KbIssue[] | undefined;
  constructor(status: number, errorClass: KbErrorClass | 'unexpected', issues?: KbIssue[]) {
    super(`kb answered ${status} ${errorClass}`);
    this.name = 'KbError';
    this.status = status;
    this.errorClass = errorClass;
    this.issues = issues;
  }
}

/** A 2xx answer whose body is not what the KB sends (outcome unknown for a write). */
export class KbProtocolError extends Error {
  readonly status: number;
  constructor(status: number, what: string) {
    super(`kb answered ${status} with ${what}`);
    this.name = 'KbProtocolError';
    this.status = status;
  }
}

/** A note to write. Times are ISO-8601 with an offset; the body is stored only as its digest. */
export interface KbNote {
  kb: string;
  title: string;
  body: string;
  sourceUrl: string;
  fetchedAt: string;
  publishAt?: string | undefined;
}

/** A write's receipt: `createdAt` in ms since the epoch; `created` false = an existing note of that key (dedup). */
export interface KbWriteReceipt {
  id: string;
  kb: string;
  createdAt: number;
  created: boolean;
}

/** The probe by key: `count` = non-deleted notes with that key (> 1 only with dedup off). */
export type KbProbeResult = { found: true; id: string; kb: string; createdAt: number; count: number } | { found: false };

/** Counts over non-deleted notes; `duplicateRows` = rows beyond one per (tenant, key). */
export interface KbStats {
  rows: number;
  distinctKeys: number;
  duplicateRows: number;
}

const CLASSES: readonly string[] = ['invalid_input', 'not_found', 'deadline_passed', 'internal'];

export class KbClient {
  readonly baseUrl: string;
  readonly #agent: Agent;
  readonly #keepAlive: boolean;

  /**
   * `baseUrl` like `http://127.0.0.1:4280` (a trailing `/` is ignored). `connections`: most sockets
   * open at once (default 64); `keepAlive` (default true).
   */
  constructor(baseUrl: string, opts: { keepAlive?: boolean; connections?: number } = {}) {
    this.baseUrl = baseUrl.replace(/\/+$/, '');
    this.#keepAlive = opts.keepAlive ?? true;
    this.#agent = new Agent({ connections: opts.connections ?? 64 });
  }

  /** Closes the connection pool (waits for in-flight requests). */
  async close(): Promise<void> {
    await this.#agent.close();
  }

  /**
   * `POST /v1/notes` under the downstream `key` (≤ 100 printable ASCII characters) with the
   * absolute deadline `deadlineAt` (ms since the epoch), after which the KB refuses to insert.
   * Throws {@link KbError}: 400 `invalid_input`, 404 `not_found` (no such knowledge base of the
   * tenant), 409 `deadline_passed` (nothing stored), 500 `internal`.
   */
  async writeNote(args: { tenant: string; key: string; deadlineAt: number; note: KbNote; signal?: AbortSignal }): Promise<KbWriteReceipt> {
    const res = await this.#call('POST', '/v1/notes', {
      headers: { 'x-tenant': args.tenant, 'idempotency-key': args.key, 'x-deadline': String(Math.floor(args.deadlineAt)) },
      body: args.note,
      signal: args.signal,
    });
    const b = res.body;
    if (!isRecord(b) || typeof b.id !== 'string' || typeof b.kb !== 'string' || typeof b.createdAt !== 'number') {
      throw new KbProtocolError(res.status, 'an unreadable receipt');
    }
    return { id: b.id, kb: b.kb, createdAt: b.createdAt, created: res.status === 201 };
  }

  /**
   * `GET /v1/notes/by-key/:key` — read-only, repeatable: the tenant's oldest non-deleted note with
   * that key, or `{ found: false }` (also for another tenant's key) — only when the KB itself said
   * so (a 404 body with `found: false`). Throws {@link KbError} for `invalid_input`, `internal` and
   * a 404 that is not the KB's probe answer.
   */
  async probe(args: { tenant: string; key: string; signal?: AbortSignal }): Promise<KbProbeResult> {
    const res = await this.#call('GET', `/v1/notes/by-key/${encodeURIComponent(args.key)}`, {
      headers: { 'x-tenant': args.tenant },
      signal: args.signal,
      notFoundOk: true,
    });
    const b = res.body;
    if (res.status === 404) {
      // Only the KB's own answer counts as "not found", never a 404 of something in between.
      if (isRecord(b) && b.found === false) return { found: false };
      throw new KbError(404, isRecord(b) && b.error === 'not_found' ? 'not_found' : 'unexpected');
    }
    if (!isRecord(b) || b.found !== true || typeof b.id !== 'string' || typeof b.kb !== 'string' || typeof b.createdAt !== 'number' || typeof b.count !== 'number') {
      throw new KbProtocolError(res.status, 'an unreadable probe result');
    }
    return { found: true, id: b.id, kb: b.kb, createdAt: b.createdAt, count: b.count };
  }

  /**
   * `DELETE /v1/notes/:id` — soft delete, idempotent (an already deleted note answers the same).
   * `key` is the downstream key of the delete. Throws {@link KbError} 404 `not_found` when the note
   * is not the tenant's, 400 `invalid_input`, 500 `internal`.
   */
  async deleteNote(args: { tenant: string; key: string; id: string; signal?: AbortSignal }): Promise<{ id: string; deleted: true }> {
    const res = await this.#call('DELETE', `/v1/notes/${encodeURIComponent(args.id)}`, {
      headers: { 'x-tenant': args.tenant, 'idempotency-key': args.key },
      signal: args.signal,
    });
    const b = res.body;
    if (!isRecord(b) || typeof b.id !== 'string' || b.deleted !== true) throw new KbProtocolError(res.status, 'an unreadable delete receipt');
    return { id: b.id, deleted: true };
  }

  /** `GET /v1/stats` — operator counts over non-deleted notes, of one tenant or of all. */
  async stats(tenant?: string, signal?: AbortSignal): Promise<KbStats> {
    const q = tenant === undefined ? '' : `?tenant=${encodeURIComponent(tenant)}`;
    const res = await this.#call('GET', `/v1/stats${q}`, { signal });
    const b = res.body;
    if (!isRecord(b) || typeof b.rows !== 'number' || typeof b.distinctKeys !== 'number' || typeof b.duplicateRows !== 'number') {
      throw new KbProtocolError(res.status, 'unreadable stats');
    }
    return { rows: b.rows, distinctKeys: b.distinctKeys, duplicateRows: b.duplicateRows };
  }

  /** `GET /healthz` — true when the KB answers 200. Network errors propagate. */
  async healthy(signal?: AbortSignal): Promise<boolean> {
    const res = await request(`${this.baseUrl}/healthz`, { dispatcher: this.#agent, signal, reset: !this.#keepAlive });
    await res.body.dump();
    return res.statusCode === 200;
  }

  async #call(
    method: string,
    path: string,
    o: { headers?: Record<string, string>; body?: unknown; signal?: AbortSignal | undefined; notFoundOk?: boolean },
  ): Promise<{ status: number; body: unknown }> {
    const headers: Record<string, string> = { accept: 'application/json', ...o.headers };
    if (o.body !== undefined) headers['content-type'] = 'application/json';
    const r = await request(`${this.baseUrl}${path}`, {
      method: method as Dispatcher.HttpMethod,
      headers,
      body: o.body === undefined ? undefined : JSON.stringify(o.body),
      signal: o.signal,
      dispatcher: this.#agent,
      reset: !this.#keepAlive,
    });
    const text = await r.body.text(); // a cut connection rejects here: propagates (outcome unknown)
    const res = { status: r.statusCode };
    let body: unknown;
    try {
      body = text ? (JSON.parse(text) as unknown) : undefined;
    } catch {
      body = undefined;
    }
    if (res.status >= 400 && !(o.notFoundOk && res.status === 404)) {
      const cls = isRecord(body) && typeof body.error === 'string' && CLASSES.includes(body.error) ? (body.error as KbErrorClass) : 'unexpected';
      const issues = isRecord(body) && Array.isArray(body.issues) ? (body.issues as KbIssue[]) : undefined;
      throw new KbError(res.status, cls, issues);
    }
    if (res.status < 200 || res.status >= 300) {
      if (!(o.notFoundOk && res.status === 404)) throw new KbProtocolError(res.status, 'an unexpected status');
    }
    return { status: res.status, body };
  }
}

function isRecord(x: unknown): x is Record<string, unknown> {
  return typeof x === 'object' && x !== null && !Array.isArray(x);
}
