import { z } from 'zod';
import { MAX_REASON_CHARS, parseStrict, type CommittedOriginal, type Contract } from './contract.js';
import { digestOf } from './digest.js';
import { ErrorClass, TooltxError } from './errors.js';
import { operationKeySchema } from './ids.js';
import { deriveCompensationKey } from './keys.js';

/**
 * The requests a caller makes about an operation it already submitted (docs/compensation.md):
 * compensate it, confirm it, or discard it. Strict: an unknown field is an `invalid_input` at its
 * path, like any input (FM-06).
 */
export const compensationRequestSchema = z.strictObject({
  operationKey: operationKeySchema,
  /** Why, in the caller's words: kept for audit as a digest only, never part of the compensation's key. */
  // Bounded as sent, before the trim: what is stored with the request stays bounded too.
  reason: z.string().max(MAX_REASON_CHARS).trim().min(1),
});
export type CompensationRequest = z.infer<typeof compensationRequestSchema>;

/** `tools.confirm` / `tools.discard` of a held-back operation. */
export const confirmationRequestSchema = z.strictObject({ operationKey: operationKeySchema });
export type ConfirmationRequest = z.infer<typeof confirmationRequestSchema>;

/** A compensation request, strictly parsed: throws `TooltxError(invalid_input)` naming each field path. */
export function parseCompensationRequest(value: unknown): CompensationRequest {
  return parseStrict(compensationRequestSchema, value);
}

/** A confirm or discard request, strictly parsed: throws `TooltxError(invalid_input)` naming each field path. */
export function parseConfirmationRequest(value: unknown): ConfirmationRequest {
  return parseStrict(confirmationRequestSchema, value);
}

/** What audit and events keep of a reason: its digest, never its text. */
export function reasonDigestOf(reason: string): string {
  return digestOf({ reason });
}

/** The compensating contract named by a declaration's `tool` (`name@version`). */
export function compensatingContractOf(contract: Contract): { tool: string; version: number } | null {
  const tool = contract.compensation?.tool;
  if (!tool) return null;
  const at = tool.lastIndexOf('@');
  return { tool: tool.slice(0, at), version: Number(tool.slice(at + 1)) };
}

/**
 * The compensation of an operation of `contract` under `originalKey`: the compensating contract and
 * the compensation's operation key ({@link deriveCompensationKey}), or null when the contract
 * declares none.
 */
export function compensationOf(
  contract: Contract,
  originalKey: string,
): { tool: string; version: number; operationKey: string } | null {
  const c = compensatingContractOf(contract);
  return c && { ...c, operationKey: deriveCompensationKey(originalKey, c) };
}

/**
 * The compensating input the declaration builds from the original and the reason. Throws
 * `TooltxError(compensation_not_allowed)` when the contract declares no compensation. The result is
 * the compensating contract's raw input: parse and key it with that contract (`prepareCall`) as any
 * input.
 */
export function compensatingInput(
  contract: Contract,
  original: CommittedOriginal,
  reason: string,
): Record<string, unknown> {
  const build = contract.compensation?.input as
    | ((o: CommittedOriginal, r: string) => Record<string, unknown>)
    | undefined;
  if (!build) throw new TooltxError(ErrorClass.CompensationNotAllowed, `${contract.id} declares no compensation`);
  return build(original, reason);
}
