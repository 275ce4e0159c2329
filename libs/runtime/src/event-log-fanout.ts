import type { JetStreamClient, JetStreamManager, JsMsg } from '@nats-io/jetstream';
import {
  heldLimit,
  keepOwnAppendsForDelivery,
  startConsumerLoop,
  type ConsumerLoop,
  type Deferred,
  type Settlement,
} from '@tooltx/nats';
import type { Logger } from './logger.js';

type Handler = (msg: JsMsg) => Promise<Settlement | void>;
type Final = Exclude<Settlement, Deferred>;

/**
 * One reader of the event log for the roles of a process that consume it (executor, reconciler,
 * audit-projector in `tooltx serve`): each event is fetched, delivered and acked once on the `host`
 * durable instead of once per role's durable — four fewer deliveries and acks per event, at the
 * server and in the process (docs/performance.md). Each role registers the handler it would give
 * its own consumer loop ({@link EventLogFanout.register}); the process starts the reader once every
 * role has registered ({@link EventLogFanout.start}).
 *
 * A message's settlement is the join of its handlers': all of them run on every delivery, so each
 * must be idempotent under redelivery, as it already is on its own durable (a durable redelivers
 * too). The join: a thrown error or a rejected deferral is thrown (the loop naks it with backoff,
 * or terms it when it cannot be decoded); else `nak` when any handler naks (the longest delay: a
 * handler that waits out an attempt's deadline must not see it sooner); else `term` when any terms;
 * else `ack`. A handler that defers keeps the message unacked until it settles, like on its own
 * durable; the others' parts are done by then.
 *
 * A handler still running once the others have returned (the executor running an attempt that came
 * through the log) is waited for without holding a fetch slot, up to `concurrency` of them: the
 * projections' events keep flowing meanwhile, as they would on their own durables.
 */
export class EventLogFanout {
  readonly durable: string;
  readonly #handlers: { role: string; handle: Handler; long: boolean }[] = [];
  #loop: ConsumerLoop | undefined;
  #stopping: Promise<void> | undefined;
  #longRunning = 0;
  #slotFreed: (() => void) | undefined;

  constructor(durable: string) {
    this.durable = durable;
  }

  /** The roles registered so far (for logs and tests). */
  get roles(): string[] {
    return this.#handlers.map((h) => h.role);
  }

  /**
   * Registers `role`'s handler of event-log messages; `long`: it may run for as long as an attempt
   * (the executor), so it is waited for off the fetch slot. Returns what the role would get from
   * its own consumer loop: `stop()` stops the shared reader (idempotent: the first role to stop
   * stops it for all; it resolves when no message is in flight or waiting for a deferred settlement).
   */
  register(role: string, handle: Handler, o: { long?: boolean } = {}): Pick<ConsumerLoop, 'stop'> {
    if (this.#loop) throw new Error(`the event log's reader has started: ${role} registered too late`);
    this.#handlers.push({ role, handle, long: o.long ?? false });
    return { stop: () => this.stop() };
  }

  /**
   * How many operations one registered role may hold unacked (deferred) at once: the durable's
   * `max_ack_pending` shared between the roles that defer ({@link heldLimit}), `holders` of them.
   */
  async heldLimit(jsm: JetStreamManager, stream: string, concurrency: number, holders = 2): Promise<number> {
    return Math.max(1, Math.floor((await heldLimit(jsm, stream, this.durable, concurrency)) / holders));
  }

  /** Starts the one reader on `stream`'s `durable`; every role has registered by now. */
  async start(o: { js: JetStreamClient; stream: string; concurrency: number; log: Logger }): Promise<void> {
    if (this.#loop || this.#stopping) return;
    // The events this process appends come back here: read them as validated at the append.
    keepOwnAppendsForDelivery();
    const quick = this.#handlers.filter((h) => !h.long).map((h) => h.handle);
    const long = this.#handlers.filter((h) => h.long).map((h) => h.handle);
    const concurrency = o.concurrency;
    this.#loop = await startConsumerLoop({
      js: o.js,
      stream: o.stream,
      durable: this.durable,
      concurrency,
      log: o.log,
      handle: (msg) => this.#dispatch(msg, quick, long, concurrency),
    });
  }

  /** Stops pulling; resolves when every message taken has been settled. */
  stop(): Promise<void> {
    this.#stopping ??= (this.#loop?.stop() ?? Promise.resolve()).then(async () => {
      while (this.#longRunning > 0) await new Promise<void>((r) => (this.#slotFreed = r));
    });
    return this.#stopping;
  }

  async #dispatch(msg: JsMsg, quick: Handler[], long: Handler[], concurrency: number): Promise<Settlement | void> {
    let ended = false;
    const slow = Promise.all(long.map((h) => h(msg)));
    // Observed here whatever happens below: a quick handler's throw must not leave it unhandled.
    void slow.then(
      () => (ended = true),
      () => (ended = true),
    );
    const done = await Promise.all(quick.map((h) => h(msg)));
    if (long.length === 0) return join(done);
    // One more turn of the microtask queue: a handler with nothing to do has returned by now.
    await Promise.resolve();
    if (ended || this.#longRunning >= concurrency) return join([...done, ...(await slow)]);
    this.#longRunning++;
    const settled = slow
      .then((l) => join([...done, ...l]))
      .then((s) => (s.kind === 'defer' ? s.settled : s))
      .finally(() => {
        this.#longRunning--;
        const f = this.#slotFreed;
        this.#slotFreed = undefined;
        f?.();
      });
    return { kind: 'defer', settled };
  }
}

/** The join of every handler's settlement of one message (see {@link EventLogFanout}). */
export function join(parts: (Settlement | void)[]): Settlement {
  const deferred = parts.filter((p): p is Deferred => p?.kind === 'defer');
  if (deferred.length === 0) return joinFinal(parts.map((p) => (p ?? { kind: 'ack' }) as Final));
  return {
    kind: 'defer',
    settled: Promise.all(
      parts.map((p) =>
        p?.kind === 'defer' ? p.settled.then((s) => s ?? ({ kind: 'ack' } as const)) : (p ?? { kind: 'ack' }),
      ),
    ).then((all) => joinFinal(all as Final[])),
  };
}

function joinFinal(parts: Final[]): Final {
  let nak: Final | undefined;
  let term: Final | undefined;
  for (const p of parts) {
    if (p.kind === 'nak') nak = !nak || (nak.kind === 'nak' && p.delayMs > nak.delayMs) ? p : nak;
    else if (p.kind === 'term') term ??= p;
  }
  return nak ?? term ?? { kind: 'ack' };
}
