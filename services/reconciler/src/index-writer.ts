import type { JsMsg } from '@nats-io/jetstream';
import type { KV } from '@nats-io/kv';
import { attemptEnded, type OperationRecord, type OperationStore } from '@tooltx/lifecycle';
import { opEventOf, type Settlement, type Subjects } from '@tooltx/nats';
import { ProjectionApplier, type ProjectionGuard } from '@tooltx/runtime';
import type { Logger } from '@tooltx/runtime';
import { applyStateToIndex, applyToIndex, reconcileValueSchema, type ReconcileValue } from './reconcile-index.js';

export interface IndexWriterOptions {
  subjects: Subjects;
  /** The reconcile bucket (`<prefix>_reconcile`). */
  kv: KV;
  /** Reads an operation's last state when a held event's hold ends. */
  store: OperationStore;
  log: Logger;
  /**
   * How long an `accepted` or `running` event is held before its operation is indexed, ms; 0 =
   * index every event at once. Must stay well below every contract's `runningBoundMs`: the sweep
   * sees an operation no earlier than this after its event (its due time comes from the event's
   * own times, so it is not moved).
   */
  delayMs: number;
  /**
   * Most operations held at once; beyond it the oldest hold ends early (it is indexed). Keep
   * `maxHeld × 3 + concurrency` below the durable's `max_ack_pending`, or the server stops
   * delivering (NATS docs, JetStream "Consumers").
   */
  maxHeld: number;
  /** True when the index holds a non-terminal entry for the key (the sweep's mirror of the bucket). */
  isIndexed?: (key: string) => boolean;
  /** The bucket's guard (memory storage, rebuilt when lost): nothing is decided or written before it is whole. */
  guard?: ProjectionGuard;
  /**
   * Told every event of a compensation operation (its state has `compensates`) before it is
   * indexed: the reconciler moves the original once the compensation has an outcome
   * (`linkCompensation`). A throw naks the event; it is told again on redelivery.
   */
  onCompensation?: (state: OperationRecord) => Promise<unknown>;
}

/**
 * Whether an operation that reached the state `s` may have had an open entry in the index, from
 * the state alone: an attempt after the first, a requeue, recovery evidence or a takeover are
 * indexed at once; otherwise an `accepted` or `running` event is held `delayMs` before it is
 * indexed, so an operation that ended within half of it (a margin for clock skew between
 * services) was not. What {@link IndexWriter} decides for a terminal event, and what a rebuild of
 * the index decides for an operation the log shows ended (rebuild-index.ts).
 */
export function mayHaveBeenIndexed(s: OperationRecord, delayMs: number): boolean {
  if (s.attempt > 1 || (s.requeues ?? 0) > 0 || s.evidence !== undefined || s.takeover !== undefined) return true;
  // An original once being compensated was indexed at `compensation_requested`.
  if (s.compensation !== undefined) return true;
  return s.updatedAt - s.acceptedAt >= delayMs / 2;
}

interface Hold {
  tenant: string;
  opId: string;
  timer: NodeJS.Timeout;
  /** The held messages: each settles when the hold ends. */
  held: { seq: number; type: string; resolve: () => void; reject: (err: unknown) => void }[];
}

/**
 * The reconciler's projection writer: the index of non-terminal operations
 * (`reconcile-index.ts`) without an index write for an operation that ends quickly.
 *
 * Most operations go accepted → running → committed within milliseconds; writing each into the
 * index (and then a tombstone) cost 6 NATS messages per call plus 3 deliveries of the sweep's watch
 * of the bucket, for operations the sweep never needs. So an `accepted` or `running` event is HELD,
 * unacked ({@link Settlement} `defer`, with `working()` heartbeats), for `delayMs`:
 * - its operation's terminal event arrives here first → the held messages are acked and nothing is
 *   written (a tombstone only where an entry may exist: `#mayBeIndexed`);
 * - the hold ends → the operation's LAST state is read (one direct get) and indexed if it is still
 *   open, so an instance that held only an early event never indexes an operation another instance
 *   saw end.
 * Every other event (unknown, takeovers, requeues under takeover) is indexed at once.
 *
 * Nothing is lost by holding: a crashed instance's held messages come back after `ack_wait` and
 * are held (or indexed) again; `flush()` (on shutdown) ends every hold at once. An entry that goes
 * stale all the same (a terminal event applied by one instance while another's write of the open
 * entry is not yet in its mirror) is found by the sweep when it is due: the sweep reads the
 * operation, sees it ended and writes the tombstone (`reconcile.ts`).
 *
 * Writes go through one {@link ProjectionApplier}: compare-and-set on the KV revision, ordered per
 * operation in this process, any number of instances.
 */
export class IndexWriter {
  readonly #o: IndexWriterOptions;
  readonly #applier: ProjectionApplier<ReconcileValue>;
  readonly #holds = new Map<string, Hold>();
  #flushing = false;
  /** When a hold last ended before its time (too many held): operations may be indexed sooner than `delayMs` since. */
  #lastEarlyEnd = -Infinity;

  constructor(o: IndexWriterOptions) {
    this.#o = o;
    this.#applier = new ProjectionApplier(o.kv, reconcileValueSchema, 10_000, o.guard);
  }

  /** Operations held right now. */
  get held(): number {
    return this.#holds.size;
  }

  /** The consumer-loop handler of the event log's `reconciler` durable. */
  readonly handle = async (msg: JsMsg): Promise<Settlement | void> => {
    const { log } = this.#o;
    // While the index is rebuilt, `#mayBeIndexed` could not know what it holds.
    await this.#o.guard?.ready();
    const m = opEventOf(this.#o.subjects, msg, log);
    if (m.kind === 'term') return m;
    const { key, event } = m;
    if (event.state.compensates) await this.#o.onCompensation?.(event.state);
    const status = event.state.status;
    const st = event.state;
    // Held: a first attempt's accepted or running event with nothing unusual about it. A requeue, a
    // later attempt, recovery evidence or a takeover is indexed at once: the sweep acts on those and
    // must see them (a held requeue left the entry's old time in the index, and each sweep in the
    // hold requeued again).
    const plain =
      st.attempt === 1 && (st.requeues ?? 0) === 0 && st.evidence === undefined && st.takeover === undefined;
    if (this.#o.delayMs > 0 && !this.#flushing && (status === 'accepted' || status === 'running') && plain) {
      return { kind: 'defer', settled: this.#hold(key, m.tenant, m.opId, msg.seq, event.type) };
    }
    await this.#applier.inOrder(key, async () => {
      const h = this.#holds.get(key);
      let written = false;
      if (attemptEnded(status) && !this.#mayBeIndexed(key, event.state)) {
        // Never indexed as open: nothing to take out of the index.
      } else {
        written = (await this.#applier.applyNow(key, (cur) => applyToIndex(cur, event, msg.seq))).kind === 'written';
      }
      // Held events older than this one are settled by it.
      if (h?.held.every((x) => x.seq < msg.seq)) this.#release(key, h, false);
      log.debug(
        { key, seq: msg.seq, type: event.type, deliveryCount: msg.info.deliveryCount },
        written ? 'projected' : 'projection unchanged',
      );
    });
  };

  /** Ends every hold now (each is indexed if its operation is still open) and holds nothing afterwards. */
  async flush(): Promise<void> {
    this.#flushing = true;
    await Promise.all([...this.#holds.keys()].map((k) => this.#end(k)));
  }

  #hold(key: string, tenant: string, opId: string, seq: number, type: string): Promise<void> {
    let h = this.#holds.get(key);
    if (!h) {
      h = { tenant, opId, held: [], timer: setTimeout(() => void this.#end(key), this.#o.delayMs) };
      this.#holds.set(key, h);
      if (this.#holds.size > this.#o.maxHeld) {
        this.#lastEarlyEnd = Date.now();
        void this.#end(this.#holds.keys().next().value as string);
      }
    }
    const hold = h;
    return new Promise<void>((resolve, reject) => hold.held.push({ seq, type, resolve, reject }));
  }

  /** Settles a hold's messages (acked) without writing. */
  #release(key: string, h: Hold, written: boolean): void {
    clearTimeout(h.timer);
    if (this.#holds.get(key) === h) this.#holds.delete(key);
    for (const x of h.held) {
      this.#o.log.debug({ key, seq: x.seq, type: x.type }, written ? 'projected' : 'projection unchanged');
      x.resolve();
    }
  }

  /** A hold's time is up: index the operation from its last state if it is still open. */
  async #end(key: string): Promise<void> {
    const h = this.#holds.get(key);
    if (!h) return;
    clearTimeout(h.timer);
    await this.#applier.inOrder(key, async () => {
      await this.#o.guard?.ready();
      if (this.#holds.get(key) !== h) return; // settled meanwhile by a newer event
      this.#holds.delete(key);
      try {
        const { state, seq } = await this.#o.store.load(h.tenant, h.opId);
        let written = false;
        if (state.status !== 'none' && !(attemptEnded(state.status) && !this.#mayBeIndexed(key, state))) {
          written = (await this.#applier.applyNow(key, (cur) => applyStateToIndex(cur, state, seq))).kind === 'written';
        }
        this.#release(key, h, written);
      } catch (err) {
        // The messages are nak'ed by the loop and come back: held again, or indexed.
        for (const x of h.held) x.reject(err);
      }
    });
  }

  /**
   * Whether the index may hold a non-terminal entry for `key`, which the operation's terminal state
   * `s` must then replace with a tombstone. True when this process wrote or read one, when the
   * sweep's mirror holds one, or when the operation could have been indexed anywhere: a hold ends
   * no sooner than `delayMs` after acceptance (so an operation that ended within half of it, a
   * margin for clock skew between services, was not indexed by one) unless holds were ended early
   * in the last minute; an attempt after the first, a requeue, recovery evidence or a takeover are
   * indexed at once. Otherwise no entry was written and none is needed.
   */
  #mayBeIndexed(key: string, s: OperationRecord): boolean {
    const cached = this.#applier.cached(key);
    if (cached && !cached.terminal) return true;
    if (this.#o.isIndexed?.(key)) return true;
    return mayHaveBeenIndexed(s, this.#o.delayMs) || Date.now() - this.#lastEarlyEnd < 60_000;
  }
}
