import { describe, expect, it } from 'vitest';
import type { Deferred, Settlement } from '@tooltx/nats';
import { join } from '../src/event-log-fanout.js';

const ack = { kind: 'ack' } as const;
const nak = (delayMs: number) => ({ kind: 'nak', delayMs }) as const;
const term = { kind: 'term', reason: 'undecodable' } as const;
const deferred = (s: Exclude<Settlement, Deferred> | void) => ({ kind: 'defer', settled: Promise.resolve(s) }) as const;

describe('the settlement of one event-log message read once for several roles', () => {
  it('is an ack when every handler acks or returns nothing', () => {
    expect(join([ack, undefined, ack])).toEqual(ack);
  });

  it('is a nak when any handler naks, with the longest delay (a wait for an attempt deadline is never cut short)', () => {
    expect(join([ack, nak(250), nak(4_000), ack])).toEqual(nak(4_000));
    expect(join([term, nak(250)])).toEqual(nak(250));
  });

  it('is a term only when some handler terms and none naks', () => {
    expect(join([ack, term])).toEqual(term);
  });

  it('waits for every deferred handler, then joins all of them', async () => {
    const s = join([ack, deferred(undefined), deferred(nak(1_000))]);
    expect(s.kind).toBe('defer');
    if (s.kind !== 'defer') return;
    expect(await s.settled).toEqual(nak(1_000));
    const all = join([deferred(ack), undefined]);
    if (all.kind !== 'defer') throw new Error('deferred');
    expect(await all.settled).toEqual(ack);
  });

  it("rejects when a deferred handler's settlement rejects (the loop naks it with backoff)", async () => {
    const s = join([ack, { kind: 'defer', settled: Promise.reject(new Error('store unavailable')) }]);
    if (s.kind !== 'defer') throw new Error('deferred');
    await expect(s.settled).rejects.toThrow('store unavailable');
  });
});
