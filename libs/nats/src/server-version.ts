/** How to get a supported nats-server: named in every error about a missing or unsupported one. */
export const INSTALL_HINT =
  "run `scripts/ensure-nats-server` (it fetches Debian 13's nats-server 2.10 into .nats-server/), name a nats-server 2.10 or later in NATS_SERVER_BIN, or set NATS_URL";

/**
 * The oldest nats-server tooltx runs on (docs/nats-server.md): 2.9.x can be stopped by any agent
 * (nats-io/nats-server#3862, fixed in 2.9.15), has no `sync_interval` to fsync before every
 * acknowledgement, and its clustered expected-sequence check was racy before 2.9.21
 * (nats-io/nats-server#4320).
 */
export const MIN_SERVER_VERSION = '2.10.0';

/** `[major, minor, patch]` of a server version (`2.10.27`, `v2.10.27`, `nats-server: v2.10.27`), or null. */
export function parseServerVersion(version: string): [number, number, number] | null {
  const m = /v?(\d+)\.(\d+)\.(\d+)/.exec(version);
  return m ? [Number(m[1]), Number(m[2]), Number(m[3])] : null;
}

/** Whether server `version` is `min` or later (false when it is not a version). */
export function serverVersionAtLeast(version: string, min: string): boolean {
  const v = parseServerVersion(version);
  const m = parseServerVersion(min);
  if (!v || !m) return false;
  for (let i = 0; i < 3; i++) if (v[i]! !== m[i]!) return v[i]! > m[i]!;
  return true;
}

/**
 * Thrown when a server older than {@link MIN_SERVER_VERSION} answers or is named; `problem` names
 * its version, why it is refused and how to get a newer one (`<where> is <problem>` is the message).
 */
export class UnsupportedServerError extends Error {
  readonly version: string;
  readonly problem: string;
  constructor(version: string, where: string) {
    const problem = `nats-server ${version}; tooltx needs ${MIN_SERVER_VERSION} or later (2.9.x can be stopped by any agent, nats-io/nats-server#3862, and cannot fsync before every acknowledgement): ${INSTALL_HINT}`;
    super(`${where} is ${problem}`);
    this.name = 'UnsupportedServerError';
    this.version = version;
    this.problem = problem;
  }
}

/** Throws {@link UnsupportedServerError} when `version` (a connection's `info.version`) is older than {@link MIN_SERVER_VERSION}. */
export function assertSupportedServer(version: string | undefined, where = 'the server'): void {
  if (version === undefined || !serverVersionAtLeast(version, MIN_SERVER_VERSION))
    throw new UnsupportedServerError(version ?? 'of unknown version', where);
}

/**
 * What an acknowledgement of the server promises (docs/durability.md):
 * - `fsync` (default): `jetstream { sync_interval: always }` — the server fsyncs before it acknowledges,
 *   so an acknowledged write survives a power failure or an OS crash;
 * - `os`: the server's own default — written to the OS's buffers and flushed every 2 minutes, so a
 *   power failure or an OS crash can lose what was acknowledged in those minutes (Jepsen, NATS 2.12.1,
 *   2025); a killed server process loses nothing.
 */
export type Durability = 'fsync' | 'os';
export const DURABILITIES: readonly Durability[] = ['fsync', 'os'];

/** The `jetstream { … }` block of a server configuration: file storage in `storeDir`, with `durability`. */
export function jetstreamConfigBlock(storeDir: string, durability: Durability = 'fsync'): string {
  return `jetstream { store_dir: ${JSON.stringify(storeDir)}${durability === 'fsync' ? ', sync_interval: always' : ''} }`;
}
