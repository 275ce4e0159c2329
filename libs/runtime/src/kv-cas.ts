import type { KV } from '@nats-io/kv';
import type { z } from 'zod';
import { decode, encode } from '@tooltx/nats';

/** Most compare-and-set rounds on one key before giving up (several instances writing at once). */
export const CAS_ROUNDS = 20;

/**
 * Every compare-and-set round on `key` was taken by another writer ({@link CAS_ROUNDS}); `cause`
 * is the last write's error. Any other failure (a read, `decide`) is thrown as it is.
 */
export class CasContendedError extends Error {
  readonly key: string;
  constructor(key: string, cause: unknown) {
    super(`${key}: every compare-and-set round was taken by another writer`, { cause });
    this.name = 'CasContendedError';
    this.key = key;
  }
}

/**
 * Reads `key`, decides, writes with compare-and-set on the revision read (create when absent), and
 * reads again after a short random pause (5–25 ms) when another writer got there first. `decide`
 * returns the value to write, or null: nothing to write. Returns what was written (or null).
 * Throws {@link CasContendedError} after {@link CAS_ROUNDS} lost rounds, and whatever the read or
 * `decide` throws.
 */
export async function casUpdate<T>(
  kv: KV,
  key: string,
  schema: z.ZodType<T>,
  decide: (cur: T | null) => T | null,
): Promise<T | null> {
  let last: unknown;
  for (let round = 0; round < CAS_ROUNDS; round++) {
    const e = await kv.get(key);
    const live = e && e.operation === 'PUT' && e.length > 0;
    const next = decide(live ? decode(schema, e.value) : null);
    if (next === null) return null;
    try {
      // A deleted key keeps a revision: the update is still conditional on it.
      if (e) await kv.update(key, encode(next), e.revision);
      else await kv.create(key, encode(next));
      return next;
    } catch (err) {
      last = err;
      await new Promise((r) => setTimeout(r, 5 + Math.random() * 20));
    }
  }
  throw new CasContendedError(key, last);
}
