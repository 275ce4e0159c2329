import { ErrorClass, NextAction, nextActionFor, TooltxError, type Contract, type ErrorInfo } from '@tooltx/contracts';
import {
  checkReceipt,
  ReceiptVerifier,
  type Receipt,
  type ReceiptCheck,
  type ServerState,
  type StatusAnswer,
  type StatusRequest,
  type UnknownEvidence,
} from '@tooltx/lifecycle';
import { compensate, type CompensateRequest, type CompensateResult } from './compensate.js';
import { confirmOrDiscard, type ConfirmationRequest, type ConfirmResult, type DiscardResult } from './confirm.js';
import { LRUCache } from 'lru-cache';
import { endSpan, SpanKind, startSpan, toolSpanAttributes, withSpan } from '@tooltx/nats';
import { awaitOutcome, statusRequester, type Track } from './await-outcome.js';
import { openConnection } from './connection.js';
import {
  checkedOptions,
  executeArgumentIssues,
  type CreateToolsOptions,
  type ExecuteOptions,
  type ExecuteRequest,
} from './options.js';
import { prepareIntent } from './submit.js';
import { readCurrentVersions } from './current-versions.js';

export { type CreateToolsOptions, type ExecuteOptions, type ExecuteRequest, ToolsOptionError } from './options.js';
export { classifyPublishRefusal, PublishRefusalCode, QUOTA_RETRY_AFTER_MS } from './submit.js';
export type { ReceiptCheck, UnknownEvidence } from '@tooltx/lifecycle';

/** What the caller should do next (FM-15): an error class's action, or continue / observe. */
export type Next = NextAction | 'continue';

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
  | {
      status: 'unknown';
      operationKey: string;
      lastServerState: ServerState;
      evidence: UnknownEvidence;
      next: Next;
      error?: ErrorInfo;
    }
  | {
      /**
       * Held back (its contract declares `confirm`, docs/compensation.md "Held-back commits"):
       * accepted and prepared, nothing external happened. `preview` is its prepare step's result;
       * it waits until `deadlineAt` (ms since the epoch) for `tools.confirm` (it then runs once) or
       * `tools.discard` (it ends `rolled_back`); unconfirmed by then, it ends `rolled_back`.
       */
      status: 'awaiting_confirmation';
      operationKey: string;
      preview?: unknown;
      deadlineAt?: number;
      next: typeof NextAction.ConfirmOrDiscard;
    };

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
  /**
   * Compensates a committed operation with the compensation its contract declares
   * (docs/compensation.md): `{ operationKey, reason }`, the original's contract among `contracts`.
   * Asking again, from this client or another, is the same compensation: one runs (FM-21). Never
   * throws; `budgetMs` as `execute`'s.
   */
  compensate(req: CompensateRequest, opts?: { budgetMs?: number }): Promise<CompensateResult>;
  /**
   * Confirms a held-back operation (`execute` answered `awaiting_confirmation`): this actor needs
   * the permission its contract's `confirm` declares. It then runs once, however often it is
   * confirmed; after a discard or its deadline it is `rejected` `operation_discarded`. Waits for
   * its run's outcome within `budgetMs` (as `execute`'s). Never throws.
   */
  confirm(req: ConfirmationRequest, opts?: { budgetMs?: number }): Promise<ConfirmResult>;
  /**
   * Discards a held-back operation before it ran: `rolled_back`, nothing external happened. A
   * confirmed one is never discarded. Never throws.
   */
  discard(req: ConfirmationRequest, opts?: { budgetMs?: number }): Promise<DiscardResult>;
  /** Drains the connection when the SDK owns it. */
  close(): Promise<void>;
}

/**
 * Creates the agent-side SDK. It needs only: publish on its own intent subject,
 * request on its own status subject, and subscribe to its own inbox prefix and its own push subject
 * (`<prefix>.push.<tenant>.<actor>.*`; without that permission it polls) — nothing else; and, when
 * `contracts` holds several versions of one name, the direct get of that name's `current.<name>`
 * key of the contract registry: an unpinned call gets the current version, read here and again
 * after an outcome that says `refresh_contract`, while a task keeps the version of its first call
 * per tool (FM-23, docs/contracts.md).
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
  // Before connecting: a bad configuration must not leave a connection open.
  const { trusted } = checkedOptions(opts);
  const conn = await openConnection(opts);
  const verifier = new ReceiptVerifier(trusted);
  const verify = (o: { operationKey: string; receipt: Receipt; result?: unknown }): ReceiptCheck =>
    checkReceipt(o, verifier, opts.tenant);
  const status = statusRequester(conn, conn.subjects.status(opts.tenant, opts.actor));
  const byName = new Map<string, Contract[]>();
  for (const c of opts.contracts) byName.set(c.name, [...(byName.get(c.name) ?? []), c]);
  // The current version of each name this host holds several versions of, from the contract
  // registry (docs/contracts.md): read now, and again when a call is told `refresh_contract`.
  const severalVersions = [...byName].filter(([, cs]) => cs.length > 1).map(([n]) => n);
  const several = new Set(severalVersions);
  let current = await readCurrentVersions(conn.nc, conn.subjects, severalVersions);
  /**
   * The version of each task's first call per tool (FM-23: a running task keeps the version it
   * started with, whatever becomes current meanwhile). Bounded: 10,000 tasks × tools.
   */
  const taskVersions = new LRUCache<string, number>({ max: 10_000 });
  const taskToolKey = (taskId: string, tool: string) => `${taskId}\0${tool}`;
  const versionFor = (tool: string, taskId: string) => taskVersions.get(taskToolKey(taskId, tool)) ?? current.get(tool);
  const io = {
    conn,
    tenant: opts.tenant,
    actor: opts.actor,
    status,
    checkReceipt: (operationKey: string, receipt: Receipt) => verify({ operationKey, receipt }),
    ...(opts.submissionIdFactory ? { submissionIdFactory: opts.submissionIdFactory } : {}),
  };

  /**
   * Keys this client saw committed, with their input digest: a repeat reads the operation's status
   * first and submits only when that read does not answer committed (docs/sdk.md "Repeats"). Only
   * the path is chosen from memory; the answer is the server's. Bounded: 10,000 keys (~1.5 MB).
   */
  const committedKeys = new LRUCache<string, string>({ max: 10_000 });

  /** One call: local checks, then the submissions and observation the lifecycle's rules decide. */
  const execute = async <O>(req: ExecuteRequest, budgetMs: number, track: Track): Promise<ExecuteResult<O>> => {
    const started = Date.now();
    const prepared = prepareIntent(byName, req, conn.nc.info?.max_payload, versionFor);
    if ('refusal' in prepared) return refused(prepared.refusal.operationKey, prepared.refusal.error);
    const { contract, call } = prepared.intent;
    // Only a name held in several versions has a version to keep; one version needs no entry.
    const pin = several.has(contract.name) ? taskToolKey(req.taskId, contract.name) : undefined;
    if (pin !== undefined && !taskVersions.has(pin)) taskVersions.set(pin, contract.version);
    track.key = call.operationKey;
    // Nothing of this call was sent: refused, definitely not stored.
    const refusedCredentials = conn.credentialsRefusal();
    if (refusedCredentials) return refused(call.operationKey, refusedCredentials);
    const forgedActor = req.actorId !== undefined && req.actorId !== opts.actor;
    const awaited = {
      operationKey: call.operationKey,
      inputDigest: call.inputDigest,
      effect: contract.effect,
      forgedActor,
      startedAt: started,
      deadlineAt: started + budgetMs,
      knownCommitted: committedKeys.get(call.operationKey) === call.inputDigest,
    };
    // The agent's side of the call, in its trace when the application traces (docs/tracing.md).
    const span = startSpan(
      `execute_tool ${contract.name}`,
      SpanKind.CLIENT,
      toolSpanAttributes({
        tool: contract.name,
        version: contract.version,
        effect: contract.effect,
        operationKey: call.operationKey,
      }),
    );
    let outcome: ExecuteResult<O> | undefined;
    try {
      outcome = (await withSpan(span, () => awaitOutcome(io, awaited, prepared.intent, track))) as ExecuteResult<O>;
    } finally {
      endSpan(span, outcome?.status ?? 'unknown', outcome && 'error' in outcome ? outcome.error?.class : undefined);
    }
    if (outcome.status === 'committed') committedKeys.set(call.operationKey, call.inputDigest);
    const cls = 'error' in outcome ? outcome.error?.class : undefined;
    if (
      pin !== undefined &&
      (cls === ErrorClass.ContractRetired || cls === ErrorClass.ContractWithdrawn) &&
      taskVersions.get(pin) === contract.version
    ) {
      // The task's version takes no new step: its next unpinned call uses the current one.
      taskVersions.delete(pin);
    }
    if (outcome.next === NextAction.RefreshContract || cls === ErrorClass.ContractWithdrawn)
      current = await readCurrentVersions(conn.nc, conn.subjects, severalVersions);
    return outcome;
  };

  return {
    tenant: opts.tenant,
    actor: opts.actor,
    status,
    verify,
    execute: async <O>(req: ExecuteRequest, o?: ExecuteOptions): Promise<ExecuteResult<O>> => {
      const issues = executeArgumentIssues(req, o);
      if (issues.length) return refused(null, { class: ErrorClass.InvalidInput, issues });
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
          evidence: {
            operationKey: track.key ?? '',
            submissionIds: track.submissionIds,
            intentStored: track.intentStored,
            statusAnswered: false,
            lastSeq: 0,
            elapsedMs: Date.now() - track.started,
          },
          next: NextAction.Observe,
          error: info,
        };
      }
    },
    compensate: (req, o) =>
      compensate(
        {
          conn,
          tenant: opts.tenant,
          actor: opts.actor,
          status,
          verify,
          contract: (id) => {
            const at = id.lastIndexOf('@');
            return byName.get(id.slice(0, at))?.find((c) => c.version === Number(id.slice(at + 1)));
          },
        },
        req,
        o?.budgetMs ?? opts.budgetMs ?? 30_000,
      ),
    confirm: (req, o) =>
      confirmOrDiscard(
        { conn, tenant: opts.tenant, actor: opts.actor, status, verify },
        'confirm',
        req,
        o?.budgetMs ?? opts.budgetMs ?? 30_000,
      ),
    discard: (req, o) =>
      confirmOrDiscard(
        { conn, tenant: opts.tenant, actor: opts.actor, status, verify },
        'discard',
        req,
        o?.budgetMs ?? opts.budgetMs ?? 30_000,
      ),
    close: () => conn.close(),
  };
}

function refused(operationKey: string | null, error: ErrorInfo): Extract<ExecuteResult, { status: 'rejected' }> {
  return { status: 'rejected', operationKey, error, next: nextActionFor[error.class] };
}
