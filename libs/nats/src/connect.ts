import { readFile } from 'node:fs/promises';
import { connect, credsAuthenticator, type NatsConnection } from '@nats-io/transport-node';
import { jetstream, jetstreamManager, type JetStreamClient, type JetStreamManager } from '@nats-io/jetstream';

export type { NatsConnection } from '@nats-io/transport-node';

/** Options of {@link connectNats}. */
export interface ConnectOptions {
  /** Comma-separated URLs, e.g. `nats://127.0.0.1:4222`. */
  servers: string;
  /** Connection name shown by the server (`service@instance`). */
  name: string;
  /** Path of a `.creds` file (DESIGN.md: secrets come from files named in the environment). */
  credsFile?: string;
  /** Per-user inbox prefix; restricted users may subscribe only there (NATS-NOTES "Identity"). */
  inboxPrefix?: string;
  /** Keep reconnecting forever (services) or fail after the default attempts (CLIs). Default true. */
  reconnectForever?: boolean;
}

/** Connects with reconnects on; throws the client's connection error when no server answers. */
export async function connectNats(opts: ConnectOptions): Promise<NatsConnection> {
  const authenticator = opts.credsFile ? credsAuthenticator(await readFile(opts.credsFile)) : undefined;
  return connect({
    servers: opts.servers.split(',').map((s) => s.trim()).filter(Boolean),
    name: opts.name,
    ...(authenticator ? { authenticator } : {}),
    ...(opts.inboxPrefix ? { inboxPrefix: opts.inboxPrefix } : {}),
    maxReconnectAttempts: opts.reconnectForever === false ? 10 : -1,
    reconnectTimeWait: 250,
    pingInterval: 10_000,
  });
}

/** The JetStream client and manager for a connection; the manager never calls `$JS.API.INFO`. */
export async function jetStreamOf(nc: NatsConnection): Promise<{ js: JetStreamClient; jsm: JetStreamManager }> {
  const js = jetstream(nc);
  const jsm = await jetstreamManager(nc, { checkAPI: false });
  return { js, jsm };
}
