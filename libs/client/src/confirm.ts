import { randomUUID } from 'node:crypto';
import {
  confirmationRequestSchema,
  ErrorClass,
  NextAction,
  nextActionFor,
  toErrorInfo,
  type ErrorInfo,
} from '@tooltx/contracts';
import {
  keylessRefusalKey,
  type ConfirmationEnvelope,
  type Receipt,
  type ReceiptCheck,
  type ServerState,
  type StatusAnswer,
} from '@tooltx/lifecycle';
import { encode } from '@tooltx/nats';
import type { Connection } from './connection.js';
import { publishOne, sleep } from './submit.js';

/** `tools.confirm` / `tools.discard`'s request: the held-back operation's key. */
export interface ConfirmationRequest {
  operationKey: string;
}

/**
 * What a confirmation of a held-back operation came to (docs/compensation.md "Held-back commits"):
 * - `committed`: it ran and committed; `receipt` (checked like `execute`'s) and `result` as
 *   `execute` gives them. Confirming again answers the same: it runs once.
 * - `confirmed`: released, its run not ended within the budget (`lastServerState`; next: observe —
 *   `tools.status` or `execute` of the same call tell the outcome).
 * - `confirm_requested`: the request may be stored, and the operation was not seen released within
 *   the budget (next: observe).
 * - `rejected`: refused and nothing was run — `operation_discarded` (discarded, or not confirmed by
 *   its deadline), `forbidden` (the confirm permission), `not_found`, `invalid_input` (not held
 *   back, bad key) — or its run was refused after the confirmation, with the class's `next`.
 */
export type ConfirmResult =
  | { status: 'committed'; operationKey: string; result: unknown; receipt: Receipt; next: 'continue' }
  | { status: 'confirmed'; operationKey: string; lastServerState: ServerState; next: NextAction }
  | { status: 'confirm_requested'; operationKey: string; next: NextAction }
  | { status: 'rejected'; operationKey: string; error: ErrorInfo; next: NextAction };

/**
 * What a discard came to: `rolled_back` (nothing external happened: `reason` says whether this
 * discard, or an earlier one, or the confirmation deadline ended it); `rejected` with its class
 * (`invalid_input` code `already_confirmed` once it was confirmed — it may have run —, `forbidden`,
 * `not_found` …); or `discard_requested` when the budget ended first (next: observe).
 */
export type DiscardResult =
  | { status: 'rolled_back'; operationKey: string; reason: 'discarded' | 'expired' }
  | { status: 'rejected'; operationKey: string; error: ErrorInfo; next: NextAction }
  | { status: 'discard_requested'; operationKey: string; next: NextAction };

interface ConfirmIo {
  conn: Connection;
  tenant: string;
  actor: string;
  status(req: { operationKey: string; submissionIds?: string[] }): Promise<StatusAnswer>;
  verify(o: { operationKey: string; receipt: Receipt; result?: unknown }): ReceiptCheck;
}

const rejected = (operationKey: string, error: ErrorInfo) => ({
  status: 'rejected' as const,
  operationKey,
  error,
  next: nextActionFor[error.class],
});

/**
 * One confirmation or discard and what came of it within `budgetMs`. Never throws. The request is
 * checked (zod, field paths), published on this actor's intent subject (`{ confirms: {
 * operationKey } }` or `{ discards: … }`), and then read until it is answered: a refusal is
 * recorded under this submission's own key (`keylessRefusalKey`), the rest is the operation's own
 * status (`confirmation`, then its run's outcome).
 */
export async function confirmOrDiscard(
  io: ConfirmIo,
  action: 'confirm',
  req: ConfirmationRequest,
  budgetMs: number,
): Promise<ConfirmResult>;
export async function confirmOrDiscard(
  io: ConfirmIo,
  action: 'discard',
  req: ConfirmationRequest,
  budgetMs: number,
): Promise<DiscardResult>;
export async function confirmOrDiscard(
  io: ConfirmIo,
  action: 'confirm' | 'discard',
  req: ConfirmationRequest,
  budgetMs: number,
): Promise<ConfirmResult | DiscardResult> {
  const deadlineAt = Date.now() + budgetMs;
  const parsed = confirmationRequestSchema.safeParse(req);
  const asked = typeof req?.operationKey === 'string' ? req.operationKey : '';
  if (!parsed.success)
    return rejected(asked, {
      class: ErrorClass.InvalidInput,
      issues: parsed.error.issues.slice(0, 8).map((i) => ({
        path: i.path.map((p) => (typeof p === 'symbol' ? String(p) : p)),
        code: i.code,
        message: i.message,
      })),
    });
  const { operationKey } = parsed.data;
  const envelope: ConfirmationEnvelope =
    action === 'confirm' ? { confirms: { operationKey } } : { discards: { operationKey } };
  const submissionId = randomUUID();
  const requestKey = keylessRefusalKey(io.tenant, submissionId);
  const published = await publishOne(
    io.conn,
    io.tenant,
    io.actor,
    { data: encode(envelope) } as never,
    submissionId,
    deadlineAt,
  ).catch((err: unknown) => ({ unanswered: 1, result: { kind: 'failed' as const, error: toErrorInfo(err) } }));
  const r = published.result;
  // Refused before anything could be stored (permissions, a full stream): nothing was asked.
  if ((r.kind === 'refused' || r.kind === 'denied' || r.kind === 'credentials_refused') && published.unanswered === 0)
    return rejected(operationKey, r.error);
  let last: StatusAnswer | undefined;
  let released = false;
  for (let i = 0; Date.now() < deadlineAt; i++) {
    try {
      const mine = await io.status({ operationKey: requestKey, submissionIds: [submissionId] });
      if (mine.source === 'decision' && mine.state === 'rejected' && mine.error)
        return rejected(operationKey, mine.error);
      const a = await io.status({ operationKey });
      last = a;
      const c = a.confirmation;
      if (action === 'discard') {
        if (c?.status === 'rolled_back')
          return { status: 'rolled_back', operationKey, reason: c.reason ?? 'discarded' };
      } else if (c?.status === 'confirmed') {
        released = true;
        if (a.state === 'committed' && a.receipt) {
          const check = io.verify({
            operationKey: a.canonicalKey ?? operationKey,
            receipt: a.receipt,
            ...(a.result !== undefined ? { result: a.result } : {}),
          });
          if (check.valid && (a.result !== undefined || a.receipt.manual))
            return { status: 'committed', operationKey, result: a.result, receipt: a.receipt, next: 'continue' };
        }
        if (a.state === 'rejected' && a.error) return rejected(operationKey, a.error);
      }
    } catch {
      // The status service did not answer this time: read again until the budget ends.
    }
    await sleep(Math.min(Math.max(0, deadlineAt - Date.now()), Math.min(500, 25 * 2 ** Math.min(i, 5))));
  }
  if (action === 'discard') return { status: 'discard_requested', operationKey, next: NextAction.Observe };
  if (!released) return { status: 'confirm_requested', operationKey, next: NextAction.Observe };
  return {
    status: 'confirmed',
    operationKey,
    lastServerState: last?.state ?? 'not_seen',
    next: last?.state === 'unknown' ? NextAction.HandOver : NextAction.Observe,
  };
}
