import { compensationOf, ErrorClass, type Contract, type ErrorInfo } from '@tooltx/contracts';
import { isCompensationStatus } from './decider.js';
import type { Evidence, OperationRecord, OperationState, Receipt } from './events.js';

/**
 * The rules a compensation, a confirmation and a discard meet before any command is built
 * (docs/compensation.md), written once for the SDK's and the operator's paths. Pure: the contract
 * and the time come in as arguments. The decider holds the same line on the state alone (a command
 * these rules refuse is never appended); these add what needs the contract and the clock, and say
 * which error class the caller gets.
 */

/** What a compensation request gets: registered, the same one again, or refused with a class. */
export type CompensationVerdict =
  /** Register the compensation: its contract and operation key (derived from the original's key and that contract only). */
  | { kind: 'request'; compensation: { operationKey: string; tool: string; version: number } }
  /** The same compensation was already asked for: answer its current state, start nothing (FM-21). */
  | { kind: 'replay'; compensationKey: string; state: OperationRecord }
  /** Refused; nothing is registered or sent (FM-22). */
  | { kind: 'refuse'; error: ErrorInfo };

const notAllowed: ErrorInfo = { class: ErrorClass.CompensationNotAllowed };

/**
 * Whether the operation in `state`, of `contract` (its own `name@version`), may be compensated at
 * `now` (ms since the epoch):
 * - not registered → `not_found` (the same answer as an operation the caller may not read);
 * - a compensation itself → `compensation_not_allowed`: a failed compensation is never compensated
 *   in turn (FM-20);
 * - no declaration in its contract → `compensation_not_allowed`;
 * - being compensated or compensated already: the same compensation → `replay` (FM-21), another
 *   one → `compensation_not_allowed` (FM-22);
 * - in a status the declaration does not allow (only `committed` by default: never `rejected`,
 *   `unknown`, `running`, `accepted`, `awaiting_confirmation` or `rolled_back`) →
 *   `compensation_not_allowed` (FM-22);
 * - later than the declared deadline after the commit (the receipt's `committedAt`) →
 *   `compensation_expired` (FM-22);
 * - otherwise → `request`.
 * The permission is not judged here: it is checked at the compensation's execution instant, like
 * any write's.
 */
export function compensationVerdict(
  contract: Contract | undefined,
  state: OperationState,
  now: number,
): CompensationVerdict {
  if (state.status === 'none') return { kind: 'refuse', error: { class: ErrorClass.NotFound } };
  if (state.compensates) return { kind: 'refuse', error: notAllowed };
  const declared = contract?.compensation;
  const compensation = contract && compensationOf(contract, state.operationKey);
  if (!declared || !compensation) return { kind: 'refuse', error: notAllowed };
  if (isCompensationStatus(state.status)) {
    const asked = state.compensation?.operationKey;
    return asked === compensation.operationKey
      ? { kind: 'replay', compensationKey: asked, state }
      : { kind: 'refuse', error: notAllowed };
  }
  const allowedFrom: readonly string[] = declared.allowedFrom ?? ['committed'];
  if (!allowedFrom.includes(state.status) || !state.receipt) return { kind: 'refuse', error: notAllowed };
  if (now > state.receipt.committedAt + declared.deadlineMs)
    return { kind: 'refuse', error: { class: ErrorClass.CompensationExpired } };
  return { kind: 'request', compensation };
}

/**
 * What the original's record takes from its compensation's state (`comp`, the compensation
 * operation's own): the command to append on the original, or `pending` while the compensation
 * has no outcome yet.
 * - committed → `complete` with the compensation's receipt;
 * - `unknown` handed to a person → `fail` (`taken_over`, with its last evidence): the world may
 *   still hold the effect, and a person has it (FM-20);
 * - rejected after its request was sent (it ran, or a person resolved it not applied) → `fail`
 *   (`rejected`, with its error class);
 * - rejected before anything was sent (e.g. its permission was refused at its execution instant) →
 *   `refuse`: the original is `committed` again, the refusal's class recorded.
 */
export type CompensationOutcome =
  | { kind: 'pending' }
  | { kind: 'complete'; receipt: Receipt }
  | { kind: 'fail'; failure: 'rejected' | 'taken_over'; error?: ErrorInfo; evidence?: Evidence }
  | { kind: 'refuse'; error: ErrorInfo };

export function compensationOutcomeOf(comp: OperationState): CompensationOutcome {
  if (comp.status === 'committed' && comp.receipt) return { kind: 'complete', receipt: comp.receipt };
  if (comp.status === 'unknown' && comp.takeover) {
    return {
      kind: 'fail',
      failure: 'taken_over',
      ...(comp.evidence || comp.takeover.lastEvidence ? { evidence: comp.evidence ?? comp.takeover.lastEvidence } : {}),
    };
  }
  if (comp.status === 'rejected') {
    const error = comp.error ?? { class: ErrorClass.Internal };
    const sent = comp.running !== undefined || comp.resolution !== undefined;
    return sent ? { kind: 'fail', failure: 'rejected', error } : { kind: 'refuse', error };
  }
  return { kind: 'pending' };
}

/**
 * The attempt of the compensation a new request registers, from the compensation operation's
 * state (`comp`): its first when it has none; the next after one refused before it ran (the
 * original went back to `committed`, and the same key starts its next attempt); the one there is
 * otherwise (its accept is then a replay of that attempt). Pure.
 */
export function compensationAttemptFor(comp: OperationState): number {
  if (comp.status === 'none') return 1;
  return comp.status === 'rejected' ? comp.attempt + 1 : comp.attempt;
}

/**
 * What an original being compensated needs, from its state and its compensation's (`comp`, the
 * compensation operation's own), so that it never stays `compensation_requested` for good:
 * - `register`: the request was recorded on the original but the compensation's attempt it names
 *   was never accepted (the process died between the two appends): a repeat of the same request
 *   (same key) completes that accept instead of answering a half-done state;
 * - `link`: that attempt has an outcome the original does not show yet (its link was lost, or read
 *   a stale state): append it (`linkCompensation`, tied to that attempt);
 * - `wait`: it has no outcome yet; it is an operation of its own, recovered as any;
 * - `none`: the original is not being compensated (or `comp` is not its compensation).
 * A request recorded before attempts were (no `attempt` in its link) takes whichever attempt there
 * is. Pure.
 */
export type CompensationSettlement = { kind: 'register' } | { kind: 'link' } | { kind: 'wait' } | { kind: 'none' };

export function compensationSettlement(original: OperationState, comp: OperationState): CompensationSettlement {
  if (original.status !== 'compensation_requested' || !original.compensation) return { kind: 'none' };
  const link = original.compensation;
  if (comp.status === 'none') return { kind: 'register' };
  if (comp.operationKey !== link.operationKey || comp.compensates?.operationKey !== original.operationKey)
    return { kind: 'none' };
  const attempt = link.attempt ?? comp.attempt;
  if (comp.attempt < attempt) return { kind: 'register' };
  if (comp.attempt > attempt) return { kind: 'wait' };
  return compensationOutcomeOf(comp).kind === 'pending' ? { kind: 'wait' } : { kind: 'link' };
}

/** What a confirmation of a held-back operation gets. */
export type ConfirmVerdict =
  /** Release it (the `confirm` command). */
  | { kind: 'confirm' }
  /** Already confirmed (waiting to start, running or ended since): one run; answer its state. */
  | { kind: 'replay'; state: OperationRecord }
  /**
   * Its confirmation deadline has passed while it waits: it ends `rolled_back` (the `confirm`
   * command appends the expiry itself) and the caller is answered `operation_discarded`.
   */
  | { kind: 'expire' }
  /** Refused: not registered (`not_found`), or discarded or expired (`operation_discarded`). */
  | { kind: 'refuse'; error: ErrorInfo }
  /**
   * It does not wait for a confirmation: its contract holds nothing back, or its prepare step has
   * not finished yet. Nothing changes; answer its state.
   */
  | { kind: 'not_awaiting'; state: OperationRecord };

/** Confirming twice is one run; confirming after a discard or the deadline is `operation_discarded`. Pure. */
export function confirmVerdict(state: OperationState, now: number): ConfirmVerdict {
  if (state.status === 'none') return { kind: 'refuse', error: { class: ErrorClass.NotFound } };
  if (state.confirmation?.confirmed) return { kind: 'replay', state };
  if (state.status === 'rolled_back') return { kind: 'refuse', error: { class: ErrorClass.OperationDiscarded } };
  if (state.status !== 'awaiting_confirmation') return { kind: 'not_awaiting', state };
  return confirmationExpired(state, now) ? { kind: 'expire' } : { kind: 'confirm' };
}

/** What a discard of a held-back operation gets. */
export type DiscardVerdict =
  | { kind: 'discard' }
  /** Already rolled back (discarded, or expired): nothing new; answer its state. */
  | { kind: 'replay'; state: OperationRecord }
  | { kind: 'refuse'; error: ErrorInfo }
  /** It does not wait for a confirmation (never held back, or already confirmed): nothing changes. */
  | { kind: 'not_awaiting'; state: OperationRecord };

/** Discarding twice is one discard; a confirmed operation is never discarded (it may have run). Pure. */
export function discardVerdict(state: OperationState): DiscardVerdict {
  if (state.status === 'none') return { kind: 'refuse', error: { class: ErrorClass.NotFound } };
  if (state.status === 'rolled_back') return { kind: 'replay', state };
  if (state.status !== 'awaiting_confirmation' || state.confirmation?.confirmed) return { kind: 'not_awaiting', state };
  return { kind: 'discard' };
}

/** Whether a held-back operation's confirmation deadline has passed at `now` (it then ends `rolled_back`). Pure. */
export function confirmationExpired(state: OperationState, now: number): boolean {
  if (state.status !== 'awaiting_confirmation') return false;
  const deadlineAt = state.confirmation?.deadlineAt;
  return deadlineAt !== undefined && now >= deadlineAt;
}

/**
 * The deadline a held-back attempt waits until: the hold's time plus the contract's
 * `confirm.deadlineMs`, or null when the contract holds nothing back. Pure.
 */
export function confirmationDeadlineOf(contract: Contract, heldAt: number): number | null {
  return contract.confirm ? heldAt + contract.confirm.deadlineMs : null;
}
