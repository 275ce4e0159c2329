/**
 * Preload for `npm run bench -- --cpu-prof DIR`. Node's own `--cpu-prof` is not allowed in
 * NODE_OPTIONS and the stack spawns its processes itself, so the bench starts them with
 * `NODE_OPTIONS=--require <this file>` and `BENCH_CPU_PROF_DIR=DIR`. The V8 sampling profiler runs
 * through `node:inspector` (the in-thread session answers synchronously, so it can be stopped from
 * an 'exit' handler) and writes `<instance>-<pid>-<n>.cpuprofile` (the format of `--cpu-prof`, for
 * Chrome DevTools or `tsx bench/profile.ts DIR`):
 * - default: from start-up until the process exits (also through `process.exit()`);
 * - `BENCH_CPU_PROF_MODE=signal`: SIGUSR2 starts a profile, the next SIGUSR2 stops and writes it,
 *   so the bench profiles exactly one phase (start-up and warm-up excluded).
 * `BENCH_CPU_PROF_INTERVAL_US` sets the sampling interval (default 1000 µs).
 */
'use strict';
const dir = process.env.BENCH_CPU_PROF_DIR;
if (dir) {
  const inspector = require('node:inspector');
  const { writeFileSync, mkdirSync } = require('node:fs');
  const { join, basename, dirname } = require('node:path');
  const session = new inspector.Session();
  session.connect();
  session.post('Profiler.enable');
  session.post('Profiler.setSamplingInterval', { interval: Number(process.env.BENCH_CPU_PROF_INTERVAL_US || 1000) });
  let running = false;
  let n = 0;
  const name = () => {
    const script = process.argv[1] || 'node';
    return (
      process.env.TOOLTX_INSTANCE_ID ||
      (basename(script) === 'main.ts'
        ? basename(dirname(dirname(script)))
        : basename(script).replace(/\.[cm]?[jt]s$/, ''))
    );
  };
  const start = () => {
    session.post('Profiler.start');
    running = true;
  };
  const stop = () => {
    if (!running) return;
    running = false;
    session.post('Profiler.stop', (err, res) => {
      if (err || !res) return;
      mkdirSync(dir, { recursive: true });
      writeFileSync(join(dir, `${name()}-${process.pid}-${++n}.cpuprofile`), JSON.stringify(res.profile));
    });
  };
  if (process.env.BENCH_CPU_PROF_MODE === 'signal') process.on('SIGUSR2', () => (running ? stop() : start()));
  else start();
  process.on('exit', stop);
}
