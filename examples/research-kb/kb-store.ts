/**
 * The research-KB sample's system of record: a SQLite store (better-sqlite3) of knowledge bases and
 * notes, used by `kb-server.ts` (no HTTP here). DESIGN.md "Sample domain, real parts" and "What the
 * downstream promises": with dedup on it honours the downstream key (`honoursKey`), and it always
 * refuses a write whose absolute deadline has passed, checked inside the insert transaction
 * (`enforcesDeadline`).
 *
 * The note body itself is never stored: only `body_digest` = `sha256:` + hex SHA-256 of its UTF-8
 * bytes. Timestamps are milliseconds since the epoch unless named `*_at TEXT` (ISO-8601, UTC).
 */
import { createHash, randomUUID } from 'node:crypto';
import { mkdirSync } from 'node:fs';
import { dirname } from 'node:path';
import Database from 'better-sqlite3';

/** A note as the KB server receives it (already validated). Times are ISO-8601 strings. */
export interface NoteInput {
  kb: string;
  title: string;
  body: string;
  sourceUrl: string;
  fetchedAt: string;
  publishAt?: string | undefined;
}

/** A stored note as the KB answers for it: `createdAt` in ms since the epoch. */
export interface NoteReceipt {
  id: string;
  kb: string;
  createdAt: number;
}

/**
 * What a write came to:
 * - `created` — a new row was inserted (HTTP 201);
 * - `existing` — dedup on and a non-deleted row with the same (tenant, key) exists: that row (200);
 * - `not_found` — the tenant has no knowledge base of that name (404);
 * - `deadline_passed` — the deadline had passed at the instant of the insert; nothing stored (409).
 */
export type WriteOutcome =
  | { kind: 'created'; note: NoteReceipt }
  | { kind: 'existing'; note: NoteReceipt }
  | { kind: 'not_found' }
  | { kind: 'deadline_passed' };

/** The read-only probe by key: the oldest non-deleted row with that key and how many there are. */
export type ProbeOutcome = ({ found: true; count: number } & NoteReceipt) | { found: false };

/** Counts over non-deleted notes; `duplicateRows` = rows beyond one per (tenant, key). */
export interface KbStats {
  rows: number;
  distinctKeys: number;
  duplicateRows: number;
}

export interface KbStoreOptions {
  /** SQLite file (parent directories are created) or `:memory:`. */
  path: string;
  /** Deduplicate writes by (tenant, downstream key) — the KB's `honoursKey` promise. */
  dedup: boolean;
  /** Clock in ms since the epoch (default `Date.now`); the deadline check uses it. */
  now?: () => number;
}

const SCHEMA = `
CREATE TABLE IF NOT EXISTS knowledge_bases (
  id TEXT PRIMARY KEY,
  tenant TEXT NOT NULL,
  name TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  UNIQUE (tenant, name)
);
CREATE TABLE IF NOT EXISTS notes (
  id TEXT PRIMARY KEY,
  tenant TEXT NOT NULL,
  kb_id TEXT NOT NULL REFERENCES knowledge_bases(id),
  downstream_key TEXT NOT NULL,
  title TEXT NOT NULL,
  body_digest TEXT NOT NULL,
  source_url TEXT NOT NULL,
  fetched_at TEXT NOT NULL,
  publish_at TEXT NULL,
  created_at INTEGER NOT NULL,
  deleted_at INTEGER NULL
);
-- Deliberately NOT unique: with dedup off the KB must be able to hold a double execution.
CREATE INDEX IF NOT EXISTS notes_tenant_key ON notes (tenant, downstream_key);
`;

/** `sha256:` + hex SHA-256 of the UTF-8 text. */
export function bodyDigest(body: string): string {
  return `sha256:${createHash('sha256').update(body, 'utf8').digest('hex')}`;
}

/** ISO-8601 in UTC (`2024-01-02T03:04:05.000Z`) for an instant given in any ISO form. */
function utcIso(s: string): string {
  const t = Date.parse(s);
  return Number.isFinite(t) ? new Date(t).toISOString() : s;
}

interface NoteRow {
  id: string;
  kb: string;
  createdAt: number;
}

/** The store's prepared statements. */
function prepare(db: Database.Database) {
  return {
    kbByName: db.prepare<[string, string], { id: string }>('SELECT id FROM knowledge_bases WHERE tenant = ? AND name = ?'),
    insertKb: db.prepare<[string, string, string, number]>(
      'INSERT INTO knowledge_bases (id, tenant, name, created_at) VALUES (?, ?, ?, ?) ON CONFLICT (tenant, name) DO NOTHING',
    ),
    liveByKey: db.prepare<[string, string], NoteRow & { count: number }>(
      `SELECT n.id AS id, k.name AS kb, n.created_at AS createdAt,
              (SELECT COUNT(*) FROM notes c WHERE c.tenant = n.tenant AND c.downstream_key = n.downstream_key AND c.deleted_at IS NULL) AS count
         FROM notes n JOIN knowledge_bases k ON k.id = n.kb_id
        WHERE n.tenant = ? AND n.downstream_key = ? AND n.deleted_at IS NULL
        ORDER BY n.created_at, n.rowid LIMIT 1`,
    ),
    insertNote: db.prepare<[string, string, string, string, string, string, string, string, string | null, number]>(
      `INSERT INTO notes (id, tenant, kb_id, downstream_key, title, body_digest, source_url, fetched_at, publish_at, created_at)
       VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
    ),
    noteOfTenant: db.prepare<[string, string], { id: string; deletedAt: number | null }>(
      'SELECT id, deleted_at AS deletedAt FROM notes WHERE id = ? AND tenant = ?',
    ),
    softDelete: db.prepare<[number, string, string]>('UPDATE notes SET deleted_at = ? WHERE id = ? AND tenant = ? AND deleted_at IS NULL'),
    statsAll: db.prepare<[], { liveRows: number; liveKeys: number }>(
      `SELECT COALESCE(SUM(n), 0) AS liveRows, COUNT(*) AS liveKeys
         FROM (SELECT COUNT(*) AS n FROM notes WHERE deleted_at IS NULL GROUP BY tenant, downstream_key)`,
    ),
    statsTenant: db.prepare<[string], { liveRows: number; liveKeys: number }>(
      `SELECT COALESCE(SUM(n), 0) AS liveRows, COUNT(*) AS liveKeys
         FROM (SELECT COUNT(*) AS n FROM notes WHERE deleted_at IS NULL AND tenant = ? GROUP BY downstream_key)`,
    ),
  };
}
type Statements = ReturnType<typeof prepare>;

/**
 * The KB's SQLite store. Opens (and creates) the file in WAL mode with `synchronous=FULL`, so a
 * write the server answered for survives a crash of the process or the machine. Every method is
 * synchronous; one store per process.
 */
export class KbStore {
  readonly dedup: boolean;
  readonly #db: Database.Database;
  readonly #now: () => number;
  readonly #stmts: Statements;
  readonly #write: (tenant: string, key: string, deadlineAt: number, note: NoteInput) => WriteOutcome;
  readonly #delete: (tenant: string, id: string) => { id: string; deleted: true } | null;

  constructor(opts: KbStoreOptions) {
    this.dedup = opts.dedup;
    this.#now = opts.now ?? Date.now;
    if (opts.path !== ':memory:') mkdirSync(dirname(opts.path), { recursive: true });
    const db = new Database(opts.path);
    this.#db = db;
    try {
      const mode = String(db.pragma('journal_mode = WAL', { simple: true }));
      if (opts.path !== ':memory:' && mode !== 'wal') throw new Error(`journal_mode is ${mode}, not wal`);
      db.pragma('synchronous = FULL');
      db.pragma('foreign_keys = ON');
      db.pragma('busy_timeout = 5000');
      db.exec(SCHEMA);
    } catch (err) {
      db.close();
      throw err;
    }

    const stmts = prepare(db);
    this.#stmts = stmts;

    // One IMMEDIATE transaction per write: kb lookup, dedup lookup, deadline check, insert.
    const write = db.transaction((tenant: string, key: string, deadlineAt: number, note: NoteInput): WriteOutcome => {
      const kb = stmts.kbByName.get(tenant, note.kb);
      if (!kb) return { kind: 'not_found' };
      if (this.dedup) {
        const prior = stmts.liveByKey.get(tenant, key);
        if (prior) return { kind: 'existing', note: { id: prior.id, kb: prior.kb, createdAt: prior.createdAt } };
      }
      // enforcesDeadline: the last check before the insert, inside the transaction.
      const now = this.#now();
      if (now > deadlineAt) return { kind: 'deadline_passed' };
      const id = `note_${randomUUID()}`;
      stmts.insertNote.run(
        id, tenant, kb.id, key, note.title, bodyDigest(note.body), note.sourceUrl,
        utcIso(note.fetchedAt), note.publishAt === undefined ? null : utcIso(note.publishAt), now,
      );
      return { kind: 'created', note: { id, kb: note.kb, createdAt: now } };
    });
    this.#write = (...args) => write.immediate(...args);

    const del = db.transaction((tenant: string, id: string) => {
      const row = stmts.noteOfTenant.get(id, tenant);
      if (!row) return null;
      if (row.deletedAt === null) stmts.softDelete.run(this.#now(), id, tenant);
      return { id, deleted: true as const };
    });
    this.#delete = (...args) => del.immediate(...args);
  }

  /**
   * Creates the knowledge base `name` of `tenant` unless it exists. Returns its id and whether it
   * was created now.
   */
  ensureKnowledgeBase(tenant: string, name: string): { id: string; created: boolean } {
    const r = this.#stmts.insertKb.run(`kb_${randomUUID()}`, tenant, name, this.#now());
    const row = this.#stmts.kbByName.get(tenant, name);
    if (!row) throw new Error('knowledge base vanished after insert');
    return { id: row.id, created: r.changes === 1 };
  }

  /**
   * Writes a note under the downstream `key` of `tenant`, refusing it when `Date.now()` (the
   * store's clock) is past `deadlineAt` (ms since the epoch) at the instant of the insert. See
   * {@link WriteOutcome}. Throws only on a storage failure (SQLite error).
   */
  writeNote(tenant: string, key: string, deadlineAt: number, note: NoteInput): WriteOutcome {
    return this.#write(tenant, key, deadlineAt, note);
  }

  /** Read-only lookup by (tenant, key) over non-deleted notes. */
  probe(tenant: string, key: string): ProbeOutcome {
    const row = this.#stmts.liveByKey.get(tenant, key);
    return row ? { found: true, id: row.id, kb: row.kb, createdAt: row.createdAt, count: row.count } : { found: false };
  }

  /**
   * Soft-deletes note `id` of `tenant` (sets `deleted_at`); idempotent: an already deleted note
   * answers the same. `null` when there is no such note of that tenant.
   */
  deleteNote(tenant: string, id: string): { id: string; deleted: true } | null {
    return this.#delete(tenant, id);
  }

  /** Counts over non-deleted notes, of one tenant or of all. */
  stats(tenant?: string): KbStats {
    const r = tenant === undefined ? this.#stmts.statsAll.get() : this.#stmts.statsTenant.get(tenant);
    const rows = r?.liveRows ?? 0;
    const distinctKeys = r?.liveKeys ?? 0;
    return { rows, distinctKeys, duplicateRows: rows - distinctKeys };
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
