import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { CodecError, decode, decodeRaw, encode, MAX_MSGPACK_DEPTH } from '@tooltx/nats';

const SEED = 20_261_130;
const bytes = (...b: number[]) => new Uint8Array(b);
const str = (s: string) => [0xa0 + Buffer.byteLength(s), ...Buffer.from(s)];
const nested = (depth: number) => bytes(...Array<number>(depth).fill(0x91), 0xc0);

/** The CodecError `fn` throws (never another error), with its message. */
function codecError(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(CodecError);
    return (err as Error).message;
  }
  throw new Error('expected a CodecError, the bytes were read');
}

/** True when `v` holds only what JSON could say, plus binary and dates: no Error, Set, RegExp, cycle, typed array. */
function plain(v: unknown, seen = new Set<unknown>()): boolean {
  if (v === null || v === undefined || ['string', 'number', 'boolean'].includes(typeof v)) return true;
  if (v instanceof Date || (v instanceof Uint8Array && v.constructor === Uint8Array) || Buffer.isBuffer(v)) return true;
  if (seen.has(v)) return false;
  seen.add(v);
  if (Array.isArray(v)) return v.every((x) => plain(x, seen));
  if (typeof v === 'object' && Object.getPrototypeOf(v) === Object.prototype)
    return Object.values(v).every((x) => plain(x, seen));
  return false;
}

describe('msgpack read guard', () => {
  it('reads every JSON-like value this codec writes, up to the depth limit, unchanged', () => {
    fc.assert(
      fc.property(fc.jsonValue({ maxDepth: 8 }), (v) => {
        expect(decodeRaw(encode(v))).toEqual(JSON.parse(JSON.stringify(v)));
      }),
      { seed: SEED, numRuns: 300 },
    );
    expect(decodeRaw(nested(MAX_MSGPACK_DEPTH))).toBeDefined();
  });

  it('any bytes at all: a plain value or a CodecError, never another exception or a non-plain object', () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 64 }), (b) => {
        let v: unknown;
        try {
          v = decodeRaw(b);
        } catch (err) {
          expect(err).toBeInstanceOf(CodecError);
          return;
        }
        expect(plain(v)).toBe(true);
      }),
      { seed: SEED, numRuns: 2_000 },
    );
  });

  it('refuses deep nesting before reading it (10,000 levels: no stack overflow)', () => {
    expect(codecError(() => decodeRaw(nested(10_000)))).toBe(
      `not msgpack: nested deeper than ${MAX_MSGPACK_DEPTH} levels`,
    );
    expect(codecError(() => decodeRaw(nested(MAX_MSGPACK_DEPTH + 1)))).toContain('nested deeper');
    const deepMap = bytes(...Array.from({ length: 10_000 }, () => [0x81, ...str('a')]).flat(), 0xc0);
    expect(codecError(() => decodeRaw(deepMap))).toContain('nested deeper');
  });

  it("refuses msgpackr's own extension types (Error, Set, RegExp, typed array, references that make a cycle, records, bundles) and 0xc1", () => {
    const cycle = bytes(0xd6, 0x69, 0, 0, 0, 1, 0x81, ...str('a'), 0xd6, 0x70, 0, 0, 0, 1);
    const cases = [
      bytes(0xc7, 0x00, 0x65, 0x92, ...str('TypeError'), ...str('boom')),
      bytes(0xc7, 0x00, 0x73, 0x92, 1, 2),
      bytes(0xc7, 0x00, 0x78, 0x92, ...str('(a+)+$'), ...str('g')),
      bytes(0xc7, 0x03, 0x74, 0x05, 1, 2, 3),
      cycle,
      bytes(0xd4, 0x72, 0x00),
      bytes(0xd6, 0x62, 0, 0, 0, 9),
      bytes(0xd4, 0x42, 0x00),
    ];
    for (const c of cases) expect(codecError(() => decodeRaw(c))).toMatch(/^not msgpack: extension type \d+/);
    expect(codecError(() => decodeRaw(bytes(0xc1)))).toContain('0xc1');
    // The spec's timestamp and msgpackr's undefined stay readable.
    expect(decodeRaw(bytes(0xd6, 0xff, 0, 0, 0, 1))).toEqual(new Date(1_000));
    expect(decodeRaw(bytes(0x91, 0xd4, 0x00, 0x00))).toEqual([undefined]);
  });

  it('refuses truncated bytes, bytes left over and lengths beyond the data, naming no byte of the content', () => {
    const e = encode({ tool: 'kb.write_note', input: { body: 'SECRET-BODY-TEXT' } });
    for (const cut of [1, 5, e.length - 1])
      expect(codecError(() => decodeRaw(e.subarray(0, cut)))).toMatch(/^not msgpack: truncated/);
    const trailing = codecError(() => decodeRaw(bytes(...e, ...str('SECRET-TRAILER'))));
    expect(trailing).toBe('not msgpack: 15 byte(s) after the value');
    expect(codecError(() => decode(z.object({}), bytes(...e, 0xc0)))).not.toContain('SECRET');
    expect(codecError(() => decodeRaw(bytes(0xdd, 0xff, 0xff, 0xff, 0xff, 0xc0)))).toMatch(/^not msgpack: truncated/);
    expect(codecError(() => decodeRaw(bytes(0xdb, 0xff, 0xff, 0xff, 0xff, 0x61)))).toMatch(/^not msgpack: truncated/);
    expect(codecError(() => decodeRaw(bytes()))).toMatch(/^not msgpack: truncated/);
  });

  it('refuses map keys that are not strings; a __proto__ key never becomes a prototype', () => {
    expect(codecError(() => decodeRaw(bytes(0x81, 0x81, ...str('a'), 1, 2)))).toBe(
      'not msgpack: a map key at byte 1 is not a string',
    );
    expect(codecError(() => decodeRaw(bytes(0x81, 0x01, 0x02)))).toContain('not a string');
    const polluted = decodeRaw(bytes(0x81, ...str('__proto__'), 0x81, ...str('actorId'), ...str('mallory'))) as Record<
      string,
      unknown
    >;
    expect(Object.getPrototypeOf(polluted)).toBe(Object.prototype);
    expect(polluted.actorId).toBeUndefined();
    expect(({} as Record<string, unknown>).actorId).toBeUndefined();
  });

  it("reads uint64 and int64 beyond 2^53 as the nearest double, which zod's int() refuses", () => {
    const big = decodeRaw(bytes(0x81, ...str('n'), 0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)) as {
      n: number;
    };
    expect(typeof big.n).toBe('number');
    expect(Number.isSafeInteger(big.n)).toBe(false);
    expect(z.object({ n: z.number().int() }).safeParse(big).success).toBe(false);
  });

  it('refuses more values than allowed in all maps and lists, and still names the top-level key it was sent under, wherever it stands', () => {
    const wide = (n: number) => Object.fromEntries(Array.from({ length: n }, (_, i) => [`f${i}`, i]));
    const key = `opk_${'k'.repeat(43)}`;
    expect(
      decodeRaw(encode({ input: wide(2_000), operationKey: key }), { maxItems: 4_096, captureKey: 'operationKey' }),
    ).toMatchObject({ operationKey: key });
    for (const env of [
      { operationKey: key, input: wide(2_100) },
      { input: wide(2_100), operationKey: key },
      { input: [wide(1_000), wide(1_100)], operationKey: key },
    ]) {
      let caught: unknown;
      try {
        decodeRaw(encode(env), { maxItems: 4_096, captureKey: 'operationKey' });
      } catch (err) {
        caught = err;
      }
      expect(caught).toBeInstanceOf(CodecError);
      expect((caught as Error).message).toBe('more than 4096 values in its maps and lists');
      expect((caught as Error).cause as { tooMany: boolean; captured?: string }).toMatchObject({
        tooMany: true,
        captured: key,
      });
    }
    // A nested `operationKey` is not the envelope's; one that is not a string is not captured.
    for (const env of [{ input: { operationKey: key, ...wide(2_100) } }, { operationKey: 7, input: wide(2_100) }]) {
      try {
        decodeRaw(encode(env), { maxItems: 4_096, captureKey: 'operationKey' });
      } catch (err) {
        expect(((err as Error).cause as { captured?: string }).captured).toBeUndefined();
      }
    }
    // Malformed bytes stay malformed: too many values is only said of well-formed ones.
    expect(codecError(() => decodeRaw(encode({ input: wide(2_100) }).subarray(0, 100), { maxItems: 4_096 }))).toMatch(
      /^not msgpack: truncated/,
    );
  });
});
