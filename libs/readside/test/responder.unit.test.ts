/**
 * The read side's request/reply helper against a stand-in connection: which requests it answers
 * (only into the requester's own inbox, FM-31/FM-32), how undecodable and refused requests and
 * thrown errors are answered in the endpoint's own error body, and what `stop()` waits for.
 * The wire formats of the real endpoints are covered end to end (status, audit, takeover tests).
 */
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import type { Msg, NatsConnection, SubscriptionOptions } from '@nats-io/transport-node';
import { ErrorClass, TooltxError, type ErrorInfo } from '@tooltx/contracts';
import { encode } from '@tooltx/nats';
import type { Logger } from '@tooltx/runtime';
import { jsonCodec, msgpackCodec, startResponder, type Codec, type Endpoint } from '../src/responder.js';

const schema = z.strictObject({ n: z.number().int() });
type Req = z.infer<typeof schema>;

/** A connection that hands the test the subscription's callback and records the drain. */
function stand() {
  const seen: { subject: string; queue: string | undefined; drained: boolean } = {
    subject: '',
    queue: undefined,
    drained: false,
  };
  let callback: ((err: Error | null, msg: Msg) => void) | undefined;
  const nc = {
    subscribe(subject: string, opts: SubscriptionOptions) {
      seen.subject = subject;
      seen.queue = opts.queue;
      callback = opts.callback as typeof callback;
      return { drain: async () => void (seen.drained = true) };
    },
  } as unknown as NatsConnection;
  const logged: { level: 'warn' | 'error'; msg: string }[] = [];
  const log = {
    warn: (_o: unknown, msg: string) => logged.push({ level: 'warn', msg }),
    error: (_o: unknown, msg: string) => logged.push({ level: 'error', msg }),
  } as unknown as Logger;
  /** Delivers one request (`reply: null`: none); resolves with the decoded answer, or undefined when none was sent. */
  const send = async (
    o: { subject?: string; reply?: string | null; data: Uint8Array },
    codec: Codec = msgpackCodec,
  ): Promise<unknown> => {
    let answered: Uint8Array | undefined;
    const msg = {
      subject: o.subject ?? 'p.test.acme.alice',
      reply: o.reply === null ? undefined : (o.reply ?? '_INBOX.acme.alice.r1'),
      data: o.data,
      respond: (b: Uint8Array) => {
        answered = b;
        return true;
      },
    } as unknown as Msg;
    callback!(null, msg);
    await new Promise((r) => setTimeout(r, 5));
    return answered && codec.decode(answered);
  };
  return { nc, log, seen, logged, send };
}

/** A msgpack endpoint on `p.test.<tenant>.<actor>` answering `{ twice }`, errors as `{ error, at: 1 }`. */
function endpoint(
  over: Partial<Endpoint<{ tenant: string; actor: string }, Req>> = {},
): Endpoint<{ tenant: string; actor: string }, Req> {
  return {
    name: 'test',
    subject: 'p.test.*.*',
    queue: 'tooltx-test',
    identify: (subject) => {
      const [, , tenant, actor] = subject.split('.');
      return tenant && actor && tenant !== 'bad'
        ? { who: { tenant, actor }, role: { kind: 'agent', tenant, actor } }
        : null;
    },
    unidentified: {
      class: ErrorClass.InvalidInput,
      issues: [{ path: ['subject'], code: 'invalid_subject', message: 'not a test subject' }],
    },
    codec: msgpackCodec,
    schema,
    handle: async (req) => ({ twice: req.n * 2 }),
    errorBody: (error: ErrorInfo) => ({ error, at: 1 }),
    ...over,
  };
}

describe('the read side responder', () => {
  it("subscribes in its queue group and answers a valid request with the handler's answer, in the endpoint's codec", async () => {
    const s = stand();
    const seenWho: unknown[] = [];
    startResponder(
      s.nc,
      s.log,
      endpoint({
        handle: async (req, who) => {
          seenWho.push(who);
          return { twice: req.n * 2 };
        },
      }),
    );
    expect(s.seen).toMatchObject({ subject: 'p.test.*.*', queue: 'tooltx-test' });
    expect(await s.send({ data: encode({ n: 21 }) })).toEqual({ twice: 42 });
    expect(seenWho).toEqual([{ tenant: 'acme', actor: 'alice' }]);
  });

  it("answers nothing into a reply subject outside the requester's inbox, and logs a warning (FM-31, FM-32)", async () => {
    const s = stand();
    let calls = 0;
    startResponder(
      s.nc,
      s.log,
      endpoint({
        handle: async () => {
          calls++;
          return {};
        },
      }),
    );
    for (const reply of [
      '_INBOX.globex.mallory.r1',
      '_INBOX._svc.executor.x',
      '$JS.API.STREAM.DELETE.X',
      'p.op.acme.x',
      '_INBOX.acme.alice.*',
      null,
    ])
      expect(await s.send({ reply, data: encode({ n: 1 }) })).toBeUndefined();
    expect(await s.send({ data: encode({ n: 1 }) })).toEqual({}); // the requester's own inbox
    expect(calls).toBe(1);
    expect(s.logged.filter((l) => l.level === 'warn').map((l) => l.msg)).toEqual(
      Array(6).fill("test request with a reply subject outside the requester's inbox: not answered"),
    );
  });

  it("a subject that names no requester gets the endpoint's unidentified error", async () => {
    const s = stand();
    startResponder(s.nc, s.log, endpoint());
    expect(await s.send({ subject: 'p.test.bad.x', data: encode({ n: 1 }) })).toEqual({
      error: {
        class: 'invalid_input',
        issues: [{ path: ['subject'], code: 'invalid_subject', message: 'not a test subject' }],
      },
      at: 1,
    });
  });

  it("undecodable bytes and a refused request answer invalid_input (the codec's issue; field paths), after the invalid-request hook", async () => {
    const s = stand();
    const hooked: string[] = [];
    startResponder(
      s.nc,
      s.log,
      endpoint({ beforeInvalidAnswer: async (who, cause) => void hooked.push(`${who.actor}:${cause}`) }),
    );
    expect(await s.send({ data: Uint8Array.of(0xc1) })).toEqual({
      error: { class: 'invalid_input', issues: [{ path: [], code: 'invalid_encoding', message: 'not msgpack' }] },
      at: 1,
    });
    expect(await s.send({ data: encode({ n: 'x', extra: 1 }) })).toMatchObject({
      error: {
        class: 'invalid_input',
        issues: expect.arrayContaining([
          expect.objectContaining({ path: ['n'] }),
          expect.objectContaining({ path: ['extra'], code: 'unrecognized_key' }),
        ]),
      },
      at: 1,
    });
    expect(hooked).toEqual(['alice:encoding', 'alice:schema']);
    expect(s.logged).toEqual([]);
  });

  it("a throwing hook is answered as a handler's throw: the request is not answered invalid_input", async () => {
    const s = stand();
    startResponder(
      s.nc,
      s.log,
      endpoint({
        beforeInvalidAnswer: async () => {
          throw new TooltxError(ErrorClass.DependencyUnavailable, 'not recorded');
        },
      }),
    );
    expect(await s.send({ data: encode({ n: 'x' }) })).toEqual({ error: { class: 'dependency_unavailable' }, at: 1 });
  });

  it('a classified throw answers its class; anything else answers internal and is logged as an error', async () => {
    const s = stand();
    let fail: unknown;
    startResponder(
      s.nc,
      s.log,
      endpoint({
        handle: async () => {
          throw fail;
        },
      }),
    );
    fail = new TooltxError(ErrorClass.NotFound, 'no such operation');
    expect(await s.send({ data: encode({ n: 1 }) })).toEqual({ error: { class: 'not_found' }, at: 1 });
    expect(s.logged).toEqual([]);
    fail = new Error('the store is down: secret detail');
    expect(await s.send({ data: encode({ n: 1 }) })).toEqual({ error: { class: 'internal' }, at: 1 });
    expect(s.logged).toEqual([{ level: 'error', msg: 'test request failed' }]);
  });

  it('the JSON codec: requests and answers are UTF-8 JSON; bytes that are not JSON answer not_json', async () => {
    const s = stand();
    startResponder(s.nc, s.log, endpoint({ codec: jsonCodec, errorBody: (error) => ({ ok: false, error }) }));
    expect(await s.send({ data: new TextEncoder().encode('{"n":2}') }, jsonCodec)).toEqual({ twice: 4 });
    expect(await s.send({ data: new TextEncoder().encode('{"n":') }, jsonCodec)).toEqual({
      ok: false,
      error: {
        class: 'invalid_input',
        issues: [{ path: [], code: 'not_json', message: 'the request must be a JSON object' }],
      },
    });
  });

  it('stop(): drains the subscription, tells the endpoint, then waits for the answers in flight', async () => {
    const s = stand();
    const order: string[] = [];
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    const r = startResponder(
      s.nc,
      s.log,
      endpoint({
        handle: async (req) => {
          await held;
          order.push('answered');
          return { twice: req.n * 2 };
        },
        onDrained: () => order.push(`drained=${s.seen.drained}`),
      }),
    );
    const answer = s.send({ data: encode({ n: 3 }) });
    const stopped = r.stop().then(() => order.push('stopped'));
    await new Promise((res) => setTimeout(res, 20));
    expect(order).toEqual(['drained=true']);
    release();
    await stopped;
    expect(order).toEqual(['drained=true', 'answered', 'stopped']);
    await answer;
  });
});
