import {
  ConcurrencyError,
  decisionRecordSchema,
  operationEventSchema,
  type DecisionRecord,
  type LoadedOperation,
  type OperationEvent,
  type OperationStore,
  type StoredIntent,
} from '@tooltx/lifecycle';

export interface MemoryStoreOptions {
  /**
   * How long a message id is remembered as already stored, ms: an event's or a decision's event
   * id, an intent's submission id (JetStream's `duplicate_window`, the same on every stream as in
   * the topology; default 2 min, the server's default).
   */
  duplicateWindowMs?: number;
  /**
   * The events' max age, ms (the events stream's `max_age`): an event older than it is dropped on
   * the next read or write, and an operation whose events are all gone loads as none. Default:
   * kept for ever. The decision and intake streams keep everything (their max age is not modelled).
   */
  maxAgeMs?: number;
  /** The clock of the duplicate window and the max age, epoch ms (default `Date.now`). Must not go backwards. */
  now?: () => number;
  /**
   * Awaited while an append is in flight: after the event is validated (as the JetStream store
   * validates before sending), before the store's check of the expected sequence and its write,
   * which together stay one atomic step (as the server's are). Every append already yields there
   * once, so appends started together all reach the check before any of them writes; a test holds
   * writers here to release them in an order of its choosing.
   */
  beforeAppend?: (tenant: string, opId: string, event: OperationEvent) => void | Promise<void>;
}

/** One stored message of a {@link MemStream}. */
interface Msg<T> {
  seq: number;
  subject: string;
  body: T;
  /** When it was stored, epoch ms of the store's clock. */
  at: number;
}

/**
 * One JetStream stream as this store models it: its own sequence, its messages by sequence, the
 * last sequence of each subject, and the message ids seen within the duplicate window. A deleted
 * or expired message leaves a gap in the sequence; the subject's last sequence falls back to its
 * previous message still stored (what `Nats-Expected-Last-Subject-Sequence` is checked against).
 */
class MemStream<T> {
  #seq = 0;
  /** Messages in sequence order (a Map keeps insertion order, and sequences only grow). */
  readonly #bySeq = new Map<number, Msg<T>>();
  /** Subject → sequence of its last stored message. */
  readonly #last = new Map<string, number>();
  /** Message id → the sequence of its first copy and when it was stored, oldest first. */
  readonly #ids = new Map<string, { seq: number; at: number }>();

  readonly #windowMs: number;
  readonly #maxAgeMs: number | undefined;

  constructor(windowMs: number, maxAgeMs: number | undefined) {
    this.#windowMs = windowMs;
    this.#maxAgeMs = maxAgeMs;
  }

  /**
   * Forgets the message ids older than the duplicate window and drops the messages older than the
   * max age. Lazy (called by every read and write of the stream) and amortised O(1): both maps are
   * in time order, so it stops at the first entry still young enough.
   */
  tidy(now: number): void {
    for (const [id, e] of this.#ids) {
      if (now - e.at < this.#windowMs) break;
      this.#ids.delete(id);
    }
    if (this.#maxAgeMs === undefined) return;
    for (const m of this.#bySeq.values()) {
      if (now - m.at < this.#maxAgeMs) break;
      this.#bySeq.delete(m.seq);
      // Older messages of the subject are older still: gone already, so the subject is empty.
      if (this.#last.get(m.subject) === m.seq) this.#last.delete(m.subject);
    }
  }

  /** The sequence of the first copy of message id `id` when it is remembered (inside the window; call {@link tidy} first). */
  firstCopy(id: string): number | undefined {
    return this.#ids.get(id)?.seq;
  }

  /** Stores `body` on `subject` (remembering `id` for the window when given); returns its sequence. */
  store(subject: string, body: T, id: string | undefined, now: number): number {
    const seq = ++this.#seq;
    this.#bySeq.set(seq, { seq, subject, body, at: now });
    this.#last.set(subject, seq);
    if (id !== undefined) this.#ids.set(id, { seq, at: now });
    return seq;
  }

  get(seq: number): Msg<T> | undefined {
    return this.#bySeq.get(seq);
  }

  /** The sequence of the subject's last stored message, 0 when it has none. */
  lastSeq(subject: string): number {
    return this.#last.get(subject) ?? 0;
  }

  lastOf(subject: string): Msg<T> | undefined {
    const seq = this.#last.get(subject);
    return seq === undefined ? undefined : this.#bySeq.get(seq);
  }

  /** The subject's messages, oldest first. */
  messagesOf(subject: string): Msg<T>[] {
    return [...this.#bySeq.values()].filter((m) => m.subject === subject);
  }

  /** Deletes the message at `seq` (its id stays remembered for the window, as on JetStream); nothing when there is none. */
  delete(seq: number): void {
    const m = this.#bySeq.get(seq);
    if (!m) return;
    this.#bySeq.delete(seq);
    if (this.#last.get(m.subject) !== seq) return;
    const before = this.messagesOf(m.subject).at(-1);
    if (before) this.#last.set(m.subject, before.seq);
    else this.#last.delete(m.subject);
  }

  get rememberedIds(): number {
    return this.#ids.size;
  }
}

interface IntentBody {
  data: Uint8Array;
  submissionId: string | undefined;
}

/**
 * An operation store in this process's memory, with the JetStream store's semantics (the same
 * contract suite runs against both, test/contracts/event-store.ts). It models the streams the
 * JetStream store uses, each with its own sequence and its own duplicate window:
 *
 * - the events stream (`<P>_EVENTS`): one sequence for every operation's events; appends under the
 *   expected last sequence of the operation (first writer wins); an event id remembered for the
 *   duplicate window — a retried append inside it returns the first one's sequence and stores
 *   nothing — and a duplicate whose first copy is no longer stored, or is another operation's, is
 *   not taken as stored;
 * - per tenant, its decision stream (`<P>_DECISIONS_<tenant>`): decisions deduplicated by their
 *   event id inside the window, the last one per `<tenant>/<opId>/<actor>`;
 * - per tenant, its intake stream (`<P>_INTENTS_<tenant>`): intents deduplicated by their
 *   submission id inside the window (the client's `Nats-Msg-Id`), deletable.
 *
 * Every read hands out a copy. An append yields before its atomic check-and-write, so concurrent
 * writers race as they do against a server ({@link MemoryStoreOptions.beforeAppend}).
 *
 * Not modelled: stream limits (`max_bytes`, `max_msgs`, discard policies, `max_msg_size`), the
 * max age of the decision and intake streams, replicas and leaders, a store that does not answer
 * (`StoreUnavailableError` is never thrown), and a tenant without provisioned streams (its
 * streams exist as soon as they are written).
 *
 * For tests of deciders and service logic without a server, and for one-process experiments;
 * nothing survives the process.
 */
export class MemoryStore implements OperationStore {
  readonly #windowMs: number;
  readonly #maxAgeMs: number | undefined;
  readonly #now: () => number;
  readonly #beforeAppend: MemoryStoreOptions['beforeAppend'];
  readonly #events: MemStream<OperationEvent>;
  /** Tenant → its decision stream. */
  readonly #decisions = new Map<string, MemStream<DecisionRecord>>();
  /** Tenant → its intake stream. */
  readonly #intents = new Map<string, MemStream<IntentBody>>();

  constructor(o: MemoryStoreOptions = {}) {
    this.#windowMs = o.duplicateWindowMs ?? 120_000;
    this.#maxAgeMs = o.maxAgeMs;
    this.#now = o.now ?? Date.now;
    this.#beforeAppend = o.beforeAppend;
    this.#events = new MemStream(this.#windowMs, this.#maxAgeMs);
  }

  async load(tenant: string, opId: string): Promise<LoadedOperation> {
    this.#events.tidy(this.#now());
    const m = this.#events.lastOf(subjectOf(tenant, opId));
    return m ? { state: structuredClone(m.body.state), seq: m.seq } : { state: { status: 'none' }, seq: 0 };
  }

  async append(tenant: string, opId: string, event: OperationEvent, expectedSeq: number): Promise<number> {
    const subject = subjectOf(tenant, opId);
    const parsed = operationEventSchema.parse(event);
    // In flight: concurrent appends all get here before any of them is checked.
    await Promise.resolve();
    await this.#beforeAppend?.(tenant, opId, event);
    // From here to the end: one synchronous step, as the server's check-and-store is.
    const now = this.#now();
    this.#events.tidy(now);
    const firstSeq = this.#events.firstCopy(parsed.eventId);
    if (firstSeq !== undefined) {
      // A duplicate inside the window (checked before the expected sequence, as JetStream does):
      // believed only if the first copy is still stored, on this operation, with this event id.
      const first = this.#events.get(firstSeq);
      if (first && first.subject === subject && first.body.eventId === parsed.eventId) return firstSeq;
      throw new ConcurrencyError(subject, expectedSeq);
    }
    const last = this.#events.lastSeq(subject);
    if (last !== expectedSeq) {
      // Our own earlier append may have landed (and left the window): then the last event is ours.
      const cur = this.#events.get(last);
      if (cur && cur.body.eventId === parsed.eventId) return last;
      throw new ConcurrencyError(subject, expectedSeq);
    }
    return this.#events.store(subject, structuredClone(parsed), parsed.eventId, now);
  }

  /**
   * Records a decision in the tenant's decision stream (its own sequence, never the events'). A
   * retried record (same event id) inside the duplicate window returns the first one's sequence and
   * stores nothing, as a JetStream duplicate does — not read back: the JetStream store does not.
   */
  async recordDecision(record: DecisionRecord, opId: string): Promise<number> {
    const parsed = decisionRecordSchema.parse(record);
    const stream = streamOf(
      this.#decisions,
      parsed.tenant,
      () => new MemStream<DecisionRecord>(this.#windowMs, undefined),
    );
    const now = this.#now();
    stream.tidy(now);
    return (
      stream.firstCopy(parsed.eventId) ??
      stream.store(decisionSubjectOf(parsed.tenant, opId, parsed.actor), structuredClone(parsed), parsed.eventId, now)
    );
  }

  async lastDecision(tenant: string, opId: string, actor: string): Promise<DecisionRecord | null> {
    const stream = this.#decisions.get(tenant);
    stream?.tidy(this.#now());
    const m = stream?.lastOf(decisionSubjectOf(tenant, opId, actor));
    return m ? structuredClone(m.body) : null;
  }

  async decisionOf(
    tenant: string,
    opId: string,
    actor: string,
    submissionIds: readonly string[],
  ): Promise<DecisionRecord | null> {
    const stream = this.#decisions.get(tenant);
    stream?.tidy(this.#now());
    const m = stream
      ?.messagesOf(decisionSubjectOf(tenant, opId, actor))
      .findLast((x) => submissionIds.includes(x.body.submissionId));
    return m ? structuredClone(m.body) : null;
  }

  async readIntent(tenant: string, seq: number): Promise<StoredIntent | null> {
    const stream = this.#intents.get(tenant);
    stream?.tidy(this.#now());
    const m = stream?.get(seq);
    return m
      ? structuredClone({ seq: m.seq, subject: m.subject, data: m.body.data, submissionId: m.body.submissionId })
      : null;
  }

  async deleteIntent(tenant: string, seq: number): Promise<void> {
    this.#intents.get(tenant)?.delete(seq);
  }

  /**
   * Stores an intent as the tenant's intake would (`subject` names the submitting actor); returns
   * its sequence in the tenant's intake (each tenant has its own, from 1). The submission id is its
   * msg id, as the client publishes it: a resubmission inside the duplicate window returns the first
   * one's sequence and stores nothing (even when that intent was deleted since, as JetStream does).
   */
  addIntent(tenant: string, subject: string, data: Uint8Array, submissionId?: string): number {
    const stream = streamOf(this.#intents, tenant, () => new MemStream<IntentBody>(this.#windowMs, undefined));
    const now = this.#now();
    stream.tidy(now);
    const id = submissionId || undefined;
    const first = id === undefined ? undefined : stream.firstCopy(id);
    return first ?? stream.store(subject, { data: new Uint8Array(data), submissionId: id }, id, now);
  }

  /** Every event of an operation still stored, oldest first (for tests: the history a replay checks). */
  history(tenant: string, opId: string): OperationEvent[] {
    this.#events.tidy(this.#now());
    return this.#events.messagesOf(subjectOf(tenant, opId)).map((m) => structuredClone(m.body));
  }

  /**
   * Removes the stored event at `seq`, as a stream's message deletion would: its event id stays in
   * the window, and its operation's last sequence falls back to its previous event still stored.
   */
  deleteEvent(seq: number): void {
    this.#events.delete(seq);
  }

  /**
   * How many message ids the duplicate windows of all its streams remember (for tests: an id is
   * forgotten, lazily, once older than the window).
   */
  rememberedIds(): number {
    let n = this.#events.rememberedIds;
    for (const s of [...this.#decisions.values(), ...this.#intents.values()]) n += s.rememberedIds;
    return n;
  }
}

function streamOf<T>(streams: Map<string, MemStream<T>>, tenant: string, create: () => MemStream<T>): MemStream<T> {
  let s = streams.get(tenant);
  if (!s) streams.set(tenant, (s = create()));
  return s;
}

function subjectOf(tenant: string, opId: string): string {
  return `${tenant}.${opId}`;
}

function decisionSubjectOf(tenant: string, opId: string, actor: string): string {
  return `${tenant}.${opId}.${actor}`;
}
