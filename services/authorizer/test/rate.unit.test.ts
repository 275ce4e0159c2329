import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { TokenBucket } from '../src/rate.js';

describe("a tenant's intake pace (docs/tenancy.md)", () => {
  beforeEach(() => vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout', 'performance'] }));
  afterEach(() => vi.useRealTimers());

  it('given a full bucket, when more than the burst is asked at once, then the burst goes at once and the rest at the rate', async () => {
    const b = new TokenBucket(100, 20);
    let taken = 0;
    for (let i = 0; i < 50; i++) void b.take().then(() => taken++);
    await vi.advanceTimersByTimeAsync(0);
    expect(taken).toBe(20);
    // 100 ms at 100/s: 10 more.
    await vi.advanceTimersByTimeAsync(100);
    expect(taken).toBe(30);
    b.release();
  });

  it('given work charged after it ran, when the balance is below zero, then later takers wait until it is paid back', async () => {
    const b = new TokenBucket(100, 1);
    await b.take();
    // An intent whose intake checks took 50 ms: 49 tokens more than the one it took.
    b.charge(49);
    let next = false;
    void b.take().then(() => (next = true));
    await vi.advanceTimersByTimeAsync(400);
    expect(next).toBe(false);
    await vi.advanceTimersByTimeAsync(120);
    expect(next).toBe(true);
  });

  it('given new limits, when set, then the new rate applies to the waiters', async () => {
    const b = new TokenBucket(1, 1);
    await b.take();
    let done = 0;
    for (let i = 0; i < 10; i++) void b.take().then(() => done++);
    b.set(1_000, 10);
    await vi.advanceTimersByTimeAsync(20);
    expect(done).toBe(10);
  });

  it('given waiters, when released (the service stops), then all go at once', async () => {
    const b = new TokenBucket(1, 1);
    await b.take();
    let done = 0;
    for (let i = 0; i < 5; i++) void b.take().then(() => done++);
    b.release();
    await vi.advanceTimersByTimeAsync(0);
    expect(done).toBe(5);
  });

  it('given a batching taker, when tokens are saved up, then it gets them all at once, at most what it asked', async () => {
    const b = new TokenBucket(10, 8);
    expect(await b.takeUpTo(5)).toBe(5);
    expect(await b.takeUpTo(64)).toBe(3);
  });

  it('given an empty bucket, when a batching taker waits, then it gets the first whole token and whatever else has come by then', async () => {
    const b = new TokenBucket(10, 8);
    await b.takeUpTo(8);
    let got = -1;
    void b.takeUpTo(64).then((n) => (got = n));
    await vi.advanceTimersByTimeAsync(99);
    expect(got).toBe(-1);
    await vi.advanceTimersByTimeAsync(1);
    expect(got).toBe(1);
  });

  it('given tokens taken for a pull that brought fewer messages, when given back, then the next taker has them, never beyond the burst', async () => {
    const b = new TokenBucket(10, 8);
    expect(await b.takeUpTo(8)).toBe(8);
    b.giveBack(6);
    expect(await b.takeUpTo(64)).toBe(6);
    b.giveBack(100);
    expect(await b.takeUpTo(64)).toBe(8);
  });

  it('given a batching taker waiting on a charged balance, when released, then it goes with no token', async () => {
    const b = new TokenBucket(10, 1);
    await b.take();
    b.charge(60);
    let got = -1;
    void b.takeUpTo(16).then((n) => (got = n));
    b.release();
    await vi.advanceTimersByTimeAsync(0);
    expect(got).toBe(0);
  });

  it('given a balance paid back over days, when a taker waits, then the timer never waits more than a minute at once (Node runs a longer delay after 1 ms: a spin)', async () => {
    const delays: number[] = [];
    const real = globalThis.setTimeout;
    const spy = vi.spyOn(globalThis, 'setTimeout').mockImplementation(((fn: () => void, ms?: number) => {
      delays.push(ms ?? 0);
      return real(fn, ms);
    }) as typeof setTimeout);
    try {
      const b = new TokenBucket(0.0005, 1);
      await b.take();
      b.charge(1_600);
      let got = -1;
      void b.takeUpTo(1).then((n) => (got = n));
      await vi.advanceTimersByTimeAsync(180_000);
      expect(got).toBe(-1);
      expect(Math.max(...delays)).toBeLessThanOrEqual(60_000);
      b.release();
      await vi.advanceTimersByTimeAsync(0);
      expect(got).toBe(0);
    } finally {
      spy.mockRestore();
    }
  });
});
