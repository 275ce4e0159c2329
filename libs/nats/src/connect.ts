import { appendFileSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import {
  connect,
  credsAuthenticator,
  errors as natsErrors,
  nkeyAuthenticator,
  type NatsConnection,
} from '@nats-io/transport-node';
import { jetstream, jetstreamManager, type JetStreamClient, type JetStreamManager } from '@nats-io/jetstream';
import { Kvm, type KV } from '@nats-io/kv';
import { applyClientPatches } from './client-patches.js';

export type { NatsConnection } from '@nats-io/transport-node';

/** Options of {@link connectNats}. */
export interface ConnectOptions {
  /** Comma-separated URLs, e.g. `nats://127.0.0.1:4222`. */
  servers: string;
  /** Connection name shown by the server (`service@instance`). */
  name: string;
  /** Path of a `.creds` file (secrets come from files named in the environment). */
  credsFile?: string | undefined;
  /** Path of a file holding an nkey seed (`SU…`), as written by `tooltx auth generate`. */
  nkeySeedFile?: string | undefined;
  /** Per-user inbox prefix; restricted users may subscribe only there (FM-32). */
  inboxPrefix?: string | undefined;
  /** Keep reconnecting forever (services) or fail after the default attempts (CLIs). Default true. */
  reconnectForever?: boolean;
}

/**
 * Connects with reconnects on; throws the client's connection error when no server answers. The
 * connection writes once per event-loop turn and builds no Error per answered request
 * (./client-patches.ts: hooks on nats.js 3.4.0 internals, skipped with a warning if they differ).
 */
export async function connectNats(opts: ConnectOptions): Promise<NatsConnection> {
  const authenticator = opts.credsFile
    ? credsAuthenticator(await readFile(opts.credsFile))
    : opts.nkeySeedFile
      ? nkeyAuthenticator(new TextEncoder().encode((await readFile(opts.nkeySeedFile, 'utf8')).trim()))
      : undefined;
  const nc = await connect({
    servers: opts.servers
      .split(',')
      .map((s) => s.trim())
      .filter(Boolean),
    name: opts.name,
    ...(authenticator ? { authenticator } : {}),
    ...(opts.inboxPrefix ? { inboxPrefix: opts.inboxPrefix } : {}),
    maxReconnectAttempts: opts.reconnectForever === false ? 10 : -1,
    reconnectTimeWait: 250,
    pingInterval: 10_000,
    // nats.js otherwise builds two Error objects (a stack trace each) for every request — every
    // PubAck, direct get and KV read — to report the caller's stack if it ever times out: 9–17 % of
    // each service's CPU in the bench profile (docs/performance.md). Errors keep their class and message.
    noAsyncTraces: true,
  });
  applyClientPatches(nc);
  return nc;
}

/**
 * The JetStream client and manager for a connection; the manager never calls `$JS.API.INFO`.
 * With `TOOLTX_TEST_PUBACK_DIR` set (tests only), every PubAck the client receives is appended to
 * `<dir>/<pid>.jsonl` as `{ stream, subject, seq, duplicate, msgId }`, so a test can check that no
 * acknowledged write is missing from the stream after a node died (FM-29).
 */
export async function jetStreamOf(nc: NatsConnection): Promise<{ js: JetStreamClient; jsm: JetStreamManager }> {
  const js = jetstream(nc);
  const pubAckDir = process.env.TOOLTX_TEST_PUBACK_DIR;
  if (pubAckDir) recordPubAcks(js, join(pubAckDir, `${process.pid}.jsonl`));
  const jsm = await jetstreamManager(nc, { checkAPI: false });
  return { js, jsm };
}

/** Wraps `js.publish` to append each PubAck to `file` (see {@link jetStreamOf}). */
function recordPubAcks(js: JetStreamClient, file: string): void {
  const publish = js.publish.bind(js);
  js.publish = async (subject, payload, opts) => {
    const ack = await publish(subject, payload, opts);
    try {
      appendFileSync(
        file,
        `${JSON.stringify({ stream: ack.stream, subject, seq: ack.seq, duplicate: ack.duplicate, ...(opts?.msgID ? { msgId: opts.msgID } : {}) })}\n`,
        { mode: 0o600 },
      );
    } catch {
      // The record is the test's; the publish it records succeeded and is answered as such.
    }
    return ack;
  };
}

/**
 * Opens a KV bucket the provisioner created. `Kvm.open` binds without reading the stream's
 * configuration and would fall back to `$JS.API.STREAM.MSG.GET`; our buckets are created with
 * `allow_direct` (checked at start-up), so reads use direct get, which the generated permissions
 * allow per bucket.
 */
export async function openBucket(nc: NatsConnection, bucket: string): Promise<KV> {
  return new Kvm(nc).open(bucket, { allow_direct: true });
}

/** A permissions violation the server reported (publish or subscribe, and the subject). */
export type PermissionViolation = InstanceType<typeof natsErrors.PermissionViolationError>;

/**
 * The server's permissions violation behind a client error, or null. nats.js wraps it in a
 * RequestError's `cause`, and our own errors may wrap that again (a StartupError of a start-up
 * step): the `cause` chain is followed up to 4 links.
 */
export function permissionViolationOf(err: unknown): PermissionViolation | null {
  for (let e: unknown = err, depth = 0; e instanceof Error && depth < 4; e = e.cause, depth++) {
    if (e instanceof natsErrors.PermissionViolationError) return e;
  }
  return null;
}

/**
 * A server list (`NATS_URL`, `servers`: comma-separated URLs or host:port) as it may be shown in an
 * error or a log: each URL's user-info (a user and password, or a token) replaced by `[redacted]`.
 */
export function displayUrl(urls: string): string {
  return (
    urls
      // With a scheme: everything between `//` and the last `@` before the host (a password may
      // hold `,` or `@`; the host part never holds `/`).
      .replace(/([a-z][a-z0-9+.-]*:\/\/)[^/?#]*@/gi, '$1[redacted]@')
      // Without one (`user:pw@host:4222`): up to the `@`, from the list's previous comma.
      .replace(/(^|,)(\s*)(?![a-z][a-z0-9+.-]*:\/\/)[^,/]*@/gi, '$1$2[redacted]@')
  );
}

/**
 * Which setting a failed {@link connectNats} is about, and why, in words that quote nothing from
 * the files (a seed's text never appears): `identity` — the seed is not an nkey seed or the creds
 * file not a .creds file (nats.js `NKeysError`, "unable to parse credentials"); `url` — the server
 * list is not a URL (`ERR_INVALID_URL`, "Invalid URL"); null for anything else (connection refused,
 * authorisation), which the caller describes itself.
 */
export function connectProblemOf(err: unknown): { about: 'identity' | 'url'; problem: string } | null {
  for (let e: unknown = err, depth = 0; e instanceof Error && depth < 4; e = e.cause, depth++) {
    if (e.constructor.name === 'NKeysError' || /^nkeys: /.test(e.message))
      return { about: 'identity', problem: 'not an nkey seed (`tooltx auth generate` writes one per user)' };
    if (e.message === 'unable to parse credentials')
      return { about: 'identity', problem: 'not a .creds file (a JWT and an nkey seed)' };
    if ((e as NodeJS.ErrnoException).code === 'ERR_INVALID_URL' || /^Invalid URL/.test(e.message))
      return { about: 'url', problem: 'not a valid server URL (nats://host:port, comma-separated)' };
  }
  return null;
}
