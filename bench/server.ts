/**
 * The nats-server both systems run on, started the same way for each run (issue 10: same settings
 * for the lower bound and tooltx): Debian's `nats-server` binary, the configuration `tooltx auth
 * generate` writes for the sample's identity list (auth on, nkey users with allow-lists), JetStream
 * file storage in a fresh directory, streams R1, and the monitoring endpoint (`-m PORT`) on loopback
 * for `/connz` and `/varz`.
 */
import { execFileSync } from 'node:child_process';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { natsServerBinary, spawnNatsServer, Subjects, type NatsServerHandle } from '@tooltx/nats';
import { generateAuth, topology, type Role } from '@tooltx/streams';
import { DEFAULT_IDENTITIES } from '../examples/research-kb/stack.js';

export interface BenchServer {
  url: string;
  monitorUrl: string;
  /** Directory holding `nkeys/<user>.nk` (what `startStack({ authDir })` reads). */
  authDir: string;
  seedFile(role: Role): string;
  pid: number;
  handle: NatsServerHandle;
  stop(): Promise<void>;
}

/** A free TCP port on loopback (for the monitoring endpoint). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const a = s.address();
      const port = typeof a === 'object' && a ? a.port : 0;
      s.close(() => resolve(port));
    });
  });
}

/** `nats-server --version` of the binary the bench uses. */
export function natsServerVersion(): string {
  const bin = natsServerBinary();
  if (!bin) return 'not found';
  return execFileSync(bin, ['--version'], { encoding: 'utf8' }).trim();
}

/** Starts a nats-server for `prefix` in `dir` (config, seeds, store); `extraArgs` e.g. `-V` (trace, bench/trace.ts). */
export async function startBenchServer(dir: string, prefix: string, o: { extraArgs?: string[] } = {}): Promise<BenchServer> {
  const subjects = new Subjects(prefix);
  const storeDir = join(dir, 'jetstream');
  const auth = generateAuth(DEFAULT_IDENTITIES, { subjects, topology: topology(subjects), outDir: join(dir, 'auth'), listen: '127.0.0.1:-1', storeDir });
  const mport = await freePort();
  const handle = await spawnNatsServer({ extraArgs: ['-c', auth.configFile, '-m', String(mport), ...(o.extraArgs ?? [])], storeDir });
  const pid = handle.process?.pid;
  if (!pid) throw new Error('nats-server has no pid');
  return {
    url: handle.url,
    monitorUrl: `http://127.0.0.1:${mport}`,
    authDir: join(dir, 'auth'),
    seedFile: (role) => auth.seedFile(role),
    pid,
    handle,
    stop: () => handle.stop({ removeStore: true }),
  };
}
