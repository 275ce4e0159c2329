import { randomUUID } from 'node:crypto';
import { JetStreamApiCodes, JetStreamApiError, type JetStreamClient, type JetStreamManager } from '@nats-io/jetstream';
import { errors as coreErrors, headers as natsHeaders } from '@nats-io/transport-node';
import {
  ConcurrencyError,
  decisionRecordSchema,
  operationEventSchema,
  StoreUnavailableError,
  type DecisionRecord,
  type LoadedOperation,
  type OperationEvent,
  type OperationStore,
  type StoredIntent,
} from '@tooltx/lifecycle';
import { decode, encode, rememberOwnAppend } from './codec.js';
import type { Subjects } from './subjects.js';

const PUBLISH_ATTEMPTS = 4;
/** Most records of one actor on one key {@link JetStreamStore.decisionOf} reads past the last one. */
const DECISIONS_SCANNED = 64;

/**
 * The JetStream store of operations ({@link OperationStore}): one subject per operation, appends
 * under the expected last subject sequence (first writer wins with no time window: JetStream's
 * `Nats-Expected-Last-Subject-Sequence`), loads by one direct get of the last message on the
 * subject. Passes the event store contract (test/contracts/event-store.ts).
 */
export class JetStreamStore implements OperationStore {
  readonly #js: JetStreamClient;
  readonly #jsm: JetStreamManager;
  readonly #subjects: Subjects;
  readonly #timeoutMs: number;

  constructor(js: JetStreamClient, jsm: JetStreamManager, subjects: Subjects, opts: { timeoutMs?: number } = {}) {
    this.#js = js;
    this.#jsm = jsm;
    this.#subjects = subjects;
    this.#timeoutMs = opts.timeoutMs ?? 5_000;
  }

  /** Loads the operation's folded state from the last event on its subject. */
  async load(tenant: string, opId: string): Promise<LoadedOperation> {
    const m = await this.#direct(this.#subjects.eventsStream, { last_by_subj: this.#subjects.op(tenant, opId) });
    if (!m) return { state: { status: 'none' }, seq: 0 };
    const event = decode(operationEventSchema, m.data);
    return { state: event.state, seq: m.seq };
  }

  /**
   * Appends `event` to the operation's subject if its last sequence is still `expectedSeq`.
   * Returns the stored sequence. Retries a publish whose answer was lost with the same msg id
   * and expectation. A `duplicate: true` answer is believed only after reading the stored message
   * back and finding this event's id (a duplicate answer names the first copy's sequence even when
   * that message is gone, or another subject's message squatted the id). Throws {@link ConcurrencyError}
   * when another writer won, {@link StoreUnavailableError} when JetStream does not answer, and
   * zod's error for an event {@link JetStreamStore.load} could not read back (checked before
   * anything is sent: one unreadable event would make its operation unreadable for good).
   */
  async append(tenant: string, opId: string, event: OperationEvent, expectedSeq: number): Promise<number> {
    const subject = this.#subjects.op(tenant, opId);
    const validated = operationEventSchema.parse(event);
    const data = encode(validated);
    const h = natsHeaders();
    h.set(EVENT_TYPE_HEADER, event.type);
    h.set(EVENT_STATUS_HEADER, event.state.status);
    let lastErr: unknown;
    for (let i = 0; i < PUBLISH_ATTEMPTS; i++) {
      try {
        const ack = await this.#js.publish(subject, data, {
          headers: h,
          msgID: event.eventId,
          expect: { lastSubjectSequence: expectedSeq },
          timeout: this.#timeoutMs,
        });
        if (!ack.duplicate) {
          // Its delivery to this process (the `host` durable's roles) is then not decoded again.
          rememberOwnAppend(operationEventSchema, validated, data, subject, ack.seq);
          return ack.seq;
        }
        if (ack.seq === 0) {
          // On a cluster, a retransmission whose first copy is still being replicated is answered
          // `duplicate` with sequence 0: nothing to read back yet. Ask again (FM-29).
          lastErr = new StoreUnavailableError(`append to ${subject}: duplicate of a message still in flight`);
          await sleep(100 * 2 ** i);
          continue;
        }
        const stored = await this.#direct(this.#subjects.eventsStream, { seq: ack.seq });
        if (stored && stored.subject === subject && decode(operationEventSchema, stored.data).eventId === event.eventId)
          return ack.seq;
        throw new ConcurrencyError(subject, expectedSeq);
      } catch (err) {
        if (err instanceof ConcurrencyError) throw err;
        if (isWrongLastSequence(err)) {
          // Our own earlier publish may have landed after its answer was lost (and after the
          // dedup window): then the last event on the subject is ours.
          // Read from the stream's leader: a replica that has not caught up would answer an older
          // last event, and our own landed append would be taken for another writer's (FM-29).
          const cur = await this.#leaderLast(subject);
          if (cur && decode(operationEventSchema, cur.data).eventId === event.eventId) return cur.seq;
          throw new ConcurrencyError(subject, expectedSeq);
        }
        if (!isTransient(err)) throw err;
        lastErr = err;
        await sleep(100 * 2 ** i);
      }
    }
    throw new StoreUnavailableError(`append to ${subject} not confirmed`, { cause: lastErr });
  }

  /**
   * The subject of the event-log message at stream sequence `seq`, or null when none is stored
   * there (read like every load: a replica that lags is asked again of the leader, FM-29). For a
   * reader that learns of a message by its sequence only (a max-deliveries advisory).
   */
  async subjectAt(seq: number): Promise<string | null> {
    return (await this.#direct(this.#subjects.eventsStream, { seq }))?.subject ?? null;
  }

  /**
   * Records a pre-acceptance outcome on the operation's decision subject (its own stream). The
   * operation's subject is never touched by it. Msg id = the record's random event id.
   */
  async recordDecision(record: DecisionRecord, opId: string): Promise<number> {
    const subject = this.#subjects.decision(record.tenant, opId, record.actor);
    return this.#publishWithRetry(subject, encode(record), record.eventId);
  }

  /** The last decision recorded for an operation about `actor`'s own requests, or null. */
  async lastDecision(tenant: string, opId: string, actor: string): Promise<DecisionRecord | null> {
    const m = await this.#direct(this.#subjects.decisionsStream(tenant), {
      last_by_subj: this.#subjects.decision(tenant, opId, actor),
    });
    return m ? decode(decisionRecordSchema, m.data) : null;
  }

  /**
   * The newest decision about one of `actor`'s submissions `submissionIds`, or null. The subject's
   * last record first (the usual case: it is one of them); else its records from the oldest on,
   * one direct get each (an actor's requests of one key are few), at most
   * {@link DECISIONS_SCANNED} of them.
   */
  async decisionOf(
    tenant: string,
    opId: string,
    actor: string,
    submissionIds: readonly string[],
  ): Promise<DecisionRecord | null> {
    const stream = this.#subjects.decisionsStream(tenant);
    const subject = this.#subjects.decision(tenant, opId, actor);
    const last = await this.#direct(stream, { last_by_subj: subject });
    if (!last) return null;
    const lastRecord = decode(decisionRecordSchema, last.data);
    if (submissionIds.includes(lastRecord.submissionId)) return lastRecord;
    let found: DecisionRecord | null = null;
    let seq = 0;
    for (let i = 0; i < DECISIONS_SCANNED; i++) {
      const m = await this.#direct(stream, { seq: seq + 1, next_by_subj: subject });
      if (!m || m.seq >= last.seq) break;
      const r = decode(decisionRecordSchema, m.data);
      if (submissionIds.includes(r.submissionId)) found = r;
      seq = m.seq;
    }
    return found;
  }

  /** Reads a stored intent by its sequence in the tenant's intake stream (the `accepted` event names it), or null. */
  async readIntent(tenant: string, seq: number): Promise<StoredIntent | null> {
    const m = await this.#direct(this.#subjects.intentsStream(tenant), { seq });
    if (!m) return null;
    return { seq: m.seq, subject: m.subject, data: m.data, submissionId: m.header?.get('Nats-Msg-Id') || undefined };
  }

  /**
   * Deletes an intent that registered nothing (a refusal, an unreadable message) from the tenant's
   * intake stream, so that it stops counting against the tenant's bound (docs/tenancy.md). An intent
   * already gone is fine. Never called for an intent an operation names: its input is read from it.
   */
  async deleteIntent(tenant: string, seq: number): Promise<void> {
    try {
      await this.#jsm.streams.deleteMessage(this.#subjects.intentsStream(tenant), seq, false);
    } catch (err) {
      // Already gone: 10043 (no message at that sequence: deleted by an earlier delivery of the same
      // intent, or a retried delete whose answer was lost) or 10057 (a sequence past the stream's end).
      if (err instanceof JetStreamApiError && (err.code === 10043 || err.code === 10057)) return;
      if (isTransient(err)) throw new StoreUnavailableError(`delete of intent ${seq} failed`, { cause: err });
      throw err;
    }
  }

  async #publishWithRetry(subject: string, data: Uint8Array, msgID: string): Promise<number> {
    let lastErr: unknown;
    for (let i = 0; i < PUBLISH_ATTEMPTS; i++) {
      try {
        const ack = await this.#js.publish(subject, data, { msgID, timeout: this.#timeoutMs });
        // A duplicate of a first copy still being replicated (cluster): its sequence is not known yet.
        if (ack.duplicate && ack.seq === 0) {
          lastErr = new StoreUnavailableError(`publish to ${subject}: duplicate of a message still in flight`);
          await sleep(100 * 2 ** i);
          continue;
        }
        return ack.seq;
      } catch (err) {
        if (!isTransient(err)) throw err;
        lastErr = err;
        await sleep(100 * 2 ** i);
      }
    }
    throw new StoreUnavailableError(`publish to ${subject} not confirmed`, { cause: lastErr });
  }

  /** The last message on `subject` as the events stream's leader holds it (`STREAM.MSG.GET`), or null. */
  async #leaderLast(subject: string) {
    try {
      return await this.#jsm.streams.getMessage(this.#subjects.eventsStream, { last_by_subj: subject });
    } catch (err) {
      if (isTransient(err))
        throw new StoreUnavailableError(`read of the last event on ${subject} failed`, { cause: err });
      throw err;
    }
  }

  /**
   * A direct get. On a replicated stream any replica may answer one, and a replica that has not yet
   * caught up does not hold a message the leader stored (FM-29: an intent read back by the executor
   * came back missing from a restarted node): a read by sequence that finds nothing is asked again
   * of the leader (`STREAM.MSG.GET`) before "not there" is believed. A read of a subject's last
   * message may be stale the same way; every append states its expected sequence, so a stale read
   * costs a refused append and a reload, never a wrong event.
   */
  async #direct(stream: string, query: { last_by_subj: string } | { seq: number; next_by_subj?: string }) {
    try {
      const m = await this.#jsm.direct.getMessage(stream, query);
      if (m || !('seq' in query) || query.next_by_subj !== undefined) return m;
      return await this.#jsm.streams.getMessage(stream, query);
    } catch (err) {
      if (isTransient(err)) throw new StoreUnavailableError(`direct get on ${stream} failed`, { cause: err });
      throw err;
    }
  }
}

/**
 * The header every appended event carries with its `type` (`accepted`, `running`, …; the body's
 * `type` is the truth): a reader that acts on some types only skips the others without decoding
 * the body (the executor acts on 1 of an operation's 3 events). Only services may publish
 * on operation subjects (libs/auth/src/permissions.ts), so the header is as trusted as the body. An event
 * without it (written before it existed) is decoded as before.
 */
export const EVENT_TYPE_HEADER = 'Tooltx-Event-Type';

/**
 * The header every appended event carries with the operation's status after it (`accepted`,
 * `running`, …): an `accepted` event that also started the attempt (docs/lifecycle.md "Accepted
 * and started") is skipped by the executor unread, like a `running` one. Trusted as
 * {@link EVENT_TYPE_HEADER} is.
 */
export const EVENT_STATUS_HEADER = 'Tooltx-Status';

/** The status named by {@link EVENT_STATUS_HEADER}, or undefined when the message has none. */
export function eventStatusOf(msg: { headers?: { get(k: string): string } | undefined }): string | undefined {
  return msg.headers?.get(EVENT_STATUS_HEADER) || undefined;
}

/** The event type named by {@link EVENT_TYPE_HEADER}, or undefined when the message has none. */
export function eventTypeOf(msg: { headers?: { get(k: string): string } | undefined }): string | undefined {
  return msg.headers?.get(EVENT_TYPE_HEADER) || undefined;
}

/** A fresh random event id (also the event's Nats-Msg-Id). */
export function newEventId(): string {
  return randomUUID();
}

export function isWrongLastSequence(err: unknown): boolean {
  return err instanceof JetStreamApiError && err.code === JetStreamApiCodes.StreamWrongLastSequence;
}

/** Timeouts, no responders and connection loss: the request may be retried (by error class, never by message text). */
export function isTransient(err: unknown): boolean {
  return (
    isNoRespondersPublish(err) ||
    isInFlightDuplicate(err) ||
    err instanceof coreErrors.TimeoutError ||
    err instanceof coreErrors.NoRespondersError ||
    err instanceof coreErrors.RequestError ||
    err instanceof coreErrors.ConnectionError ||
    err instanceof coreErrors.DrainingConnectionError ||
    err instanceof coreErrors.ClosedConnectionError
  );
}

/**
 * nats-server 2.11+ answers a retransmission whose first copy is still being replicated with error
 * 10158 (JSStreamDuplicateMessageConflict, "duplicate message id is in process"), where 2.10 answers
 * `duplicate` with sequence 0: the first copy may yet land, so the same publish is asked again.
 */
export const IN_FLIGHT_DUPLICATE_CODE = 10158;
export function isInFlightDuplicate(err: unknown): boolean {
  return err instanceof JetStreamApiError && err.code === IN_FLIGHT_DUPLICATE_CODE;
}

/**
 * A JetStream publish that reached no stream: nats.js reports the request's no-responders as
 * `JetStreamNotEnabled` once its own retries are spent. Nothing was stored, so the same publish may
 * be sent again. On a cluster it happens for a moment after a node (re)starts, before the interest
 * of a stream across a service import has reached the node the client is connected to (FM-29).
 */
export function isNoRespondersPublish(err: unknown): boolean {
  if (!(err instanceof Error) || err.name !== 'JetStreamNotEnabled') return false;
  const cause = err.cause;
  return cause instanceof coreErrors.RequestError && cause.isNoResponders();
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
