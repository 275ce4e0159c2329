/**
 * A small typed HTTP client of the research-KB storage service (./kb-server.ts), for the trusted
 * tool implementations, the demo and tests. HTTP via undici with one connection pool per client;
 * `keepAlive: false` closes the connection after every request, so a fault proxy that cuts one
 * connection touches exactly one request.
 *
 * Error convention: an HTTP answer of 4xx/5xx throws {@link KbError} (the KB answered, with a
 * class); network errors, aborts (the caller's `signal`) and a reply that cannot be read propagate
 * unchanged or as {@link KbProtocolError} — callers treat those as "outcome unknown".
 *
 * Service credential: constructed with `serviceToken` (the content of the KB's
 * `KB_SERVICE_TOKEN_FILE`), every request but the health check and the operator endpoints (which
 * send the operator token instead) carries `authorization: Bearer <serviceToken>`; a KB that
 * requires it answers 401 `unauthorized` without it.
 *
 * Authorisation: resolve a reference first ({@link KbClient.resolve}: the canonical
 * `kbId`, the `authVersion` and the actor's role), then write with `actor` and `ifMatch` =
 * that `authVersion`; the KB re-checks version, state, role and quota in the insert's transaction.
 */

import { Agent, request, type Dispatcher } from 'undici';
import type { KbAdminView, KbRowCount, KbStats } from './kb-store.js';

/** The error classes the KB answers with (`{ error }` bodies). */
export type KbErrorClass =
  | 'invalid_input'
  | 'unauthorized'
  | 'forbidden'
  | 'not_found'
  | 'frozen'
  | 'deadline_passed'
  | 'conflict'
  | 'version_conflict'
  | 'quota_exceeded'
  /** Dedup on: the key holds a note written with another input digest (422). */
  | 'key_reused'
  | 'internal';

const CLASSES: readonly string[] = [
  'invalid_input',
  'unauthorized',
  'forbidden',
  'not_found',
  'frozen',
  'deadline_passed',
  'conflict',
  'version_conflict',
  'quota_exceeded',
  'key_reused',
  'internal',
] satisfies KbErrorClass[];

/**
 * A field problem of an `invalid_input` answer: `path` is `["headers", name]`, `["query", name]` or
 * the body field's path. For a refused batch: `path` is `["items", index]` and `code` the class.
 */
export interface KbIssue {
  path: (string | number)[];
  code: string;
  message: string;
}

/**
 * The KB answered 4xx/5xx. `errorClass` is the answer's `error` class, or `unexpected` when the
 * body carried none (e.g. a proxy's page). `issues` is set for `invalid_input` and for a refused
 * batch (then `index` is the refused item). `retryAfterMs` is set for `quota_exceeded`.
 */
export class KbError extends Error {
  readonly status: number;
  readonly errorClass: KbErrorClass | 'unexpected';
  readonly issues: KbIssue[] | undefined;
  readonly retryAfterMs: number | undefined;
  readonly index: number | undefined;
  /** The KB's clock when it answered (its `x-kb-now` header), ms since the epoch, when it sent one. */
  readonly kbNow: number | undefined;
  constructor(
    status: number,
    errorClass: KbErrorClass | 'unexpected',
    issues?: KbIssue[],
    extra: { retryAfterMs?: number | undefined; index?: number | undefined; kbNow?: number | undefined } = {},
  ) {
    super(`kb answered ${status} ${errorClass}`);
    this.name = 'KbError';
    this.status = status;
    this.errorClass = errorClass;
    this.issues = issues;
    this.retryAfterMs = extra.retryAfterMs;
    this.index = extra.index;
    this.kbNow = extra.kbNow;
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

/** A note to write: `kb` is any reference (name, alias, `kb_<uuid>`). Times are ISO-8601 with an offset; the body is stored only as its digest. */
export interface KbNote {
  kb: string;
  title: string;
  body: string;
  sourceUrl: string;
  fetchedAt: string;
  publishAt?: string | undefined;
}

export type KbRole = 'reader' | 'writer' | 'admin';
export type KbState = 'active' | 'frozen' | 'deleted';

/** What the resolver answers: the canonical id, the authorisation version and the actor's role. */
export interface KbResolution {
  kbId: string;
  name: string;
  state: 'active' | 'frozen';
  authVersion: number;
  role: KbRole | null;
}

/** A stored note: `kb` is the knowledge base's name, `createdAt` in ms since the epoch. */
export interface KbNoteReceipt {
  id: string;
  kb: string;
  kbId: string;
  createdAt: number;
}

/** A write's receipt: `created` false = an existing note of that key (dedup). */
export interface KbWriteReceipt extends KbNoteReceipt {
  created: boolean;
  /** The KB's clock when it answered, ms since the epoch (absent from a KB that does not send it). */
  kbNow?: number;
}

/** A batch's receipt: the items in order; `created` false = the batch stored earlier under that key (dedup). */
export interface KbBatchReceipt {
  items: KbNoteReceipt[];
  created: boolean;
}

/**
 * The probe by key: `count` = non-deleted notes with that key (> 1 only with dedup off). For a
 * batch key, `items` lists the batch's notes in order (`id`, `kb`, `createdAt` are item 0's).
 * `inputDigest`: what the note (a batch: item 0) was written with (`x-tooltx-input-digest`), absent
 * when it was written without one.
 */
export type KbProbeResult =
  /** `deleted`: the note written under the key was deleted since (the write still happened); `count` counts deleted rows too. */
  | {
      found: true;
      id: string;
      kb: string;
      createdAt: number;
      count: number;
      inputDigest?: string;
      deleted?: true;
      items?: { id: string; kb: string; createdAt: number }[];
    }
  /**
   * `now`: the KB's clock at the lookup, ms since the epoch, which never goes back: a request whose
   * deadline is before it can no longer be stored (absent from a KB that does not send it).
   */
  | { found: false; now?: number };

/** The probe of a delete by key: the note it deleted, when, and how many deletes the key holds. */
export type KbDeleteProbeResult =
  | { found: true; id: string; deletedAt: number; count: number; inputDigest?: string }
  | { found: false; now?: number };

/** The form of `x-tooltx-input-digest` (tooltx's `digestOf`: `sha256:` + 64 lower-case hex). */
export const INPUT_DIGEST = /^sha256:[0-9a-f]{64}$/;

// The stats shapes are the store's own (a type-only import: nothing of SQLite is loaded here).
export type { KbStats, KbRowCount } from './kb-store.js';

/** The operator's view of a knowledge base, as the store answers it (members' role `none` = revoked). */
export type { KbAdminView } from './kb-store.js';

/** The operator endpoints (`/v1/admin/*`) with the operator token. Every change answers the new view and whether it changed anything. */
export interface KbAdmin {
  list(tenant?: string, signal?: AbortSignal): Promise<KbAdminView[]>;
  get(kbId: string, signal?: AbortSignal): Promise<KbAdminView>;
  /** Grants `role` to `actor` of `tenant` (the owner tenant), or revokes it (`null`). */
  setMember(
    kbId: string,
    member: { tenant: string; actor: string; role: KbRole | null },
  ): Promise<KbAdminView & { changed: boolean }>;
  setDefaultRole(kbId: string, role: KbRole | null): Promise<KbAdminView & { changed: boolean }>;
  setState(kbId: string, state: KbState): Promise<KbAdminView & { changed: boolean }>;
  transferOwner(kbId: string, tenant: string): Promise<KbAdminView & { changed: boolean }>;
  addAlias(kbId: string, alias: string): Promise<KbAdminView & { changed: boolean }>;
  removeAlias(kbId: string, alias: string): Promise<KbAdminView & { changed: boolean }>;
}

/**
 * The caller's digest of what it asked, sent as `x-tooltx-input-digest` (must match
 * {@link INPUT_DIGEST}; the KB answers 400 `invalid_input` otherwise) and stored with the note(s) so
 * the probe can tell this write's effect from another under the same key. Absent = none
 * stored.
 */
interface Digest {
  inputDigest?: string | undefined;
}

/**
 * The W3C `traceparent` of the attempt that sends the request (`ExecutionContext.traceparent`),
 * sent as its `traceparent` header so the KB's work joins the caller's trace (docs/tracing.md).
 */
interface Traced {
  traceparent?: string | undefined;
}

/** The identity and version condition of a write. */
interface Authz {
  /**
   * The acting actor (`x-actor`). REQUIRED by the KB (a write without it is 400 invalid_input);
   * optional in the type only until every caller sends it.
   */
  actor?: string | undefined;
  /**
   * The `authVersion` the caller checked (`if-match`). REQUIRED by the KB, like `actor`; never
   * defaulted.
   */
  ifMatch?: number | undefined;
}

export class KbClient {
  readonly baseUrl: string;
  readonly #agent: Agent;
  readonly #keepAlive: boolean;
  readonly #auth: Record<string, string>;

  /**
   * `baseUrl` like `http://127.0.0.1:4280` (a trailing `/` is ignored). `connections`: most sockets
   * open at once (default 64); `keepAlive` (default true); `serviceToken`: the KB's service token
   * (see the file's header; absent = none sent).
   */
  constructor(
    baseUrl: string,
    opts: { keepAlive?: boolean; connections?: number; serviceToken?: string | undefined } = {},
  ) {
    this.baseUrl = baseUrl.replace(/\/+$/, '');
    this.#keepAlive = opts.keepAlive ?? true;
    this.#auth = opts.serviceToken === undefined ? {} : { authorization: `Bearer ${opts.serviceToken}` };
    this.#agent = new Agent({ connections: opts.connections ?? 64 });
  }

  /** Closes the connection pool (waits for in-flight requests). */
  async close(): Promise<void> {
    await this.#agent.close();
  }

  /**
   * `GET /v1/resolve` — the knowledge base of `tenant` that `ref` names (name, alias or `kb_<uuid>`,
   * any case, percent-encoded or not), with the actor's current role. Throws {@link KbError} 404
   * `not_found` — identical for a missing, another tenant's and a soft-deleted knowledge base.
   */
  async resolve(args: { tenant: string; actor: string; ref: string; signal?: AbortSignal }): Promise<KbResolution> {
    const res = await this.#call('GET', `/v1/resolve?ref=${encodeURIComponent(args.ref)}`, {
      headers: { 'x-tenant': args.tenant, 'x-actor': args.actor },
      signal: args.signal,
    });
    const b = res.body;
    if (
      !isRecord(b) ||
      typeof b.kbId !== 'string' ||
      typeof b.name !== 'string' ||
      (b.state !== 'active' && b.state !== 'frozen') ||
      typeof b.authVersion !== 'number' ||
      !(b.role === null || b.role === 'reader' || b.role === 'writer' || b.role === 'admin')
    ) {
      throw new KbProtocolError(res.status, 'an unreadable resolution');
    }
    return { kbId: b.kbId, name: b.name, state: b.state, authVersion: b.authVersion, role: b.role };
  }

  /**
   * `POST /v1/notes` under the downstream `key` (≤ 100 printable ASCII characters) with the
   * absolute deadline `deadlineAt` (ms since the epoch), after which the KB refuses to insert, as
   * `actor` under the version condition `ifMatch`. Throws {@link KbError}: 400 `invalid_input`, 404
   * `not_found`, 409 `frozen` / `deadline_passed`, 412 `version_conflict`, 403 `forbidden`, 429
   * `quota_exceeded` (with `retryAfterMs`), 500 `internal` — nothing stored for any of them.
   * `inputDigest` is stored with the note (see {@link Digest}).
   */
  async writeNote(
    args: { tenant: string; key: string; deadlineAt: number; note: KbNote; signal?: AbortSignal } & Authz &
      Digest &
      Traced,
  ): Promise<KbWriteReceipt> {
    const res = await this.#call('POST', '/v1/notes', {
      headers: {
        'x-tenant': args.tenant,
        'idempotency-key': args.key,
        'x-deadline': String(Math.floor(args.deadlineAt)),
        ...authzHeaders(args.actor, args.ifMatch),
        ...digestHeader(args.inputDigest),
        ...traceHeader(args.traceparent),
      },
      body: args.note,
      signal: args.signal,
    });
    const r = noteReceipt(res.body);
    if (!r) throw new KbProtocolError(res.status, 'an unreadable receipt');
    return { ...r, created: res.status === 201, ...(res.kbNow !== undefined ? { kbNow: res.kbNow } : {}) };
  }

  /**
   * `POST /v1/notes:batch` — 1..50 notes under one downstream `key` (≤ 96 characters; item `i` is
   * stored under `<key>#<i>`), all or nothing. `ifMatch` maps each knowledge base id the batch
   * writes to onto the `authVersion` checked. A refusal throws {@link KbError} with the refused
   * item's `index` (nothing is stored). `inputDigest` is stored with every item (see {@link Digest}).
   */
  async writeBatch(
    args: {
      tenant: string;
      actor: string;
      key: string;
      deadlineAt: number;
      ifMatch: Readonly<Record<string, number>>;
      items: KbNote[];
      signal?: AbortSignal;
    } & Digest &
      Traced,
  ): Promise<KbBatchReceipt> {
    const res = await this.#call('POST', '/v1/notes:batch', {
      headers: {
        'x-tenant': args.tenant,
        'x-actor': args.actor,
        'idempotency-key': args.key,
        'x-deadline': String(Math.floor(args.deadlineAt)),
        'if-match': Object.entries(args.ifMatch)
          .map(([id, v]) => `${id}=${v}`)
          .join(', '),
        ...digestHeader(args.inputDigest),
        ...traceHeader(args.traceparent),
      },
      body: { items: args.items },
      signal: args.signal,
    });
    const b = res.body;
    const items = isRecord(b) && Array.isArray(b.items) ? b.items.map(noteReceipt) : [];
    if (items.length === 0 || items.some((i) => i === null))
      throw new KbProtocolError(res.status, 'an unreadable batch receipt');
    return { items: items as KbNoteReceipt[], created: res.status === 201 };
  }

  /**
   * `GET /v1/notes/by-key/:key` — read-only, repeatable: the tenant's oldest non-deleted note with
   * that key (or the batch stored under it) with the input digest it was written with when it has
   * one, or `{ found: false }` (also for another tenant's key) — only when the KB itself said so (a
   * 404 body with `found: false`). Throws {@link KbError} for `invalid_input`, `internal` and a 404
   * that is not the KB's probe answer; {@link KbProtocolError} for an answer it cannot read (an
   * `inputDigest` that is not a digest included).
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
      if (isRecord(b) && b.found === false) {
        if (b.now === undefined) return { found: false };
        if (typeof b.now !== 'number' || !Number.isSafeInteger(b.now) || b.now < 0)
          throw new KbProtocolError(res.status, 'an unreadable probe result');
        return { found: false, now: b.now };
      }
      throw new KbError(404, isRecord(b) && b.error === 'not_found' ? 'not_found' : 'unexpected');
    }
    if (
      !isRecord(b) ||
      b.found !== true ||
      typeof b.id !== 'string' ||
      typeof b.kb !== 'string' ||
      typeof b.createdAt !== 'number' ||
      typeof b.count !== 'number'
    ) {
      throw new KbProtocolError(res.status, 'an unreadable probe result');
    }
    const out: KbProbeResult = {
      found: true,
      id: b.id,
      kb: b.kb,
      createdAt: b.createdAt,
      count: b.count,
      ...(b.deleted === true ? { deleted: true as const } : {}),
    };
    if (b.inputDigest !== undefined) {
      if (typeof b.inputDigest !== 'string' || !INPUT_DIGEST.test(b.inputDigest))
        throw new KbProtocolError(res.status, 'an unreadable probe result');
      out.inputDigest = b.inputDigest;
    }
    if (Array.isArray(b.items)) {
      out.items = b.items.map((i: unknown) => {
        if (!isRecord(i) || typeof i.id !== 'string' || typeof i.kb !== 'string' || typeof i.createdAt !== 'number')
          throw new KbProtocolError(res.status, 'an unreadable probe result');
        return { id: i.id, kb: i.kb, createdAt: i.createdAt };
      });
    }
    return out;
  }

  /**
   * `DELETE /v1/notes/:id` — soft delete, idempotent (an already deleted note answers the same).
   * `key` is the downstream key of the delete, stored with it (with `inputDigest`, see
   * {@link Digest}) and found by {@link KbClient.probeDelete}. Throws {@link KbError} 404
   * `not_found` when the note is not in a knowledge base of the tenant, 409 `frozen`, 412
   * `version_conflict`, 403 `forbidden`, 422 `key_reused` (the key deleted another note), 400
   * `invalid_input`, 500 `internal`.
   */
  async deleteNote(
    args: { tenant: string; key: string; id: string; signal?: AbortSignal } & Authz & Digest & Traced,
  ): Promise<{ id: string; deleted: true }> {
    const res = await this.#call('DELETE', `/v1/notes/${encodeURIComponent(args.id)}`, {
      headers: {
        'x-tenant': args.tenant,
        'idempotency-key': args.key,
        ...authzHeaders(args.actor, args.ifMatch),
        ...digestHeader(args.inputDigest),
        ...traceHeader(args.traceparent),
      },
      signal: args.signal,
    });
    const b = res.body;
    if (!isRecord(b) || typeof b.id !== 'string' || b.deleted !== true)
      throw new KbProtocolError(res.status, 'an unreadable delete receipt');
    return { id: b.id, deleted: true };
  }

  /**
   * `GET /v1/deletes/by-key/:key` — read-only: the delete made under the key (`id` = the note it
   * deleted, `deletedAt` = when that note was deleted, `count` = deletes under the key: > 1 only
   * with dedup off), or `{ found: false, now? }` only when the KB itself said so.
   */
  async probeDelete(args: { tenant: string; key: string; signal?: AbortSignal }): Promise<KbDeleteProbeResult> {
    const res = await this.#call('GET', `/v1/deletes/by-key/${encodeURIComponent(args.key)}`, {
      headers: { 'x-tenant': args.tenant },
      signal: args.signal,
      notFoundOk: true,
    });
    const b = res.body;
    if (res.status === 404) {
      if (isRecord(b) && b.found === false) {
        if (b.now === undefined) return { found: false };
        if (typeof b.now !== 'number' || !Number.isSafeInteger(b.now) || b.now < 0)
          throw new KbProtocolError(res.status, 'an unreadable probe result');
        return { found: false, now: b.now };
      }
      throw new KbError(404, isRecord(b) && b.error === 'not_found' ? 'not_found' : 'unexpected');
    }
    if (
      !isRecord(b) ||
      b.found !== true ||
      typeof b.id !== 'string' ||
      typeof b.deletedAt !== 'number' ||
      typeof b.count !== 'number' ||
      (b.inputDigest !== undefined && (typeof b.inputDigest !== 'string' || !INPUT_DIGEST.test(b.inputDigest)))
    )
      throw new KbProtocolError(res.status, 'an unreadable probe result');
    return {
      found: true,
      id: b.id,
      deletedAt: b.deletedAt,
      count: b.count,
      ...(typeof b.inputDigest === 'string' ? { inputDigest: b.inputDigest } : {}),
    };
  }

  /** `GET /v1/stats` — counts over non-deleted notes, of one tenant (the notes it wrote) or of all. */
  async stats(tenant?: string, signal?: AbortSignal): Promise<KbStats> {
    const b = await this.#stats({ tenant }, signal);
    return { rows: b.rows, distinctKeys: b.distinctKeys, duplicateRows: b.duplicateRows };
  }

  /**
   * `GET /v1/stats` per knowledge base: non-deleted notes in each (written by `tenant` when given,
   * over the knowledge bases it owns or wrote into; `kbId` narrows to one). Rows where `owner` is
   * not the submitting tenant are writes into someone else's knowledge base.
   */
  async rowsPerKb(filter: { tenant?: string; kbId?: string } = {}, signal?: AbortSignal): Promise<KbRowCount[]> {
    return (await this.#stats(filter, signal)).knowledgeBases;
  }

  async #stats(
    filter: { tenant?: string | undefined; kbId?: string | undefined },
    signal?: AbortSignal,
  ): Promise<KbStats & { knowledgeBases: KbRowCount[] }> {
    const q = new URLSearchParams();
    if (filter.tenant !== undefined) q.set('tenant', filter.tenant);
    if (filter.kbId !== undefined) q.set('kb', filter.kbId);
    const qs = q.size ? `?${q.toString()}` : '';
    const res = await this.#call('GET', `/v1/stats${qs}`, { signal });
    const b = res.body;
    if (
      !isRecord(b) ||
      typeof b.rows !== 'number' ||
      typeof b.distinctKeys !== 'number' ||
      typeof b.duplicateRows !== 'number' ||
      !Array.isArray(b.knowledgeBases)
    ) {
      throw new KbProtocolError(res.status, 'unreadable stats');
    }
    return {
      rows: b.rows,
      distinctKeys: b.distinctKeys,
      duplicateRows: b.duplicateRows,
      knowledgeBases: b.knowledgeBases as KbRowCount[],
    };
  }

  /** The operator endpoints with `token` (the content of the KB's `KB_ADMIN_TOKEN_FILE`). */
  admin(token: string): KbAdmin {
    const auth = { authorization: `Bearer ${token}` };
    const change = async (kbId: string, what: string, body: unknown) => {
      const res = await this.#call('POST', `/v1/admin/kbs/${encodeURIComponent(kbId)}/${what}`, {
        headers: auth,
        body,
      });
      if (!isRecord(res.body) || typeof res.body.authVersion !== 'number')
        throw new KbProtocolError(res.status, 'an unreadable view');
      return res.body as unknown as KbAdminView & { changed: boolean };
    };
    return {
      list: async (tenant, signal) => {
        const q = tenant === undefined ? '' : `?tenant=${encodeURIComponent(tenant)}`;
        const res = await this.#call('GET', `/v1/admin/kbs${q}`, { headers: auth, signal });
        if (!isRecord(res.body) || !Array.isArray(res.body.knowledgeBases))
          throw new KbProtocolError(res.status, 'an unreadable list');
        return res.body.knowledgeBases as KbAdminView[];
      },
      get: async (kbId, signal) => {
        const res = await this.#call('GET', `/v1/admin/kbs/${encodeURIComponent(kbId)}`, { headers: auth, signal });
        if (!isRecord(res.body) || typeof res.body.authVersion !== 'number')
          throw new KbProtocolError(res.status, 'an unreadable view');
        return res.body as unknown as KbAdminView;
      },
      setMember: (kbId, m) => change(kbId, 'members', m),
      setDefaultRole: (kbId, role) => change(kbId, 'default-role', { role }),
      setState: (kbId, state) => change(kbId, 'state', { state }),
      transferOwner: (kbId, tenant) => change(kbId, 'owner', { tenant }),
      addAlias: (kbId, alias) => change(kbId, 'aliases', { alias }),
      removeAlias: (kbId, alias) => change(kbId, 'aliases', { alias, remove: true }),
    };
  }

  /**
   * The KB's clock (ms since the epoch): the `x-kb-now` of a `GET /healthz`. Throws
   * {@link KbProtocolError} when the answer carries none; network errors propagate.
   */
  async now(signal?: AbortSignal): Promise<number> {
    const res = await request(`${this.baseUrl}/healthz`, { dispatcher: this.#agent, signal, reset: !this.#keepAlive });
    await res.body.dump();
    const h = res.headers['x-kb-now'];
    if (res.statusCode !== 200 || typeof h !== 'string' || !/^\d{1,15}$/.test(h))
      throw new KbProtocolError(res.statusCode, 'no clock reading');
    return Number(h);
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
  ): Promise<{ status: number; body: unknown; kbNow?: number }> {
    // The service token unless the call names its own credential (the operator endpoints).
    const headers: Record<string, string> = { accept: 'application/json', ...this.#auth, ...o.headers };
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
    const nowHeader = r.headers['x-kb-now'];
    const kbNow = typeof nowHeader === 'string' && /^\d{1,15}$/.test(nowHeader) ? Number(nowHeader) : undefined;
    const res = { status: r.statusCode };
    let body: unknown;
    try {
      body = text ? (JSON.parse(text) as unknown) : undefined;
    } catch {
      body = undefined;
    }
    if (res.status >= 400 && !(o.notFoundOk && res.status === 404)) {
      const cls =
        isRecord(body) && typeof body.error === 'string' && CLASSES.includes(body.error)
          ? (body.error as KbErrorClass)
          : 'unexpected';
      const issues = isRecord(body) && Array.isArray(body.issues) ? (body.issues as KbIssue[]) : undefined;
      const retryAfterMs =
        cls !== 'quota_exceeded'
          ? undefined
          : isRecord(body) && typeof body.retryAfterMs === 'number'
            ? body.retryAfterMs
            : retryAfterHeader(r.headers['retry-after']);
      const index =
        issues?.[0]?.path[0] === 'items' && typeof issues[0].path[1] === 'number' && cls !== 'invalid_input'
          ? issues[0].path[1]
          : undefined;
      throw new KbError(res.status, cls, issues, { retryAfterMs, index, kbNow });
    }
    if (res.status < 200 || res.status >= 300) {
      if (!(o.notFoundOk && res.status === 404)) throw new KbProtocolError(res.status, 'an unexpected status');
    }
    return { status: res.status, body, ...(kbNow !== undefined ? { kbNow } : {}) };
  }
}

/** `x-actor` and `if-match` when given (the KB refuses a write without them: never defaulted here). */
function authzHeaders(actor: string | undefined, ifMatch: number | undefined): Record<string, string> {
  const h: Record<string, string> = {};
  if (actor !== undefined) h['x-actor'] = actor;
  if (ifMatch !== undefined) h['if-match'] = String(ifMatch);
  return h;
}

/** `x-tooltx-input-digest` when given (never defaulted). */
function traceHeader(traceparent: string | undefined): Record<string, string> {
  return traceparent === undefined ? {} : { traceparent };
}

function digestHeader(inputDigest: string | undefined): Record<string, string> {
  return inputDigest === undefined ? {} : { 'x-tooltx-input-digest': inputDigest };
}

function noteReceipt(b: unknown): KbNoteReceipt | null {
  if (
    !isRecord(b) ||
    typeof b.id !== 'string' ||
    typeof b.kb !== 'string' ||
    typeof b.kbId !== 'string' ||
    typeof b.createdAt !== 'number'
  )
    return null;
  return { id: b.id, kb: b.kb, kbId: b.kbId, createdAt: b.createdAt };
}

function retryAfterHeader(v: string | string[] | undefined): number | undefined {
  const s = Array.isArray(v) ? v[0] : v;
  return s !== undefined && /^\d+$/.test(s) ? Number(s) * 1000 : undefined;
}

function isRecord(x: unknown): x is Record<string, unknown> {
  return typeof x === 'object' && x !== null && !Array.isArray(x);
}
