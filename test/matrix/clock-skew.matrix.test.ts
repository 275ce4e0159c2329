/**
 * clock-skew, the full grid (docs/clocks.md): the authorizer, the executor, the reconciler and the KB,
 * each alone, restarted with its wall clock ±2 s, ±30 s and ±10 min off, under a slow downstream
 * that does not deduplicate (one write slow inside its attempt's time, one held past it). Always 0
 * duplicate side effects; within the tolerance docs/clocks.md states (any skew for each of these),
 * every call committed with one KB row per key. nats-server is not in the grid: libfaketime cannot
 * shift a Go program's clock (docs/clocks.md). Last, the executor's clock stepped back 30 s mid-attempt.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startSkewBench, type SkewBench, type SkewedRole } from '../helpers/skew.js';
import { figure } from '../helpers/figures.js';

let bench: SkewBench;

beforeAll(async () => {
  bench = await startSkewBench();
});

afterAll(async () => {
  expect(await bench?.close()).toEqual([0, 0, 0, 0]);
});

describe('clock-skew grid', () => {
  const roles: SkewedRole[] = ['authorizer', 'executor', 'reconciler', 'kb'];
  const skews = [2_000, -2_000, 30_000, -30_000, 600_000, -600_000];
  for (const role of roles) {
    for (const skewMs of skews) {
      const label = `${skewMs > 0 ? '+' : '-'}${Math.abs(skewMs) >= 60_000 ? `${Math.abs(skewMs) / 60_000} min` : `${Math.abs(skewMs) / 1000} s`}`;
      it(`clock-skew: ${role} ${label}, restarted with it — every call committed, one KB row per key`, {
        timeout: 120_000,
      }, async ({ task }) => {
        const c = await bench.run(role, skewMs, { mode: 'restart', writes: 4 });
        const keys = c.calls.length;
        const rows = c.calls.reduce((n, x) => n + x.rows, 0);
        figure(task, {
          row: 'FM-12',
          name: 'clock-skew: KB rows / keys',
          value: `${rows}/${keys}`,
          duplicates: c.duplicates,
        });
        figure(task, {
          row: 'FM-12',
          name: 'clock-skew: committed / calls',
          value: `${c.calls.filter((x) => x.status === 'committed').length}/${keys}`,
        });
        expect(c.duplicates).toBe(0);
        expect(c.calls.map((x) => ({ status: x.status, rows: x.rows }))).toEqual(
          c.calls.map(() => ({ status: 'committed', rows: 1 })),
        );
        expect(c.calls.map((x) => x.flavour)).toEqual(['slow', 'held', 'slow', 'held']);
      });
    }
  }

  it('clock-skew: executor stepped back 30 s while its requests are out — the unknown it records still reads back, every call committed, one KB row per key', async ({
    task,
  }) => {
    const c = await bench.run('executor', -30_000, { stepAfterMs: 500 });
    figure(task, {
      row: 'FM-12',
      name: 'clock-skew: KB rows / keys',
      value: `${c.calls.reduce((n, x) => n + x.rows, 0)}/${c.calls.length}`,
      duplicates: c.duplicates,
    });
    expect(c.calls.map((x) => ({ status: x.status, rows: x.rows }))).toEqual([
      { status: 'committed', rows: 1 },
      { status: 'committed', rows: 1 },
    ]);
  });
});
