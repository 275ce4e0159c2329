import { Packr } from 'msgpackr';
import type { z } from 'zod';

// Plain maps and arrays only: no records/structures extension, so any msgpack reader can decode.
const packr = new Packr({ useRecords: false, moreTypes: false, int64AsType: 'number' });

/** Thrown when bytes on a stream are not a valid message of the expected schema. */
export class CodecError extends Error {
  constructor(message: string, opts?: ErrorOptions) {
    super(message, opts);
    this.name = 'CodecError';
  }
}

/** msgpack bytes of `value` (undefined fields are dropped). */
export function encode(value: unknown): Uint8Array {
  return packr.pack(dropUndefined(value));
}

/** Decodes msgpack bytes and parses them with `schema`; throws {@link CodecError} on either failure. */
export function decode<S extends z.ZodType>(schema: S, bytes: Uint8Array): z.infer<S> {
  let raw: unknown;
  try {
    raw = packr.unpack(bytes);
  } catch (err) {
    throw new CodecError('not msgpack', { cause: err });
  }
  const r = schema.safeParse(raw);
  if (!r.success) throw new CodecError(`does not match schema: ${r.error.issues.length} issue(s)`, { cause: r.error });
  return r.data;
}

/** Decodes msgpack without a schema (for envelopes whose parse errors must name field paths). */
export function decodeRaw(bytes: Uint8Array): unknown {
  try {
    return packr.unpack(bytes);
  } catch (err) {
    throw new CodecError('not msgpack', { cause: err });
  }
}

function dropUndefined(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(dropUndefined);
  if (v && typeof v === 'object' && Object.getPrototypeOf(v) === Object.prototype) {
    const out: Record<string, unknown> = {};
    for (const [k, x] of Object.entries(v)) if (x !== undefined) out[k] = dropUndefined(x);
    return out;
  }
  return v;
}
