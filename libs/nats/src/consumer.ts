import type { Consumer, JetStreamClient, JetStreamManager, JsMsg } from '@nats-io/jetstream';
import type { Logger } from 'pino';
import { CodecError } from './codec.js';
import { ConcurrencyError, StoreUnavailableError } from '@tooltx/lifecycle';
import { isTransient } from './jetstream-store.js';

/**
 * What a handler asks the loop to do with its message. Handlers normally just return; the loop
 * maps thrown errors once, to ack / nak(delay) / term:
 * - `CodecError` (bytes that can never parse) → `term`;
 * - `StoreUnavailableError`, `ConcurrencyError`, transient NATS errors → `nak` with backoff;
 * - anything else → `nak` with backoff, logged as an error.
 */
export type Settlement =
  | { kind: 'ack' }
  | { kind: 'nak'; delayMs: number }
  | { kind: 'term'; reason: string }
  | Deferred;

/**
 * The handler is done with its part but the message's fate is decided later: its slot is freed at
 * once (the loop fetches more), the message stays unacked (with `working()` heartbeats, so it is
 * not redelivered meanwhile) until `settled` resolves to a settlement — or rejects, mapped like a
 * thrown error. `stop()` waits for every deferred message. The deferrer must bound how many it
 * holds below the durable's `max_ack_pending` (the server stops delivering beyond it).
 */
export interface Deferred {
  kind: 'defer';
  settled: Promise<Exclude<Settlement, Deferred> | void>;
}

export interface ConsumerLoopOptions {
  js: JetStreamClient;
  stream: string;
  durable: string;
  /** Messages handled at once; the loop never fetches more than it has free slots for. */
  concurrency: number;
  /** How long one pull request waits for messages, ms (default 5 000). */
  fetchExpiresMs?: number;
  log: Logger;
  handle: (msg: JsMsg) => Promise<Settlement | void>;
  /**
   * Admission before each pull: `take(free)` resolves with how many messages the loop may pull now
   * (at most `free`, its free slots; 0 = pull nothing and look again), and `unused(n)` gets back
   * what a pull admitted but did not bring. What is not admitted stays in the stream — not in this
   * process's memory, nor on its connection ahead of other consumers' messages (docs/tenancy.md).
   */
  admit?: { take(free: number): Promise<number>; unused(n: number): void };
}

/** A running consumer loop; `stop()` stops pulling, waits for in-flight handlers, then resolves. */
export interface ConsumerLoop {
  stop(): Promise<void>;
  /** Resolves when the loop has ended (after stop). */
  readonly done: Promise<void>;
}

/**
 * Runs a durable pull consumer with bounded concurrency. Each fetch asks for at most the free
 * slots, so no message waits in a prefetch buffer while its ack timer runs; a handler running
 * longer than a third of `ack_wait` sends `working()` heartbeats (a message not acked within
 * `ack_wait` is redelivered: NATS docs, JetStream "Consumers").
 * Each message is acked on its own; a handler may defer its message's settlement ({@link Deferred}).
 */
export async function startConsumerLoop(opts: ConsumerLoopOptions): Promise<ConsumerLoop> {
  const consumer: Consumer = await opts.js.consumers.get(opts.stream, opts.durable);
  const info = await consumer.info(true);
  const ackWaitMs = Math.max(1_000, Math.floor((info.config.ack_wait ?? 30_000_000_000) / 1_000_000));
  const heartbeatMs = Math.floor(ackWaitMs / 3);
  const expires = opts.fetchExpiresMs ?? 5_000;
  const log = opts.log.child({ stream: opts.stream, consumer: opts.durable });

  let stopping = false;
  let inFlight = 0;
  let deferred = 0;
  let slotFreed: (() => void) | null = null;
  let currentBatch: { stop(): void } | null = null;
  const idle = () => new Promise<void>((r) => (slotFreed = r));

  const failed = (m: JsMsg, err: unknown): Exclude<Settlement, Deferred> => {
    const settlement = classify(err, m.info.deliveryCount);
    const level =
      settlement.kind === 'term' ||
      !(err instanceof StoreUnavailableError || err instanceof ConcurrencyError || isTransient(err))
        ? 'error'
        : 'warn';
    log[level]({ err, seq: m.seq, deliveryCount: m.info.deliveryCount, settlement: settlement.kind }, 'handler failed');
    return settlement;
  };

  const run = async (m: JsMsg) => {
    const hb = setInterval(() => {
      try {
        m.working();
      } catch {
        // The connection is closed: the message comes back after ack_wait; the loop is ending.
      }
    }, heartbeatMs);
    let outcome: Settlement;
    try {
      outcome = (await opts.handle(m)) ?? { kind: 'ack' };
    } catch (err) {
      outcome = failed(m, err);
    }
    const settlement = outcome;
    if (settlement.kind === 'defer') {
      // The slot is freed when this returns; the heartbeat runs until the deferred settlement.
      deferred++;
      void settlement.settled
        .then(
          (s) => s ?? ({ kind: 'ack' } as const),
          (err: unknown) => failed(m, err),
        )
        .then((s) => settle(m, s))
        .finally(() => {
          clearInterval(hb);
          deferred--;
          const f = slotFreed;
          slotFreed = null;
          f?.();
        });
      return;
    }
    clearInterval(hb);
    settle(m, settlement);
  };

  const settle = (m: JsMsg, settlement: Exclude<Settlement, Deferred>) => {
    if (settlement.kind === 'term')
      log.warn(
        { seq: m.seq, deliveryCount: m.info.deliveryCount, reason: settlement.reason },
        'message terminated: never redelivered',
      );
    if (settlement.kind === 'ack') m.ack();
    else if (settlement.kind === 'nak') m.nak(settlement.delayMs);
    // A bare +TERM: nats-server 2.9.10 does not recognise `+TERM <reason>` (added in 2.10), so a
    // reasoned term would be redelivered until max_deliver — a poison message holding a slot of
    // max_ack_pending all that time (1,000 garbage intents stalled
    // every tenant's intake for 25 minutes). The reason is in the handler's log line instead.
    else m.term();
  };

  const loop = async () => {
    let failures = 0;
    while (!stopping) {
      if (inFlight >= opts.concurrency) {
        await idle();
        continue;
      }
      let admitted = opts.concurrency - inFlight;
      if (opts.admit) {
        admitted = await opts.admit.take(admitted);
        if (stopping || admitted < 1) {
          if (admitted > 0) opts.admit.unused(admitted);
          continue;
        }
      }
      let brought = 0;
      try {
        const batch = await consumer.fetch({ max_messages: admitted, expires });
        currentBatch = batch;
        for await (const m of batch) {
          brought++;
          inFlight++;
          void run(m).finally(() => {
            inFlight--;
            const f = slotFreed;
            slotFreed = null;
            f?.();
          });
        }
        failures = 0;
      } catch (err) {
        if (stopping) break;
        failures++;
        log.warn({ err, failures }, 'fetch failed; retrying');
        await new Promise((r) => setTimeout(r, Math.min(5_000, 100 * 2 ** failures)));
      } finally {
        currentBatch = null;
        if (opts.admit && brought < admitted) opts.admit.unused(admitted - brought);
      }
    }
    while (inFlight > 0 || deferred > 0) await idle();
  };

  const done = loop();
  return {
    done,
    async stop() {
      stopping = true;
      currentBatch?.stop();
      const f = slotFreed as (() => void) | null;
      slotFreed = null;
      f?.();
      await done;
    },
  };
}

function classify(err: unknown, deliveryCount: number): Exclude<Settlement, Deferred> {
  if (err instanceof CodecError) return { kind: 'term', reason: 'undecodable' };
  return { kind: 'nak', delayMs: Math.min(30_000, 250 * 2 ** Math.min(7, deliveryCount - 1)) };
}

/**
 * How many keys (operations) a deferring handler may hold at once on `durable` so that their unacked
 * messages (`perKey` each) plus the loop's `concurrency` stay under the durable's `max_ack_pending`,
 * beyond which the server stops delivering (NATS docs, JetStream "Consumers"). Per instance:
 * several instances of one durable share the server's limit.
 */
export async function heldLimit(
  jsm: JetStreamManager,
  stream: string,
  durable: string,
  concurrency: number,
  perKey = 3,
): Promise<number> {
  const { config } = await jsm.consumers.info(stream, durable);
  return Math.max(1, Math.floor(((config.max_ack_pending ?? 1_000) - concurrency) / perKey));
}
