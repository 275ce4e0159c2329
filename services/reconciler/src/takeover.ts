import type { NatsConnection, Msg } from '@nats-io/transport-node';
import type { KV } from '@nats-io/kv';
import { z } from 'zod';
import { digestOf, EMPTY_RESULT_DIGEST, ErrorClass, idSchema, fieldIssues, invalidInput, operationIdOf, operationKeySchema, TooltxError, toErrorInfo, type ErrorInfo } from '@tooltx/contracts';
import { handleCommand, takeoverRecordOf, type OperationRecord, type OperationStore, type ReceiptSigner, type TakeoverRecord } from '@tooltx/lifecycle';
import { encode, newEventId, type Subjects } from '@tooltx/nats';
import { freezeTask, thawTask, type FrozenTaskWatch } from '@tooltx/runtime';
import type { ImplementationRegistry, Logger } from '@tooltx/runtime';
import { isOwnReplyInbox } from '@tooltx/nats';
import type { IndexEntry } from './projection.js';

/**
 * Takeover (FM-14; DESIGN.md "After a timeout, verify before acting"): when evidence runs
 * out, the operation becomes a person's. Order of writes: the task is frozen FIRST, then the
 * takeover record is appended — so nobody can see a takeover whose task still takes side effects.
 * A resolution is appended first and the task thawed after; a thaw lost to a crash is repaired by
 * {@link repairFreezes}.
 */
export interface TakeoverDeps {
  store: OperationStore;
  subjects: Subjects;
  results: KV;
  tasks: KV;
  tools: ImplementationRegistry;
  log: Logger;
  /** Signs the receipt of a person's committed resolution. */
  signer: ReceiptSigner;
  now?: () => number;
}

/**
 * Opens a takeover on an `unknown` operation (idempotent: a second call finds it open). `probed`
 * (for `probe_mismatch`): what the probe found under our key — its resource id and the input digest
 * the downstream recorded — kept in the record as `probed`. Returns
 * false when the operation is no longer `unknown` or another writer moved it meanwhile.
 * Throws the store's and the KV's errors.
 */
export async function openTakeover(
  d: TakeoverDeps,
  tenant: string,
  opId: string,
  why: { reason: TakeoverRecord['reason']; probes: number; probed?: TakeoverRecord['probed'] },
): Promise<boolean> {
  const now = d.now ?? Date.now;
  const { state, seq } = await d.store.load(tenant, opId);
  if (state.status !== 'unknown') return false;
  if (state.takeover) return true;
  const openedAt = now();
  const takeover = takeoverRecordOf(state, why, openedAt);
  await freezeTask(d.tasks, tenant, state.taskId, state.operationKey, openedAt);
  const h = await handleCommand(d.store, tenant, opId, () => ({ type: 'open_takeover', eventId: newEventId(), at: openedAt, attempt: state.attempt, takeover }), { known: { state, seq }, retry: false });
  if (h.kind !== 'appended') return false;
  d.log.error({ tenant, operationKey: state.operationKey, taskId: state.taskId, reason: why.reason, probes: why.probes, ...(why.probed ? { probedResourceId: why.probed.resourceId } : {}) }, 'takeover opened: the task is frozen until a person resolves it');
  return true;
}

/**
 * Thaws freezes that no open takeover backs any more (a resolution whose thaw was lost, or a
 * takeover append that lost its race). A freeze younger than `graceMs` is left alone: its takeover
 * append may still be on its way.
 */
export async function repairFreezes(d: TakeoverDeps, frozen: Pick<FrozenTaskWatch, 'entries'>, graceMs = 60_000): Promise<number> {
  const now = d.now ?? Date.now;
  let thawed = 0;
  for (const task of frozen.entries()) {
    for (const [key, openedAt] of Object.entries(task.frozenBy)) {
      if (now() - openedAt < graceMs) continue;
      const { state } = await d.store.load(task.tenant, operationIdOf(key));
      if (state.status === 'unknown' && state.takeover) continue;
      await thawTask(d.tasks, task.tenant, task.taskId, key);
      thawed++;
      d.log.info({ tenant: task.tenant, operationKey: key, taskId: task.taskId }, 'freeze without an open takeover thawed');
    }
  }
  return thawed;
}

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
 * The takeover service: lists open takeovers, shows one operation, and records a person's
 * resolution. The operator's id comes from the subject the server pinned them to (never from the
 * payload); it becomes `resolvedBy` of the `manual: true` event. Runs in every reconciler instance
 * (queue group `tooltx-takeover`).
 */
export function startTakeoverService(
  d: TakeoverDeps & { nc: NatsConnection; watched: ReadonlyMap<string, IndexEntry> },
): { stop(): Promise<void> } {
  const now = d.now ?? Date.now;
  const sub = d.nc.subscribe(d.subjects.allTakeover, { queue: 'tooltx-takeover' });

  const locate = (key: string, tenant?: string): { tenant: string; opId: string } => {
    const opId = operationIdOf(key);
    if (tenant) return { tenant, opId };
    for (const e of d.watched.values()) if (e.operationKey === key) return { tenant: e.tenant, opId };
    throw new TooltxError(ErrorClass.NotFound, 'no watched operation with this key: name its tenant', { issues: [{ path: ['tenant'], code: 'required', message: 'the operation is not under watch; give its tenant' }] });
  };

  const handle = async (m: Msg): Promise<TakeoverAnswer> => {
    const operator = m.subject.split('.').at(-1)!;
    let raw: unknown;
    try {
      raw = JSON.parse(new TextDecoder().decode(m.data));
    } catch {
      throw invalidInput([], 'not_json', 'the request must be a JSON object');
    }
    const parsed = takeoverRequestSchema.safeParse(raw);
    if (!parsed.success) throw new TooltxError(ErrorClass.InvalidInput, 'invalid takeover request', { issues: fieldIssues(parsed.error) });
    const req = parsed.data;
    if (req.action === 'list') {
      const takeovers: (TakeoverRecord & { status: string })[] = [];
      for (const e of d.watched.values()) {
        if (e.takeoverAt === undefined) continue;
        const { state } = await d.store.load(e.tenant, operationIdOf(e.operationKey));
        if (state.status !== 'none' && state.takeover) takeovers.push({ ...state.takeover, status: state.status });
      }
      return { ok: true, takeovers: takeovers.sort((a, b) => a.times.openedAt - b.times.openedAt) };
    }
    const { tenant, opId } = locate(req.operationKey, req.tenant);
    const { state } = await d.store.load(tenant, opId);
    if (state.status === 'none' || state.operationKey !== req.operationKey) throw new TooltxError(ErrorClass.NotFound, 'no such operation');
    if (req.action === 'show') return { ok: true, operation: state };

    // resolve: only an `unknown` operation; a repeat of the same resolution answers the state.
    const o = req.outcome;
    const already = state.resolution && state.resolution.outcome === o.kind && (o.kind !== 'committed' || state.receipt?.resourceId === o.resourceId);
    if (!already) {
      if (state.status !== 'unknown') throw new TooltxError(ErrorClass.IdempotencyConflict, `the operation is ${state.status}, not unknown: nothing to resolve`);
      const impl = d.tools.get(state.tool, state.version);
      let resultDigest = digestOf({});
      if (o.kind === 'committed') {
        // A write's result is its receipt (FM-19): store the empty result when the contract's output allows it.
        const empty = impl?.contract.output.safeParse({});
        if (empty?.success) {
          resultDigest = digestOf(empty.data);
          if (resultDigest !== EMPTY_RESULT_DIGEST) await d.results.put(d.subjects.resultKey(tenant, opId), encode({ operationKey: state.operationKey, attempt: state.attempt, resultDigest, result: empty.data }));
        }
      }
      const h = await handleCommand(
        d.store, tenant, opId,
        () => ({
          type: 'resolve',
          eventId: newEventId(),
          at: now(),
          attempt: state.attempt,
          resolvedBy: operator,
          outcome: o.kind === 'committed' ? { kind: 'committed', resourceId: o.resourceId, resultDigest } : { kind: 'not_applied' },
        }),
        { signer: d.signer, retry: false },
      );
      if (h.kind !== 'appended') throw new TooltxError(ErrorClass.IdempotencyConflict, 'the operation moved on meanwhile; show it again');
      d.log.warn({ tenant, operationKey: state.operationKey, resolvedBy: operator, outcome: o.kind }, 'takeover resolved by a person');
    }
    await thawTask(d.tasks, tenant, state.taskId, state.operationKey);
    const { state: after } = await d.store.load(tenant, opId);
    return { ok: true, operation: after as OperationRecord };
  };

  const done = (async () => {
    for await (const m of sub) {
      // Answers go only to the operator's own inbox (the reply subject is the requester's choice).
      if (!isOwnReplyInbox({ kind: 'operator', operator: m.subject.split('.').at(-1)! }, m.reply)) {
        d.log.warn({ subject: m.subject }, 'takeover request with a reply subject outside the operator\'s inbox: not answered');
        continue;
      }
      let answer: TakeoverAnswer;
      try {
        answer = await handle(m);
      } catch (err) {
        const info = toErrorInfo(err);
        if (info.class === ErrorClass.Internal) d.log.warn({ err }, 'takeover request failed');
        answer = { ok: false, error: info };
      }
      m.respond(new TextEncoder().encode(JSON.stringify(answer)));
    }
  })();
  return {
    async stop() {
      await sub.drain();
      await done;
    },
  };
}
