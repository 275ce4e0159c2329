/**
 * tooltx's real path for the bench: the SDK (libs/client) in the bench's process
 * publishing intents for `kb.write_note`, the four services as separate processes
 * (dev/src/stack.ts, auth on, one instance each, default settings), the KB storage
 * service with `KB_DEDUP=off` (it inserts a row for every write that reaches it, so its row count
 * tells duplicates) and the sample's tenant list (examples/research-kb/tenants.json: acme's quota,
 * 1,000,000 notes per UTC day, is counted on every insert and lies far above the 20,100 notes of a
 * `--sweep` point), and the receipt back at the client through the status endpoint.
 */
import type { Durability } from '@tooltx/nats';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createTools, type Tools } from '@tooltx/client';
import { researchContracts } from '../examples/research-kb/contracts.js';
import { KbClient } from '../examples/research-kb/kb-client.js';
import { DEFAULT_KB_TENANTS, SERVICES, startStack, type Stack } from '@tooltx/dev/stack';
import { startBenchServer, type BenchServer } from './server.js';
import type { BenchProcess, BenchSystem, Outcome } from './workload.js';

const TENANT = 'acme';
/** The preload that profiles a process on SIGUSR2 (see its header). */
export const CPU_PROFILE_PRELOAD = fileURLToPath(new URL('./cpu-profile.cjs', import.meta.url));
const ACTOR = 'researcher';
export const SDK_CONNECTION = `tooltx-sdk:${TENANT}/${ACTOR}`;

export interface TooltxOptions {
  dir: string;
  prefix: string;
  runId: string;
  /** Extra environment for every stack process (e.g. NODE_OPTIONS=--cpu-prof …). */
  env?: Record<string, string>;
  /** Per-call budget of the SDK, ms. */
  budgetMs?: number;
  /** Directory for CPU profiles of the main phase (bench/cpu-profile.cjs), of every stack process and the client. */
  cpuProfDir?: string;
  /** Extra nats-server arguments (bench/trace.ts: `-V`). */
  serverArgs?: string[];
  /** What the server's acknowledgements promise (default `fsync`). */
  durability?: Durability;
}

/** The note of call `k`: same `k`, same input, same operation key. */
export function noteOf(runId: string, k: number) {
  return {
    kb: 'research',
    title: `Bench note ${k}`,
    body: `Finding ${k} of bench run ${runId}: a short research note, as an agent writes it after reading a page.`,
    sourceUrl: `https://example.org/bench/${runId}/${k}`,
    fetchedAt: '2025-01-01T00:00:00Z',
  };
}

export async function startTooltx(
  o: TooltxOptions,
): Promise<BenchSystem & { restarts: () => number; server: BenchServer }> {
  const server: BenchServer = await startBenchServer(join(o.dir, 'nats'), o.prefix, {
    extraArgs: o.serverArgs ?? [],
    durability: o.durability ?? 'fsync',
  });
  let stack: Stack | undefined;
  let tools: Tools | undefined;
  let restarts = 0;
  try {
    stack = await startStack({
      stateDir: join(o.dir, 'stack'),
      natsUrl: server.url,
      authDir: server.authDir,
      prefix: o.prefix,
      kbPort: 0,
      kbDedup: false,
      kbSeed: `${TENANT}:research`,
      kbTenants: DEFAULT_KB_TENANTS,
      logs: { dir: join(o.dir, 'logs') },
      env: {
        LOG_LEVEL: process.env.LOG_LEVEL ?? 'info',
        ...(o.cpuProfDir
          ? {
              NODE_OPTIONS: `--require ${CPU_PROFILE_PRELOAD}`,
              BENCH_CPU_PROF_DIR: o.cpuProfDir,
              BENCH_CPU_PROF_MODE: 'signal',
            }
          : {}),
        ...o.env,
      },
      onRestart: () => void restarts++,
    });
    tools = await createTools({
      servers: server.url,
      tenant: TENANT,
      actor: ACTOR,
      nkeyFile: server.seedFile({ kind: 'agent', tenant: TENANT, actor: ACTOR }),
      contracts: researchContracts({ kbDedup: false }).all,
      prefix: o.prefix,
      receiptKeys: stack.receiptKeysFile,
    });
  } catch (err) {
    await tools?.close().catch(() => undefined);
    await stack?.stop().catch(() => undefined);
    await server.stop();
    throw err;
  }
  const s = stack;
  const t = tools;
  const taskId = `bench-${o.runId}`;
  const keys = new Map<number, string>();
  const kb = new KbClient(s.kbUrl, { serviceToken: s.kbServiceToken });
  const budgetMs = o.budgetMs ?? 60_000;

  const processes: BenchProcess[] = [
    { name: 'client', pid: process.pid, connections: [SDK_CONNECTION] },
    { name: 'nats-server', pid: server.pid, connections: [] },
    ...SERVICES.map((name) => {
      const p = s.processes.find((x) => x.name === `${name}-1`);
      if (!p?.child.pid) throw new Error(`${name} has no process`);
      return { name, pid: p.child.pid, connections: [`${name}@${name}-1`] };
    }),
    { name: 'kb', pid: s.processes.find((x) => x.name === 'kb')!.child.pid!, connections: [] },
  ];

  return {
    label: 'tooltx',
    server,
    processes,
    monitorUrl: server.monitorUrl,
    restarts: () => restarts,
    ...(o.cpuProfDir
      ? {
          toggleProfiles() {
            // SIGUSR2 to every node process of the stack and to this one (the SDK client).
            for (const p of processes) if (p.name !== 'nats-server') process.kill(p.pid, 'SIGUSR2');
          },
        }
      : {}),
    async call(k): Promise<Outcome> {
      const r = await t.execute({ tool: 'kb.write_note', taskId, input: noteOf(o.runId, k) }, { budgetMs });
      if (r.status === 'committed') {
        keys.set(k, r.operationKey);
        return { ok: true, resourceId: r.receipt.resourceId };
      }
      return {
        ok: false,
        error:
          r.status === 'rejected'
            ? `rejected: ${r.error.class}`
            : r.status === 'awaiting_confirmation'
              ? 'awaiting_confirmation'
              : `unknown: last state ${r.lastServerState}${r.error ? ` (${r.error.class})` : ''}`,
      };
    },
    async status(k) {
      const key = keys.get(k);
      if (!key) return false;
      const a = await t.status({ operationKey: key });
      return a.state === 'committed';
    },
    async rows() {
      const st = await kb.stats(TENANT);
      return { rows: st.rows, duplicateRows: st.duplicateRows };
    },
    async stop() {
      await kb.close().catch(() => undefined);
      await t.close().catch(() => undefined);
      await s.stop();
      await server.stop();
    },
  };
}
