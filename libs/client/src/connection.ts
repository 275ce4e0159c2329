import { jetstream, type JetStreamClient } from '@nats-io/jetstream';
import { errors } from '@nats-io/transport-node';
import { ErrorClass, TooltxError, type ErrorInfo, type FieldIssue } from '@tooltx/contracts';
import { pushMessageSchema, type PushMessage, type StatusAnswer, type StatusRequest } from '@tooltx/lifecycle';
import {
  connectNats,
  decode,
  displayUrl,
  encode,
  permissionViolationOf,
  Subjects,
  type NatsConnection,
  type PermissionViolation,
} from '@tooltx/nats';
import { ToolsOptionError, type CreateToolsOptions } from './options.js';

/** The SDK's connection, checked at start: its subjects, its pushed answers, and what the server refuses. */
export interface Connection {
  nc: NatsConnection;
  js: JetStreamClient;
  subjects: Subjects;
  /** What a permissions violation of the server means for this configuration, as a field issue. */
  deniedIssue(v: PermissionViolation, when: 'setup' | 'call'): FieldIssue;
  /** The refusal of this connection's credentials while the server refuses them (a rotated or revoked key, an expired credential); else null. */
  credentialsRefusal(): ErrorInfo | null;
  pushes: Pushes;
  /** Ends the watch of connection events and the push subscription; drains the connection when the SDK owns it. */
  close(): Promise<void>;
}

/** The pushed answers of this connection's calls (one subscription, a waiter per submission in flight). */
export interface Pushes {
  /** Whether this connection has received a push that answered a call: services that push are deployed. */
  readonly seen: boolean;
  /**
   * Registers the waiter of one submission's push for the call of `key` (before the submission is
   * published); null when this connection gets no pushes (refused, or an id that is not one subject token).
   */
  waitFor(submissionId: string, key: string, inputDigest: string): PushWait | null;
}

/** A submission's push: the message once it comes, and its answer (never settles on a "poll"). */
export interface PushWait {
  pushed: Promise<PushMessage>;
  final: Promise<StatusAnswer>;
  cancel(): void;
}

/**
 * Connects (or takes `opts.nc`), checks that the server lets this connection act as
 * `tenant`/`actor` under the prefix, watches for the server refusing its credentials and subscribes
 * to its pushed answers. Throws as {@link createTools} documents (a connection it opened is closed
 * again): `TooltxError(forbidden)` for refused credentials or permissions,
 * `TooltxError(dependency_unavailable)` when no server answers, {@link ToolsOptionError} for a
 * `servers` value that is not a URL list.
 */
export async function openConnection(opts: CreateToolsOptions): Promise<Connection> {
  const subjects = new Subjects(opts.prefix ?? 'tooltx');
  const owned = !opts.nc;
  const inboxPrefix = opts.inboxPrefix ?? `_INBOX.${opts.tenant}.${opts.actor}`;
  const servers = opts.servers ?? 'nats://127.0.0.1:4222';
  const nc =
    opts.nc ??
    (await connectNats({
      servers,
      name: `tooltx-sdk:${opts.tenant}/${opts.actor}`,
      credsFile: opts.credsFile,
      nkeySeedFile: opts.nkeyFile,
      inboxPrefix,
    }).catch((err: unknown) => {
      throw connectFailure(err, servers, opts);
    }));
  const credentials = opts.nkeyFile ? 'nkeyFile' : opts.credsFile ? 'credsFile' : opts.nc ? 'nc' : 'servers';
  const identity = opts.nkeyFile ? ` (seed ${opts.nkeyFile})` : opts.credsFile ? ` (creds ${opts.credsFile})` : '';
  const deniedIssue = (v: PermissionViolation, when: 'setup' | 'call'): FieldIssue => ({
    path: [credentials],
    code: 'permission_violation',
    message:
      `the server refused ${v.operation === 'publish' ? 'publishing to' : 'subscribing to'} ${v.subject}: ` +
      `this connection's identity${identity} ${when === 'setup' ? 'is not' : 'may no longer act as'} ` +
      `${opts.tenant}/${opts.actor} under prefix ${subjects.prefix}` +
      (v.operation === 'publish' ? '' : `, or inboxPrefix ${inboxPrefix} is not that actor's`),
  });
  try {
    const denied = await probePermissions(nc, subjects.status(opts.tenant, opts.actor));
    if (denied) {
      const issue = deniedIssue(denied, 'setup');
      throw new TooltxError(ErrorClass.Forbidden, `createTools: ${issue.message}`, { issues: [issue] });
    }
  } catch (err) {
    if (owned) await nc.close().catch(() => undefined);
    throw err;
  }
  // The server refusing this connection's credentials: nats.js keeps reconnecting and every publish
  // would wait out its timeout until the budget ends, answered `unknown`/`observe`. Calls answer at
  // once instead, `forbidden`/`reauthorise`, until the connection is back.
  let credentialsRefused: Error | undefined;
  const statusEvents = nc.status();
  void (async () => {
    for await (const s of statusEvents) {
      if (
        s.type === 'error' &&
        (s.error instanceof errors.AuthorizationError || s.error instanceof errors.UserAuthenticationExpiredError)
      )
        credentialsRefused = s.error;
      else if (s.type === 'reconnect') credentialsRefused = undefined;
    }
  })().catch(() => undefined);
  const credentialsRefusal = (): ErrorInfo | null =>
    credentialsRefused
      ? {
          class: ErrorClass.Forbidden,
          issues: [
            {
              path: [credentials],
              code: 'credentials_refused',
              message: `the server refuses this connection's credentials${identity}: ${credentialsRefused.message ?? 'authorization violation'}; the key was rotated or revoked`,
            },
          ],
        }
      : null;
  const pushes = subscribePushes(nc, subjects, opts.tenant, opts.actor);
  return {
    nc,
    js: jetstream(nc),
    subjects,
    deniedIssue,
    credentialsRefusal,
    pushes,
    async close() {
      // The listener of connection events ends with this object (a caller-supplied `nc` lives on).
      (statusEvents as AsyncIterable<unknown> & { stop?: () => void }).stop?.();
      if (!nc.isClosed()) pushes.unsubscribe();
      // Closed already (e.g. the server refused its credentials twice and nats.js gave up): nothing to drain.
      if (owned && !nc.isClosed()) await nc.drain();
    },
  };
}

/**
 * Pushed answers: the executor pushes a committed receipt (and the authorizer and the executor a
 * "poll now" for other outcomes) to `<p>.push.<tenant>.<actor>.<submissionId>`. One subscription; a
 * waiter per submission in flight. Best effort: the status endpoint stays the truth, and a
 * connection whose identity may not subscribe there (an older auth configuration) simply polls.
 *
 * A message on that subject is NOT trusted as such: any agent of the tenant can make the status
 * service answer onto it (a request's reply subject is the requester's choice, and replies come back
 * into the tenant's account). A push is taken as an answer only when it is a push a service made
 * (`pushed`, a field the status endpoint never sends, so no relayed status answer parses as one),
 * `committed` for exactly this call's key and input digest (a different input under the key is a
 * conflict, FM-03), with a receipt for that key (which the receipt check then checks: signature,
 * tenant, key, result digest), and names no alias (an alias's canonical key comes only from the
 * status endpoint). Anything else only ends the wait: the call asks status (FM-32).
 */
function subscribePushes(
  nc: NatsConnection,
  subjects: Subjects,
  tenant: string,
  actor: string,
): Pushes & { unsubscribe(): void } {
  const waiters = new Map<string, { key: string; inputDigest: string; resolve: (m: PushMessage) => void }>();
  let seen = false;
  let refused = false;
  const refuse = () => {
    refused = true;
    for (const w of waiters.values()) w.resolve({ poll: true, at: Date.now() });
    waiters.clear();
  };
  let sub: { unsubscribe(): void } | undefined;
  try {
    sub = nc.subscribe(subjects.pushesOf(tenant, actor), {
      callback: (err, m) => {
        if (err) return refuse();
        const id = m.subject.slice(m.subject.lastIndexOf('.') + 1);
        const w = waiters.get(id);
        if (!w) return;
        let body: PushMessage;
        try {
          body = decode(pushMessageSchema, m.data);
        } catch {
          return; // not a push this SDK understands: the call asks status after its wait
        }
        waiters.delete(id);
        const answers =
          !('poll' in body) &&
          body.state === 'committed' &&
          body.source === 'operation' &&
          body.operationKey === w.key &&
          body.canonicalKey === undefined &&
          body.inputDigest === w.inputDigest &&
          body.receipt?.operationKey === w.key;
        if (answers) seen = true;
        w.resolve(answers ? body : { poll: true, at: Date.now() });
      },
    });
  } catch {
    refuse();
  }
  return {
    get seen() {
      return seen;
    },
    waitFor(submissionId, key, inputDigest) {
      if (refused || subjects.push(tenant, actor, submissionId) === null) return null;
      let resolve!: (m: PushMessage) => void;
      const pushed = new Promise<PushMessage>((r) => (resolve = r));
      const entry = { key, inputDigest, resolve };
      waiters.set(submissionId, entry);
      return {
        pushed,
        final: pushed.then((m) => ('poll' in m ? new Promise<StatusAnswer>(() => undefined) : m)),
        cancel: () => void (waiters.get(submissionId) === entry && waiters.delete(submissionId)),
      };
    },
    unsubscribe: () => sub?.unsubscribe(),
  };
}

/**
 * Whether the server lets `nc` publish on `subject` and subscribe to its inbox prefix: one status
 * request (a key nobody holds, answered `not_seen` or not at all) and a PING. The server answers a
 * refused SUB or PUB with `-ERR 'Permissions Violation …'` before the PONG, so once the flush
 * returns, a refusal has been seen; the status answer itself is not awaited (no service need run).
 */
async function probePermissions(nc: NatsConnection, subject: string): Promise<PermissionViolation | null> {
  let denied: PermissionViolation | null = null;
  const probe: StatusRequest = { operationKey: `opk_${'0'.repeat(43)}`, waitMs: 0 };
  const answered = nc.request(subject, encode(probe), { timeout: 5_000 }).then(
    () => undefined,
    (err: unknown) => void (denied = permissionViolationOf(err)),
  );
  await Promise.race([answered, nc.flush()]);
  // The rejection of a refused request settles in the same read as the -ERR; let its handlers run.
  await new Promise((r) => setImmediate(r));
  return denied;
}

/**
 * The typed error for a connection {@link createTools} could not open (the NATS client's raw
 * `AuthorizationError` and `ConnectionError` reached the caller). The message is ours: the servers
 * (without user-info), the credential option, and the reason from the error's class or code.
 */
function connectFailure(err: unknown, servers: string, opts: CreateToolsOptions): Error {
  const shown = displayUrl(servers);
  const name = err instanceof Error ? err.name : '';
  const code =
    (err as { code?: unknown } | undefined)?.code ?? (err as { cause?: { code?: unknown } } | undefined)?.cause?.code;
  if (name === 'AuthorizationError') {
    const option = opts.credsFile && !opts.nkeyFile ? 'credsFile' : 'nkeyFile';
    const message = opts.nkeyFile
      ? `the server at ${shown} does not know the seed in ${opts.nkeyFile} (Authorization Violation): give the seed \`tooltx auth generate\` wrote for ${opts.tenant}/${opts.actor} for this server`
      : opts.credsFile
        ? `the server at ${shown} refused the credentials in ${opts.credsFile} (Authorization Violation)`
        : `the server at ${shown} requires credentials (Authorization Violation): give nkeyFile, the seed \`tooltx auth generate\` wrote for ${opts.tenant}/${opts.actor}`;
    return new TooltxError(ErrorClass.Forbidden, `createTools: ${message}`, {
      issues: [{ path: [option], code: 'authorization_violation', message }],
      cause: err,
    });
  }
  if (code === 'ERR_INVALID_URL' || name === 'InvalidArgumentError') {
    return new ToolsOptionError([
      {
        path: ['servers'],
        code: 'invalid_url',
        message: `${shown} is not a list of server URLs (nats://host:port, comma-separated)`,
      },
    ]);
  }
  const reasons: Record<string, string> = {
    ECONNREFUSED: 'connection refused: nothing listens there',
    ENOTFOUND: 'the host name does not resolve',
    EAI_AGAIN: 'the host name does not resolve: temporary DNS failure',
    ETIMEDOUT: 'timed out',
    EHOSTUNREACH: 'host unreachable',
    ENETUNREACH: 'network unreachable',
    ECONNRESET: 'the connection was reset',
  };
  const reason =
    typeof code === 'string' && reasons[code]
      ? `${reasons[code]} (${code})`
      : name === 'TimeoutError'
        ? 'timed out'
        : `${name || 'error'}${typeof code === 'string' ? ` (${code})` : ''}`;
  const message = `cannot connect to ${shown}: ${reason}; is a nats-server listening there?`;
  return new TooltxError(ErrorClass.DependencyUnavailable, `createTools: ${message}`, {
    issues: [{ path: ['servers'], code: 'unreachable', message }],
    cause: err,
  });
}
