/**
 * `npm run bench -- --workload peers`: tooltx beside Restate and DBOS on the peers bench's
 * workload (its README: a copy of it runs Restate and DBOS here, `--peers DIR`), in one invocation.
 *
 * Workload (./workload.ts's phase driver, sized as the peers bench's lib/workload.mjs): warm-up 100
 * calls (not counted); main 2,000 unique keys at 16 in flight; dup 20 % of main's keys submitted
 * again after completion, two copies at once (8 pairs in flight); race 400 new keys each submitted
 * twice at the same moment; seq 300 calls one at a time. Each call's side effect is one line
 * `<key> <execId>` appended (O_APPEND, one write) to a local file; after a run the lines are counted
 * per key (./peers-effects.ts) and every key must have exactly one.
 *
 * Systems (`--systems`, comma-separated, default all):
 * - `tooltx-colocated`, `tooltx-services`: ./peers-tooltx.ts (one process for every role, or the
 *   four services as separate processes), auth on, receipts and audit on, nats-server fsyncing
 *   before every acknowledgement (`sync_interval: always`);
 * - `floor-fsync`: ./floor.ts's floor (a) on the same nats-server settings: three sequential
 *   publishes per call with msg id and expected last subject sequence, the line appended between
 *   the second and the third;
 * - `floor-shape`: ./floor-shape.ts: the co-located layout's call shape (intent stream, a worker
 *   process appending `accepted` and `committed` to the event log, the log read back into a
 *   memory-stored projection) with none of tooltx's own work, on the same server settings;
 * - `restate`, `dbos`: run by the peers bench in `--peers DIR` (./peers-external.ts).
 * Rounds (`--rounds`, default 3) run every system once each, the order rotated per round; medians
 * are reported. After the timed rounds, an untimed pass per system counts fsync-family calls of its
 * server-side processes under strace (`--fsync-probe N` calls, 0 = none). The load average
 * (`/proc/loadavg`) at start and end is printed: the machine is shared, compare within one run.
 *
 * `--sweep`: per tooltx layout, the main phase alone at each `--sweep-calls` size (default 2,000
 * and 20,000), a fresh stack each, reporting every process's peak RSS and its growth between the
 * smallest and the largest size, nats-server's beside it.
 */
import { spawn, spawnSync } from 'node:child_process';
import { mkdirSync, readFileSync, rmSync } from 'node:fs';
import { cpus, loadavg } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { startFloor } from './floor.js';
import { startFloorShape } from './floor-shape.js';
import { EXTERNAL_PEERS, externalFsyncsPerCall, runExternalRound, type ExternalPeer } from './peers-external.js';
import {
  PEERS_SYSTEMS,
  peersReportSchema,
  peersSweepSchema,
  type PeersSystem,
  type peersSystemSchema,
} from './peers-report.js';
import { startPeersTooltx } from './peers-tooltx.js';
import { natsServerVersion } from './server.js';
import {
  PHASES,
  pool,
  round3,
  runWorkload,
  type BenchSystem,
  type PhaseFigures,
  type PhaseName,
  type RoundResult,
  type WorkloadSizes,
} from './workload.js';
import type { z } from 'zod';

/** One round of one system, in the bench's terms (local systems and the peers alike). */
export interface RoundFigures {
  phases: Record<PhaseName, PhaseFigures>;
  /** Main phase, ms of CPU per call, all the system's processes. */
  cpuMsPerCall: number;
  cpuMsPerCallByProcess: Record<string, number>;
  /** Lines beyond one per key. */
  duplicates: number;
  /** Keys without a line. */
  missing: number;
  /** Second submissions whose answer named another effect than the first. */
  mismatches: number;
  /** Highest peak RSS of the server-side processes, MB. */
  rssPeakMB: number | null;
  rssPeakMBByProcess: Record<string, number | null>;
}

export interface PeersOptions {
  quick: boolean;
  sweep: boolean;
  rounds?: number;
  systems: PeersSystem[];
  /** A writable copy of the peers bench (Restate and DBOS); without it they are skipped. */
  peersDir?: string;
  /** Calls of the untimed strace pass per system; 0 = none. */
  fsyncProbeCalls?: number;
  /** Calls in flight in the main, dup and race phases and the fsync probe, every system alike (default 16). */
  inFlight?: number;
  sweepCalls: number[];
  /** Scratch directory of this run (state, logs, effect files). */
  root: string;
  keep: boolean;
  /** With `--cpu-prof`: the tooltx processes and the client write CPU profiles of the main phase here. */
  cpuProfDir?: string;
}

const FULL: WorkloadSizes = {
  warmup: 100,
  main: 2_000,
  inFlight: 16,
  dupFraction: 0.2,
  dupCopies: 2,
  race: 400,
  seq: 300,
  status: 0,
};
const QUICK: WorkloadSizes = { ...FULL, warmup: 20, main: 200, race: 40, seq: 30 };
const PREFIX = 'tooltx';
/** The floor's event payload, bytes: the KB workload's floor (a) size (a tooltx lifecycle event's mean, bench/run.ts). */
const PAYLOAD_BYTES = 1_420;
/** System calls the fsync probe counts (the peers bench's list). */
const SYNC_CALLS = 'fsync,fdatasync,sync_file_range,syncfs,sync,msync';

const isLocal = (s: PeersSystem) => !(EXTERNAL_PEERS as readonly string[]).includes(s);
const median = (xs: number[]): number => {
  const s = xs.slice().sort((a, b) => a - b);
  if (!s.length) return 0;
  return round3(s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2);
};
const loadNow = () => loadavg().map((x) => round3(x));

export async function runPeers(
  o: PeersOptions,
  say: (s: string) => void,
): Promise<{ report: Record<string, unknown>; table: string; failures: string[] }> {
  const failures: string[] = [];
  const load = [loadNow()];
  let runs = 0;

  /** Starts a local system in a fresh directory, its lines going to `<dir>/effects.log`. */
  const startLocal = (
    name: PeersSystem,
    dir: string,
    runId: string,
  ): Promise<BenchSystem & { restarts?(): number }> => {
    mkdirSync(dir, { recursive: true });
    const effectsFile = join(dir, 'effects.log');
    if (name === 'floor-fsync')
      return startFloor({
        dir,
        prefix: PREFIX,
        sqlite: false,
        payloadBytes: PAYLOAD_BYTES,
        runId,
        durability: 'fsync',
        effectsFile,
        label: 'floor-fsync',
      });
    if (name === 'floor-shape') return startFloorShape({ dir, prefix: PREFIX, runId, effectsFile });
    return startPeersTooltx({
      dir,
      layout: name === 'tooltx-colocated' ? 'colocated' : 'services',
      prefix: PREFIX,
      runId,
      effectsFile,
      ...(o.cpuProfDir ? { cpuProfDir: o.cpuProfDir } : {}),
    });
  };

  /** One run of the workload on a fresh local system. */
  const localRound = async (name: PeersSystem, z: WorkloadSizes): Promise<RoundResult> => {
    const dir = join(o.root, `${++runs}-${name}`);
    const sys = await startLocal(name, dir, randomBytes(4).toString('hex'));
    try {
      const r = await runWorkload(sys, z, say);
      say(
        `  ${name} nats-server messages in + out per call (main): ${r.serverMsgsPerCall.main}; by connection (in/out): ${Object.entries(
          r.processes,
        )
          .map(([n, p]) => `${n} ${p.phases.main?.natsInPerCall}/${p.phases.main?.natsOutPerCall}`)
          .join(', ')}`,
      );
      const restarts = sys.restarts?.() ?? 0;
      if (restarts) failures.push(`${name} run ${runs}: ${restarts} service exits while it ran`);
      if (r.errorSamples.length) say(`  ${name} errors (samples): ${r.errorSamples.join(' | ')}`);
      return r;
    } finally {
      await sys.stop();
      load.push(loadNow());
      if (!o.keep) rmSync(dir, { recursive: true, force: true });
    }
  };

  const skipped: Record<string, string> = {};
  const systems = o.systems.filter((s) => {
    if (isLocal(s)) return true;
    if (o.quick) skipped[s] = '--quick runs no peer';
    else if (!o.peersDir) skipped[s] = 'no --peers DIR (a copy of the peers bench)';
    return !skipped[s];
  });
  for (const [s, why] of Object.entries(skipped)) say(`peers: skipping ${s}: ${why}`);

  if (o.sweep) return sweep(o, systems, localRound, say, failures, load);

  const sizes = { ...(o.quick ? QUICK : FULL), ...(o.inFlight !== undefined ? { inFlight: o.inFlight } : {}) };
  const rounds = o.quick ? 1 : Math.max(1, o.rounds ?? 3);
  const results = new Map<PeersSystem, RoundFigures[]>(systems.map((s) => [s, []]));
  for (let r = 1; r <= rounds; r++) {
    const order = systems.map((_, i) => systems[(i + r - 1) % systems.length]!);
    for (const name of order) {
      if (skipped[name]) continue;
      say(
        `peers: round ${r}/${rounds}: ${name} (load ${loadavg()
          .map((x) => x.toFixed(2))
          .join(' ')})`,
      );
      try {
        const f = isLocal(name)
          ? localFigures(await localRound(name, sizes))
          : await runExternalRound(o.peersDir!, name as ExternalPeer, sizes, say);
        if (f.duplicates) failures.push(`${name} round ${r}: ${f.duplicates} lines beyond one per key`);
        if (f.mismatches)
          failures.push(`${name} round ${r}: ${f.mismatches} second submissions answered another effect`);
        results.get(name)!.push(f);
      } catch (err) {
        const why = err instanceof Error ? err.message : String(err);
        failures.push(`${name} round ${r}: ${why}`);
        skipped[name] = `failed: ${why}`;
        say(`peers: ${name} failed, not run again: ${why}`);
      }
    }
  }

  // The untimed fsync pass, after every timed round (strace slows what it watches).
  const probeCalls = o.fsyncProbeCalls ?? (o.quick ? 0 : 1_000);
  const fsyncs = new Map<PeersSystem, number | null>();
  for (const name of systems) {
    if (skipped[name] || probeCalls <= 0) continue;
    say(`peers: fsync probe: ${name} (${probeCalls} calls at ${sizes.inFlight} in flight under strace -c)`);
    try {
      fsyncs.set(
        name,
        isLocal(name)
          ? await localFsyncs(name, probeCalls, sizes.inFlight)
          : await externalFsyncsPerCall(o.peersDir!, name as ExternalPeer, sizes, probeCalls, say),
      );
    } catch (err) {
      say(`peers: fsync probe of ${name} failed: ${err instanceof Error ? err.message : String(err)}`);
    }
  }

  const out: Partial<Record<PeersSystem, z.infer<typeof peersSystemSchema>>> = {};
  for (const [name, rs] of results) if (rs.length) out[name] = aggregate(rs, fsyncs.get(name) ?? null);
  const peers = EXTERNAL_PEERS.map((p) => out[p]).filter((x) => x !== undefined);
  const best = (pick: (s: NonNullable<(typeof out)[PeersSystem]>) => number, higher: boolean) =>
    peers.length ? (higher ? Math.max : Math.min)(...peers.map(pick)) : null;
  const vs = (
    sys: PeersSystem,
    pick: (s: NonNullable<(typeof out)[PeersSystem]>) => number,
    higher: boolean,
  ): number | null => {
    const b = best(pick, higher);
    const s = out[sys];
    return s && b ? round3(pick(s) / b) : null;
  };
  const ratios = {
    colocatedVsBestPeer: vs('tooltx-colocated', (s) => s.main.callsPerSecond, true),
    servicesVsBestPeer: vs('tooltx-services', (s) => s.main.callsPerSecond, true),
    colocatedSeqP50VsBestPeer: vs('tooltx-colocated', (s) => s.seq.p50_ms, false),
    colocatedCpuVsBestPeer: vs('tooltx-colocated', (s) => s.cpuMsPerCall, false),
    colocatedDupP50VsBestPeer: vs('tooltx-colocated', (s) => s.dup.p50_ms, false),
  };
  load.push(loadNow());
  const report = {
    bench: 'tooltx',
    workload: 'peers' as const,
    mode: o.quick ? ('quick' as const) : ('full' as const),
    settings: {
      sizes,
      rounds,
      natsServer: natsServerVersion(),
      durability: 'fsync (sync_interval: always)',
      fsyncProbeCalls: probeCalls,
      peersDir: o.peersDir ?? null,
      cpus: cpus().length,
      node: process.version,
    },
    systems: out,
    ratios,
    skipped,
    loadAverage: { start: load[0]!, end: load.at(-1)! },
    failures,
    ok: failures.length === 0,
  };
  peersReportSchema.parse(report);
  return { report, table: tableOf(out, ratios, rounds, load), failures };
}

function localFigures(r: RoundResult): RoundFigures {
  const procs = Object.entries(r.processes);
  const serverSide = procs.filter(([n]) => n !== 'client').map(([, p]) => p.rssPeakMB);
  const known = serverSide.filter((x): x is number => x !== null);
  const rows = r.rows ?? { rows: 0, duplicateRows: 0 };
  return {
    phases: Object.fromEntries(PHASES.map((ph) => [ph, r.phases[ph]])) as Record<PhaseName, PhaseFigures>,
    cpuMsPerCall: round3(procs.reduce((s, [, p]) => s + p.phases.main.cpuMsPerCall, 0)),
    cpuMsPerCallByProcess: Object.fromEntries(procs.map(([n, p]) => [n, p.phases.main.cpuMsPerCall])),
    duplicates: rows.duplicateRows,
    missing: Math.max(0, r.uniqueKeys - (rows.rows - rows.duplicateRows)),
    mismatches: r.receiptMismatches,
    rssPeakMB: known.length ? Math.max(...known) : null,
    rssPeakMBByProcess: Object.fromEntries(procs.map(([n, p]) => [n, p.rssPeakMB])),
  };
}

/** Medians over the rounds; errors, duplicates and missing lines summed; peak RSS the highest. */
function aggregate(rs: RoundFigures[], fsyncsPerCall: number | null): z.infer<typeof peersSystemSchema> {
  const phase = (ph: PhaseName) => ({
    callsPerSecond: median(rs.map((r) => r.phases[ph].callsPerSecond)),
    p50_ms: median(rs.map((r) => r.phases[ph].p50_ms)),
    p90_ms: median(rs.map((r) => r.phases[ph].p90_ms)),
    p99_ms: median(rs.map((r) => r.phases[ph].p99_ms)),
    errors: rs.reduce((s, r) => s + r.phases[ph].errors, 0),
    calls: Math.round(median(rs.map((r) => r.phases[ph].calls))),
  });
  const maxOf = (xs: (number | null | undefined)[]) => {
    const k = xs.filter((x): x is number => typeof x === 'number');
    return k.length ? round3(Math.max(...k)) : null;
  };
  const names = [
    ...new Set(rs.flatMap((r) => [...Object.keys(r.cpuMsPerCallByProcess), ...Object.keys(r.rssPeakMBByProcess)])),
  ];
  return {
    main: phase('main'),
    dup: phase('dup'),
    race: phase('race'),
    seq: phase('seq'),
    cpuMsPerCall: median(rs.map((r) => r.cpuMsPerCall)),
    duplicates: rs.reduce((s, r) => s + r.duplicates, 0),
    missing: rs.reduce((s, r) => s + r.missing, 0),
    rssPeakMB: maxOf(rs.map((r) => r.rssPeakMB)),
    fsyncsPerCall,
    processes: Object.fromEntries(
      names.map((n) => {
        const cpu = rs.map((r) => r.cpuMsPerCallByProcess[n]).filter((x): x is number => x !== undefined);
        return [
          n,
          { cpuMsPerCall: cpu.length ? median(cpu) : null, rssPeakMB: maxOf(rs.map((r) => r.rssPeakMBByProcess[n])) },
        ];
      }),
    ),
    rounds: rs.length,
  };
}

/**
 * fsync-family calls per call of a local system's server-side processes (nats-server, the
 * services): a fresh system, 50 warm-up calls, then `calls` calls at `inFlight` while
 * `strace -f -c` watches those processes (the client, this process, is not traced). A count, not
 * a timing. Null when strace is not installed.
 */
async function localFsyncs(name: PeersSystem, calls: number, inFlight: number): Promise<number | null> {
  if (spawnSync('strace', ['-V']).error) return null;
  const root = join(
    process.env.TMPDIR ?? '/tmp',
    `tooltx-bench-fsyncs-${process.pid}-${randomBytes(3).toString('hex')}`,
  );
  mkdirSync(root, { recursive: true });
  const runId = randomBytes(4).toString('hex');
  const effectsFile = join(root, 'effects.log');
  const sys =
    name === 'floor-fsync'
      ? await startFloor({ dir: root, prefix: PREFIX, sqlite: false, payloadBytes: PAYLOAD_BYTES, runId, effectsFile })
      : name === 'floor-shape'
        ? await startFloorShape({ dir: root, prefix: PREFIX, runId, effectsFile })
        : await startPeersTooltx({
            dir: root,
            layout: name === 'tooltx-colocated' ? 'colocated' : 'services',
            prefix: PREFIX,
            runId,
            effectsFile,
          });
  try {
    const drive = async (from: number, n: number) =>
      pool(
        Array.from({ length: n }, (_, i) => from + i),
        inFlight,
        async (k) => {
          const r = await sys.call(k);
          if (!r.ok) throw new Error(`call ${k}: ${r.error}`);
        },
      );
    await drive(0, 50);
    const out = join(root, 'strace.txt');
    const pids = sys.processes.filter((p) => p.name !== 'client').flatMap((p) => ['-p', String(p.pid)]);
    const trace = spawn('strace', ['-f', '-c', '-qq', '-e', `trace=${SYNC_CALLS}`, '-o', out, ...pids], {
      stdio: 'ignore',
    });
    await new Promise((r) => setTimeout(r, 1_500));
    await drive(50, calls);
    trace.kill('SIGINT');
    await new Promise((r) => trace.once('exit', r));
    // strace -c's table: "% time  seconds  usecs/call  calls  [errors]  syscall", then a "total" row.
    let total = 0;
    for (const line of readFileSync(out, 'utf8').split('\n')) {
      const f = line.trim().split(/\s+/);
      if (f.length >= 5 && /^\d+$/.test(f[3]!) && f.at(-1) !== 'total') total += Number(f[3]);
    }
    return round3(total / calls);
  } finally {
    await sys.stop();
    rmSync(root, { recursive: true, force: true });
  }
}

function table(rows: (string | number)[][]): string {
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => String(r[i] ?? '').length)));
  return rows
    .map((r) => r.map((c, i) => (i === 0 ? String(c).padEnd(widths[i]!) : String(c).padStart(widths[i]!))).join('  '))
    .join('\n');
}

function tableOf(
  out: Partial<Record<PeersSystem, z.infer<typeof peersSystemSchema>>>,
  ratios: Record<string, number | null>,
  rounds: number,
  load: number[][],
): string {
  const f = (x: number | null | undefined, d = 1) => (x === null || x === undefined ? '–' : x.toFixed(d));
  const rows: (string | number)[][] = [
    [
      `system (median of ${rounds})`,
      'main calls/s',
      'p50 ms',
      'p99 ms',
      'dup p50/p99',
      'race p50/p99',
      'seq p50/p99',
      'errors',
      'cpu ms/call',
      'fsyncs/call',
      'dups',
      'missing',
      'peak RSS MB',
    ],
  ];
  const procRows: (string | number)[][] = [['system / process', 'cpu ms/call (main)', 'peak RSS MB']];
  for (const name of PEERS_SYSTEMS) {
    const s = out[name];
    if (!s) continue;
    rows.push([
      name,
      f(s.main.callsPerSecond, 0),
      f(s.main.p50_ms, 2),
      f(s.main.p99_ms, 2),
      `${f(s.dup.p50_ms, 2)} / ${f(s.dup.p99_ms, 2)}`,
      `${f(s.race.p50_ms, 2)} / ${f(s.race.p99_ms, 2)}`,
      `${f(s.seq.p50_ms, 2)} / ${f(s.seq.p99_ms, 2)}`,
      PHASES.reduce((a, ph) => a + s[ph].errors, 0),
      f(s.cpuMsPerCall, 2),
      f(s.fsyncsPerCall, 2),
      s.duplicates,
      s.missing,
      f(s.rssPeakMB, 0),
    ]);
    for (const [p, v] of Object.entries(s.processes))
      procRows.push([`${name} / ${p}`, f(v.cpuMsPerCall, 3), f(v.rssPeakMB, 1)]);
  }
  const l = (x: number[]) => x.map((v) => v.toFixed(2)).join(' ');
  return [
    table(rows),
    table(procRows),
    `ratios (tooltx ÷ the better of restate and dbos): ${Object.entries(ratios)
      .map(([k, v]) => `${k} ${v ?? '–'}`)
      .join(', ')}`,
    `load average (1/5/15 min) at start ${l(load[0]!)}, at end ${l(load.at(-1)!)}`,
  ].join('\n\n');
}

async function sweep(
  o: PeersOptions,
  systems: PeersSystem[],
  localRound: (name: PeersSystem, z: WorkloadSizes) => Promise<RoundResult>,
  say: (s: string) => void,
  failures: string[],
  load: number[][],
): Promise<{ report: Record<string, unknown>; table: string; failures: string[] }> {
  const layouts = systems.filter((s) => s === 'tooltx-colocated' || s === 'tooltx-services');
  const sizes = o.sweepCalls.slice().sort((a, b) => a - b);
  const result: Record<
    string,
    {
      points: {
        calls: number;
        callsPerSecond: number;
        p99_ms: number;
        errors: number;
        rssPeakMB: Record<string, number | null>;
      }[];
      rssGrowthMB: Record<string, number | null>;
    }
  > = {};
  for (const layout of layouts) {
    const points: (typeof result)[string]['points'] = [];
    for (const calls of sizes) {
      say(
        `peers sweep: ${layout}, ${calls} calls (load ${loadavg()
          .map((x) => x.toFixed(2))
          .join(' ')})`,
      );
      try {
        const r = await localRound(layout, {
          ...(o.quick ? QUICK : FULL),
          main: calls,
          dupFraction: 0,
          race: 0,
          seq: 0,
        });
        points.push({
          calls,
          callsPerSecond: r.phases.main.callsPerSecond,
          p99_ms: r.phases.main.p99_ms,
          errors: r.phases.main.errors,
          // The client is the bench's own process: its peak covers every earlier run.
          rssPeakMB: Object.fromEntries(
            Object.entries(r.processes)
              .filter(([n]) => n !== 'client')
              .map(([n, p]) => [n, p.rssPeakMB]),
          ),
        });
      } catch (err) {
        failures.push(`${layout} sweep ${calls}: ${err instanceof Error ? err.message : String(err)}`);
        break;
      }
    }
    const first = points[0]?.rssPeakMB ?? {};
    const last = points.at(-1)?.rssPeakMB ?? {};
    result[layout] = {
      points,
      rssGrowthMB: Object.fromEntries(
        Object.keys(last).map((n) => [n, last[n] != null && first[n] != null ? round3(last[n]! - first[n]!) : null]),
      ),
    };
  }
  load.push(loadNow());
  const rows: (string | number)[][] = [['layout / process', ...sizes.map((c) => `peak RSS MB @${c}`), 'growth MB']];
  const perf: (string | number)[][] = [['layout', ...sizes.flatMap((c) => [`calls/s @${c}`, `p99 ms @${c}`])]];
  for (const [layout, r] of Object.entries(result)) {
    perf.push([layout, ...r.points.flatMap((p) => [p.callsPerSecond, p.p99_ms])]);
    // nats-server beside the tooltx processes; the client is the bench's own process.
    for (const n of Object.keys(r.rssGrowthMB).sort((a, b) => (a === 'nats-server' ? -1 : b === 'nats-server' ? 1 : 0)))
      rows.push([
        `${layout} / ${n}`,
        ...r.points.map((p) => p.rssPeakMB[n]?.toFixed(1) ?? '–'),
        r.rssGrowthMB[n]?.toFixed(1) ?? '–',
      ]);
  }
  const report = {
    bench: 'tooltx',
    workload: 'peers' as const,
    mode: 'sweep' as const,
    layouts: result,
    loadAverage: { start: load[0]!, end: load.at(-1)! },
    failures,
    ok: failures.length === 0,
  };
  peersSweepSchema.parse(report);
  const l = (x: number[]) => x.map((v) => v.toFixed(2)).join(' ');
  return {
    report,
    table: `${table(perf)}\n\n${table(rows)}\n\nload average (1/5/15 min) at start ${l(load[0]!)}, at end ${l(load.at(-1)!)}`,
    failures,
  };
}
