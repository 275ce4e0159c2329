/**
 * `npm run bench` — throughput, latency, CPU, NATS messages and memory of tooltx against lower
 * bounds measured in the same run. See docs/performance.md for what the figures mean.
 *
 * One command, one run: rounds alternate A (lower bounds (a) and (b), bench/floor.ts) and B
 * (tooltx, bench/tooltx.ts), each on a fresh nats-server with the same settings (bench/server.ts:
 * file storage, R1, auth on), once per durability (`--durability`, default `fsync,os`: the server
 * fsyncs before every acknowledgement, or leaves it to the OS; docs/durability.md); medians over the
 * rounds are reported, headline figures for the first durability listed. Phases (bench/workload.ts):
 * main, dup, race, seq, then the status query. After each run the KB's rows must equal the unique
 * keys, else the bench exits 1 naming the run (so do errors it cannot account for: a service
 * restart, a receipt naming another resource).
 *
 * Options: --quick (small sizes, 1 round: CI proves it works), --sweep (main phase at 1/4/16/64
 * in flight × 2,000 and 20,000 calls), --rounds N, --json (one JSON object on the last line),
 * --cpu-prof DIR (the stack's processes write V8 CPU profiles there), --keep (keep state and logs).
 * Progress goes to stderr; the table (and the JSON line) to stdout.
 *
 * `--workload peers` measures another workload instead, tooltx beside Restate and DBOS
 * (bench/peers.ts, with --systems, --peers DIR and --fsync-probe N); `--workload kb` is the above.
 */
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { cpus, loadavg, tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { randomBytes } from 'node:crypto';
import { createRequire } from 'node:module';
import { Command } from 'commander';
import { DURABILITIES, type Durability } from '@tooltx/nats';
import { usageErrorsExitTwo } from '@tooltx/runtime';
import { startFloor } from './floor.js';
import { benchReportSchema } from './report.js';
import { runPeers } from './peers.js';
import { PEERS_SYSTEMS, type PeersSystem } from './peers-report.js';
import { natsServerVersion } from './server.js';
import { CPU_PROFILE_PRELOAD, startTooltx } from './tooltx.js';
import {
  PHASES,
  round3,
  runWorkload,
  type BenchSystem,
  type PhaseFigures,
  type PhaseName,
  type RoundResult,
  type WorkloadSizes,
} from './workload.js';

const program = usageErrorsExitTwo(new Command('tooltx-bench'))
  .description(
    'tooltx end-to-end throughput, latency, CPU, NATS messages and memory against lower bounds measured in the same run',
  )
  .option('--workload <name>', 'kb (the research KB, against lower bounds) or peers (beside Restate and DBOS)', 'kb')
  .option('--systems <list>', `peers workload: systems to measure, comma-separated (${PEERS_SYSTEMS.join(',')})`)
  .option('--peers <dir>', 'peers workload: a writable copy of the peers bench, to run restate and dbos from')
  .option(
    '--fsync-probe <n>',
    'peers workload: calls of the untimed strace pass per system (0 = none; default 1000, --quick 0)',
  )
  .option(
    '--in-flight <n>',
    'peers workload: calls in flight for every system (default 16, as the peers bench; more or fewer show where throughput stops growing)',
  )
  .option('--json', 'print one JSON object with the figures on the last line')
  .option('--quick', 'small sizes and one round (CI: proves the bench works; figures mean little)')
  .option('--sweep', 'main phase only, at 1, 4, 16 and 64 in flight and at 2,000 and 20,000 calls (one round each)')
  .option('--sweep-calls <list>', 'calls per sweep point, comma-separated', '2000,20000')
  .option('--sweep-in-flight <list>', 'calls in flight per sweep point, comma-separated', '1,4,16,64')
  .option('--rounds <n>', 'rounds of A (lower bounds) and B (tooltx), medians reported (default 3; --quick 1)')
  .option('--cpu-prof <dir>', 'the stack processes write V8 CPU profiles (.cpuprofile) into this directory')
  .option('--keep', 'keep the state directories (logs, stores)')
  .option(
    '--durability <list>',
    'nats-server durabilities to measure, comma-separated: fsync (sync_interval: always, the default deployment) and os (docs/durability.md); the first is the headline',
    'fsync,os',
  )
  .parse(process.argv);
const opts = program.opts<{
  workload: string;
  systems?: string;
  peers?: string;
  fsyncProbe?: string;
  inFlight?: string;
  json?: boolean;
  quick?: boolean;
  sweep?: boolean;
  sweepCalls: string;
  sweepInFlight: string;
  rounds?: string;
  cpuProf?: string;
  keep?: boolean;
  durability: string;
}>();
const durabilities = [...new Set(opts.durability.split(',').map((x) => x.trim()))];
for (const d of durabilities)
  if (!(DURABILITIES as readonly string[]).includes(d))
    program.error(`error: --durability: expected fsync and/or os, comma-separated, got ${JSON.stringify(d)}`, {
      exitCode: 2,
      code: 'tooltx.bench.usage',
    });
const usage = (message: string) => program.error(`error: ${message}`, { exitCode: 2, code: 'tooltx.bench.usage' });
if (opts.workload !== 'kb' && opts.workload !== 'peers')
  usage(`--workload: expected kb or peers, got ${JSON.stringify(opts.workload)}`);
if (opts.workload === 'kb' && (opts.systems !== undefined || opts.peers !== undefined || opts.fsyncProbe !== undefined))
  usage('--systems, --peers and --fsync-probe are options of --workload peers');
const peersSystems = (opts.systems ?? PEERS_SYSTEMS.join(','))
  .split(',')
  .map((x) => x.trim())
  .filter(Boolean);
for (const s of peersSystems)
  if (!(PEERS_SYSTEMS as readonly string[]).includes(s))
    usage(`--systems: expected some of ${PEERS_SYSTEMS.join(', ')}, got ${JSON.stringify(s)}`);
if (
  opts.inFlight !== undefined &&
  (opts.workload !== 'peers' ||
    !/^\d+$/.test(opts.inFlight) ||
    Number(opts.inFlight) < 1 ||
    Number(opts.inFlight) > 1024)
)
  usage(
    `--in-flight: expected a number of calls from 1 to 1024, with --workload peers; got ${JSON.stringify(opts.inFlight)}`,
  );
if (opts.fsyncProbe !== undefined && !/^\d+$/.test(opts.fsyncProbe))
  usage(`--fsync-probe: expected a number of calls, got ${JSON.stringify(opts.fsyncProbe)}`);
if (opts.peers !== undefined && !existsSync(join(opts.peers, 'run.sh')))
  usage(`--peers: ${opts.peers} has no run.sh (copy the peers bench there, as its README says)`);
/** The durability of the headline figures (the first listed), then the others. */
const [headline, ...others] = durabilities as Durability[];
const list = (s: string) =>
  s
    .split(',')
    .map((x) => Number(x.trim()))
    .filter((x) => Number.isInteger(x) && x > 0);
const say = (line: string) => process.stderr.write(`${line}\n`);

const FULL: WorkloadSizes = {
  warmup: 100,
  main: 2_000,
  inFlight: 16,
  dupFraction: 0.2,
  race: 400,
  seq: 300,
  status: 300,
};
const QUICK: WorkloadSizes = { warmup: 20, main: 200, inFlight: 16, dupFraction: 0.2, race: 40, seq: 30, status: 50 };
const sizes = opts.quick ? QUICK : FULL;
const rounds = Math.max(1, Number(opts.rounds ?? (opts.quick ? 1 : 3)));
const PREFIX = 'tooltx';
// The mean size of a tooltx lifecycle event (headers included: ~1,530 B with its signed receipt) less
// the floor's own headers (bench/trace.ts).
const PAYLOAD_BYTES = 1_420;

const root = mkdtempSync(join(tmpdir(), 'tooltx-bench-'));
const cpuProfDir = opts.cpuProf ? resolve(opts.cpuProf) : undefined;
if (cpuProfDir) {
  // The client (this process) is profiled by the same preload, on the same SIGUSR2 toggles.
  process.env.BENCH_CPU_PROF_DIR = cpuProfDir;
  process.env.BENCH_CPU_PROF_MODE = 'signal';
  createRequire(import.meta.url)(CPU_PROFILE_PRELOAD);
}
const failures: string[] = [];
const load: number[][] = [loadavg()];

type SystemName = 'a' | 'b' | 'tooltx';
let runs = 0;
async function once(which: SystemName, z: WorkloadSizes, durability: Durability = headline!): Promise<RoundResult> {
  const runId = randomBytes(4).toString('hex');
  const dir = join(root, `${++runs}-${which}-${durability}`);
  const sys: BenchSystem & { restarts?: () => number } =
    which === 'tooltx'
      ? await startTooltx({ dir, prefix: PREFIX, runId, durability, ...(cpuProfDir ? { cpuProfDir } : {}) })
      : await startFloor({
          dir,
          prefix: PREFIX,
          sqlite: which === 'b',
          payloadBytes: PAYLOAD_BYTES,
          runId,
          durability,
        });
  try {
    const r = await runWorkload(sys, z, say);
    const label = `${sys.label} (${durability}) run ${runs}`;
    if (r.rows && (r.rows.rows !== r.uniqueKeys || r.rows.duplicateRows !== 0))
      failures.push(
        `${label}: KB rows ${r.rows.rows} (beyond one per key: ${r.rows.duplicateRows}) for ${r.uniqueKeys} unique keys`,
      );
    if (r.receiptMismatches)
      failures.push(`${label}: ${r.receiptMismatches} second submissions got a receipt naming another resource`);
    const restarts = sys.restarts?.() ?? 0;
    if (restarts) failures.push(`${label}: ${restarts} service restarts`);
    if (r.errorSamples.length) say(`  ${sys.label} errors (samples): ${r.errorSamples.join(' | ')}`);
    return r;
  } finally {
    await sys.stop();
    load.push(loadavg());
    if (!opts.keep) rmSync(dir, { recursive: true, force: true });
  }
}

/** The median of each numeric leaf over `xs` (same shape); non-numbers from the first. */
function median<T>(xs: T[]): T {
  const first = xs[0] as unknown;
  if (typeof first === 'number') {
    const s = (xs as unknown as number[]).slice().sort((a, b) => a - b);
    const m = s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
    return round3(m) as unknown as T;
  }
  if (first && typeof first === 'object' && !Array.isArray(first)) {
    const out: Record<string, unknown> = {};
    for (const k of Object.keys(first))
      out[k] = median(xs.map((x) => (x as Record<string, unknown>)[k]).filter((v) => v !== undefined && v !== null));
    return out as T;
  }
  return first as T;
}

const ratio = (x: number, y: number) => (y ? round3(x / y) : 0);

// ---------------------------------------------------------------------------------------------

function systemFigures(r: RoundResult) {
  const pick = (p: PhaseFigures) => ({
    callsPerSecond: p.callsPerSecond,
    p50_ms: p.p50_ms,
    p90_ms: p.p90_ms,
    p99_ms: p.p99_ms,
    errors: p.errors,
    calls: p.calls,
  });
  return {
    ...(Object.fromEntries(PHASES.map((ph) => [ph, pick(r.phases[ph])])) as Record<PhaseName, ReturnType<typeof pick>>),
    status: r.status,
    natsServerMsgsPerCall: r.serverMsgsPerCall,
    processes: Object.fromEntries(
      Object.entries(r.processes).map(([name, p]) => [
        name,
        {
          cpuMsPerCall: p.phases.main.cpuMsPerCall,
          natsMsgsPerCall: p.phases.main.natsMsgsPerCall,
          natsInPerCall: p.phases.main.natsInPerCall,
          natsOutPerCall: p.phases.main.natsOutPerCall,
          rssPeakMB: p.rssPeakMB,
          rssStartMB: p.rssStartMB,
          seq: {
            cpuMsPerCall: p.phases.seq.cpuMsPerCall,
            natsMsgsPerCall: p.phases.seq.natsMsgsPerCall,
            natsInPerCall: p.phases.seq.natsInPerCall,
            natsOutPerCall: p.phases.seq.natsOutPerCall,
          },
        },
      ]),
    ),
  };
}

function table(rows: (string | number)[][]): string {
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => String(r[i] ?? '').length)));
  return rows
    .map((r) => r.map((c, i) => (i === 0 ? String(c).padEnd(widths[i]!) : String(c).padStart(widths[i]!))).join('  '))
    .join('\n');
}

/** The few figures compared across durabilities, per system (medians over the rounds). */
function durabilitySummary(results: Record<SystemName, RoundResult[]>) {
  const pick = (rs: RoundResult[]) => {
    const f = median(rs.map(systemFigures));
    return {
      mainCallsPerSecond: f.main.callsPerSecond,
      mainP50_ms: f.main.p50_ms,
      mainP99_ms: f.main.p99_ms,
      seqP50_ms: f.seq.p50_ms,
      dupP50_ms: f.dup.p50_ms,
      statusP50_ms: f.status.p50_ms,
      cpuMsPerCall: round3(Object.values(f.processes).reduce((sum, p) => sum + p.cpuMsPerCall, 0)),
      natsServerCpuMsPerCall: f.processes['nats-server']?.cpuMsPerCall ?? null,
    };
  };
  return { floorA: pick(results.a), floorB: pick(results.b), tooltx: pick(results.tooltx) };
}

async function standard() {
  const byDurability = Object.fromEntries(
    durabilities.map((d) => [d, { a: [] as RoundResult[], b: [] as RoundResult[], tooltx: [] as RoundResult[] }]),
  ) as unknown as Record<Durability, Record<SystemName, RoundResult[]>>;
  for (let r = 1; r <= rounds; r++) {
    for (const d of durabilities as Durability[]) {
      say(
        `bench: round ${r}/${rounds}, durability ${d} (load ${loadavg()
          .map((x) => x.toFixed(2))
          .join(' ')})`,
      );
      byDurability[d].a.push(await once('a', sizes, d));
      byDurability[d].b.push(await once('b', sizes, d));
      byDurability[d].tooltx.push(await once('tooltx', sizes, d));
    }
  }
  const results = byDurability[headline!];
  const fa = median(results.a.map(systemFigures));
  const fb = median(results.b.map(systemFigures));
  const ft = median(results.tooltx.map(systemFigures));
  const duplicates = Math.max(
    ...results.tooltx.map((r) =>
      r.rows ? r.rows.duplicateRows + Math.max(0, r.rows.rows - r.uniqueKeys - r.rows.duplicateRows) : 0,
    ),
    ...results.b.map((r) => r.rows?.duplicateRows ?? 0),
  );
  const perFigure = (f: typeof fa) =>
    Object.fromEntries([
      ...PHASES.flatMap((ph) => [
        [`${ph}.callsPerSecond`, ratio(ft[ph].callsPerSecond, f[ph].callsPerSecond)],
        [`${ph}.p50_ms`, ratio(ft[ph].p50_ms, f[ph].p50_ms)],
        [`${ph}.p90_ms`, ratio(ft[ph].p90_ms, f[ph].p90_ms)],
        [`${ph}.p99_ms`, ratio(ft[ph].p99_ms, f[ph].p99_ms)],
      ]),
      ['status.p50_ms', ratio(ft.status.p50_ms, f.status.p50_ms)],
      ['status.p99_ms', ratio(ft.status.p99_ms, f.status.p99_ms)],
    ]) as Record<string, number>;
  const ratios = {
    mainThroughput: ratio(ft.main.callsPerSecond, fa.main.callsPerSecond),
    seqP50: ratio(ft.seq.p50_ms, fa.seq.p50_ms),
    floorB: {
      mainThroughput: ratio(ft.main.callsPerSecond, fb.main.callsPerSecond),
      seqP50: ratio(ft.seq.p50_ms, fb.seq.p50_ms),
    },
    perFigure: { a: perFigure(fa), b: perFigure(fb) },
  };
  const processes = ft.processes;
  const serviceRss = Object.entries(processes)
    .filter(([n]) => !['client', 'nats-server'].includes(n))
    .map(([, p]) => p.rssPeakMB ?? 0);
  const targets = {
    mainThroughputAtLeast04xFloorA: ratios.mainThroughput >= 0.4,
    mainThroughputAtLeast1200: ft.main.callsPerSecond >= 1_200,
    seqP50AtMost5xFloorA: ratios.seqP50 <= 5,
    statusP50AtMost1ms: ft.status.p50_ms <= 1,
    noDuplicates: duplicates === 0,
    serviceRssAtMost120MB: Math.max(...serviceRss) <= 120,
  };

  // The readable table: every figure for both lower bounds and tooltx, with the ratios.
  const rowsOut: (string | number)[][] = [
    [`figure (median of ${rounds})`, 'floor (a)', 'floor (b)', 'tooltx', 'tooltx÷a', 'tooltx÷b'],
  ];
  for (const ph of PHASES) {
    for (const f of ['callsPerSecond', 'p50_ms', 'p90_ms', 'p99_ms', 'errors'] as const) {
      rowsOut.push([
        `${ph} ${f}`,
        fa[ph][f],
        fb[ph][f],
        ft[ph][f],
        f === 'errors' ? '' : ratio(ft[ph][f], fa[ph][f]),
        f === 'errors' ? '' : ratio(ft[ph][f], fb[ph][f]),
      ]);
    }
  }
  rowsOut.push([
    'status p50_ms',
    fa.status.p50_ms,
    fb.status.p50_ms,
    ft.status.p50_ms,
    ratio(ft.status.p50_ms, fa.status.p50_ms),
    ratio(ft.status.p50_ms, fb.status.p50_ms),
  ]);
  rowsOut.push([
    'status p99_ms',
    fa.status.p99_ms,
    fb.status.p99_ms,
    ft.status.p99_ms,
    ratio(ft.status.p99_ms, fa.status.p99_ms),
    ratio(ft.status.p99_ms, fb.status.p99_ms),
  ]);
  rowsOut.push([
    'nats-server msgs/call (main)',
    fa.natsServerMsgsPerCall.main,
    fb.natsServerMsgsPerCall.main,
    ft.natsServerMsgsPerCall.main,
    ratio(ft.natsServerMsgsPerCall.main, fa.natsServerMsgsPerCall.main),
    '',
  ]);
  const procRows: (string | number)[][] = [
    [
      'process (tooltx)',
      'cpu ms/call main',
      'nats msgs/call main',
      'in',
      'out',
      'cpu ms/call seq',
      'nats msgs/call seq',
      'peak RSS MB',
      'after start-up',
    ],
  ];
  for (const [name, p] of Object.entries(processes))
    procRows.push([
      name,
      p.cpuMsPerCall,
      p.natsMsgsPerCall,
      p.natsInPerCall,
      p.natsOutPerCall,
      p.seq.cpuMsPerCall,
      p.seq.natsMsgsPerCall,
      p.rssPeakMB ?? '',
      p.rssStartMB ?? '',
    ]);
  for (const [label, f] of [
    ['floor (a)', fa],
    ['floor (b)', fb],
  ] as const) {
    for (const [name, p] of Object.entries(f.processes))
      procRows.push([
        `${label} ${name}`,
        p.cpuMsPerCall,
        p.natsMsgsPerCall,
        p.natsInPerCall,
        p.natsOutPerCall,
        p.seq.cpuMsPerCall,
        p.seq.natsMsgsPerCall,
        p.rssPeakMB ?? '',
        p.rssStartMB ?? '',
      ]);
  }
  const totalCpu = (f: typeof fa) => round3(Object.values(f.processes).reduce((s, p) => s + p.cpuMsPerCall, 0));
  procRows.push([
    'total cpu ms/call: floor (a) / floor (b) / tooltx',
    `${totalCpu(fa)} / ${totalCpu(fb)} / ${totalCpu(ft)}`,
    '',
    '',
    '',
    '',
    '',
    '',
    '',
  ]);
  const durability = Object.fromEntries(
    durabilities.map((d) => [d, durabilitySummary(byDurability[d as Durability])]),
  ) as Record<Durability, ReturnType<typeof durabilitySummary>>;
  const durRows: (string | number)[][] = [
    [
      `durability (median of ${rounds})`,
      'system',
      'main calls/s',
      'main p50 ms',
      'main p99 ms',
      'seq p50 ms',
      'dup p50 ms',
      'status p50 ms',
      'cpu ms/call',
      'nats-server cpu ms/call',
    ],
  ];
  for (const d of durabilities as Durability[]) {
    for (const [label, f] of [
      ['floor (a)', durability[d].floorA],
      ['floor (b)', durability[d].floorB],
      ['tooltx', durability[d].tooltx],
    ] as const) {
      durRows.push([
        d,
        label,
        f.mainCallsPerSecond,
        f.mainP50_ms,
        f.mainP99_ms,
        f.seqP50_ms,
        f.dupP50_ms,
        f.statusP50_ms,
        f.cpuMsPerCall,
        f.natsServerCpuMsPerCall ?? '',
      ]);
    }
  }
  process.stdout.write(
    `\nheadline: durability ${headline}${others.length ? ` (also measured: ${others.join(', ')}, below)` : ''}\n\n${table(rowsOut)}\n\n${table(procRows)}\n\n${table(durRows)}\n\n`,
  );
  process.stdout.write(
    `targets: ${Object.entries(targets)
      .map(([k, v]) => `${k} ${v ? 'met' : 'NOT met'}`)
      .join(', ')}\n`,
  );
  process.stdout.write(
    `load average (1/5/15 min) at start ${load[0]!.map((x) => x.toFixed(2)).join(' ')}, at end ${load
      .at(-1)!
      .map((x) => x.toFixed(2))
      .join(' ')}\n`,
  );

  const report = {
    bench: 'tooltx',
    mode: opts.quick ? 'quick' : 'full',
    settings: settings(),
    natsServer: { version: natsServerVersion(), durability: headline },
    durability,
    lowerBound: { a: fa, b: fb },
    tooltx: ft,
    ratios,
    duplicates,
    rows: results.tooltx.map((r) => ({ expected: r.uniqueKeys, actual: r.rows?.rows ?? null })),
    processes: Object.fromEntries(Object.entries(processes).map(([n, p]) => [n, p])),
    perRound: {
      mainCallsPerSecond: {
        a: results.a.map((r) => r.phases.main.callsPerSecond),
        b: results.b.map((r) => r.phases.main.callsPerSecond),
        tooltx: results.tooltx.map((r) => r.phases.main.callsPerSecond),
      },
      seqP50: {
        a: results.a.map((r) => r.phases.seq.p50_ms),
        b: results.b.map((r) => r.phases.seq.p50_ms),
        tooltx: results.tooltx.map((r) => r.phases.seq.p50_ms),
      },
    },
    targets,
    loadAverage: { start: load[0], end: load.at(-1) },
    failures,
    ok: failures.length === 0,
  };
  benchReportSchema.parse(report);
  return report;
}

function settings() {
  return {
    natsServer: natsServerVersion(),
    durabilities,
    storage: 'file',
    replicas: 1,
    auth: 'nkeys with per-role allow-lists (tooltx auth generate)',
    kbDedup: 'off',
    logLevel: process.env.LOG_LEVEL ?? 'info',
    sizes: opts.sweep ? undefined : sizes,
    rounds: opts.sweep ? 1 : rounds,
    floorPayloadBytes: PAYLOAD_BYTES,
    cpus: cpus().length,
    node: process.version,
    cpuProfile: Boolean(opts.cpuProf),
  };
}

async function sweep() {
  const points: Record<string, unknown>[] = [];
  for (const calls of list(opts.sweepCalls)) {
    for (const inFlight of list(opts.sweepInFlight)) {
      const z: WorkloadSizes = { warmup: 100, main: calls, inFlight, dupFraction: 0, race: 0, seq: 0, status: 0 };
      say(
        `bench sweep: ${calls} calls, ${inFlight} in flight (load ${loadavg()
          .map((x) => x.toFixed(2))
          .join(' ')})`,
      );
      const a = await once('a', z);
      const t = await once('tooltx', z);
      points.push({
        calls,
        inFlight,
        floorA: a.phases.main,
        tooltx: t.phases.main,
        ratioThroughput: ratio(t.phases.main.callsPerSecond, a.phases.main.callsPerSecond),
        ratioP99: ratio(t.phases.main.p99_ms, a.phases.main.p99_ms),
        rssPeakMB: Object.fromEntries(Object.entries(t.processes).map(([n, p]) => [n, p.rssPeakMB])),
        rssStartMB: Object.fromEntries(Object.entries(t.processes).map(([n, p]) => [n, p.rssStartMB])),
        cpuMsPerCall: Object.fromEntries(Object.entries(t.processes).map(([n, p]) => [n, p.phases.main.cpuMsPerCall])),
      });
    }
  }
  type P = {
    calls: number;
    inFlight: number;
    floorA: PhaseFigures;
    tooltx: PhaseFigures;
    ratioThroughput: number;
    ratioP99: number;
    rssPeakMB: Record<string, number | null>;
  };
  const ps = points as unknown as P[];
  const names = Object.keys(ps[0]!.rssPeakMB);
  const rowsOut: (string | number)[][] = [
    [
      'calls',
      'in flight',
      'floor(a) calls/s',
      'tooltx calls/s',
      'ratio',
      'floor(a) p99',
      'tooltx p99',
      'ratio',
      ...names.map((n) => `${n} RSS MB`),
    ],
  ];
  for (const p of ps)
    rowsOut.push([
      p.calls,
      p.inFlight,
      p.floorA.callsPerSecond,
      p.tooltx.callsPerSecond,
      p.ratioThroughput,
      p.floorA.p99_ms,
      p.tooltx.p99_ms,
      p.ratioP99,
      ...names.map((n) => p.rssPeakMB[n] ?? ''),
    ]);
  process.stdout.write(
    `\n${table(rowsOut)}\n\nload average at start ${load[0]!.map((x) => x.toFixed(2)).join(' ')}, at end ${load
      .at(-1)!
      .map((x) => x.toFixed(2))
      .join(' ')}\n`,
  );
  return {
    bench: 'tooltx',
    mode: 'sweep',
    settings: settings(),
    natsServer: { version: natsServerVersion(), durability: headline },
    sweep: points,
    loadAverage: { start: load[0], end: load.at(-1) },
    failures,
    ok: failures.length === 0,
  };
}

async function peers() {
  const r = await runPeers(
    {
      quick: Boolean(opts.quick),
      sweep: Boolean(opts.sweep),
      ...(opts.rounds !== undefined ? { rounds: Number(opts.rounds) } : {}),
      systems: [...new Set(peersSystems)] as PeersSystem[],
      ...(opts.peers !== undefined ? { peersDir: resolve(opts.peers) } : {}),
      ...(opts.fsyncProbe !== undefined ? { fsyncProbeCalls: Number(opts.fsyncProbe) } : {}),
      ...(opts.inFlight !== undefined ? { inFlight: Number(opts.inFlight) } : {}),
      sweepCalls: list(opts.sweepCalls),
      root,
      keep: Boolean(opts.keep),
      ...(cpuProfDir ? { cpuProfDir } : {}),
    },
    say,
  );
  failures.push(...r.failures);
  process.stdout.write(`\n${r.table}\n`);
  return r.report;
}

let report: Record<string, unknown>;
try {
  report = opts.workload === 'peers' ? await peers() : opts.sweep ? await sweep() : await standard();
} finally {
  if (!opts.keep) rmSync(root, { recursive: true, force: true });
  else say(`bench: state kept in ${root}`);
}
for (const f of failures) say(`bench: FAILED: ${f}`);
if (opts.json) process.stdout.write(`${JSON.stringify(report)}\n`);
process.exit(failures.length ? 1 : 0);
