import { Packr } from 'msgpackr';
import type { z } from 'zod';
import { checkMsgpack, MsgpackShapeError } from './msgpack-guard.js';

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
  const raw = unpackChecked(bytes);
  const r = schema.safeParse(raw);
  if (!r.success) throw new CodecError(`does not match schema: ${r.error.issues.length} issue(s)`, { cause: r.error });
  return r.data;
}

/**
 * {@link decode} of a delivered message's body, the msgpack read shared by every caller that
 * decodes the same message object: in a process that reads the event log once for several roles
 * (one delivery handed to each role's handler), the bytes are checked and read once, and each
 * schema parses that one read (zod builds a new object per parse, so no caller sees another's).
 * Throws {@link CodecError} as `decode` does, to each caller.
 */
export function decodeMsg<S extends z.ZodType>(schema: S, msg: { readonly data: Uint8Array }): z.infer<S> {
  let raw = rawOfMsg.get(msg);
  if (raw === undefined) {
    try {
      raw = { value: unpackChecked(msg.data) };
    } catch (err) {
      raw = { error: err };
    }
    rawOfMsg.set(msg, raw);
  }
  if ('error' in raw) throw raw.error;
  const r = schema.safeParse(raw.value);
  if (!r.success) throw new CodecError(`does not match schema: ${r.error.issues.length} issue(s)`, { cause: r.error });
  return r.data;
}
const rawOfMsg = new WeakMap<object, { value: unknown } | { error: unknown }>();

/**
 * Decodes msgpack without a schema (for envelopes whose parse errors must name field paths).
 * `maxItems`: at most this many values in all maps and lists, refused before any is read
 * ({@link checkMsgpack}); what an agent sends is bounded so (docs/tenancy.md).
 */
export function decodeRaw(bytes: Uint8Array, opts: { maxItems?: number; captureKey?: string } = {}): unknown {
  return unpackChecked(bytes, opts.maxItems, opts.captureKey);
}

/**
 * msgpackr's read of bytes that passed {@link checkMsgpack} (plain types only, bounded depth, no
 * byte missing or left over: msgpack-guard.ts says why). Throws {@link CodecError} whose message
 * and cause never quote the bytes (msgpackr's own errors can: they are not kept).
 */
function unpackChecked(bytes: Uint8Array, maxItems?: number, captureKey?: string): unknown {
  try {
    checkMsgpack(bytes, undefined, maxItems, captureKey);
  } catch (err) {
    if (err instanceof MsgpackShapeError)
      throw new CodecError(err.tooMany ? err.message : `not msgpack: ${err.message}`, { cause: err });
    throw err;
  }
  try {
    return packr.unpack(bytes);
  } catch {
    throw new CodecError('not msgpack: unreadable');
  }
}

function dropUndefined(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(dropUndefined);
  if (v && typeof v === 'object') {
    const proto = Object.getPrototypeOf(v) as unknown;
    if (proto === Object.prototype || proto === null) {
      // Written as a Map, whose entries msgpackr writes as they are (a msgpack map either way).
      // A plain object it writes only after reading `constructor`, `toJSON` and `hasOwnProperty` on
      // the object itself: data with those field names (JSON.parse of a downstream's answer) made
      // it throw, and an own `__proto__` field, copied by assignment, replaced the copy's prototype.
      const out = new Map<string, unknown>();
      for (const [k, x] of Object.entries(v)) if (x !== undefined) out.set(k, dropUndefined(x));
      return out;
    }
  }
  return v;
}
