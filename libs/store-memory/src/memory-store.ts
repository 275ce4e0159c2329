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
  /** How long an event id is remembered as already appended, ms (JetStream's `duplicate_window`; default 2 min). */
  duplicateWindowMs?: number;
  /** The clock of the duplicate window, ms (default `Date.now`). */
  now?: () => number;
}

interface Stored {
  seq: number;
  subject: string;
  event: OperationEvent;
}

/**
 * An event store in this process's memory, with the JetStream store's semantics (the same contract
 * suite runs against both, test/contracts/event-store.ts): one sequence for every operation,
 * appends under the expected last sequence of the operation (first writer wins), an event id
 * remembered for a duplicate window — a retried append inside it returns the first one's sequence
 * and stores nothing — and a duplicate whose first copy is no longer stored is not taken as stored.
 *
 * For tests of deciders and service logic without a server, and for one-process experiments;
 * nothing survives the process.
 */
export class MemoryStore implements OperationStore {
  readonly #windowMs: number;
  readonly #now: () => number;
  #seq = 0;
  /** Every stored event by sequence. */
  readonly #bySeq = new Map<number, Stored>();
  /** An operation's subject → the sequence of its last event. */
  readonly #last = new Map<string, number>();
  /** Event id → the sequence it was stored at and when, for the duplicate window. */
  readonly #ids = new Map<string, { seq: number; at: number }>();
  readonly #decisions = new Map<string, DecisionRecord>();
  readonly #intents = new Map<string, Map<number, StoredIntent>>();
  #intentSeq = 0;

  constructor(o: MemoryStoreOptions = {}) {
    this.#windowMs = o.duplicateWindowMs ?? 120_000;
    this.#now = o.now ?? Date.now;
  }

  async load(tenant: string, opId: string): Promise<LoadedOperation> {
    const seq = this.#last.get(subjectOf(tenant, opId));
    const m = seq === undefined ? undefined : this.#bySeq.get(seq);
    return m ? { state: structuredClone(m.event.state), seq: m.seq } : { state: { status: 'none' }, seq: 0 };
  }

  async append(tenant: string, opId: string, event: OperationEvent, expectedSeq: number): Promise<number> {
    const subject = subjectOf(tenant, opId);
    const parsed = operationEventSchema.parse(event);
    const now = this.#now();
    const seen = this.#ids.get(parsed.eventId);
    if (seen && now - seen.at < this.#windowMs) {
      // A duplicate inside the window: believed only if the first copy is still stored, on this
      // operation, with this event id.
      const first = this.#bySeq.get(seen.seq);
      if (first && first.subject === subject && first.event.eventId === parsed.eventId) return seen.seq;
      throw new ConcurrencyError(subject, expectedSeq);
    }
    const last = this.#last.get(subject) ?? 0;
    if (last !== expectedSeq) {
      // Our own earlier append may have landed (and left the window): then the last event is ours.
      const cur = this.#bySeq.get(last);
      if (cur && cur.event.eventId === parsed.eventId) return last;
      throw new ConcurrencyError(subject, expectedSeq);
    }
    const seq = ++this.#seq;
    this.#bySeq.set(seq, { seq, subject, event: structuredClone(parsed) });
    this.#last.set(subject, seq);
    this.#ids.set(parsed.eventId, { seq, at: now });
    return seq;
  }

  async recordDecision(record: DecisionRecord, opId: string): Promise<number> {
    this.#decisions.set(`${record.tenant}/${opId}/${record.actor}`, structuredClone(decisionRecordSchema.parse(record)));
    return ++this.#seq;
  }

  async lastDecision(tenant: string, opId: string, actor: string): Promise<DecisionRecord | null> {
    const d = this.#decisions.get(`${tenant}/${opId}/${actor}`);
    return d ? structuredClone(d) : null;
  }

  async readIntent(tenant: string, seq: number): Promise<StoredIntent | null> {
    return this.#intents.get(tenant)?.get(seq) ?? null;
  }

  async deleteIntent(tenant: string, seq: number): Promise<void> {
    this.#intents.get(tenant)?.delete(seq);
  }

  /** Stores an intent as the tenant's intake would (`subject` names the submitting actor); returns its sequence. */
  addIntent(tenant: string, subject: string, data: Uint8Array, submissionId?: string): number {
    const seq = ++this.#intentSeq;
    let m = this.#intents.get(tenant);
    if (!m) this.#intents.set(tenant, (m = new Map()));
    m.set(seq, { seq, subject, data, submissionId });
    return seq;
  }

  /** Every event of an operation, oldest first (for tests: the history a replay checks). */
  history(tenant: string, opId: string): OperationEvent[] {
    const subject = subjectOf(tenant, opId);
    return [...this.#bySeq.values()].filter((m) => m.subject === subject).map((m) => structuredClone(m.event));
  }

  /** Removes the stored event at `seq`, as a stream's message deletion would; its event id stays in the window. */
  deleteEvent(seq: number): void {
    const m = this.#bySeq.get(seq);
    if (!m) return;
    this.#bySeq.delete(seq);
    if (this.#last.get(m.subject) === seq) {
      const before = [...this.#bySeq.values()].filter((x) => x.subject === m.subject).at(-1);
      if (before) this.#last.set(m.subject, before.seq);
      else this.#last.delete(m.subject);
    }
  }
}

function subjectOf(tenant: string, opId: string): string {
  return `${tenant}.${opId}`;
}
