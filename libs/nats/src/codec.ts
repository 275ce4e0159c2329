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
 * {@link decode} of a delivered message's body, the read shared by every caller that decodes the
 * same message object: in a process that reads the event log once for several roles (one delivery
 * handed to each role's handler), the bytes are checked and read once, and each schema parses that
 * one read (zod builds a new object per parse, so no caller sees another's).
 *
 * A message this process appended itself ({@link rememberOwnAppend}: same subject, stream sequence
 * and bytes) is not read again: a caller asking for the schema it was validated with at the append
 * gets that validated value, deeply frozen and shared by every such caller of that delivery; any
 * other schema parses that value, unless the caller names that schema as `impliedBy` (every value
 * it accepts is one `schema` accepts, with more fields: a lenient reader that picks its fields).
 * The bytes are compared in full, so a message that is not exactly what this process validated is
 * read like any other.
 * Throws {@link CodecError} as `decode` does, to each caller.
 */
export function decodeMsg<S extends z.ZodType>(
  schema: S,
  msg: { readonly data: Uint8Array; readonly seq?: number; readonly subject?: string },
  o: { impliedBy?: z.ZodType } = {},
): z.infer<S> {
  let raw = rawOfMsg.get(msg);
  if (raw === undefined) {
    const own = takeOwnAppend(msg);
    if (own) raw = own;
    else
      try {
        raw = { value: unpackChecked(msg.data) };
      } catch (err) {
        raw = { error: err };
      }
    rawOfMsg.set(msg, raw);
  }
  if ('error' in raw) throw raw.error;
  if ('schema' in raw && (raw.schema === schema || raw.schema === o.impliedBy)) return raw.value as z.infer<S>;
  const r = schema.safeParse(raw.value);
  if (!r.success) throw new CodecError(`does not match schema: ${r.error.issues.length} issue(s)`, { cause: r.error });
  return r.data;
}
const rawOfMsg = new WeakMap<object, { value: unknown; schema?: z.ZodType } | { error: unknown }>();

/**
 * The events this process appended and has not seen delivered yet, by `<seq> <subject>`: what
 * {@link decodeMsg} hands out instead of decoding and validating them again (about a tenth of a
 * co-located process's CPU on the peers workload, docs/performance.md). An entry leaves at its
 * first delivery, or once {@link OWN_APPENDS_KEPT} newer appends came after it (a delivery that
 * late is read as any other).
 */
const ownAppends = new Map<string, { bytes: Uint8Array; schema: z.ZodType; value: unknown }>();
/** About 1.7 s of appends at 600 events a second. */
const OWN_APPENDS_KEPT = 1_024;
/** Off until this process reads the event log ({@link keepOwnAppendsForDelivery}). */
let keepOwnAppends = false;

/**
 * Turns {@link rememberOwnAppend} on in a process that reads back the events it appends (one reader
 * of the event log for several roles: `tooltx serve`). Elsewhere nothing would take the entries, and
 * the newest 1,024 events would stay in memory for nothing (an authorizer on its own appends and
 * never reads the log).
 */
export function keepOwnAppendsForDelivery(): void {
  keepOwnAppends = true;
}

/**
 * Records that this process appended `bytes` (the {@link encode} of `value`, which is the output of
 * `schema`'s parse and referenced by nothing else) on `subject` at stream sequence `seq`. `value`
 * is frozen here: readers of the delivery share it.
 */
export function rememberOwnAppend(
  schema: z.ZodType,
  value: unknown,
  bytes: Uint8Array,
  subject: string,
  seq: number,
): void {
  if (!keepOwnAppends) return;
  ownAppends.set(`${seq} ${subject}`, { bytes, schema, value: deepFreeze(value) });
  if (ownAppends.size > OWN_APPENDS_KEPT) ownAppends.delete(ownAppends.keys().next().value as string);
}

function takeOwnAppend(msg: {
  readonly data: Uint8Array;
  readonly seq?: number;
  readonly subject?: string;
}): { value: unknown; schema: z.ZodType } | undefined {
  if (ownAppends.size === 0 || msg.seq === undefined || msg.subject === undefined) return undefined;
  const k = `${msg.seq} ${msg.subject}`;
  const own = ownAppends.get(k);
  if (!own) return undefined;
  ownAppends.delete(k);
  const b = own.bytes;
  if (!Buffer.from(b.buffer, b.byteOffset, b.byteLength).equals(msg.data)) return undefined;
  return { value: own.value, schema: own.schema };
}

function deepFreeze<T>(v: T): T {
  if (v && typeof v === 'object' && !Object.isFrozen(v)) {
    Object.freeze(v);
    for (const x of Object.values(v)) deepFreeze(x);
  }
  return v;
}

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
