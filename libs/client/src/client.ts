import { randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { jetstream, JetStreamApiError } from '@nats-io/jetstream';
import { errors } from '@nats-io/transport-node';
import { z } from 'zod';
import {
  digestOf,
  fieldIssues,
  ErrorClass,
  hasSideEffect,
  ID_PATTERN,
  nextActionFor,
  NextAction,
  prepareCall,
  toErrorInfo,
  TooltxError,
  type Contract,
  type ErrorInfo,
  type FieldIssue,
  type PreparedCall,
} from '@tooltx/contracts';
import { MAX_STATUS_WAIT_MS, pushMessageSchema, receiptSchema, statusReplySchema, type PushMessage, trustedReceiptKeys, verifyReceipt, type Receipt, type ServerState, type TakeoverRecord, type StatusAnswer, type StatusRequest } from '@tooltx/lifecycle';
import { connectNats, decode, displayUrl, encode, isTransient, permissionViolationOf, Subjects, type NatsConnection, type PermissionViolation } from '@tooltx/nats';
import { newSubmission, publishSubmission, type Submission } from './submission.js';

/** Options of {@link createTools}. Give `servers` (the SDK connects and owns the connection) or `nc`. */
export interface CreateToolsOptions {
  servers?: string;
  nc?: NatsConnection;
  /** The tenant and actor this agent authenticates as; the server checks them against its identity. */
  tenant: string;
  actor: string;
  /** The contracts this agent may call (the shared half: schemas, normalisers, key rules). */
  contracts: Contract[];
  /** Subject prefix (default `tooltx`). */
  prefix?: string;
  /** Credentials file, when connecting with `servers`. */
  credsFile?: string;
  /** Nkey seed file, when connecting with `servers` (`tooltx auth generate` writes one per actor). */
  nkeyFile?: string;
  /** Inbox prefix for replies (default `_INBOX.<tenant>.<actor>`): the only subjects this agent subscribes to. */
  inboxPrefix?: string;
  /** Default per-call budget, ms (default 30 000). */
  budgetMs?: number;
  /**
   * Makes submission ids (Nats-Msg-Id); default random UUIDs, which no one else can predict.
   * Only tests and replay tools should set it.
   */
  submissionIdFactory?: () => string;
  /**
   * The receipt keys this agent trusts (FM-17): `{ "<keyId>": "<SPKI PEM>" }`, or the path
   * of such a JSON file (`tooltx auth generate` writes `receipt-keys.json`); default the file named
   * by `TOOLTX_RECEIPT_KEYS_FILE`. Required: a committed answer counts only with a receipt signed
   * under exactly one of these key ids.
   */
  receiptKeys?: Record<string, string> | string;
}

/**
 * One tool call, as the agent states it. `actorId`, when given, must be the authenticated actor.
 *
 * Field paths: every `issues[].path` of a refusal `execute` returns is relative to the object the
 * caller passed — this request (`["taskId"]`, `["actorId"]`, `["input", "items", 3, "body"]`) or, for
 * a bad option, the options object (`["budgetMs"]`). Errors `createTools` throws name the option
 * (`["nkeyFile"]`, `["contracts", 1]`).
 */
export interface ExecuteRequest {
  tool: string;
  /** Contract version; may be omitted when exactly one version of `tool` was given to createTools. */
  version?: number;
  taskId: string;
  /** The key the caller holds, if any; the server derives it again and refuses a mismatch. */
  operationKey?: string;
  actorId?: string;
  input: unknown;
}

export interface ExecuteOptions {
  /** How long this call may take before it returns `unknown`, ms. */
  budgetMs?: number;
}

/** What the caller should do next (FM-15): an error class's action, or continue / observe. */
export type Next = NextAction | 'continue';

/** Evidence handed back with an `unknown` outcome: enough to observe or take over, no bodies. */
export interface UnknownEvidence {
  operationKey: string;
  submissionIds: string[];
  /** Whether the server confirmed storing at least one submission (a PubAck). */
  intentStored: boolean;
  /** Whether any status request was answered. */
  statusAnswered: boolean;
  /**
   * The last status answer's `seq`: the operation's own event count (0 = never registered as far as
   * we saw). Per operation, never a stream sequence, so it says nothing of other tenants' traffic.
   */
  lastSeq: number;
  attempt?: number;
  elapsedMs: number;
  /** The takeover record, when the server handed the operation over to a person (FM-14). */
  takeover?: TakeoverRecord;
  /** Set when the server answered `committed` with a receipt this SDK cannot trust (FM-17): why. */
  invalidReceipt?: string;
  /**
   * Set when nats-server refused a publish of this call (that publish stored nothing: its JetStream
   * API error code) after an earlier transmission that may have been stored: why the answer is
   * `unknown` and not `rejected`.
   */
  refusal?: { jsApiCode: number; why: 'earlier_transmission_may_be_stored' };
}

/**
 * The outcome of `tools.execute`. Business result (`result`) apart from metadata (`receipt`,
 * `operationKey`). `unknown` is never "failed": it says evidence ran out within the budget.
 * `operationKey` of a committed or unknown outcome is the operation that holds the effect: the key
 * the SDK derived, or — when the input named its target through an alias (another name, case or
 * encoding of the same resource) — the key of the canonical input, which the receipt carries
 * (FM-10). A rejection names the derived key.
 *
 * Answered at once, without spending the budget: `rejected` (`invalid_input` at `["input"]`, code
 * `too_large`) for an intent larger than the server's `max_payload` — checked before publishing;
 * `rejected` (`forbidden`, code `permission_violation`) when the server refused the first publish
 * of the intent (never stored); `unknown` with `error.class` `forbidden` and `next: "reauthorise"`
 * when the server refused a later publish or the reply inbox (an intent may be stored, and this
 * connection can no longer observe it); `rejected` (`dependency_unavailable`, next `backoff`) when
 * JetStream refused to store the intent (a full intents stream, insufficient resources; see
 * {@link classifyPublishRefusal}) and no earlier transmission of the call can have been stored —
 * `unknown` with `evidence.refusal` when one may have been.
 */
export type ExecuteResult<O = unknown> =
  | { status: 'committed'; operationKey: string; result: O; receipt: Receipt; next: 'continue' }
  | { status: 'rejected'; operationKey: string | null; error: ErrorInfo; next: Next; attempt?: number }
  | { status: 'unknown'; operationKey: string; lastServerState: ServerState; evidence: UnknownEvidence; next: Next; error?: ErrorInfo };

/** What the SDK checks of a committed outcome before anyone may count it as done (FM-17). */
export type ReceiptCheck = { valid: true } | { valid: false; reason: 'untrusted_key' | 'bad_signature' | 'other_operation' | 'result_mismatch' };

/** The SDK handle. */
export interface Tools {
  readonly tenant: string;
  readonly actor: string;
  execute<O = unknown>(req: ExecuteRequest, opts?: ExecuteOptions): Promise<ExecuteResult<O>>;
  /** One status request (read-only, repeatable). Throws `TooltxError(dependency_unavailable)` when no status service answers. */
  status(req: StatusRequest): Promise<StatusAnswer>;
  /**
   * Checks a committed outcome the way `execute` does: a receipt signed under a trusted key id, for
   * this tenant and the outcome's operation key, whose result digest matches the result. Use it on
   * any "success" that did not come straight from `execute` (a model's claim, a stored result).
   */
  verify(outcome: { operationKey: string; receipt: Receipt; result?: unknown }): ReceiptCheck;
  /** Drains the connection when the SDK owns it. */
  close(): Promise<void>;
}

/** What one call has done so far, for the evidence of an unexpected failure. */
interface Track {
  key: string | undefined;
  submissionIds: string[];
  intentStored: boolean;
  started: number;
}

/**
 * The shape of `execute`'s arguments: programming errors come back as `invalid_input` with a path
 * relative to the argument that holds the field (the request, or the options object).
 */
const executeRequestSchema = z.strictObject({
  // Strict: a misspelt or extra field (`versoin`, `tenant`) is a caller's bug, never ignored.
  tool: z.string().min(1).max(100),
  version: z.number().int().min(1).optional(),
  taskId: z.string().min(1).max(256),
  operationKey: z.string().max(100).optional(),
  actorId: z.string().max(64).optional(),
  input: z.unknown(),
});
const budgetSchema = z.number().int().min(100).max(24 * 3600_000);
const executeOptionsSchema = z.strictObject({ budgetMs: budgetSchema.optional() });

/** The options of {@link createTools}; a problem is a {@link ToolsOptionError} at the option's name. */
const createToolsOptionsSchema = z.strictObject({
  servers: z.string().min(1).optional(),
  nc: z.custom<NatsConnection>((v) => typeof v === 'object' && v !== null && typeof (v as { request?: unknown }).request === 'function', 'must be a NatsConnection').optional(),
  tenant: z.string().regex(ID_PATTERN, 'must match ^[a-z0-9_-]{1,64}$'),
  actor: z.string().regex(ID_PATTERN, 'must match ^[a-z0-9_-]{1,64}$'),
  contracts: z.array(z.custom<Contract>((v) => typeof v === 'object' && v !== null && typeof (v as { id?: unknown }).id === 'string', 'must be a contract (defineContract)')).min(1),
  prefix: z.string().regex(/^[a-z][a-z0-9_]{0,31}$/, 'must match ^[a-z][a-z0-9_]{0,31}$').optional(),
  credsFile: z.string().min(1).optional(),
  nkeyFile: z.string().min(1).optional(),
  inboxPrefix: z.string().min(1).optional(),
  budgetMs: budgetSchema.optional(),
  submissionIdFactory: z.custom<() => string>((v) => typeof v === 'function', 'must be a function').optional(),
  receiptKeys: z.union([z.record(z.string(), z.string()), z.string().min(1)]).optional(),
});

/**
 * A bad option of {@link createTools} (a `TypeError`: a programming or configuration error, thrown
 * before anything is connected). `issues[].path` starts with the option's name (`["nkeyFile"]`,
 * `["contracts", 1]`, `["receiptKeys"]`); the message names the option and, for a file, its path.
 */
export class ToolsOptionError extends TypeError {
  readonly issues: FieldIssue[];
  constructor(issues: FieldIssue[]) {
    super(`createTools: ${issues.map((i) => `${i.path.join('.') || '(options)'}: ${i.message}`).join('; ')}`);
    this.name = 'ToolsOptionError';
    this.issues = issues;
  }
}

const PUBACK_TIMEOUT_MS = 2_000;
/**
 * Room left for the headers of a submission (`Nats-Msg-Id` and the HPUB framing, under 100 bytes)
 * within the server's `max_payload`, which bounds headers and payload together (NATS protocol, HPUB).
 */
const HEADER_ALLOWANCE_BYTES = 512;
const STATUS_POLL_MS = 5_000;
/**
 * How long a call waits for its pushed answer before it asks the status endpoint, ms.
 * Only once this connection has received a push (services that push are deployed); before that, a
 * call asks the status endpoint at once and takes whichever answer comes first.
 */
const PUSH_WAIT_MS = 1_000;
/** Read/compute attempts rejected as dependency_unavailable are resubmitted at most this often. */
const MAX_RETRYABLE_ATTEMPTS = 5;

/**
 * Creates the agent-side SDK. It needs only: publish on its own intent subject,
 * request on its own status subject, and subscribe to its own inbox prefix and its own push subject
 * (`<prefix>.push.<tenant>.<actor>.*`; without that permission it polls) — nothing else.
 *
 * Before it returns it checks, with one status request (read-only), that the server lets this
 * connection act as `tenant`/`actor` under `prefix`: publish on its status subject and subscribe to
 * its inbox prefix. That check needs no service running (a status service that is down is fine).
 *
 * Throws, before connecting:
 * - {@link ToolsOptionError} (a `TypeError`) for a bad option: an id that is not `^[a-z0-9_-]{1,64}$`,
 *   two contracts with one `name@version`, an unreadable `nkeyFile`/`credsFile`, a receipt keys file
 *   that cannot be read or parsed, no trusted receipt key — the message names the option (or
 *   `TOOLTX_RECEIPT_KEYS_FILE`) and the file's path;
 * and after connecting (the connection it opened is closed again):
 * - `TooltxError(forbidden)` when the server refuses that publish or subscription (NATS permissions
 *   violation): the credentials are not those of `tenant`/`actor`, or `prefix`/`inboxPrefix` are not
 *   the deployment's; `issues[0].path` names the credentials option;
 * - `TooltxError(forbidden)` when the server refuses the credentials themselves (NATS
 *   `Authorization Violation`: none given to a server with auth on, or a seed it does not know);
 *   `issues[0].path` is `["nkeyFile"]` (`["credsFile"]` when that was given);
 * - `TooltxError(dependency_unavailable)` (next: backoff) when no server of `servers` answers:
 *   refused, a name that does not resolve, timed out; `issues[0].path` is `["servers"]`.
 * A `servers` value that is not a URL list is a {@link ToolsOptionError} at `servers`.
 */
export async function createTools(opts: CreateToolsOptions): Promise<Tools> {
  const parsed = createToolsOptionsSchema.safeParse(opts);
  if (!parsed.success) throw new ToolsOptionError(fieldIssues(parsed.error));
  checkDistinctContracts(opts.contracts);
  const subjects = new Subjects(opts.prefix ?? 'tooltx');
  // Before connecting: a bad configuration must not leave a connection open.
  const trusted = loadTrustedKeys(opts.receiptKeys);
  for (const option of ['nkeyFile', 'credsFile'] as const) checkReadable(option, opts[option]);
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
  /** What a permissions violation of the server means for this configuration, as a field issue. */
  const deniedIssue = (v: PermissionViolation, when: 'setup' | 'call'): FieldIssue => ({
    path: [credentials],
    code: 'permission_violation',
    message:
      `the server refused ${v.operation === 'publish' ? 'publishing to' : 'subscribing to'} ${v.subject}: ` +
      `this connection's identity${opts.nkeyFile ? ` (seed ${opts.nkeyFile})` : opts.credsFile ? ` (creds ${opts.credsFile})` : ''} ${when === 'setup' ? 'is not' : 'may no longer act as'} ` +
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
  const js = jetstream(nc);
  // The server refusing this connection's credentials (a rotated or revoked key, an expired
  // credential): nats.js keeps reconnecting and every publish would wait out its timeout until the
  // budget ends, answered `unknown`/`observe`. Calls answer at once instead,
  // `forbidden`/`reauthorise`, until the connection is back.
  let credentialsRefused: Error | undefined;
  const statusEvents = nc.status();
  void (async () => {
    for await (const s of statusEvents) {
      if (s.type === 'error' && (s.error instanceof errors.AuthorizationError || s.error instanceof errors.UserAuthenticationExpiredError)) credentialsRefused = s.error;
      else if (s.type === 'reconnect') credentialsRefused = undefined;
    }
  })().catch(() => undefined);
  const refusedCredentials = (): ErrorInfo => ({
    class: ErrorClass.Forbidden,
    issues: [
      {
        path: [credentials],
        code: 'credentials_refused',
        message: `the server refuses this connection's credentials${opts.nkeyFile ? ` (seed ${opts.nkeyFile})` : opts.credsFile ? ` (creds ${opts.credsFile})` : ''}: ${credentialsRefused?.message ?? 'authorization violation'}; the key was rotated or revoked`,
      },
    ],
  });
  const verify = (o: { operationKey: string; receipt: Receipt; result?: unknown }): ReceiptCheck => {
    const r = receiptSchema.safeParse(o.receipt);
    if (!r.success || !trusted.has(r.data.keyId)) return { valid: false, reason: 'untrusted_key' };
    if (!verifyReceipt(r.data, trusted)) return { valid: false, reason: 'bad_signature' };
    if (r.data.tenant !== opts.tenant || r.data.operationKey !== o.operationKey) return { valid: false, reason: 'other_operation' };
    if (o.result !== undefined && digestOf(o.result) !== r.data.resultDigest) return { valid: false, reason: 'result_mismatch' };
    return { valid: true };
  };
  const byName = new Map<string, Contract[]>();
  for (const c of opts.contracts) byName.set(c.name, [...(byName.get(c.name) ?? []), c]);
  const statusSubject = subjects.status(opts.tenant, opts.actor);

  // Pushed answers: the executor pushes a committed receipt (and the authorizer and the
  // executor a "poll now" for other outcomes) to `<p>.push.<tenant>.<actor>.<submissionId>`. One
  // subscription; a waiter per submission in flight. Best effort: the status endpoint stays the
  // truth, and a connection whose identity may not subscribe there (an older auth configuration)
  // simply polls.
  //
  // A message on that subject is NOT trusted as such: any agent of the tenant can make the status
  // service answer onto it (a request's reply subject is the requester's choice, and replies come
  // back into the tenant's account). A push is taken as an answer only when it is
  // a push a service made (`pushed`, a field the status endpoint never sends, so no relayed status
  // answer parses as one), `committed` for exactly this call's key and input digest (a different
  // input under the key is a conflict, FM-03), with a receipt for that key (which `verify` then
  // checks: signature, tenant, key, result digest), and names no alias (an alias's canonical key
  // comes only from the status endpoint). Anything else only ends the wait: the call asks status.
  const pushWaiters = new Map<string, { key: string; inputDigest: string; resolve: (m: PushMessage) => void }>();
  let pushSeen = false;
  let pushRefused = false;
  const refusePush = () => {
    pushRefused = true;
    for (const w of pushWaiters.values()) w.resolve({ poll: true, at: Date.now() });
    pushWaiters.clear();
  };
  let pushSub: { unsubscribe(): void } | undefined;
  try {
    pushSub = nc.subscribe(subjects.pushesOf(opts.tenant, opts.actor), {
      callback: (err, m) => {
        if (err) return refusePush();
        const id = m.subject.slice(m.subject.lastIndexOf('.') + 1);
        const w = pushWaiters.get(id);
        if (!w) return;
        let body: PushMessage;
        try {
          body = decode(pushMessageSchema, m.data);
        } catch {
          return; // not a push this SDK understands: the call asks status after its wait
        }
        pushWaiters.delete(id);
        const answers =
          !('poll' in body) &&
          body.state === 'committed' &&
          body.source === 'operation' &&
          body.operationKey === w.key &&
          body.canonicalKey === undefined &&
          body.inputDigest === w.inputDigest &&
          body.receipt?.operationKey === w.key;
        if (answers) pushSeen = true;
        w.resolve(answers ? body : { poll: true, at: Date.now() });
      },
    });
  } catch {
    refusePush();
  }
  /** A submission's push: the message once it comes, and its answer (never settles on a "poll"). */
  interface PushWait {
    pushed: Promise<PushMessage>;
    final: Promise<StatusAnswer>;
    /** Whether the call has already waited {@link PUSH_WAIT_MS} for it. */
    waited: boolean;
    /** Whether its answer was handed to the call (a second look must not take it again). */
    used: boolean;
    cancel(): void;
  }
  /** Registers the waiter of one submission's push for the call of `key` (before the submission is published). */
  const waitForPush = (submissionId: string, key: string, inputDigest: string): PushWait | null => {
    if (pushRefused || subjects.push(opts.tenant, opts.actor, submissionId) === null) return null;
    let resolve!: (m: PushMessage) => void;
    const pushed = new Promise<PushMessage>((r) => (resolve = r));
    const entry = { key, inputDigest, resolve };
    pushWaiters.set(submissionId, entry);
    const w: PushWait = {
      pushed,
      final: pushed.then((m) => ('poll' in m ? new Promise<StatusAnswer>(() => undefined) : m)),
      waited: false,
      used: false,
      cancel: () => void (pushWaiters.get(submissionId) === entry && pushWaiters.delete(submissionId)),
    };
    return w;
  };
  /**
   * The next answer of a call whose latest submission may still get a push: first (once) up to
   * `waitMs` for the push alone — only once this connection has received a push, i.e. services that
   * push are deployed; then the status endpoint's answer, raced by a push that lands meanwhile (so
   * a status endpoint that is down does not hide a pushed receipt). A "poll now" ends the wait.
   */
  const answerOf = async (w: PushWait, ask: () => Promise<StatusAnswer>, waitMs: number): Promise<StatusAnswer> => {
    if (!w.waited) {
      w.waited = true;
      if (pushSeen) {
        let timer: NodeJS.Timeout | undefined;
        const first = await Promise.race([w.pushed, new Promise<null>((r) => (timer = setTimeout(() => r(null), waitMs)))]);
        clearTimeout(timer);
        if (first && !('poll' in first)) return (w.used = true), first;
      }
    }
    const asked = ask();
    asked.catch(() => undefined);
    const r = await Promise.race([asked.then((a) => ({ a, pushed: false })), w.final.then((a) => ({ a, pushed: true }))]);
    if (r.pushed) w.used = true;
    return r.a;
  };

  const status = async (req: StatusRequest): Promise<StatusAnswer> => {
    let reply;
    try {
      reply = await nc.request(statusSubject, encode(req), { timeout: (req.waitMs ?? 0) + 2_000 });
    } catch (err) {
      const denied = permissionViolationOf(err);
      if (denied) throw new TooltxError(ErrorClass.Forbidden, 'status request refused by the server (permissions)', { issues: [deniedIssue(denied, 'call')], cause: err });
      throw new TooltxError(ErrorClass.DependencyUnavailable, 'status service did not answer', { cause: err });
    }
    const body = decode(statusReplySchema, reply.data);
    if (!('state' in body)) throw new TooltxError(body.error.class, 'status request refused', { issues: body.error.issues });
    return body;
  };

  const tools: Tools = {
    tenant: opts.tenant,
    actor: opts.actor,
    status,
    verify,
    execute: async <O>(req: ExecuteRequest, o?: ExecuteOptions): Promise<ExecuteResult<O>> => {
      const r = executeRequestSchema.safeParse(req);
      const ro = executeOptionsSchema.safeParse(o ?? {});
      if (!r.success || !ro.success) return refused(null, { class: ErrorClass.InvalidInput, issues: [...(r.success ? [] : fieldIssues(r.error)), ...(ro.success ? [] : fieldIssues(ro.error))] });
      const track: Track = { key: undefined, submissionIds: [], intentStored: false, started: Date.now() };
      try {
        return await execute<O>(req, o?.budgetMs ?? opts.budgetMs ?? 30_000, track);
      } catch (err) {
        // execute never throws: an outcome it could not establish is unknown, not failed. Only a
        // call that provably sent nothing (a local, definite error) could be called rejected.
        const info = err instanceof TooltxError ? err.toInfo() : { class: ErrorClass.DependencyUnavailable };
        return {
          status: 'unknown',
          operationKey: track.key ?? '',
          lastServerState: 'not_seen',
          evidence: { operationKey: track.key ?? '', submissionIds: track.submissionIds, intentStored: track.intentStored, statusAnswered: false, lastSeq: 0, elapsedMs: Date.now() - track.started },
          next: NextAction.Observe,
          error: info,
        };
      }
    },
    async close() {
      // The listener of connection events ends with this object (a caller-supplied `nc` lives on).
      (statusEvents as AsyncIterable<unknown> & { stop?: () => void }).stop?.();
      if (!nc.isClosed()) pushSub?.unsubscribe();
      // Closed already (e.g. the server refused its credentials twice and nats.js gave up): nothing to drain.
      if (owned && !nc.isClosed()) await nc.drain();
    },
  };

  async function execute<O>(req: ExecuteRequest, budgetMs: number, track: Track): Promise<ExecuteResult<O>> {
    const started = Date.now();
    const deadline = started + budgetMs;
    const left = () => deadline - Date.now();

    // Local checks only improve UX; the server repeats every one of them.
    const candidates = byName.get(req.tool) ?? [];
    const contract = req.version === undefined ? (candidates.length === 1 ? candidates[0] : undefined) : candidates.find((c) => c.version === req.version);
    if (!contract) {
      const path = candidates.length ? 'version' : 'tool';
      return refused(null, { class: ErrorClass.InvalidInput, issues: [{ path: [path], code: 'unknown_contract', message: `no single contract ${req.tool}${req.version ? `@${req.version}` : ''}` }] });
    }
    let prepared: PreparedCall;
    try {
      prepared = prepareCall(contract, req.taskId, req.input);
    } catch (err) {
      return refused(null, toErrorInfo(err));
    }
    const key = prepared.operationKey;
    track.key = key;
    if (req.operationKey !== undefined && req.operationKey !== key) {
      return refused(req.operationKey, { class: ErrorClass.IdempotencyConflict, issues: [{ path: ['operationKey'], code: 'key_mismatch', message: 'the operation key is derived from taskId, contract, target and intent' }] });
    }
    // The contract's digest goes along: the authorizer refuses a write made with a contract that
    // differs from its own under the same name@version (FM-25).
    const envelope = { tool: contract.name, version: contract.version, taskId: req.taskId, operationKey: key, interfaceDigest: contract.interfaceDigest, input: req.input, ...(req.actorId !== undefined ? { actorId: req.actorId } : {}) };
    // The server drops a message over its max_payload without storing it (and the client refuses to
    // send one): a call that can never be stored is the caller's to shrink, not an unknown outcome.
    const maxPayload = nc.info?.max_payload;
    const data = encode(envelope); // once per call: every submission of it sends these bytes
    const size = data.length + HEADER_ALLOWANCE_BYTES;
    if (maxPayload !== undefined && size > maxPayload) {
      return refused(key, {
        class: ErrorClass.InvalidInput,
        issues: [{ path: ['input'], code: 'too_large', message: `the encoded intent is ${size - HEADER_ALLOWANCE_BYTES} bytes; with its headers (${HEADER_ALLOWANCE_BYTES} bytes allowed) it must fit the server's max_payload of ${maxPayload} bytes: split the input into smaller calls` }],
      });
    }

    // Nothing of this call was sent: refused, definitely not stored.
    if (credentialsRefused) return refused(key, refusedCredentials());

    const submissionIds = track.submissionIds;
    let intentStored = false;
    let statusAnswered = false;
    let lastState: ServerState = 'not_seen';
    let lastSeq = 0;
    let attempt: number | undefined;
    let retryableRejections = 0;
    let invalidReceipt: string | undefined;
    /** Submission ids given up (another publisher's, or a duplicate whose intent is gone): later ids are random. */
    let burntIds = 0;
    /** Whether a transmission of this call may have been stored (no answer, or a duplicate's): a later refusal then proves nothing. */
    let mayBeStored = false;

    /** The push the latest submission waits for (cancelled when a newer submission is sent). */
    let pending: PushWait | null = null;
    /**
     * Whether a duplicate PubAck of a retransmission stands for an intent the server read: the
     * status endpoint reports this call's operation started by one of its submissions, or a refusal
     * of one of them. A duplicate alone proves only that the id was stored once: dedup is by msg id,
     * stream-wide, and outlives the message, which a lowered per-subject limit or a max age may have
     * evicted unread (FM-30). Agents may not read the intents stream (libs/auth/src/permissions.ts), so
     * the status endpoint is the check; `not_seen`, no answer or the budget running out count as
     * "not stored".
     */
    const duplicateRead = async (): Promise<boolean> => {
      let timer: NodeJS.Timeout | undefined;
      const ask = status({ operationKey: key, waitMs: 0, inputDigest: prepared.inputDigest, submissionIds }).then(
        (a) => a.source === 'decision' || (a.source === 'operation' && a.ownAttempt === true),
        () => false,
      );
      const answered = await Promise.race([ask, new Promise<false>((r) => (timer = setTimeout(() => r(false), Math.max(0, left()))))]);
      clearTimeout(timer);
      return answered;
    };
    const submit = async (): Promise<void> => {
      const id = burntIds === 0 && opts.submissionIdFactory ? opts.submissionIdFactory() : randomUUID();
      const s: Submission = newSubmission(subjects, opts.tenant, opts.actor, envelope, id, data);
      submissionIds.push(s.submissionId);
      pending?.cancel();
      pending = waitForPush(s.submissionId, key, prepared.inputDigest);
      for (let i = 0; left() > 0; i++) {
        try {
          const ack = await publishSubmission(js, s, Math.min(PUBACK_TIMEOUT_MS, Math.max(100, left())));
          if (ack.duplicate && i === 0) {
            // A first transmission can only be a duplicate if someone else used this id (dedup is
            // stream-wide): our intent was NOT stored. Submit again under a new id; the operation
            // key keeps it to one operation (FM-31).
            burntIds++;
            return void (await submit());
          }
          if (ack.duplicate) {
            // Our earlier transmission was stored under this id, but it may be gone unread: verify
            // before calling it stored, and if it is not, send again now under a new id rather than
            // wait out a status poll (the operation key keeps it to one operation, FM-30).
            mayBeStored = true;
            if (!(await duplicateRead())) {
              if (left() <= 0) return;
              burntIds++;
              return void (await submit());
            }
          }
          intentStored = true;
          track.intentStored = true;
          return;
        } catch (err) {
          const denied = permissionViolationOf(err);
          if (denied) throw new PermissionDenied(denied, submissionIds.length === 1 && i === 0 && denied.operation === 'publish' && denied.subject === s.subject);
          if (credentialsRefused) throw new TooltxError(ErrorClass.Forbidden, 'credentials refused', { issues: refusedCredentials().issues });
          if (err instanceof JetStreamApiError) {
            const refusal = classifyPublishRefusal(err.code);
            if (refusal) throw new PublishRefused(err.code, refusal, !mayBeStored && !intentStored);
          }
          // No answer: this transmission may have been stored.
          mayBeStored = true;
          if (!isTransient(err)) throw err;
          await sleep(Math.min(left(), 100 * 2 ** Math.min(i, 5)));
        }
      }
    };

    /**
     * The server refused a publish or the inbox subscription: waiting will not change that. A refused
     * first publish of the intent was never stored (rejected); otherwise an earlier transmission may
     * have been, and the outcome is unknown — returned at once, not at the end of the budget.
     */
    const deniedOutcome = (e: PermissionDenied | TooltxError): ExecuteResult<O> => {
      const info: ErrorInfo = e instanceof PermissionDenied ? { class: ErrorClass.Forbidden, issues: [deniedIssue(e.violation, 'call')] } : e.toInfo();
      if (e instanceof PermissionDenied && e.neverStored && !intentStored) return refused(key, info);
      return {
        status: 'unknown',
        operationKey: opKey,
        lastServerState: lastState,
        evidence: { operationKey: opKey, submissionIds, intentStored, statusAnswered, lastSeq, ...(attempt ? { attempt } : {}), elapsedMs: Date.now() - started },
        next: NextAction.Reauthorise,
        error: info,
      };
    };
    /**
     * JetStream refused to store a publish of this call. Only when no transmission of the call can
     * have been stored is that a definite answer (rejected); otherwise an earlier one may yet run.
     */
    const refusalOutcome = (e: PublishRefused): ExecuteResult<O> => {
      if (e.neverStored) return refused(key, e.info);
      return {
        status: 'unknown',
        operationKey: opKey,
        lastServerState: lastState,
        evidence: { operationKey: opKey, submissionIds, intentStored, statusAnswered, lastSeq, ...(attempt ? { attempt } : {}), elapsedMs: Date.now() - started, refusal: { jsApiCode: e.jsApiCode, why: 'earlier_transmission_may_be_stored' } },
        next: NextAction.Observe,
        error: e.info,
      };
    };
    const submitOrDenied = async (): Promise<ExecuteResult<O> | undefined> => {
      try {
        await submit();
        return undefined;
      } catch (err) {
        if (err instanceof PublishRefused) return refusalOutcome(err);
        if (err instanceof PermissionDenied) return deniedOutcome(err);
        // An earlier transmission of this call may be stored: unknown, reauthorise, at once.
        if (err instanceof TooltxError && credentialsRefused) return deniedOutcome(err);
        throw err;
      }
    };

    // The key of the operation that holds the effect: ours, or the canonical one ours is an alias of (FM-10).
    let opKey = key;
    /** Submits, then observes until an answer, the budget or a refusal ends the call. */
    const observe = async (): Promise<ExecuteResult<O>> => {
      let outcome = await submitOrDenied();
      if (outcome) return outcome;
      let notSeenSince = Date.now();
      let failures = 0;
      /** The wait of the last status request, ms: near the end of the budget it is too short to wait on the server. */
      let askedWaitMs: number | undefined;
      while (left() > 0) {
        // A request that could not wait (under 2.1 s of budget left) answered at once: pause before the
        // next one instead of asking in a tight loop until the budget ends (without the pause:
        // ~950 requests in the last 2 s of a call).
        if (askedWaitMs !== undefined && askedWaitMs < 250) await Promise.race([sleep(Math.min(left(), 250)), ...(pending ? [pending.final] : [])]);
        if (left() <= 0) break;
        let a: StatusAnswer;
        try {
          // One long-poll until a final answer (not one per intermediate state), at most STATUS_POLL_MS;
          // after a submission, its pushed answer first.
          const ask = () => {
            askedWaitMs = Math.max(0, Math.min(STATUS_POLL_MS, MAX_STATUS_WAIT_MS, left() - 2_100));
            return status({ operationKey: key, waitMs: askedWaitMs, afterSeq: lastSeq, inputDigest: prepared.inputDigest, submissionIds, untilFinal: true });
          };
          // The push wait needs no margin for a request's timeout (the status request's 2.1 s).
          a = pending ? await answerOf(pending, ask, Math.max(0, Math.min(PUSH_WAIT_MS, left() - 100))) : await ask();
          // A pushed answer is taken once; whatever follows (a result not readable yet…) asks status.
          if (pending?.used) {
            pending.cancel();
            pending = null;
          }
          statusAnswered = true;
          failures = 0;
        } catch (err) {
          // Refused by the server's permissions: our intent is stored (or may be); only observing failed.
          if (err instanceof TooltxError && permissionViolationOf(err.cause)) return deniedOutcome(err);
          if (credentialsRefused) return deniedOutcome(new TooltxError(ErrorClass.Forbidden, 'credentials refused', { issues: refusedCredentials().issues }));
          if (err instanceof TooltxError && err.class !== ErrorClass.DependencyUnavailable) return refused(key, err.toInfo());
          await sleep(Math.min(left(), 200 * 2 ** Math.min(failures++, 4)));
          continue;
        }
        if (a.canonicalKey) opKey = a.canonicalKey;
        if (a.source === 'decision') return refused(key, withActorPath(a.error ?? { class: ErrorClass.Internal }, req.actorId !== undefined && req.actorId !== opts.actor));
        if (a.source === 'operation' && a.inputMatches === false) {
          return refused(key, { class: ErrorClass.IdempotencyConflict, issues: [{ path: ['input'], code: 'input_differs', message: 'this operation key is registered with another input' }] });
        }
        if (a.state === 'not_seen') {
          if (!intentStored || Date.now() - notSeenSince >= STATUS_POLL_MS) {
            if ((outcome = await submitOrDenied())) return outcome;
            notSeenSince = Date.now();
          }
          continue;
        }
        lastState = a.state;
        lastSeq = a.seq;
        attempt = a.attempt;
        if (a.state === 'unknown' && a.takeover) {
          // Evidence ran out on the server side too: a person decides now, not the budget (FM-14).
          return {
            status: 'unknown',
            operationKey: opKey,
            lastServerState: 'unknown',
            evidence: { operationKey: opKey, submissionIds, intentStored, statusAnswered, lastSeq, ...(attempt ? { attempt } : {}), elapsedMs: Date.now() - started, takeover: a.takeover },
            next: NextAction.HandOver,
          };
        }
        if (a.state === 'committed' && a.receipt) {
          const check = verify({ operationKey: opKey, receipt: a.receipt });
          if (!check.valid) {
            // Not a receipt we can trust: never "done". A key we do not trust will not become one by
            // waiting: hand over now; otherwise (a tampered answer) keep observing until the budget.
            invalidReceipt = check.reason;
            if (check.reason === 'untrusted_key') break;
            await sleep(Math.min(left(), 500));
            continue;
          }
          if (a.receipt.manual && a.result === undefined) {
            // A person resolved it and no business result exists to hand on: the receipt is the outcome.
            return { status: 'committed', operationKey: opKey, result: undefined as O, receipt: a.receipt, next: 'continue' };
          }
          if (a.result === undefined || digestOf(a.result) !== a.receipt.resultDigest) {
            // Only a result matching the receipt's digest is handed on; wait for a readable one.
            await sleep(Math.min(left(), 200));
            continue;
          }
          return { status: 'committed', operationKey: opKey, result: a.result as O, receipt: a.receipt, next: 'continue' };
        }
        if (a.state === 'rejected' && a.ownAttempt === false) {
          // An earlier attempt's refusal: our identical submission starts a new attempt; wait for it
          // (and submit again if nothing happens, as for not_seen).
          if (Date.now() - notSeenSince >= STATUS_POLL_MS) {
            if ((outcome = await submitOrDenied())) return outcome;
            notSeenSince = Date.now();
          }
          continue;
        }
        if (a.state === 'rejected') {
          const error = a.error ?? { class: ErrorClass.Internal };
          const retryable = !hasSideEffect(contract.effect) && error.class === ErrorClass.DependencyUnavailable && ++retryableRejections < MAX_RETRYABLE_ATTEMPTS;
          if (!retryable) return { ...refused(key, error), ...(a.attempt ? { attempt: a.attempt } : {}) };
          await sleep(Math.min(left(), 200 * 2 ** retryableRejections));
          if ((outcome = await submitOrDenied())) return outcome;
          notSeenSince = Date.now();
        }
      }
      return {
        status: 'unknown',
        operationKey: opKey,
        lastServerState: lastState,
        evidence: { operationKey: opKey, submissionIds, intentStored, statusAnswered, lastSeq, ...(attempt ? { attempt } : {}), elapsedMs: Date.now() - started, ...(invalidReceipt ? { invalidReceipt } : {}) },
        next: lastState === 'unknown' || invalidReceipt ? NextAction.HandOver : NextAction.Observe,
      };
    };
    try {
      return await observe();
    } finally {
      // A call that ends without its push leaves no waiter behind.
      (pending as PushWait | null)?.cancel();
    }
  }

  return tools;
}



/**
 * JetStream API error codes with which nats-server answers a publish it did not store: it refused
 * the message before or instead of writing it (codes of nats-server's `server/errors.json`, 2.10+).
 * They say nothing about other transmissions of the same call.
 */
export const PublishRefusalCode = {
  /** JSStreamStoreFailedF: a limit of the tenant's own intake stream (max_msgs, max_bytes: its quota, docs/tenancy.md) or a failed write. */
  StoreFailed: 10077,
  /** JSInsufficientResourcesErr: the server is over its JetStream storage or memory. */
  InsufficientResources: 10023,
  /** JSAccountResourcesExceededErr: the JetStream account of the streams (not the tenant's) is over its limits. */
  AccountResourcesExceeded: 10002,
  /** JSStreamMessageExceedsMaximumErr: the message is larger than the stream's max_msg_size or the server's max_payload. */
  MessageExceedsMaximum: 10054,
} as const;

/**
 * How long a caller refused `quota_exceeded` at intake waits before it tries again, ms: the tenant's
 * intake stream drains at the tenant's rate (docs/tenancy.md), so about a second frees room for a
 * hundred intents at the default rate.
 */
export const QUOTA_RETRY_AFTER_MS = 1_000;

/**
 * The answer for an intent publish nats-server refused with JetStream API error `jsApiCode`, or
 * `null` when the code does not prove that nothing was stored (the outcome is then unknown). The
 * intake stream is the tenant's own (docs/tenancy.md): its full bound is the tenant's
 * `quota_exceeded` (with a retry-after), which only its own callers meet. A limit of the deployment
 * (the server's store, the account) is `dependency_unavailable` (back off: it is not the caller's to
 * fix); an intent larger than the stream takes is the caller's to split (`invalid_input`, as for one
 * over `max_payload`).
 */
export function classifyPublishRefusal(jsApiCode: number): ErrorInfo | null {
  const code = 'intake_refused';
  switch (jsApiCode) {
    case PublishRefusalCode.StoreFailed:
      return { class: ErrorClass.QuotaExceeded, retryAfterMs: QUOTA_RETRY_AFTER_MS, issues: [{ path: [], code: 'intake_full', message: `the tenant's intake is full (JetStream API error ${jsApiCode}): nothing of this intent was stored; try again after retryAfterMs` }] };
    case PublishRefusalCode.InsufficientResources:
    case PublishRefusalCode.AccountResourcesExceeded:
      return { class: ErrorClass.DependencyUnavailable, issues: [{ path: [], code, message: `the server refused to store the intent (JetStream API error ${jsApiCode}): nothing of it was stored; try again later` }] };
    case PublishRefusalCode.MessageExceedsMaximum:
      return { class: ErrorClass.InvalidInput, issues: [{ path: ['input'], code: 'too_large', message: `the encoded intent is larger than the intents stream takes (JetStream API error ${jsApiCode}): split the input into smaller calls` }] };
    default:
      return null;
  }
}

/** Thrown inside `execute` when JetStream refused to store a publish; `neverStored`: no transmission of the call can have been stored. */
class PublishRefused extends Error {
  constructor(
    readonly jsApiCode: number,
    readonly info: ErrorInfo,
    readonly neverStored: boolean,
  ) {
    super(`publish refused by JetStream (${jsApiCode})`);
  }
}

/** Thrown inside `execute` when the server refused a submission; `neverStored`: the refused publish was the call's first transmission. */
class PermissionDenied extends Error {
  constructor(
    readonly violation: PermissionViolation,
    readonly neverStored: boolean,
  ) {
    super(`permissions violation: ${violation.operation} ${violation.subject}`);
  }
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

/** Adds the `actorId` path to a refusal of a forged actor (FM-06) that carries no path of its own. */
function withActorPath(error: ErrorInfo, forgedActor: boolean): ErrorInfo {
  if (!forgedActor || error.class !== ErrorClass.Forbidden || error.issues?.length) return error;
  return { ...error, issues: [{ path: ['actorId'], code: 'not_authenticated_actor', message: 'actorId must be the actor this connection authenticated as' }] };
}


/**
 * The typed error for a connection {@link createTools} could not open (the NATS
 * client's raw `AuthorizationError` and `ConnectionError` reached the caller). The message is ours:
 * the servers (without user-info), the credential option, and the reason from the error's class or code.
 */
function connectFailure(err: unknown, servers: string, opts: CreateToolsOptions): Error {
  const shown = displayUrl(servers);
  const name = err instanceof Error ? err.name : '';
  const code = (err as { code?: unknown } | undefined)?.code ?? (err as { cause?: { code?: unknown } } | undefined)?.cause?.code;
  if (name === 'AuthorizationError') {
    const option = opts.credsFile && !opts.nkeyFile ? 'credsFile' : 'nkeyFile';
    const message = opts.nkeyFile
      ? `the server at ${shown} does not know the seed in ${opts.nkeyFile} (Authorization Violation): give the seed \`tooltx auth generate\` wrote for ${opts.tenant}/${opts.actor} for this server`
      : opts.credsFile
        ? `the server at ${shown} refused the credentials in ${opts.credsFile} (Authorization Violation)`
        : `the server at ${shown} requires credentials (Authorization Violation): give nkeyFile, the seed \`tooltx auth generate\` wrote for ${opts.tenant}/${opts.actor}`;
    return new TooltxError(ErrorClass.Forbidden, `createTools: ${message}`, { issues: [{ path: [option], code: 'authorization_violation', message }], cause: err });
  }
  if (code === 'ERR_INVALID_URL' || name === 'InvalidArgumentError') {
    return new ToolsOptionError([{ path: ['servers'], code: 'invalid_url', message: `${shown} is not a list of server URLs (nats://host:port, comma-separated)` }]);
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
  const reason = typeof code === 'string' && reasons[code] ? `${reasons[code]} (${code})` : name === 'TimeoutError' ? 'timed out' : `${name || 'error'}${typeof code === 'string' ? ` (${code})` : ''}`;
  const message = `cannot connect to ${shown}: ${reason}; is a nats-server listening there?`;
  return new TooltxError(ErrorClass.DependencyUnavailable, `createTools: ${message}`, { issues: [{ path: ['servers'], code: 'unreachable', message }], cause: err });
}

/** Throws {@link ToolsOptionError} at `contracts[i]` for a second contract with one `name@version`. */
function checkDistinctContracts(contracts: Contract[]): void {
  const seen = new Map<string, number>();
  contracts.forEach((c, i) => {
    const first = seen.get(c.id);
    if (first !== undefined) throw new ToolsOptionError([{ path: ['contracts', i], code: 'duplicate', message: `${c.id} is given twice (also contracts[${first}]); give each name@version once` }]);
    seen.set(c.id, i);
  });
}

/** Throws {@link ToolsOptionError} naming `option` and the path when the file cannot be read. */
function checkReadable(option: 'nkeyFile' | 'credsFile', path: string | undefined): void {
  if (path === undefined) return;
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (err) {
    throw new ToolsOptionError([{ path: [option], code: 'unreadable', message: `cannot read ${path} (${(err as NodeJS.ErrnoException).code ?? String(err)})` }]);
  }
  if (option === 'nkeyFile' && !/^SU[A-Z2-7]{50,}$/.test(text.trim())) {
    throw new ToolsOptionError([{ path: [option], code: 'not_a_seed', message: `${path} does not hold a user nkey seed (SU…; \`tooltx auth generate\` writes one per actor)` }]);
  }
}

const receiptKeysFileSchema = z.record(z.string(), z.string());

/**
 * The trusted receipt keys from the option, else the file named by TOOLTX_RECEIPT_KEYS_FILE. Throws
 * {@link ToolsOptionError} at `receiptKeys` naming the option or variable and the file's path: none
 * given, unreadable, not JSON, not `{ keyId: PEM }`, a key that is not a matching Ed25519 key, none trusted.
 */
function loadTrustedKeys(o: Record<string, string> | string | undefined) {
  const fromEnv = o === undefined;
  const src = o ?? process.env.TOOLTX_RECEIPT_KEYS_FILE;
  const fail = (message: string) => new ToolsOptionError([{ path: ['receiptKeys'], code: 'invalid_receipt_keys', message }]);
  if (src === undefined || src === '') throw fail('receiptKeys (or TOOLTX_RECEIPT_KEYS_FILE) is required: the receipt keys this agent trusts');
  const where = typeof src === 'string' ? `${fromEnv ? 'TOOLTX_RECEIPT_KEYS_FILE' : 'receiptKeys'} file ${src}` : 'receiptKeys';
  let keys: unknown = src;
  if (typeof src === 'string') {
    let text: string;
    try {
      text = readFileSync(src, 'utf8');
    } catch (err) {
      throw fail(`cannot read ${where} (${(err as NodeJS.ErrnoException).code ?? String(err)})`);
    }
    try {
      keys = JSON.parse(text);
    } catch {
      throw fail(`${where} is not JSON; \`tooltx auth generate\` writes receipt-keys.json`);
    }
  }
  const shape = receiptKeysFileSchema.safeParse(keys);
  if (!shape.success) throw fail(`${where} must be a JSON object { "<keyId>": "<SPKI PEM>" }`);
  let trusted;
  try {
    trusted = trustedReceiptKeys(shape.data);
  } catch (err) {
    throw fail(`${where}: ${(err as Error).message}`);
  }
  if (trusted.size === 0) throw fail(`${where}: no receipt key is trusted (the object is empty)`);
  return trusted;
}

function refused(operationKey: string | null, error: ErrorInfo): Extract<ExecuteResult, { status: 'rejected' }> {
  return { status: 'rejected', operationKey, error, next: nextActionFor[error.class] };
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, Math.max(0, ms)));
}

