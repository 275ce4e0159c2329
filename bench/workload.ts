/**
 * The workload of `npm run bench`, the same for the lower bounds and for tooltx:
 * warm-up (not reported), main (unique keys, N in flight), dup (20 % of main's keys submitted again
 * after completion), race (new keys, each submitted twice at the same moment), seq (one call at a
 * time), status (one committed key queried one request at a time). Between phases it snapshots
 * each process's CPU time and each NATS connection's message counters.
 */
import { performance } from 'node:perf_hooks';
import { connCounts, cpuMsOf, rssPeakMbOf, serverCounts, type ConnCounts } from './proc.js';

/** What one call came to. `resourceId` names the side effect (the KB row, or the floor's key). */
export interface Outcome {
  ok: boolean;
  resourceId?: string;
  /** An error class or message for the bench's error summary (never a body). */
  error?: string;
}

/** A process whose CPU, NATS messages and peak RSS the bench reports. */
export interface BenchProcess {
  name: string;
  pid: number;
  /** Names of its NATS connections (as /connz shows them); none for the KB. */
  connections: string[];
}

/** One system under test: the lower bound (a), (b), or tooltx. */
export interface BenchSystem {
  label: string;
  /** Performs call `k` (key `k` of this run: same `k` = same key, same input). */
  call(k: number): Promise<Outcome>;
  /** One status query for the committed call `k`. */
  status(k: number): Promise<boolean>;
  /** Side effects stored (rows) and rows beyond one per key, or null when the system has no side effect. */
  rows(): Promise<{ rows: number; duplicateRows: number } | null>;
  processes: BenchProcess[];
  monitorUrl: string;
  /** With `--cpu-prof`: starts, then (second call) stops and writes the processes' CPU profiles. */
  toggleProfiles?(): void;
  stop(): Promise<void>;
}

/** Figures of one phase, as the bench's JSON line names them (bench/report.ts). */
export interface PhaseFigures {
  calls: number;
  callsPerSecond: number;
  p50_ms: number;
  p90_ms: number;
  p99_ms: number;
  errors: number;
}

/** Per process, per phase: CPU ms per call, NATS messages (in + out) per call. */
export interface ProcessPhase {
  cpuMsPerCall: number;
  natsMsgsPerCall: number;
  natsInPerCall: number;
  natsOutPerCall: number;
}

export interface WorkloadSizes {
  warmup: number;
  main: number;
  inFlight: number;
  /** Fraction of main's keys submitted again after completion. */
  dupFraction: number;
  /**
   * Copies of each dup key submitted at once (default 1): the peers workload sends 2, at the same
   * moment, with half as many keys in flight (as its race phase does).
   */
  dupCopies?: 1 | 2;
  race: number;
  seq: number;
  status: number;
}

export const PHASES = ['main', 'dup', 'race', 'seq'] as const;
export type PhaseName = (typeof PHASES)[number];

export interface RoundResult {
  phases: Record<PhaseName, PhaseFigures>;
  status: { p50_ms: number; p99_ms: number; errors: number };
  /** Per process name: per phase figures and its peak RSS over the round. */
  processes: Record<
    string,
    { phases: Record<PhaseName, ProcessPhase>; rssPeakMB: number | null; rssStartMB: number | null }
  >;
  /** All NATS messages the server handled per call (varz in + out), per phase. */
  serverMsgsPerCall: Record<PhaseName, number>;
  /** Keys whose side effect should exist exactly once. */
  uniqueKeys: number;
  rows: { rows: number; duplicateRows: number } | null;
  /** Second submissions (dup, race) whose receipt named another resource than the first. */
  receiptMismatches: number;
  errorSamples: string[];
}

/** Nearest-rank percentile of ascending `sorted` (ms), 3 decimals. */
export function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return 0;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return round3(sorted[i]!);
}

export function round3(x: number): number {
  return Math.round(x * 1000) / 1000;
}

/** Runs `fn` over `items` with at most `inFlight` at once. */
export async function pool<T>(items: T[], inFlight: number, fn: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.max(1, Math.min(inFlight, items.length)) }, async () => {
      while (next < items.length) {
        const item = items[next++]!;
        await fn(item);
      }
    }),
  );
}

interface Snapshot {
  cpu: Map<string, number>;
  conns: Map<string, ConnCounts>;
  server: ConnCounts;
}

async function snapshot(sys: BenchSystem): Promise<Snapshot> {
  const cpu = new Map<string, number>();
  for (const p of sys.processes) cpu.set(p.name, cpuMsOf(p.pid));
  const [conns, server] = await Promise.all([connCounts(sys.monitorUrl), serverCounts(sys.monitorUrl)]);
  return { cpu, conns, server };
}

function perProcess(sys: BenchSystem, a: Snapshot, b: Snapshot, calls: number): Record<string, ProcessPhase> {
  const out: Record<string, ProcessPhase> = {};
  for (const p of sys.processes) {
    let inMsgs = 0;
    let outMsgs = 0;
    for (const c of p.connections) {
      inMsgs += (b.conns.get(c)?.in ?? 0) - (a.conns.get(c)?.in ?? 0);
      outMsgs += (b.conns.get(c)?.out ?? 0) - (a.conns.get(c)?.out ?? 0);
    }
    out[p.name] = {
      cpuMsPerCall: round3(((b.cpu.get(p.name) ?? 0) - (a.cpu.get(p.name) ?? 0)) / calls),
      natsMsgsPerCall: round3((inMsgs + outMsgs) / calls),
      natsInPerCall: round3(inMsgs / calls),
      natsOutPerCall: round3(outMsgs / calls),
    };
  }
  return out;
}

/** Runs one phase: `calls` thunks (each returns its latencies), `inFlight` at once. */
async function timed(
  units: (() => Promise<{ ms: number; ok: boolean; error?: string }[]>)[],
  inFlight: number,
  errors: string[],
): Promise<PhaseFigures> {
  const lat: number[] = [];
  let failed = 0;
  const started = performance.now();
  await pool(units, inFlight, async (u) => {
    for (const r of await u()) {
      lat.push(r.ms);
      if (!r.ok) {
        failed++;
        if (errors.length < 10 && r.error) errors.push(r.error);
      }
    }
  });
  const elapsed = (performance.now() - started) / 1000;
  lat.sort((x, y) => x - y);
  return {
    calls: lat.length,
    callsPerSecond: Math.round((lat.length / elapsed) * 10) / 10,
    p50_ms: percentile(lat, 50),
    p90_ms: percentile(lat, 90),
    p99_ms: percentile(lat, 99),
    errors: failed,
  };
}

/**
 * Runs every phase on `sys` and returns its figures. Keys: warm-up `0..w-1`, main `w..w+N-1`, race
 * and seq after them; dup re-submits every `1/dupFraction`-th main key.
 */
export async function runWorkload(sys: BenchSystem, z: WorkloadSizes, say: (s: string) => void): Promise<RoundResult> {
  const errorSamples: string[] = [];
  const first = new Map<number, string>();
  let receiptMismatches = 0;
  const one =
    (k: number, check = false) =>
    async () => {
      const t0 = performance.now();
      let o: Outcome;
      try {
        o = await sys.call(k);
      } catch (err) {
        o = { ok: false, error: err instanceof Error ? `${err.name}: ${err.message}` : String(err) };
      }
      const ms = performance.now() - t0;
      // A resubmission must name the resource the first call created (the floors' known-key answers
      // name none: they stop at the first publish).
      if (o.ok && o.resourceId !== undefined) {
        if (check && first.has(k) && first.get(k) !== o.resourceId) receiptMismatches++;
        if (!first.has(k)) first.set(k, o.resourceId);
      }
      return [{ ms, ok: o.ok, ...(o.error ? { error: o.error } : {}) }];
    };
  const range = (from: number, n: number) => Array.from({ length: n }, (_, i) => from + i);

  let k = 0;
  const warm = range(k, z.warmup);
  k += z.warmup;
  const mainKeys = range(k, z.main);
  k += z.main;
  const step = z.dupFraction > 0 ? Math.max(1, Math.round(1 / z.dupFraction)) : 0;
  const dupKeys = step ? mainKeys.filter((_, i) => i % step === 0) : [];
  const raceKeys = range(k, z.race);
  k += z.race;
  const seqKeys = range(k, z.seq);
  k += z.seq;

  // Peak RSS after start-up, before any call: what the process costs before it handles work.
  const rssStart = new Map(sys.processes.map((p) => [p.name, rssPeakMbOf(p.pid)]));
  if (warm.length)
    await timed(
      warm.map((x) => one(x)),
      z.inFlight,
      errorSamples,
    );
  const phases = {} as Record<PhaseName, PhaseFigures>;
  const procPhases = {} as Record<PhaseName, Record<string, ProcessPhase>>;
  const serverMsgsPerCall = {} as Record<PhaseName, number>;
  const plan: Record<
    PhaseName,
    { units: (() => Promise<{ ms: number; ok: boolean; error?: string }[]>)[]; inFlight: number }
  > = {
    main: { units: mainKeys.map((x) => one(x)), inFlight: z.inFlight },
    dup:
      z.dupCopies === 2
        ? {
            units: dupKeys.map((x) => async () => (await Promise.all([one(x, true)(), one(x, true)()])).flat()),
            inFlight: Math.max(1, Math.floor(z.inFlight / 2)),
          }
        : { units: dupKeys.map((x) => one(x, true)), inFlight: z.inFlight },
    // Both copies at the same moment; in flight counts calls, so half as many pairs.
    race: {
      units: raceKeys.map((x) => async () => (await Promise.all([one(x, true)(), one(x, true)()])).flat()),
      inFlight: Math.max(1, Math.floor(z.inFlight / 2)),
    },
    seq: { units: seqKeys.map((x) => one(x)), inFlight: 1 },
  };
  for (const name of PHASES) {
    const { units, inFlight } = plan[name];
    if (units.length === 0) {
      phases[name] = { calls: 0, callsPerSecond: 0, p50_ms: 0, p90_ms: 0, p99_ms: 0, errors: 0 };
      procPhases[name] = {};
      serverMsgsPerCall[name] = 0;
      continue;
    }
    const a = await snapshot(sys);
    // CPU profiles (--cpu-prof) cover exactly the main phase: no start-up, no warm-up.
    if (name === 'main') sys.toggleProfiles?.();
    phases[name] = await timed(units, inFlight, errorSamples);
    if (name === 'main') sys.toggleProfiles?.();
    const b = await snapshot(sys);
    procPhases[name] = perProcess(sys, a, b, phases[name].calls);
    serverMsgsPerCall[name] = round3((b.server.in - a.server.in + b.server.out - a.server.out) / phases[name].calls);
    say(
      `  ${sys.label} ${name.padEnd(4)} ${phases[name].calls} calls  ${phases[name].callsPerSecond} calls/s  p50 ${phases[name].p50_ms} ms  p99 ${phases[name].p99_ms} ms  errors ${phases[name].errors}`,
    );
  }

  // Status: one committed key (the first main key), one query at a time.
  const statusKey = mainKeys[0] ?? warm[0] ?? 0;
  const lat: number[] = [];
  let statusErrors = 0;
  for (let i = 0; i < z.status; i++) {
    const t0 = performance.now();
    const ok = await sys.status(statusKey).catch(() => false);
    lat.push(performance.now() - t0);
    if (!ok) statusErrors++;
  }
  lat.sort((x, y) => x - y);

  const rows = await sys.rows();
  const processes: RoundResult['processes'] = {};
  for (const p of sys.processes) {
    processes[p.name] = {
      phases: Object.fromEntries(
        PHASES.map((ph) => [
          ph,
          procPhases[ph][p.name] ?? { cpuMsPerCall: 0, natsMsgsPerCall: 0, natsInPerCall: 0, natsOutPerCall: 0 },
        ]),
      ) as Record<PhaseName, ProcessPhase>,
      rssPeakMB: rssPeakMbOf(p.pid) === null ? null : round3(rssPeakMbOf(p.pid)!),
      rssStartMB: rssStart.get(p.name) == null ? null : round3(rssStart.get(p.name)!),
    };
  }
  return {
    phases,
    status: { p50_ms: percentile(lat, 50), p99_ms: percentile(lat, 99), errors: statusErrors },
    processes,
    serverMsgsPerCall,
    uniqueKeys: k,
    rows,
    receiptMismatches,
    errorSamples,
  };
}
