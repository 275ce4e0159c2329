/**
 * tooltx on the peers workload (bench/peers.ts): nats-server with `sync_interval: always` and auth
 * on (./server.ts, durability `fsync`), the streams applied, receipts signed, the audit projector
 * running, the services loading the workload's tools module (./peers-tools.ts: one line appended
 * per call), and the SDK (libs/client) in the bench's process submitting `peers.append_line`.
 * Started here rather than by `startStack` (which always serves the research KB's tools module),
 * compiled with the stack's V8 flags and environment (dev/src/stack.ts); the tools module is an
 * extra entry of the stack's build (dev/src/compiled.ts `ensureStackBuild({ extraEntries })`), so it
 * shares the roles' modules. Two layouts:
 * - `services`: the four services as separate processes, one instance each;
 * - `colocated`: one `tooltx serve` process hosting every role, named `tooltx-1`, its connections
 *   `<role>@tooltx-1`, each role as its own identity from the auth directory.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, mkdirSync, openSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createTools, type Tools } from '@tooltx/client';
import { ensureStackBuild } from '@tooltx/dev/compiled';
import { DEFAULT_IDENTITIES, HOST_NODE_FLAGS, SERVICE_NODE_FLAGS, SERVICES } from '@tooltx/dev/stack';
import { tenantsOf } from '@tooltx/auth';
import { connectNats, inboxPrefixOf, jetStreamOf, Subjects } from '@tooltx/nats';
import { ensureKeyFile } from '@tooltx/runtime';
import { applyTopology, topology } from '@tooltx/streams';
import { countEffects, effectsKey } from './peers-effects.js';
import { peersContracts } from './peers-contracts.js';
import { startBenchServer, type BenchServer } from './server.js';
import { CPU_PROFILE_PRELOAD } from './tooltx.js';
import type { BenchProcess, BenchSystem, Outcome } from './workload.js';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');
/** The tools module, by its name in the stack's build and its source (repository-relative). */
export const PEERS_TOOLS_ENTRY = { 'peers-tools': 'bench/peers-tools.ts' } as const;
const TENANT = 'acme';
const ACTOR = 'researcher';
const SDK_CONNECTION = `tooltx-sdk:${TENANT}/${ACTOR}`;
/** How long a service may take to say it is ready, ms. */
const READY_MS = 30_000;
/** How long a service may take to exit after SIGTERM before SIGKILL, ms (its own grace is 15 s). */
const HARD_STOP_MS = 20_000;

export type Layout = 'services' | 'colocated';

export interface PeersTooltxOptions {
  dir: string;
  layout: Layout;
  prefix: string;
  runId: string;
  /** The file the tool appends its lines to. */
  effectsFile: string;
  /** Directory for CPU profiles of the main phase (bench/cpu-profile.cjs), of the roles and the client. */
  cpuProfDir?: string;
}

/** A started tooltx: the workload's system, the server it runs on, and service exits seen while it ran. */
export type PeersTooltx = BenchSystem & { server: BenchServer; restarts(): number };

export async function startPeersTooltx(o: PeersTooltxOptions): Promise<PeersTooltx> {
  const server = await startBenchServer(join(o.dir, 'nats'), o.prefix, { durability: 'fsync' });
  let roles: { processes: BenchProcess[]; exits(): number; stop(): Promise<void> } | undefined;
  let tools: Tools | undefined;
  try {
    const env = {
      LOG_LEVEL: process.env.LOG_LEVEL ?? 'info',
      PEERS_EFFECTS_FILE: o.effectsFile,
      ...(o.cpuProfDir
        ? {
            NODE_OPTIONS: `--require ${CPU_PROFILE_PRELOAD}`,
            BENCH_CPU_PROF_DIR: o.cpuProfDir,
            BENCH_CPU_PROF_MODE: 'signal',
          }
        : {}),
    };
    roles = await startRoles(o, server, env, o.layout);
    tools = await createTools({
      servers: server.url,
      tenant: TENANT,
      actor: ACTOR,
      nkeyFile: server.seedFile({ kind: 'agent', tenant: TENANT, actor: ACTOR }),
      contracts: peersContracts,
      prefix: o.prefix,
      receiptKeys: join(server.authDir, 'receipt-keys.json'),
    });
  } catch (err) {
    await tools?.close().catch(() => undefined);
    await roles?.stop().catch(() => undefined);
    await server.stop();
    throw err;
  }
  const r = roles;
  const t = tools;
  const taskId = `peers-${o.runId}`;
  const processes: BenchProcess[] = [
    { name: 'client', pid: process.pid, connections: [SDK_CONNECTION] },
    { name: 'nats-server', pid: server.pid, connections: [] },
    ...r.processes,
  ];
  return {
    label: `tooltx-${o.layout}`,
    server,
    processes,
    monitorUrl: server.monitorUrl,
    restarts: () => r.exits(),
    ...(o.cpuProfDir
      ? {
          toggleProfiles() {
            // SIGUSR2 to every node process of the system and to this one (the SDK client).
            for (const p of processes) if (p.name !== 'nats-server') process.kill(p.pid, 'SIGUSR2');
          },
        }
      : {}),
    async call(k): Promise<Outcome> {
      const a = await t.execute(
        { tool: 'peers.append_line', taskId, input: { key: effectsKey(o.runId, k) } },
        { budgetMs: 60_000 },
      );
      if (a.status === 'committed') return { ok: true, resourceId: a.receipt.resourceId };
      return {
        ok: false,
        error:
          a.status === 'rejected'
            ? `rejected: ${a.error.class}`
            : a.status === 'awaiting_confirmation'
              ? 'awaiting_confirmation'
              : `unknown: last state ${a.lastServerState}${a.error ? ` (${a.error.class})` : ''}`,
      };
    },
    async status() {
      return false;
    },
    async rows() {
      const c = countEffects(o.effectsFile);
      return { rows: c.rows, duplicateRows: c.duplicateRows };
    },
    async stop() {
      await t.close().catch(() => undefined);
      await r.stop();
      await server.stop();
    },
  };
}

/**
 * The roles as compiled processes (see the file's header): the four services each in its own
 * (`services`), or every role in one `tooltx serve` process, `tooltx-1`, each role connecting as its
 * own identity from the auth directory (`colocated`).
 */
async function startRoles(o: PeersTooltxOptions, server: BenchServer, env: Record<string, string>, layout: Layout) {
  const build = await ensureStackBuild({ extraEntries: PEERS_TOOLS_ENTRY });
  const stateDir = join(o.dir, 'stack');
  const logsDir = join(o.dir, 'logs');
  mkdirSync(stateDir, { recursive: true, mode: 0o700 });
  mkdirSync(logsDir, { recursive: true });
  // The provisioner step of startStack: every stream and bucket, with the sample's tenants.
  const nc = await connectNats({
    servers: server.url,
    name: 'tooltx-provisioner',
    nkeySeedFile: server.seedFile({ kind: 'provisioner' }),
    inboxPrefix: inboxPrefixOf({ kind: 'provisioner' }),
    reconnectForever: false,
  });
  try {
    const { jsm } = await jetStreamOf(nc);
    await applyTopology(
      nc,
      jsm,
      topology(new Subjects(o.prefix), { replicas: 1, tenants: tenantsOf(DEFAULT_IDENTITIES) }),
    );
  } finally {
    await nc.drain().catch(() => undefined);
  }
  const common = {
    ...env,
    NATS_URL: server.url,
    TOOLTX_PREFIX: o.prefix,
    TOOLTX_TOOLS_MODULE: build.path('peers-tools'),
    TOOLTX_AUDIT_HMAC_KEY_FILE: ensureKeyFile(join(stateDir, 'audit-hmac.key')),
    TOOLTX_LOG_HMAC_KEY_FILE: ensureKeyFile(join(stateDir, 'log-hmac.key')),
    TOOLTX_EXIT_WITH_PARENT: String(process.pid),
  };
  const children: { name: string; child: ChildProcess }[] = [];
  let stopping = false;
  let exits = 0;
  const stop = async () => {
    stopping = true;
    await Promise.all(children.map(({ child }) => terminate(child)));
  };
  try {
    const launch = async (name: string, entry: 'serve' | (typeof SERVICES)[number], own: Record<string, string>) => {
      const log = openSync(join(logsDir, `${name}.log`), 'a');
      const flags = entry === 'serve' ? HOST_NODE_FLAGS : SERVICE_NODE_FLAGS;
      const child = spawn(process.execPath, [...flags, '--enable-source-maps', build.path(entry)], {
        cwd: ROOT,
        detached: true,
        env: { ...process.env, ...common, TOOLTX_INSTANCE_ID: name, ...own },
        stdio: ['ignore', log, log, 'ipc'],
      });
      closeSync(log);
      children.push({ name, child });
      child.once('exit', () => {
        if (!stopping) exits++;
      });
      await ready(child, name, join(logsDir, `${name}.log`));
    };
    if (layout === 'colocated') await launch('tooltx-1', 'serve', { TOOLTX_AUTH_DIR: server.authDir });
    else
      await Promise.all(
        SERVICES.map((name) =>
          launch(`${name}-1`, name, {
            NATS_NKEY_FILE: server.seedFile({ kind: 'service', service: name }),
            ...(name === 'executor' || name === 'reconciler'
              ? { TOOLTX_SIGNING_KEY_FILE: join(server.authDir, 'signing', `${name}.pem`) }
              : {}),
          }),
        ),
      );
  } catch (err) {
    await stop();
    throw err;
  }
  return {
    processes:
      layout === 'colocated'
        ? children.map(({ child }) => ({
            name: 'tooltx',
            pid: child.pid!,
            connections: [...SERVICES, 'host'].map((s) => `${s}@tooltx-1`),
          }))
        : children.map(({ name, child }) => ({
            name: name.replace(/-1$/, ''),
            pid: child.pid!,
            connections: [`${name}@${name}`],
          })),
    exits: () => exits,
    stop,
  };
}

/** Resolves on the process's `{ tooltx: 'ready' }` IPC message (libs/runtime announceReady); rejects if it exits first. */
export function ready(child: ChildProcess, name: string, log: string): Promise<void> {
  return new Promise((res, rej) => {
    const timer = setTimeout(() => {
      cleanup();
      rej(new Error(`${name} was not ready within ${READY_MS} ms; ${log} may say why`));
    }, READY_MS);
    const onMessage = (m: unknown) => {
      if ((m as { tooltx?: unknown } | null)?.tooltx !== 'ready') return;
      cleanup();
      res();
    };
    const onExit = (code: number | null, signal: NodeJS.Signals | null) => {
      cleanup();
      rej(new Error(`${name} exited (${signal ?? `code ${code}`}) before it was ready; ${log} says why`));
    };
    const cleanup = () => {
      clearTimeout(timer);
      child.off('message', onMessage);
      child.off('exit', onExit);
    };
    child.on('message', onMessage);
    child.once('exit', onExit);
  });
}

/** SIGTERM, then SIGKILL after {@link HARD_STOP_MS}; resolves when the process is gone. */
export function terminate(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((res) => {
    const hard = setTimeout(() => child.kill('SIGKILL'), HARD_STOP_MS);
    child.once('exit', () => {
      clearTimeout(hard);
      res();
    });
    child.kill('SIGTERM');
  });
}
