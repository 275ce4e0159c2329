import { randomUUID } from 'node:crypto';
import {
  compensationOf,
  compensationRequestSchema,
  ErrorClass,
  nextActionFor,
  NextAction,
  toErrorInfo,
  type Contract,
  type ErrorInfo,
} from '@tooltx/contracts';
import type {
  CompensationEnvelope,
  IntentEnvelope,
  Receipt,
  ReceiptCheck,
  StatusAnswer,
  TakeoverRecord,
} from '@tooltx/lifecycle';
import { encode } from '@tooltx/nats';
import type { Connection } from './connection.js';
import { publishOne, sleep } from './submit.js';

/** `tools.compensate`'s request: the operation to compensate and why (1–500 characters, kept as a digest). */
export interface CompensateRequest {
  operationKey: string;
  reason: string;
}

/**
 * Where a compensation stands (docs/compensation.md). `operationKey` is the original's; its committed
 * receipt stays valid in every case. `compensationKey` is the compensation's own operation (its
 * status answers it).
 * - `compensated`: the compensation committed; `receipt` is its own, checked like `execute`'s.
 * - `compensation_failed`: it was refused after it ran, or its outcome went to a person: the world
 *   still holds the original's effect (next: `hand_over`). `takeover` is the record a person
 *   resolves (`tooltx takeover resolve`, FM-20), when the server wrote one.
 * - `compensation_requested`: registered, not ended within the budget (next: `observe`).
 * - `rejected`: refused before anything was sent (`compensation_not_allowed`, `compensation_expired`,
 *   `forbidden`, `not_found`, `invalid_input` …), with the class's `next`.
 * `replayed` (all but `rejected`): true when this request found the compensation already registered
 * by an earlier request (another client's, or this one's before) and was answered with it (FM-21);
 * false when this request registered it. On `compensation_requested` it is false until this
 * request was judged.
 */
export type CompensateResult =
  | { status: 'compensated'; operationKey: string; compensationKey: string; receipt: Receipt; replayed: boolean }
  | {
      status: 'compensation_failed';
      operationKey: string;
      compensationKey: string;
      error?: ErrorInfo;
      takeover?: TakeoverRecord;
      next: NextAction;
      replayed: boolean;
    }
  | {
      status: 'compensation_requested';
      operationKey: string;
      compensationKey: string;
      next: NextAction;
      replayed: boolean;
    }
  | { status: 'rejected'; operationKey: string; compensationKey: string | null; error: ErrorInfo; next: NextAction };

interface CompensateIo {
  conn: Connection;
  tenant: string;
  actor: string;
  status(req: { operationKey: string; submissionIds?: string[] }): Promise<StatusAnswer>;
  verify(o: { operationKey: string; receipt: Receipt }): ReceiptCheck;
  contract(id: string): Contract | undefined;
}

const rejected = (operationKey: string, compensationKey: string | null, error: ErrorInfo): CompensateResult => ({
  status: 'rejected',
  operationKey,
  compensationKey,
  error,
  next: nextActionFor[error.class],
});

/**
 * One compensation request and its outcome within `budgetMs`. Never throws: a request that could
 * not be established is `compensation_requested` (observe) once it may have been stored, else
 * `rejected`. Steps: the request is checked (zod, field paths); the original's status names its
 * contract, whose declaration gives the compensating contract and the compensation's key (from the
 * original's key and that contract only, so every requester's is the same: FM-21); the request is
 * published on this actor's intent subject; then the compensation's status (a refusal recorded
 * under its key) and the original's (its compensation's outcome) are read until it ends.
 */
export async function compensate(
  io: CompensateIo,
  req: CompensateRequest,
  budgetMs: number,
): Promise<CompensateResult> {
  const started = Date.now();
  const deadlineAt = started + budgetMs;
  const parsed = compensationRequestSchema.safeParse(req);
  const asked = typeof req?.operationKey === 'string' ? req.operationKey : '';
  if (!parsed.success)
    return rejected(asked, null, {
      class: ErrorClass.InvalidInput,
      issues: parsed.error.issues.slice(0, 8).map((i) => ({
        path: i.path.map((p) => (typeof p === 'symbol' ? String(p) : p)),
        code: i.code,
        message: i.message,
      })),
    });
  const { reason } = parsed.data;
  let original: StatusAnswer;
  try {
    original = await io.status({ operationKey: parsed.data.operationKey });
  } catch (err) {
    return rejected(parsed.data.operationKey, null, toErrorInfo(err));
  }
  if (original.source !== 'operation' || !original.contract)
    return rejected(parsed.data.operationKey, null, { class: ErrorClass.NotFound });
  // A key of a call that named its target through an alias answers for the operation registered
  // under the canonical key (FM-10): that operation is the one compensated.
  const operationKey = original.canonicalKey ?? parsed.data.operationKey;
  const contract = io.contract(original.contract);
  const declared = contract && compensationOf(contract, operationKey);
  if (!declared) return rejected(operationKey, null, { class: ErrorClass.CompensationNotAllowed });
  const compensationKey = declared.operationKey;
  const compensating = io.contract(`${declared.tool}@${declared.version}`);
  const envelope: CompensationEnvelope = {
    tool: declared.tool,
    version: declared.version,
    operationKey: compensationKey,
    compensates: { operationKey, reason },
    ...(compensating ? { interfaceDigest: compensating.interfaceDigest } : {}),
  };
  const submissionId = randomUUID();
  const published = await publishOne(
    io.conn,
    io.tenant,
    io.actor,
    {
      contract: contract,
      call: { operationKey: compensationKey } as never,
      envelope: envelope as unknown as IntentEnvelope,
      data: encode(envelope),
    },
    submissionId,
    deadlineAt,
  ).catch(() => ({ unanswered: 1, result: { kind: 'no_ack' as const } }));
  const r = published.result;
  if (r.kind !== 'acked' && r.kind !== 'no_ack' && 'error' in r)
    return rejected(operationKey, compensationKey, r.error);
  // Read until it ends: a refusal of this request (under the compensation's key), or the original's
  // compensation status, with the compensation's receipt once it committed.
  let replayed = false;
  for (let i = 0; Date.now() < deadlineAt; i++) {
    try {
      const mine = await io.status({ operationKey: compensationKey, submissionIds: [submissionId] });
      if (mine.source === 'decision' && mine.state === 'rejected' && mine.error)
        return rejected(operationKey, compensationKey, mine.error);
      // Registered by another request: this one is answered only once it was judged itself (each
      // requester is authorised on its own), with the replay or with its own refusal.
      const judged = mine.source !== 'operation' || mine.ownAttempt !== false || mine.replayed === true;
      replayed = mine.source === 'operation' && mine.replayed === true;
      const now = await io.status({ operationKey });
      const c = now.compensation;
      if (judged && c && c.operationKey === compensationKey) {
        if (c.status === 'compensated' && mine.receipt) {
          const check = io.verify({ operationKey: compensationKey, receipt: mine.receipt });
          if (!check.valid)
            return {
              status: 'compensation_failed',
              operationKey,
              compensationKey,
              error: { class: ErrorClass.Internal },
              next: NextAction.HandOver,
              replayed,
            };
          return { status: 'compensated', operationKey, compensationKey, receipt: mine.receipt, replayed };
        }
        if (c.status === 'compensation_failed')
          return {
            status: 'compensation_failed',
            operationKey,
            compensationKey,
            ...(c.error ? { error: c.error } : {}),
            ...(now.takeover ? { takeover: now.takeover } : {}),
            next: NextAction.HandOver,
            replayed,
          };
        if (c.status === 'refused' && c.error) return rejected(operationKey, compensationKey, c.error);
      }
    } catch {
      // The status service did not answer this time: read again until the budget ends.
    }
    await sleep(Math.min(Math.max(0, deadlineAt - Date.now()), Math.min(500, 25 * 2 ** Math.min(i, 5))));
  }
  return { status: 'compensation_requested', operationKey, compensationKey, next: NextAction.Observe, replayed };
}
