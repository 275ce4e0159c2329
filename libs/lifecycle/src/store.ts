import type { DecisionRecord, OperationEvent, OperationState } from './events.js';

/**
 * What the lifecycle needs of an event store, and what every store (the JetStream adapter in
 * `@tooltx/nats`, the in-memory one in `@tooltx/store-memory`) guarantees. One contract test suite
 * (test/contracts/event-store.ts) runs against each.
 *
 * An operation is one stream of events (`tenant`, `opId`). A store keeps one sequence for all of
 * its streams; an operation's sequence is the store sequence of its last event (0: none). An append
 * names the sequence it was decided on and is refused with {@link ConcurrencyError} when another
 * event was appended since: first writer wins, with no time window.
 */
export interface EventStore {
  /** The operation's folded state and the sequence of its last event. */
  load(tenant: string, opId: string): Promise<LoadedOperation>;
  /**
   * Appends `event` if the operation's last sequence is still `expectedSeq`; returns the stored
   * sequence. Retrying the same event (same `eventId`) is the same append: it returns the sequence
   * it was stored at, and nothing is stored twice. Throws {@link ConcurrencyError} when another
   * writer appended first, {@link StoreUnavailableError} when the store did not confirm (the event
   * may or may not be stored: retry the same event), and zod's error for an event a load could not
   * read back.
   */
  append(tenant: string, opId: string, event: OperationEvent, expectedSeq: number): Promise<number>;
}

/**
 * What the services store besides operation events: the tenant's pre-acceptance decisions
 * (refusals, aliases) and the intents an operation's input is read from.
 */
export interface OperationStore extends EventStore {
  /** Records a decision on the operation's decision subject; returns its sequence. Never touches the operation's own events. */
  recordDecision(record: DecisionRecord, opId: string): Promise<number>;
  /** The last decision recorded for an operation about `actor`'s own requests, or null. */
  lastDecision(tenant: string, opId: string, actor: string): Promise<DecisionRecord | null>;
  /** A stored intent by its sequence in the tenant's intake, or null. */
  readIntent(tenant: string, seq: number): Promise<StoredIntent | null>;
  /** Deletes an intent that registered nothing (docs/tenancy.md); an intent already gone is fine. */
  deleteIntent(tenant: string, seq: number): Promise<void>;
}

/** An operation as loaded: its folded state and the sequence of its last event (0 = none). */
export interface LoadedOperation {
  state: OperationState;
  seq: number;
}

/** A stored intent: the subject it was published on (its identity), its bytes and its submission id. */
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
