/**
 * A token bucket: `ratePerSecond` tokens a second, at most `burst` saved up. `take()` resolves when
 * a token is available, in the order asked (docs/tenancy.md: how fast one authorizer instance takes
 * one tenant's intents; the rest waits in the tenant's own stream). Clock: `performance.now()`
 * (monotonic: a wall-clock step neither floods nor stalls intake).
 */
/** The longest single wait of the bucket's timer, ms (it is set again after it). */
const MAX_WAIT_MS = 60_000;

/** One waiter: `grant(n)` once `n` ≥ 1 tokens are taken for it, or `grant(0)` when released. */
interface Waiter {
  /** Most tokens it takes at once. */
  max: number;
  grant(n: number): void;
}

export class TokenBucket {
  #rate: number;
  #burst: number;
  #tokens: number;
  #at: number;
  #queue: Waiter[] = [];
  #timer: NodeJS.Timeout | null = null;

  constructor(ratePerSecond: number, burst: number) {
    this.#rate = ratePerSecond;
    this.#burst = burst;
    this.#tokens = burst;
    this.#at = performance.now();
  }

  /** New rate and burst; tokens saved up are kept, up to the new burst. */
  set(ratePerSecond: number, burst: number): void {
    this.#refill();
    this.#rate = ratePerSecond;
    this.#burst = burst;
    this.#tokens = Math.min(this.#tokens, burst);
    // The waiters' wake-up was timed at the old rate.
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = null;
    this.#schedule();
  }

  /** Resolves once a token is taken (or the bucket is released). */
  async take(): Promise<void> {
    await this.takeUpTo(1);
  }

  /**
   * Resolves once at least one whole token is available, with as many as are taken at once, at most
   * `max`; 0 when {@link release}d first (or `max` < 1). For a taker that batches: a consumer asks
   * the server for that many messages, so what is not admitted yet waits in the stream.
   */
  takeUpTo(max: number): Promise<number> {
    if (!(max >= 1)) return Promise.resolve(0);
    this.#refill();
    if (this.#queue.length === 0 && this.#tokens >= 1) return Promise.resolve(this.#grant(max));
    return new Promise((resolve) => {
      this.#queue.push({ max, grant: resolve });
      this.#schedule();
    });
  }

  /** Returns tokens taken but not used (a pull that brought fewer messages than admitted), up to the burst. */
  giveBack(tokens: number): void {
    if (!(tokens > 0)) return;
    this.#refill();
    this.#tokens = Math.min(this.#burst, this.#tokens + tokens);
    this.#wake();
  }

  /**
   * Takes `tokens` more for work already done (its cost is known only after it): the balance may go
   * below zero, and later takers wait until it is paid back.
   */
  charge(tokens: number): void {
    if (!(tokens > 0)) return;
    this.#refill();
    this.#tokens -= tokens;
  }

  /** Lets every waiter through at once, with no token (the service is stopping: in-flight intents finish). */
  release(): void {
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = null;
    for (const w of this.#queue.splice(0)) w.grant(0);
  }

  /** Takes up to `max` whole tokens (at least one is there). */
  #grant(max: number): number {
    const n = Math.min(max, Math.floor(this.#tokens));
    this.#tokens -= n;
    return n;
  }

  #wake(): void {
    while (this.#queue.length > 0 && this.#tokens >= 1) {
      const w = this.#queue.shift()!;
      w.grant(this.#grant(w.max));
    }
  }

  #refill(): void {
    const now = performance.now();
    this.#tokens = Math.min(this.#burst, this.#tokens + ((now - this.#at) / 1_000) * this.#rate);
    this.#at = now;
  }

  #schedule(): void {
    if (this.#timer || this.#queue.length === 0) return;
    // At most a minute, then looked at again: Node runs a delay above 2^31-1 ms after 1 ms instead,
    // and a tenant paid back over days (a tiny rate, a large charge) would spin this timer.
    const waitMs = Math.min(MAX_WAIT_MS, Math.max(1, Math.ceil(((1 - this.#tokens) / this.#rate) * 1_000)));
    this.#timer = setTimeout(() => {
      this.#timer = null;
      this.#refill();
      this.#wake();
      this.#schedule();
    }, waitMs);
  }
}
