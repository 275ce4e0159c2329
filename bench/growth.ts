/**
 * `npx tsx bench/growth.ts` — how each process's CPU per call changes as a tooltx run goes on
 * (the sweep's open finding: nats-server's CPU per call grew ~5× from 2,000 to 20,000 calls).
 *
 * One tooltx stack (bench/tooltx.ts: the same server settings, services and SDK as `npm run bench`),
 * `--calls` unique keys at `--in-flight`, measured in windows of `--window` calls: per window, CPU ms
 * per call of every process (/proc/<pid>/stat), NATS messages per call at the server (/varz), and
 * calls/s. With `--pprof DIR`, nats-server runs with `--profile PORT` and a Go CPU profile of
 * `--pprof-seconds` is taken at the start of the windows named by `--pprof-windows` (DIR/w<N>.pprof;
 * `python3 bench/pprof-top.py DIR/w1.pprof` prints the top functions).
 * Progress to stderr, one JSON object on the last line of stdout.
 */
import { mkdtempSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import { randomBytes } from 'node:crypto';
import { Command } from 'commander';
import { usageErrorsExitTwo } from '@tooltx/runtime';
import { cpuMsOf, serverCounts } from './proc.js';
import { freePort } from './server.js';
import { startTooltx } from './tooltx.js';
import { pool, round3 } from './workload.js';

const program = usageErrorsExitTwo(new Command('tooltx-growth'))
  .description('CPU per call of every process, window by window, over one long tooltx run')
  .option('--calls <n>', 'unique keys', '20000')
  .option('--window <n>', 'calls per measured window', '2000')
  .option('--in-flight <n>', 'calls in flight', '16')
  .option('--pprof <dir>', 'take Go CPU profiles of nats-server into this directory')
  .option('--pprof-windows <list>', 'windows (1-based) at whose start a profile is taken', '1,10')
  .option('--pprof-seconds <n>', 'length of each profile, s', '20')
  .option('--keep', 'keep the state directory')
  .parse(process.argv);
const o = program.opts<{
  calls: string;
  window: string;
  inFlight: string;
  pprof?: string;
  pprofWindows: string;
  pprofSeconds: string;
  keep?: boolean;
}>();
const say = (s: string) => process.stderr.write(`${s}\n`);
const calls = Number(o.calls);
const win = Number(o.window);
const inFlight = Number(o.inFlight);
const pprofWindows = new Set(o.pprofWindows.split(',').map(Number));

const root = mkdtempSync(join(tmpdir(), 'tooltx-growth-'));
const profPort = o.pprof ? await freePort() : 0;
if (o.pprof) mkdirSync(resolve(o.pprof), { recursive: true });
const sys = await startTooltx({
  dir: root,
  prefix: 'tooltx',
  runId: randomBytes(4).toString('hex'),
  serverArgs: o.pprof ? ['--profile', String(profPort)] : [],
});
const windows: Record<string, unknown>[] = [];
const loads: number[][] = [loadavg()];
try {
  // Warm-up, not measured.
  await pool(
    Array.from({ length: 100 }, (_, i) => i),
    inFlight,
    async (k) => void (await sys.call(k)),
  );
  let next = 100;
  for (let w = 1; next < 100 + calls; w++) {
    const keys = Array.from({ length: Math.min(win, 100 + calls - next) }, (_, i) => next + i);
    next += keys.length;
    const cpu0 = new Map(sys.processes.map((p) => [p.name, cpuMsOf(p.pid)]));
    const s0 = await serverCounts(sys.monitorUrl);
    const prof =
      o.pprof && pprofWindows.has(w)
        ? fetch(`http://127.0.0.1:${profPort}/debug/pprof/profile?seconds=${o.pprofSeconds}`)
            .then(async (r) =>
              writeFileSync(join(resolve(o.pprof!), `w${w}.pprof`), Buffer.from(await r.arrayBuffer())),
            )
            .catch((err: unknown) => say(`profile of window ${w} failed: ${String(err)}`))
        : null;
    let errors = 0;
    const t0 = performance.now();
    await pool(keys, inFlight, async (k) => {
      const r = await sys.call(k);
      if (!r.ok) errors++;
    });
    const secs = (performance.now() - t0) / 1000;
    const s1 = await serverCounts(sys.monitorUrl);
    const cpu = Object.fromEntries(
      sys.processes.map((p) => [p.name, round3((cpuMsOf(p.pid) - cpu0.get(p.name)!) / keys.length)]),
    );
    const row = {
      window: w,
      callsBefore: next - keys.length - 100,
      calls: keys.length,
      callsPerSecond: round3(keys.length / secs),
      errors,
      serverMsgsPerCall: round3((s1.in - s0.in + s1.out - s0.out) / keys.length),
      cpuMsPerCall: cpu,
      load1: round3(loadavg()[0]!),
    };
    windows.push(row);
    say(
      `window ${w} (${row.callsBefore}+${keys.length}): ${row.callsPerSecond} calls/s, nats-server ${cpu['nats-server']} ms/call, msgs/call ${row.serverMsgsPerCall}, load ${row.load1}, cpu ${JSON.stringify(cpu)}`,
    );
    await prof;
  }
} finally {
  loads.push(loadavg());
  await sys.stop();
  if (!o.keep) rmSync(root, { recursive: true, force: true });
}
process.stdout.write(
  `${JSON.stringify({ calls, window: win, inFlight, loadStart: loads[0], loadEnd: loads.at(-1), windows })}\n`,
);
