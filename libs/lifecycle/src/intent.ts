import { z } from 'zod';
import { ID_PATTERN } from '@tooltx/contracts';

/**
 * The intent envelope an agent publishes to `<prefix>.intent.<tenant>.<actor>`:
 * `{ tool, version, taskId, operationKey?, actorId?, input }`. Strict: an unknown envelope field
 * is `invalid_input`. Identity is never read from here — `actorId`, when present, must equal the
 * actor the subject names (DESIGN.md "Who the caller is, in the intent").
 */
export const intentEnvelopeSchema = z.strictObject({
  tool: z.string().min(1).max(100),
  version: z.number().int().min(1),
  /** The agent task this call belongs to; part of the operation key. 1–256 chars. */
  taskId: z.string().min(1).max(256).refine((s) => (s as string & { isWellFormed(): boolean }).isWellFormed(), 'contains a lone surrogate (ill-formed Unicode)'),
  /** The key the client derived; the server derives it again and refuses a mismatch (FM-03). */
  operationKey: z.string().max(100).optional(),
  actorId: z.string().regex(ID_PATTERN).optional(),
  input: z.unknown(),
});
export type IntentEnvelope = z.infer<typeof intentEnvelopeSchema>;
