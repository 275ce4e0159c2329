/**
 * The research-KB sample's system of record: a SQLite store (better-sqlite3) of tenants, knowledge
 * bases, their aliases and members, and notes, used by `kb-server.ts` (no HTTP here).
 *
 * What the downstream promises (docs/clocks.md), authorisation recomputed at the execution instant
 * (FM-07, FM-08) and canonical resource ids (FM-10):
 * - with dedup on it honours the downstream key (`honoursKey`), and it always refuses a write whose
 *   absolute deadline has passed, checked inside the insert transaction (`enforcesDeadline`);
 * - ONE resolver ({@link KbStore.resolve}, over {@link canonicalRef}) turns any reference — name,
 *   alias, internal `kb_<uuid>` id, in any case, percent-encoded or not, NFC or NFD — into one
 *   knowledge base of the caller's tenant, or nothing: a missing, another tenant's and a
 *   soft-deleted knowledge base are indistinguishable. Every path (resolve, write, batch, delete)
 *   goes through it;
 * - a write is checked in ONE immediate transaction with its insert, in this order: resolve, dedup,
 *   state (frozen), the authorisation version the caller checked (If-Match), the actor's current
 *   role, the tenant's quota, the deadline;
 * - `auth_version` of a knowledge base changes ONLY when its owner, state, aliases, members, roles
 *   or default role change — never on note inserts, deletes or quota counting.
 *
 * Roles: an explicit member row `(kb, tenant, actor, role)` wins; otherwise the knowledge base's
 * `default_role` applies to every actor of the owner tenant (`KB_SEED` without actors sets it to
 * `writer`; NULL = no role). A revoked member of a knowledge base with a default role is kept as an
 * explicit `none` row, so revocation is never undone by the default.
 *
 * Quotas are counted PER TENANT (the tenant list sets `quota_limit`, NULL = unlimited) in a daily
 * window aligned to UTC midnight: `quota_used` counts notes inserted by the tenant in the current
 * window (deletes do not refund), and a refusal says how long until the next window.
 *
 * The note body itself is never stored: only `body_digest` = `sha256:` + hex SHA-256 of its UTF-8
 * bytes. A write may carry the caller's `input_digest` (tooltx's RFC 8785 digest of the operation's
 * normalised input, `sha256:` + 64 hex): it is stored with the row and answered by the probe, so
 * recovery can tell its own effect from another under the same key; rows written without
 * one (and rows from before schema version 2) have NULL. Timestamps are milliseconds since the epoch unless named `*_at TEXT` (ISO-8601, UTC).
 */
import { createHash, randomUUID } from 'node:crypto';
import { chmodSync, closeSync, mkdirSync, openSync, statSync } from 'node:fs';
import { dirname } from 'node:path';
import Database from 'better-sqlite3';

/** A note as the KB server receives it (already validated). `kb` is any reference; times ISO-8601. */
export interface NoteInput {
  kb: string;
  title: string;
  body: string;
  sourceUrl: string;
  fetchedAt: string;
  publishAt?: string | undefined;
}

/** A stored note as the KB answers for it: `kb` is the knowledge base's name, `createdAt` in ms. */
export interface NoteReceipt {
  id: string;
  kb: string;
  kbId: string;
  createdAt: number;
}

export const KB_ROLES = ['reader', 'writer', 'admin'] as const;
export type KbRole = (typeof KB_ROLES)[number];
export const KB_STATES = ['active', 'frozen', 'deleted'] as const;
export type KbState = (typeof KB_STATES)[number];

/** Roles that may write and delete notes. */
const WRITE_ROLES: ReadonlySet<string> = new Set<KbRole>(['writer', 'admin']);

/** A knowledge base as the resolver finds it (never a deleted one). */
export interface KbRecord {
  id: string;
  /** The owner tenant. */
  tenant: string;
  name: string;
  state: Exclude<KbState, 'deleted'>;
  authVersion: number;
  /** The role of any actor of the owner tenant without an explicit member row. */
  defaultRole: KbRole | null;
}

/** What `GET /v1/resolve` answers: the caller's own role (or null) on the resolved knowledge base. */
export interface Resolution {
  kbId: string;
  name: string;
  state: Exclude<KbState, 'deleted'>;
  authVersion: number;
  role: KbRole | null;
}

/** Who writes: the authenticated tenant and actor, the downstream key and the absolute deadline. */
export interface WriteContext {
  tenant: string;
  actor: string;
  key: string;
  /** ms since the epoch. */
  deadlineAt: number;
  /** The caller's digest of what it asked (`sha256:` + 64 hex, already validated), stored with the row(s); absent = NULL. */
  inputDigest?: string | undefined;
}

/**
 * What a write came to:
 * - `created` — a new row was inserted (HTTP 201);
 * - `existing` — dedup on and a non-deleted row with the same (tenant, key) exists: that row (200);
 * - `key_reused` — dedup on, and that row was written with another input digest than this request
 *   carries: the key was reused for a different request, nothing is returned or stored (422, as the
 *   IETF Idempotency-Key HTTP header draft advises);
 * - `not_found` — no knowledge base of the caller's tenant answers to the reference (404; also a
 *   foreign or soft-deleted one);
 * - `frozen` — the knowledge base is frozen (409);
 * - `version_conflict` — its authorisation version is not the one the caller checked (412);
 * - `forbidden` — the actor's current role may not write (403);
 * - `quota_exceeded` — the tenant's quota of the current window is used up (429);
 * - `deadline_passed` — the deadline had passed at the instant of the insert (409).
 * Nothing is stored unless `created`.
 */
export type WriteOutcome =
  | { kind: 'created'; note: NoteReceipt }
  | { kind: 'existing'; note: NoteReceipt }
  | { kind: 'not_found' | 'frozen' | 'version_conflict' | 'forbidden' | 'deadline_passed' | 'key_reused' }
  | { kind: 'quota_exceeded'; retryAfterMs: number };

/** A batch's outcome; a refusal names the first refused item's `index` (nothing is stored). */
export type BatchOutcome =
  | { kind: 'created'; notes: NoteReceipt[] }
  | { kind: 'existing'; notes: NoteReceipt[] }
  | { kind: 'not_found' | 'frozen' | 'version_conflict' | 'forbidden'; index: number }
  | { kind: 'quota_exceeded'; index: number; retryAfterMs: number }
  | { kind: 'deadline_passed' };

/**
 * A delete's outcome: `deleted` (also for an already deleted note, and — dedup on — for a repeat
 * under the key: idempotent; `deletedAt` = when the note was deleted), or a refusal that changed
 * nothing; `key_reused` (dedup on): the key holds a delete of another note or of another input digest.
 */
export type DeleteOutcome =
  | { kind: 'deleted'; id: string; deletedAt: number }
  | { kind: 'not_found' | 'frozen' | 'version_conflict' | 'forbidden' | 'key_reused' };

/** The read-only probe of deletes by key: the first delete under it and how many there are. */
export type DeleteProbeOutcome =
  | { found: true; id: string; deletedAt: number; count: number; inputDigest?: string; now: number }
  | { found: false; now: number };

/**
 * The read-only probe by key: the oldest row with that key (deleted ones too) and how many there are.
 * `inputDigest`: the digest that row was written with (a batch: item 0's), absent when it has none.
 */
export type ProbeOutcome =
  | ({
      found: true;
      count: number;
      inputDigest?: string;
      deleted?: true;
      items?: { id: string; kb: string; createdAt: number }[];
      now: number;
    } & Omit<NoteReceipt, 'kbId'>)
  /** `now`: the store's clock at the lookup (see {@link KbStore.probe}). */
  | { found: false; now: number };

/** Counts over non-deleted notes; `duplicateRows` = rows beyond one per (tenant, key). */
export interface KbStats {
  rows: number;
  distinctKeys: number;
  duplicateRows: number;
}

/** Non-deleted notes per knowledge base (of the notes written by one tenant when filtered). */
export interface KbRowCount {
  kbId: string;
  owner: string;
  name: string;
  state: KbState;
  rows: number;
}

/** An explicit member row; `none` = revoked (overrides the default role). */
export interface KbMember {
  tenant: string;
  actor: string;
  role: KbRole | 'none';
}

/** The operator's view of a knowledge base (quota figures are the owner tenant's, current window). */
export interface KbAdminView {
  kbId: string;
  tenant: string;
  name: string;
  state: KbState;
  authVersion: number;
  quotaUsed: number;
  quotaLimit: number | null;
  aliases: string[];
  defaultRole: KbRole | null;
  members: KbMember[];
}

/** An operator change: `conflict` (409) and `invalid` (400) carry a reason that names no other tenant's data. */
export type AdminOutcome =
  | { kind: 'ok'; kb: KbAdminView; changed: boolean }
  | { kind: 'not_found' }
  | { kind: 'conflict'; reason: string }
  | { kind: 'invalid'; path: string; reason: string };

/** A knowledge base to create (seeding). */
export interface KbSpec {
  tenant: string;
  name: string;
  aliases?: string[];
  members?: { actor: string; role: KbRole }[];
  defaultRole?: KbRole | null;
  state?: KbState;
}

export interface KbStoreOptions {
  /** SQLite file (parent directories are created) or `:memory:`. */
  path: string;
  /** Deduplicate writes by (tenant, downstream key) — the KB's `honoursKey` promise. */
  dedup: boolean;
  /** Clock in ms since the epoch (default `Date.now`); the deadline and quota window use it. */
  now?: () => number;
  /** Length of a quota window in ms, windows aligned to the epoch (default one day: UTC midnights). */
  quotaWindowMs?: number;
}

/** The schema before roles (user_version 0); kept as the base every migration starts from. */
const BASE_SCHEMA = `
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

/** Schema version 1: authorisation state. Applied once, in one transaction. */
const MIGRATION_1_TABLES = `
CREATE TABLE IF NOT EXISTS tenants (
  id TEXT PRIMARY KEY,
  quota_limit INTEGER NULL,
  quota_used INTEGER NOT NULL DEFAULT 0,
  quota_window_start INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS kb_aliases (
  tenant TEXT NOT NULL,
  alias TEXT NOT NULL,
  kb_id TEXT NOT NULL REFERENCES knowledge_bases(id),
  PRIMARY KEY (tenant, alias)
);
CREATE INDEX IF NOT EXISTS kb_aliases_kb ON kb_aliases (kb_id);
CREATE TABLE IF NOT EXISTS kb_members (
  kb_id TEXT NOT NULL REFERENCES knowledge_bases(id),
  tenant TEXT NOT NULL,
  actor TEXT NOT NULL,
  role TEXT NOT NULL CHECK (role IN ('reader', 'writer', 'admin', 'none')),
  PRIMARY KEY (kb_id, tenant, actor)
);
CREATE INDEX IF NOT EXISTS notes_kb ON notes (kb_id);
`;
const MIGRATION_1_COLUMNS: [string, string][] = [
  ['state', `state TEXT NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'frozen', 'deleted'))`],
  ['auth_version', 'auth_version INTEGER NOT NULL DEFAULT 1'],
  ['default_role', `default_role TEXT NULL CHECK (default_role IN ('reader', 'writer', 'admin'))`],
];
/** Schema version 2: the caller's input digest with each note (NULL for older rows). */
const MIGRATION_2_COLUMNS: [string, string][] = [['input_digest', 'input_digest TEXT NULL']];
/**
 * Schema version 3: the latest clock reading a probe answered (ms since the epoch). The store's clock
 * starts from it, so a KB restarted on a machine whose clock went back never stores a request whose
 * deadline a probe already declared passed (docs/clocks.md).
 */
const MIGRATION_3_TABLES = `CREATE TABLE IF NOT EXISTS clock_floor (id INTEGER PRIMARY KEY CHECK (id = 1), at INTEGER NOT NULL);`;
/**
 * Schema version 4: each delete request stored under its downstream key (the delete is idempotent
 * by that key and found by its own probe, as a write is). Not unique: with dedup off every delete
 * that passes its checks is a row, so a double execution shows.
 */
const MIGRATION_4_TABLES = `
CREATE TABLE IF NOT EXISTS note_deletes (
  id TEXT PRIMARY KEY,
  tenant TEXT NOT NULL,
  downstream_key TEXT NOT NULL,
  note_id TEXT NOT NULL REFERENCES notes(id),
  input_digest TEXT NULL,
  deleted_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS note_deletes_tenant_key ON note_deletes (tenant, downstream_key);
`;
export const SCHEMA_VERSION = 4;

/**
 * Every non-deleted note row in the KB file `file` — its downstream key (a batch item's is
 * `<key>#<index>`), its knowledge base and that knowledge base's CURRENT owner — read through its
 * own read-only connection (safe next to a running KB: WAL). For checks from outside the service,
 * such as the demo's unauthorised-write count; the row's own tenant column is deliberately not
 * returned, so such a check cannot lean on what the writer said it was. Throws better-sqlite3's
 * error when the file is missing or not a KB.
 */
export function readLiveRows(file: string): { key: string; kbId: string; owner: string }[] {
  const db = new Database(file, { readonly: true, fileMustExist: true });
  try {
    return db
      .prepare<[], { key: string; kbId: string; owner: string }>(
        `SELECT n.downstream_key AS key, n.kb_id AS kbId, k.tenant AS owner
           FROM notes n JOIN knowledge_bases k ON k.id = n.kb_id
          WHERE n.deleted_at IS NULL
          ORDER BY n.rowid`,
      )
      .all();
  } finally {
    db.close();
  }
}

/** `sha256:` + hex SHA-256 of the UTF-8 text. */
export function bodyDigest(body: string): string {
  return `sha256:${createHash('sha256').update(body, 'utf8').digest('hex')}`;
}

/**
 * The canonical form of a knowledge-base reference, or `null` when it cannot name anything:
 * percent-decoded ONCE (an invalid encoding → null), Unicode NFC, trimmed, lower-cased (and NFC
 * again: lower-casing may decompose). `Research%2DNotes`, ` research-notes ` and `RESEARCH-NOTES`
 * are one reference; `%252D` decodes to the literal `%2D`, not to `-`. Exported so the trusted
 * tools canonicalise exactly as the KB does.
 */
export function canonicalRef(ref: string): string | null {
  let s: string;
  try {
    s = decodeURIComponent(ref);
  } catch {
    return null;
  }
  s = s.normalize('NFC').trim().toLowerCase().normalize('NFC');
  return s.length > 0 ? s : null;
}

/** An internal knowledge-base id: `kb_` + a lower-case UUID. */
export const KB_ID = /^kb_[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
/** A knowledge-base name (already canonical). */
export const KB_NAME = /^[a-z0-9_-]{1,64}$/;
/** Longest alias, in UTF-16 code units, after canonicalisation. */
export const MAX_ALIAS = 128;

/** Why an alias (already canonical) is not acceptable, or null. */
function aliasProblem(alias: string): string | null {
  if (alias.length > MAX_ALIAS) return `longer than ${MAX_ALIAS} characters`;
  // eslint-disable-next-line no-control-regex
  // biome-ignore lint/suspicious/noControlCharactersInRegex: the control characters are what it looks for
  if (/[\u0000-\u001f\u007f-\u009f]/.test(alias)) return 'contains a control character';
  if (alias.includes('%')) return 'contains "%" (references are percent-decoded once)';
  if (alias.startsWith('kb_')) return 'starts with "kb_" (reserved for internal ids)';
  return null;
}

/** ISO-8601 in UTC (`2024-01-02T03:04:05.000Z`) for an instant given in any ISO form. */
function utcIso(s: string): string {
  const t = Date.parse(s);
  return Number.isFinite(t) ? new Date(t).toISOString() : s;
}

interface KbRow {
  id: string;
  tenant: string;
  name: string;
  state: KbState;
  authVersion: number;
  defaultRole: KbRole | null;
}

interface NoteRow {
  id: string;
  kb: string;
  kbId: string;
  createdAt: number;
  key: string;
  inputDigest: string | null;
  /** When the note was soft-deleted (ms), `null` while it is live. */
  deletedAt: number | null;
}

const KB_COLS =
  'k.id AS id, k.tenant AS tenant, k.name AS name, k.state AS state, k.auth_version AS authVersion, k.default_role AS defaultRole';

/** The store's prepared statements. */
function prepare(db: Database.Database) {
  return {
    kbByName: db.prepare<[string, string], KbRow>(
      `SELECT ${KB_COLS} FROM knowledge_bases k WHERE k.tenant = ? AND k.name = ?`,
    ),
    kbByAlias: db.prepare<[string, string], KbRow>(
      `SELECT ${KB_COLS} FROM kb_aliases a JOIN knowledge_bases k ON k.id = a.kb_id WHERE a.tenant = ? AND a.alias = ? AND k.tenant = a.tenant`,
    ),
    kbByIdOfTenant: db.prepare<[string, string], KbRow>(
      `SELECT ${KB_COLS} FROM knowledge_bases k WHERE k.id = ? AND k.tenant = ?`,
    ),
    kbById: db.prepare<[string], KbRow>(`SELECT ${KB_COLS} FROM knowledge_bases k WHERE k.id = ?`),
    allKbs: db.prepare<[], KbRow>(`SELECT ${KB_COLS} FROM knowledge_bases k ORDER BY k.tenant, k.name`),
    kbsOfTenant: db.prepare<[string], KbRow>(
      `SELECT ${KB_COLS} FROM knowledge_bases k WHERE k.tenant = ? ORDER BY k.name`,
    ),
    insertKb: db.prepare<[string, string, string, number, KbState, KbRole | null]>(
      `INSERT INTO knowledge_bases (id, tenant, name, created_at, state, auth_version, default_role)
       VALUES (?, ?, ?, ?, ?, 1, ?) ON CONFLICT (tenant, name) DO NOTHING`,
    ),
    bumpVersion: db.prepare<[string]>('UPDATE knowledge_bases SET auth_version = auth_version + 1 WHERE id = ?'),
    setState: db.prepare<[KbState, string]>('UPDATE knowledge_bases SET state = ? WHERE id = ?'),
    setOwner: db.prepare<[string, string]>('UPDATE knowledge_bases SET tenant = ?, default_role = NULL WHERE id = ?'),
    setDefaultRole: db.prepare<[KbRole | null, string]>('UPDATE knowledge_bases SET default_role = ? WHERE id = ?'),

    aliasOwner: db.prepare<[string, string], { kbId: string }>(
      'SELECT kb_id AS kbId FROM kb_aliases WHERE tenant = ? AND alias = ?',
    ),
    aliasesOfKb: db.prepare<[string], { alias: string }>('SELECT alias FROM kb_aliases WHERE kb_id = ? ORDER BY alias'),
    insertAlias: db.prepare<[string, string, string]>('INSERT INTO kb_aliases (tenant, alias, kb_id) VALUES (?, ?, ?)'),
    deleteAlias: db.prepare<[string, string]>('DELETE FROM kb_aliases WHERE kb_id = ? AND alias = ?'),
    moveAliases: db.prepare<[string, string]>('UPDATE kb_aliases SET tenant = ? WHERE kb_id = ?'),

    member: db.prepare<[string, string, string], { role: KbRole | 'none' }>(
      'SELECT role FROM kb_members WHERE kb_id = ? AND tenant = ? AND actor = ?',
    ),
    membersOfKb: db.prepare<[string], KbMember>(
      'SELECT tenant, actor, role FROM kb_members WHERE kb_id = ? ORDER BY tenant, actor',
    ),
    upsertMember: db.prepare<[string, string, string, KbRole | 'none']>(
      `INSERT INTO kb_members (kb_id, tenant, actor, role) VALUES (?, ?, ?, ?)
       ON CONFLICT (kb_id, tenant, actor) DO UPDATE SET role = excluded.role`,
    ),
    deleteMember: db.prepare<[string, string, string]>(
      'DELETE FROM kb_members WHERE kb_id = ? AND tenant = ? AND actor = ?',
    ),
    deleteForeignMembers: db.prepare<[string, string]>('DELETE FROM kb_members WHERE kb_id = ? AND tenant <> ?'),

    tenant: db.prepare<[string], { limit: number | null; used: number; windowStart: number }>(
      'SELECT quota_limit AS "limit", quota_used AS used, quota_window_start AS windowStart FROM tenants WHERE id = ?',
    ),
    setQuotaLimit: db.prepare<[string, number | null]>(
      'INSERT INTO tenants (id, quota_limit) VALUES (?, ?) ON CONFLICT (id) DO UPDATE SET quota_limit = excluded.quota_limit',
    ),
    countQuota: db.prepare<[string, number, number]>(
      `INSERT INTO tenants (id, quota_limit, quota_used, quota_window_start) VALUES (?, NULL, ?, ?)
       ON CONFLICT (id) DO UPDATE SET quota_used = excluded.quota_used, quota_window_start = excluded.quota_window_start`,
    ),

    // Deleted rows included: a write made under a key stays made when its note is deleted later —
    // the probe must still find it (or recovery would write it again) and dedup must replay it.
    byKey: db.prepare<[string, string], NoteRow & { count: number }>(
      `SELECT n.id AS id, k.name AS kb, n.kb_id AS kbId, n.created_at AS createdAt, n.downstream_key AS key, n.input_digest AS inputDigest, n.deleted_at AS deletedAt,
              (SELECT COUNT(*) FROM notes c WHERE c.tenant = n.tenant AND c.downstream_key = n.downstream_key) AS count
         FROM notes n JOIN knowledge_bases k ON k.id = n.kb_id
        WHERE n.tenant = ? AND n.downstream_key = ?
        ORDER BY n.created_at, n.rowid LIMIT 1`,
    ),
    // Every row (deleted ones too) whose key lies in [lo, hi): a batch's item keys `<key>#<index>`.
    inKeyRange: db.prepare<[string, string, string], NoteRow>(
      `SELECT n.id AS id, k.name AS kb, n.kb_id AS kbId, n.created_at AS createdAt, n.downstream_key AS key, n.input_digest AS inputDigest, n.deleted_at AS deletedAt
         FROM notes n JOIN knowledge_bases k ON k.id = n.kb_id
        WHERE n.tenant = ? AND n.downstream_key >= ? AND n.downstream_key < ?
        ORDER BY n.created_at, n.rowid`,
    ),
    insertNote: db.prepare<
      [string, string, string, string, string, string, string, string, string | null, number, string | null]
    >(
      `INSERT INTO notes (id, tenant, kb_id, downstream_key, title, body_digest, source_url, fetched_at, publish_at, created_at, input_digest)
       VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
    ),
    deleteByKey: db.prepare<
      [string, string],
      { noteId: string; inputDigest: string | null; deletedAt: number; count: number }
    >(
      `SELECT d.note_id AS noteId, d.input_digest AS inputDigest, n.deleted_at AS deletedAt,
              (SELECT COUNT(*) FROM note_deletes c WHERE c.tenant = d.tenant AND c.downstream_key = d.downstream_key) AS count
         FROM note_deletes d JOIN notes n ON n.id = d.note_id
        WHERE d.tenant = ? AND d.downstream_key = ?
        ORDER BY d.deleted_at, d.rowid LIMIT 1`,
    ),
    insertDelete: db.prepare<[string, string, string, string, string | null, number]>(
      'INSERT INTO note_deletes (id, tenant, downstream_key, note_id, input_digest, deleted_at) VALUES (?, ?, ?, ?, ?, ?)',
    ),
    noteById: db.prepare<[string], { id: string; kbId: string; deletedAt: number | null }>(
      'SELECT id, kb_id AS kbId, deleted_at AS deletedAt FROM notes WHERE id = ?',
    ),
    clockFloor: db.prepare<[], { at: number }>('SELECT at FROM clock_floor WHERE id = 1'),
    setClockFloor: db.prepare<[number]>(
      'INSERT INTO clock_floor (id, at) VALUES (1, ?) ON CONFLICT (id) DO UPDATE SET at = excluded.at',
    ),
    softDelete: db.prepare<[number, string]>('UPDATE notes SET deleted_at = ? WHERE id = ? AND deleted_at IS NULL'),
  };
}
type Statements = ReturnType<typeof prepare>;

/** Adds the columns of `table` the file lacks (a fresh file or a half-migrated one may have some). */
function addMissingColumns(db: Database.Database, table: string, columns: [string, string][]): void {
  const have = new Set((db.prepare(`PRAGMA table_info(${table})`).all() as { name: string }[]).map((c) => c.name));
  for (const [name, ddl] of columns) if (!have.has(name)) db.exec(`ALTER TABLE ${table} ADD COLUMN ${ddl}`);
}

/** Applies the migrations the file lacks, each in one transaction; a no-op on an up-to-date file. */
function migrate(db: Database.Database): void {
  db.exec(BASE_SCHEMA);
  const version = Number(db.pragma('user_version', { simple: true }));
  if (version < 1) {
    db.transaction(() => {
      addMissingColumns(db, 'knowledge_bases', MIGRATION_1_COLUMNS);
      db.exec(MIGRATION_1_TABLES);
      // Knowledge bases from before roles were writable by every actor of their tenant: keep that.
      db.exec(`UPDATE knowledge_bases SET default_role = 'writer' WHERE default_role IS NULL`);
      db.exec('INSERT OR IGNORE INTO tenants (id) SELECT DISTINCT tenant FROM knowledge_bases');
      db.pragma('user_version = 1');
    }).immediate();
  }
  if (version < 2) {
    // Existing notes keep NULL: no digest recorded, so recovery commits them as before.
    db.transaction(() => {
      addMissingColumns(db, 'notes', MIGRATION_2_COLUMNS);
      db.pragma('user_version = 2');
    }).immediate();
  }
  if (version < 3) {
    db.transaction(() => {
      db.exec(MIGRATION_3_TABLES);
      db.pragma('user_version = 3');
    }).immediate();
  }
  if (version < 4) {
    db.transaction(() => {
      db.exec(MIGRATION_4_TABLES);
      db.pragma('user_version = 4');
    }).immediate();
  }
}

/**
 * The database holds every tenant's notes: its files are the KB's own (kb.sqlite
 * was 0644 beside keys that are 0600). Directories this creates are 0700; the database file is
 * created 0600 before SQLite opens it, and SQLite gives its -wal and -shm files the database file's
 * permissions (unix VFS). A database file, -wal or -shm from an earlier run readable by others is
 * narrowed to 0600 (only where this user may: a file it does not own is left as it is).
 */
export function privateDatabaseFiles(path: string): void {
  mkdirSync(dirname(path), { recursive: true, mode: 0o700 });
  try {
    closeSync(openSync(path, 'wx', 0o600));
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
  }
  for (const file of [path, `${path}-wal`, `${path}-shm`]) {
    try {
      if ((statSync(file).mode & 0o077) !== 0) chmodSync(file, 0o600);
    } catch {
      // absent, or not ours to change
    }
  }
}

/**
 * The KB's SQLite store. Opens (and creates, and migrates) the file in WAL mode with
 * `synchronous=FULL`, so a write the server answered for survives a crash of the process or the
 * machine. Every method is synchronous; one store per process.
 */
export class KbStore {
  readonly dedup: boolean;
  readonly #db: Database.Database;
  readonly #now: () => number;
  /** The latest clock reading a probe answered, as stored (the clock never starts below it). */
  #floor: number;
  readonly #windowMs: number;
  readonly #stmts: Statements;

  constructor(opts: KbStoreOptions) {
    this.dedup = opts.dedup;
    this.#floor = 0;
    this.#now = Date.now;
    this.#windowMs = opts.quotaWindowMs ?? 86_400_000;
    if (opts.path !== ':memory:') privateDatabaseFiles(opts.path);
    const db = new Database(opts.path);
    this.#db = db;
    try {
      const mode = String(db.pragma('journal_mode = WAL', { simple: true }));
      if (opts.path !== ':memory:' && mode !== 'wal') throw new Error(`journal_mode is ${mode}, not wal`);
      db.pragma('synchronous = FULL');
      db.pragma('foreign_keys = ON');
      db.pragma('busy_timeout = 5000');
      migrate(db);
    } catch (err) {
      db.close();
      throw err;
    }
    this.#stmts = prepare(db);
    this.#floor = this.#stmts.clockFloor.get()?.at ?? 0;
    this.#now = neverBack(opts.now ?? Date.now, this.#floor);
  }

  /** Runs `fn` in one IMMEDIATE transaction (the write lock is taken before the first read). */
  #tx<T>(fn: () => T): T {
    return this.#db.transaction(fn).immediate();
  }

  // -------------------------------------------------------------------------------------------
  // The one resolver

  /**
   * THE resolver: the knowledge base of `tenant` that `ref` names, or `null`. After
   * {@link canonicalRef}, in this order: the tenant's names, its aliases, a `kb_<uuid>` id of that
   * tenant. A knowledge base of another tenant (under any reference, its id included) and a
   * soft-deleted one resolve to `null` exactly like a missing one. Used by every read and write
   * path, inside their transactions.
   */
  resolve(tenant: string, ref: string): KbRecord | null {
    const canon = canonicalRef(ref);
    if (canon === null) return null;
    const s = this.#stmts;
    const row =
      s.kbByName.get(tenant, canon) ??
      s.kbByAlias.get(tenant, canon) ??
      (KB_ID.test(canon) ? s.kbByIdOfTenant.get(canon, tenant) : undefined);
    if (!row || row.state === 'deleted' || row.tenant !== tenant) return null;
    return { ...row, state: row.state };
  }

  /** The current role of `actor` of `tenant` on `kb`: its explicit member row, else the default role. */
  roleOf(kb: KbRecord, tenant: string, actor: string): KbRole | null {
    if (kb.tenant !== tenant) return null;
    const m = this.#stmts.member.get(kb.id, tenant, actor);
    if (m) return m.role === 'none' ? null : m.role;
    return kb.defaultRole;
  }

  /** {@link resolve} plus the actor's role: what `GET /v1/resolve` answers; `null` = uniform not-found. */
  resolveFor(tenant: string, actor: string, ref: string): Resolution | null {
    const kb = this.resolve(tenant, ref);
    if (!kb) return null;
    return {
      kbId: kb.id,
      name: kb.name,
      state: kb.state,
      authVersion: kb.authVersion,
      role: this.roleOf(kb, tenant, actor),
    };
  }

  // -------------------------------------------------------------------------------------------
  // Quota (per tenant, current window)

  #windowStart(now: number): number {
    return Math.floor(now / this.#windowMs) * this.#windowMs;
  }

  /** Notes `tenant` may still insert in the window of `now` (Infinity when unlimited). */
  #quotaLeft(tenant: string, now: number): { left: number; used: number; retryAfterMs: number } {
    const start = this.#windowStart(now);
    const t = this.#stmts.tenant.get(tenant);
    const used = t && t.windowStart === start ? t.used : 0;
    const left = t?.limit === null || t?.limit === undefined ? Infinity : Math.max(0, t.limit - used);
    return { left, used, retryAfterMs: start + this.#windowMs - now };
  }

  // -------------------------------------------------------------------------------------------
  // Writes

  /**
   * Writes a note under the downstream `ctx.key` of `ctx.tenant`, provided the knowledge base's
   * authorisation version is still `ifMatch`, the actor may write, the tenant has quota left and
   * the store's clock is not past `ctx.deadlineAt` — all in the insert's transaction. See
   * {@link WriteOutcome}. Throws only on a storage failure (SQLite error).
   */
  writeNote(ctx: WriteContext & { ifMatch: number }, note: NoteInput): WriteOutcome {
    return this.#tx((): WriteOutcome => {
      const kb = this.resolve(ctx.tenant, note.kb);
      if (!kb) return { kind: 'not_found' };
      if (this.dedup) {
        const prior = this.#stmts.byKey.get(ctx.tenant, ctx.key);
        if (prior?.inputDigest && ctx.inputDigest && prior.inputDigest !== ctx.inputDigest)
          return { kind: 'key_reused' };
        if (prior) return { kind: 'existing', note: receipt(prior) };
      }
      if (kb.state === 'frozen') return { kind: 'frozen' };
      if (kb.authVersion !== ctx.ifMatch) return { kind: 'version_conflict' };
      if (!WRITE_ROLES.has(this.roleOf(kb, ctx.tenant, ctx.actor) ?? '')) return { kind: 'forbidden' };
      const now = this.#now();
      const quota = this.#quotaLeft(ctx.tenant, now);
      if (quota.left < 1) return { kind: 'quota_exceeded', retryAfterMs: quota.retryAfterMs };
      // enforcesDeadline: the last check before the insert, inside the transaction.
      if (now > ctx.deadlineAt) return { kind: 'deadline_passed' };
      const id = this.#insert(ctx.tenant, kb.id, ctx.key, note, now, ctx.inputDigest);
      this.#stmts.countQuota.run(ctx.tenant, quota.used + 1, this.#windowStart(now));
      return { kind: 'created', note: { id, kb: kb.name, kbId: kb.id, createdAt: now } };
    });
  }

  /**
   * Writes `notes` (1..50) as one batch under the downstream `ctx.key`: item `i` is stored with key
   * `<key>#<i>`. Every item is resolved and authorised (state, `ifMatch[kbId]`, role); the tenant
   * needs quota for all of them; the first refused item refuses the whole batch and nothing is
   * stored (FM-09). With dedup on, a batch already stored under the key is returned as it is.
   */
  writeBatch(ctx: WriteContext & { ifMatch: ReadonlyMap<string, number> }, notes: NoteInput[]): BatchOutcome {
    return this.#tx((): BatchOutcome => {
      const kbs: KbRecord[] = [];
      for (const [index, note] of notes.entries()) {
        const kb = this.resolve(ctx.tenant, note.kb);
        if (!kb) return { kind: 'not_found', index };
        kbs.push(kb);
      }
      if (this.dedup) {
        const prior = this.#batchRows(ctx.tenant, ctx.key);
        if (prior) return { kind: 'existing', notes: prior.items.map(receipt) };
      }
      const roles = new Map<string, KbRole | null>();
      for (const [index, kb] of kbs.entries()) {
        if (kb.state === 'frozen') return { kind: 'frozen', index };
        if (ctx.ifMatch.get(kb.id) !== kb.authVersion) return { kind: 'version_conflict', index };
        if (!roles.has(kb.id)) roles.set(kb.id, this.roleOf(kb, ctx.tenant, ctx.actor));
        if (!WRITE_ROLES.has(roles.get(kb.id) ?? '')) return { kind: 'forbidden', index };
      }
      const now = this.#now();
      const quota = this.#quotaLeft(ctx.tenant, now);
      if (quota.left < notes.length)
        return { kind: 'quota_exceeded', index: quota.left, retryAfterMs: quota.retryAfterMs };
      if (now > ctx.deadlineAt) return { kind: 'deadline_passed' };
      const out = notes.map((note, i) => {
        const kb = kbs[i]!;
        return {
          id: this.#insert(ctx.tenant, kb.id, `${ctx.key}#${i}`, note, now, ctx.inputDigest),
          kb: kb.name,
          kbId: kb.id,
          createdAt: now,
        };
      });
      this.#stmts.countQuota.run(ctx.tenant, quota.used + notes.length, this.#windowStart(now));
      return { kind: 'created', notes: out };
    });
  }

  #insert(
    tenant: string,
    kbId: string,
    key: string,
    note: NoteInput,
    now: number,
    inputDigest: string | undefined,
  ): string {
    const id = `note_${randomUUID()}`;
    this.#stmts.insertNote.run(
      id,
      tenant,
      kbId,
      key,
      note.title,
      bodyDigest(note.body),
      note.sourceUrl,
      utcIso(note.fetchedAt),
      note.publishAt === undefined ? null : utcIso(note.publishAt),
      now,
      inputDigest ?? null,
    );
    return id;
  }

  /**
   * Soft-deletes note `id` (sets `deleted_at`) of a knowledge base the tenant owns, under the same
   * checks as a write, in one transaction: resolve; with dedup on, a delete already stored under
   * `ctx.key` answers again (`key_reused` when it was of another note or another input digest);
   * a note already deleted answers the same (idempotent); else state, `ifMatch`, role. Every
   * delete answered `deleted` is stored under its key (the probe finds it). The note stays: its
   * write's probe still finds it, marked deleted; reads and counts leave it out. No quota is refunded.
   */
  deleteNote(ctx: {
    tenant: string;
    actor: string;
    id: string;
    ifMatch: number;
    key: string;
    inputDigest?: string | undefined;
  }): DeleteOutcome {
    return this.#tx((): DeleteOutcome => {
      const note = this.#stmts.noteById.get(ctx.id);
      if (!note) return { kind: 'not_found' };
      const kb = this.resolve(ctx.tenant, note.kbId);
      if (!kb) return { kind: 'not_found' };
      if (this.dedup) {
        const prior = this.#stmts.deleteByKey.get(ctx.tenant, ctx.key);
        if (
          prior &&
          (prior.noteId !== note.id || (prior.inputDigest && ctx.inputDigest && prior.inputDigest !== ctx.inputDigest))
        )
          return { kind: 'key_reused' };
        if (prior) return { kind: 'deleted', id: note.id, deletedAt: prior.deletedAt };
      }
      const now = this.#now();
      const record = (deletedAt: number): DeleteOutcome => {
        this.#stmts.insertDelete.run(`del_${randomUUID()}`, ctx.tenant, ctx.key, note.id, ctx.inputDigest ?? null, now);
        return { kind: 'deleted', id: note.id, deletedAt };
      };
      if (note.deletedAt !== null) return record(note.deletedAt);
      if (kb.state === 'frozen') return { kind: 'frozen' };
      if (kb.authVersion !== ctx.ifMatch) return { kind: 'version_conflict' };
      if (!WRITE_ROLES.has(this.roleOf(kb, ctx.tenant, ctx.actor) ?? '')) return { kind: 'forbidden' };
      this.#stmts.softDelete.run(now, note.id);
      return record(now);
    });
  }

  // -------------------------------------------------------------------------------------------
  // Reads

  /** A batch stored under `key`: the oldest row of each item key `<key>#<i>` (deleted or not), by index; count = rows of item 0. */
  #batchRows(tenant: string, key: string): { items: NoteRow[]; count: number } | null {
    // '$' is the character after '#': [key#, key$) holds exactly the keys starting with `key#`.
    const rows = this.#stmts.inKeyRange.all(tenant, `${key}#`, `${key}$`);
    const byIndex = new Map<number, NoteRow>();
    let count = 0;
    for (const r of rows) {
      const suffix = r.key.slice(key.length + 1);
      if (!/^(0|[1-9]\d?)$/.test(suffix)) continue;
      const i = Number(suffix);
      if (i === 0) count++;
      if (!byIndex.has(i)) byIndex.set(i, r);
    }
    if (!byIndex.has(0)) return null;
    const items: NoteRow[] = [];
    for (let i = 0; byIndex.has(i); i++) items.push(byIndex.get(i)!);
    return { items, count };
  }

  /** The store's clock, ms since the epoch: the one the deadline check reads, and it never goes back. */
  now(): number {
    return this.#now();
  }

  /**
   * Read-only lookup by (tenant, key) over every note ever written, deleted ones too (`deleted:
   * true` when the oldest is; `count` counts them all): a note written under that key, else
   * a batch written under it (`items` in index order; `id`, `kb`, `createdAt` are item 0's), with
   * the input digest it was written with when it has one, and `now`, the store's clock at the
   * lookup: with `now` past a request's deadline, no request under the key can be stored any more
   * (the deadline check reads the same clock), so a caller may run it again (docs/clocks.md).
   */
  probe(tenant: string, key: string): ProbeOutcome {
    const now = this.#probeNow();
    const row = this.#stmts.byKey.get(tenant, key);
    if (row)
      return {
        found: true,
        id: row.id,
        kb: row.kb,
        createdAt: row.createdAt,
        count: row.count,
        ...digestOf(row),
        ...(row.deletedAt !== null ? { deleted: true } : {}),
        now,
      };
    const batch = this.#batchRows(tenant, key);
    if (!batch) return { found: false, now };
    const first = batch.items[0]!;
    return {
      found: true,
      id: first.id,
      kb: first.kb,
      createdAt: first.createdAt,
      count: batch.count,
      ...digestOf(first),
      ...(first.deletedAt !== null ? { deleted: true } : {}),
      items: batch.items.map((r) => ({ id: r.id, kb: r.kb, createdAt: r.createdAt })),
      now,
    };
  }

  /**
   * Read-only lookup of the deletes made under (tenant, key): the first one — the note it deleted
   * and when that note was deleted — and how many deletes the key holds (> 1 only with dedup off),
   * with the input digest it was made with, and `now` as {@link probe} reads it.
   */
  probeDelete(tenant: string, key: string): DeleteProbeOutcome {
    const now = this.#probeNow();
    const row = this.#stmts.deleteByKey.get(tenant, key);
    if (!row) return { found: false, now };
    return {
      found: true,
      id: row.noteId,
      deletedAt: row.deletedAt,
      count: row.count,
      ...(row.inputDigest === null ? {} : { inputDigest: row.inputDigest }),
      now,
    };
  }

  /**
   * The clock read with a probe's lookup, in the same synchronous step: no insert can fall between
   * them, and the clock never goes back, so every later insert checks its deadline against a time ≥
   * the reading — across a restart too: the reading is stored before it is answered.
   */
  #probeNow(): number {
    const now = this.#now();
    if (now > this.#floor) {
      this.#stmts.setClockFloor.run(now);
      this.#floor = now;
    }
    return now;
  }

  /** Counts over non-deleted notes: of notes written by one tenant and/or in one knowledge base, or of all. */
  stats(filter: { tenant?: string | undefined; kbId?: string | undefined } = {}): KbStats {
    const where = ['deleted_at IS NULL'];
    const args: string[] = [];
    if (filter.tenant !== undefined) {
      where.push('tenant = ?');
      args.push(filter.tenant);
    }
    if (filter.kbId !== undefined) {
      where.push('kb_id = ?');
      args.push(filter.kbId);
    }
    const r = this.#db
      .prepare<string[], { liveRows: number; liveKeys: number }>(
        `SELECT COALESCE(SUM(n), 0) AS liveRows, COUNT(*) AS liveKeys
           FROM (SELECT COUNT(*) AS n FROM notes WHERE ${where.join(' AND ')} GROUP BY tenant, downstream_key)`,
      )
      .get(...args);
    const rows = r?.liveRows ?? 0;
    const distinctKeys = r?.liveKeys ?? 0;
    return { rows, distinctKeys, duplicateRows: rows - distinctKeys };
  }

  /**
   * Non-deleted notes per knowledge base. With `tenant`: the notes that tenant wrote, over the
   * knowledge bases it owns or wrote into (so rows in a knowledge base whose `owner` is not that
   * tenant show up); with `kbId`: that knowledge base only.
   */
  rowsPerKb(filter: { tenant?: string | undefined; kbId?: string | undefined } = {}): KbRowCount[] {
    const params: Record<string, string> = {};
    if (filter.tenant !== undefined) params.tenant = filter.tenant;
    if (filter.kbId !== undefined) params.kbId = filter.kbId;
    const on = filter.tenant === undefined ? '' : ' AND n.tenant = @tenant';
    const where = filter.kbId === undefined ? '' : 'WHERE k.id = @kbId';
    const having = filter.tenant === undefined ? '' : 'HAVING k.tenant = @tenant OR COUNT(n.id) > 0';
    const stmt = this.#db.prepare<[Record<string, string>], KbRowCount>(
      `SELECT k.id AS kbId, k.tenant AS owner, k.name AS name, k.state AS state, COUNT(n.id) AS "rows"
         FROM knowledge_bases k LEFT JOIN notes n ON n.kb_id = k.id AND n.deleted_at IS NULL${on}
        ${where}
        GROUP BY k.id ${having}
        ORDER BY k.tenant, k.name`,
    );
    return stmt.all(params); // an empty object binds nothing
  }

  // -------------------------------------------------------------------------------------------
  // Operator changes (each bumps auth_version exactly when it changes something)

  #view(row: KbRow): KbAdminView {
    const q = this.#quotaLeft(row.tenant, this.#now());
    const t = this.#stmts.tenant.get(row.tenant);
    return {
      kbId: row.id,
      tenant: row.tenant,
      name: row.name,
      state: row.state,
      authVersion: row.authVersion,
      quotaUsed: q.used,
      quotaLimit: t?.limit ?? null,
      aliases: this.#stmts.aliasesOfKb.all(row.id).map((a) => a.alias),
      defaultRole: row.defaultRole,
      members: this.#stmts.membersOfKb.all(row.id),
    };
  }

  /** Every knowledge base (deleted ones included), or those `tenant` owns. */
  listKnowledgeBases(tenant?: string): KbAdminView[] {
    const rows = tenant === undefined ? this.#stmts.allKbs.all() : this.#stmts.kbsOfTenant.all(tenant);
    return rows.map((r) => this.#view(r));
  }

  /** The operator's view of one knowledge base by internal id (deleted ones included), or null. */
  knowledgeBase(kbId: string): KbAdminView | null {
    const row = this.#stmts.kbById.get(kbId);
    return row ? this.#view(row) : null;
  }

  /** Runs an operator change on `kbId` in one transaction; bumps auth_version when `change` reports a change. */
  #admin(kbId: string, change: (kb: KbRow) => boolean | Exclude<AdminOutcome, { kind: 'ok' }>): AdminOutcome {
    return this.#tx((): AdminOutcome => {
      const kb = this.#stmts.kbById.get(kbId);
      if (!kb) return { kind: 'not_found' };
      const r = change(kb);
      if (typeof r !== 'boolean') return r;
      if (r) this.#stmts.bumpVersion.run(kbId);
      return { kind: 'ok', kb: this.#view(this.#stmts.kbById.get(kbId)!), changed: r };
    });
  }

  /**
   * Grants `role` to `actor` of `tenant` (which must be the owner tenant), or revokes it (`null`):
   * the member row is removed, or — when the knowledge base has a default role — set to `none`.
   */
  setMember(kbId: string, tenant: string, actor: string, role: KbRole | null): AdminOutcome {
    return this.#admin(kbId, (kb) => {
      if (tenant !== kb.tenant) return { kind: 'conflict', reason: 'the member tenant is not the owner tenant' };
      const before = this.#stmts.member.get(kbId, tenant, actor)?.role;
      if (role === null && kb.defaultRole === null) {
        if (before === undefined) return false;
        this.#stmts.deleteMember.run(kbId, tenant, actor);
        return true;
      }
      const next = role ?? 'none';
      if (before === next) return false;
      this.#stmts.upsertMember.run(kbId, tenant, actor, next);
      return true;
    });
  }

  /** Sets the role of every actor of the owner tenant without a member row (`null` = none). */
  setDefaultRole(kbId: string, role: KbRole | null): AdminOutcome {
    return this.#admin(kbId, (kb) => {
      if (kb.defaultRole === role) return false;
      this.#stmts.setDefaultRole.run(role, kbId);
      return true;
    });
  }

  /** Sets the state: `active`, `frozen` or `deleted` (soft; an operator may set it back). */
  setState(kbId: string, state: KbState): AdminOutcome {
    return this.#admin(kbId, (kb) => {
      if (kb.state === state) return false;
      this.#stmts.setState.run(state, kbId);
      return true;
    });
  }

  /**
   * Transfers the knowledge base to `tenant` with its name and aliases. Members of other tenants
   * are removed and the default role is reset to none (the new owner grants roles explicitly).
   * `conflict` when the new owner already has that name or one of the aliases.
   */
  transferOwner(kbId: string, tenant: string): AdminOutcome {
    return this.#admin(kbId, (kb) => {
      if (kb.tenant === tenant) return false;
      const aliases = this.#stmts.aliasesOfKb.all(kbId).map((a) => a.alias);
      for (const ref of [kb.name, ...aliases]) {
        if (this.#taken(tenant, ref))
          return { kind: 'conflict', reason: 'the new owner already has a knowledge base of that name or alias' };
      }
      this.#stmts.setOwner.run(tenant, kbId);
      this.#stmts.moveAliases.run(tenant, kbId);
      this.#stmts.deleteForeignMembers.run(kbId, tenant);
      return true;
    });
  }

  /** Whether `canon` already names (by name or alias) a knowledge base of `tenant`, deleted ones included. */
  #taken(tenant: string, canon: string): boolean {
    return (
      this.#stmts.kbByName.get(tenant, canon) !== undefined || this.#stmts.aliasOwner.get(tenant, canon) !== undefined
    );
  }

  /** Adds (`remove` false) or removes an alias; stored canonical ({@link canonicalRef}), unique per tenant across names and aliases. */
  setAlias(kbId: string, alias: string, remove = false): AdminOutcome {
    const canon = canonicalRef(alias);
    if (canon === null) return { kind: 'invalid', path: 'alias', reason: 'empty or not a valid percent-encoding' };
    const problem = aliasProblem(canon);
    if (problem) return { kind: 'invalid', path: 'alias', reason: problem };
    return this.#admin(kbId, (kb) => {
      const owner = this.#stmts.aliasOwner.get(kb.tenant, canon);
      if (remove) {
        if (owner?.kbId !== kbId) return false;
        this.#stmts.deleteAlias.run(kbId, canon);
        return true;
      }
      if (owner?.kbId === kbId) return false;
      if (this.#taken(kb.tenant, canon))
        return { kind: 'conflict', reason: 'the tenant already has a knowledge base of that name or alias' };
      this.#stmts.insertAlias.run(kb.tenant, canon, kbId);
      return true;
    });
  }

  /** Sets a tenant's quota (notes per window; `null` = unlimited), keeping its counter. */
  setTenantQuota(tenant: string, limit: number | null): void {
    this.#stmts.setQuotaLimit.run(tenant, limit);
  }

  /**
   * Creates a knowledge base unless the tenant already has one of that name (then nothing is
   * changed: operator changes survive a restart). Throws when an alias is invalid or taken.
   */
  createKnowledgeBase(spec: KbSpec): { id: string; created: boolean } {
    return this.#tx(() => {
      const existing = this.#stmts.kbByName.get(spec.tenant, spec.name);
      if (existing) return { id: existing.id, created: false };
      if (this.#stmts.aliasOwner.get(spec.tenant, spec.name))
        throw new Error(`${spec.tenant}:${spec.name}: the name is an alias of another knowledge base`);
      const id = `kb_${randomUUID()}`;
      this.#stmts.insertKb.run(
        id,
        spec.tenant,
        spec.name,
        this.#now(),
        spec.state ?? 'active',
        spec.defaultRole ?? null,
      );
      for (const alias of spec.aliases ?? []) {
        const canon = canonicalRef(alias);
        const problem = canon === null ? 'empty or not a valid percent-encoding' : aliasProblem(canon);
        if (problem || canon === null) throw new Error(`${spec.tenant}:${spec.name}: alias "${alias}" ${problem}`);
        if (this.#stmts.aliasOwner.get(spec.tenant, canon)?.kbId === id) continue;
        if (this.#taken(spec.tenant, canon)) throw new Error(`${spec.tenant}:${spec.name}: alias "${alias}" is taken`);
        this.#stmts.insertAlias.run(spec.tenant, canon, id);
      }
      for (const m of spec.members ?? []) this.#stmts.upsertMember.run(id, spec.tenant, m.actor, m.role);
      return { id, created: true };
    });
  }

  /**
   * Creates the knowledge base `name` of `tenant` unless it exists, writable by every actor of the
   * tenant (default role `writer`). Returns its id and whether it was created now.
   */
  ensureKnowledgeBase(tenant: string, name: string): { id: string; created: boolean } {
    return this.createKnowledgeBase({ tenant, name, defaultRole: 'writer' });
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

function receipt(r: NoteRow): NoteReceipt {
  return { id: r.id, kb: r.kb, kbId: r.kbId, createdAt: r.createdAt };
}

/** `{ inputDigest }` when the row has one, else nothing (older rows, writers that sent none). */
function digestOf(r: NoteRow): { inputDigest?: string } {
  return r.inputDigest === null ? {} : { inputDigest: r.inputDigest };
}

/**
 * `clock`, never going back and never below `floor`: a wall clock stepped back (NTP, an operator, a
 * restart on a machine whose clock is behind) must not let a request through the deadline check
 * after a probe answered a later time. Whole ms.
 */
export function neverBack(clock: () => number, floor: number): () => number {
  let last = floor;
  let lastMono = performance.now();
  return () => {
    // Behind its last reading, the clock keeps going at the monotonic clock's pace from there rather
    // than stand still: a deadline beyond that reading still passes in its time.
    const mono = performance.now();
    last = Math.max(clock(), last + (mono - lastMono));
    lastMono = mono;
    return Math.floor(last);
  };
}
