import type { z } from 'zod';
import { sha256B64u } from './digest.js';
import type { Contract } from './contract.js';
import { ErrorClass, TooltxError } from './errors.js';

/**
 * What the trusted side hands an implementation for one attempt. Identity comes from the
 * authenticated subject, never from the input (FM-06).
 */
export interface ExecutionContext {
  tenant: string;
  actor: string;
  operationKey: string;
  /** The tenant-scoped key sent downstream (see {@link downstreamKeyOf}). */
  downstreamKey: string;
  /** Attempt number of this operation, from 1. */
  attempt: number;
  /**
   * `sha256:` digest of the normalised input this operation registered (RFC 8785 bytes). A
   * downstream that records it with the effect lets a probe tell our effect from another.
   */
  inputDigest?: string;
  /**
   * Absolute deadline of this attempt, ms since the epoch, on the downstream's clock as far as the
   * executor has learned it (from `downstreamAt` answers; the executor's own clock until then). Sent
   * downstream when it `enforcesDeadline`. Any value is safe: the downstream judges it by its own
   * clock, and recovery judges by the clock the downstream reports (docs/clocks.md).
   */
  deadlineAt: number;
  /** Aborted when the attempt's `timeoutMs` elapses or the service shuts down. */
  signal: AbortSignal;
  /**
   * W3C `traceparent` of this attempt's span, when tracing is on (docs/tracing.md): send it
   * downstream as the `traceparent` request header, so the downstream's work joins the caller's
   * trace. Absent when tracing is off.
   */
  traceparent?: string;
  /**
   * What the policy seam allowed at the execution instant, just before `running`: the canonical
   * resources and their authorisation versions, to be sent downstream as a version condition
   * (If-Match) so a change after the check stops the commit (FM-07, FM-08).
   */
  authorization?: AuthorizationResult;
}

/** What an allowing policy seam returns: the canonical resources it checked and their versions. */
export interface AuthorizationResult {
  resources?: { id: string; version: number }[];
  /**
   * The same input with every resource reference replaced by the canonical reference the
   * operation key binds (e.g. any alias, case or encoding of a knowledge base → its name). The
   * references must be part of the contract's `target`. When the canonical input's key differs
   * from the submitted one, the authorizer registers the operation under the canonical key and
   * input digest and records the submitted key as an alias of it (status follows it), so two
   * references to one resource are one operation; the executor refuses `version_conflict` when the
   * references resolve to another key at the execution instant (FM-10). Must satisfy the
   * contract's input schema; absent = the input is already canonical (return it only when a
   * reference changed: the authorizer then derives the key again).
   */
  input?: Record<string, unknown>;
}

/** Who asks, from the authenticated subject, and at which point of the flow. */
export interface AuthorizationContext {
  tenant: string;
  actor: string;
  operationKey: string;
  /**
   * `intake` when the authorizer registers the operation, `execution` right before it runs. Where
   * one process accepts and starts it in one append (the co-located layout, docs/operating.md "One
   * process or four"), there is one check, at `execution`: a policy must allow or refuse there
   * everything it would check at intake.
   */
  phase: 'intake' | 'execution';
  /** Server time of the check, ms since the epoch. */
  now: number;
  /**
   * Set when the call compensates another operation (docs/compensation.md): that operation's key and
   * the permission its contract declares for compensating it. The policy grants that permission to
   * `actor` or refuses (`forbidden`), at the compensation's execution instant like any write's.
   * `requestedBy` says who asked: an agent (`actor`, who needs that permission), or an operator
   * through `tooltx compensate` (`actor` is then `_op-<operator>`): the operator's grant in the
   * identity list is the permission, so a policy does not ask it of an agent; it still checks
   * everything else (the resource exists, its state, its version).
   */
  compensates?: {
    operationKey: string;
    permission: string;
    requestedBy?: { kind: 'actor' | 'operator'; id: string };
  };
  /**
   * Set when `actor` confirms or discards a held-back operation of this contract
   * (docs/compensation.md "Held-back commits"): `input` is that operation's, `operationKey` its key,
   * `owner` the actor who submitted it, and `permission` the one its contract's `confirm` declares.
   * The policy grants that permission to `actor` or refuses (`forbidden`): nothing is confirmed or
   * discarded then. The run a confirmation releases is checked again at its execution instant as
   * any write, for its submitter (without this field). `requestedBy` says who asks: an agent
   * (`actor`, who needs that permission), or an operator through `tooltx confirm` / `tooltx discard`
   * (`actor` is then `_op-<operator>`): the operator's `confirm` grant in the identity list is the
   * permission, so a policy does not ask it of an agent.
   */
  confirms?: {
    operationKey: string;
    permission: string;
    owner: string;
    action: 'confirm' | 'discard';
    requestedBy?: { kind: 'actor' | 'operator'; id: string };
  };
}

/** Who asks to read an operation, and whose operation it is. */
export interface ReadContext {
  tenant: string;
  actor: string;
  /** The actor who submitted the operation's current attempt. */
  owner: string;
  operationKey: string;
  now: number;
  /** The canonical resources the intake decision saw (ids and versions), when it recorded any. */
  resources?: { id: string; version: number }[];
}

/** A committed effect: the canonical resource id and the business result the caller may read. */
export interface ExecutionResult<O = unknown> {
  resourceId: string;
  result: O;
  /**
   * The downstream's clock when it answered, ms since the epoch, when it says: the executor learns
   * the downstream's clock offset from it, so the deadlines it sends hold whatever its own clock says.
   */
  downstreamAt?: number;
}

/**
 * What a `prepare` step is given: the identity and key of the held-back operation, as for `execute`,
 * but no authorisation result (no write follows from it) and a signal aborted at the attempt's
 * timeout.
 */
export type PrepareContext = Omit<ExecutionContext, 'authorization'>;

/** What a `prepare` step returns: the preview the caller reads before confirming (the contract's `confirm.preview`). */
export interface PrepareResult<P = unknown> {
  preview: P;
}

/** What a probe by downstream key found. */
export type ProbeResult =
  /**
   * `downstreamAt`: the downstream's clock, ms since the epoch, read together with the lookup (no
   * write can fall between the two), on a clock that never goes back. With a downstream that
   * `enforcesDeadline`, only a `downstreamAt` past the attempt's deadline proves that no request of
   * that attempt can still land, so only then is a `not_found` attempt run again (docs/clocks.md).
   * Absent = the probe cannot prove that: the attempt stays `unknown` for a person.
   */
  | { found: false; downstreamAt?: number }
  /**
   * `inputDigest`: the {@link ExecutionContext.inputDigest} the downstream recorded with the effect,
   * when it keeps one; recovery commits only when it equals the operation's.
   */
  | { found: true; resourceId: string; resultDigest?: string; inputDigest?: string };

/**
 * Thrown by `execute` when the downstream refused the request because it arrived after the
 * attempt's absolute deadline by the downstream's own clock: definitively not applied. The executor
 * learns the downstream's clock from `downstreamAt` and runs the attempt again with a deadline on
 * that clock (a bounded number of times), instead of failing every call of an executor whose clock
 * runs behind (docs/clocks.md).
 */
export class DeadlinePassedError extends TooltxError {
  /** The downstream's clock when it refused, ms since the epoch (absent when it did not say). */
  readonly downstreamAt: number | undefined;
  constructor(downstreamAt: number | undefined, message = 'the downstream refused the request as past its deadline') {
    super(ErrorClass.DependencyUnavailable, message);
    this.name = 'DeadlinePassedError';
    this.downstreamAt = downstreamAt;
  }
}

/**
 * The trusted side of a contract, loaded only by services (never by agents).
 *
 * Error convention for `execute`: throwing a `TooltxError` means the downstream definitively did
 * NOT apply the effect (it refused); any other throw, and an abort, mean the outcome is unknown
 * (the request may have left), which for side-effecting contracts is never turned into `rejected`.
 */
export interface Implementation<C extends Contract = Contract> {
  contract: C;
  execute(input: z.infer<C['input']>, ctx: ExecutionContext): Promise<ExecutionResult<z.infer<C['output']>>>;
  /**
   * For a contract that declares `confirm`: runs once the operation is accepted, before it waits in
   * `awaiting_confirmation`, and must have no external effect the caller could not take back by
   * discarding it — a draft in the downstream's outbox, a cost preview, a check of the target. Its
   * `preview` goes back to the caller (the contract's `confirm.preview` schema) so a person can
   * confirm what they saw; `execute` runs only after a confirmation. A throw is treated as a run's
   * refusal (a `TooltxError`) or as not prepared (anything else), never as a side effect.
   */
  prepare?(input: z.infer<C['input']>, ctx: PrepareContext): Promise<PrepareResult>;
  /**
   * For a contract that declares `confirm`: drops what `prepare` left downstream (the draft) once
   * the operation ended `rolled_back` — discarded, or not confirmed by its deadline. Best effort and
   * idempotent by `ctx.downstreamKey`: nothing external happened either way, and nothing ever runs
   * the operation's `execute` after it is rolled back; a failure is logged and left.
   */
  discard?(input: z.infer<C['input']>, ctx: PrepareContext): Promise<void>;
  /**
   * The policy seam (authorisation is recomputed at the execution instant, FM-07, FM-08): called by
   * the authorizer at intake and again by the executor right before `running`, with the identity
   * from the authenticated subject. Throw `TooltxError(forbidden | not_found | quota_exceeded)` to
   * refuse; return the canonical resources it checked (with their authorisation versions). The
   * decision is recorded with {@link Implementation.policyVersion}. Absent = allow.
   */
  authorize?(input: z.infer<C['input']>, ctx: AuthorizationContext): Promise<AuthorizationResult | void>;
  /** Version of the policy `authorize` implements; recorded with every decision (default `none`). */
  policyVersion?: string;
  /**
   * Business invariants only the trusted side can judge — field relations, state transitions,
   * time windows — checked at intake and again at the execution instant, after `authorize`.
   * Throw `TooltxError(invalid_input)` with the field path for a fixable violation.
   */
  invariants?(input: z.infer<C['input']>, ctx: AuthorizationContext): void | Promise<void>;
  /**
   * Whether `ctx.actor` may read a registered operation of this contract (its state, receipt and
   * result) — the status endpoint's policy seam, run before anything is revealed. Throw a
   * `TooltxError` to deny: the caller then gets the same answer as for a never-registered key.
   * Absent = any actor of the operation's tenant may read it.
   */
  authorizeRead?(ctx: ReadContext): Promise<void>;
  /**
   * The downstream's clock now, ms since the epoch (a cheap read, such as a health check's answer):
   * asked once before the first attempt, so that attempt's deadline is already on the downstream's
   * clock (docs/clocks.md). Absent = learned from the answers only.
   */
  clock?(signal: AbortSignal): Promise<number>;
  /** Read-only lookup by `ctx.downstreamKey`; used by recovery (FM-02, FM-27). */
  probe?(ctx: Omit<ExecutionContext, 'signal' | 'deadlineAt'> & { signal: AbortSignal }): Promise<ProbeResult>;
}

export function defineImplementation<C extends Contract>(impl: Implementation<C>): Implementation<C> {
  return impl;
}

/**
 * The key sent downstream: `tx_` + base64url SHA-256 of tenant and operation key, so one tenant's
 * key can never address another tenant's record in a downstream that dedups on it.
 */
export function downstreamKeyOf(tenant: string, operationKey: string): string {
  return `tx_${sha256B64u(`${tenant}\u0000${operationKey}`)}`;
}
