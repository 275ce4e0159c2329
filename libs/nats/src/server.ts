import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, delimiter } from 'node:path';

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
  /** Kills and restarts a spawned server on the same port and store (FM-28); throws for others. */
  restart?(): Promise<void>;
  /** The child process of a spawned server. */
  process?: ChildProcess;
}

const INSTALL_HINT =
  'install it with `sudo apt-get install nats-server` (Debian) or run `scripts/ensure-nats-server`, or set NATS_URL';

/**
 * Path of the `nats-server` binary: `NATS_SERVER_BIN` when set (as it is, even when missing: a
 * named binary is never silently replaced by another one — fresh-user trial), else the first on
 * PATH, else Debian's places, else null.
 */
export function natsServerBinary(env: NodeJS.ProcessEnv = process.env): string | null {
  if (env.NATS_SERVER_BIN) return env.NATS_SERVER_BIN;
  for (const dir of (env.PATH ?? '').split(delimiter)) {
    const p = join(dir, 'nats-server');
    if (dir && existsSync(p)) return p;
  }
  for (const p of ['/usr/sbin/nats-server', '/usr/bin/nats-server']) if (existsSync(p)) return p;
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

/**
 * Spawns `nats-server -a 127.0.0.1 -p <port|-1> -js -sd <dir>` (plus `extraArgs`, e.g. `-c FILE`)
 * and resolves once it logs its client port. Throws {@link NatsServerUnavailableError} when the
 * binary is missing or the server exits before listening (10 s).
 */
const ownedServers = new Set<ChildProcess>();
process.once('exit', () => {
  for (const c of ownedServers) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
});

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
     * leaves no server holding the port and the store (fresh-user trial: `kill -9` of `npm start`).
     * Linux only, through util-linux `setpriv --pdeathsig` (found as {@link setprivBinary}); where
     * it is missing, nothing is done and the caller must find an orphan itself (npm start's lock).
     */
    exitWithParent?: boolean;
  } = {},
): Promise<NatsServerHandle> {
  const bin = opts.binary ?? natsServerBinary();
  if (!bin) throw new NatsServerUnavailableError(`nats-server not found: ${INSTALL_HINT}`);
  const storeDir = opts.storeDir ?? mkdtempSync(join(tmpdir(), 'tooltx-js-'));
  let child!: ChildProcess;
  const start = (port: number) =>
    new Promise<number>((resolve, reject) => {
      const args = opts.extraArgs?.some((a) => a === '-c')
        ? ['-p', String(port), ...opts.extraArgs]
        : ['-a', '127.0.0.1', '-p', String(port), '-js', '-sd', storeDir, ...(opts.extraArgs ?? [])];
      const setpriv = opts.exitWithParent ? setprivBinary() : null;
      child = setpriv
        ? spawn(setpriv, ['--pdeathsig', 'TERM', '--', bin, ...args], { stdio: ['ignore', 'ignore', 'pipe'], detached: opts.detached ?? false })
        : spawn(bin, args, { stdio: ['ignore', 'ignore', 'pipe'], detached: opts.detached ?? false });
      // A server this process spawned attached (tests, one-off tools) dies with it, even when the
      // caller never reached its stop(); a detached one (npm start's stack) is stopped by its owner.
      if (!opts.detached) ownedServers.add(child);
      const spawned = child;
      spawned.once('exit', () => ownedServers.delete(spawned));
      let log = '';
      const timer = setTimeout(() => reject(new NatsServerUnavailableError(`nats-server did not start in 10 s: ${log.slice(-500)}`)), 10_000);
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
        reject(new NatsServerUnavailableError(log.trim() ? `nats-server exited with ${code}: ${log.slice(-500)}` : `${bin} exited with ${code} without a word on stderr: is it a nats-server?`));
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
      if (removeStore) rmSync(storeDir, { recursive: true, force: true });
    },
    async restart() {
      await stopChild('SIGKILL');
      port = await start(port);
    },
  };
  return handle;
}

/**
 * Finds a server for library code and tests (DESIGN.md "NATS server"): `NATS_URL` when set;
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
  throw new NatsServerUnavailableError(`no NATS server: NATS_URL is unset and nats-server is not installed; ${INSTALL_HINT}`);
}

async function tryContainer(): Promise<NatsServerHandle | null> {
  // testcontainers 12 needs Node >= 22 and a Docker engine (NATS-NOTES "Client packages").
  if (Number(process.versions.node.split('.')[0]) < 22) return null;
  try {
    execFileSync('docker', ['info'], { stdio: 'ignore', timeout: 5_000 });
  } catch {
    return null;
  }
  try {
    const spec = 'testcontainers';
    type Started = { getMappedPort(p: number): number; getHost(): string; stop(): Promise<unknown> };
    type Builder = { withCommand(c: string[]): Builder; withExposedPorts(p: number): Builder; start(): Promise<Started> };
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
