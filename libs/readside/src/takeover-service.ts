import type { NatsConnection } from '@nats-io/transport-node';
import type { KV } from '@nats-io/kv';
import { z } from 'zod';
import {
  digestOf,
  EMPTY_RESULT_DIGEST,
  ErrorClass,
  idSchema,
  operationIdOf,
  operationKeySchema,
  TooltxError,
  type ErrorInfo,
} from '@tooltx/contracts';
import {
  handleCommand,
  openTakeoverOf,
  receiptOnlyResult,
  resolutionVerdict,
  type OperationRecord,
  type OperationStore,
  type ReceiptSigner,
  type TakeoverRecord,
} from '@tooltx/lifecycle';
import { encode, newEventId, type Subjects } from '@tooltx/nats';
import { thawTask, type ImplementationRegistry, type Logger } from '@tooltx/runtime';
import { jsonCodec, startResponder, type Responder } from './responder.js';

/** What an operator asks the takeover service (`<prefix>.takeover.<operator>`, request/reply). */
export const takeoverRequestSchema = z.discriminatedUnion('action', [
  z.strictObject({ action: z.literal('list') }),
  z.strictObject({ action: z.literal('show'), operationKey: operationKeySchema, tenant: idSchema.optional() }),
  z.strictObject({
    action: z.literal('resolve'),
    operationKey: operationKeySchema,
    tenant: idSchema.optional(),
    outcome: z.discriminatedUnion('kind', [
      z.strictObject({ kind: z.literal('committed'), resourceId: z.string().min(1).max(200) }),
      z.strictObject({ kind: z.literal('not_applied') }),
      // A failed compensation (FM-20): the original's effect stays, accepted by a person, or a
      // person undid it outside tooltx.
      z.strictObject({ kind: z.literal('effect_kept') }),
      z.strictObject({ kind: z.literal('undone_by_hand') }),
    ]),
  }),
]);
export type TakeoverRequest = z.infer<typeof takeoverRequestSchema>;

/** The answer: `{ ok: true, … }` or `{ ok: false, error }` with a machine class. */
export type TakeoverAnswer =
  | { ok: true; takeovers: (TakeoverRecord & { status: string })[] }
  | { ok: true; operation: OperationRecord }
  | { ok: false; error: ErrorInfo };

/**
 * An operation the reconciler watches, as far as the takeover service reads it: where it lives and
 * whether a takeover was opened on it (`takeoverAt`, ms since the epoch). The reconciler's index
 * entries are such values.
 */
export interface WatchedTakeover {
  tenant: string;
  operationKey: string;
  takeoverAt?: number | undefined;
}

export interface TakeoverServiceDeps {
  nc: NatsConnection;
  store: OperationStore;
  subjects: Subjects;
  /** The results bucket: a person's committed resolution stores the contract's empty result there. */
  results: KV;
  /** The frozen-task bucket: a resolution thaws the operation's task. */
  tasks: KV;
  tools: ImplementationRegistry;
  log: Logger;
  /** Signs the receipt of a person's committed resolution. */
  signer: ReceiptSigner;
  /** The operations under watch by operation id; `list` and a `show` without a tenant read them. */
  watched: ReadonlyMap<string, WatchedTakeover>;
  now?: () => number;
}

/**
 * The takeover service (FM-14, FM-20): lists open takeovers, shows one operation, and records a
 * person's resolution — `committed` or `not_applied` of an `unknown` operation, `effect_kept` or
 * `undone_by_hand` of a failed compensation (whose status stays `compensation_failed`, its receipt
 * valid). The operator's id comes from the subject the server pinned them to (never from the
 * payload); it becomes `resolvedBy` of the `manual: true` event. Runs in every reconciler instance
 * (queue group `tooltx-takeover`). JSON on the wire (the CLI speaks it): a {@link TakeoverAnswer};
 * a refused request answers `{ ok: false, error }` — `invalid_input` (`not_json` for bytes that are
 * not JSON, field issues otherwise; `outcome_mismatch` at `outcome.kind` for an outcome that does
 * not fit the takeover), `not_found`, `idempotency_conflict` (nothing to resolve, resolved otherwise
 * already, or moved on meanwhile), `internal`. Answers go only into the operator's own inbox
 * (FM-31, FM-32).
 *
 * A resolution is appended first and the task thawed after (the reconciler repairs a thaw lost to
 * a crash); a repeated identical resolution answers the operation's state and thaws again.
 */
export function startTakeoverService(d: TakeoverServiceDeps): Responder {
  const now = d.now ?? Date.now;

  const locate = (key: string, tenant?: string): { tenant: string; opId: string } => {
    const opId = operationIdOf(key);
    if (tenant) return { tenant, opId };
    for (const e of d.watched.values()) if (e.operationKey === key) return { tenant: e.tenant, opId };
    throw new TooltxError(ErrorClass.NotFound, 'no watched operation with this key: name its tenant', {
      issues: [{ path: ['tenant'], code: 'required', message: 'the operation is not under watch; give its tenant' }],
    });
  };

  const handle = async (req: TakeoverRequest, operator: string): Promise<TakeoverAnswer> => {
    if (req.action === 'list') {
      const takeovers: (TakeoverRecord & { status: string })[] = [];
      for (const e of d.watched.values()) {
        if (e.takeoverAt === undefined) continue;
        const { state } = await d.store.load(e.tenant, operationIdOf(e.operationKey));
        const open = openTakeoverOf(state);
        if (open && state.status !== 'none') takeovers.push({ ...open, status: state.status });
      }
      return { ok: true, takeovers: takeovers.sort((a, b) => a.times.openedAt - b.times.openedAt) };
    }
    const { tenant, opId } = locate(req.operationKey, req.tenant);
    const { state } = await d.store.load(tenant, opId);
    if (state.status === 'none' || state.operationKey !== req.operationKey)
      throw new TooltxError(ErrorClass.NotFound, 'no such operation');
    if (req.action === 'show') return { ok: true, operation: state };

    // resolve: an `unknown` operation or a failed compensation; a repeat of the same resolution
    // answers the state.
    const o = req.outcome;
    const verdict = resolutionVerdict(state, o);
    if (verdict === 'not_unknown')
      throw new TooltxError(
        ErrorClass.IdempotencyConflict,
        state.status === 'compensation_failed'
          ? 'the failed compensation was resolved otherwise already'
          : `the operation is ${state.status}, not unknown: nothing to resolve`,
      );
    if (verdict === 'outcome_mismatch') {
      const failed = state.status === 'compensation_failed';
      const fits = failed ? 'effect_kept or undone_by_hand' : 'committed or not_applied';
      throw new TooltxError(ErrorClass.InvalidInput, `${o.kind} does not resolve a ${state.status} operation`, {
        issues: [
          {
            path: ['outcome', 'kind'],
            code: 'outcome_mismatch',
            message: `the operation is ${state.status}: resolve it ${fits}`,
          },
        ],
      });
    }
    if (verdict === 'resolve_compensation' && (o.kind === 'effect_kept' || o.kind === 'undone_by_hand')) {
      // The original's receipt is not touched: the effect it proves happened, whatever a person
      // decides about it now.
      const h = await handleCommand(
        d.store,
        tenant,
        opId,
        () => ({
          type: 'resolve_compensation_failure',
          eventId: newEventId(),
          at: now(),
          resolvedBy: operator,
          outcome: o.kind,
        }),
        { retry: false },
      );
      if (h.kind !== 'appended')
        throw new TooltxError(ErrorClass.IdempotencyConflict, 'the operation moved on meanwhile; show it again');
      d.log.warn(
        { tenant, operationKey: state.operationKey, resolvedBy: operator, outcome: o.kind },
        'failed compensation resolved by a person',
      );
    }
    if (verdict === 'resolve' && (o.kind === 'committed' || o.kind === 'not_applied')) {
      const impl = d.tools.get(state.tool, state.version);
      let resultDigest = digestOf({});
      const receiptOnly = o.kind === 'committed' && impl ? receiptOnlyResult(impl.contract) : null;
      if (receiptOnly) {
        resultDigest = receiptOnly.digest;
        if (resultDigest !== EMPTY_RESULT_DIGEST)
          await d.results.put(
            d.subjects.resultKey(tenant, opId),
            encode({
              operationKey: state.operationKey,
              attempt: state.attempt,
              resultDigest,
              result: receiptOnly.result,
            }),
          );
      }
      const h = await handleCommand(
        d.store,
        tenant,
        opId,
        () => ({
          type: 'resolve',
          eventId: newEventId(),
          at: now(),
          attempt: state.attempt,
          resolvedBy: operator,
          outcome:
            o.kind === 'committed'
              ? { kind: 'committed', resourceId: o.resourceId, resultDigest }
              : { kind: 'not_applied' },
        }),
        { signer: d.signer, retry: false },
      );
      if (h.kind !== 'appended')
        throw new TooltxError(ErrorClass.IdempotencyConflict, 'the operation moved on meanwhile; show it again');
      d.log.warn(
        { tenant, operationKey: state.operationKey, resolvedBy: operator, outcome: o.kind },
        'takeover resolved by a person',
      );
    }
    await thawTask(d.tasks, tenant, state.taskId, state.operationKey);
    const { state: after } = await d.store.load(tenant, opId);
    return { ok: true, operation: after as OperationRecord };
  };

  return startResponder(d.nc, d.log, {
    name: 'takeover',
    subject: d.subjects.allTakeover,
    queue: 'tooltx-takeover',
    identify: (subject) => {
      const operator = subject.split('.').at(-1);
      return operator ? { who: operator, role: { kind: 'operator', operator } } : null;
    },
    unidentified: {
      class: ErrorClass.InvalidInput,
      issues: [{ path: ['subject'], code: 'invalid_subject', message: 'not a takeover subject' }],
    },
    codec: jsonCodec,
    schema: takeoverRequestSchema,
    handle,
    errorBody: (error): TakeoverAnswer => ({ ok: false, error }),
  });
}
