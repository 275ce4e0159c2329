import { randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { jetstream } from '@nats-io/jetstream';
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
  type PreparedCall,
} from '@tooltx/contracts';
import { MAX_STATUS_WAIT_MS, receiptSchema, statusReplySchema, trustedReceiptKeys, verifyReceipt, type Receipt, type ServerState, type TakeoverRecord, type StatusAnswer, type StatusRequest } from '@tooltx/lifecycle';
import { connectNats, decode, encode, isTransient, Subjects, type NatsConnection } from '@tooltx/nats';
import { newSubmission, publishSubmission, type Submission } from './intent.js';

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
   * The receipt keys this agent trusts (issue 9, FM-17): `{ "<keyId>": "<SPKI PEM>" }`, or the path
   * of such a JSON file (`tooltx auth generate` writes `receipt-keys.json`); default the file named
   * by `TOOLTX_RECEIPT_KEYS_FILE`. Required: a committed answer counts only with a receipt signed
   * under exactly one of these key ids.
   */
  receiptKeys?: Record<string, string> | string;
}

/** One tool call, as the agent states it. `actorId`, when given, must be the authenticated actor. */
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
  /** The operation subject's last sequence seen (0 = never registered as far as we saw). */
  lastSeq: number;
  attempt?: number;
  elapsedMs: number;
  /** The takeover record, when the server handed the operation over to a person (FM-14). */
  takeover?: TakeoverRecord;
  /** Set when the server answered `committed` with a receipt this SDK cannot trust (FM-17): why. */
  invalidReceipt?: string;
}

/**
 * The outcome of `tools.execute`. Business result (`result`) apart from metadata (`receipt`,
 * `operationKey`). `unknown` is never "failed": it says evidence ran out within the budget.
 * `operationKey` of a committed or unknown outcome is the operation that holds the effect: the key
 * the SDK derived, or — when the input named its target through an alias (another name, case or
 * encoding of the same resource) — the key of the canonical input, which the receipt carries
 * (DESIGN.md "Canonical resource ids", FM-10). A rejection names the derived key.
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

/** The shape of `execute`'s arguments: programming errors come back as `invalid_input` with a path. */
const executeArgsSchema = z.object({
  // Strict: a misspelt or extra field (`versoin`, `tenant`) is a caller's bug, never ignored.
  req: z.strictObject({
    tool: z.string().min(1).max(100),
    version: z.number().int().min(1).optional(),
    taskId: z.string().min(1).max(256),
    operationKey: z.string().max(100).optional(),
    actorId: z.string().max(64).optional(),
    input: z.unknown(),
  }),
  opts: z.object({ budgetMs: z.number().int().min(100).max(24 * 3600_000).optional() }),
});

const PUBACK_TIMEOUT_MS = 2_000;
const STATUS_POLL_MS = 5_000;
/** Read/compute attempts rejected as dependency_unavailable are resubmitted at most this often. */
const MAX_RETRYABLE_ATTEMPTS = 5;

/**
 * Creates the agent-side SDK (issue 3). It needs only: publish on its own intent subject,
 * request on its own status subject, and subscribe to its own inbox prefix — nothing else.
 * Throws `TypeError` for a bad tenant/actor id or two contracts with one `name@version`.
 */
export async function createTools(opts: CreateToolsOptions): Promise<Tools> {
  if (!ID_PATTERN.test(opts.tenant) || !ID_PATTERN.test(opts.actor)) throw new TypeError('tenant and actor must match ^[a-z0-9_-]{1,64}$');
  const subjects = new Subjects(opts.prefix ?? 'tooltx');
  // Before connecting: a bad configuration must not leave a connection open.
  const trusted = loadTrustedKeys(opts.receiptKeys);
  const owned = !opts.nc;
  const nc =
    opts.nc ??
    (await connectNats({
      servers: opts.servers ?? 'nats://127.0.0.1:4222',
      name: `tooltx-sdk:${opts.tenant}/${opts.actor}`,
      credsFile: opts.credsFile,
      nkeySeedFile: opts.nkeyFile,
      inboxPrefix: opts.inboxPrefix ?? `_INBOX.${opts.tenant}.${opts.actor}`,
    }));
  const js = jetstream(nc);
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

  const status = async (req: StatusRequest): Promise<StatusAnswer> => {
    let reply;
    try {
      reply = await nc.request(statusSubject, encode(req), { timeout: (req.waitMs ?? 0) + 2_000 });
    } catch (err) {
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
      const r = executeArgsSchema.safeParse({ req, opts: o ?? {} });
      if (!r.success) return refused(null, { class: ErrorClass.InvalidInput, issues: fieldIssues(r.error) });
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
      if (owned) await nc.drain();
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
    const envelope = { tool: contract.name, version: contract.version, taskId: req.taskId, operationKey: key, input: req.input, ...(req.actorId !== undefined ? { actorId: req.actorId } : {}) };

    const submissionIds = track.submissionIds;
    let intentStored = false;
    let statusAnswered = false;
    let lastState: ServerState = 'not_seen';
    let lastSeq = 0;
    let attempt: number | undefined;
    let retryableRejections = 0;
    let invalidReceipt: string | undefined;
    let squatted = 0;

    const submit = async (): Promise<void> => {
      const id = squatted === 0 && opts.submissionIdFactory ? opts.submissionIdFactory() : randomUUID();
      const s: Submission = newSubmission(subjects, opts.tenant, opts.actor, envelope, id);
      submissionIds.push(s.submissionId);
      for (let i = 0; left() > 0; i++) {
        try {
          const ack = await publishSubmission(js, s, Math.min(PUBACK_TIMEOUT_MS, Math.max(100, left())));
          if (ack.duplicate && i === 0) {
            // A first transmission can only be a duplicate if someone else used this id (dedup is
            // stream-wide, NATS-NOTES): our intent was NOT stored. Submit again under a new id;
            // the operation key keeps it to one operation (FM-31).
            squatted++;
            return void (await submit());
          }
          intentStored = true;
          track.intentStored = true;
          return;
        } catch (err) {
          if (!isTransient(err)) throw err;
          await sleep(Math.min(left(), 100 * 2 ** Math.min(i, 5)));
        }
      }
    };

    await submit();
    let notSeenSince = Date.now();
    // The key of the operation that holds the effect: ours, or the canonical one ours is an alias of (FM-10).
    let opKey = key;
    let failures = 0;
    while (left() > 0) {
      let a: StatusAnswer;
      try {
        // One long-poll until a final answer (not one per intermediate state), at most STATUS_POLL_MS.
        a = await status({ operationKey: key, waitMs: Math.max(0, Math.min(STATUS_POLL_MS, MAX_STATUS_WAIT_MS, left() - 2_100)), afterSeq: lastSeq, inputDigest: prepared.inputDigest, submissionIds, untilFinal: true });
        statusAnswered = true;
        failures = 0;
      } catch (err) {
        if (err instanceof TooltxError && err.class !== ErrorClass.DependencyUnavailable) return refused(key, err.toInfo());
        await sleep(Math.min(left(), 200 * 2 ** Math.min(failures++, 4)));
        continue;
      }
      if (a.canonicalKey) opKey = a.canonicalKey;
      if (a.source === 'decision') return refused(key, a.error ?? { class: ErrorClass.Internal });
      if (a.source === 'operation' && a.inputMatches === false) {
        return refused(key, { class: ErrorClass.IdempotencyConflict, issues: [{ path: ['input'], code: 'input_differs', message: 'this operation key is registered with another input' }] });
      }
      if (a.state === 'not_seen') {
        if (!intentStored || Date.now() - notSeenSince >= STATUS_POLL_MS) {
          await submit();
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
          await submit();
          notSeenSince = Date.now();
        }
        continue;
      }
      if (a.state === 'rejected') {
        const error = a.error ?? { class: ErrorClass.Internal };
        const retryable = !hasSideEffect(contract.effect) && error.class === ErrorClass.DependencyUnavailable && ++retryableRejections < MAX_RETRYABLE_ATTEMPTS;
        if (!retryable) return { ...refused(key, error), ...(a.attempt ? { attempt: a.attempt } : {}) };
        await sleep(Math.min(left(), 200 * 2 ** retryableRejections));
        await submit();
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
  }

  return tools;
}

/** The trusted receipt keys from the option, else the file named by TOOLTX_RECEIPT_KEYS_FILE. Throws `TypeError` when none. */
function loadTrustedKeys(o: Record<string, string> | string | undefined) {
  const src = o ?? process.env.TOOLTX_RECEIPT_KEYS_FILE;
  if (src === undefined || src === '') throw new TypeError('createTools: receiptKeys (or TOOLTX_RECEIPT_KEYS_FILE) is required: the receipt keys this agent trusts');
  const keys = typeof src === 'string' ? (JSON.parse(readFileSync(src, 'utf8')) as Record<string, string>) : src;
  const trusted = trustedReceiptKeys(keys);
  if (trusted.size === 0) throw new TypeError('createTools: no receipt key is trusted');
  return trusted;
}

function refused(operationKey: string | null, error: ErrorInfo): Extract<ExecuteResult, { status: 'rejected' }> {
  return { status: 'rejected', operationKey, error, next: nextActionFor[error.class] };
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, Math.max(0, ms)));
}

