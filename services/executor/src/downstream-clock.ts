/**
 * What the executor has learned of each downstream's clock: the offset (ms) to add to its own wall
 * clock to read the downstream's, from the `downstreamAt` of the downstream's answers.
 *
 * A sample taken over a request of round trip `rtt` is off by at most `rtt / 2` (the answer's time
 * lies somewhere inside the request); a sample from a shorter round trip replaces a longer one, and
 * any sample replaces one older than {@link SAMPLE_TTL_MS}, and a sample that cannot agree with the
 * one kept (their error intervals do not overlap: a clock was stepped) replaces it at once. The offset only moves the deadlines the executor sends, so a wrong one costs a
 * refused request (run again: `refused_late`) or a later recovery — never a second effect: the
 * downstream enforces the deadline by its own clock, and recovery judges by the clock its probe
 * reports (docs/clocks.md).
 */
export class DownstreamClocks {
  readonly #byDownstream = new Map<unknown, { offsetMs: number; rttMs: number; takenAt: number }>();
  readonly #elapsed: () => number;

  constructor(elapsed: () => number = () => performance.now()) {
    this.#elapsed = elapsed;
  }

  /** Whether anything was learned of `downstream`'s clock. */
  knows(downstream: unknown): boolean {
    return this.#byDownstream.has(downstream);
  }

  /** The offset to add to the local wall clock for `downstream`'s, ms (0 until something was learned). */
  offsetMs(downstream: unknown): number {
    return this.#byDownstream.get(downstream)?.offsetMs ?? 0;
  }

  /**
   * One answer of `downstream` stamped `downstreamAt` (its clock, ms since the epoch), to a request
   * sent at `sentAt` and answered at `receivedAt` (the local wall clock, ms since the epoch).
   */
  observe(downstream: unknown, downstreamAt: number | undefined, sentAt: number, receivedAt: number): void {
    if (downstreamAt === undefined || !Number.isFinite(downstreamAt)) return;
    const rttMs = Math.max(0, receivedAt - sentAt);
    const sample = { offsetMs: Math.round(downstreamAt - (sentAt + receivedAt) / 2), rttMs, takenAt: this.#elapsed() };
    const cur = this.#byDownstream.get(downstream);
    // Two samples whose error intervals do not overlap cannot both be right: a clock was stepped
    // since, and the newer sample wins at once.
    const moved = cur !== undefined && Math.abs(sample.offsetMs - cur.offsetMs) > (rttMs + cur.rttMs) / 2 + 1;
    if (!cur || moved || rttMs <= cur.rttMs || sample.takenAt - cur.takenAt > SAMPLE_TTL_MS)
      this.#byDownstream.set(downstream, sample);
  }
}

/** How long a sample is kept against samples of longer round trips, ms. */
export const SAMPLE_TTL_MS = 30_000;
