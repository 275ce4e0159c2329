import { randomUUID } from 'node:crypto';
import type { JetStreamClient } from '@nats-io/jetstream';
import type { KV } from '@nats-io/kv';
import type { NatsConnection } from '@nats-io/transport-node';
import { ErrorClass, operationIdOf, TooltxError } from '@tooltx/contracts';
import {
  auditRecordForAuditor,
  auditRecordSchema,
  auditRequestSchema,
  countsOf,
  MAX_AUDIT_PAGE,
  type AuditAnswer,
  type AuditQueryRecord,
  type AuditRecord,
  type AuditRequest,
  type ContractCounts,
} from '@tooltx/lifecycle';
import { decode, encode, isTransient, type Subjects } from '@tooltx/nats';
import type { Logger } from '@tooltx/runtime';
import { msgpackCodec, startResponder, type Responder } from './responder.js';

/**
 * The auditors' query service: audit evidence is read by auditors, who may not read business
 * results, and what they read is itself audited (exports included). Request/reply on
 * `<prefix>.audit.<tenant>.<auditor>` (queue group `tooltx-audit`, any number of instances): the
 * server lets only that auditor publish there, so the tenant and the auditor come from the
 * subject. Requests and answers are msgpack, through the read side's responder; answers go only
 * into the auditor's own inbox (FM-31).
 *
 * Every query and every export page is recorded — who, when, what, which range, how many records —
 * in the stream `<P>_AUDITLOG` (subject `<prefix>.auditlog.<tenant>.<auditor>`, readable by no
 * auditor) and only answered once the server confirmed storing that record. No record, no answer:
 * the auditor gets `dependency_unavailable` and no data. A query the schema refuses is recorded
 * (`kind: 'invalid'`) under the same rule before its `invalid_input` answer; bytes that are not
 * msgpack are recorded when the log takes the record, and answered `invalid_input` either way.
 *
 * Error answers are `{ error: ErrorInfo }`: `invalid_input` (with field issues, none for a subject
 * that names no auditor) or `dependency_unavailable` (the projection or the query log failed; with
 * `retryAfterMs` while the records are rebuilt from the log after the server lost them: the query
 * is not recorded, nothing is answered from records that may be incomplete).
 *
 * Ranges: an operation is in `[since, until)` when any of its states or decisions falls in it
 * (`lastAt >= since` and `firstAt < until`), times in ms since the epoch.
 */

/** Queue group shared by every audit service instance. */
export const AUDIT_QUEUE = 'tooltx-audit';
/** Encoded records in one answer stay under this many bytes (the server's default max_payload is 1 MiB). */
export const PAGE_BYTES = 768 * 1024;

export interface AuditServiceDeps {
  nc: NatsConnection;
  js: JetStreamClient;
  kv: KV;
  subjects: Subjects;
  log: Logger;
  instance: string;
  now?: () => number;
  /**
   * True while the audit bucket is being rebuilt from the log (it is on memory storage, lost when
   * the server restarts: ProjectionGuard in @tooltx/runtime): queries are then answered
   * `dependency_unavailable` with `retryAfterMs` ({@link REBUILDING_RETRY_MS}), never from the partial
   * records. Absent: never rebuilding.
   */
  rebuilding?: () => boolean;
}

/** What a query is told to wait before it asks again while the audit records are rebuilt, ms. */
export const REBUILDING_RETRY_MS = 2_000;

const order = (a: AuditRecord, b: AuditRecord) =>
  a.firstAt - b.firstAt || (a.operationKey < b.operationKey ? -1 : a.operationKey > b.operationKey ? 1 : 0);
const cursorOf = (r: AuditRecord) => `${r.firstAt}.${r.operationKey}`;
const afterCursor = (r: AuditRecord, c: string) => {
  const i = c.indexOf('.');
  const at = Number(c.slice(0, i));
  const key = c.slice(i + 1);
  return r.firstAt > at || (r.firstAt === at && r.operationKey > key);
};

type Auditor = { tenant: string; auditor: string };

/** What the auditor is told when the projection or the query log failed; the cause stays in the log. */
const unavailable = (cause: unknown) =>
  new TooltxError(ErrorClass.DependencyUnavailable, 'audit query not answered', { cause });

/** The audit query service; `start()` subscribes, `stop()` drains and waits for in-flight answers. */
export class AuditService {
  readonly #d: AuditServiceDeps;
  readonly #now: () => number;
  #responder: Responder | null = null;

  constructor(deps: AuditServiceDeps) {
    this.#d = deps;
    this.#now = deps.now ?? Date.now;
  }

  start(): void {
    const { subjects, log } = this.#d;
    this.#responder = startResponder(this.#d.nc, log, {
      name: 'audit',
      subject: subjects.allAudit,
      queue: AUDIT_QUEUE,
      identify: (subject) => {
        const who = subjects.parseAuditSubject(subject);
        return who && { who, role: { kind: 'auditor', tenant: who.tenant, actor: who.auditor } };
      },
      unidentified: { class: ErrorClass.InvalidInput },
      codec: msgpackCodec,
      schema: auditRequestSchema,
      handle: (req, who) => this.#handle(req, who),
      // Auditors get `invalid_input` or `dependency_unavailable` only: an unforeseen throw is the
      // dependency's, never `internal` (the responder logs it).
      errorBody: (info) => ({
        error: info.class === ErrorClass.Internal ? { class: ErrorClass.DependencyUnavailable } : info,
      }),
      beforeInvalidAnswer: async (who, cause) => {
        const recorded = this.#record(who, { kind: 'invalid', count: 0 });
        if (cause === 'encoding') return void (await recorded.catch(() => undefined));
        try {
          await recorded;
        } catch (err) {
          log
            .child({ tenant: who.tenant, auditor: who.auditor })
            .error({ err, kind: 'invalid' }, 'query not recorded: not answered');
          throw unavailable(err);
        }
      },
    });
  }

  async stop(): Promise<void> {
    await this.#responder?.stop();
  }

  /**
   * The answer to one valid query of `who`, once its record is stored. Throws `dependency_unavailable`
   * when the projection could not be read or the record could not be stored (logged here).
   */
  async #handle(req: AuditRequest, who: Auditor): Promise<Exclude<AuditAnswer, { error: unknown }>> {
    const l = this.#d.log.child({ tenant: who.tenant, auditor: who.auditor });
    if (this.#d.rebuilding?.()) {
      l.info({ kind: req.kind }, 'audit query refused: the audit records are being rebuilt');
      throw new TooltxError(ErrorClass.DependencyUnavailable, 'audit records being rebuilt', {
        retryAfterMs: REBUILDING_RETRY_MS,
      });
    }
    let answer: Exclude<AuditAnswer, { error: unknown }>;
    try {
      answer = await this.#answer(who, req);
    } catch (err) {
      l.error({ err, kind: req.kind }, 'audit query failed');
      throw unavailable(err);
    }
    const count =
      'records' in answer
        ? typeof answer.records === 'number'
          ? answer.records
          : answer.records.length
        : answer.record
          ? 1
          : 0;
    try {
      // Recorded, and confirmed stored by the server, before anything is answered.
      await this.#record(who, {
        queryId: answer.queryId,
        kind: req.kind,
        count,
        ...(req.kind === 'show' ? { operationKey: req.operationKey } : {}),
        ...(req.kind !== 'show' && req.since !== undefined ? { since: req.since } : {}),
        ...(req.kind !== 'show' && req.until !== undefined ? { until: req.until } : {}),
        ...(req.kind === 'list' && req.state ? { state: req.state } : {}),
        ...(req.kind === 'list' && req.contract ? { contract: req.contract } : {}),
        ...((req.kind === 'list' || req.kind === 'export') && req.after ? { after: req.after } : {}),
        ...(answer.kind === 'export' ? { exportId: answer.exportId } : {}),
      });
    } catch (err) {
      l.error({ err, kind: req.kind }, 'query not recorded: not answered');
      throw unavailable(err);
    }
    l.info({ kind: req.kind, queryId: answer.queryId, count }, 'audit query answered');
    return answer;
  }

  /** Publishes the query record to the audit log stream and waits for the server's acknowledgement. */
  async #record(
    who: Auditor,
    q: Omit<AuditQueryRecord, 'schema' | 'queryId' | 'at' | 'tenant' | 'auditor' | 'instance'> & { queryId?: string },
  ): Promise<void> {
    const record: AuditQueryRecord = {
      schema: 1,
      queryId: q.queryId ?? randomUUID(),
      at: this.#now(),
      tenant: who.tenant,
      auditor: who.auditor,
      instance: this.#d.instance,
      ...q,
    } as AuditQueryRecord;
    const subject = this.#d.subjects.auditLog(who.tenant, who.auditor);
    let lastErr: unknown;
    for (let i = 0; i < 3; i++) {
      try {
        // The query id is the message id: a retried publish is stored once.
        await this.#d.js.publish(subject, encode(record), { msgID: record.queryId, timeout: 5_000 });
        return;
      } catch (err) {
        if (!isTransient(err)) throw err;
        lastErr = err;
        await new Promise((r) => setTimeout(r, 100 * 2 ** i));
      }
    }
    throw lastErr;
  }

  async #answer(who: Auditor, req: AuditRequest): Promise<Exclude<AuditAnswer, { error: unknown }>> {
    const queryId = randomUUID();
    if (req.kind === 'show') {
      const e = await this.#d.kv.get(this.#d.subjects.projectionKey(who.tenant, operationIdOf(req.operationKey)));
      const record = e && e.operation === 'PUT' ? decode(auditRecordSchema, e.value) : null;
      // An operation key of another tenant is never under this tenant's keys: the same `null`.
      return {
        kind: 'show',
        queryId,
        record: record && record.operationKey === req.operationKey ? auditRecordForAuditor(record) : null,
      };
    }
    const all = (await auditRecordsOf(this.#d.kv, `${who.tenant}.>`, this.#d.log)).filter((r) => inRange(r, req));
    if (req.kind === 'counts')
      return { kind: 'counts', queryId, records: all.length, counts: countsOf(all) satisfies ContractCounts[] };
    const { page, next } = pageOf(
      all,
      req.kind === 'list' ? { state: req.state, contract: req.contract, after: req.after } : { after: req.after },
      req.kind === 'list' ? (req.limit ?? 100) : MAX_AUDIT_PAGE,
    );
    const answered = page.map(auditRecordForAuditor);
    if (req.kind === 'list') return { kind: 'list', queryId, records: answered, ...(next ? { next } : {}) };
    return {
      kind: 'export',
      queryId,
      exportId: req.exportId ?? randomUUID(),
      records: answered,
      ...(next ? { next } : {}),
    };
  }
}

/**
 * The newest record under every key of the audit bucket that `filter` matches (`<tenant>.>` for
 * one tenant, `>` for all): one ordered pass over the bucket's stream (the bucket keeps one value
 * per key). O(records matched) per query. A record that does not parse is logged and skipped.
 */
export async function auditRecordsOf(kv: KV, filter: string, log: Logger): Promise<AuditRecord[]> {
  const latest = new Map<string, { revision: number; value: Uint8Array }>();
  for await (const e of await kv.history({ key: filter })) {
    const cur = latest.get(e.key);
    if (cur && cur.revision > e.revision) continue;
    if (e.operation !== 'PUT') latest.delete(e.key);
    else latest.set(e.key, { revision: e.revision, value: e.value });
  }
  const out: AuditRecord[] = [];
  for (const [key, { value }] of latest) {
    if (key.startsWith('_')) continue;
    try {
      out.push(decode(auditRecordSchema, value));
    } catch (err) {
      log.error({ err, key }, 'audit record does not match its schema: skipped');
    }
  }
  return out;
}

/**
 * Whether an operation is in `[since, until)`: any of its states or decisions falls in it
 * (`lastAt >= since` and `firstAt < until`), times in ms since the epoch.
 */
export function inRange(r: AuditRecord, range: { since?: number | undefined; until?: number | undefined }): boolean {
  return (
    (range.since === undefined || r.lastAt >= range.since) && (range.until === undefined || r.firstAt < range.until)
  );
}

/**
 * One page of `records` (oldest first): those of `state` and `contract` when given, after the
 * cursor `after`, at most `limit` and under {@link PAGE_BYTES} encoded; `next` is the cursor of the
 * page's last record when more follow.
 */
export function pageOf(
  records: readonly AuditRecord[],
  f: { state?: string | undefined; contract?: string | undefined; after?: string | undefined },
  limit: number,
): { page: AuditRecord[]; next?: string } {
  const selected = records
    .filter((r) => (!f.state || r.status === f.state) && (!f.contract || r.contract === f.contract))
    .filter((r) => !f.after || afterCursor(r, f.after))
    .sort(order);
  const page: AuditRecord[] = [];
  let bytes = 0;
  for (const r of selected) {
    const size = encode(r).byteLength;
    if (page.length >= limit || (page.length > 0 && bytes + size > PAGE_BYTES)) break;
    page.push(r);
    bytes += size;
  }
  const next = page.length < selected.length && page.length > 0 ? cursorOf(page.at(-1)!) : undefined;
  return next ? { page, next } : { page };
}
