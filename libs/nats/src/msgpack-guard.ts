/**
 * A structural check of msgpack bytes before msgpackr reads them (the msgpack spec:
 * https://github.com/msgpack/msgpack/blob/master/spec.md). msgpackr's reader is built for trusted
 * bytes: it recurses once per nesting level (a stack overflow at a few thousand), decodes its own
 * extension types whatever the Unpackr's options say — `Error` objects (0x65), `Set`s (0x73),
 * `RegExp`s (0x78), typed arrays (0x74), record definitions (0x72), string bundles (0x62) and
 * object references that build CYCLIC objects (0x69/0x70) — reads the unused byte 0xc1 as an
 * object, turns any map key into a string with `toString()`, and puts the first 100 characters of
 * the data into the message of the error it throws on trailing bytes. Every message a service reads
 * from an agent (intents, status and audit requests) passes here first, so only plain maps, arrays,
 * strings, numbers, booleans, nil, binary and the spec's own timestamp reach the reader, at most
 * {@link MAX_MSGPACK_DEPTH} levels deep, and a refusal names no byte of the content.
 *
 * Not checked: that strings are valid UTF-8 (msgpackr replaces what is not; a field's own schema
 * decides whether such a string is acceptable), and uint64/int64 beyond 2^53 (read as the nearest
 * double; zod's `.int()` refuses an unsafe integer).
 */

/** Nesting levels a message may have (an envelope's input is at level 2): far beyond any contract's. */
export const MAX_MSGPACK_DEPTH = 64;

/** Why bytes are not a message tooltx reads; the message never quotes the bytes. */
export class MsgpackShapeError extends Error {
  /**
   * For a message refused only for holding more values than allowed (otherwise well formed): the
   * string value of the top-level map's `captureKey` field, when it has one (e.g. the operation key
   * the refusal is recorded under).
   */
  readonly captured: string | undefined;
  /** Well formed, refused only for holding more values than allowed. */
  readonly tooMany: boolean;
  constructor(message: string, opts: { tooMany?: boolean; captured?: string } = {}) {
    super(message);
    this.name = 'MsgpackShapeError';
    this.tooMany = opts.tooMany ?? false;
    this.captured = opts.captured;
  }
}

/** The extension types read: the spec's timestamp (-1, 4/8/12 bytes) and msgpackr's `undefined` (0, 1 byte). */
function extAllowed(type: number, length: number): boolean {
  if (type === 0xff) return length === 4 || length === 8 || length === 12;
  return type === 0x00 && length === 1;
}

/**
 * Throws {@link MsgpackShapeError} unless `b` is exactly one msgpack value made of the accepted
 * types, with string map keys, at most `maxDepth` levels deep, with at most `maxItems` values in
 * all its maps and arrays (a map entry counts 2: key and value; checked from the container headers,
 * before any of their items is read), with no byte missing or left over. Iterative (no recursion),
 * one pass, no allocation per value.
 */
export function checkMsgpack(
  b: Uint8Array,
  maxDepth = MAX_MSGPACK_DEPTH,
  maxItems = Infinity,
  captureKey?: string,
): void {
  let items = 0;
  // Past maxItems the walk goes on (one cheap pass, nothing decoded) so that a message refused for
  // its size alone can still name the key it was sent under.
  let over = false;
  const want = captureKey === undefined ? null : new TextEncoder().encode(captureKey);
  let wantedNext = false;
  let captured: string | undefined;
  const dv = new DataView(b.buffer, b.byteOffset, b.byteLength);
  const len = b.byteLength;
  /** Items still to read at each open level (a map of n pairs has 2n), and whether it is a map. */
  const remaining: number[] = [];
  const isMap: boolean[] = [];
  let pos = 0;
  const need = (n: number) => {
    if (pos + n > len) throw new MsgpackShapeError(`truncated: ${len} bytes, a value at byte ${pos} needs more`);
  };
  const uint = (size: 1 | 2 | 4): number => {
    need(1 + size);
    const v = size === 1 ? b[pos + 1]! : size === 2 ? dv.getUint16(pos + 1) : dv.getUint32(pos + 1);
    return v;
  };
  for (;;) {
    need(1);
    const top = remaining.length - 1;
    const expectKey = top >= 0 && isMap[top]! && remaining[top]! % 2 === 0;
    const at = pos;
    const t = b[pos]!;
    let isString = false;
    /** Set for a map or an array: its item count and kind. */
    let container: { items: number; map: boolean } | null = null;
    if (t <= 0x7f || t >= 0xe0 || t === 0xc0 || t === 0xc2 || t === 0xc3) pos += 1;
    else if (t >= 0xa0 && t <= 0xbf) {
      isString = true;
      need(1 + (t & 0x1f));
      pos += 1 + (t & 0x1f);
    } else if (t >= 0x80 && t <= 0x8f) {
      container = { items: 2 * (t & 0x0f), map: true };
      pos += 1;
    } else if (t >= 0x90 && t <= 0x9f) {
      container = { items: t & 0x0f, map: false };
      pos += 1;
    } else {
      switch (t) {
        case 0xc1:
          throw new MsgpackShapeError(`byte 0xc1 (never used by msgpack) at byte ${pos}`);
        case 0xd9:
        case 0xda:
        case 0xdb:
        case 0xc4:
        case 0xc5:
        case 0xc6: {
          const size = t === 0xd9 || t === 0xc4 ? 1 : t === 0xda || t === 0xc5 ? 2 : 4;
          const n = uint(size);
          need(1 + size + n);
          pos += 1 + size + n;
          isString = t >= 0xd9;
          break;
        }
        case 0xca:
          need(5);
          pos += 5;
          break;
        case 0xcb:
          need(9);
          pos += 9;
          break;
        case 0xcc:
        case 0xd0:
          need(2);
          pos += 2;
          break;
        case 0xcd:
        case 0xd1:
          need(3);
          pos += 3;
          break;
        case 0xce:
        case 0xd2:
          need(5);
          pos += 5;
          break;
        case 0xcf:
        case 0xd3:
          need(9);
          pos += 9;
          break;
        case 0xd4:
        case 0xd5:
        case 0xd6:
        case 0xd7:
        case 0xd8:
        case 0xc7:
        case 0xc8:
        case 0xc9: {
          const fixed = { 212: 1, 213: 2, 214: 4, 215: 8, 216: 16 }[t as 0xd4];
          const size = fixed !== undefined ? 0 : t === 0xc7 ? 1 : t === 0xc8 ? 2 : 4;
          const n = fixed ?? uint(size as 1 | 2 | 4);
          need(2 + size + n);
          const type = b[pos + 1 + size]!;
          if (!extAllowed(type, n))
            throw new MsgpackShapeError(`extension type ${type} (${n} bytes) at byte ${pos} is not accepted`);
          pos += 2 + size + n;
          break;
        }
        case 0xdc:
          container = { items: uint(2), map: false };
          pos += 3;
          break;
        case 0xdd:
          container = { items: uint(4), map: false };
          pos += 5;
          break;
        case 0xde:
          container = { items: 2 * uint(2), map: true };
          pos += 3;
          break;
        case 0xdf:
          container = { items: 2 * uint(4), map: true };
          pos += 5;
          break;
        default:
          throw new MsgpackShapeError(`byte 0x${t.toString(16)} at byte ${pos} is not a msgpack type`);
      }
    }
    if (expectKey && !isString) throw new MsgpackShapeError(`a map key at byte ${at} is not a string`);
    if (want && top === 0 && isMap[0]) {
      if (expectKey) wantedNext = isString && sameBytes(b, at, pos, want);
      else {
        if (wantedNext && isString && captured === undefined)
          captured = new TextDecoder().decode(b.subarray(pos - stringLength(b, at), pos));
        wantedNext = false;
      }
    }
    if (top >= 0) remaining[top]!--;
    if (container && container.items > 0) {
      items += container.items;
      if (items > maxItems) over = true;
      // Every item takes at least one byte: a count beyond the bytes left is a truncation.
      if (container.items > len - pos)
        throw new MsgpackShapeError(
          `truncated: a ${container.map ? 'map' : 'list'} of ${container.map ? container.items / 2 : container.items} at byte ${at} cannot fit in ${len} bytes`,
        );
      if (remaining.length >= maxDepth) throw new MsgpackShapeError(`nested deeper than ${maxDepth} levels`);
      remaining.push(container.items);
      isMap.push(container.map);
    } else if (container && remaining.length >= maxDepth) {
      throw new MsgpackShapeError(`nested deeper than ${maxDepth} levels`);
    }
    while (remaining.length > 0 && remaining[remaining.length - 1] === 0) {
      remaining.pop();
      isMap.pop();
    }
    if (remaining.length === 0) break;
  }
  if (pos !== len) throw new MsgpackShapeError(`${len - pos} byte(s) after the value`);
  if (over)
    throw new MsgpackShapeError(`more than ${maxItems} values in its maps and lists`, { tooMany: true, captured });
}

/** The byte length of the string whose header starts at `at`. */
function stringLength(b: Uint8Array, at: number): number {
  const t = b[at]!;
  if (t >= 0xa0 && t <= 0xbf) return t & 0x1f;
  if (t === 0xd9) return b[at + 1]!;
  if (t === 0xda) return (b[at + 1]! << 8) | b[at + 2]!;
  return ((b[at + 1]! << 24) >>> 0) + ((b[at + 2]! << 16) | (b[at + 3]! << 8) | b[at + 4]!);
}

/** Whether the string value between `at` (its header) and `end` is exactly `want`. */
function sameBytes(b: Uint8Array, at: number, end: number, want: Uint8Array): boolean {
  const n = stringLength(b, at);
  if (n !== want.length) return false;
  for (let i = 0; i < n; i++) if (b[end - n + i] !== want[i]) return false;
  return true;
}
