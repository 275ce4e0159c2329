import type { DecisionRecord, OperationEvent, OperationState } from './events.js';

/**
 * What the lifecycle needs of an event store, and what every store (the JetStream adapter in
 * `@tooltx/nats`, the in-memory one in `@tooltx/store-memory`) guarantees. One contract test suite
 * (test/contracts/event-store.ts) runs against each.
 *
 * An operation is one stream of events (`tenant`, `opId`; on JetStream the subject
 * `<p>.op.<tenant>.<opId>` of the events stream). A store keeps one sequence for the events of all
 * operations; an operation's sequence is the store sequence of its last event still stored (0:
 * none — when its last event is deleted, the one before it is its last; nats-server 2.10 loses it
 * when two or more remain, fixed in 2.11: test/contracts/event-store.ts). An append names the
 * sequence it was decided on and is refused with {@link ConcurrencyError} when another event was
 * appended since: first writer wins, with no time window.
 */
export interface EventStore {
  /** The operation's folded state and the sequence of its last event; `{ state: { status: 'none' }, seq: 0 }` when it has none. The state is the caller's own copy. */
  load(tenant: string, opId: string): Promise<LoadedOperation>;
  /**
   * Appends `event` if the operation's last sequence is still `expectedSeq`; returns the stored
   * sequence. Retrying the same event (same `eventId`) is the same append: inside the store's
   * duplicate window (JetStream's `duplicate_window`, a `Nats-Msg-Id` per event) it returns the
   * sequence the first copy was stored at, and nothing is stored twice; past the window the
   * operation's last event being this one is recognised as the landed append (FM-30). A duplicate
   * whose first copy is no longer stored, or was stored on another operation (an event id reused
   * there), is refused with {@link ConcurrencyError}, never taken as stored. Throws
   * {@link ConcurrencyError} when another writer appended first, {@link StoreUnavailableError} when
   * the store did not confirm (the event may or may not be stored: retry the same event), and zod's
   * error for an event a load could not read back (nothing is sent then).
   */
  append(tenant: string, opId: string, event: OperationEvent, expectedSeq: number): Promise<number>;
}

/**
 * What the services store besides operation events: the tenant's pre-acceptance decisions
 * (refusals, aliases) and the intents an operation's input is read from. Each tenant has its own
 * decision stream and its own intake (`<P>_DECISIONS_<tenant>`, `<P>_INTENTS_<tenant>`,
 * docs/tenancy.md), each with its own sequence: neither moves the events' sequence, nor another
 * tenant's.
 */
export interface OperationStore extends EventStore {
  /**
   * Records a decision on the operation's decision subject for `record.actor`
   * (`<p>.decision.<tenant>.<opId>.<actor>`) in the tenant's decision stream; returns its sequence
   * there. Never touches the operation's own events. A retried record (same `eventId`) inside the
   * duplicate window returns the first one's sequence and stores nothing; past the window it is
   * stored again (the same record, now the newest). Throws {@link StoreUnavailableError} when the
   * store did not confirm.
   */
  recordDecision(record: DecisionRecord, opId: string): Promise<number>;
  /**
   * The newest decision recorded for the operation about `actor`'s own requests (another actor's
   * never hides it), or null. The caller's own copy.
   */
  lastDecision(tenant: string, opId: string, actor: string): Promise<DecisionRecord | null>;
  /**
   * The newest decision recorded for the operation about one of `actor`'s own submissions
   * `submissionIds`, or null: later records of the same actor's other submissions never hide it
   * (several requests of one actor on one key, each judged on its own: FM-21). The caller's own copy.
   */
  decisionOf(
    tenant: string,
    opId: string,
    actor: string,
    submissionIds: readonly string[],
  ): Promise<DecisionRecord | null>;
  /**
   * A stored intent by its sequence in the tenant's intake, or null (never stored, or deleted).
   * The caller's own copy: changing its bytes changes nothing stored.
   */
  readIntent(tenant: string, seq: number): Promise<StoredIntent | null>;
  /** Deletes an intent that registered nothing (docs/tenancy.md); an intent already gone is fine. */
  deleteIntent(tenant: string, seq: number): Promise<void>;
}

/** An operation as loaded: its folded state and the sequence of its last event (0 = none). */
export interface LoadedOperation {
  state: OperationState;
  seq: number;
}

/**
 * A stored intent: its sequence in the tenant's intake, the subject it was published on
 * (`<p>.intent.<tenant>.<actor>`: its identity), its bytes and its submission id (its msg id;
 * undefined when it was published without one).
 */
export interface StoredIntent {
  seq: number;
  subject: string;
  data: Uint8Array;
  submissionId: string | undefined;
}

/**
 * Another writer appended to the operation first (on JetStream: error 10071,
 * `StreamWrongLastSequence`). Reload and decide again. The domain never sees the store's own error.
 */
export class ConcurrencyError extends Error {
  readonly subject: string;
  readonly expectedSeq: number;
  constructor(subject: string, expectedSeq: number) {
    super(`another writer appended to ${subject} after sequence ${expectedSeq}`);
    this.name = 'ConcurrencyError';
    this.subject = subject;
    this.expectedSeq = expectedSeq;
  }
}

/** The store did not answer in time or refused transiently; the append may or may not be stored. */
export class StoreUnavailableError extends Error {
  constructor(message: string, opts?: ErrorOptions) {
    super(message, opts);
    this.name = 'StoreUnavailableError';
  }
}
