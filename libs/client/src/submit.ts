import { JetStreamApiError } from '@nats-io/jetstream';
import {
  ErrorClass,
  prepareCall,
  toErrorInfo,
  TooltxError,
  type Contract,
  type ErrorInfo,
  type PreparedCall,
} from '@tooltx/contracts';
import type { IntentEnvelope, PublishResult } from '@tooltx/lifecycle';
import { encode, isTransient, permissionViolationOf } from '@tooltx/nats';
import type { Connection } from './connection.js';
import type { ExecuteRequest } from './options.js';
import { newSubmission, publishSubmission } from './submission.js';

const PUBACK_TIMEOUT_MS = 2_000;
/**
 * Room left for the headers of a submission (`Nats-Msg-Id` and the HPUB framing, under 100 bytes)
 * within the server's `max_payload`, which bounds headers and payload together (NATS protocol, HPUB).
 */
const HEADER_ALLOWANCE_BYTES = 512;

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
      return {
        class: ErrorClass.QuotaExceeded,
        retryAfterMs: QUOTA_RETRY_AFTER_MS,
        issues: [
          {
            path: [],
            code: 'intake_full',
            message: `the tenant's intake is full (JetStream API error ${jsApiCode}): nothing of this intent was stored; try again after retryAfterMs`,
          },
        ],
      };
    case PublishRefusalCode.InsufficientResources:
    case PublishRefusalCode.AccountResourcesExceeded:
      return {
        class: ErrorClass.DependencyUnavailable,
        issues: [
          {
            path: [],
            code,
            message: `the server refused to store the intent (JetStream API error ${jsApiCode}): nothing of it was stored; try again later`,
          },
        ],
      };
    case PublishRefusalCode.MessageExceedsMaximum:
      return {
        class: ErrorClass.InvalidInput,
        issues: [
          {
            path: ['input'],
            code: 'too_large',
            message: `the encoded intent is larger than the intents stream takes (JetStream API error ${jsApiCode}): split the input into smaller calls`,
          },
        ],
      };
    default:
      return null;
  }
}

/** A call ready to submit: its contract, prepared call (key, digests), envelope and the envelope's bytes. */
export interface PreparedIntent {
  contract: Contract;
  call: PreparedCall;
  envelope: IntentEnvelope;
  /** The encoded envelope: every submission of the call sends these bytes. */
  data: Uint8Array;
}

/**
 * Prepares a call from the request, or the refusal that needs nothing sent (`operationKey`: the key
 * it names, null before one is derived): no single contract `tool@version` (`invalid_input` at
 * `tool` or `version`), an input the contract refuses, a supplied key other than the derived one
 * (`idempotency_conflict` at `operationKey`, FM-03), an intent over the server's `max_payload`
 * (`invalid_input` at `input`, `too_large`). Local checks only improve UX; the server repeats each.
 */
export function prepareIntent(
  byName: ReadonlyMap<string, Contract[]>,
  req: ExecuteRequest,
  maxPayload: number | undefined,
  /**
   * The version of an unpinned call of a name with several contracts: the one the task started
   * with, else the registry's current one (docs/contracts.md); undefined = none known.
   */
  versionFor: (tool: string, taskId: string) => number | undefined = () => undefined,
): { intent: PreparedIntent } | { refusal: { operationKey: string | null; error: ErrorInfo } } {
  const candidates = byName.get(req.tool) ?? [];
  const unpinned = () => {
    if (candidates.length === 1) return candidates[0];
    const v = versionFor(req.tool, req.taskId);
    return v === undefined ? undefined : candidates.find((c) => c.version === v);
  };
  const contract = req.version === undefined ? unpinned() : candidates.find((c) => c.version === req.version);
  if (!contract) {
    const path = candidates.length ? 'version' : 'tool';
    return {
      refusal: {
        operationKey: null,
        error: {
          class: ErrorClass.InvalidInput,
          issues: [
            {
              path: [path],
              code: 'unknown_contract',
              message: `no single contract ${req.tool}${req.version ? `@${req.version}` : ''}`,
            },
          ],
        },
      },
    };
  }
  let call: PreparedCall;
  try {
    call = prepareCall(contract, req.taskId, req.input);
  } catch (err) {
    return { refusal: { operationKey: null, error: toErrorInfo(err) } };
  }
  const key = call.operationKey;
  if (req.operationKey !== undefined && req.operationKey !== key) {
    return {
      refusal: {
        operationKey: req.operationKey,
        error: {
          class: ErrorClass.IdempotencyConflict,
          issues: [
            {
              path: ['operationKey'],
              code: 'key_mismatch',
              message: 'the operation key is derived from taskId, contract, target and intent',
            },
          ],
        },
      },
    };
  }
  // The contract's digest goes along: the authorizer refuses a write made with a contract that
  // differs from its own under the same name@version (FM-25).
  const envelope = {
    tool: contract.name,
    version: contract.version,
    taskId: req.taskId,
    operationKey: key,
    interfaceDigest: contract.interfaceDigest,
    input: req.input,
    ...(req.actorId !== undefined ? { actorId: req.actorId } : {}),
  };
  // The server drops a message over its max_payload without storing it (and the client refuses to
  // send one): a call that can never be stored is the caller's to shrink, not an unknown outcome.
  const data = encode(envelope);
  const size = data.length + HEADER_ALLOWANCE_BYTES;
  if (maxPayload !== undefined && size > maxPayload) {
    const message = `the encoded intent is ${size - HEADER_ALLOWANCE_BYTES} bytes; with its headers (${HEADER_ALLOWANCE_BYTES} bytes allowed) it must fit the server's max_payload of ${maxPayload} bytes: split the input into smaller calls`;
    return {
      refusal: {
        operationKey: key,
        error: { class: ErrorClass.InvalidInput, issues: [{ path: ['input'], code: 'too_large', message }] },
      },
    };
  }
  return { intent: { contract, call, envelope, data } };
}

/**
 * Publishes one submission of `intent` under `submissionId`, retransmitting it (same id) after a
 * transmission that got no PubAck, with a backoff, until a PubAck, a refusal or `deadlineAt` (ms
 * since the epoch). Returns how it ended and how many transmissions got no answer before that
 * (each may have been stored). Throws what no rule knows (a non-transient client error).
 */
export async function publishOne(
  conn: Connection,
  tenant: string,
  actor: string,
  intent: PreparedIntent,
  submissionId: string,
  deadlineAt: number,
): Promise<{ unanswered: number; result: PublishResult }> {
  const s = newSubmission(conn.subjects, tenant, actor, intent.envelope, submissionId, intent.data);
  const left = () => deadlineAt - Date.now();
  let i = 0;
  for (; left() > 0; i++) {
    try {
      const ack = await publishSubmission(conn.js, s, Math.min(PUBACK_TIMEOUT_MS, Math.max(100, left())));
      return { unanswered: i, result: { kind: 'acked', duplicate: ack.duplicate } };
    } catch (err) {
      const denied = permissionViolationOf(err);
      if (denied)
        return {
          unanswered: i,
          result: {
            kind: 'denied',
            error: { class: ErrorClass.Forbidden, issues: [conn.deniedIssue(denied, 'call')] },
            intentPublish: denied.operation === 'publish' && denied.subject === s.subject,
          },
        };
      const refusedCredentials = conn.credentialsRefusal();
      if (refusedCredentials)
        return {
          unanswered: i,
          result: {
            kind: 'credentials_refused',
            error: new TooltxError(ErrorClass.Forbidden, 'credentials refused', {
              issues: refusedCredentials.issues,
            }).toInfo(),
          },
        };
      if (err instanceof JetStreamApiError) {
        const refusal = classifyPublishRefusal(err.code);
        if (refusal) return { unanswered: i, result: { kind: 'refused', jsApiCode: err.code, error: refusal } };
      }
      // No answer: this transmission may have been stored.
      if (!isTransient(err)) throw err;
      await sleep(Math.min(left(), 100 * 2 ** Math.min(i, 5)));
    }
  }
  return { unanswered: i, result: { kind: 'no_ack' } };
}

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, Math.max(0, ms)));
}
