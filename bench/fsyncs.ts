/**
 * Durable writes per call, by file: the bench's stack (bench/tooltx.ts, fsync durability) runs
 * `--calls` `kb.write_note` calls after a warm-up while strace(1) watches nats-server's
 * fsync-family calls; each is attributed to the file it synced (the stream or KV bucket's block).
 * A count, never a timing: strace slows the server. Usage: `tsx bench/fsyncs.ts [--calls N] [--in-flight N] [--json]`.
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { Command } from 'commander';
import { usageErrorsExitTwo } from '@tooltx/runtime';
import { startTooltx } from './tooltx.js';

const program = usageErrorsExitTwo(new Command('tooltx-bench-fsyncs'))
  .description('count nats-server fsyncs per tooltx call, by file (strace)')
  .option('--calls <n>', 'calls counted', '200')
  .option('--in-flight <n>', 'calls in flight', '16')
  .option('--warmup <n>', 'calls before counting starts', '50')
  .option('--json', 'print the figures as one JSON object on the last line')
  .parse(process.argv);
const o = program.opts<{ calls: string; inFlight: string; warmup: string; json?: boolean }>();
const calls = Number(o.calls);
const inFlight = Number(o.inFlight);
const say = (s: string) => process.stderr.write(`${s}\n`);

const dir = mkdtempSync(join(tmpdir(), 'tooltx-fsyncs-'));
const runId = randomBytes(4).toString('hex');
const sys = await startTooltx({ dir, prefix: 'tooltx', runId });
try {
  let next = 0;
  const drive = async (n: number) => {
    const end = next + n;
    await Promise.all(
      Array.from({ length: inFlight }, async () => {
        for (let k = next++; k < end; k = next++) {
          const r = await sys.call(k);
          if (!r.ok) throw new Error(`call ${k}: ${r.error}`);
        }
      }),
    );
    next = end;
  };
  say(`fsyncs: warm-up ${o.warmup} calls`);
  await drive(Number(o.warmup));
  const trace = spawn(
    'strace',
    ['-f', '-y', '-qq', '-e', 'trace=fsync,fdatasync,sync_file_range,msync', '-p', String(sys.server.pid)],
    { stdio: ['ignore', 'ignore', 'pipe'] },
  );
  let out = '';
  trace.stderr.on('data', (c: Buffer) => (out += c.toString()));
  await new Promise((r) => setTimeout(r, 1_000));
  say(`fsyncs: ${calls} calls, ${inFlight} in flight, under strace`);
  await drive(calls);
  await new Promise((r) => setTimeout(r, 1_000));
  trace.kill('SIGINT');
  await new Promise((r) => trace.once('exit', r));
  const byFile = new Map<string, number>();
  for (const line of out.split('\n')) {
    const m = /(fsync|fdatasync|sync_file_range|msync)\((\d+)<([^>]*)>/.exec(line);
    if (!m) continue;
    // …/jetstream/TOOLTX/streams/<stream>/msgs/1.blk → the stream; consumer state → its durable.
    const path = m[3]!;
    const s = /streams\/([^/]+)\/(obs\/([^/]+)|msgs)/.exec(path);
    const what = s ? (s[3] ? `${s[1]} consumer ${s[3]}` : s[1]!) : path.replace(/.*jetstream\//, '');
    byFile.set(what, (byFile.get(what) ?? 0) + 1);
  }
  const total = [...byFile.values()].reduce((a, b) => a + b, 0);
  const rows = [...byFile.entries()].sort((a, b) => b[1] - a[1]);
  for (const [what, n] of rows) console.log(`${(n / calls).toFixed(2).padStart(6)}  ${what}`);
  console.log(`${(total / calls).toFixed(2).padStart(6)}  total per call (${total} fsyncs over ${calls} calls)`);
  if (o.json)
    console.log(
      JSON.stringify({
        calls,
        inFlight,
        fsyncsPerCall: total / calls,
        byFile: Object.fromEntries(rows.map(([k, n]) => [k, n / calls])),
      }),
    );
} finally {
  await sys.stop();
  rmSync(dir, { recursive: true, force: true });
}
