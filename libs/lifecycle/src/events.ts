import { z } from 'zod';
import { effectClasses, errorClasses, ID_PATTERN, OPERATION_KEY_PATTERN } from '@tooltx/contracts';

/**
 * The operation lifecycle as data: one zod schema per event, a discriminated union over them, and
 * the folded state every event carries (so loading an operation is one read of the last message on
 * its subject). Events hold metadata and digests only — never inputs, results, bodies or raw error
 * text (FM-16).
 */
export const EVENT_SCHEMA_VERSION = 1;

const id = z.string().regex(ID_PATTERN);
/**
 * A W3C Trace Context `traceparent` (version-traceid-parentid-flags, lowercase hex): where an
 * operation's attempt sits in its caller's trace (docs/tracing.md). Never an input or a result.
 */
export const traceparentSchema = z.string().regex(/^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$/);
const digest = z.string().regex(/^sha256:[0-9a-f]{64}$/);
const epochMs = z.number().int().nonnegative();
const eventId = z.string().min(8).max(64);

export const errorInfoSchema = z.object({
  class: z.enum(errorClasses),
  issues: z
    .array(z.object({ path: z.array(z.union([z.string(), z.number()])), code: z.string(), message: z.string() }))
    .optional(),
  retryAfterMs: z.number().int().nonnegative().optional(),
});

/** Evidence about an attempt whose outcome is not known: digests, codes, sizes and times only. */
export const evidenceSchema = z.object({
  kind: z.enum(['timeout', 'connection_lost', 'downstream_error', 'probe', 'executor_lost']),
  at: epochMs,
  statusCode: z.number().int().optional(),
  bytesSent: z.number().int().nonnegative().optional(),
  bytesReceived: z.number().int().nonnegative().optional(),
  elapsedMs: z.number().int().nonnegative().optional(),
  detailDigest: digest.optional(),
});
export type Evidence = z.infer<typeof evidenceSchema>;

/**
 * An authorisation decision bound to the operation key (authorisation is recomputed at the
 * execution instant, FM-07, FM-08): allow/deny, the reason class of a denial, the policy version
 * that decided, the time, and the canonical resources (internal id + authorisation version) it saw.
 */
export const authDecisionSchema = z.object({
  decision: z.enum(['allow', 'deny']),
  policyVersion: z.string().min(1).max(100),
  reason: z.enum(errorClasses).optional(),
  at: epochMs,
  resources: z
    .array(z.object({ id: z.string().max(200), version: z.number().int() }))
    .max(50)
    .optional(),
});
export type AuthDecision = z.infer<typeof authDecisionSchema>;

/** The receipt format the signers write now (docs/lifecycle.md "Receipt formats"). */
export const RECEIPT_SCHEMA_VERSION = 2;

/** Fields every receipt format carries. */
const receiptFields = {
  tenant: id,
  operationKey: z.string().regex(OPERATION_KEY_PATTERN),
  tool: z.string(),
  version: z.number().int(),
  state: z.literal('committed'),
  resourceId: z.string().min(1),
  /** `sha256:` digest of the RFC 8785 canonical business result. */
  resultDigest: digest,
  /** Server time of the commit, ms since the epoch. */
  committedAt: epochMs,
  attempt: z.number().int().min(1),
  /** Set when a person resolved the operation: `resolvedBy` is their operator id. */
  manual: z.literal(true).optional(),
  resolvedBy: id.optional(),
  /** The signer's key id (`ed25519:…`) and its base64url signature over every other field. */
  keyId: z.string().regex(/^ed25519:[A-Za-z0-9_-]{22}$/),
  signature: z.string().regex(/^[A-Za-z0-9_-]{86}$/),
};

/**
 * Receipt format 2 (`schema: 2`), what every signer writes: the chain position it binds is the
 * operation's own event count before the commit (`prevEventCount`, the `eventCount` of the state
 * the commit was decided on), which no other tenant's traffic moves.
 */
export const receiptV2Schema = z.object({
  schema: z.literal(RECEIPT_SCHEMA_VERSION),
  ...receiptFields,
  prevEventCount: z.number().int().min(1),
});

/**
 * Receipt format 1 (no `schema` field), read and verified only: stored `committed` events and
 * receipts agents kept still carry it. `prevSeq` is the shared event log's sequence the `committed`
 * append expected, which other tenants' traffic moves (no signer writes this format).
 */
export const receiptV1Schema = z.object({
  ...receiptFields,
  prevSeq: z.number().int().min(1),
});

/**
 * The server-side proof that an operation committed (FM-17): what was known before the append —
 * tenant, key, attempt, the operation's position before the commit, resource id, result digest, the
 * signer's clock, `manual` / `resolvedBy` for a person's resolution — signed with Ed25519 over its
 * RFC 8785 bytes (see `signing.ts`). Either format (docs/lifecycle.md "Receipt formats"); both
 * verify the same way.
 */
export const receiptSchema = z.union([receiptV2Schema, receiptV1Schema]);
export type Receipt = z.infer<typeof receiptSchema>;
export type ReceiptV1 = z.infer<typeof receiptV1Schema>;
export type ReceiptV2 = z.infer<typeof receiptV2Schema>;

/**
 * What a person resolving a failed compensation needs of the original's receipt: which effect it
 * proves (key, resource id, commit time, result digest) and the signature that makes it checkable
 * against the receipt the status answer returns. No body, no result.
 */
export const receiptReferenceSchema = z.object({
  operationKey: z.string().regex(OPERATION_KEY_PATTERN),
  resourceId: z.string().min(1),
  committedAt: epochMs,
  resultDigest: digest,
  keyId: z.string().regex(/^ed25519:[A-Za-z0-9_-]{22}$/),
  signature: z.string().regex(/^[A-Za-z0-9_-]{86}$/),
});
export type ReceiptReference = z.infer<typeof receiptReferenceSchema>;

/**
 * A takeover record (FM-14, FM-20): written when an operation is still `unknown` past its
 * contract's `unknownDeadlineMs`, when a probe found something else under our key, or, on a
 * committed original, when its compensation failed (`compensation_failed`: the original's receipt
 * reference and the compensation's key, outcome and last evidence). From then on the operation is a
 * person's, and every side-effecting intent of its task is refused with `task_frozen` until the
 * takeover is resolved. Times in ms since the epoch.
 */
export const takeoverRecordSchema = z.object({
  operationKey: z.string().regex(OPERATION_KEY_PATTERN),
  tenant: id,
  taskId: z.string(),
  tool: z.string(),
  version: z.number().int(),
  /** `sha256:` digest of the normalised target (never the target itself). */
  targetDigest: digest,
  inputDigest: digest,
  reason: z.enum(['unknown_past_deadline', 'probe_mismatch', 'compensation_failed']),
  /** The last evidence about the attempt (digests, codes, sizes, times only). */
  lastEvidence: evidenceSchema.optional(),
  /**
   * What a probe found under our key when it did not match what was asked (`probe_mismatch`): the
   * downstream's resource id and the input digest it recorded with that effect (compare with
   * `inputDigest` above).
   */
  probed: z.object({ resourceId: z.string().max(200), inputDigest: digest.optional() }).optional(),
  /** `compensation_failed`: the original's committed receipt, which stays valid beside the failure. */
  receipt: receiptReferenceSchema.optional(),
  /**
   * `compensation_failed`: the compensation operation (its own status answers it in full), how it
   * failed — refused after it ran, or its unknown outcome taken over — with its error class and
   * its last evidence (also `lastEvidence` above).
   */
  compensation: z
    .object({
      operationKey: z.string().regex(OPERATION_KEY_PATTERN),
      tool: z.string(),
      version: z.number().int(),
      kind: z.enum(['rejected', 'taken_over']),
      error: errorInfoSchema.optional(),
      evidence: evidenceSchema.optional(),
    })
    .optional(),
  attempts: z.object({
    attempt: z.number().int().min(1),
    requeues: z.number().int().min(0),
    probes: z.number().int().min(0),
  }),
  times: z.object({
    acceptedAt: epochMs,
    runningAt: epochMs.optional(),
    unknownSince: epochMs.optional(),
    openedAt: epochMs,
  }),
});
export type TakeoverRecord = z.infer<typeof takeoverRecordSchema>;

/**
 * What a person decides about a failed compensation (FM-20): `effect_kept` — the original's effect
 * stays in the world and a person accepts it; `undone_by_hand` — a person undid it outside tooltx.
 * Either way the original's status stays `compensation_failed` and its receipt stays valid.
 */
export const compensationResolutionOutcomes = ['effect_kept', 'undone_by_hand'] as const;

/**
 * A person's resolution of an operation under takeover: who, when, which outcome — `committed` or
 * `not_applied` for an unknown one (FM-14), one of {@link compensationResolutionOutcomes} for a
 * failed compensation (FM-20).
 */
export const resolutionSchema = z.object({
  by: id,
  at: epochMs,
  outcome: z.enum(['committed', 'not_applied', ...compensationResolutionOutcomes]),
});

/**
 * Every status of a registered operation (docs/lifecycle.md). `awaiting_confirmation` and
 * `rolled_back` belong to a held-back commit; `compensation_requested`, `compensated` and
 * `compensation_failed` to a committed operation being compensated, whose receipt stays valid in
 * each of them (docs/compensation.md).
 */
export const operationStatuses = [
  'accepted',
  'running',
  'committed',
  'rejected',
  'unknown',
  'awaiting_confirmation',
  'rolled_back',
  'compensation_requested',
  'compensated',
  'compensation_failed',
] as const;
export type OperationStatus = (typeof operationStatuses)[number];

/** Who asked for a confirmation, a discard or a compensation: an actor (SDK) or an operator (CLI). */
export const requesterSchema = z.object({ kind: z.enum(['actor', 'operator']), id });
export type Requester = z.infer<typeof requesterSchema>;

/**
 * On a compensation operation's record: the committed operation it compensates. Such an operation
 * is never compensated in turn (FM-20).
 */
export const compensatesSchema = z.object({
  operationKey: z.string().regex(OPERATION_KEY_PATTERN),
  tool: z.string(),
  version: z.number().int(),
});

/**
 * On the original's record, from the first compensation request on: which compensation, who asked
 * and the digest of why (never the text), and how it ended — `receipt` (its own signed receipt)
 * once it committed, `failure` (its refusal after it ran, or its takeover, with its last evidence)
 * once it failed, `refusal` when it was refused before it ran and the original went back to
 * `committed`. The original's own receipt is never touched. `attempt`: the compensation's attempt
 * this request registered (its first, or the next after one refused before it ran): only that
 * attempt's outcome moves the original. Absent on requests recorded before it was: any attempt's.
 */
export const compensationLinkSchema = z.object({
  operationKey: z.string().regex(OPERATION_KEY_PATTERN),
  tool: z.string(),
  version: z.number().int(),
  attempt: z.number().int().min(1).optional(),
  requestedBy: requesterSchema,
  reasonDigest: digest,
  requestedAt: epochMs,
  receipt: receiptSchema.optional(),
  failure: z
    .object({
      at: epochMs,
      kind: z.enum(['rejected', 'taken_over']),
      error: errorInfoSchema.optional(),
      evidence: evidenceSchema.optional(),
    })
    .optional(),
  refusal: z.object({ at: epochMs, error: errorInfoSchema }).optional(),
});
export type CompensationLink = z.infer<typeof compensationLinkSchema>;

/**
 * On a held-back operation's record (its contract declares `confirm`), from its acceptance on:
 * nothing starts it until `confirmed` is set. `heldAt`/`deadlineAt` once it waits (after its prepare
 * step, whose result's digest is `previewDigest`); `discarded` or `expiredAt` once it was rolled back.
 */
export const confirmationSchema = z.object({
  heldAt: epochMs.optional(),
  deadlineAt: epochMs.optional(),
  previewDigest: digest.optional(),
  confirmed: z.object({ by: requesterSchema, at: epochMs }).optional(),
  discarded: z.object({ by: requesterSchema, at: epochMs }).optional(),
  expiredAt: epochMs.optional(),
});
export type Confirmation = z.infer<typeof confirmationSchema>;

/**
 * The key and input digest a submission derived itself, when it named its target through an alias
 * (another case, encoding or name of the same resource): the operation is registered under the
 * canonical input's key and digest, and this submission's own are kept to check its stored input
 * against (FM-10).
 */
export const submittedSchema = z.object({ operationKey: z.string().regex(OPERATION_KEY_PATTERN), inputDigest: digest });

/** The folded state of a registered operation. */
export const operationRecordSchema = z.object({
  status: z.enum(operationStatuses),
  operationKey: z.string().regex(OPERATION_KEY_PATTERN),
  tenant: id,
  /** The actor who submitted the current attempt. */
  actor: id,
  taskId: z.string(),
  tool: z.string(),
  version: z.number().int(),
  contractDigest: digest,
  effect: z.enum(effectClasses),
  inputDigest: digest,
  targetDigest: digest,
  attempt: z.number().int().min(1),
  /**
   * Where the current attempt's input lives: the intent stream's sequence and the submission id;
   * `submitted` when that submission named the target through an alias (FM-10).
   */
  intent: z.object({
    seq: z.number().int().positive(),
    submissionId: z.string(),
    submitted: submittedSchema.optional(),
    /** The trace context of the span that accepted this attempt, when tracing is on (docs/tracing.md). */
    traceparent: traceparentSchema.optional(),
  }),
  acceptedAt: epochMs,
  running: z.object({ eventId, executor: z.string(), at: epochMs, deadlineAt: epochMs }).optional(),
  receipt: receiptSchema.optional(),
  error: errorInfoSchema.optional(),
  evidence: evidenceSchema.optional(),
  /** The current attempt's decisions: at intake (authorizer) and at the execution instant (executor). */
  authorization: z
    .object({ intake: authDecisionSchema.optional(), execution: authDecisionSchema.optional() })
    .optional(),
  /** How often this attempt was requeued after verification (0 when never). */
  requeues: z.number().int().min(0).optional(),
  /** Set once the operation was handed over to a person (it stays until a new attempt). */
  takeover: takeoverRecordSchema.optional(),
  /** Set when a person resolved it (`manual: true` in the event). */
  resolution: resolutionSchema.optional(),
  /** Set on a held-back operation (its contract declares `confirm`): see {@link confirmationSchema}. */
  confirmation: confirmationSchema.optional(),
  /** Set on a compensation operation: the original it compensates. */
  compensates: compensatesSchema.optional(),
  /** Set on an original once a compensation of it was requested: see {@link compensationLinkSchema}. */
  compensation: compensationLinkSchema.optional(),
  lastEventId: eventId,
  updatedAt: epochMs,
  /**
   * The operation's own event count: 1 after its first event, +1 per event of any type (across
   * attempts), so it only grows. What agents are told of an operation's position (the status
   * answer's `seq`, a receipt's `prevEventCount`) is this, never a stream sequence: those count
   * every tenant's events. Absent from events written before it was counted; read those with
   * {@link eventCountOf}.
   */
  eventCount: z.number().int().min(1).optional(),
});
export type OperationRecord = z.infer<typeof operationRecordSchema>;
export type OperationState = { status: 'none' } | OperationRecord;

/**
 * The operation's event count (see `eventCount`), 0 for `none`. A state written before events were
 * counted has none: it counts as 1 — its true count is unknown, and 1 is the least any registered
 * operation has. Counting goes on from there, so the count still grows with every later event; it
 * is then a lower bound of the true count, not the count itself.
 */
export function eventCountOf(state: OperationState): number {
  if (state.status === 'none') return 0;
  return state.eventCount ?? 1;
}

const base = { schema: z.literal(EVENT_SCHEMA_VERSION), eventId, at: epochMs, state: operationRecordSchema };

export const acceptedEventSchema = z.object({
  ...base,
  type: z.literal('accepted'),
  attempt: z.number().int().min(1),
  actor: id,
  intentSeq: z.number().int().positive(),
  submissionId: z.string(),
  submitted: submittedSchema.optional(),
  authorization: authDecisionSchema.optional(),
  /**
   * Set when the process that accepted the attempt also started it, in this one append (the
   * co-located layout, docs/lifecycle.md "Accepted and started"): the state is then `running`, its
   * run id this event's id. `authorization` is the decision at the execution instant.
   */
  started: z
    .object({ executor: z.string(), deadlineAt: epochMs, authorization: authDecisionSchema.optional() })
    .optional(),
  /** Set when its contract declares `confirm`: the attempt waits for a confirmation before it may start. */
  awaitsConfirmation: z.literal(true).optional(),
  /** Set when the operation is a compensation: the original it compensates. */
  compensates: compensatesSchema.optional(),
  /** The trace context of the span that accepted this attempt, when tracing is on (docs/tracing.md). */
  traceparent: traceparentSchema.optional(),
});
export const runningEventSchema = z.object({
  ...base,
  type: z.literal('running'),
  attempt: z.number().int().min(1),
  executor: z.string(),
  deadlineAt: epochMs,
  authorization: authDecisionSchema.optional(),
});
/** Fields of an outcome a person decided: `manual: true` and the operator's id. */
const manual = { manual: z.literal(true).optional(), resolvedBy: id.optional() };
export const committedEventSchema = z.object({
  ...base,
  type: z.literal('committed'),
  attempt: z.number().int().min(1),
  receipt: receiptSchema,
  ...manual,
});
export const rejectedEventSchema = z.object({
  ...base,
  type: z.literal('rejected'),
  attempt: z.number().int().min(1),
  error: errorInfoSchema,
  authorization: authDecisionSchema.optional(),
  ...manual,
});
/**
 * Back to `accepted` for the same attempt, so an executor runs it again under the SAME key. Only
 * after verifying: the downstream was probed and holds nothing under the key, and either
 * it honours the key or the attempt's absolute deadline has passed (a late request is refused);
 * or `accepted` sat undispatched beyond its bound; or the executor stored `running` too late to send
 * the request and sent nothing (`late_start`, decideSend); or the downstream refused the run's
 * request as past its deadline by its own clock (`refused_late`).
 */
export const requeuedEventSchema = z.object({
  ...base,
  type: z.literal('requeued'),
  attempt: z.number().int().min(1),
  reason: z.enum(['probe_not_found', 'stale_accepted', 'late_start', 'refused_late']),
});
export const unknownEventSchema = z.object({
  ...base,
  type: z.literal('unknown'),
  attempt: z.number().int().min(1),
  evidence: evidenceSchema,
});

/** The operation is handed over to a person; it stays `unknown` (FM-14). */
export const takeoverEventSchema = z.object({
  ...base,
  type: z.literal('takeover'),
  attempt: z.number().int().min(1),
  takeover: takeoverRecordSchema,
});

/** A held-back attempt waits for its confirmation until `deadlineAt` (after its prepare step, if any). */
export const awaitingConfirmationEventSchema = z.object({
  ...base,
  type: z.literal('awaiting_confirmation'),
  attempt: z.number().int().min(1),
  deadlineAt: epochMs,
  /** `sha256:` digest of the prepare step's result (the preview the caller was shown), when it ran. */
  previewDigest: digest.optional(),
});
/**
 * The held-back attempt was confirmed: it is `accepted` again, now free to start, or `running` at
 * once when the process that took the confirmation also starts it (`started`, as an accepted event's).
 */
export const confirmedEventSchema = z.object({
  ...base,
  type: z.literal('confirmed'),
  attempt: z.number().int().min(1),
  by: requesterSchema,
  started: z
    .object({ executor: z.string(), deadlineAt: epochMs, authorization: authDecisionSchema.optional() })
    .optional(),
});
/** The held-back attempt was discarded before it ran: `rolled_back`, nothing external happened. */
export const discardedEventSchema = z.object({
  ...base,
  type: z.literal('discarded'),
  attempt: z.number().int().min(1),
  by: requesterSchema,
});
/** No confirmation came by the deadline: `rolled_back`, nothing external happened. */
export const confirmationExpiredEventSchema = z.object({
  ...base,
  type: z.literal('confirmation_expired'),
  attempt: z.number().int().min(1),
});
/** A compensation of the committed operation was registered (its own operation, under its own key). */
export const compensationRequestedEventSchema = z.object({
  ...base,
  type: z.literal('compensation_requested'),
  attempt: z.number().int().min(1),
  compensation: compensationLinkSchema.pick({
    operationKey: true,
    tool: true,
    version: true,
    attempt: true,
    requestedBy: true,
    reasonDigest: true,
  }),
});
/** The compensation committed: its receipt, linked from the original. */
export const compensatedEventSchema = z.object({
  ...base,
  type: z.literal('compensated'),
  attempt: z.number().int().min(1),
  compensation: z.object({ operationKey: z.string().regex(OPERATION_KEY_PATTERN), receipt: receiptSchema }),
});
/**
 * The compensation failed after it ran (its downstream refused it) or its unknown outcome was
 * handed to a person: the world still holds the original's effect. Final; the task is frozen, and
 * the takeover record a person resolves comes in this same append (FM-20). Events written before
 * the record existed have none.
 */
export const compensationFailedEventSchema = z.object({
  ...base,
  type: z.literal('compensation_failed'),
  attempt: z.number().int().min(1),
  compensation: z.object({
    operationKey: z.string().regex(OPERATION_KEY_PATTERN),
    kind: z.enum(['rejected', 'taken_over']),
    error: errorInfoSchema.optional(),
    evidence: evidenceSchema.optional(),
  }),
  takeover: takeoverRecordSchema.optional(),
});
/**
 * A person resolved the failed compensation (FM-20): the status stays `compensation_failed`, the
 * original's receipt stays valid, the resolution is recorded and the task may thaw.
 */
export const compensationFailureResolvedEventSchema = z.object({
  ...base,
  type: z.literal('compensation_failure_resolved'),
  attempt: z.number().int().min(1),
  outcome: z.enum(compensationResolutionOutcomes),
  manual: z.literal(true),
  resolvedBy: id,
});
/** The compensation was refused before it ran (e.g. its permission was revoked): back to `committed`. */
export const compensationRefusedEventSchema = z.object({
  ...base,
  type: z.literal('compensation_refused'),
  attempt: z.number().int().min(1),
  compensation: z.object({ operationKey: z.string().regex(OPERATION_KEY_PATTERN), error: errorInfoSchema }),
});

/** Every lifecycle event of an operation. */
export const operationEventSchema = z.discriminatedUnion('type', [
  acceptedEventSchema,
  runningEventSchema,
  committedEventSchema,
  rejectedEventSchema,
  unknownEventSchema,
  requeuedEventSchema,
  takeoverEventSchema,
  awaitingConfirmationEventSchema,
  confirmedEventSchema,
  discardedEventSchema,
  confirmationExpiredEventSchema,
  compensationRequestedEventSchema,
  compensatedEventSchema,
  compensationFailedEventSchema,
  compensationRefusedEventSchema,
  compensationFailureResolvedEventSchema,
]);
export type OperationEvent = z.infer<typeof operationEventSchema>;
export type OperationEventType = OperationEvent['type'];

/**
 * A pre-acceptance outcome, written to the operation's decision subject (never its own subject):
 * a refusal at intake or an idempotency conflict. The key is not registered by it.
 */
const decisionBase = {
  schema: z.literal(EVENT_SCHEMA_VERSION),
  type: z.literal('decision'),
  eventId,
  at: epochMs,
  operationKey: z.string().regex(OPERATION_KEY_PATTERN),
  tenant: id,
  actor: id,
  submissionId: z.string(),
  tool: z.string().optional(),
  version: z.number().int().optional(),
};
export const rejectionRecordSchema = z.object({
  ...decisionBase,
  outcome: z.literal('rejected'),
  error: errorInfoSchema,
  /** Set when the policy seam decided (a denial with its policy version). */
  authorization: authDecisionSchema.optional(),
  /**
   * Set when the intent gave no key and none could be derived (bytes that are not msgpack, an
   * envelope that does not parse): `operationKey` is then derived from the tenant and the
   * submission id (docs/tenancy.md), so that the refusal has an audit record.
   */
  keyless: z.literal(true).optional(),
});
/**
 * The submission named its target through an alias: `operationKey` is the key it derived, and the
 * operation lives under `canonicalKey` (the key of the canonical input, whose digest is
 * `canonicalInputDigest`). Status follows it; nothing is registered under `operationKey` (FM-10).
 * `inputDigest` is the submission's own, so a status caller can be told whether it is its input.
 */
export const aliasRecordSchema = z.object({
  ...decisionBase,
  outcome: z.literal('aliased'),
  canonicalKey: z.string().regex(OPERATION_KEY_PATTERN),
  inputDigest: digest,
  canonicalInputDigest: digest,
});
/**
 * A request for a compensation registered already (by another request, or an earlier one of the
 * same requester), whose requester the compensating contract's policy allowed: it was answered with
 * that compensation (the replay, FM-21). Recorded on the requester's decision subject of the
 * compensation, so that every requester is on record with the digest of its reason, and knows
 * that its own request was judged.
 */
export const replayRecordSchema = z.object({
  ...decisionBase,
  outcome: z.literal('replayed'),
  requestedBy: requesterSchema,
  reasonDigest: digest,
});
export const decisionRecordSchema = z.discriminatedUnion('outcome', [
  rejectionRecordSchema,
  aliasRecordSchema,
  replayRecordSchema,
]);
export type DecisionRecord = z.infer<typeof decisionRecordSchema>;
export type ReplayRecord = z.infer<typeof replayRecordSchema>;
export type RejectionRecord = z.infer<typeof rejectionRecordSchema>;
export type AliasRecord = z.infer<typeof aliasRecordSchema>;
