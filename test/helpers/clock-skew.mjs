/**
 * Preload (`NODE_OPTIONS=--import=<this file>`) that shifts this process's wall clock, as a machine
 * whose clock is off would: `Date.now()`, `new Date()` and `performance.timeOrigin`. Monotonic time
 * (`performance.now()`, timers) is untouched, as it is on such a machine. Test-only.
 * - `TOOLTX_TEST_CLOCK_SKEW_MS`: the shift from the start (an integer, ms; negative = behind);
 * - `TOOLTX_TEST_CLOCK_SKEW_FILE`: a file holding the shift, re-read when it changes (polled every
 *   50 ms): the clock is stepped while the process runs, as NTP or an operator would step it.
 */
import { readFileSync, watchFile } from 'node:fs';

const parse = (raw, what) => {
  const s = String(raw).trim();
  if (!/^-?\d{1,12}$/.test(s)) throw new Error(`${what}: expected an integer number of ms, got ${JSON.stringify(s)}`);
  return Number(s);
};

let skew = parse(process.env.TOOLTX_TEST_CLOCK_SKEW_MS ?? '0', 'TOOLTX_TEST_CLOCK_SKEW_MS');
const file = process.env.TOOLTX_TEST_CLOCK_SKEW_FILE;
if (file) {
  const read = (initial) => {
    let text;
    try {
      text = readFileSync(file, 'utf8');
    } catch (err) {
      if (err?.code === 'ENOENT') return;
      throw err;
    }
    // A file caught half-written (empty) keeps the current shift; the next poll sees the whole one.
    if (!initial && text.trim() === '') return;
    skew = parse(text, file);
  };
  read(true);
  watchFile(file, { interval: 50, persistent: false }, () => read(false));
}

const RealDate = Date;
const realNow = RealDate.now.bind(RealDate);
function SkewedDate(...args) {
  if (!new.target) return new RealDate(realNow() + skew).toString();
  return args.length === 0 ? new RealDate(realNow() + skew) : new RealDate(...args);
}
SkewedDate.prototype = RealDate.prototype;
SkewedDate.now = () => realNow() + skew;
SkewedDate.parse = RealDate.parse;
SkewedDate.UTC = RealDate.UTC;
globalThis.Date = SkewedDate;
const origin = performance.timeOrigin;
Object.defineProperty(performance, 'timeOrigin', { get: () => origin + skew, configurable: true });
