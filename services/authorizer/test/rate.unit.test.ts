import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { TokenBucket } from '../src/rate.js';

describe('a tenant\'s intake pace (docs/tenancy.md)', () => {
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
});
