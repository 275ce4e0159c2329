/**
 * Restate and DBOS on the peers workload, run by the peers bench itself (`--peers DIR`: a writable
 * copy of it, whose README says how it is made): one `run.sh` per round and system
 * (`PEERS=<system> RUNS=1`, with this run's N, C, SEQ_N, WARMUP and DUP_FRAC, no fsync probe), its
 * figures read from the JSON it writes (`results/<stamp>/<system>-r1.json`, lib/workload.mjs:
 * throughput, latencies, errors, CPU ms per call of its client and servers from /proc, lines per
 * key). Its fsync count comes from a separate `FSYNC_PROBE=1 RUNS=0` run (strace -c on its servers
 * during an untimed main phase; `fsync-probe.json`).
 *
 * Peak RSS is not in its JSON: while `run.sh` runs, every process below it (and PostgreSQL, which
 * runs as a daemon) is read from `/proc/<pid>/status` (`VmHWM`, kB) once a second and the highest
 * value per process kept, named `restate-server`, `postgres` (the highest of the postmaster and its
 * backends), or `node <script>`. The system's `rssPeakMB` leaves Restate's load-driving client
 * (`node client.mjs`) out, as tooltx's leaves out the bench's own process; DBOS's `node bench.mjs`
 * counts, since its workflows run in it. The polling reads a few hundred small /proc files a
 * second on this machine's own CPUs; a peak between the last poll and a process's exit is missed.
 */
import { spawn } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { basename, join } from 'node:path';
import { z } from 'zod';
import { round3, type PhaseFigures, type PhaseName, type WorkloadSizes } from './workload.js';
import type { RoundFigures } from './peers.js';

export const EXTERNAL_PEERS = ['restate', 'dbos'] as const;
export type ExternalPeer = (typeof EXTERNAL_PEERS)[number];

const phaseSchema = z.object({
  ok: z.number(),
  errors: z.number(),
  throughput_cps: z.number(),
  p50_ms: z.number().nullable(),
  p90_ms: z.number().nullable(),
  p99_ms: z.number().nullable(),
});
/** The fields of lib/workload.mjs's result this bench reads. */
const peerResultSchema = z.object({
  peer: z.string(),
  main: phaseSchema.extend({
    cpu_ms_per_call: z.number(),
    client_cpu_ms: z.number(),
    server_cpu_ms_by_pid: z.record(z.string(), z.number()),
  }),
  dup: phaseSchema.extend({ mismatched_results: z.number(), result_differs_from_original: z.number() }),
  race: phaseSchema.extend({ mismatched_results: z.number() }),
  seq: phaseSchema,
  effects: z.object({ all: z.object({ duplicate_executions: z.number(), missing: z.number() }) }),
  sample_errors: z.array(z.string()),
});

/** The environment of one run.sh run: the workload's sizes as the peers bench names them. */
function peersEnv(peer: ExternalPeer, z: WorkloadSizes, extra: Record<string, string>): NodeJS.ProcessEnv {
  return {
    ...process.env,
    PEERS: peer,
    N: String(z.main),
    C: String(z.inFlight),
    SEQ_N: String(z.seq),
    WARMUP: String(z.warmup),
    DUP_FRAC: String(z.dupFraction),
    ...extra,
  };
}

/** Runs `bash run.sh` in `dir` with `env`; progress to `say`; resolves with its results directory. */
async function runSh(
  dir: string,
  env: NodeJS.ProcessEnv,
  say: (s: string) => void,
  onPid?: (pid: number, scratch: () => string | undefined) => () => void,
): Promise<string> {
  const child = spawn('bash', ['run.sh'], { cwd: dir, env, stdio: ['ignore', 'pipe', 'pipe'] });
  let resdir: string | undefined;
  let scratchDir: string | undefined;
  const stop = child.pid && onPid ? onPid(child.pid, () => scratchDir) : undefined;
  // Interrupted, the bench stops run.sh too (its trap then stops the servers it started), instead
  // of leaving it running on its own.
  const onSignal = (sig: NodeJS.Signals) => {
    child.kill('SIGTERM');
    process.exit(sig === 'SIGINT' ? 130 : 143);
  };
  process.once('SIGINT', onSignal).once('SIGTERM', onSignal);
  let tail = '';
  let buf = '';
  child.stderr.setEncoding('utf8');
  child.stderr.on('data', (c: string) => {
    buf += c;
    let i: number;
    while ((i = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, i);
      buf = buf.slice(i + 1);
      const m = /results -> (\S+) ; scratch -> (\S+) ;/.exec(line);
      if (m) [resdir, scratchDir] = [m[1], m[2]];
      if (/^\[run\.sh|^\[(restate|dbos)\]/.test(line)) say(`    ${line}`);
      tail = `${tail}${line}\n`.slice(-2_000);
    }
  });
  // Its stdout is the peers bench's own table (report.mjs): kept in its results directory.
  child.stdout.resume();
  const code = await new Promise<number | null>((r) => child.once('exit', r));
  process.off('SIGINT', onSignal).off('SIGTERM', onSignal);
  stop?.();
  if (code !== 0 || !resdir)
    throw new Error(`run.sh exited ${code}${resdir ? '' : ' without a results directory'}: ${tail.slice(-600)}`);
  return resdir;
}

/** One timed round of `peer` (see the file's header). */
export async function runExternalRound(
  peersDir: string,
  peer: ExternalPeer,
  z: WorkloadSizes,
  say: (s: string) => void,
): Promise<RoundFigures & { errorSamples: string[] }> {
  const rss = new Map<number, { name: string; mb: number }>();
  const resdir = await runSh(peersDir, peersEnv(peer, z, { RUNS: '1', FSYNC_PROBE: '0' }), say, (root, scratch) => {
    const poll = () => {
      for (const p of descendants(root, scratch())) {
        const mb = vmHwmMb(p);
        const name = processName(p);
        if (mb === null || name === null) continue;
        const cur = rss.get(p);
        if (!cur || mb > cur.mb) rss.set(p, { name, mb });
      }
    };
    const timer = setInterval(poll, 1_000);
    return () => clearInterval(timer);
  });
  const file = join(resdir, `${peer}-r1.json`);
  if (!existsSync(file)) throw new Error(`the peers bench wrote no ${file}`);
  const r = peerResultSchema.parse(JSON.parse(readFileSync(file, 'utf8')));
  const phase = (p: z.infer<typeof phaseSchema>): PhaseFigures => ({
    calls: p.ok,
    callsPerSecond: p.throughput_cps,
    p50_ms: p.p50_ms ?? 0,
    p90_ms: p.p90_ms ?? 0,
    p99_ms: p.p99_ms ?? 0,
    errors: p.errors,
  });
  const byName = new Map<string, number>();
  for (const { name, mb } of rss.values()) byName.set(name, Math.max(byName.get(name) ?? 0, mb));
  // The client only drives load (Restate: HTTP to its ingress); DBOS runs its workflows in it.
  const client = peer === 'restate' ? 'node client.mjs' : 'node bench.mjs';
  const serverSide = [...byName.entries()].filter(([n]) => peer !== 'restate' || n !== client);
  const cpuByProcess: Record<string, number> = {};
  for (const [pid, ms] of Object.entries(r.main.server_cpu_ms_by_pid)) {
    const name = rss.get(Number(pid))?.name ?? `pid ${pid}`;
    cpuByProcess[name] = round3((cpuByProcess[name] ?? 0) + ms / Math.max(1, r.main.ok));
  }
  cpuByProcess[client] = round3(r.main.client_cpu_ms / Math.max(1, r.main.ok));
  return {
    phases: { main: phase(r.main), dup: phase(r.dup), race: phase(r.race), seq: phase(r.seq) } as Record<
      PhaseName,
      PhaseFigures
    >,
    cpuMsPerCall: r.main.cpu_ms_per_call,
    cpuMsPerCallByProcess: cpuByProcess,
    duplicates: r.effects.all.duplicate_executions,
    missing: r.effects.all.missing,
    mismatches: r.dup.mismatched_results + r.dup.result_differs_from_original + r.race.mismatched_results,
    rssPeakMB: serverSide.length ? round3(Math.max(...serverSide.map(([, mb]) => mb))) : null,
    rssPeakMBByProcess: Object.fromEntries([...byName.entries()].map(([n, mb]) => [n, round3(mb)])),
    errorSamples: r.sample_errors,
  };
}

/** fsync-family calls per call of `peer`'s servers, from the peers bench's own untimed strace probe. */
export async function externalFsyncsPerCall(
  peersDir: string,
  peer: ExternalPeer,
  z: WorkloadSizes,
  probeCalls: number,
  say: (s: string) => void,
): Promise<number | null> {
  const resdir = await runSh(
    peersDir,
    peersEnv(peer, z, { RUNS: '0', FSYNC_PROBE: '1', PROBE_N: String(probeCalls) }),
    say,
  );
  const file = join(resdir, 'fsync-probe.json');
  if (!existsSync(file)) return null;
  const probe = JSON.parse(readFileSync(file, 'utf8')) as Record<string, { syncs_per_call?: number }>;
  return probe[peer]?.syncs_per_call ?? null;
}

/**
 * Every live process below `root` (not `root` itself), from `/proc/<pid>/stat`'s ppid (field 4),
 * and below any process whose command line names `scratch` (the run's scratch directory): `pg_ctl`
 * starts PostgreSQL as a daemon, which init adopts, with its data directory there.
 */
function descendants(root: number, scratch: string | undefined): number[] {
  const parent = new Map<number, number>();
  const roots = new Set([root]);
  for (const e of readdirSync('/proc')) {
    if (!/^\d+$/.test(e)) continue;
    try {
      const st = readFileSync(`/proc/${e}/stat`, 'utf8');
      parent.set(Number(e), Number(st.slice(st.lastIndexOf(')') + 2).split(' ')[1]));
      if (scratch && readFileSync(`/proc/${e}/cmdline`, 'utf8').includes(scratch)) roots.add(Number(e));
    } catch {
      // gone
    }
  }
  const out: number[] = [...roots].filter((p) => p !== root);
  const seen = new Set(roots);
  let grew = true;
  while (grew) {
    grew = false;
    for (const [pid, ppid] of parent)
      if (!seen.has(pid) && seen.has(ppid)) {
        seen.add(pid);
        out.push(pid);
        grew = true;
      }
  }
  return out;
}

/** `VmHWM` of a process in MB (proc(5)), or null when it is gone or has none (a kernel thread). */
function vmHwmMb(pid: number): number | null {
  try {
    const m = /VmHWM:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) / 1024 : null;
  } catch {
    return null;
  }
}

/** The name a peer's process is reported under, or null for the scripts' helpers (bash, curl, psql, …). */
function processName(pid: number): string | null {
  try {
    const argv = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter(Boolean);
    // postgres backends rename themselves ("postgres: checkpointer", "postgres: postgres peers_bench_dbos …").
    if (/^postgres:/.test(argv[0] ?? '')) return 'postgres';
    const exe = basename(argv[0] ?? '');
    if (exe === 'restate-server' || exe === 'postgres') return exe;
    if (exe === 'node') {
      // The peers bench's own helpers (its report, `node -e` one-liners) are not the system.
      const script = argv.slice(1).find((a) => !a.startsWith('-'));
      return script && !argv.includes('-e') && basename(script) !== 'report.mjs' ? `node ${basename(script)}` : null;
    }
    return null;
  } catch {
    return null;
  }
}
