/**
 * Starts the whole research-KB stack as real processes: nats-server (unless `natsUrl` is given)
 * with its JetStream store in `stateDir`, the streams applied (the provisioner step), the KB storage
 * service, the mail outbox (the sample's `mail.*` tools call it), and the four tooltx services.
 * Used by `npm start`, `npm run demo` and `npm run bench`.
 *
 * The KB, the outbox and the services run as compiled JavaScript by plain `node` (./compiled.ts: built on
 * demand, cached) with {@link SERVICE_NODE_FLAGS}; `TOOLTX_STACK_RUNTIME=tsx` runs their TypeScript
 * sources under tsx instead (development).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createWriteStream, mkdirSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { z } from 'zod';
import {
  assertSupportedServer,
  connectNats,
  DURABILITIES,
  jetStreamOf,
  Subjects,
  UnsupportedServerError,
  type Durability,
} from '@tooltx/nats';
import {
  freeLoopbackPort,
  natsServerBinary,
  NatsServerUnavailableError,
  spawnNatsCluster,
  spawnNatsServer,
  type NatsServerHandle,
} from '@tooltx/dev/nats-server';
import {
  describeConnectError,
  describeError,
  displayUrl,
  ensureKeyFile,
  isNatsError,
  makeDirs,
  readKeyFile,
  SecretFileError,
  showValue,
  startupStep,
  StartupError,
  StartupFailure,
  type ReadyMessage,
} from '@tooltx/runtime';
import { applyTopology, topology } from '@tooltx/streams';
import { generateAuth, identityListSchema, tenantsOf, type IdentityList } from '@tooltx/auth';
import { inboxPrefixOf, type Role } from '@tooltx/nats';
import { ensureStackBuild, StackBuildError, touchStackBuild, type StackEntry } from './compiled.js';
import { loadSeedFile, SeedError } from '../../examples/research-kb/kb-seed.js';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
export const RESEARCH_TOOLS = join(ROOT, 'examples', 'research-kb', 'tools.ts');
export const SERVICES = ['authorizer', 'executor', 'reconciler', 'audit-projector'] as const;

/**
 * How the stack runs the KB and the services (`TOOLTX_STACK_RUNTIME`, or {@link StackOptions.runtime}):
 * - `compiled` (default): the bundle of ./compiled.ts (built on demand, cached under
 *   node_modules/.cache/tooltx-stack/) run by plain `node --enable-source-maps`;
 * - `tsx`: the TypeScript sources under `node --import tsx` — no build step, for development; about
 *   45 MB more RSS per process (tsx's loader runs in its own V8 isolate on Node 20).
 */
export type StackRuntime = 'compiled' | 'tsx';
const stackRuntimeSchema = z.enum(['compiled', 'tsx']);

/**
 * V8 flags of every KB and service process, whatever the runtime (each ≤ 120 MB peak
 * RSS; the figures are in docs/performance.md, "Memory: compiled services and V8 flags"). None caps
 * the heap — `--max-old-space-size` would turn a burst of live data into an out-of-memory crash —
 * they make V8 collect earlier and keep one compiler out:
 * - `--max-semi-space-size=4` (MB): the young generation stays at 2 × 4 MB; by default it grows to
 *   2 × 16 MB under load in every process (−24 MB each). About 3.5× more scavenges, each of the same
 *   surviving objects, and more of them promoted.
 * - `--heap-growing-percent=50`: the next full GC comes when the old generation has grown to 1.5 ×
 *   what survived the last one. V8's own factor (up to 4×, from its GC and mutator speeds) let the
 *   authorizer's old space reach 60–70 MB while 23–28 MB of it was live.
 * - `--liftoff-only`: WebAssembly stays on V8's baseline compiler. undici's HTTP parser (llhttp) is
 *   WebAssembly, and its tier-up to TurboFan compiled in one burst of 25–40 MB outside the heap —
 *   the authorizer's and executor's peak, within a second of their first KB requests. llhttp then
 *   parses the KB's small answers in baseline code: no difference per request measured.
 * CPU: more GC work per call; see the docs for the measured cost. `--lite-mode`/`--jitless` (no
 * optimising compiler) and `--optimize-for-size` (1 MB semi-spaces: GC 25–37 % of CPU) were rejected.
 */
export const SERVICE_NODE_FLAGS: readonly string[] = [
  '--max-semi-space-size=4',
  '--heap-growing-percent=50',
  '--liftoff-only',
];
/**
 * V8 flags of a co-located process (`tooltx serve`, every role): {@link SERVICE_NODE_FLAGS} with a
 * 16 MB semi-space (the young generation at 2 × 16 MB). One process does the work of four, so it
 * allocates four times as fast: with 4 MB semi-spaces scavenges were 14 % of its CPU. The 24 MB more
 * young generation is paid once instead of four processes' baseline (docs/performance.md).
 */
export const HOST_NODE_FLAGS: readonly string[] = [
  '--max-semi-space-size=16',
  ...SERVICE_NODE_FLAGS.filter((f) => !f.startsWith('--max-semi-space-size')),
];
/** `TOOLTX_STACK_NODE_FLAGS`: node/V8 flags replacing {@link SERVICE_NODE_FLAGS}, space-separated, each `--…` ("" = none; for measuring them). */
const nodeFlagsSchema = z
  .string()
  .transform((v) => v.split(/\s+/).filter(Boolean))
  .pipe(z.array(z.string().regex(/^--[a-z0-9][a-z0-9_=.,:/-]*$/i)));

/** The identities `npm start` and the demo generate when no list is given (TOOLTX_IDENTITIES). */
export const DEFAULT_IDENTITIES: IdentityList = JSON.parse(
  readFileSync(join(ROOT, 'examples', 'research-kb', 'identities.json'), 'utf8'),
) as IdentityList;
/**
 * The sample's tenant list for the KB (its `KB_SEED_FILE`, schema in ./kb-seed.ts): every tenant of
 * `identities.json` with its quota — notes per UTC day, counted by the KB per tenant in the insert's
 * transaction. Set well above what the demo (~250 notes for acme, a few for globex) and the
 * bench (20,100 notes per stack in `--sweep`) write, so only a runaway writer meets it.
 */
export const DEFAULT_KB_TENANTS = join(ROOT, 'examples', 'research-kb', 'tenants.json');

export interface StackOptions {
  stateDir: string;
  /** The identity list; default {@link DEFAULT_IDENTITIES}, or the JSON file named by TOOLTX_IDENTITIES. */
  identities?: IdentityList;
  /**
   * With `natsUrl` (an external server), the directory holding the nkey seeds that
   * `tooltx auth generate` wrote for that server's configuration (`<dir>/nkeys/*.nk`).
   */
  authDir?: string;
  /** Use this server instead of starting one. */
  natsUrl?: string;
  /** Port of the started nats-server (-1 = a free port); a cluster's nodes listen on it and the next two. */
  natsPort?: number;
  /**
   * What an acknowledgement of the started nats-server promises (default `TOOLTX_DURABILITY`, else
   * `fsync`: `sync_interval: always`; docs/durability.md). Unused with `natsUrl`.
   */
  durability?: Durability;
  /** Nodes of the started nats-server: 1 (default), or 3 — a cluster on loopback, every stream and bucket R3 (docs/cluster.md). */
  cluster?: 1 | 3;
  prefix: string;
  /** KB port (0 = a free port). */
  kbPort: number;
  kbDedup: boolean;
  /** `tenant:kb` pairs the KB creates. */
  kbSeed: string;
  /**
   * The KB's tenant list with the tenants' quotas (`KB_SEED_FILE`); default {@link DEFAULT_KB_TENANTS}.
   * When the stack generates the identities, every tenant of the identity list must be in it
   * (`quota: null` says "unlimited" explicitly): a tenant left out would write without a quota.
   */
  kbTenants?: string;
  /** The KB's operator token (default: random per run). */
  kbAdminToken?: string;
  /**
   * Whether to start the mail outbox (default true): without it the sample's `mail.*` tools answer
   * `dependency_unavailable`.
   */
  mail?: boolean;
  /** Whether the outbox deduplicates by key (`MAIL_DEDUP` of it and of the services); default {@link kbDedup}. */
  mailDedup?: boolean;
  /**
   * Whether to start the console (docs/console.md), and on which port (0 = a free one); default
   * none. It acts as each logged-in operator or auditor with the seeds of the auth directory.
   */
  console?: { port: number };
  /** `pretty`: pino-pretty to the terminal; `inherit`: JSON lines to stdout; a path: log files in that directory. */
  logs: 'pretty' | 'inherit' | { dir: string };
  /** Extra environment for every process. */
  env?: Record<string, string>;
  /** Called when a crashed service is started again (at most 5 times a minute, then the stack stops). */
  onRestart?: (name: string, code: number | null, signal: NodeJS.Signals | null) => void;
  /**
   * Called once the KB listens, with its URL; returns the URL the services use instead (the demo
   * puts a fault-injecting hop there). Default: the KB's own URL.
   */
  kbHop?: (kbUrl: string) => Promise<string>;
  /** How the KB and the services run (default `TOOLTX_STACK_RUNTIME`, else `compiled`); see {@link StackRuntime}. */
  runtime?: StackRuntime;
  /** Node/V8 flags of the KB and the services (default `TOOLTX_STACK_NODE_FLAGS` when set, else {@link SERVICE_NODE_FLAGS}). */
  nodeFlags?: readonly string[];
  /**
   * How the roles run (default `TOOLTX_STACK_LAYOUT`, else `services`): `colocated` = every role in
   * one process (`tooltx serve`, processes `tooltx-<n>`, connections `<role>@tooltx-<n>`);
   * `services` = each role its own process (`<role>-<n>`).
   */
  layout?: StackLayout;
  /** Instances of each service, or of the co-located process (`tooltx`) (default 1). */
  instances?: Partial<Record<(typeof SERVICES)[number] | 'kb' | 'tooltx', number>>;
  /**
   * Called with every process of the stack that is running (nats-server, the KB, the services) each
   * time one starts or exits — `npm start` records them in its lock, so a later start can refuse
   * while one of them is still alive.
   */
  onPids?: (pids: StackPid[]) => void;
}

/** The stack's process layout ({@link StackOptions.layout}). */
export type StackLayout = 'colocated' | 'services';
export const STACK_LAYOUTS: readonly StackLayout[] = ['colocated', 'services'];

/** A process of the stack: its name (`nats-server`, `kb`, `executor-1`, …) and pid. */
export interface StackPid {
  name: string;
  pid: number;
}

/**
 * A process of the stack could not start because of a setting: `setting` is that process's own
 * (`KB_PORT`, `KB_DB`, …), read from its `failed to start` log line; `processName` says which.
 */
export class StackProcessStartupError extends StartupError {
  readonly processName: string;
  constructor(processName: string, setting: string, value: string | undefined, problem: string) {
    super(setting, value, problem);
    this.processName = processName;
  }
}

/** Why the stack stops by itself ({@link Stack.crashed}). */
export interface StackCrash {
  /** `nats-server`, `kb` or a service's name. */
  name: string;
  /** What the supervisor says about it, one sentence without the process's own output. */
  reason: string;
}

/** The nats-server a stack runs on, as the demo's and the bench's `--json` report it. */
export interface StackNatsServer {
  /** The version the server announced (`2.10.27`). */
  version: string;
  /** What its acknowledgements promise; `unknown` for a server the stack did not start (`natsUrl`): its configuration is not ours to read. */
  durability: Durability | 'unknown';
  /** Its nodes (1, or 3 for a cluster); 0 = unknown (`natsUrl`). */
  nodes: number;
}

export interface Stack {
  /** Every node's client URL, comma-separated. */
  natsUrl: string;
  natsServer: StackNatsServer;
  prefix: string;
  kbUrl: string;
  /** The KB's operator token (for its admin endpoints: roles, state, transfers). */
  kbAdminToken: string;
  /**
   * The KB's service token (`KB_SERVICE_TOKEN_FILE` of the KB and of the services that load the
   * tools module): what the demo's and the bench's own KbClient send to read stats and probes.
   */
  kbServiceToken: string;
  /** The KB's SQLite file (read-only checks of its rows, as the tests do). */
  kbDb: string;
  /**
   * The mail outbox's URL (`MAIL_URL` of the services) and its service token (`MAIL_SERVICE_TOKEN_FILE`
   * of the outbox and of the services that load the tools module): what the demo's own MailClient
   * sends to probe sends and drafts by key. Null when started with `mail: false`.
   */
  mail: { url: string; serviceToken: string } | null;
  /** The console's URL, and where each login's password is (`<auth dir>/console/passwords/`); null without `console`. */
  console: { url: string; passwordsDir: string } | null;
  /** The seed file of a role (agents: `{ kind: 'agent', tenant, actor }`). */
  seedFile(role: Role): string;
  /** The receipt keys agents trust (`receipt-keys.json` of the auth directory). */
  receiptKeysFile: string;
  /** A role's inbox prefix (agents must use it: they may subscribe nowhere else). */
  inboxPrefix(role: Role): string;
  /** The nats-server the stack started (a cluster's first node), or null with `natsUrl`. */
  server: NatsServerHandle | null;
  /** Every nats-server node the stack started. */
  servers: NatsServerHandle[];
  processes: { name: string; child: ChildProcess }[];
  /** SIGTERM every process, wait, stop the nats-server we started (store kept). */
  stop(): Promise<void>;
  /**
   * Resolves with the first process whose exit stops the stack and why: the KB or nats-server
   * exited (they are not restarted), a service exited a 6th time within a minute (it is restarted
   * at most 5 times a minute), or its restart could not be built.
   */
  readonly crashed: Promise<StackCrash>;
}

/**
 * Starts the stack (see the file's header). A failure caused by a setting throws a
 * {@link StartupError} naming it — `TOOLTX_STATE_DIR`, `KB_SEED_FILE`, `TOOLTX_IDENTITIES`,
 * `NATS_PORT`, `NATS_SERVER_BIN`, `NATS_URL`, `TOOLTX_AUTH_DIR`, `KB_SERVICE_TOKEN_FILE`,
 * `TOOLTX_STACK_RUNTIME` (not `compiled`/`tsx`, or the build failed or its cache is not writable),
 * `TOOLTX_STACK_NODE_FLAGS`, or a process's own setting
 * ({@link StackProcessStartupError}: `KB_PORT`, `KB_DB`, …) — and leaves nothing running.
 */
export async function startStack(o: StackOptions): Promise<Stack> {
  // First, before anything is created: the JavaScript the processes run (a few ms when cached).
  const runtimeEnv = process.env.TOOLTX_STACK_RUNTIME;
  const runtime =
    o.runtime ??
    (await startupStep(
      'TOOLTX_STACK_RUNTIME',
      runtimeEnv,
      () => stackRuntimeSchema.parse(runtimeEnv ?? 'compiled'),
      () => 'expected "compiled" or "tsx"',
    ));
  const flagsEnv = process.env.TOOLTX_STACK_NODE_FLAGS;
  const nodeFlags =
    o.nodeFlags ??
    (flagsEnv === undefined
      ? SERVICE_NODE_FLAGS
      : await startupStep(
          'TOOLTX_STACK_NODE_FLAGS',
          flagsEnv,
          () => nodeFlagsSchema.parse(flagsEnv),
          () => 'expected node flags separated by spaces, each starting with --',
        ));
  let build =
    runtime === 'compiled'
      ? await startupStep('TOOLTX_STACK_RUNTIME', 'compiled', () => ensureStackBuild(), buildProblem)
      : undefined;
  // 0700: it holds keys, seeds and every tenant's notes (kb.sqlite).
  await startupStep('TOOLTX_STATE_DIR', o.stateDir, () => makeDirs(o.stateDir, 0o700));
  // Development HMAC keys, kept in the state directory (0600) so audit records rebuilt
  // after a restart equal the ones they replace; a key file named in the environment wins.
  const keys = await startupStep('TOOLTX_STATE_DIR', o.stateDir, () => ({
    TOOLTX_AUDIT_HMAC_KEY_FILE:
      process.env.TOOLTX_AUDIT_HMAC_KEY_FILE ?? ensureKeyFile(join(o.stateDir, 'audit-hmac.key')),
    TOOLTX_LOG_HMAC_KEY_FILE: process.env.TOOLTX_LOG_HMAC_KEY_FILE ?? ensureKeyFile(join(o.stateDir, 'log-hmac.key')),
  }));
  // The KB's service token, kept there too: only the trusted side (the KB, and the authorizer,
  // executor and reconciler through the tools module) gets the file; a file named in the environment wins.
  const kbServiceTokenFile = await startupStep(
    'TOOLTX_STATE_DIR',
    o.stateDir,
    () => process.env.KB_SERVICE_TOKEN_FILE ?? ensureKeyFile(join(o.stateDir, 'kb-service.token')),
  );
  const kbServiceToken = await startupStep('KB_SERVICE_TOKEN_FILE', kbServiceTokenFile, () => {
    try {
      return readKeyFile(kbServiceTokenFile).toString('utf8');
    } catch (err) {
      throw err instanceof SecretFileError
        ? new StartupError('KB_SERVICE_TOKEN_FILE', err.file, err.problem, { cause: err })
        : err;
    }
  });
  // The mail outbox's service token, the same way: the outbox and the services that call it.
  const mailServiceTokenFile = await startupStep(
    'TOOLTX_STATE_DIR',
    o.stateDir,
    () => process.env.MAIL_SERVICE_TOKEN_FILE ?? ensureKeyFile(join(o.stateDir, 'mail-service.token')),
  );
  const mailServiceToken = await startupStep('MAIL_SERVICE_TOKEN_FILE', mailServiceTokenFile, () => {
    try {
      return readKeyFile(mailServiceTokenFile).toString('utf8');
    } catch (err) {
      throw err instanceof SecretFileError
        ? new StartupError('MAIL_SERVICE_TOKEN_FILE', err.file, err.problem, { cause: err })
        : err;
    }
  });
  // The tenant list (quotas) is read and checked before anything starts; the KB reads it again.
  const kbTenants = resolve(o.kbTenants ?? DEFAULT_KB_TENANTS);
  const tenantList = await startupStep('KB_SEED_FILE', kbTenants, () => loadSeedFile(kbTenants), seedProblem);
  const subjects = new Subjects(o.prefix);
  const nodes = o.natsUrl ? 0 : (o.cluster ?? 1);
  // On a cluster every stream and bucket has three replicas; the services check it (TOOLTX_REPLICAS).
  const replicas = nodes === 3 ? 3 : 1;
  const identitiesFile = process.env.TOOLTX_IDENTITIES;
  const identities: IdentityList =
    o.identities ??
    (identitiesFile
      ? await startupStep(
          'TOOLTX_IDENTITIES',
          identitiesFile,
          () => JSON.parse(readFileSync(identitiesFile, 'utf8')) as IdentityList,
          (err) => (err instanceof SyntaxError ? 'not JSON' : describeError(err)),
        )
      : DEFAULT_IDENTITIES);
  const parsedIdentities = identityListSchema.safeParse(identities);
  if (!parsedIdentities.success)
    throw new StartupError(
      'TOOLTX_IDENTITIES',
      identitiesFile,
      `not an identity list: ${parsedIdentities.error.issues.map((i) => `${i.path.join('.') || '(root)'}: ${i.message}`).join('; ')}`,
    );
  // Each tenant of the list gets its own intake and decision streams (docs/tenancy.md).
  const topo = topology(subjects, { replicas, tenants: tenantsOf(identities) });
  const durabilityEnv = process.env.TOOLTX_DURABILITY;
  const durability: Durability =
    o.durability ??
    (await startupStep(
      'TOOLTX_DURABILITY',
      durabilityEnv,
      () => z.enum(DURABILITIES as [Durability, ...Durability[]]).parse(durabilityEnv ?? 'fsync'),
      () => 'expected "fsync" or "os"',
    ));
  let servers: NatsServerHandle[] = [];
  let natsUrl = o.natsUrl;
  let seedFile: (role: Role) => string;
  let authDir: string;
  if (!natsUrl) {
    // Auth is always on: a fresh nkey per user for this run, the config holding public keys only.
    const listed = new Set(tenantList.tenants.map((t) => t.id));
    const parsed = parsedIdentities;
    const missing = parsed.data.tenants.filter((t) => !listed.has(t.id));
    if (missing.length) {
      throw new StartupError(
        'KB_SEED_FILE',
        kbTenants,
        missing
          .map((t) => `tenant ${t.id} of the identity list has no entry (give it a quota, or "quota": null for none)`)
          .join('; '),
      );
    }
    // A state directory keeps one layout: a cluster next to a single server's store (or the reverse)
    // would start from empty streams while the KB still holds the old notes.
    const otherLayout = nodes === 3 ? join(o.stateDir, 'jetstream') : join(o.stateDir, 'jetstream-n1');
    if (existsSync(otherLayout)) {
      throw new StartupError(
        'TOOLTX_STATE_DIR',
        o.stateDir,
        `holds the JetStream store of ${nodes === 3 ? 'a single server (jetstream/)' : 'a three-node cluster (jetstream-n1/ …)'}: start it as before, or give this layout another state directory`,
      );
    }
    // A cluster's routes listen on free loopback ports, chosen now: every node's configuration lists the others'.
    const routePorts = nodes === 3 ? await Promise.all([0, 1, 2].map(() => freeLoopbackPort())) : [];
    const clientPort = (i: number) => (o.natsPort === undefined || o.natsPort === -1 ? -1 : o.natsPort + i);
    const storeDirOf = (i: number) =>
      nodes === 3 ? join(o.stateDir, `jetstream-n${i + 1}`) : join(o.stateDir, 'jetstream');
    const auth = await startupStep(
      'TOOLTX_IDENTITIES',
      identitiesFile,
      () =>
        generateAuth(identities, {
          subjects,
          topology: topo,
          outDir: join(o.stateDir, 'auth'),
          listen: `127.0.0.1:${o.natsPort ?? -1}`,
          storeDir: storeDirOf(0),
          durability,
          ...(nodes === 3
            ? {
                cluster: {
                  nodes: routePorts.map((p, i) => ({
                    serverName: `n${i + 1}`,
                    listen: `127.0.0.1:${clientPort(i)}`,
                    clusterListen: `127.0.0.1:${p}`,
                    storeDir: storeDirOf(i),
                  })),
                },
              }
            : {}),
        }),
      // The identity checks' messages are tooltx's own (they name ids and field paths); a file error its code.
      (err) => (err instanceof Error && err.name === 'TooltxError' ? err.message : describeError(err)),
    );
    if (nodes === 3) {
      const cluster = await spawnNatsCluster(auth.configFiles, [0, 1, 2].map(storeDirOf), {
        ports: [0, 1, 2].map(clientPort),
        detached: true,
        exitWithParent: true,
      }).catch((err: unknown) => {
        throw natsServerProblem(err, o.natsPort);
      });
      servers = cluster.nodes;
      natsUrl = cluster.url;
    } else {
      const server = await spawnNatsServer({
        port: o.natsPort ?? -1,
        extraArgs: ['-c', auth.configFile],
        storeDir: storeDirOf(0),
        detached: true,
        exitWithParent: true,
      }).catch((err: unknown) => {
        throw natsServerProblem(err, o.natsPort);
      });
      servers = [server];
      natsUrl = server.url;
    }
    seedFile = (role) => auth.seedFile(role);
    authDir = join(o.stateDir, 'auth');
  } else {
    const dir = o.authDir ?? process.env.TOOLTX_AUTH_DIR;
    if (!dir)
      throw new StartupError(
        'TOOLTX_AUTH_DIR',
        undefined,
        'required when NATS_URL is set: the directory `tooltx auth generate` wrote for that server (or unset NATS_URL, and the stack runs its own nats-server)',
      );
    authDir = dir;
    seedFile = (role) => {
      const name =
        role.kind === 'agent' || role.kind === 'auditor'
          ? `${role.kind}.${role.tenant}.${role.actor}`
          : role.kind === 'service'
            ? `service.${role.service}`
            : role.kind === 'operator'
              ? `operator.${role.operator}`
              : 'provisioner';
      const f = join(dir, 'nkeys', `${name}.nk`);
      if (!existsSync(f))
        throw new StartupError(
          'TOOLTX_AUTH_DIR',
          dir,
          `no seed nkeys/${name}.nk in it (\`tooltx auth generate\` writes one per user)`,
        );
      return f;
    };
  }
  let serverVersion = 'unknown';
  const stopServers = () => Promise.all(servers.map((n) => n.stop({ removeStore: false })));
  try {
    const provisionerSeed = seedFile({ kind: 'provisioner' });
    const servers = natsUrl;
    const nc = await startupStep(
      'NATS_URL',
      displayUrl(servers),
      () =>
        connectNats({
          servers,
          name: 'tooltx-provisioner',
          nkeySeedFile: provisionerSeed,
          inboxPrefix: inboxPrefixOf({ kind: 'provisioner' }),
          reconnectForever: false,
        }),
      describeConnectError,
    );
    serverVersion = nc.info?.version ?? 'unknown';
    // 2.10 is the oldest server tooltx runs on (docs/nats-server.md); the services refuse it too.
    await startupStep(
      'NATS_URL',
      displayUrl(servers),
      () => assertSupportedServer(serverVersion),
      (err) => (err instanceof UnsupportedServerError ? `the server there is ${err.problem}` : describeError(err)),
    );
    const { jsm } = await jetStreamOf(nc);
    await startupStep(
      'NATS_URL',
      displayUrl(servers),
      () => applyTopology(nc, jsm, topo),
      (err) =>
        err instanceof Error && (isNatsError(err) || err.name === 'StreamConfigError')
          ? `cannot apply the streams as the provisioner: ${err.message}`
          : describeError(err),
    );
    await nc.drain();
  } catch (err) {
    await stopServers();
    throw err;
  }

  const processes: { name: string; child: ChildProcess }[] = [];
  const restartsOf = new Map<string, number[]>();
  let stopping = false;
  let onCrash!: (crash: StackCrash) => void;
  const crashed = new Promise<StackCrash>((r) => (onCrash = r));
  const serverName = (i: number) => (servers.length > 1 ? `nats-server-n${i + 1}` : 'nats-server');
  servers.forEach((n, i) => {
    n.process?.once('exit', (code, signal) => {
      if (!stopping)
        onCrash({
          name: serverName(i),
          reason: `${serverName(i)} exited (${signal ?? `code ${code}`}); it is not restarted`,
        });
      reportPids();
    });
  });
  const reportPids = () => {
    if (!o.onPids) return;
    const running = (c: ChildProcess | undefined) =>
      c?.pid !== undefined && c.exitCode === null && c.signalCode === null;
    const list: StackPid[] = [];
    servers.forEach((n, i) => {
      if (n.process && running(n.process)) list.push({ name: serverName(i), pid: n.process.pid! });
    });
    for (const p of processes) if (running(p.child)) list.push({ name: p.name, pid: p.child.pid! });
    o.onPids(list);
  };
  reportPids();
  /**
   * SIGTERM, and SIGKILL for a process still running after {@link HARD_STOP_MS} (a drain never blocks
   * the stop for good; a service gives itself 15 s), named on stderr: a killed process cannot say so.
   */
  const terminate = (group: { name?: string; child: ChildProcess }[]) =>
    Promise.all(
      group.map(({ name, child }) =>
        child.exitCode !== null || child.signalCode !== null
          ? undefined
          : new Promise((r) => {
              const hard = setTimeout(() => {
                process.stderr.write(
                  `tooltx-stack: ${name ?? `pid ${child.pid}`} still running ${HARD_STOP_MS / 1000} s after SIGTERM (hung or stopped): SIGKILL\n`,
                );
                child.kill('SIGKILL');
              }, HARD_STOP_MS);
              child.once('exit', () => {
                clearTimeout(hard);
                r(undefined);
              });
              child.kill('SIGTERM');
            }),
      ),
    );
  /** The downstreams: not restarted, and stopped after the services. */
  const DOWNSTREAMS = new Set(['kb', 'mail']);
  /** Services first (they finish in-flight work against the KB, the outbox and nats), then those, then nats. */
  const stop = async () => {
    stopping = true;
    await terminate(processes.filter((p) => !DOWNSTREAMS.has(p.name)));
    await terminate(processes.filter((p) => DOWNSTREAMS.has(p.name)));
    await stopServers();
  };
  /** Where a process's own words about a failure are (for a failure message). */
  const logsOf = (name: string) =>
    typeof o.logs === 'object' ? `its log ${join(o.logs.dir, `${name}.log`)}` : 'its output above';
  /** The node arguments of a process: its compiled entry, or its TypeScript source under tsx. */
  const argsOf = (entry: StackEntry, source: string): string[] => {
    // The co-located process gets its own flags unless they were set explicitly.
    const flags =
      entry === 'serve' && o.nodeFlags === undefined && flagsEnv === undefined ? HOST_NODE_FLAGS : nodeFlags;
    if (!build) return [...flags, '--import', 'tsx', source];
    touchStackBuild(build);
    return [...flags, '--enable-source-maps', build.path(entry)];
  };
  const launch = (name: string, program: StackEntry, source: string, env: Record<string, string>) => {
    // Own process group: a terminal's Ctrl-C reaches only the supervisor, which stops the services
    // first (they drain), then the KB, then nats-server.
    const child = spawn(process.execPath, argsOf(program, source), {
      detached: true,
      cwd: ROOT,
      // TOOLTX_EXIT_WITH_PARENT: the process stops by itself when this supervisor is gone, even
      // after a SIGKILL of it (each watches its parent pid; libs/runtime shutdown.ts).
      env: { ...process.env, ...o.env, ...keys, ...env, TOOLTX_EXIT_WITH_PARENT: String(process.pid) },
      // The IPC channel carries the process's readiness (announceReady), whatever LOG_LEVEL hides.
      stdio: ['ignore', 'pipe', 'pipe', 'ipc'],
    });
    if (o.logs === 'inherit') {
      child.stdout!.pipe(process.stdout);
      child.stderr!.pipe(process.stderr);
    } else if (o.logs === 'pretty') {
      const fmt = spawn(
        process.execPath,
        [join(ROOT, 'node_modules', 'pino-pretty', 'bin.js'), '--colorize', '--ignore', 'pid,hostname,instance'],
        { stdio: ['pipe', 'inherit', 'inherit'], detached: true },
      );
      child.stdout!.pipe(fmt.stdin!);
      child.stderr!.pipe(process.stderr);
    } else {
      mkdirSync(o.logs.dir, { recursive: true });
      const out = createWriteStream(join(o.logs.dir, `${name}.log`), { flags: 'a' });
      child.stdout!.pipe(out);
      child.stderr!.pipe(out);
    }
    const entry = { name, child };
    processes.push(entry);
    reportPids();
    child.once('exit', (code, signal) => {
      reportPids();
      if (stopping) return;
      // A tooltx service is stateless: the supervisor starts it again (a crash mid-operation is
      // exactly what recovery handles). The KB, the outbox or nats-server going away stops everything.
      const restarts = (restartsOf.get(name) ?? []).filter((t) => Date.now() - t < 60_000);
      if (!DOWNSTREAMS.has(name) && restarts.length < 5) {
        restartsOf.set(name, [...restarts, Date.now()]);
        o.onRestart?.(name, code, signal);
        setTimeout(() => {
          if (stopping) return;
          processes.splice(processes.indexOf(entry), 1);
          void (async () => {
            // The build's directory was removed while the stack ran (a cleaned cache): build again
            // (from the sources as they are now) rather than restart into a missing file.
            if (build && !existsSync(build.path(program))) {
              try {
                build = await ensureStackBuild();
              } catch (err) {
                process.stderr.write(
                  `tooltx-stack: cannot restart ${name}: the build is gone and rebuilding failed: ${err instanceof Error ? err.message : String(err)}\n`,
                );
                if (!stopping)
                  onCrash({ name, reason: `${name} could not be restarted: the build is gone and rebuilding failed` });
                return;
              }
            }
            if (!stopping) launch(name, program, source, env);
          })();
        }, 500);
        return;
      }
      const how = signal ?? `code ${code}`;
      onCrash({
        name,
        reason:
          name === 'kb'
            ? `the KB exited (${how}); it is not restarted`
            : name === 'mail'
              ? `the mail outbox exited (${how}); it is not restarted`
              : `${name} exited (${how}) a 6th time within a minute; a service is restarted at most 5 times a minute`,
      });
    });
    return child;
  };

  const url: string = natsUrl;
  try {
    return await launchAll();
  } catch (err) {
    // Never leave half a stack running (a nats-server holding the port, a KB holding its file).
    await stop();
    throw err;
  }

  async function launchAll(): Promise<Stack> {
    // The KB first: the executor needs its URL. Its operator token lives in the state directory.
    const kbAdminToken = o.kbAdminToken ?? randomBytes(24).toString('hex');
    const tokenFile = join(o.stateDir, 'kb-admin.token');
    writeFileSync(tokenFile, kbAdminToken, { mode: 0o600 });
    const kbChild = launch('kb', 'kb-server', join(ROOT, 'examples', 'research-kb', 'kb-server.ts'), {
      KB_ADMIN_TOKEN_FILE: tokenFile,
      KB_SERVICE_TOKEN_FILE: kbServiceTokenFile,
      KB_PORT: String(o.kbPort),
      KB_DB: join(o.stateDir, 'kb.sqlite'),
      KB_DEDUP: o.kbDedup ? 'on' : 'off',
      KB_SEED: o.kbSeed,
      KB_SEED_FILE: kbTenants,
      LOG_LEVEL: process.env.LOG_LEVEL ?? 'info',
    });
    // The mail outbox beside it, on a free port, its database in the state directory.
    const mailDedup = (o.mailDedup ?? o.kbDedup) ? 'on' : 'off';
    const mailChild =
      o.mail === false
        ? undefined
        : launch('mail', 'mail-server', join(ROOT, 'examples', 'research-kb', 'mail-server.ts'), {
            MAIL_PORT: '0',
            MAIL_DB: join(o.stateDir, 'mail.sqlite'),
            MAIL_DEDUP: mailDedup,
            MAIL_SERVICE_TOKEN_FILE: mailServiceTokenFile,
            LOG_LEVEL: process.env.LOG_LEVEL ?? 'info',
          });
    const [kbPort, mailPort] = await Promise.all([
      waitForReady(kbChild, 'kb', logsOf('kb')).then((r) => r.port),
      mailChild ? waitForReady(mailChild, 'mail', logsOf('mail')).then((r) => r.port) : null,
    ]);
    if (kbPort === undefined) throw new StartupFailure('the KB said it was ready without its port');
    if (mailPort === undefined) throw new StartupFailure('the mail outbox said it was ready without its port');
    const kbUrl = `http://127.0.0.1:${kbPort}`;
    const mailUrl = mailPort === null ? null : `http://127.0.0.1:${mailPort}`;

    const common = {
      NATS_URL: url,
      TOOLTX_PREFIX: o.prefix,
      ...(replicas !== 1 ? { TOOLTX_REPLICAS: String(replicas) } : {}),
      // Compiled: the tools module of the same build, so it shares the service's @tooltx/* modules.
      TOOLTX_TOOLS_MODULE: build ? build.path('tools') : RESEARCH_TOOLS,
      KB_URL: o.kbHop ? await o.kbHop(kbUrl) : kbUrl,
      KB_DEDUP: o.kbDedup ? 'on' : 'off',
      // The tools module builds the mail contracts from MAIL_DEDUP: the same as the outbox's.
      ...(mailUrl ? { MAIL_URL: mailUrl, MAIL_DEDUP: mailDedup } : {}),
    };
    const layout = o.layout ?? layoutFromEnv();
    if (layout === 'colocated')
      await Promise.all(
        Array.from({ length: o.instances?.tooltx ?? 1 }, (_, i) => {
          const name = `tooltx-${i + 1}`;
          const child = launch(name, 'serve', join(ROOT, 'bin', 'serve.ts'), {
            ...common,
            TOOLTX_INSTANCE_ID: name,
            // Each role connects as its own identity and signs with its own key from the auth directory.
            TOOLTX_AUTH_DIR: authDir,
            KB_SERVICE_TOKEN_FILE: kbServiceTokenFile,
            ...(mailUrl ? { MAIL_SERVICE_TOKEN_FILE: mailServiceTokenFile } : {}),
          });
          return waitForReady(child, name, logsOf(name));
        }),
      );
    await Promise.all(
      (layout === 'colocated' ? [] : SERVICES).flatMap((name) =>
        Array.from({ length: o.instances?.[name] ?? 1 }, (_, i) => {
          const child = launch(`${name}-${i + 1}`, name, join(ROOT, 'services', name, 'src', 'main.ts'), {
            ...common,
            TOOLTX_INSTANCE_ID: `${name}-${i + 1}`,
            NATS_NKEY_FILE: seedFile({ kind: 'service', service: name }),
            // The services that append `committed` sign their receipts.
            ...(name === 'executor' || name === 'reconciler'
              ? { TOOLTX_SIGNING_KEY_FILE: join(authDir, 'signing', `${name}.pem`) }
              : {}),
            // The services whose tools module calls the KB and the outbox (resolve, write, probe)
            // carry their service tokens.
            ...(name !== 'audit-projector' ? { KB_SERVICE_TOKEN_FILE: kbServiceTokenFile } : {}),
            ...(name !== 'audit-projector' && mailUrl ? { MAIL_SERVICE_TOKEN_FILE: mailServiceTokenFile } : {}),
          });
          return waitForReady(child, `${name}-${i + 1}`, logsOf(`${name}-${i + 1}`));
        }),
      ),
    );

    // The console last: it serves pages over the services above, as the logged-in identity.
    let consoleUrl: string | null = null;
    if (o.console) {
      const child = launch('console', 'console', join(ROOT, 'services', 'console', 'src', 'main.ts'), {
        NATS_URL: url,
        TOOLTX_PREFIX: o.prefix,
        TOOLTX_AUTH_DIR: authDir,
        TOOLTX_CONSOLE_PORT: String(o.console.port),
        TOOLTX_INSTANCE_ID: 'console-1',
      });
      const port = (await waitForReady(child, 'console', logsOf('console'))).port;
      if (port === undefined) throw new StartupFailure('the console said it was ready without its port');
      consoleUrl = `http://127.0.0.1:${port}`;
    }

    return {
      natsUrl: url,
      console: consoleUrl ? { url: consoleUrl, passwordsDir: join(authDir, 'console', 'passwords') } : null,
      natsServer: { version: serverVersion, durability: o.natsUrl ? 'unknown' : durability, nodes },
      prefix: o.prefix,
      receiptKeysFile: join(authDir, 'receipt-keys.json'),
      kbUrl,
      kbAdminToken,
      kbServiceToken,
      kbDb: join(o.stateDir, 'kb.sqlite'),
      mail: mailUrl ? { url: mailUrl, serviceToken: mailServiceToken } : null,
      seedFile,
      inboxPrefix: inboxPrefixOf,
      server: servers[0] ?? null,
      servers,
      processes,
      crashed,
      stop,
    };
  }
}

/** The `failed to start` line of a tooltx process (libs/runtime startup.ts). */
const failedLineSchema = z.object({
  msg: z.literal('failed to start'),
  setting: z.string().min(1),
  value: z.string().optional(),
  problem: z.string().optional(),
  problems: z.array(z.string()).optional(),
});

/**
 * Resolves with the ready message `child` sends over its IPC channel (libs/runtime `announceReady`:
 * the KB's carries its port) — readiness does not depend on LOG_LEVEL. When the process ends first,
 * rejects with a {@link StackProcessStartupError} naming the setting of its `failed to start` log
 * line if it logged one (LOG_LEVEL fatal or lower), else with a {@link StartupFailure} saying which
 * process exited how and where its own words are (`where`); a {@link StartupFailure} too after
 * `timeoutMs` without either.
 */
/** How long the stack waits for a process to exit after SIGTERM before it kills it, ms: a service's own 15 s grace plus a margin. */
const HARD_STOP_MS = 20_000;

function waitForReady(
  child: ChildProcess,
  name: string,
  where: string,
  timeoutMs = 30_000,
): Promise<Omit<ReadyMessage, 'tooltx'>> {
  return new Promise((resolvePromise, reject) => {
    let buf = '';
    let failed: z.infer<typeof failedLineSchema> | undefined;
    const done = () => {
      clearTimeout(timer);
      child.off('message', onMessage);
      child.stdout!.off('data', onData);
      child.off('close', onClose);
    };
    const timer = setTimeout(() => {
      done();
      reject(
        new StartupFailure(`${name} (pid ${child.pid}) was not ready within ${timeoutMs} ms; ${where} may say why`),
      );
    }, timeoutMs);
    const onMessage = (m: unknown) => {
      if (typeof m !== 'object' || m === null || (m as { tooltx?: unknown }).tooltx !== 'ready') return;
      done();
      const port = (m as ReadyMessage).port;
      resolvePromise(typeof port === 'number' ? { port } : {});
    };
    const onData = (c: Buffer) => {
      buf += c.toString();
      if (!failed && buf.includes('"msg":"failed to start"')) {
        for (const line of buf.split('\n')) {
          try {
            const r = failedLineSchema.safeParse(JSON.parse(line));
            if (r.success) failed = r.data;
          } catch {
            // not a whole JSON line yet
          }
        }
      }
      if (buf.length > 100_000) buf = buf.slice(-10_000);
    };
    // 'close', not 'exit': the last lines (its `failed to start`) are read by then.
    const onClose = (code: number | null, signal: NodeJS.Signals | null) => {
      done();
      if (!failed)
        return reject(
          new StartupFailure(`${name} exited (${signal ?? `code ${code}`}) before it was ready; ${where} says why`),
        );
      const { setting } = failed;
      // A configuration error's problems each start with their setting (and value, `NAME=value: `):
      // the first one's without them, since the error names them.
      const named = [
        `${setting}: `,
        ...(failed.value !== undefined ? [`${setting}=${showValue(failed.value)}: `] : []),
      ];
      const problem =
        failed.problem ??
        failed.problems?.map((p) => named.reduce((q, n) => (q.startsWith(n) ? q.slice(n.length) : q), p)).join('; ') ??
        'invalid';
      reject(new StackProcessStartupError(name, setting, failed.value, problem));
    };
    child.on('message', onMessage);
    child.stdout!.on('data', onData);
    child.once('close', onClose);
  });
}

/** Why the stack's JavaScript could not be built: esbuild's words about our sources, or the cache's file-system code. */
function buildProblem(err: unknown): string {
  if (err instanceof StackBuildError) return `cannot build the KB's and the services' JavaScript: ${err.message}`;
  return `cannot write the build cache node_modules/.cache/tooltx-stack (${describeError(err)}); TOOLTX_STACK_RUNTIME=tsx runs the TypeScript sources without a build`;
}

/** A seed file's problems (its own messages: field paths and rules, never a token). */
function seedProblem(err: unknown): string {
  return err instanceof SeedError
    ? err.problems.map((p) => p.replace(/^KB_SEED_FILE: /, '')).join('; ')
    : describeError(err);
}

/** Why the nats-server did not start, as a setting: its port in use, its binary missing or older than 2.10. */
function natsServerProblem(err: unknown, port: number | undefined): unknown {
  if (err instanceof UnsupportedServerError)
    return new StartupError('NATS_SERVER_BIN', natsServerBinary() ?? undefined, err.problem, { cause: err });
  if (!(err instanceof NatsServerUnavailableError)) return err;
  if (/address already in use/i.test(err.message))
    return new StartupError(
      'NATS_PORT',
      String(port ?? -1),
      'the port is already in use: another process listens on it (EADDRINUSE)',
      { cause: err },
    );
  if (/without a word on stderr/.test(err.message))
    return new StartupError(
      'NATS_SERVER_BIN',
      natsServerBinary() ?? undefined,
      err.message.replace(/^.* exited/, 'exited'),
      { cause: err },
    );
  if (/not found/.test(err.message))
    return new StartupError(
      'NATS_SERVER_BIN',
      process.env.NATS_SERVER_BIN,
      "no nats-server 2.10 or later: `scripts/ensure-nats-server` fetches Debian 13's into .nats-server/, or name one in NATS_SERVER_BIN",
      { cause: err },
    );
  // Its own log's last lines: the server's words about our generated configuration.
  return new StartupError(
    'NATS_PORT',
    String(port ?? -1),
    `the nats-server did not start: ${err.message.slice(0, 400)}`,
    { cause: err },
  );
}

/** `TOOLTX_STACK_LAYOUT` (`colocated` or `services`), default `services`; anything else throws a StartupError naming it. */
function layoutFromEnv(): StackLayout {
  const v = process.env.TOOLTX_STACK_LAYOUT;
  if (v === undefined || v === '') return 'services';
  if ((STACK_LAYOUTS as readonly string[]).includes(v)) return v as StackLayout;
  throw new StartupError('TOOLTX_STACK_LAYOUT', v, `expected ${STACK_LAYOUTS.join(' or ')}`);
}
