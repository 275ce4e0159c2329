import type { KV } from '@nats-io/kv';
import { z } from 'zod';
import { EMPTY_RESULT_DIGEST } from '@tooltx/contracts';
import { decode } from './codec.js';
import type { Subjects } from './subjects.js';

/** One entry of the result store (`<p>_results`, key `<tenant>.<opId>`): the business result of a committed attempt. */
export const resultEntrySchema = z.object({
  operationKey: z.string(),
  attempt: z.number().int(),
  resultDigest: z.string(),
  result: z.unknown(),
});

/**
 * The business result of a committed operation as the caller may read it: `{}` for a receipt-only
 * result (its digest says what it is; nothing is stored, FM-19), else the stored entry's result
 * when it belongs to this `attempt` and matches the receipt's `resultDigest`. Null when none is
 * readable (not stored yet, deleted, another attempt's). One KV get at most; throws when the store
 * does not answer or the entry does not decode (`CodecError`).
 */
export async function committedResult(
  results: KV,
  subjects: Subjects,
  tenant: string,
  opId: string,
  receipt: { attempt: number; resultDigest: string },
): Promise<{ result: unknown } | null> {
  if (receipt.resultDigest === EMPTY_RESULT_DIGEST) return { result: {} };
  const entry = await results.get(subjects.resultKey(tenant, opId));
  if (entry?.operation !== 'PUT') return null;
  const r = decode(resultEntrySchema, entry.value);
  return r.attempt === receipt.attempt && r.resultDigest === receipt.resultDigest ? { result: r.result } : null;
}
