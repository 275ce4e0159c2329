import {
  DeadlinePassedError,
  digestOf,
  ErrorClass,
  hasSideEffect,
  TooltxError,
  type Contract,
  type EffectClass,
  type ErrorInfo,
} from '@tooltx/contracts';
import { EVENT_SCHEMA_VERSION, type AuthDecision, type DecisionRecord, type Evidence } from './events.js';
import { decideRunAgain, decideSend, type SendStep } from './recovery.js';
import type { OperationState } from './events.js';

/**
 * The rules a call meets at intake (authorizer) and again at the execution instant (executor),
 * written once: what the policy seam's answer means, when a frozen task refuses, what an
 * idempotency conflict says, what a refusal or an alias records, and what a run's outcome becomes.
 * Pure: no clock, no I/O (times come in as arguments).
 */

/** What the policy seam's answer (`authorize` and `invariants`) means for the call. */
export type PolicyVerdict =
  | { kind: 'allow'; authorization: AuthDecision }
  /** Refused: `authorization` is the denial to record, absent when the input itself was invalid (not a policy decision). */
  | { kind: 'refuse'; error: ErrorInfo; authorization?: AuthDecision }
  /** The policy could not decide (its dependency is away, or it failed): not a refusal, the message is retried. */
  | { kind: 'retry' };

/**
 * The verdict of the policy seam (docs/lifecycle.md "Order of checks"): `failure` is what it threw
 * (as error info), undefined when it allowed. An allow records the policy version and the resources
 * the policy named.
 */
export function policyVerdict(
  failure: ErrorInfo | undefined,
  o: { policyVersion: string; at: number; resources?: AuthDecision['resources'] },
): PolicyVerdict {
  if (!failure)
    return {
      kind: 'allow',
      authorization: {
        decision: 'allow',
        policyVersion: o.policyVersion,
        at: o.at,
        ...(o.resources ? { resources: o.resources } : {}),
      },
    };
  if (failure.class === ErrorClass.Internal || failure.class === ErrorClass.DependencyUnavailable)
    return { kind: 'retry' };
  if (failure.class === ErrorClass.InvalidInput) return { kind: 'refuse', error: failure };
  return {
    kind: 'refuse',
    error: failure,
    authorization: { decision: 'deny', policyVersion: o.policyVersion, reason: failure.class, at: o.at },
  };
}

/**
 * A task with an operation under takeover takes no new side effect until a person resolves it
 * (FM-14): the refusal of a side-effecting call on a frozen task, or null. Reads and computations
 * go on.
 */
export function frozenTaskRefusal(effect: EffectClass, frozen: boolean): ErrorInfo | null {
  return frozen && hasSideEffect(effect) ? { class: ErrorClass.TaskFrozen } : null;
}

/** The refusal of a known key submitted with another input (FM-26): the registered input is never revealed. */
export const IDEMPOTENCY_CONFLICT: ErrorInfo = {
  class: ErrorClass.IdempotencyConflict,
  issues: [{ path: ['input'], code: 'input_differs', message: 'this operation key is registered with another input' }],
};

/** The bounded record that replaces a refusal whose details the store would not take. */
export function boundedRefusal(error: ErrorInfo): ErrorInfo {
  return {
    class: error.class,
    issues: [{ path: [], code: 'record_not_stored', message: "the refusal's details could not be stored" }],
  };
}

/** Who submitted, and which submission: the identity every decision record carries. */
export interface Submitter {
  tenant: string;
  actor: string;
  submissionId: string;
}

/** What every decision record starts with: its id and time, the key it is recorded under, and who submitted. */
function decisionHead(who: Submitter, eventId: string, at: number, operationKey: string) {
  return {
    schema: EVENT_SCHEMA_VERSION as typeof EVENT_SCHEMA_VERSION,
    type: 'decision' as const,
    eventId,
    at,
    operationKey,
    tenant: who.tenant,
    actor: who.actor,
    submissionId: who.submissionId,
  };
}

/**
 * The record of a refusal before anything was registered, under `key` — or, when no key could be
 * derived (bytes that are not an intent), under `keylessKey` with `keyless: true`.
 */
export function refusalRecord(
  who: Submitter,
  o: {
    eventId: string;
    at: number;
    key: string | null;
    keylessKey: string;
    error: ErrorInfo;
    tool?: string;
    version?: number;
    authorization?: AuthDecision;
  },
): DecisionRecord {
  return {
    ...decisionHead(who, o.eventId, o.at, o.key ?? o.keylessKey),
    outcome: 'rejected',
    error: o.error,
    ...(o.tool !== undefined ? { tool: o.tool } : {}),
    ...(o.version !== undefined ? { version: o.version } : {}),
    ...(o.authorization ? { authorization: o.authorization } : {}),
    ...(o.key ? {} : { keyless: true as const }),
  };
}

/** The record that a request for a registered compensation was allowed and answered with it. */
export function replayRecord(
  who: Submitter,
  o: {
    eventId: string;
    at: number;
    key: string;
    tool: string;
    version: number;
    requestedBy: { kind: 'actor' | 'operator'; id: string };
    reasonDigest: string;
  },
): DecisionRecord {
  return {
    ...decisionHead(who, o.eventId, o.at, o.key),
    outcome: 'replayed',
    tool: o.tool,
    version: o.version,
    requestedBy: o.requestedBy,
    reasonDigest: o.reasonDigest,
  };
}

/**
 * The record that a submission named its target through an alias (FM-10): its own key and digest,
 * and the canonical key and digest it is registered under.
 */
export function aliasRecord(
  who: Submitter,
  o: {
    eventId: string;
    at: number;
    key: string;
    inputDigest: string;
    canonicalKey: string;
    canonicalInputDigest: string;
    tool: string;
    version: number;
  },
): DecisionRecord {
  return {
    ...decisionHead(who, o.eventId, o.at, o.key),
    outcome: 'aliased',
    canonicalKey: o.canonicalKey,
    inputDigest: o.inputDigest,
    canonicalInputDigest: o.canonicalInputDigest,
    tool: o.tool,
    version: o.version,
  };
}

/** How a run ended, as the executor saw it. */
export type RunOutcome =
  | { kind: 'ok' }
  /** The downstream refused the request as past its deadline, by its own clock (`error`): not applied. */
  | { kind: 'late'; error: ErrorInfo }
  /** The downstream definitively refused (a typed error): not applied. */
  | { kind: 'refused'; error: ErrorInfo }
  /** Anything else: a timeout (`aborted`) or a lost connection — the request may have left. */
  | { kind: 'failed'; aborted: boolean };

/** What a run's outcome becomes. */
export type AfterRun =
  | { kind: 'commit' }
  /** Nothing of this run was applied: the same attempt runs again. */
  | { kind: 'requeue'; reason: 'refused_late' }
  /**
   * Not applied: `refused` (the downstream's typed refusal), `read_failed` (a read or computation
   * failed; a repeat is harmless, the caller may retry), `late_again` (refused as late once too often).
   */
  | { kind: 'reject'; error: ErrorInfo; reason: 'refused' | 'read_failed' | 'late_again' }
  /** The request may have been applied: `unknown` with this evidence, for the reconciler to verify. */
  | { kind: 'mark_unknown'; evidence: Evidence['kind'] };

/**
 * The effect-class failure mapping (FM-12, FM-13, FM-15): a side-effecting run refused as late is
 * run again (rejected as `dependency_unavailable` once requeued too often, {@link decideRunAgain});
 * a typed refusal is a rejection; a read or computation that failed is rejected as
 * `dependency_unavailable` (retryable: a repeat has no effect); a side effect whose request may have
 * left is never rejected and never blindly retried: `unknown`.
 */
export function decideAfterRun(effect: EffectClass, outcome: RunOutcome, requeues: number): AfterRun {
  const sideEffect = hasSideEffect(effect);
  switch (outcome.kind) {
    case 'ok':
      return { kind: 'commit' };
    case 'late':
      if (sideEffect)
        return decideRunAgain(requeues).kind === 'requeue'
          ? { kind: 'requeue', reason: 'refused_late' }
          : { kind: 'reject', error: { class: ErrorClass.DependencyUnavailable }, reason: 'late_again' };
      return { kind: 'reject', error: outcome.error, reason: 'read_failed' };
    case 'refused':
      return { kind: 'reject', error: outcome.error, reason: 'refused' };
    case 'failed':
      if (!sideEffect)
        return { kind: 'reject', error: { class: ErrorClass.DependencyUnavailable }, reason: 'read_failed' };
      return { kind: 'mark_unknown', evidence: outcome.aborted ? 'timeout' : 'connection_lost' };
  }
}

/** Deliveries of an intent that fails for good before it is recorded as `internal` and terminated. */
export const TERMINAL_AFTER_DELIVERIES = 3;

/**
 * What becomes of an intent whose handling threw. `retryable`: the store or the server did not
 * answer, or another writer won (a later delivery may not meet it); `dependencyAway`: the policy's
 * own dependency is away. Either is retried for as long as the consumer redelivers. Any other
 * failure will fail again: it is retried a few times ({@link TERMINAL_AFTER_DELIVERIES}), then
 * recorded as `internal` and terminated — never redelivered for minutes (docs/tenancy.md). Pure.
 */
export function decideIntakeFailure(f: {
  retryable: boolean;
  dependencyAway: boolean;
  deliveryCount: number;
}): 'retry' | 'terminal' {
  if (f.retryable || f.dependencyAway) return 'retry';
  return f.deliveryCount < TERMINAL_AFTER_DELIVERIES ? 'retry' : 'terminal';
}

/**
 * Whether an intent that registered nothing in this delivery may be deleted from the tenant's
 * intake (docs/tenancy.md: refused intents stop counting against the tenant's bound): only on its
 * first delivery. A redelivered intent may have registered an operation in a delivery whose ack was
 * lost, and the executor reads that operation's input from it. Pure.
 */
export function refusedIntentDeletable(deliveryCount: number): boolean {
  return deliveryCount === 1;
}

/** A call as derived from an input: its operation key and digests. */
export interface DerivedCall {
  operationKey: string;
  inputDigest: string;
  targetDigest: string;
}

/**
 * Two references to one resource are one operation (FM-10). `own`: the call as the submission
 * derived it; `canonical`: as derived from the policy seam's canonical input (null when the seam
 * gave none). When the two keys differ, the operation is registered under the canonical one and
 * the submission's own key and digest are kept with the attempt (`submitted`) and recorded as an
 * alias. Pure.
 */
export function registrationOf(
  own: DerivedCall,
  canonical: DerivedCall | null,
): { registered: DerivedCall; submitted?: { operationKey: string; inputDigest: string } } {
  if (!canonical || canonical.operationKey === own.operationKey) return { registered: own };
  return { registered: canonical, submitted: { operationKey: own.operationKey, inputDigest: own.inputDigest } };
}

/**
 * At the execution instant the canonical input must still name what the operation was registered
 * for: a reference (an alias) that names another resource since intake would write where the key
 * does not bind (FM-10). `canonical`: the key and input digest derived from the policy seam's
 * canonical input now (null when it no longer parses). An operation's canonical key must be its
 * own; a compensation's key comes from its original's key, never from its input, so there its
 * canonical input's digest must be the one registered. Returns the refusal — `version_conflict`,
 * recorded as a denial — or null. Pure.
 */
export function referenceMovedRefusal(
  registered: { operationKey: string; inputDigest: string; compensation: boolean },
  canonical: { operationKey: string; inputDigest: string } | null,
  o: { policyVersion: string; at: number },
): { error: ErrorInfo; authorization: AuthDecision } | null {
  const same =
    canonical !== null &&
    (registered.compensation
      ? canonical.inputDigest === registered.inputDigest
      : canonical.operationKey === registered.operationKey);
  if (same) return null;
  return {
    error: { class: ErrorClass.VersionConflict },
    authorization: { decision: 'deny', policyVersion: o.policyVersion, reason: ErrorClass.VersionConflict, at: o.at },
  };
}

/**
 * A `running` operation redelivered to an executor (its earlier executor died mid-attempt, FM-27):
 * how long to wait before verifying it, ms — until the attempt's deadline has passed on the
 * downstream's clock as far as it is known (`offsetMs`: the downstream's clock minus this one's),
 * plus a margin; 0: verify now (probe). Only a schedule: the probe decides. Pure.
 */
export function redeliveredRunWaitMs(deadlineAt: number, now: number, offsetMs: number): number {
  const wait = deadlineAt - (now + offsetMs);
  return wait > 0 ? wait + REDELIVERED_RUN_MARGIN_MS : 0;
}

/** Margin past an attempt's deadline before a redelivered running operation is probed, ms. */
export const REDELIVERED_RUN_MARGIN_MS = 250;

/**
 * A write's result is its receipt (FM-19): the result to store for a commit that no run returned —
 * found by a probe, or resolved by a person — when the contract's output takes an empty object;
 * null when it does not (a business result cannot be recovered: the operation stays for a person).
 * `digest` is the result's digest for the receipt. Pure.
 */
export function receiptOnlyResult(
  contract: Pick<Contract, 'output'>,
): { result: Record<string, unknown>; digest: string } | null {
  const empty = contract.output.safeParse({});
  if (!empty.success) return null;
  const result = empty.data as Record<string, unknown>;
  return { result, digest: digestOf(result) };
}

/**
 * How a run ended, from what the downstream call threw (`err`; undefined when it returned) and
 * whether the attempt's own signal was aborted (its deadline, or shutdown): a refusal as late by the
 * downstream's clock (`DeadlinePassedError`), a typed refusal (`TooltxError`), or anything else — a
 * timeout or a lost connection, after which the request may have been applied. Pure.
 */
export function runOutcomeOf(err: unknown, aborted: boolean): RunOutcome {
  if (err === undefined) return { kind: 'ok' };
  if (err instanceof DeadlinePassedError) return { kind: 'late', error: err.toInfo() };
  if (err instanceof TooltxError) return { kind: 'refused', error: err.toInfo() };
  return { kind: 'failed', aborted };
}

/**
 * What the executor does with an operation an event of attempt `attempt` was delivered for, read as
 * `state` (`deliveryCount`: how often the event was delivered): `run` it when it waits to run
 * (`accepted`, this attempt); `recover` it when it is `running` and the event comes again — the
 * executor that took it died mid-attempt (FM-27): verify before acting; otherwise `ignore` (another
 * attempt, or another executor drives it). Pure.
 */
export function executorAction(
  state: OperationState,
  attempt: number,
  deliveryCount: number,
): 'run' | 'recover' | 'ignore' {
  if (state.status === 'none' || state.attempt !== attempt) return 'ignore';
  if (state.status === 'running' && deliveryCount > 1 && state.running) return 'recover';
  return state.status === 'accepted' ? 'run' : 'ignore';
}

/**
 * Whether a verdict reached before `running` (a refusal at the execution instant) still applies:
 * the operation still waits to run, in the same attempt. Once another executor has moved it on,
 * that run is not ours to refuse. Pure.
 */
export function waitingToRun(state: OperationState, attempt: number): boolean {
  return state.status === 'accepted' && state.attempt === attempt;
}

/**
 * Whether a run whose `running` event is stored may still be sent ({@link decideSend}):
 * `elapsedMs` since the executor fixed the attempt's deadline, `timeoutMs` the attempt's time. Reads
 * and computations are always sent (a late one is refused or times out, and is retryable). Pure.
 */
export function sendAfterStart(a: {
  effect: EffectClass;
  timeoutMs: number;
  elapsedMs: number;
  requeues: number;
}): SendStep {
  if (!hasSideEffect(a.effect)) return { kind: 'send' };
  return decideSend({ startedAt: 0, deadlineAt: a.timeoutMs, now: a.elapsedMs, requeues: a.requeues });
}
