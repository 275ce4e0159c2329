/**
 * The nats-server both systems run on, started the same way for each run (same settings for the
 * lower bounds and tooltx): the project's nats-server (Debian 13's 2.10, from
 * scripts/ensure-nats-server), the configuration `tooltx auth generate` writes for the sample's
 * identity list (auth on, nkey users with allow-lists), JetStream file storage in a fresh directory
 * with the run's durability (`fsync`: `sync_interval: always`, or `os`), streams R1, and the
 * monitoring endpoint (`-m PORT`) on loopback for `/connz` and `/varz`.
 */
import { join } from 'node:path';
import { Subjects, type Durability } from '@tooltx/nats';
import {
  binaryVersion,
  freeLoopbackPort,
  natsServerBinary,
  spawnNatsServer,
  type NatsServerHandle,
} from '@tooltx/dev/nats-server';
import { topology } from '@tooltx/streams';
import { generateAuth } from '@tooltx/auth';
import type { Role } from '@tooltx/nats';
import { DEFAULT_IDENTITIES } from '@tooltx/dev/stack';

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
export const freePort = freeLoopbackPort;

/** The version of the binary the bench uses (`2.10.27`), or `not found`. */
export function natsServerVersion(): string {
  const bin = natsServerBinary();
  return (bin && binaryVersion(bin)) ?? 'not found';
}

/** Starts a nats-server for `prefix` in `dir` (config, seeds, store); `extraArgs` e.g. `-V` (trace, bench/trace.ts). */
export async function startBenchServer(
  dir: string,
  prefix: string,
  o: { extraArgs?: string[]; durability?: Durability } = {},
): Promise<BenchServer> {
  const subjects = new Subjects(prefix);
  const storeDir = join(dir, 'jetstream');
  const auth = generateAuth(DEFAULT_IDENTITIES, {
    subjects,
    topology: topology(subjects),
    outDir: join(dir, 'auth'),
    listen: '127.0.0.1:-1',
    storeDir,
    durability: o.durability ?? 'fsync',
  });
  const mport = await freePort();
  const handle = await spawnNatsServer({
    extraArgs: ['-c', auth.configFile, '-m', String(mport), ...(o.extraArgs ?? [])],
    storeDir,
  });
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
