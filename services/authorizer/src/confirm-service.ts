import { randomUUID } from 'node:crypto';
import type { JetStreamClient } from '@nats-io/jetstream';
import type { NatsConnection } from '@nats-io/transport-node';
import { z } from 'zod';
import {
  confirmationRequestSchema,
  ErrorClass,
  idSchema,
  operationIdOf,
  operatorActorOf,
  TooltxError,
  type ErrorInfo,
} from '@tooltx/contracts';
import { keylessRefusalKey, type ConfirmationEnvelope, type OperationStore, type Receipt } from '@tooltx/lifecycle';
import { encode, type Subjects } from '@tooltx/nats';
import { jsonCodec, startResponder, type Responder } from '@tooltx/readside';
import type { Logger } from '@tooltx/runtime';
import { publishOperatorIntent, sleep } from './compensate-service.js';

/** The longest an operator's confirmation or discard waits for its outcome, ms. */
export const MAX_CONFIRM_WAIT_MS = 60_000;
/** How long it waits when the request does not say, ms. */
export const DEFAULT_CONFIRM_WAIT_MS = 10_000;

/**
 * What an operator asks on `<prefix>.ops.confirm.<operator>` or `<prefix>.ops.discard.<operator>`
 * (JSON, strict): the held-back operation of `tenant`, and how long to wait for the outcome (0–60 000
 * ms, default 10 000). The action is the subject's.
 */
export const operatorConfirmRequestSchema = confirmationRequestSchema.extend({
  tenant: idSchema,
  waitMs: z.number().int().min(0).max(MAX_CONFIRM_WAIT_MS).optional(),
});
export type OperatorConfirmRequest = z.infer<typeof operatorConfirmRequestSchema>;

/**
 * The answer, the SDK's `ConfirmResult` / `DiscardResult` without `next` and the business result:
 * - confirm: `committed` with the operation's receipt (it ran once, however often it was
 *   confirmed), `confirmed` (released, its run not ended within the wait: `state` is where it
 *   stands), `confirm_requested` (not seen released within the wait);
 * - discard: `rolled_back` (`reason`: this discard or an earlier one, or its deadline),
 *   `discard_requested` (not seen rolled back within the wait);
 * - either: `rejected` with the class (of the request, or of the run the confirmation released). A
 *   refusal of the request itself (`invalid_input` of its fields, `forbidden`) carries only `error`.
 */
export type OperatorConfirmAnswer =
  | { status: 'committed'; operationKey: string; receipt: Receipt }
  | { status: 'confirmed'; operationKey: string; state: string }
  | { status: 'confirm_requested'; operationKey: string }
  | { status: 'rolled_back'; operationKey: string; reason: 'discarded' | 'expired' }
  | { status: 'discard_requested'; operationKey: string }
  | { status: 'rejected'; operationKey?: string; error: ErrorInfo };

export interface ConfirmServiceDeps {
  nc: NatsConnection;
  js: JetStreamClient;
  store: OperationStore;
  subjects: Subjects;
  log: Logger;
}

/**
 * The operator confirmation service (`tooltx confirm`, `tooltx discard`; docs/compensation.md), in
 * every authorizer instance (queue groups `tooltx-ops-confirm`, `tooltx-ops-discard`). The action
 * and the operator come from the subject, which the server lets only an operator granted `confirm`
 * publish on; never from the payload. The request is judged through the agents' path: it is
 * stored as a `{ confirms }` or `{ discards }` intent in the tenant's intake stream under the actor
 * token `_op-<operator>` (which no agent can hold, and which this authorizer identity may publish
 * on only for granted operators: a request that reached here for another is answered `forbidden`
 * when the server refuses that publish), so the authorizer judges it as any confirmation — the
 * verdict, the contract's policy told the operator's grant is the permission, the expected-sequence
 * append, one run however often it is confirmed, the same refusal classes. Then the outcome is read
 * through the store: a refusal of this request (recorded under the submission's own key, on the
 * operator's token), or the operation's own state, until it answers or the wait is over.
 */
export function startConfirmService(d: ConfirmServiceDeps): Responder[] {
  const { store, subjects } = d;
  // Waits end at once when the service stops: their answer is `confirm_requested` or `discard_requested`.
  const stopping = new AbortController();

  const handle = async (
    req: OperatorConfirmRequest,
    who: { action: 'confirm' | 'discard'; operator: string },
  ): Promise<OperatorConfirmAnswer> => {
    const started = Date.now();
    const waitMs = req.waitMs ?? DEFAULT_CONFIRM_WAIT_MS;
    const { tenant, operationKey } = req;
    const { action, operator } = who;
    const actor = operatorActorOf(operator);
    const l = d.log.child({ tenant, operator, operationKey, action });
    const pending: OperatorConfirmAnswer =
      action === 'confirm'
        ? { status: 'confirm_requested', operationKey }
        : { status: 'discard_requested', operationKey };
    const envelope: ConfirmationEnvelope =
      action === 'confirm' ? { confirms: { operationKey } } : { discards: { operationKey } };
    const submissionId = randomUUID();
    // The publish gets a few seconds of its own even with `waitMs: 0`: the request is stored (or
    // known not to be) before the answer goes.
    const published = await publishOperatorIntent(
      d.js,
      subjects.intent(tenant, actor),
      encode(envelope),
      submissionId,
      started + Math.max(waitMs, 5_000),
      stopping.signal,
    );
    if (published === 'forbidden') {
      l.warn(`${action} request of an operator this identity may not publish for: forbidden`);
      throw new TooltxError(ErrorClass.Forbidden, 'not an operator who may confirm or discard');
    }
    if (published === 'no_ack') return pending;
    l.info(`${action} requested by an operator`);

    // A refusal of this request is recorded under its submission's own key, on the operator's
    // token; anything else is the operation's own state.
    const requestId = operationIdOf(keylessRefusalKey(tenant, submissionId));
    const opId = operationIdOf(operationKey);
    const deadlineAt = started + waitMs;
    for (let i = 0; ; i++) {
      const mine = await store.lastDecision(tenant, requestId, actor);
      if (mine?.outcome === 'rejected' && mine.submissionId === submissionId)
        return { status: 'rejected', operationKey, error: mine.error };
      const { state } = await store.load(tenant, opId);
      const c = state.status === 'none' ? undefined : state.confirmation;
      if (state.status !== 'none' && c) {
        if (action === 'discard') {
          if (state.status === 'rolled_back')
            return { status: 'rolled_back', operationKey, reason: c.discarded ? 'discarded' : 'expired' };
        } else if (c.confirmed) {
          if (state.status === 'committed' && state.receipt)
            return { status: 'committed', operationKey, receipt: state.receipt };
          if (state.status === 'rejected' && state.error)
            return { status: 'rejected', operationKey, error: state.error };
        }
      }
      const left = deadlineAt - Date.now();
      if (left <= 0 || stopping.signal.aborted) break;
      await sleep(Math.min(left, Math.min(500, 25 * 2 ** Math.min(i, 5))), stopping.signal);
    }
    const { state } = await store.load(tenant, opId);
    if (action === 'confirm' && state.status !== 'none' && state.confirmation?.confirmed)
      return { status: 'confirmed', operationKey, state: state.status };
    return pending;
  };

  const endpoint = (action: 'confirm' | 'discard'): Responder =>
    startResponder(d.nc, d.log, {
      name: `operator ${action}`,
      subject: action === 'confirm' ? subjects.allOpsConfirm : subjects.allOpsDiscard,
      queue: `tooltx-ops-${action}`,
      identify: (subject) => {
        const who = subjects.parseOpsConfirmSubject(subject);
        return who?.action === action ? { who, role: { kind: 'operator', operator: who.operator } } : null;
      },
      unidentified: {
        class: ErrorClass.InvalidInput,
        issues: [{ path: ['subject'], code: 'invalid_subject', message: `not an operator ${action} subject` }],
      },
      codec: jsonCodec,
      schema: operatorConfirmRequestSchema,
      handle,
      // Only the class: a refused requester learns nothing about the operation.
      errorBody: (error): OperatorConfirmAnswer => ({ status: 'rejected', error }),
      onDrained: () => stopping.abort(),
    });

  return [endpoint('confirm'), endpoint('discard')];
}
