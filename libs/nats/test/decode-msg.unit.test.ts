import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { CodecError, decodeMsg, encode } from '@tooltx/nats';

const strict = z.object({ type: z.string(), state: z.object({ tenant: z.string(), attempt: z.number() }) });
const lenient = z.object({ type: z.string() });

describe('decodeMsg: one msgpack read per delivered message, one parse per caller', () => {
  it('gives each schema its own parse of the same message', () => {
    const msg = { data: encode({ type: 'committed', state: { tenant: 'acme', attempt: 1 }, extra: 'x' }) };
    const a = decodeMsg(strict, msg);
    const b = decodeMsg(strict, msg);
    const c = decodeMsg(lenient, msg);
    expect(a).toEqual({ type: 'committed', state: { tenant: 'acme', attempt: 1 } });
    expect(c).toEqual({ type: 'committed' });
    // No caller sees another's object: a handler that changed its copy changes nothing for the next.
    expect(b).not.toBe(a);
    expect(b.state).not.toBe(a.state);
    a.state.attempt = 9;
    expect(decodeMsg(strict, msg).state.attempt).toBe(1);
  });

  it('throws a CodecError to every caller of a message that is not msgpack, and a schema miss to its own caller', () => {
    const bad = { data: new Uint8Array([0xc1]) };
    expect(() => decodeMsg(lenient, bad)).toThrow(CodecError);
    expect(() => decodeMsg(strict, bad)).toThrow(CodecError);
    const partial = { data: encode({ type: 'accepted' }) };
    expect(decodeMsg(lenient, partial)).toEqual({ type: 'accepted' });
    expect(() => decodeMsg(strict, partial)).toThrow(/does not match schema/);
  });

  it('reads a different message object again, even with equal bytes (a redelivery)', () => {
    const data = encode({ type: 'running', state: { tenant: 'acme', attempt: 1 } });
    expect(decodeMsg(strict, { data }).type).toBe('running');
    expect(decodeMsg(strict, { data: encode({ type: 'committed', state: { tenant: 'acme', attempt: 2 } }) }).type).toBe(
      'committed',
    );
  });
});
