import { z } from 'zod';
import { hasSideEffect, ID_PATTERN, OPERATION_KEY_PATTERN, type EffectClass } from '@tooltx/contracts';

/**
 * Audit evidence as data — evidence, not a copy of sensitive content (FM-16):
 * the audit record the audit-projector keeps per operation, and the request/answer shapes of the
 * auditors' query service (`<prefix>.audit.<tenant>.<auditor>`, msgpack). Shared by the service
 * and its clients (`tooltx audit`, the demo); the projection rules live in the service.
 *
 * A record is evidence, not a copy of content: who (the internal actor id the server authenticated),
 * when (every state with its time), which contract, which target (a KEYED HMAC — a plain digest of
 * a guessable id is reversed by hashing guesses), the authorisation decisions with their policy
 * versions, whether a side effect happened, the error class, a keyed HMAC of the result digest and
 * who resolved it when a person did. Never an input, body, result, token or raw error text.
 */

const seq = z.number().int().positive();
const epochMs = z.number().int().nonnegative();
const digest = z.string().regex(/^sha256:[0-9a-f]{64}$/);
/** `hmac-sha256:<64 hex>` — HMAC-SHA256 under the deployment's audit key (`TOOLTX_AUDIT_HMAC_KEY_FILE`). */
export const AUDIT_HMAC_PATTERN = /^hmac-sha256:[0-9a-f]{64}$/;
const hmac = z.string().regex(AUDIT_HMAC_PATTERN);
const id = z.string().regex(ID_PATTERN);
/** A machine token: event type, status, error class, effect class, reason. */
const token = z.string().regex(/^[a-z][a-z0-9_]{0,39}$/);

/** An authorisation decision as the audit keeps it: resource ids only as keyed HMACs. */
export const auditAuthorizationSchema = z.object({
  decision: z.enum(['allow', 'deny']),
  policyVersion: z.string(),
  reason: token.optional(),
  at: epochMs,
  resources: z.array(z.object({ idHmac: hmac, version: z.number().int() })).optional(),
});
export type AuditAuthorization = z.infer<typeof auditAuthorizationSchema>;

/** One state the operation went through: one per event, with its stream sequence and time (ms since the epoch). */
export const auditStateSchema = z.object({
  /** Sequence in the event log. */
  seq,
  /** The event type (`accepted`, `running`, `requeued`, `takeover`, … — any, also one added later). */
  event: token,
  /** The status after it. */
  status: token,
  at: epochMs,
  attempt: z.number().int().min(1),
  /** The actor of the attempt at that moment. */
  actor: id,
  /** The error class of a `rejected` event. */
  errorClass: token.optional(),
  /** The operator who decided this outcome by hand. */
  resolvedBy: id.optional(),
  /** Who confirmed or discarded a held-back operation (`confirmed`, `discarded`): an actor or an operator. */
  by: z.object({ kind: z.enum(['actor', 'operator']), id }).optional(),
});
export type AuditState = z.infer<typeof auditStateSchema>;

/**
 * One outcome on the operation's decision subject: a refusal at intake or a conflict (`errorClass`),
 * or a later request of a registered compensation answered with it (`replayed`: who asked, an agent
 * or an operator, and the digest of its reason; every requester is on record).
 */
export const auditDecisionSchema = z.object({
  /** Sequence in the decision stream. */
  seq,
  at: epochMs,
  actor: id,
  /** `name@version` when the request named a known contract. */
  contract: z.string().optional(),
  /** The refusal's class; absent on a `replayed` entry. */
  errorClass: token.optional(),
  replayed: z
    .object({ requestedBy: z.object({ kind: z.enum(['actor', 'operator']), id }), reasonDigest: digest })
    .optional(),
  /** True for an `idempotency_conflict`: the key is registered with another input. */
  conflict: z.boolean(),
  /** Policy version of a denial at intake. */
  policyVersion: z.string().optional(),
});
export type AuditDecision = z.infer<typeof auditDecisionSchema>;

/** Whether a side effect happened: never (read/compute, refused, not applied), maybe (running, unknown), yes (committed). */
export const sideEffects = ['none', 'possible', 'applied'] as const;

/**
 * Whether the effect of an operation whose current status is `status` happened (docs/lifecycle.md):
 * `none` for a read or a computation, or when rejected (definitively not applied), accepted (not
 * started, or requeued after a probe found nothing), held back waiting for a confirmation, or rolled
 * back (discarded before it ran); `applied` when committed, and in every compensation status (the
 * original's effect happened; a compensation is another effect, never its undoing, FM-20);
 * `possible` while it runs or its outcome is unknown. Pure.
 */
export function sideEffectOf(effect: string, status: string): (typeof sideEffects)[number] {
  // As read from an event: a value this version does not know is taken as a side effect (never as none).
  if (!hasSideEffect(effect as EffectClass)) return 'none';
  if (
    status === 'committed' ||
    status === 'compensation_requested' ||
    status === 'compensated' ||
    status === 'compensation_failed'
  )
    return 'applied';
  if (status === 'rejected' || status === 'accepted' || status === 'awaiting_confirmation' || status === 'rolled_back')
    return 'none';
  return 'possible';
}

/** The value stored under `<tenant>.<opId>` in KV `<prefix>_audit` (msgpack). */
export const auditRecordSchema = z.object({
  operationKey: z.string().regex(OPERATION_KEY_PATTERN),
  tenant: id,
  /** Event-log sequence of the head event; 0 while the operation was never registered. */
  seq: z.number().int().nonnegative(),
  /** Decision-stream sequence of the newest decision; 0 when none. */
  decisionSeq: z.number().int().nonnegative(),
  /** Internal actor id of the current attempt (or of the newest refused request). */
  actor: id,
  /**
   * The task the operation belongs to (the agent's own task id), once it was accepted: what
   * `tooltx contracts usage` counts tasks by (docs/contracts.md).
   */
  taskId: z.string().min(1).max(200).optional(),
  /** Current status; `refused` when the operation was only ever refused before acceptance. */
  status: token,
  tool: z.string().optional(),
  /** `name@version` of the contract. */
  contract: z.string().optional(),
  contractDigest: digest.optional(),
  effect: token.optional(),
  /** HMAC (purpose `audit-target`) of the normalised target's digest. */
  targetHmac: hmac.optional(),
  attempt: z.number().int().min(1).optional(),
  /** The current attempt's decisions: at intake and at the execution instant. */
  authorization: z
    .object({ intake: auditAuthorizationSchema.optional(), execution: auditAuthorizationSchema.optional() })
    .optional(),
  sideEffect: z.enum(sideEffects),
  /** The error class of a `rejected` (or `refused`) head. */
  errorClass: token.optional(),
  /** HMAC (purpose `audit-result`) of a `committed` receipt's result digest. */
  resultHmac: hmac.optional(),
  /** The operator who resolved the current outcome by hand. */
  resolvedBy: id.optional(),
  /** Set once the operation was handed over to a person. */
  takeover: z.object({ reason: token }).optional(),
  /**
   * The compensation asked of this operation (docs/compensation.md): the compensation's key (its own
   * record), who asked, an HMAC (purpose `audit-reason`) of the reason's digest, and the class of its
   * failure or refusal. No body of either operation.
   */
  compensation: z
    .object({
      operationKey: z.string().regex(OPERATION_KEY_PATTERN),
      requestedBy: z.object({ kind: token, id }),
      reasonHmac: hmac,
      errorClass: token.optional(),
    })
    .optional(),
  /** Set on a compensation's record: the key of the operation it compensates. */
  compensates: z.string().regex(OPERATION_KEY_PATTERN).optional(),
  states: z.array(auditStateSchema),
  /** The newest pre-acceptance decisions (at most 64: docs/tenancy.md). */
  decisions: z.array(auditDecisionSchema),
  /** Older decisions not kept in the record (at least this many): a key refused again and again. */
  decisionsDropped: z.number().int().positive().optional(),
  /** Earliest and latest time of any state or decision, ms since the epoch. */
  firstAt: epochMs,
  lastAt: epochMs,
});
export type AuditRecord = z.infer<typeof auditRecordSchema>;

/**
 * An audit record as an auditor receives it: the positions in the event log all tenants share
 * become the operation's own (`seq` = how many of its states the record holds, each state's `seq`
 * its 1-based place among them), so nothing an auditor reads counts another tenant's calls
 * (docs/tenancy.md). Decision sequences are the tenant's own stream's already. Pure.
 */
export function auditRecordForAuditor(r: AuditRecord): AuditRecord {
  const states = [...r.states].sort((a, b) => a.seq - b.seq).map((st, i) => ({ ...st, seq: i + 1 }));
  return { ...r, seq: states.length, states };
}

/**
 * Counts of one contract version, computed from audit records:
 * - `operations` — records (operation keys) of this contract version;
 * - `accepted` — attempts accepted (`accepted` events; requeues are not new attempts);
 * - `committed` — operations whose outcome is `committed`;
 * - `rejected` — attempts rejected after acceptance, by error class (a person's "not applied" included);
 * - `refused` — requests refused at intake, by class (decision records; conflicts apart);
 * - `conflicts` — `idempotency_conflict` decisions: each refused request that reused a registered
 *   key with another input (or supplied a key that did not match), counted once per decision
 *   record on the operation's decision subject;
 * - `unknown` — operations that were `unknown` at least once; `unresolved` — still unknown now;
 * - `takeovers` — operations handed to a person; `manual` — outcomes a person decided.
 */
export const contractCountsSchema = z.object({
  contract: z.string(),
  operations: z.number().int(),
  accepted: z.number().int(),
  committed: z.number().int(),
  rejected: z.record(z.string(), z.number().int()),
  refused: z.record(z.string(), z.number().int()),
  conflicts: z.number().int(),
  unknown: z.number().int(),
  unresolved: z.number().int(),
  takeovers: z.number().int(),
  manual: z.number().int(),
});
export type ContractCounts = z.infer<typeof contractCountsSchema>;

/**
 * {@link ContractCounts} per contract version, from audit records (the schema's doc says what each
 * count means). Conflicts are counted from the decision stream: one per `idempotency_conflict`
 * decision record, under the contract the refused request named. Refusals that named no known
 * contract count under `(none)`. Sorted by contract. Pure.
 */
export function countsOf(records: Iterable<AuditRecord>): ContractCounts[] {
  const by = new Map<string, ContractCounts>();
  const get = (contract: string) => {
    let c = by.get(contract);
    if (!c)
      by.set(
        contract,
        (c = {
          contract,
          operations: 0,
          accepted: 0,
          committed: 0,
          rejected: {},
          refused: {},
          conflicts: 0,
          unknown: 0,
          unresolved: 0,
          takeovers: 0,
          manual: 0,
        }),
      );
    return c;
  };
  const inc = (m: Record<string, number>, k: string) => (m[k] = (m[k] ?? 0) + 1);
  for (const r of records) {
    const c = get(r.contract ?? '(none)');
    c.operations++;
    for (const s of r.states) {
      if (s.event === 'accepted') c.accepted++;
      if (s.status === 'rejected' && s.errorClass) inc(c.rejected, s.errorClass);
    }
    for (const d of r.decisions) {
      if (d.conflict) get(d.contract ?? r.contract ?? '(none)').conflicts++;
      else if (d.errorClass) inc(get(d.contract ?? r.contract ?? '(none)').refused, d.errorClass);
    }
    if (r.status === 'committed') c.committed++;
    if (r.states.some((s) => s.status === 'unknown')) c.unknown++;
    if (r.status === 'unknown') c.unresolved++;
    if (r.states.some((s) => s.event === 'takeover') || r.takeover) c.takeovers++;
    if (r.states.some((s) => s.resolvedBy)) c.manual++;
  }
  return [...by.values()].sort((a, b) => a.contract.localeCompare(b.contract));
}

/** Most records in one answer of the audit service. */
export const MAX_AUDIT_PAGE = 500;

const range = {
  /** Operations with a state or decision at or after this time (ms since the epoch). */
  since: epochMs.optional(),
  /** … and first seen before this time. */
  until: epochMs.optional(),
};
/** Where the next page starts: `<firstAt>.<operationKey>` of the last record of the previous page. */
export const auditCursorSchema = z.string().regex(/^\d{1,16}\.opk_[A-Za-z0-9_-]{1,100}$/);

/**
 * One request to the audit service. The tenant and the auditor are never in it: they are the
 * request subject's tokens, which the server lets only that auditor publish.
 */
export const auditRequestSchema = z.discriminatedUnion('kind', [
  z.strictObject({ kind: z.literal('show'), operationKey: z.string().regex(OPERATION_KEY_PATTERN) }),
  z.strictObject({
    kind: z.literal('list'),
    ...range,
    state: token.optional(),
    contract: z.string().max(120).optional(),
    limit: z.number().int().min(1).max(MAX_AUDIT_PAGE).optional(),
    after: auditCursorSchema.optional(),
  }),
  z.strictObject({
    kind: z.literal('export'),
    ...range,
    format: z.literal('jsonl'),
    exportId: z.uuid().optional(),
    after: auditCursorSchema.optional(),
  }),
  z.strictObject({ kind: z.literal('counts'), ...range }),
]);
export type AuditRequest = z.infer<typeof auditRequestSchema>;

/**
 * What the audit service records (stream `<P>_AUDITLOG`, subject `<prefix>.auditlog.<tenant>.<auditor>`)
 * BEFORE it answers: who, when, what, which range, how many records.
 */
export const auditQueryRecordSchema = z.object({
  schema: z.literal(1),
  queryId: z.uuid(),
  /** When the query was answered, ms since the epoch (the service's clock). */
  at: epochMs,
  tenant: id,
  auditor: id,
  kind: z.enum(['show', 'list', 'export', 'counts', 'invalid']),
  operationKey: z.string().optional(),
  since: epochMs.optional(),
  until: epochMs.optional(),
  state: z.string().optional(),
  contract: z.string().optional(),
  after: z.string().optional(),
  exportId: z.string().optional(),
  /** How many records the answer carries (`counts`: how many records were counted). */
  count: z.number().int().nonnegative(),
  /** The service instance that answered. */
  instance: z.string(),
});
export type AuditQueryRecord = z.infer<typeof auditQueryRecordSchema>;

const issues = z.array(
  z.object({ path: z.array(z.union([z.string(), z.number()])), code: z.string(), message: z.string() }),
);

/** The answers (msgpack). Every data answer carries the id of its recorded query. */
export const auditAnswerSchema = z.union([
  z.object({ kind: z.literal('show'), queryId: z.string(), record: auditRecordSchema.nullable() }),
  z.object({
    kind: z.literal('list'),
    queryId: z.string(),
    records: z.array(auditRecordSchema),
    next: auditCursorSchema.optional(),
  }),
  z.object({
    kind: z.literal('export'),
    queryId: z.string(),
    exportId: z.string(),
    records: z.array(auditRecordSchema),
    next: auditCursorSchema.optional(),
  }),
  z.object({
    kind: z.literal('counts'),
    queryId: z.string(),
    records: z.number().int(),
    counts: z.array(contractCountsSchema),
  }),
  // `retryAfterMs`: ask again after it (the audit records are being rebuilt from the log).
  z.object({
    error: z.object({ class: z.string(), issues: issues.optional(), retryAfterMs: z.number().int().optional() }),
  }),
]);
export type AuditAnswer = z.infer<typeof auditAnswerSchema>;
