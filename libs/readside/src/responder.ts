import type { Msg, NatsConnection, Subscription } from '@nats-io/transport-node';
import type { z } from 'zod';
import { ErrorClass, fieldIssues, toErrorInfo, type ErrorInfo, type FieldIssue } from '@tooltx/contracts';
import { decodeRaw, encode, isOwnReplyInbox, type Role } from '@tooltx/nats';
import type { Logger } from '@tooltx/runtime';

/**
 * How one endpoint's requests and answers are written on the wire. `decode` throws on bytes that
 * are not a value of the format at all; what the value must look like is the endpoint's schema's
 * business. `undecodable` is the one issue an `invalid_input` answer carries for such bytes.
 */
export interface Codec {
  decode(bytes: Uint8Array): unknown;
  encode(body: unknown): Uint8Array;
  undecodable: FieldIssue;
}

/** msgpack (the agents' and auditors' endpoints): plain maps and lists, bounded depth ({@link decodeRaw}). */
export const msgpackCodec: Codec = {
  decode: (bytes) => decodeRaw(bytes),
  encode,
  undecodable: { path: [], code: 'invalid_encoding', message: 'not msgpack' },
};

/** UTF-8 JSON (the operators' endpoint, spoken by the CLI). */
export const jsonCodec: Codec = {
  decode: (bytes) => JSON.parse(new TextDecoder().decode(bytes)) as unknown,
  encode: (body) => new TextEncoder().encode(JSON.stringify(body)),
  undecodable: { path: [], code: 'not_json', message: 'the request must be a JSON object' },
};

/**
 * One request/reply endpoint of the read side: what it listens on, who asks, how requests are
 * written and checked, what it answers. `Who` is the identity read from the subject (the server
 * lets only that identity publish there, so it is never taken from the payload); `Req` the
 * request as `schema` parses it.
 */
export interface Endpoint<Who, Req> {
  /** Names the endpoint in log lines (`<name> request failed`, …). */
  name: string;
  /** The subscription's subject (a wildcard over every identity). */
  subject: string;
  /** Queue group: every instance of the role joins it, so each request is answered once. */
  queue: string;
  /**
   * The requester and its role from a request's subject; null when the subject does not name one.
   * The role decides which reply subjects are the requester's own inbox.
   */
  identify(subject: string): { who: Who; role: Role } | null;
  /** The error answered (through {@link errorBody}) when {@link identify} returns null. */
  unidentified: ErrorInfo;
  codec: Codec;
  schema: z.ZodType<Req>;
  /**
   * The answer to a valid request, encoded with the codec as it is. A throw is answered with
   * {@link errorBody} of `toErrorInfo(err)`: throw a `TooltxError` to answer a class, anything
   * else answers `internal` (and is logged).
   */
  handle(req: Req, who: Who): Promise<unknown>;
  /** The body that carries an error, in this endpoint's wire format. */
  errorBody(info: ErrorInfo): unknown;
  /**
   * Awaited before an `invalid_input` answer to an identified requester goes (`cause`: bytes that
   * do not decode, or a value the schema refused). A throw is answered as a handler's throw is.
   * The audit service records refused queries here.
   */
  beforeInvalidAnswer?(who: Who, cause: 'encoding' | 'schema'): Promise<void>;
  /**
   * Called once by `stop()` after the subscription drained and before waiting for the answers in
   * flight: a long-polling endpoint answers its waiting requests now instead of waiting on.
   */
  onDrained?(): void;
}

/**
 * An operator's request/reply endpoint (`<prefix>.ops.<kind>.<operator>`): the operator is named by
 * the subject (`parse`; another subject is answered `invalid_input` at `subject`, "not a `what`
 * subject"), the wire format is JSON, and an unforeseen throw is answered `dependency_unavailable`,
 * never `internal` (the responder logs it).
 */
export function operatorEndpoint<Req>(o: {
  name: string;
  subject: string;
  queue: string;
  parse(subject: string): string | null;
  /** What a request subject is called in the refusal of another one, e.g. `a debug request`. */
  what: string;
  schema: z.ZodType<Req>;
  handle(req: Req, operator: string): Promise<unknown>;
  beforeInvalidAnswer?(operator: string, cause: 'encoding' | 'schema'): Promise<void>;
}): Endpoint<string, Req> {
  return {
    name: o.name,
    subject: o.subject,
    queue: o.queue,
    identify: (subject) => {
      const operator = o.parse(subject);
      return operator ? { who: operator, role: { kind: 'operator', operator } } : null;
    },
    unidentified: {
      class: ErrorClass.InvalidInput,
      issues: [{ path: ['subject'], code: 'invalid_subject', message: `not ${o.what} subject` }],
    },
    codec: jsonCodec,
    schema: o.schema,
    handle: o.handle,
    ...(o.beforeInvalidAnswer ? { beforeInvalidAnswer: o.beforeInvalidAnswer } : {}),
    errorBody: (info) => ({
      ok: false,
      error: info.class === ErrorClass.Internal ? { class: ErrorClass.DependencyUnavailable } : info,
    }),
  };
}

/** A running endpoint. */
export interface Responder {
  /** Drains the subscription (no new requests), then waits until every answer in flight went out. */
  stop(): Promise<void>;
}

/**
 * Subscribes `endpoint` in its queue group and answers each request concurrently. Per request:
 * the subject names the requester ({@link Endpoint.identify}); the answer goes only to a reply
 * subject in the requester's own inbox — anything else is logged as a warning and not answered,
 * because the reply subject is the requester's choice and the service may publish where the
 * requester may not (FM-31, FM-32); the bytes are decoded with the endpoint's codec (undecodable:
 * `invalid_input`, the codec's issue) and parsed with its schema (refused: `invalid_input` with
 * the field issues); then the handler answers. Never throws out of a message callback: a failure
 * to answer is logged (`<name> request failed`).
 */
export function startResponder<Who, Req>(nc: NatsConnection, log: Logger, endpoint: Endpoint<Who, Req>): Responder {
  const e = endpoint;
  const inFlight = new Set<Promise<void>>();

  const answer = async (msg: Msg): Promise<void> => {
    const reply = (body: unknown) => msg.respond(e.codec.encode(body));
    const id = e.identify(msg.subject);
    if (!id) return void reply(e.errorBody(e.unidentified));
    if (!isOwnReplyInbox(id.role, msg.reply)) {
      log.warn(
        { subject: msg.subject },
        `${e.name} request with a reply subject outside the requester's inbox: not answered`,
      );
      return;
    }
    try {
      let raw: unknown;
      try {
        raw = e.codec.decode(msg.data);
      } catch {
        await e.beforeInvalidAnswer?.(id.who, 'encoding');
        return void reply(e.errorBody({ class: ErrorClass.InvalidInput, issues: [e.codec.undecodable] }));
      }
      const parsed = e.schema.safeParse(raw);
      if (!parsed.success) {
        await e.beforeInvalidAnswer?.(id.who, 'schema');
        return void reply(e.errorBody({ class: ErrorClass.InvalidInput, issues: fieldIssues(parsed.error) }));
      }
      reply(await e.handle(parsed.data, id.who));
    } catch (err) {
      const info = toErrorInfo(err);
      reply(e.errorBody(info));
      if (info.class === ErrorClass.Internal) log.error({ err }, `${e.name} request failed`);
    }
  };

  const sub: Subscription = nc.subscribe(e.subject, {
    queue: e.queue,
    callback: (err, msg) => {
      if (err) return void log.warn({ err }, `${e.name} subscription error`);
      const p = answer(msg).catch((err: unknown) => log.error({ err }, `${e.name} request failed`));
      inFlight.add(p);
      void p.finally(() => inFlight.delete(p));
    },
  });

  return {
    async stop() {
      await sub.drain();
      e.onDrained?.();
      await Promise.all(inFlight);
    },
  };
}
