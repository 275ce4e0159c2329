import { z } from 'zod';

/** A duration ago as the CLI and the console take it: `500ms`, `30s`, `30m`, `24h`, `7d`. */
export const DURATION_AGO = /^(\d+)(ms|s|m|h|d)$/;
const UNIT = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000 } as const;

/** A duration as {@link DURATION_AGO} writes it (`30s`, `30m`, `4h`), in ms; null when it is not one. */
export function durationMsOf(v: string): number | null {
  const d = DURATION_AGO.exec(v);
  if (!d) return null;
  const ms = Number(d[1]) * UNIT[d[2] as keyof typeof UNIT];
  return Number.isSafeInteger(ms) ? ms : null;
}

/**
 * A point in time given as a duration ago ({@link DURATION_AGO}) or ISO-8601 with an offset
 * (`2026-11-30T06:00:00Z`; with `local: 'utc'`, also without one, read as UTC), in ms since the
 * epoch; null when it is neither, or before 1970-01-01. Pure but for `now`.
 */
export function timeSpecOf(v: string, now: number, o: { local?: 'utc' } = {}): number | null {
  const d = DURATION_AGO.exec(v);
  if (d) {
    const at = now - Number(d[1]) * UNIT[d[2] as keyof typeof UNIT];
    return Number.isSafeInteger(at) && at >= 0 ? at : null;
  }
  if (!z.iso.datetime({ offset: true, local: o.local === 'utc' }).safeParse(v).success) return null;
  const at = Date.parse(/(?:Z|[+-]\d\d:?\d\d)$/.test(v) ? v : `${v}Z`);
  return Number.isFinite(at) && at >= 0 ? at : null;
}
