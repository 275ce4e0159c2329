/**
 * A token bucket: `ratePerSecond` tokens a second, at most `burst` saved up. `take()` resolves when
 * a token is available, in the order asked (docs/tenancy.md: how fast one authorizer instance takes
 * one tenant's intents; the rest waits in the tenant's own stream). Clock: `performance.now()`
 * (monotonic: a wall-clock step neither floods nor stalls intake).
 */
export class TokenBucket {
  #rate: number;
  #burst: number;
  #tokens: number;
  #at: number;
  #queue: (() => void)[] = [];
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

  /** Resolves once a token is taken. */
  take(): Promise<void> {
    this.#refill();
    if (this.#queue.length === 0 && this.#tokens >= 1) {
      this.#tokens -= 1;
      return Promise.resolve();
    }
    return new Promise((resolve) => {
      this.#queue.push(resolve);
      this.#schedule();
    });
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

  /** Lets every waiter through at once (the service is stopping: in-flight intents finish). */
  release(): void {
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = null;
    for (const r of this.#queue.splice(0)) r();
  }

  #refill(): void {
    const now = performance.now();
    this.#tokens = Math.min(this.#burst, this.#tokens + ((now - this.#at) / 1_000) * this.#rate);
    this.#at = now;
  }

  #schedule(): void {
    if (this.#timer || this.#queue.length === 0) return;
    const waitMs = Math.max(1, Math.ceil(((1 - this.#tokens) / this.#rate) * 1_000));
    this.#timer = setTimeout(() => {
      this.#timer = null;
      this.#refill();
      while (this.#queue.length > 0 && this.#tokens >= 1) {
        this.#tokens -= 1;
        this.#queue.shift()!();
      }
      this.#schedule();
    }, waitMs);
  }
}
