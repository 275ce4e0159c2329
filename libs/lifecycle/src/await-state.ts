import type { EffectClass, ErrorInfo, NextAction } from '@tooltx/contracts';
import type { Receipt, TakeoverRecord } from './events.js';
import type { ServerState, StatusAnswer, StatusRequest } from './status.js';

/**
 * What the SDK knows while it awaits the outcome of one call, what comes of each step it takes,
 * the steps, and the answers: the data of the pure decider `decideAwait` (await-outcome.ts).
 */

/** What the SDK checks of a committed outcome before anyone may count it as done (FM-17). */
export type ReceiptCheck =
  | { valid: true }
  | { valid: false; reason: 'untrusted_key' | 'bad_signature' | 'other_operation' | 'result_mismatch' };

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
 * The answer of a call. `operationKey` of a committed or unknown answer is the operation that holds
 * the effect (the canonical key an answer named, FM-10); a rejection names the derived key.
 */
export type AwaitOutcome =
  | { status: 'committed'; operationKey: string; result: unknown; receipt: Receipt; next: 'continue' }
  | { status: 'rejected'; operationKey: string; error: ErrorInfo; next: NextAction; attempt?: number }
  | {
      status: 'unknown';
      operationKey: string;
      lastServerState: ServerState;
      evidence: UnknownEvidence;
      next: NextAction;
      error?: ErrorInfo;
    }
  | {
      /**
       * Held back (its contract declares `confirm`): accepted, prepared, and waiting for
       * `tools.confirm` or `tools.discard` until `deadlineAt` (ms since the epoch); nothing external
       * happened. `preview` is its prepare step's result, when it has one.
       */
      status: 'awaiting_confirmation';
      operationKey: string;
      preview?: unknown;
      deadlineAt?: number;
      next: typeof NextAction.ConfirmOrDiscard;
    };

/** The call being awaited: its derived key and input digest, effect class, and budget (ms since the epoch). */
export interface AwaitCall {
  operationKey: string;
  inputDigest: string;
  effect: EffectClass;
  /** Whether the request named another actor than the authenticated one (FM-06): a refusal without a path gets `actorId`. */
  forgedActor: boolean;
  startedAt: number;
  deadlineAt: number;
  /**
   * The caller saw this key committed before (with this input): the first step reads its status
   * instead of submitting — a repeat of a finished call costs a read (docs/sdk.md). Whatever the
   * read does not answer as committed is submitted as usual.
   */
  knownCommitted?: boolean;
}

/** What the SDK knows of the call so far (`decideAwait` returns the next one). */
export interface AwaitState extends AwaitCall {
  /** The key of the operation that holds the effect: the derived one, or the canonical one an answer named (FM-10). */
  outcomeKey: string;
  submissionIds: string[];
  /** Submission ids given up (another publisher's, or a duplicate whose intent is gone): later ids are random. */
  idsGivenUp: number;
  /** Whether a PubAck confirmed storing a submission. */
  intentStored: boolean;
  /** Whether a transmission may have been stored (no answer, or a duplicate's): a later refusal then proves nothing. */
  mayBeStored: boolean;
  /** When the latest submission's publish ended, ms since the epoch. */
  submittedAt: number;
  /** The latest submission's push: none to wait for, expected (not waited for yet), or waited for once. */
  push: 'none' | 'expected' | 'waited';
  statusAnswered: boolean;
  lastState: ServerState;
  lastSeq: number;
  attempt?: number;
  statusFailures: number;
  retryableRejections: number;
  /** The first status read of a key known committed is pending (see {@link AwaitCall.knownCommitted}). */
  readFirst: boolean;
  /** The wait of the last status request, ms. */
  askedWaitMs?: number;
  invalidReceipt?: string;
}

/** What is known before anything is sent. */
export function initialAwait(call: AwaitCall): AwaitState {
  return {
    ...call,
    outcomeKey: call.operationKey,
    submissionIds: [],
    idsGivenUp: 0,
    intentStored: false,
    mayBeStored: false,
    submittedAt: call.startedAt,
    push: 'none',
    statusAnswered: false,
    lastState: 'not_seen',
    lastSeq: 0,
    statusFailures: 0,
    retryableRejections: 0,
    readFirst: call.knownCommitted === true,
  };
}

/**
 * How one submission's publish ended (`submit`): a PubAck (`duplicate`: the server had stored that
 * id already); none before the budget ended; JetStream refused to store it (`refused`, its API error
 * code classified); the server refused a publish or subscription (`denied`, `intentPublish`: the
 * refused operation was a publish on the submission's subject); or refused the credentials.
 */
export type PublishResult =
  | { kind: 'acked'; duplicate: boolean }
  | { kind: 'no_ack' }
  | { kind: 'refused'; jsApiCode: number; error: ErrorInfo }
  | { kind: 'denied'; error: ErrorInfo; intentPublish: boolean }
  | { kind: 'credentials_refused'; error: ErrorInfo };

/**
 * What came of the last step:
 * - `start`: nothing sent yet;
 * - `published`: a submission's publish ended (`unanswered`: its transmissions that got no answer
 *   before `result`; `pushable`: a waiter for its push is registered);
 * - `stored_checked`: the answer to `confirm_stored`, null when none came within the budget;
 * - `answered`: a status answer, or the pushed one (`pushed`);
 * - `status_failed`: no status answer (`reauthorise`: the server refused the request or the
 *   credentials; else `error` as the request failed, `dependency_unavailable` when it did not answer);
 * - `push_missed`: the wait for the push ended without an answer;
 * - `paused`: a pause ended.
 */
export type AwaitEvent =
  | { kind: 'start' }
  | { kind: 'published'; submissionId: string; pushable: boolean; unanswered: number; result: PublishResult }
  | { kind: 'stored_checked'; answer: StatusAnswer | null }
  | { kind: 'answered'; answer: StatusAnswer; pushed: boolean }
  | { kind: 'status_failed'; error: ErrorInfo; reauthorise: boolean }
  | { kind: 'push_missed' }
  | { kind: 'paused' };

/**
 * The next step:
 * - `submit`: after `delayMs`, publish a new submission of the call's intent (retransmitting it
 *   until a PubAck or the budget's end) under a new id — random when `randomId` (an earlier id was
 *   taken or lost), else the caller's id factory's; report `published`;
 * - `confirm_stored`: send `request` (no wait) before the budget ends; report `stored_checked`;
 * - `wait_push`: wait up to `ms` for the latest submission's push alone; report `answered` or `push_missed`;
 * - `ask_status`: send `request`, raced by the latest submission's push when `racePush`; report
 *   `answered` or `status_failed`;
 * - `pause`: wait `ms` (ended early by the latest submission's push when `wakeOnPush`); report `paused`;
 * - `answer`: the call's outcome.
 */
export type AwaitStep =
  | { kind: 'submit'; delayMs: number; randomId: boolean }
  | { kind: 'confirm_stored'; request: StatusRequest }
  | { kind: 'wait_push'; ms: number }
  | { kind: 'ask_status'; request: StatusRequest; racePush: boolean }
  | { kind: 'pause'; ms: number; wakeOnPush: boolean }
  | { kind: 'answer'; outcome: AwaitOutcome };

/**
 * What the decider is told besides the event: the time (ms since the epoch), whether the connection
 * has received a push for any call, and the SDK's receipt check (`checkReceipt` with its trusted keys).
 */
export interface AwaitContext {
  now: number;
  pushSeen: boolean;
  checkReceipt(operationKey: string, receipt: Receipt): ReceiptCheck;
}

export interface AwaitDecision {
  state: AwaitState;
  step: AwaitStep;
}
