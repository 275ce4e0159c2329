import { z } from 'zod';
import { effectClasses, errorClasses, hasSideEffect, idSchema, operationKeySchema } from '@tooltx/contracts';
import { operationStatuses, type OperationEvent } from '@tooltx/lifecycle';

/**
 * The audit-projector's projection (issue 3): one audit record per operation, in KV
 * `<prefix>_audit` under `<tenant>.<opId>`. It is evidence, not a copy of content (DESIGN.md
 * "Audit evidence is not a copy of sensitive content"): who, which contract, which target (a
 * digest), side effect or not, every state with its time, final state, error class and result
 * digest — never an input, body, result or raw error text.
 *
 * Order independence: the record's head (status, attempt, actor, error class, result digest) comes
 * from the event with the highest stream sequence seen; `states` holds one entry per event, keyed
 * and sorted by stream sequence; `sideEffect` only ever turns true. So after every event has been
 * applied — in any order, any number of times — the record equals the in-order one.
 */

const seq = z.number().int().positive();
const epochMs = z.number().int().nonnegative();
const digest = z.string().regex(/^sha256:[0-9a-f]{64}$/);

/** One state the operation went through: the event's stream sequence, its status, time (ms since the epoch) and attempt. */
export const auditStateSchema = z.object({
  seq,
  status: z.enum(operationStatuses),
  at: epochMs,
  attempt: z.number().int().min(1),
});
export type AuditState = z.infer<typeof auditStateSchema>;

/** The value stored under `<tenant>.<opId>` in the audit bucket (msgpack). */
export const auditRecordSchema = z.object({
  /** Stream sequence (events stream) of the newest event applied: the head's source. */
  seq,
  operationKey: operationKeySchema,
  tenant: idSchema,
  /** The actor who submitted the current attempt (from the authenticated subject). */
  actor: idSchema,
  tool: z.string(),
  /** `name@version` of the contract the operation runs under. */
  contract: z.string(),
  contractDigest: digest,
  effect: z.enum(effectClasses),
  /** Irreversible digest of the normalised target. */
  targetDigest: digest,
  attempt: z.number().int().min(1),
  status: z.enum(operationStatuses),
  /** Every state in stream order, one per event, no duplicates. */
  states: z.array(auditStateSchema),
  /** The machine error class of a `rejected` current attempt. */
  errorClass: z.enum(errorClasses).optional(),
  /** The result digest of a `committed` operation's receipt. */
  resultDigest: digest.optional(),
  /** True once an operation of a side-effecting effect class reached `running` (in any attempt). */
  sideEffect: z.boolean(),
});
export type AuditRecord = z.infer<typeof auditRecordSchema>;

/**
 * The projection rule: the record after `event`, stored at stream sequence `seq`, or `null` when
 * nothing changes (this sequence was already applied). An event older than the record's head still
 * adds its state to `states`; only a newer one moves the head. Pure.
 */
export function applyToAudit(current: AuditRecord | null, event: OperationEvent, seq: number): AuditRecord | null {
  if (current?.states.some((x) => x.seq === seq)) return null;
  const s = event.state;
  const state: AuditState = { seq, status: s.status, at: event.at, attempt: event.attempt };
  const states = [...(current?.states ?? []), state].sort((a, b) => a.seq - b.seq);
  // `running` is carried on by `unknown` and `committed` of the same attempt, so a skipped
  // `running` event is still seen.
  const ran = hasSideEffect(s.effect) && (event.type === 'running' || s.running !== undefined);
  const sideEffect = (current?.sideEffect ?? false) || ran;
  if (current && current.seq > seq) return { ...current, states, sideEffect };
  return {
    seq,
    operationKey: s.operationKey,
    tenant: s.tenant,
    actor: s.actor,
    tool: s.tool,
    contract: `${s.tool}@${s.version}`,
    contractDigest: s.contractDigest,
    effect: s.effect,
    targetDigest: s.targetDigest,
    attempt: s.attempt,
    status: s.status,
    states,
    ...(s.status === 'rejected' && s.error ? { errorClass: s.error.class } : {}),
    ...(s.status === 'committed' && s.receipt ? { resultDigest: s.receipt.resultDigest } : {}),
    sideEffect,
  };
}
