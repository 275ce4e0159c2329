/**
 * The guaranteed fields of `npm run bench -- --json`, as a zod schema: the bench checks
 * its own output against it before printing, and the CI test (test/bench.e2e.test.ts) parses the
 * last line with it. Times in ms, throughput in calls per second, memory in MB (VmHWM), CPU in ms
 * per call, NATS messages (in + out, as the server counts them for the process's connection) per call.
 */
import { z } from 'zod';

const n = z.number().finite().nonnegative();
const phase = z.object({ callsPerSecond: n, p50_ms: n, p90_ms: n, p99_ms: n, errors: z.number().int().nonnegative() });
const status = z.object({ p50_ms: n, p99_ms: n });
const system = z.object({ main: phase, dup: phase, race: phase, seq: phase, status });
const proc = z.object({ cpuMsPerCall: n, natsMsgsPerCall: n, rssPeakMB: n.nullable() });

const durabilitySystem = z.object({
  mainCallsPerSecond: n,
  mainP50_ms: n,
  mainP99_ms: n,
  seqP50_ms: n,
  dupP50_ms: n,
  statusP50_ms: n,
  cpuMsPerCall: n,
  natsServerCpuMsPerCall: n.nullable(),
});
const durabilityFigures = z.object({ floorA: durabilitySystem, floorB: durabilitySystem, tooltx: durabilitySystem });

export const benchReportSchema = z.object({
  /** The server of the headline figures: its version and what its acknowledgements promise (docs/durability.md). */
  natsServer: z.object({ version: z.string().min(1), durability: z.enum(['fsync', 'os']) }),
  /** The same workload per durability measured in this run (`--durability`, default both). */
  durability: z.object({ fsync: durabilityFigures.optional(), os: durabilityFigures.optional() }),
  lowerBound: z.object({ a: system, b: system }),
  tooltx: system,
  ratios: z.object({
    /** tooltx ÷ floor (a). */
    mainThroughput: n,
    seqP50: n,
    /** tooltx ÷ floor (b). */
    floorB: z.object({ mainThroughput: n, seqP50: n }),
  }),
  /** KB rows beyond one per unique key, worst run (tooltx and floor (b)). */
  duplicates: z.number().int().nonnegative(),
  /** tooltx's processes. */
  processes: z.object({
    client: proc,
    'nats-server': proc,
    authorizer: proc,
    executor: proc,
    reconciler: proc,
    'audit-projector': proc,
    kb: proc,
  }),
  ok: z.boolean(),
});
export type BenchReport = z.infer<typeof benchReportSchema>;
