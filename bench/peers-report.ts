/**
 * The guaranteed fields of `npm run bench -- --workload peers --json`, as zod schemas: the bench
 * checks its own output against them before printing, and the CI test (test/bench.e2e.test.ts)
 * parses the last line with them. Times in ms (latencies: nearest-rank percentiles over the phase's
 * calls), throughput in calls per second (completed calls ÷ the phase's wall time), CPU in ms per
 * call of the main phase (every process of the system: client, nats-server or its peers' servers,
 * services), memory in MB (peak resident set, `VmHWM`), fsyncs as fsync-family system calls per
 * call (strace, an untimed pass).
 */
import { z } from 'zod';

const n = z.number().finite().nonnegative();
const count = z.number().int().nonnegative();
const phase = z.object({ callsPerSecond: n, p50_ms: n, p90_ms: n, p99_ms: n, errors: count, calls: count });

/** One system's figures: medians over the rounds; errors, duplicates and missing lines summed over them; RSS the highest. */
export const peersSystemSchema = z.object({
  main: phase,
  dup: phase,
  race: phase,
  seq: phase,
  /** Main phase, all of the system's processes. */
  cpuMsPerCall: n,
  /** Lines beyond one per key, all rounds (must be 0). */
  duplicates: count,
  /** Keys without a line, all rounds. */
  missing: count,
  /** Highest peak RSS of the system's server-side processes (not the load-driving client), MB; null when unknown. */
  rssPeakMB: n.nullable(),
  /** fsync-family calls per call of the system's server-side processes (untimed strace pass); null when not measured. */
  fsyncsPerCall: n.nullable(),
  /** Per process: CPU ms per call (main phase) and peak RSS, MB. */
  processes: z.record(z.string(), z.object({ cpuMsPerCall: n.nullable(), rssPeakMB: n.nullable() })),
  rounds: count,
});

export const PEERS_SYSTEMS = [
  'tooltx-colocated',
  'tooltx-services',
  'floor-fsync',
  'floor-shape',
  'restate',
  'dbos',
] as const;
export type PeersSystem = (typeof PEERS_SYSTEMS)[number];

/** tooltx ÷ the better of Restate and DBOS on that figure; null when neither (or that tooltx) ran. */
const ratio = n.nullable();

export const peersReportSchema = z.object({
  workload: z.literal('peers'),
  mode: z.enum(['quick', 'full']),
  systems: z.object(
    Object.fromEntries(PEERS_SYSTEMS.map((s) => [s, peersSystemSchema.optional()])) as Record<
      PeersSystem,
      z.ZodOptional<typeof peersSystemSchema>
    >,
  ),
  ratios: z.object({
    /** Main-phase calls per second ÷ the higher peer's. */
    colocatedVsBestPeer: ratio,
    servicesVsBestPeer: ratio,
    /** seq p50 ÷ the lower peer's. */
    colocatedSeqP50VsBestPeer: ratio,
    /** CPU ms per call ÷ the lower peer's. */
    colocatedCpuVsBestPeer: ratio,
    /** dup p50 ÷ the lower peer's. */
    colocatedDupP50VsBestPeer: ratio,
  }),
  /** Systems asked for but not measured, with the reason. */
  skipped: z.record(z.string(), z.string()),
  /** `/proc/loadavg`'s 1, 5 and 15 minute averages when the run started and ended. */
  loadAverage: z.object({ start: z.array(n).length(3), end: z.array(n).length(3) }),
  failures: z.array(z.string()),
  ok: z.boolean(),
});
export type PeersReport = z.infer<typeof peersReportSchema>;

/** `--workload peers --sweep --json`: per tooltx layout, the main phase at each size and each process's peak RSS. */
export const peersSweepSchema = z.object({
  workload: z.literal('peers'),
  mode: z.literal('sweep'),
  layouts: z.record(
    z.string(),
    z.object({
      points: z.array(
        z.object({
          calls: count,
          callsPerSecond: n,
          p99_ms: n,
          errors: count,
          rssPeakMB: z.record(z.string(), n.nullable()),
        }),
      ),
      /** Peak RSS at the largest size minus at the smallest, MB, per process. */
      rssGrowthMB: z.record(z.string(), z.number().nullable()),
    }),
  ),
  loadAverage: z.object({ start: z.array(n).length(3), end: z.array(n).length(3) }),
  failures: z.array(z.string()),
  ok: z.boolean(),
});
