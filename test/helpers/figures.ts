/**
 * Figures a fault-matrix test reports for `npm run matrix` (docs/fault-matrix.md): what the test
 * measured (rows at the KB per key, final states, counts, ms), attached to the running test's
 * `task.meta`, which vitest hands to the runner's reporter with the test's result. A figure is
 * reported before the assertion that checks it, so a failing test still shows what it saw.
 *
 * The gate fields are counts the runner sums across every test of the run:
 * - `duplicates`: side effects beyond one per key (rows at the KB or the sink, minus one per key);
 * - `unknownTotal` / `unknownConverged`: operations that went through `unknown`, and how many of
 *   them then converged (`committed` or `rejected`) or were handed over (a takeover record);
 * - `unauthorisedWrites`: rows written where the caller had no right to write;
 * - `leakedCanaries`: planted secrets found anywhere they must not be;
 * - `takeoverTotal` / `takeoverComplete`: takeover records checked, and how many were complete.
 */
import type { TaskMeta } from 'vitest';
import { takeoverRecordSchema } from '@tooltx/lifecycle';
import { GATE_COUNT_NAMES, type GateCounts } from '../matrix/fault-matrix.js';

export { GATE_COUNT_NAMES, type GateCounts };

export interface Figure extends GateCounts {
  /**
   * The row the figure belongs to (`FM-27`), even for a test whose name names no row (a grid's):
   * the test then counts for that row too. Without it, every row the test's name names.
   */
  row?: string;
  /** What was measured, as a reader would say it: `kb rows for the key`. */
  name: string;
  value: number | string | boolean;
  /** `ms`, `rows`, … — printed after the value. */
  unit?: string;
}

declare module 'vitest' {
  interface TaskMeta {
    /** Figures reported with {@link figure}. */
    figures?: Figure[];
  }
}

/**
 * Reports `f` for the running test: `it('…', async ({ task }) => { …; figure(task, {…}); expect(…) })`.
 * Returns the figure's value, so it can wrap the measurement inline.
 */
export function figure<V extends Figure['value']>(task: { meta: TaskMeta }, f: Figure & { value: V }): V {
  for (const k of GATE_COUNT_NAMES) {
    const n = f[k];
    if (n !== undefined && !(Number.isInteger(n) && n >= 0))
      throw new Error(`figure ${f.name}: ${k} must be a count, got ${String(n)}`);
  }
  if (f.row !== undefined && !/^FM-\d\d$/.test(f.row))
    throw new Error(`figure ${f.name}: row must be an FM id like FM-27, got ${f.row}`);
  (task.meta.figures ??= []).push({ ...f });
  return f.value;
}

/** Side effects beyond one, for `rows` found under one key. */
export const beyondOne = (rows: number): number => Math.max(0, rows - 1);

/**
 * The `unknown` gate's counts for one operation's event types (oldest first): whether it went
 * through `unknown`, and if so whether it then converged or was handed over.
 */
export function convergence(types: readonly string[]): Pick<GateCounts, 'unknownTotal' | 'unknownConverged'> {
  const at = types.indexOf('unknown');
  if (at < 0) return { unknownTotal: 0, unknownConverged: 0 };
  const after = types.slice(at + 1);
  const settled = after.includes('takeover') || ['committed', 'rejected'].includes(types.at(-1) ?? '');
  return { unknownTotal: 1, unknownConverged: settled ? 1 : 0 };
}

/**
 * The figure of an operation that went `unknown` and was handed over: its takeover record is
 * complete when it is a valid record carrying what a person needs — the last evidence, when the
 * attempt ran and since when it was unknown, and what the probe found for a `probe_mismatch`. The
 * `unknown` counts as handed over when there is a record at all.
 */
export function takeoverFigure(record: unknown): Figure {
  const parsed = takeoverRecordSchema.safeParse(record);
  const r = parsed.success ? parsed.data : undefined;
  const complete =
    r !== undefined &&
    r.lastEvidence !== undefined &&
    r.times.runningAt !== undefined &&
    r.times.unknownSince !== undefined &&
    (r.reason !== 'probe_mismatch' || r.probed !== undefined);
  return {
    name: 'takeover record complete',
    value: complete,
    takeoverTotal: 1,
    takeoverComplete: complete ? 1 : 0,
    unknownTotal: 1,
    unknownConverged: record === undefined ? 0 : 1,
  };
}

/** The figure of rows that appeared where the write was refused (each one an unauthorised write). */
export function rowsWhereRefused(rows: number): Figure {
  return { name: 'rows written where refused', value: rows, unauthorisedWrites: Math.max(0, rows) };
}
