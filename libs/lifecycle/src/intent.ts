import { z } from 'zod';
import { compensationRequestSchema, confirmationRequestSchema, ID_PATTERN } from '@tooltx/contracts';

/**
 * The intent envelope an agent publishes to `<prefix>.intent.<tenant>.<actor>`:
 * `{ tool, version, taskId, operationKey?, actorId?, interfaceDigest?, input }`. Strict: an unknown envelope field
 * is `invalid_input`. Identity is never read from here — `actorId`, when present, must equal the
 * actor the subject names (FM-06).
 */
export const intentEnvelopeSchema = z.strictObject({
  tool: z.string().min(1).max(100),
  version: z.number().int().min(1),
  /** The agent task this call belongs to; part of the operation key. 1–256 chars. */
  taskId: z
    .string()
    .min(1)
    .max(256)
    .refine(
      (s) => (s as string & { isWellFormed(): boolean }).isWellFormed(),
      'contains a lone surrogate (ill-formed Unicode)',
    ),
  /** The key the client derived; the server derives it again and refuses a mismatch (FM-03). */
  operationKey: z.string().max(100).optional(),
  actorId: z.string().regex(ID_PATTERN).optional(),
  /**
   * The `interfaceDigest` (`sha256:` + 64 hex) of the contract the caller holds for
   * `tool@version`: a write whose digest differs from the server's contract is refused
   * `contract_mismatch` (FM-25). The SDK always sends it; a raw
   * intent may leave it out.
   */
  interfaceDigest: z
    .string()
    .regex(/^sha256:[0-9a-f]{64}$/, 'expected sha256: and 64 lowercase hex digits')
    .optional(),
  input: z.unknown(),
});
export type IntentEnvelope = z.infer<typeof intentEnvelopeSchema>;

/**
 * The envelope of a compensation request, published on the same intent subject:
 * `{ tool, version, operationKey?, actorId?, interfaceDigest?, compensates: { operationKey, reason } }`.
 * `tool@version` is the compensating contract the original's declares; the input is built by the
 * server from the original's input and receipt (docs/compensation.md). Strict.
 */
export const compensationEnvelopeSchema = z.strictObject({
  tool: z.string().min(1).max(100),
  version: z.number().int().min(1),
  operationKey: z.string().max(100).optional(),
  actorId: z.string().regex(ID_PATTERN).optional(),
  interfaceDigest: z
    .string()
    .regex(/^sha256:[0-9a-f]{64}$/, 'expected sha256: and 64 lowercase hex digits')
    .optional(),
  compensates: compensationRequestSchema,
});
export type CompensationEnvelope = z.infer<typeof compensationEnvelopeSchema>;

/**
 * The envelope of a confirmation or a discard of a held-back operation, published on the same
 * intent subject: `{ confirms: { operationKey } }` or `{ discards: { operationKey } }`, with the
 * caller's `actorId` optionally (checked against the subject like any intent's). Strict: one of the
 * two, nothing else. Its refusals are recorded under the key `keylessRefusalKey` derives from the
 * submission (the operation itself answers its own state), which is where the SDK reads them.
 */
export const confirmEnvelopeSchema = z.strictObject({
  actorId: z.string().regex(ID_PATTERN).optional(),
  confirms: confirmationRequestSchema,
});
export const discardEnvelopeSchema = z.strictObject({
  actorId: z.string().regex(ID_PATTERN).optional(),
  discards: confirmationRequestSchema,
});
export type ConfirmationEnvelope = z.infer<typeof confirmEnvelopeSchema> | z.infer<typeof discardEnvelopeSchema>;
