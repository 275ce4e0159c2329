import type { KV } from '@nats-io/kv';
import type { NatsConnection } from '@nats-io/transport-node';
import { z } from 'zod';
import {
  ErrorClass,
  idSchema,
  operationIdOf,
  operationKeySchema,
  TooltxError,
  type ErrorInfo,
} from '@tooltx/contracts';
import {
  auditCursorSchema,
  auditRecordForAuditor,
  auditRecordSchema,
  MAX_AUDIT_PAGE,
  type AuditRecord,
} from '@tooltx/lifecycle';
import { decode, type Subjects } from '@tooltx/nats';
import type { Logger } from '@tooltx/runtime';
import { auditRecordsOf, inRange, pageOf, REBUILDING_RETRY_MS } from './audit-queries.js';
import { operatorEndpoint, startResponder, type Responder } from './responder.js';

const epochMs = z.number().int().nonnegative();
/** A status as audit records carry it (an operation's, or `refused`). */
const state = z.string().regex(/^[a-z][a-z0-9_]{0,39}$/);

/**
 * What an operator asks the operations query service (`<prefix>.ops.query.<operator>`, JSON):
 * operations by state across tenants, or one operation's audit record. The operator is the
 * subject's last token, never a field.
 */
export const opsQueryRequestSchema = z.discriminatedUnion('action', [
  z.strictObject({
    action: z.literal('list'),
    tenant: idSchema.optional(),
    state: state.optional(),
    contract: z.string().max(120).optional(),
    /** Operations with a state or decision at or after this time (ms since the epoch)… */
    since: epochMs.optional(),
    /** … and first seen before this time. */
    until: epochMs.optional(),
    limit: z.number().int().min(1).max(MAX_AUDIT_PAGE).optional(),
    after: auditCursorSchema.optional(),
  }),
  z.strictObject({ action: z.literal('show'), operationKey: operationKeySchema, tenant: idSchema }),
]);
export type OpsQueryRequest = z.infer<typeof opsQueryRequestSchema>;

/** The answers (JSON): `{ ok: true, … }` or `{ ok: false, error }` with a machine class. */
export const opsQueryAnswerSchema = z.union([
  z.object({ ok: z.literal(true), operations: z.array(auditRecordSchema), next: auditCursorSchema.optional() }),
  z.object({ ok: z.literal(true), record: auditRecordSchema.nullable() }),
  z.object({
    ok: z.literal(false),
    error: z.object({
      class: z.string(),
      issues: z
        .array(z.object({ path: z.array(z.union([z.string(), z.number()])), code: z.string(), message: z.string() }))
        .optional(),
      retryAfterMs: z.number().int().optional(),
    }),
  }),
]);
export type OpsQueryAnswer =
  | { ok: true; operations: AuditRecord[]; next?: string }
  | { ok: true; record: AuditRecord | null }
  | { ok: false; error: ErrorInfo };

export interface OpsQueryServiceDeps {
  nc: NatsConnection;
  /** The audit bucket: every tenant's records. */
  kv: KV;
  subjects: Subjects;
  log: Logger;
  /** True while the audit records are rebuilt from the log (as for {@link AuditService}). */
  rebuilding?: () => boolean;
}

/**
 * The operations query service: an operator granted `query` lists operations by state across
 * tenants (filters: tenant, contract, state, time range; paged, oldest first) and reads one
 * operation's audit record — the same records, the same range rule and the same pages as the audit
 * service's, for every tenant instead of one; no input, body, result or error text is in them.
 * Request/reply on `<prefix>.ops.query.<operator>` (queue group `tooltx-ops-query`), served by the
 * audit-projector, which owns the records; only a granted operator may publish there, and answers
 * go only into that operator's own inbox (FM-31, FM-32). Refusals: `invalid_input` (with field
 * issues), `dependency_unavailable` (with `retryAfterMs` while the records are rebuilt).
 */
export function startOpsQueryService(d: OpsQueryServiceDeps): Responder {
  const handle = async (req: OpsQueryRequest, operator: string): Promise<OpsQueryAnswer> => {
    if (d.rebuilding?.())
      throw new TooltxError(ErrorClass.DependencyUnavailable, 'audit records being rebuilt', {
        retryAfterMs: REBUILDING_RETRY_MS,
      });
    let answer: OpsQueryAnswer;
    let count: number;
    try {
      if (req.action === 'show') {
        const e = await d.kv.get(d.subjects.projectionKey(req.tenant, operationIdOf(req.operationKey)));
        const record = e && e.operation === 'PUT' ? decode(auditRecordSchema, e.value) : null;
        const found = record && record.operationKey === req.operationKey ? auditRecordForAuditor(record) : null;
        answer = { ok: true, record: found };
        count = found ? 1 : 0;
      } else {
        const all = (await auditRecordsOf(d.kv, req.tenant ? `${req.tenant}.>` : '>', d.log)).filter((r) =>
          inRange(r, req),
        );
        const { page, next } = pageOf(all, req, req.limit ?? 100);
        answer = { ok: true, operations: page.map(auditRecordForAuditor), ...(next ? { next } : {}) };
        count = page.length;
      }
    } catch (err) {
      d.log.error({ err, operator, action: req.action }, 'operations query failed');
      throw new TooltxError(ErrorClass.DependencyUnavailable, 'operations query not answered', { cause: err });
    }
    d.log.info({ operator, action: req.action, count }, 'operations query answered');
    return answer;
  };

  return startResponder(
    d.nc,
    d.log,
    operatorEndpoint({
      name: 'ops-query',
      subject: d.subjects.allOpsQuery,
      queue: 'tooltx-ops-query',
      parse: (subject) => d.subjects.parseOpsQuerySubject(subject),
      what: 'an operations query',
      schema: opsQueryRequestSchema,
      handle,
    }),
  );
}
