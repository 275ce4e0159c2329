/**
 * The sample's mail outbox store: a SQLite file (better-sqlite3, WAL, `synchronous=FULL`, files
 * 0600 as the KB's) of drafts, sent mail and discards, used by `mail-server.ts` (no HTTP here).
 * Nothing leaves the machine: "sent" is a row in `sent`.
 *
 * What the downstream promises (docs/clocks.md), the same as the KB's:
 * - with dedup on it honours the caller's downstream key (`honoursKey`): a repeat under a key
 *   answers what the first request under it did; the same key with another request — another
 *   body, another draft, another `x-tooltx-input-digest` — is `key_reused` and changes nothing;
 * - it refuses any write whose absolute deadline has passed, checked inside the write's
 *   transaction on a clock that never goes back, across a restart too (`enforcesDeadline`);
 * - a read-only probe by key for each operation, with the clock at the lookup.
 *
 * Keys are per tenant and per operation: a draft, its send and its discard may share one key (the
 * prepare and execute steps of one tooltx operation do), each in its own table.
 *
 * Drafts: `draft` → `sent` or `discarded`, never back. A discarded draft is never sent; a sent one
 * is never discarded. A draft is sent once: a second send of it (under any key) answers the first
 * sent mail. With dedup off nothing is deduplicated — every request that reaches the insert stores
 * a row, a second send of a sent draft included — so a double execution upstream shows as a
 * duplicate row; the state rules (discarded, sent) still hold.
 *
 * The body of a mail is never stored: only its `sha256:` digest, its size in UTF-8 bytes and, for a
 * draft, the excerpt its preview shows. Timestamps are ms since the epoch.
 */
import { randomUUID } from 'node:crypto';
import Database from 'better-sqlite3';
import { digestOf } from '@tooltx/contracts';
import { bodyDigest, neverBack, privateDatabaseFiles } from './kb-store.js';

/** A mail as the server receives it (already validated). */
export interface MailInput {
  to: string[];
  cc?: string[] | undefined;
  subject: string;
  body: string;
}

/** What a draft shows before it leaves: recipients, subject, an excerpt of the body and its size. */
export interface DraftPreview {
  to: string[];
  cc: string[];
  subject: string;
  excerpt: string;
  bodyBytes: number;
}

export const DRAFT_STATES = ['draft', 'sent', 'discarded'] as const;
export type DraftState = (typeof DRAFT_STATES)[number];

export interface DraftView {
  draftId: string;
  state: DraftState;
  preview: DraftPreview;
  createdAt: number;
}

export const SENT_KINDS = ['draft', 'direct', 'correction'] as const;
export type SentKind = (typeof SENT_KINDS)[number];

/** A sent mail's receipt: `draftId` for a sent draft, `corrects` for a correction. */
export interface SentReceipt {
  id: string;
  kind: SentKind;
  draftId?: string;
  corrects?: string;
  sentAt: number;
}

/** A sent mail as a reader of the outbox sees it (no body: its digest and size). */
export interface SentMail extends SentReceipt {
  to: string[];
  cc: string[];
  subject: string;
  bodyDigest: string;
  bodyBytes: number;
}

export interface DiscardReceipt {
  draftId: string;
  state: 'discarded';
  discardedAt: number;
}

/** Who writes: the tenant and actor, the downstream key, the absolute deadline (ms) and the caller's input digest. */
export interface MailWriteContext {
  tenant: string;
  actor: string;
  key: string;
  deadlineAt: number;
  inputDigest?: string | undefined;
}

/** Which draft: by its id, or by the key it was created under (the oldest draft of that key). */
export type DraftRef = { draftId: string } | { draftKey: string };

/**
 * What a write came to: `created` (a row was stored, HTTP 201), `existing` (dedup on: the key's
 * first answer, or the sent mail of a draft sent before; 200), or a refusal that stored nothing:
 * `key_reused` (422), `not_found` (404: missing and another tenant's alike), `draft_discarded` /
 * `draft_sent` / `deadline_passed` (409).
 */
export type Outcome<T> =
  | { kind: 'created' | 'existing'; value: T }
  | { kind: 'key_reused' | 'not_found' | 'draft_discarded' | 'draft_sent' | 'deadline_passed' };

/** `found` with the first row under the key and how many rows it has (> 1 only with dedup off); `now` = the clock at the lookup. */
export type Probe<T> =
  | ({ found: true; count: number; inputDigest?: string; now: number } & T)
  | { found: false; now: number };

export interface MailStats {
  drafts: Record<DraftState, number>;
  sent: {
    rows: number;
    distinctKeys: number;
    /** Rows beyond one per (tenant, key). */
    duplicateRows: number;
    /** Sent rows beyond one per draft: a draft that left twice. */
    duplicateDraftSends: number;
    byKind: Record<SentKind, number>;
  };
  discards: number;
}

export interface MailStoreOptions {
  /** SQLite file (parent directories are created) or `:memory:`. */
  path: string;
  /** Deduplicate by (tenant, downstream key) and send a draft once: the outbox's `honoursKey` promise. */
  dedup: boolean;
  /** Clock in ms since the epoch (default `Date.now`). */
  now?: () => number;
}

/** Characters of a body the preview shows. */
export const EXCERPT_CHARS = 200;

/** The first {@link EXCERPT_CHARS} characters of the body, whitespace collapsed, `…` when cut. */
export function excerptOfBody(body: string): string {
  const flat = body.replace(/\s+/g, ' ').trim();
  const chars = [...flat];
  return chars.length <= EXCERPT_CHARS ? flat : `${chars.slice(0, EXCERPT_CHARS - 1).join('')}…`;
}

const SCHEMA = `
CREATE TABLE IF NOT EXISTS drafts (
  id TEXT PRIMARY KEY,
  tenant TEXT NOT NULL,
  actor TEXT NOT NULL,
  downstream_key TEXT NOT NULL,
  request_digest TEXT NOT NULL,
  input_digest TEXT NULL,
  recipients TEXT NOT NULL,
  subject TEXT NOT NULL,
  body_digest TEXT NOT NULL,
  body_bytes INTEGER NOT NULL,
  excerpt TEXT NOT NULL,
  state TEXT NOT NULL CHECK (state IN ('draft', 'sent', 'discarded')),
  created_at INTEGER NOT NULL,
  state_at INTEGER NULL
);
CREATE TABLE IF NOT EXISTS sent (
  id TEXT PRIMARY KEY,
  tenant TEXT NOT NULL,
  actor TEXT NOT NULL,
  downstream_key TEXT NOT NULL,
  request_digest TEXT NOT NULL,
  input_digest TEXT NULL,
  kind TEXT NOT NULL CHECK (kind IN ('draft', 'direct', 'correction')),
  draft_id TEXT NULL REFERENCES drafts(id),
  corrects_id TEXT NULL REFERENCES sent(id),
  recipients TEXT NOT NULL,
  subject TEXT NOT NULL,
  body_digest TEXT NOT NULL,
  body_bytes INTEGER NOT NULL,
  sent_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS discards (
  id TEXT PRIMARY KEY,
  tenant TEXT NOT NULL,
  actor TEXT NOT NULL,
  downstream_key TEXT NOT NULL,
  request_digest TEXT NOT NULL,
  input_digest TEXT NULL,
  draft_id TEXT NOT NULL REFERENCES drafts(id),
  discarded_at INTEGER NOT NULL
);
-- Deliberately NOT unique: with dedup off the outbox must be able to hold a double execution.
CREATE INDEX IF NOT EXISTS drafts_tenant_key ON drafts (tenant, downstream_key);
CREATE INDEX IF NOT EXISTS sent_tenant_key ON sent (tenant, downstream_key);
CREATE INDEX IF NOT EXISTS sent_draft ON sent (draft_id);
CREATE INDEX IF NOT EXISTS discards_tenant_key ON discards (tenant, downstream_key);
-- The latest clock reading a probe answered: the clock never starts below it (docs/clocks.md).
CREATE TABLE IF NOT EXISTS clock_floor (id INTEGER PRIMARY KEY CHECK (id = 1), at INTEGER NOT NULL);
`;
export const MAIL_SCHEMA_VERSION = 1;

interface DraftRow {
  id: string;
  tenant: string;
  key: string;
  requestDigest: string;
  inputDigest: string | null;
  recipients: string;
  subject: string;
  bodyDigest: string;
  bodyBytes: number;
  excerpt: string;
  state: DraftState;
  createdAt: number;
}

interface SentRow {
  id: string;
  key: string;
  requestDigest: string;
  inputDigest: string | null;
  kind: SentKind;
  draftId: string | null;
  corrects: string | null;
  recipients: string;
  subject: string;
  bodyDigest: string;
  bodyBytes: number;
  sentAt: number;
}

interface DiscardRow {
  key: string;
  requestDigest: string;
  inputDigest: string | null;
  draftId: string;
  discardedAt: number;
}

const DRAFT_COLS = `id, tenant, downstream_key AS key, request_digest AS requestDigest, input_digest AS inputDigest,
  recipients, subject, body_digest AS bodyDigest, body_bytes AS bodyBytes, excerpt, state, created_at AS createdAt`;
const SENT_COLS = `id, downstream_key AS key, request_digest AS requestDigest, input_digest AS inputDigest, kind,
  draft_id AS draftId, corrects_id AS corrects, recipients, subject, body_digest AS bodyDigest,
  body_bytes AS bodyBytes, sent_at AS sentAt`;
const DISCARD_COLS = `downstream_key AS key, request_digest AS requestDigest, input_digest AS inputDigest,
  draft_id AS draftId, discarded_at AS discardedAt`;

function prepare(db: Database.Database) {
  // The first row under a key (the one dedup replays and the probe names) and how many there are.
  const firstByKey = <R>(table: string, cols: string, order: string) =>
    db.prepare<[string, string], R & { count: number }>(
      `SELECT ${cols}, (SELECT COUNT(*) FROM ${table} c WHERE c.tenant = t.tenant AND c.downstream_key = t.downstream_key) AS count
         FROM ${table} t WHERE t.tenant = ? AND t.downstream_key = ? ORDER BY ${order}, t.rowid LIMIT 1`,
    );
  return {
    draftByKey: firstByKey<DraftRow>('drafts', DRAFT_COLS, 'created_at'),
    draftById: db.prepare<[string, string], DraftRow>(`SELECT ${DRAFT_COLS} FROM drafts WHERE id = ? AND tenant = ?`),
    insertDraft: db.prepare<
      [string, string, string, string, string, string | null, string, string, string, number, string, number]
    >(
      `INSERT INTO drafts (id, tenant, actor, downstream_key, request_digest, input_digest, recipients, subject,
                           body_digest, body_bytes, excerpt, state, created_at)
       VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'draft', ?)`,
    ),
    setDraftState: db.prepare<[DraftState, number, string]>('UPDATE drafts SET state = ?, state_at = ? WHERE id = ?'),

    sentByKey: firstByKey<SentRow>('sent', SENT_COLS, 'sent_at'),
    sentById: db.prepare<[string, string], SentRow>(`SELECT ${SENT_COLS} FROM sent WHERE id = ? AND tenant = ?`),
    firstSentOfDraft: db.prepare<[string], SentRow>(
      `SELECT ${SENT_COLS} FROM sent WHERE draft_id = ? ORDER BY sent_at, rowid LIMIT 1`,
    ),
    insertSent: db.prepare<
      [
        string,
        string,
        string,
        string,
        string,
        string | null,
        SentKind,
        string | null,
        string | null,
        string,
        string,
        string,
        number,
        number,
      ]
    >(
      `INSERT INTO sent (id, tenant, actor, downstream_key, request_digest, input_digest, kind, draft_id, corrects_id,
                         recipients, subject, body_digest, body_bytes, sent_at)
       VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
    ),

    discardByKey: firstByKey<DiscardRow>('discards', DISCARD_COLS, 'discarded_at'),
    firstDiscardOfDraft: db.prepare<[string], { discardedAt: number }>(
      'SELECT discarded_at AS discardedAt FROM discards WHERE draft_id = ? ORDER BY discarded_at, rowid LIMIT 1',
    ),
    insertDiscard: db.prepare<[string, string, string, string, string, string | null, string, number]>(
      `INSERT INTO discards (id, tenant, actor, downstream_key, request_digest, input_digest, draft_id, discarded_at)
       VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
    ),

    clockFloor: db.prepare<[], { at: number }>('SELECT at FROM clock_floor WHERE id = 1'),
    setClockFloor: db.prepare<[number]>(
      'INSERT INTO clock_floor (id, at) VALUES (1, ?) ON CONFLICT (id) DO UPDATE SET at = excluded.at',
    ),
  };
}
type Statements = ReturnType<typeof prepare>;

function recipientsOf(mail: MailInput): string {
  return JSON.stringify({ to: mail.to, cc: mail.cc ?? [] });
}

function previewOf(r: DraftRow): DraftPreview {
  const { to, cc } = JSON.parse(r.recipients) as { to: string[]; cc: string[] };
  return { to, cc, subject: r.subject, excerpt: r.excerpt, bodyBytes: r.bodyBytes };
}

function draftView(r: DraftRow): DraftView {
  return { draftId: r.id, state: r.state, preview: previewOf(r), createdAt: r.createdAt };
}

function sentReceipt(r: SentRow): SentReceipt {
  return {
    id: r.id,
    kind: r.kind,
    ...(r.draftId !== null ? { draftId: r.draftId } : {}),
    ...(r.corrects !== null ? { corrects: r.corrects } : {}),
    sentAt: r.sentAt,
  };
}

function digestField(r: { inputDigest: string | null }): { inputDigest?: string } {
  return r.inputDigest === null ? {} : { inputDigest: r.inputDigest };
}

/**
 * The mail outbox's SQLite store. Every method is synchronous and every write runs in one
 * IMMEDIATE transaction (the write lock is taken before the first read), so a concurrent repeat of
 * a key waits and then replays. One store per process.
 */
export class MailStore {
  readonly dedup: boolean;
  readonly #db: Database.Database;
  readonly #stmts: Statements;
  readonly #now: () => number;
  #floor: number;

  constructor(opts: MailStoreOptions) {
    this.dedup = opts.dedup;
    if (opts.path !== ':memory:') privateDatabaseFiles(opts.path);
    const db = new Database(opts.path);
    this.#db = db;
    try {
      const mode = String(db.pragma('journal_mode = WAL', { simple: true }));
      if (opts.path !== ':memory:' && mode !== 'wal') throw new Error(`journal_mode is ${mode}, not wal`);
      // An answered send survives a crash of the process or the machine.
      db.pragma('synchronous = FULL');
      db.pragma('foreign_keys = ON');
      db.pragma('busy_timeout = 5000');
      db.transaction(() => {
        db.exec(SCHEMA);
        if (Number(db.pragma('user_version', { simple: true })) < MAIL_SCHEMA_VERSION)
          db.pragma(`user_version = ${MAIL_SCHEMA_VERSION}`);
      }).immediate();
    } catch (err) {
      db.close();
      throw err;
    }
    this.#stmts = prepare(db);
    this.#floor = this.#stmts.clockFloor.get()?.at ?? 0;
    this.#now = neverBack(opts.now ?? Date.now, this.#floor);
  }

  #tx<T>(fn: () => T): T {
    return this.#db.transaction(fn).immediate();
  }

  /** The store's clock, ms since the epoch: the one the deadline check reads, and it never goes back. */
  now(): number {
    return this.#now();
  }

  /**
   * Whether a prior row under the key answers this request: `replay` (same request), `key_reused`
   * (another request: another digest of it, or another input digest from the caller), or `none`.
   */
  #prior(
    prior: { requestDigest: string; inputDigest: string | null } | undefined,
    requestDigest: string,
    inputDigest: string | undefined,
  ): 'none' | 'replay' | 'key_reused' {
    if (!this.dedup || !prior) return 'none';
    if (prior.requestDigest !== requestDigest) return 'key_reused';
    if (prior.inputDigest && inputDigest && prior.inputDigest !== inputDigest) return 'key_reused';
    return 'replay';
  }

  #draftOf(tenant: string, ref: DraftRef): DraftRow | undefined {
    return 'draftId' in ref
      ? this.#stmts.draftById.get(ref.draftId, tenant)
      : this.#stmts.draftByKey.get(tenant, ref.draftKey);
  }

  // -------------------------------------------------------------------------------------------
  // Writes

  /** Stores a draft (nothing leaves) and answers its preview. */
  createDraft(ctx: MailWriteContext, mail: MailInput): Outcome<DraftView> {
    const requestDigest = digestOf({
      op: 'draft',
      to: mail.to,
      cc: mail.cc ?? [],
      subject: mail.subject,
      body: mail.body,
    });
    return this.#tx((): Outcome<DraftView> => {
      const prior = this.#stmts.draftByKey.get(ctx.tenant, ctx.key);
      const p = this.#prior(prior, requestDigest, ctx.inputDigest);
      if (p === 'key_reused') return { kind: p };
      if (p === 'replay') return { kind: 'existing', value: draftView(prior!) };
      const now = this.#now();
      // enforcesDeadline: the last check before the insert, inside the transaction.
      if (now > ctx.deadlineAt) return { kind: 'deadline_passed' };
      const id = `draft_${randomUUID()}`;
      this.#stmts.insertDraft.run(
        id,
        ctx.tenant,
        ctx.actor,
        ctx.key,
        requestDigest,
        ctx.inputDigest ?? null,
        recipientsOf(mail),
        mail.subject,
        bodyDigest(mail.body),
        Buffer.byteLength(mail.body, 'utf8'),
        excerptOfBody(mail.body),
        now,
      );
      return { kind: 'created', value: draftView(this.#stmts.draftById.get(id, ctx.tenant)!) };
    });
  }

  /**
   * Sends a draft of the tenant: records a sent mail and marks the draft `sent`. A discarded draft
   * is refused (`draft_discarded`); with dedup on, a draft already sent answers its first sent
   * mail (`existing`), so a draft leaves once.
   */
  sendDraft(ctx: MailWriteContext, ref: DraftRef): Outcome<SentReceipt> {
    const requestDigest = digestOf({ op: 'send_draft', ...ref });
    return this.#tx((): Outcome<SentReceipt> => {
      const prior = this.#stmts.sentByKey.get(ctx.tenant, ctx.key);
      const p = this.#prior(prior, requestDigest, ctx.inputDigest);
      if (p === 'key_reused') return { kind: p };
      if (p === 'replay') return { kind: 'existing', value: sentReceipt(prior!) };
      const draft = this.#draftOf(ctx.tenant, ref);
      if (!draft) return { kind: 'not_found' };
      if (draft.state === 'discarded') return { kind: 'draft_discarded' };
      if (draft.state === 'sent' && this.dedup) {
        const first = this.#stmts.firstSentOfDraft.get(draft.id);
        if (first) return { kind: 'existing', value: sentReceipt(first) };
      }
      const now = this.#now();
      if (now > ctx.deadlineAt) return { kind: 'deadline_passed' };
      const id = this.#insertSent(ctx, requestDigest, 'draft', draft.id, null, {
        recipients: draft.recipients,
        subject: draft.subject,
        bodyDigest: draft.bodyDigest,
        bodyBytes: draft.bodyBytes,
        now,
      });
      if (draft.state === 'draft') this.#stmts.setDraftState.run('sent', now, draft.id);
      return { kind: 'created', value: sentReceipt(this.#stmts.sentById.get(id, ctx.tenant)!) };
    });
  }

  /**
   * Discards a draft of the tenant: it can never be sent. A sent draft is refused (`draft_sent`);
   * a draft discarded before answers that discard again (recorded under this key too).
   */
  discardDraft(ctx: MailWriteContext, ref: DraftRef): Outcome<DiscardReceipt> {
    const requestDigest = digestOf({ op: 'discard', ...ref });
    return this.#tx((): Outcome<DiscardReceipt> => {
      const prior = this.#stmts.discardByKey.get(ctx.tenant, ctx.key);
      const p = this.#prior(prior, requestDigest, ctx.inputDigest);
      if (p === 'key_reused') return { kind: p };
      if (p === 'replay') return { kind: 'existing', value: discardReceipt(prior!) };
      const draft = this.#draftOf(ctx.tenant, ref);
      if (!draft) return { kind: 'not_found' };
      if (draft.state === 'sent') return { kind: 'draft_sent' };
      const now = this.#now();
      if (now > ctx.deadlineAt) return { kind: 'deadline_passed' };
      const discardedAt = this.#stmts.firstDiscardOfDraft.get(draft.id)?.discardedAt ?? now;
      this.#stmts.insertDiscard.run(
        `discard_${randomUUID()}`,
        ctx.tenant,
        ctx.actor,
        ctx.key,
        requestDigest,
        ctx.inputDigest ?? null,
        draft.id,
        discardedAt,
      );
      if (draft.state === 'draft') this.#stmts.setDraftState.run('discarded', now, draft.id);
      return { kind: 'created', value: { draftId: draft.id, state: 'discarded', discardedAt } };
    });
  }

  /** Sends a mail at once (no draft). */
  sendMail(ctx: MailWriteContext, mail: MailInput): Outcome<SentReceipt> {
    return this.#sendNew(ctx, mail, null);
  }

  /**
   * Sends a correction of the tenant's sent mail `corrects`: a NEW mail that refers to it (the
   * corrected mail stays sent; nothing is ever unsent). `not_found` when `corrects` is not a sent
   * mail of the tenant.
   */
  sendCorrection(ctx: MailWriteContext, mail: MailInput & { corrects: string }): Outcome<SentReceipt> {
    return this.#sendNew(ctx, mail, mail.corrects);
  }

  #sendNew(ctx: MailWriteContext, mail: MailInput, corrects: string | null): Outcome<SentReceipt> {
    const kind: SentKind = corrects === null ? 'direct' : 'correction';
    const requestDigest = digestOf({
      op: kind,
      corrects,
      to: mail.to,
      cc: mail.cc ?? [],
      subject: mail.subject,
      body: mail.body,
    });
    return this.#tx((): Outcome<SentReceipt> => {
      const prior = this.#stmts.sentByKey.get(ctx.tenant, ctx.key);
      const p = this.#prior(prior, requestDigest, ctx.inputDigest);
      if (p === 'key_reused') return { kind: p };
      if (p === 'replay') return { kind: 'existing', value: sentReceipt(prior!) };
      if (corrects !== null && !this.#stmts.sentById.get(corrects, ctx.tenant)) return { kind: 'not_found' };
      const now = this.#now();
      if (now > ctx.deadlineAt) return { kind: 'deadline_passed' };
      const id = this.#insertSent(ctx, requestDigest, kind, null, corrects, {
        recipients: recipientsOf(mail),
        subject: mail.subject,
        bodyDigest: bodyDigest(mail.body),
        bodyBytes: Buffer.byteLength(mail.body, 'utf8'),
        now,
      });
      return { kind: 'created', value: sentReceipt(this.#stmts.sentById.get(id, ctx.tenant)!) };
    });
  }

  #insertSent(
    ctx: MailWriteContext,
    requestDigest: string,
    kind: SentKind,
    draftId: string | null,
    corrects: string | null,
    m: { recipients: string; subject: string; bodyDigest: string; bodyBytes: number; now: number },
  ): string {
    const id = `mail_${randomUUID()}`;
    this.#stmts.insertSent.run(
      id,
      ctx.tenant,
      ctx.actor,
      ctx.key,
      requestDigest,
      ctx.inputDigest ?? null,
      kind,
      draftId,
      corrects,
      m.recipients,
      m.subject,
      m.bodyDigest,
      m.bodyBytes,
      m.now,
    );
    return id;
  }

  // -------------------------------------------------------------------------------------------
  // Reads

  /**
   * The clock read together with a lookup, stored before it is answered: no write can fall between
   * the two, and after a restart on a clock that went back no request whose deadline a probe
   * declared passed is stored (docs/clocks.md).
   */
  #probeNow(): number {
    const now = this.#now();
    if (now > this.#floor) {
      this.#stmts.setClockFloor.run(now);
      this.#floor = now;
    }
    return now;
  }

  /** Read-only: the first draft created under the key (whatever its state now). */
  probeDraft(tenant: string, key: string): Probe<DraftView> {
    const now = this.#probeNow();
    const r = this.#stmts.draftByKey.get(tenant, key);
    return r ? { found: true, ...draftView(r), count: r.count, ...digestField(r), now } : { found: false, now };
  }

  /** Read-only: the first mail sent under the key (a sent draft, a direct mail or a correction). */
  probeSent(tenant: string, key: string): Probe<SentReceipt> {
    const now = this.#probeNow();
    const r = this.#stmts.sentByKey.get(tenant, key);
    return r ? { found: true, ...sentReceipt(r), count: r.count, ...digestField(r), now } : { found: false, now };
  }

  /** Read-only: the first discard made under the key. */
  probeDiscard(tenant: string, key: string): Probe<DiscardReceipt> {
    const now = this.#probeNow();
    const r = this.#stmts.discardByKey.get(tenant, key);
    return r ? { found: true, ...discardReceipt(r), count: r.count, ...digestField(r), now } : { found: false, now };
  }

  /** A sent mail of the tenant by id (no body), or null. */
  sentMail(tenant: string, id: string): SentMail | null {
    const r = this.#stmts.sentById.get(id, tenant);
    if (!r) return null;
    const { to, cc } = JSON.parse(r.recipients) as { to: string[]; cc: string[] };
    return { ...sentReceipt(r), to, cc, subject: r.subject, bodyDigest: r.bodyDigest, bodyBytes: r.bodyBytes };
  }

  /** Counts over every row (of one tenant when given): nothing here deduplicates, so a double send shows. */
  stats(tenant?: string): MailStats {
    const where = tenant === undefined ? '' : 'WHERE tenant = @tenant';
    const args: Record<string, string> = tenant === undefined ? {} : { tenant };
    const get = <R>(sql: string) => this.#db.prepare<[Record<string, string>], R>(sql).get(args)!;
    const drafts = { draft: 0, sent: 0, discarded: 0 };
    for (const r of this.#db
      .prepare<[Record<string, string>], { state: DraftState; n: number }>(
        `SELECT state, COUNT(*) AS n FROM drafts ${where} GROUP BY state`,
      )
      .all(args))
      drafts[r.state] = r.n;
    const byKind = { draft: 0, direct: 0, correction: 0 };
    for (const r of this.#db
      .prepare<[Record<string, string>], { kind: SentKind; n: number }>(
        `SELECT kind, COUNT(*) AS n FROM sent ${where} GROUP BY kind`,
      )
      .all(args))
      byKind[r.kind] = r.n;
    const keys = get<{ rows: number; keys: number }>(
      `SELECT COALESCE(SUM(n), 0) AS rows, COUNT(*) AS keys
         FROM (SELECT COUNT(*) AS n FROM sent ${where} GROUP BY tenant, downstream_key)`,
    );
    const perDraft = get<{ extra: number }>(
      `SELECT COALESCE(SUM(n - 1), 0) AS extra
         FROM (SELECT COUNT(*) AS n FROM sent ${where === '' ? 'WHERE' : `${where} AND`} draft_id IS NOT NULL GROUP BY draft_id)`,
    );
    const discards = get<{ n: number }>(`SELECT COUNT(*) AS n FROM discards ${where}`);
    return {
      drafts,
      sent: {
        rows: keys.rows,
        distinctKeys: keys.keys,
        duplicateRows: keys.rows - keys.keys,
        duplicateDraftSends: perDraft.extra,
        byKind,
      },
      discards: discards.n,
    };
  }

  /** The connection's own `journal_mode` and `synchronous` (0 OFF, 1 NORMAL, 2 FULL, 3 EXTRA). */
  pragmas(): { journalMode: string; synchronous: number } {
    return {
      journalMode: String(this.#db.pragma('journal_mode', { simple: true })),
      synchronous: Number(this.#db.pragma('synchronous', { simple: true })),
    };
  }

  /** Closes the database (checkpoints the WAL). Idempotent. */
  close(): void {
    if (this.#db.open) this.#db.close();
  }
}

function discardReceipt(r: DiscardRow): DiscardReceipt {
  return { draftId: r.draftId, state: 'discarded', discardedAt: r.discardedAt };
}
