import { z } from 'zod';
import { ID_PATTERN, OPERATION_KEY_PATTERN } from '@tooltx/contracts';
import {
  sideEffectOf,
  type AuditAuthorization,
  type AuditDecision,
  type AuditRecord,
  type AuditState,
} from '@tooltx/lifecycle';

export { auditRecordSchema, type AuditRecord, type ContractCounts } from '@tooltx/lifecycle';

/**
 * The audit-projector's projection: one audit record per operation, in KV
 * `<prefix>_audit` under `<tenant>.<opId>`, fed by the event log and the decision stream. It is
 * evidence, not a copy of content (FM-16):
 * who (the internal actor id the server authenticated), when (every state with its time), which
 * contract (`name@version` and its digest), which target (a KEYED HMAC — a plain digest of a
 * guessable id is reversed by hashing guesses), the authorisation decisions with their policy
 * version, whether a side effect happened, the error class, a keyed HMAC of the result digest, and
 * who resolved it when a person did. Never an input, body, result, token or raw error text.
 *
 * Order independence: the record's head (status, actor, contract, authorisation, error class,
 * result) comes from the event with the highest event-log sequence seen — or, while the operation
 * was never registered, from the newest decision; `states` and `decisions` hold one entry per
 * message, keyed and sorted by stream sequence. So after every message has been applied — in any
 * order, any number of times, by any number of instances — the record equals the in-order one,
 * and a rebuild from the streams into an empty bucket gives the same records (same HMAC key).
 *
 * Events are read leniently ({@link auditedEventSchema}): an event type or a status this projector
 * does not know (a future compensation state, a takeover) is still recorded with its time.
 */

const epochMs = z.number().int().nonnegative();
const digest = z.string().regex(/^sha256:[0-9a-f]{64}$/);
const id = z.string().regex(ID_PATTERN);
/** A machine token: event type, status, error class, effect class, reason. */
const token = z.string().regex(/^[a-z][a-z0-9_]{0,39}$/);

/** The HMAC under the deployment's audit key, per purpose (see `keyedDigest` in @tooltx/runtime). */
export type AuditHmac = (purpose: 'target' | 'result' | 'resource' | 'reason', value: string) => string;

// ---- What is read from the streams (lenient: unknown fields are dropped, unknown types kept) ----

const authSeen = z.object({
  decision: z.enum(['allow', 'deny']),
  policyVersion: z.string().min(1).max(100),
  reason: token.optional(),
  at: epochMs,
  resources: z
    .array(z.object({ id: z.string().max(200), version: z.number().int() }))
    .max(50)
    .optional(),
});

/** The part of a lifecycle event the audit reads. Any event type; any status token. */
export const auditedEventSchema = z.object({
  type: token,
  at: epochMs,
  /** Set on an outcome a person decided, with their operator id. */
  manual: z.boolean().optional(),
  resolvedBy: id.optional(),
  /** Who confirmed or discarded a held-back operation. */
  by: z.object({ kind: z.enum(['actor', 'operator']), id }).optional(),
  state: z.object({
    status: token,
    operationKey: z.string().regex(OPERATION_KEY_PATTERN),
    tenant: id,
    actor: id,
    taskId: z.string().min(1).max(200).optional(),
    tool: z.string().min(1).max(100),
    version: z.number().int(),
    contractDigest: digest,
    effect: token,
    targetDigest: digest,
    attempt: z.number().int().min(1),
    authorization: z.object({ intake: authSeen.optional(), execution: authSeen.optional() }).optional(),
    error: z.object({ class: token }).optional(),
    receipt: z.object({ resultDigest: digest, resolvedBy: id.optional() }).optional(),
    resolution: z.object({ by: id }).optional(),
    takeover: z.object({ reason: token }).optional(),
    /** The compensation asked of this operation (docs/compensation.md): its key, who asked, why (a digest). */
    compensation: z
      .object({
        operationKey: z.string().regex(OPERATION_KEY_PATTERN),
        requestedBy: z.object({ kind: token, id }),
        reasonDigest: digest,
        failure: z.object({ kind: token, error: z.object({ class: token }).optional() }).optional(),
        refusal: z.object({ error: z.object({ class: token }) }).optional(),
      })
      .optional(),
    /** Set on a compensation: the operation it compensates. */
    compensates: z.object({ operationKey: z.string().regex(OPERATION_KEY_PATTERN) }).optional(),
  }),
});
export type AuditedEvent = z.infer<typeof auditedEventSchema>;

/**
 * The part of a decision record the audit reads: a refusal at intake or an idempotency conflict
 * (`error`), or a compensation's replay to a later requester (`outcome: 'replayed'`).
 */
export const auditedDecisionSchema = z.union([
  z.object({
    type: z.literal('decision'),
    outcome: z.literal('replayed'),
    at: epochMs,
    operationKey: z.string().regex(OPERATION_KEY_PATTERN),
    tenant: id,
    actor: id,
    tool: z.string().min(1).max(100).optional(),
    version: z.number().int().optional(),
    requestedBy: z.object({ kind: z.enum(['actor', 'operator']), id }),
    reasonDigest: digest,
  }),
  z.object({
    type: z.literal('decision'),
    at: epochMs,
    operationKey: z.string().regex(OPERATION_KEY_PATTERN),
    tenant: id,
    actor: id,
    tool: z.string().min(1).max(100).optional(),
    version: z.number().int().optional(),
    error: z.object({ class: token }),
    authorization: authSeen.optional(),
  }),
]);
export type AuditedDecision = z.infer<typeof auditedDecisionSchema>;

/** Fields of a record that come from its head (replaced together when the head moves). */
type Head = Omit<
  AuditRecord,
  'operationKey' | 'tenant' | 'decisionSeq' | 'states' | 'decisions' | 'firstAt' | 'lastAt'
>;
const HEAD_KEYS = [
  'seq',
  'actor',
  'taskId',
  'status',
  'tool',
  'contract',
  'contractDigest',
  'effect',
  'targetHmac',
  'attempt',
  'authorization',
  'sideEffect',
  'errorClass',
  'resultHmac',
  'resolvedBy',
  'takeover',
  'compensation',
  'compensates',
] as const;

function authView(a: z.infer<typeof authSeen> | undefined, h: AuditHmac): AuditAuthorization | undefined {
  if (!a) return undefined;
  return {
    decision: a.decision,
    policyVersion: a.policyVersion,
    ...(a.reason ? { reason: a.reason } : {}),
    at: a.at,
    ...(a.resources
      ? { resources: a.resources.map((r) => ({ idHmac: h('resource', r.id), version: r.version })) }
      : {}),
  };
}

function headOfEvent(e: AuditedEvent, at: number, h: AuditHmac): Head {
  const s = e.state;
  const intake = authView(s.authorization?.intake, h);
  const execution = authView(s.authorization?.execution, h);
  const resolvedBy = s.resolution?.by ?? (e.manual ? e.resolvedBy : undefined) ?? s.receipt?.resolvedBy;
  return {
    seq: at,
    actor: s.actor,
    ...(s.taskId !== undefined ? { taskId: s.taskId } : {}),
    status: s.status,
    tool: s.tool,
    contract: `${s.tool}@${s.version}`,
    contractDigest: s.contractDigest,
    effect: s.effect,
    targetHmac: h('target', s.targetDigest),
    attempt: s.attempt,
    ...(intake || execution
      ? { authorization: { ...(intake ? { intake } : {}), ...(execution ? { execution } : {}) } }
      : {}),
    sideEffect: sideEffectOf(s.effect, s.status),
    ...(s.status === 'rejected' && s.error ? { errorClass: s.error.class } : {}),
    ...(s.status === 'committed' && s.receipt ? { resultHmac: h('result', s.receipt.resultDigest) } : {}),
    ...(resolvedBy ? { resolvedBy } : {}),
    ...(s.takeover ? { takeover: { reason: s.takeover.reason } } : {}),
    // The two operations linked by their keys; the reason only as a keyed HMAC of its digest.
    ...(s.compensation
      ? {
          compensation: {
            operationKey: s.compensation.operationKey,
            requestedBy: s.compensation.requestedBy,
            reasonHmac: h('reason', s.compensation.reasonDigest),
            ...((s.compensation.failure?.error ?? s.compensation.refusal?.error)
              ? { errorClass: (s.compensation.failure?.error ?? s.compensation.refusal?.error)!.class }
              : {}),
          },
        }
      : {}),
    ...(s.compensates ? { compensates: s.compensates.operationKey } : {}),
  };
}

function headOfDecision(d: AuditDecision): Head {
  return {
    seq: 0,
    actor: d.actor,
    status: 'refused',
    ...(d.contract ? { contract: d.contract, tool: d.contract.slice(0, d.contract.lastIndexOf('@')) } : {}),
    sideEffect: 'none',
    ...(d.errorClass ? { errorClass: d.errorClass } : {}),
  };
}

function pickHead(r: AuditRecord): Head {
  const out: Record<string, unknown> = {};
  for (const k of HEAD_KEYS) if (r[k] !== undefined) out[k] = r[k];
  return out as Head;
}

function assemble(
  operationKey: string,
  tenant: string,
  head: Head,
  states: AuditState[],
  decisions: AuditDecision[],
  decisionsDropped = 0,
): AuditRecord {
  const times = [...states.map((s) => s.at), ...decisions.map((d) => d.at)];
  const { seq: headSeq, ...rest } = head;
  return {
    operationKey,
    tenant,
    seq: headSeq,
    decisionSeq: decisions.reduce((m, d) => Math.max(m, d.seq), 0),
    ...rest,
    states,
    decisions,
    ...(decisionsDropped > 0 ? { decisionsDropped } : {}),
    firstAt: Math.min(...times),
    lastAt: Math.max(...times),
  };
}

/**
 * Decisions one audit record keeps: the newest; older ones are counted in `decisionsDropped`. A
 * tenant refused again and again under one key (its own choice of key) would otherwise grow one
 * record without bound, and every refusal would rewrite all of it (docs/tenancy.md).
 */
export const MAX_AUDIT_DECISIONS = 64;

/**
 * The projection rule for an event stored at event-log sequence `at`: the record after it, or `null`
 * when nothing changes (this sequence was already applied). An event older than the record's head
 * still adds its state; only a newer one moves the head. Pure (the HMAC is a keyed function).
 */
export function applyEventToAudit(
  current: AuditRecord | null,
  e: AuditedEvent,
  at: number,
  h: AuditHmac,
): AuditRecord | null {
  if (current?.states.some((x) => x.seq === at)) return null;
  const s = e.state;
  const resolvedBy = e.manual ? (e.resolvedBy ?? s.resolution?.by) : undefined;
  const state: AuditState = {
    seq: at,
    event: e.type,
    status: s.status,
    at: e.at,
    attempt: s.attempt,
    actor: s.actor,
    ...(s.status === 'rejected' && s.error && (e.type === 'rejected' || e.manual) ? { errorClass: s.error.class } : {}),
    ...(resolvedBy ? { resolvedBy } : {}),
    ...(e.by ? { by: e.by } : {}),
  };
  const states = [...(current?.states ?? []), state].sort((a, b) => a.seq - b.seq);
  const head = !current || current.seq < at ? headOfEvent(e, at, h) : pickHead(current);
  return assemble(s.operationKey, s.tenant, head, states, current?.decisions ?? [], current?.decisionsDropped);
}

/**
 * The projection rule for a decision stored at decision-stream sequence `at`. While no event of the
 * operation was applied, the newest decision is the head (status `refused`). Pure.
 */
export function applyDecisionToAudit(current: AuditRecord | null, d: AuditedDecision, at: number): AuditRecord | null {
  if (current?.decisions.some((x) => x.seq === at)) return null;
  let dropped = current?.decisionsDropped ?? 0;
  // Older than every decision a full record keeps: counted, not kept (a redelivery of one already
  // dropped counts again: the count is "at least").
  if (current && current.decisions.length >= MAX_AUDIT_DECISIONS && at < current.decisions[0]!.seq) {
    return assemble(
      d.operationKey,
      d.tenant,
      current.seq > 0 ? pickHead(current) : headOfDecision(current.decisions.at(-1)!),
      current.states,
      current.decisions,
      dropped + 1,
    );
  }
  const contract = d.tool && d.version !== undefined ? { contract: `${d.tool}@${d.version}` } : {};
  const entry: AuditDecision =
    'outcome' in d
      ? {
          seq: at,
          at: d.at,
          actor: d.actor,
          ...contract,
          replayed: { requestedBy: d.requestedBy, reasonDigest: d.reasonDigest },
          conflict: false,
        }
      : {
          seq: at,
          at: d.at,
          actor: d.actor,
          ...contract,
          errorClass: d.error.class,
          conflict: d.error.class === 'idempotency_conflict',
          ...(d.authorization?.decision === 'deny' ? { policyVersion: d.authorization.policyVersion } : {}),
        };
  const all = [...(current?.decisions ?? []), entry].sort((a, b) => a.seq - b.seq);
  dropped += Math.max(0, all.length - MAX_AUDIT_DECISIONS);
  const decisions = all.slice(-MAX_AUDIT_DECISIONS);
  const head = current && current.seq > 0 ? pickHead(current) : headOfDecision(decisions.at(-1)!);
  return assemble(d.operationKey, d.tenant, head, current?.states ?? [], decisions, dropped);
}
