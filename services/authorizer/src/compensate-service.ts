import { randomUUID } from 'node:crypto';
import type { JetStreamClient } from '@nats-io/jetstream';
import type { NatsConnection } from '@nats-io/transport-node';
import { z } from 'zod';
import {
  compensationOf,
  compensationRequestSchema,
  ErrorClass,
  idSchema,
  operationIdOf,
  operatorActorOf,
  TooltxError,
  type ErrorInfo,
} from '@tooltx/contracts';
import type { CompensationEnvelope, OperationStore, Receipt } from '@tooltx/lifecycle';
import { encode, isTransient, permissionViolationOf, type Subjects } from '@tooltx/nats';
import { jsonCodec, startResponder, type Responder } from '@tooltx/readside';
import type { ImplementationRegistry, Logger } from '@tooltx/runtime';

/** The longest an operator's request waits for its compensation's outcome, ms. */
export const MAX_COMPENSATE_WAIT_MS = 60_000;
/** How long it waits when the request does not say, ms. */
export const DEFAULT_COMPENSATE_WAIT_MS = 10_000;
/** The wait of one publish acknowledgement, ms (retransmitted under the same id until the budget ends). */
const PUBACK_TIMEOUT_MS = 2_000;

/**
 * What an operator asks on `<prefix>.ops.compensate.<operator>` (JSON, strict): the operation of
 * `tenant` to compensate, why (1–500 characters, kept as a digest), and how long to wait for the
 * compensation's outcome (0–60 000 ms, default 10 000).
 */
export const operatorCompensateRequestSchema = compensationRequestSchema.extend({
  tenant: idSchema,
  waitMs: z.number().int().min(0).max(MAX_COMPENSATE_WAIT_MS).optional(),
});
export type OperatorCompensateRequest = z.infer<typeof operatorCompensateRequestSchema>;

/**
 * The answer, the SDK's `CompensateResult` without `next`: `compensated` with the compensation's
 * own receipt, `compensation_failed`, `compensation_requested` (not ended within the wait: ask
 * again, a second request is a replay), or `rejected` with the class. A refusal of the request
 * itself (`invalid_input`, `internal`) carries only `error`.
 */
export type OperatorCompensateAnswer =
  | { status: 'compensated'; operationKey: string; compensationKey: string; receipt: Receipt }
  | { status: 'compensation_failed'; operationKey: string; compensationKey: string; error?: ErrorInfo }
  | { status: 'compensation_requested'; operationKey: string; compensationKey: string }
  | { status: 'rejected'; operationKey?: string; compensationKey?: string | null; error: ErrorInfo };

export interface CompensateServiceDeps {
  nc: NatsConnection;
  js: JetStreamClient;
  store: OperationStore;
  subjects: Subjects;
  tools: ImplementationRegistry;
  log: Logger;
}

/** Waits `ms`, or less when `signal` aborts. */
export const sleep = (ms: number, signal: AbortSignal) =>
  new Promise<void>((resolve) => {
    if (signal.aborted) return resolve();
    const t = setTimeout(done, Math.max(0, ms));
    function done() {
      clearTimeout(t);
      signal.removeEventListener('abort', done);
      resolve();
    }
    signal.addEventListener('abort', done, { once: true });
  });

/**
 * Publishes an operator request's intent until the server acknowledges it, refuses it (`forbidden`:
 * this identity may not publish for that operator), or the budget ends (`no_ack`, or at once when
 * `signal` aborts). Retransmitted under the same message id, so it is stored once.
 */
export async function publishOperatorIntent(
  js: JetStreamClient,
  subject: string,
  data: Uint8Array,
  submissionId: string,
  deadlineAt: number,
  signal: AbortSignal,
): Promise<'acked' | 'forbidden' | 'no_ack'> {
  for (let i = 0; Date.now() < deadlineAt && !signal.aborted; i++) {
    try {
      await js.publish(subject, data, {
        msgID: submissionId,
        timeout: Math.min(PUBACK_TIMEOUT_MS, Math.max(100, deadlineAt - Date.now())),
      });
      return 'acked';
    } catch (err) {
      if (permissionViolationOf(err)) return 'forbidden';
      if (!isTransient(err)) throw err;
      await sleep(Math.min(deadlineAt - Date.now(), 100 * 2 ** Math.min(i, 5)), signal);
    }
  }
  return 'no_ack';
}

/**
 * The operator compensation service (`tooltx compensate`, docs/compensation.md), in every
 * authorizer instance (queue group `tooltx-ops-compensate`). The operator's id comes from the
 * subject, which the server lets only an operator granted `compensate` publish on; never from the
 * payload. The request is registered through the agents' path: it is stored as a compensation
 * intent in the tenant's intake stream under the actor token `_op-<operator>` (which no agent can
 * hold, and which this authorizer identity may publish on only for granted operators: a request
 * that reached here for another is answered `forbidden` when the server refuses that publish), so
 * the authorizer judges it like any compensation request — verdict, expected-sequence append,
 * replay for a second requester, the same refusal classes — and the executor rebuilds the
 * compensating input from that stored request. Then the compensation's outcome is read through the
 * store until it ends or the wait is over.
 */
export function startCompensateService(d: CompensateServiceDeps): Responder {
  const { store, subjects, tools } = d;
  // Waits end at once when the service stops: their answer is `compensation_requested`.
  const stopping = new AbortController();

  const rejected = (
    operationKey: string,
    compensationKey: string | null,
    error: ErrorInfo,
  ): OperatorCompensateAnswer => ({
    status: 'rejected',
    operationKey,
    compensationKey,
    error,
  });

  const handle = async (req: OperatorCompensateRequest, operator: string): Promise<OperatorCompensateAnswer> => {
    const started = Date.now();
    const waitMs = req.waitMs ?? DEFAULT_COMPENSATE_WAIT_MS;
    const { tenant, operationKey, reason } = req;
    const actor = operatorActorOf(operator);
    const l = d.log.child({ tenant, operator, operationKey });
    // What the SDK reads from the status answer, read from the store: the original's contract names
    // the compensating contract and the compensation's key (the original's key and that contract only).
    const { state: original } = await store.load(tenant, operationIdOf(operationKey));
    if (original.status === 'none' || original.operationKey !== operationKey)
      return rejected(operationKey, null, { class: ErrorClass.NotFound });
    const contract = tools.get(original.tool, original.version)?.contract;
    const declared = contract && compensationOf(contract, operationKey);
    if (!declared) return rejected(operationKey, null, { class: ErrorClass.CompensationNotAllowed });
    const compensationKey = declared.operationKey;
    const compensating = tools.get(declared.tool, declared.version)?.contract;
    const envelope: CompensationEnvelope = {
      tool: declared.tool,
      version: declared.version,
      operationKey: compensationKey,
      compensates: { operationKey, reason },
      ...(compensating ? { interfaceDigest: compensating.interfaceDigest } : {}),
    };
    const submissionId = randomUUID();
    // The publish gets a few seconds of its own even with `waitMs: 0`: the request is registered
    // (or known not to be) before the answer goes.
    const published = await publishOperatorIntent(
      d.js,
      subjects.intent(tenant, actor),
      encode(envelope),
      submissionId,
      started + Math.max(waitMs, 5_000),
      stopping.signal,
    );
    if (published === 'forbidden') {
      l.warn('compensation request of an operator this identity may not publish for: forbidden');
      throw new TooltxError(ErrorClass.Forbidden, 'not an operator who may compensate');
    }
    if (published === 'no_ack') return { status: 'compensation_requested', operationKey, compensationKey };
    l.info({ compensationKey }, 'compensation requested by an operator');

    // Its outcome: a refusal of this request (its decision record under the compensation's key, on
    // the operator's token), or the original's compensation link, with the compensation's receipt
    // once it committed.
    const compId = operationIdOf(compensationKey);
    const deadlineAt = started + waitMs;
    for (let i = 0; ; i++) {
      // This request's own record: an operator asking twice at once has two on one subject.
      const mine = await store.decisionOf(tenant, compId, actor, [submissionId]);
      if (mine?.outcome === 'rejected' && mine.submissionId === submissionId)
        return rejected(operationKey, compensationKey, mine.error);
      // Judged: this request registered the compensation, or was answered with it (the replay).
      const { state: comp } = await store.load(tenant, compId);
      const judged =
        (mine?.outcome === 'replayed' && mine.submissionId === submissionId) ||
        (comp.status !== 'none' && comp.intent.submissionId === submissionId);
      const { state: now } = await store.load(tenant, operationIdOf(operationKey));
      const c = now.status === 'none' ? undefined : now.compensation;
      if (judged && now.status !== 'none' && c?.operationKey === compensationKey) {
        if (now.status === 'compensated') {
          const receipt = comp.status === 'committed' ? comp.receipt : c.receipt;
          if (receipt) return { status: 'compensated', operationKey, compensationKey, receipt };
        }
        if (now.status === 'compensation_failed')
          return {
            status: 'compensation_failed',
            operationKey,
            compensationKey,
            ...(c.failure?.error ? { error: c.failure.error } : {}),
          };
        if (now.status === 'committed' && c.refusal && c.refusal.at >= started)
          return rejected(operationKey, compensationKey, c.refusal.error);
      }
      const left = deadlineAt - Date.now();
      if (left <= 0 || stopping.signal.aborted) break;
      await sleep(Math.min(left, Math.min(500, 25 * 2 ** Math.min(i, 5))), stopping.signal);
    }
    return { status: 'compensation_requested', operationKey, compensationKey };
  };

  return startResponder(d.nc, d.log, {
    name: 'operator compensation',
    subject: subjects.allOpsCompensate,
    queue: 'tooltx-ops-compensate',
    identify: (subject) => {
      const operator = subjects.parseOpsCompensateSubject(subject);
      return operator ? { who: operator, role: { kind: 'operator', operator } } : null;
    },
    unidentified: {
      class: ErrorClass.InvalidInput,
      issues: [{ path: ['subject'], code: 'invalid_subject', message: 'not an operator compensation subject' }],
    },
    codec: jsonCodec,
    schema: operatorCompensateRequestSchema,
    handle,
    // Only the class: a refused requester learns nothing about the operation.
    errorBody: (error): OperatorCompensateAnswer => ({ status: 'rejected', error }),
    onDrained: () => stopping.abort(),
  });
}
