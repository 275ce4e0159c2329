import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, existsSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, delimiter } from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  INSTALL_HINT,
  jetstreamConfigBlock,
  MIN_SERVER_VERSION,
  parseServerVersion,
  serverVersionAtLeast,
  UnsupportedServerError,
  type Durability,
} from '@tooltx/nats';

/** Thrown when no NATS server can be found or started; names the install command. */
export class NatsServerUnavailableError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'NatsServerUnavailableError';
  }
}

/** A nats-server this process started (or was pointed at). */
export interface NatsServerHandle {
  /** `nats://127.0.0.1:<port>` */
  url: string;
  port: number;
  /** JetStream store directory (file storage); absent for external servers. */
  storeDir?: string;
  /** How it was found: `env` (NATS_URL), `binary`, `container`. */
  source: 'env' | 'binary' | 'container';
  /** Stops a server this process started (SIGTERM, then SIGKILL after 5 s); no-op for `env`. */
  stop(opts?: { removeStore?: boolean }): Promise<void>;
  /** Kills (SIGKILL unless told) and restarts a spawned server on the same port and store (FM-28); throws for others. */
  restart?(signal?: NodeJS.Signals): Promise<void>;
  /** Stops a spawned server with `signal` (default SIGKILL: a crash) and waits for its exit, keeping its store; {@link restart} starts it again. */
  kill?(signal?: NodeJS.Signals): Promise<void>;
  /** The binary's version (`2.10.27`), when this process started it. */
  version?: string;
  /** The child process of a spawned server. */
  process?: ChildProcess;
}

/**
 * The Debian suites whose `nats-server` package `scripts/ensure-nats-server` unpacks into
 * `.nats-server/<suite>/`: `trixie` (2.10.27 or later, the default), `sid` (the current release,
 * for the newer-server tests) and `bookworm` (2.9.10, only for the tests that show it refused).
 */
export type ServerSuite = 'trixie' | 'sid' | 'bookworm';

/**
 * The project's own binary of `suite`, or null: `.nats-server/<suite>/` in the root of the tooltx
 * checkout this module (or the working directory) lies in ({@link packageRoot}). Never a directory
 * further up: anyone may create `/tmp/.nats-server`.
 */
export function projectServerBinary(suite: ServerSuite = 'trixie'): string | null {
  for (const start of [dirname(fileURLToPath(import.meta.url)), process.cwd()]) {
    const root = packageRoot(start);
    if (!root) continue;
    const p = join(root, '.nats-server', suite, 'usr', 'sbin', 'nats-server');
    if (existsSync(p)) return p;
  }
  return null;
}

/**
 * The tooltx checkout `start` lies in: the nearest directory at or above it whose `package.json` is
 * the `tooltx` package, passing only its own workspaces (`@tooltx/*`); null at any other package.
 */
function packageRoot(start: string): string | null {
  for (let dir = start; ; dir = dirname(dir)) {
    const pkg = join(dir, 'package.json');
    if (existsSync(pkg)) {
      let name: unknown;
      try {
        name = (JSON.parse(readFileSync(pkg, 'utf8')) as { name?: unknown }).name;
      } catch {
        return null;
      }
      if (name === 'tooltx') return dir;
      if (typeof name !== 'string' || !name.startsWith('@tooltx/')) return null;
    }
    if (dirname(dir) === dir) return null;
  }
}

const versionCache = new Map<string, string | null>();
/** What `bin --version` prints (`2.10.27`), or null when it does not run or print one; cached per path. */
export function binaryVersion(bin: string): string | null {
  if (versionCache.has(bin)) return versionCache.get(bin)!;
  let v: string | null = null;
  try {
    const out = execFileSync(bin, ['--version'], {
      encoding: 'utf8',
      timeout: 5_000,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const p = parseServerVersion(out);
    v = p ? p.join('.') : null;
  } catch {
    v = null;
  }
  versionCache.set(bin, v);
  return v;
}

/**
 * Path of the `nats-server` binary: `NATS_SERVER_BIN` when set (as it is, even when missing or
 * old: a named binary is never silently replaced by another one, and {@link spawnNatsServer}
 * refuses one older than {@link MIN_SERVER_VERSION}); else the project's own
 * (`.nats-server/trixie/`, from `scripts/ensure-nats-server`); else the first on PATH or in
 * Debian's places that is {@link MIN_SERVER_VERSION} or later — Debian 12's 2.9.10 is never picked.
 * Null when there is none.
 */
export function natsServerBinary(
  env: NodeJS.ProcessEnv = process.env,
  o: { /** Look for the project's own (default true). */ project?: boolean } = {},
): string | null {
  if (env.NATS_SERVER_BIN) return env.NATS_SERVER_BIN;
  const own = o.project === false ? null : projectServerBinary('trixie');
  if (own) return own;
  const candidates = [
    ...(env.PATH ?? '')
      .split(delimiter)
      .filter(Boolean)
      .map((dir) => join(dir, 'nats-server')),
    '/usr/sbin/nats-server',
    '/usr/bin/nats-server',
  ];
  for (const p of candidates) {
    if (!existsSync(p)) continue;
    const v = binaryVersion(p);
    if (v && serverVersionAtLeast(v, MIN_SERVER_VERSION)) return p;
  }
  return null;
}

/**
 * util-linux `setpriv` when it can set a parent-death signal (Linux), else null. It execs the
 * server in place, so the child's pid is the server's.
 */
export function setprivBinary(): string | null {
  if (process.platform !== 'linux') return null;
  for (const p of ['/usr/bin/setpriv', '/bin/setpriv', '/usr/sbin/setpriv']) if (existsSync(p)) return p;
  return null;
}

const ownedServers = new Set<ChildProcess>();
process.once('exit', () => {
  for (const c of ownedServers) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
});

/**
 * Spawns `nats-server -p <port|-1> -c FILE` — the caller's `-c FILE` in `extraArgs`, else a configuration
 * on loopback with JetStream in `storeDir` and `durability` (fsync by default) —
 * and resolves once it logs its client port. Throws {@link NatsServerUnavailableError} when the
 * binary is missing or the server exits before listening (10 s), and {@link UnsupportedServerError}
 * for a binary older than {@link MIN_SERVER_VERSION} unless `allowUnsupported`.
 */
export async function spawnNatsServer(
  opts: {
    port?: number;
    storeDir?: string;
    extraArgs?: string[];
    binary?: string;
    /** Run in its own process group, so a terminal's Ctrl-C reaches only the supervisor, which stops it last. */
    detached?: boolean;
    /**
     * The server gets SIGTERM when this process dies, even by SIGKILL, so a supervisor's crash
     * leaves no server holding the port and the store (`kill -9` of `npm start`).
     * Linux only, through util-linux `setpriv --pdeathsig` (found as {@link setprivBinary}); where
     * it is missing, nothing is done and the caller must find an orphan itself (npm start's lock).
     */
    exitWithParent?: boolean;
    /** Start a server older than {@link MIN_SERVER_VERSION} anyway (only the tests that show it refused do). */
    allowUnsupported?: boolean;
    /** Without `-c` in `extraArgs`: the durability of the configuration written for it (default `fsync`). */
    durability?: Durability;
  } = {},
): Promise<NatsServerHandle> {
  const bin = opts.binary ?? natsServerBinary();
  if (!bin) throw new NatsServerUnavailableError(`nats-server not found: ${INSTALL_HINT}`);
  // A bare name is looked up on PATH by the same exec that runs it.
  const version = binaryVersion(bin);
  if (version && !opts.allowUnsupported && !serverVersionAtLeast(version, MIN_SERVER_VERSION))
    throw new UnsupportedServerError(version, bin);
  const storeDir = opts.storeDir ?? mkdtempSync(join(tmpdir(), 'tooltx-js-'));
  // Without a configuration of the caller's, one of ours: `sync_interval` has no command-line flag.
  let extraArgs = opts.extraArgs ?? [];
  if (!extraArgs.includes('-c')) {
    const conf = `${storeDir.replace(/\/+$/, '')}.conf`;
    writeFileSync(conf, `listen: "127.0.0.1:-1"\n${jetstreamConfigBlock(storeDir, opts.durability)}\n`, {
      mode: 0o600,
    });
    extraArgs = ['-c', conf, ...extraArgs];
  }
  let child!: ChildProcess;
  const start = (port: number) =>
    new Promise<number>((resolve, reject) => {
      const args = ['-p', String(port), ...extraArgs];
      const setpriv = opts.exitWithParent ? setprivBinary() : null;
      child = setpriv
        ? spawn(setpriv, ['--pdeathsig', 'TERM', '--', bin, ...args], {
            stdio: ['ignore', 'ignore', 'pipe'],
            detached: opts.detached ?? false,
          })
        : spawn(bin, args, { stdio: ['ignore', 'ignore', 'pipe'], detached: opts.detached ?? false });
      // A server this process spawned attached (tests, one-off tools) dies with it, even when the
      // caller never reached its stop(); a detached one (npm start's stack) is stopped by its owner.
      if (!opts.detached) ownedServers.add(child);
      const spawned = child;
      spawned.once('exit', () => ownedServers.delete(spawned));
      let log = '';
      const timer = setTimeout(
        () => reject(new NatsServerUnavailableError(`nats-server did not start in 10 s: ${log.slice(-500)}`)),
        10_000,
      );
      child.stderr!.setEncoding('utf8');
      child.stderr!.on('data', (chunk: string) => {
        if (log.length < 20_000) log += chunk;
        const m = /Listening for client connections on [^\s]*:(\d+)/.exec(log);
        if (m) {
          clearTimeout(timer);
          resolve(Number(m[1]));
        }
      });
      child.once('exit', (code) => {
        clearTimeout(timer);
        // A binary that says nothing before it exits is likely no nats-server at all (NATS_SERVER_BIN=/bin/false).
        reject(
          new NatsServerUnavailableError(
            log.trim()
              ? `nats-server exited with ${code}: ${log.slice(-500)}`
              : `${bin} exited with ${code} without a word on stderr: is it a nats-server?`,
          ),
        );
      });
    });
  let port = await start(opts.port ?? -1);
  const stopChild = async (signal: NodeJS.Signals) => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise<void>((r) => child.once('exit', () => r()));
    child.kill(signal);
    const t = setTimeout(() => child.kill('SIGKILL'), 5_000);
    await exited;
    clearTimeout(t);
  };
  const handle: NatsServerHandle = {
    url: `nats://127.0.0.1:${port}`,
    port,
    storeDir,
    source: 'binary',
    get process() {
      return child;
    },
    async stop({ removeStore = opts.storeDir === undefined } = {}) {
      await stopChild('SIGTERM');
      if (removeStore) {
        rmSync(storeDir, { recursive: true, force: true });
        if (!opts.extraArgs?.includes('-c')) rmSync(`${storeDir.replace(/\/+$/, '')}.conf`, { force: true });
      }
    },
    async restart(signal: NodeJS.Signals = 'SIGKILL') {
      await stopChild(signal);
      port = await start(port);
    },
    async kill(signal: NodeJS.Signals = 'SIGKILL') {
      await stopChild(signal);
    },
    ...(version ? { version } : {}),
  };
  return handle;
}

/**
 * Finds a server for library code and tests (docs/nats-server.md): `NATS_URL` when set;
 * else spawns the `nats-server` binary on a free loopback port with a temp store; else starts a
 * testcontainers NATS when a Docker engine answers and the Node version can load testcontainers;
 * else throws {@link NatsServerUnavailableError} naming the install command. Never installs.
 */
export async function findOrStartNatsServer(env: NodeJS.ProcessEnv = process.env): Promise<NatsServerHandle> {
  if (env.NATS_URL) {
    const url = env.NATS_URL;
    const port = Number(/:(\d+)/.exec(url)?.[1] ?? 4222);
    return { url, port, source: 'env', async stop() {} };
  }
  if (natsServerBinary(env)) return spawnNatsServer();
  const container = await tryContainer();
  if (container) return container;
  throw new NatsServerUnavailableError(
    `no NATS server: NATS_URL is unset and nats-server is not installed; ${INSTALL_HINT}`,
  );
}

async function tryContainer(): Promise<NatsServerHandle | null> {
  // testcontainers 12 needs Node >= 22 and a Docker engine (it crashes on require under Node 20).
  if (Number(process.versions.node.split('.')[0]) < 22) return null;
  try {
    execFileSync('docker', ['info'], { stdio: 'ignore', timeout: 5_000 });
  } catch {
    return null;
  }
  try {
    const spec = 'testcontainers';
    type Started = { getMappedPort(p: number): number; getHost(): string; stop(): Promise<unknown> };
    type Builder = {
      withCommand(c: string[]): Builder;
      withExposedPorts(p: number): Builder;
      start(): Promise<Started>;
    };
    const tc = (await import(spec)) as { GenericContainer: new (image: string) => Builder };
    const c = new tc.GenericContainer('nats:2.10');
    const started = await c.withCommand(['-js']).withExposedPorts(4222).start();
    const port = started.getMappedPort(4222);
    return {
      url: `nats://${started.getHost()}:${port}`,
      port,
      source: 'container',
      async stop() {
        await started.stop();
      },
    };
  } catch {
    return null;
  }
}

/**
 * A TCP port on loopback that nothing listens on right now (bound once to port 0, then closed): for a
 * cluster node's route port or a monitoring port, which must be known before the server starts.
 */
export function freeLoopbackPort(): Promise<number> {
  return new Promise((resolvePort, reject) => {
    const probe = createServer();
    probe.once('error', reject);
    probe.listen(0, '127.0.0.1', () => {
      const a = probe.address();
      probe.close(() => resolvePort(typeof a === 'object' && a ? a.port : 0));
    });
  });
}

/** The nodes of a cluster this process started ({@link spawnNatsCluster}). */
export interface NatsClusterHandle {
  /** Every node's client URL, comma-separated (what `NATS_URL` and `createTools({ servers })` take). */
  url: string;
  nodes: NatsServerHandle[];
  stop(opts?: { removeStore?: boolean }): Promise<void>;
}

/**
 * Spawns one nats-server per configuration of a cluster (`generateAuth({ cluster })` writes them,
 * docs/cluster.md) at once — a node waits for its routes, so one after the other would stall — with
 * `storeDirs[i]` and client port `ports[i]` (default a free one each). Throws as
 * {@link spawnNatsServer}; a node that fails stops the others.
 */
export async function spawnNatsCluster(
  configFiles: string[],
  storeDirs: string[],
  opts: {
    ports?: number[];
    binary?: string;
    detached?: boolean;
    exitWithParent?: boolean;
    allowUnsupported?: boolean /** More arguments per node (e.g. `-m PORT`). */;
    extraArgs?: string[][];
  } = {},
): Promise<NatsClusterHandle> {
  const started = await Promise.allSettled(
    configFiles.map((file, i) =>
      spawnNatsServer({
        extraArgs: ['-c', file, ...(opts.extraArgs?.[i] ?? [])],
        storeDir: storeDirs[i]!,
        ...(opts.ports?.[i] !== undefined ? { port: opts.ports[i] } : {}),
        ...(opts.binary ? { binary: opts.binary } : {}),
        ...(opts.detached !== undefined ? { detached: opts.detached } : {}),
        ...(opts.exitWithParent !== undefined ? { exitWithParent: opts.exitWithParent } : {}),
        ...(opts.allowUnsupported !== undefined ? { allowUnsupported: opts.allowUnsupported } : {}),
      }),
    ),
  );
  const nodes = started.flatMap((r) => (r.status === 'fulfilled' ? [r.value] : []));
  const failed = started.find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (failed) {
    await Promise.all(nodes.map((n) => n.stop({ removeStore: false })));
    throw failed.reason;
  }
  return {
    url: nodes.map((n) => n.url).join(','),
    nodes,
    async stop(o) {
      await Promise.all(nodes.map((n) => n.stop(o)));
    },
  };
}
