/**
 * clock-skew: exactly once whatever the clocks say (docs/clocks.md). The reconciler and the executor,
 * each alone, run with their wall clock 2 s and 30 s ahead and behind, on real processes with a KB
 * that does not deduplicate (every request that reaches its insert path is a row) behind a hop that
 * delays each key's first write: one slow but inside its attempt's time, one held past it. Every
 * call commits, and the KB holds exactly one row per key. The full grid (every process, ±2 s, ±30 s,
 * ±10 min) is in test/matrix/clock-skew.matrix.test.ts.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startSkewBench, type SkewBench, type SkewedRole } from './helpers/skew.js';
import { figure } from './helpers/figures.js';

let bench: SkewBench;

beforeAll(async () => {
  bench = await startSkewBench();
});

afterAll(async () => {
  expect(await bench?.close()).toEqual([0, 0, 0, 0]);
});

describe('clock-skew', () => {
  const grid: [SkewedRole, number][] = [
    ['reconciler', 2_000],
    ['reconciler', -2_000],
    ['reconciler', 30_000],
    ['reconciler', -30_000],
    ['executor', 2_000],
    ['executor', -2_000],
    ['executor', 30_000],
    ['executor', -30_000],
  ];
  for (const [role, skewMs] of grid) {
    it(`clock-skew: ${role} ${skewMs > 0 ? '+' : ''}${skewMs / 1000} s — every call committed, one KB row per key`, async ({
      task,
    }) => {
      const c = await bench.run(role, skewMs);
      figure(task, {
        row: 'FM-12',
        name: 'clock-skew: KB rows / keys',
        value: `${c.calls.reduce((n, x) => n + x.rows, 0)}/${c.calls.length}`,
        duplicates: c.duplicates,
      });
      expect(c.calls.map((x) => ({ flavour: x.flavour, status: x.status, rows: x.rows }))).toEqual([
        { flavour: 'slow', status: 'committed', rows: 1 },
        { flavour: 'held', status: 'committed', rows: 1 },
      ]);
      expect(c.duplicates).toBe(0);
    });
  }
});
