import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { CodecError, decodeMsg, encode, keepOwnAppendsForDelivery, rememberOwnAppend } from '@tooltx/nats';
import { operationEventSchema } from '@tooltx/lifecycle';

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

describe('decodeMsg of an event this process appended itself', () => {
  it('remembers nothing in a process that does not read the event log back', () => {
    const value = strict.parse({ type: 'committed', state: { tenant: 'acme', attempt: 1 } });
    const data = encode(value);
    rememberOwnAppend(strict, value, data, 'p.op.acme.o0', 6);
    const read = decodeMsg(strict, { data, seq: 6, subject: 'p.op.acme.o0' });
    expect(read).toEqual(value);
    expect(read).not.toBe(value);
    expect(Object.isFrozen(value)).toBe(false);
  });

  const event = {
    type: 'committed',
    state: { tenant: 'acme', attempt: 1 },
  };
  const own = (subject: string, seq: number, value = strict.parse(event)) => {
    const data = encode(value);
    keepOwnAppendsForDelivery();
    rememberOwnAppend(strict, value, data, subject, seq);
    return { value, data };
  };

  it('hands the validated value, frozen, to every caller of that delivery asking for its schema; another schema parses it', () => {
    const { value, data } = own('p.op.acme.o1', 7);
    const msg = { data: new Uint8Array(data), seq: 7, subject: 'p.op.acme.o1' };
    const a = decodeMsg(strict, msg);
    expect(a).toBe(value);
    expect(decodeMsg(strict, msg)).toBe(value);
    expect(Object.isFrozen(a) && Object.isFrozen(a.state)).toBe(true);
    // A reader cannot change what the next one reads (ES modules are strict: the write throws).
    expect(() => {
      (a.state as { attempt: number }).attempt = 9;
    }).toThrow(TypeError);
    const c = decodeMsg(lenient, msg);
    expect(c).toEqual({ type: 'committed' });
    expect(Object.isFrozen(c)).toBe(false);
    // A lenient reader that names the schema the append used gets the validated value itself.
    expect(decodeMsg(lenient, msg, { impliedBy: strict })).toBe(value);
  });

  it('reads a message like any other when its bytes, sequence or subject differ from the append, and after its first delivery', () => {
    const { value, data } = own('p.op.acme.o2', 8);
    const other = encode({ type: 'running', state: { tenant: 'acme', attempt: 2 } });
    // Same place, other bytes: what is stored there is read, never what this process sent.
    expect(decodeMsg(strict, { data: other, seq: 8, subject: 'p.op.acme.o2' }).type).toBe('running');
    // The entry left at that first delivery: a redelivery is read afresh.
    const again = decodeMsg(strict, { data, seq: 8, subject: 'p.op.acme.o2' });
    expect(again).toEqual(value);
    expect(again).not.toBe(value);
    own('p.op.acme.o3', 9);
    expect(decodeMsg(strict, { data, seq: 10, subject: 'p.op.acme.o3' })).not.toBe(value);
    expect(decodeMsg(strict, { data, seq: 9, subject: 'p.op.acme.o4' })).toEqual(value);
  });

  it("freezes only zod's copy: the event the writer built stays its own (the event schema has no pass-through field)", () => {
    // An accepted-and-started event as the co-located process appends it (peers workload).
    const built = {
      schema: 1,
      type: 'accepted',
      eventId: '8f570335-b23e-4a0d-a17c-c01118043030',
      at: 1796286575556,
      attempt: 1,
      actor: 'researcher',
      intentSeq: 330,
      submissionId: 'd56d9636-2f91-4bcc-89b2-965b29a54cc2',
      authorization: {
        decision: 'allow',
        policyVersion: 'none',
        at: 1796286575556,
      },
      started: {
        executor: 'tooltx-1',
        deadlineAt: 1796286585556,
        authorization: {
          decision: 'allow',
          policyVersion: 'none',
          at: 1796286575556,
        },
      },
      state: {
        operationKey: 'opk_1-GCf3r1YAyVXsqrH2sRlQYa5xwujHcQke27M90zd6U',
        tenant: 'acme',
        taskId: 'peers-cb55de67',
        tool: 'peers.append_line',
        version: 1,
        contractDigest: 'sha256:60fcf8f95060af0482e83f3e4a8241290311cf37d869b9f8eacf4ca293926375',
        effect: 'create',
        inputDigest: 'sha256:158efd447a95c23c64639707bab8645cb7a8f78daba86203a416f3ac64a60882',
        targetDigest: 'sha256:158efd447a95c23c64639707bab8645cb7a8f78daba86203a416f3ac64a60882',
        status: 'running',
        actor: 'researcher',
        attempt: 1,
        intent: {
          seq: 330,
          submissionId: 'd56d9636-2f91-4bcc-89b2-965b29a54cc2',
        },
        acceptedAt: 1796286575556,
        running: {
          eventId: '8f570335-b23e-4a0d-a17c-c01118043030',
          executor: 'tooltx-1',
          at: 1796286575556,
          deadlineAt: 1796286585556,
        },
        authorization: {
          intake: {
            decision: 'allow',
            policyVersion: 'none',
            at: 1796286575556,
          },
          execution: {
            decision: 'allow',
            policyVersion: 'none',
            at: 1796286575556,
          },
        },
        lastEventId: '8f570335-b23e-4a0d-a17c-c01118043030',
        updatedAt: 1796286575556,
        eventCount: 1,
      },
    };
    const validated = operationEventSchema.parse(built);
    keepOwnAppendsForDelivery();
    rememberOwnAppend(operationEventSchema, validated, encode(validated), 'p.op.acme.o5', 11);
    expect(Object.isFrozen(validated.state)).toBe(true);
    const walk = (v: unknown): void => {
      if (v && typeof v === 'object') {
        expect(Object.isFrozen(v)).toBe(false);
        for (const x of Object.values(v)) walk(x);
      }
    };
    walk(built);
  });
});
