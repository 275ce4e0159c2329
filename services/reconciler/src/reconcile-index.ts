import { z } from 'zod';
import { effectClasses, idSchema, operationKeySchema } from '@tooltx/contracts';
import { endedStatuses, openTakeoverOf, type OperationEvent, type OperationRecord } from '@tooltx/lifecycle';

/**
 * The reconciler's projection: an index of the operations that are NOT yet terminal, in
 * KV `<prefix>_reconcile` under `<tenant>.<opId>`. It is what the reconciler will scan for
 * `running` past its contract's `runningBoundMs` and `unknown` until `unknownDeadlineMs` (FM-27,
 * FM-14); probing and redriving come later.
 *
 * Ordering: an event is applied only when its stream sequence is newer than the entry's `seq`.
 * A terminal operation keeps a tombstone instead of losing its key, so an older event redelivered
 * after the terminal one cannot bring the operation back into the index. A `rejected` operation
 * may come back with a new attempt: its `accepted` event is newer, so it replaces the tombstone.
 */

const seq = z.number().int().positive();
const epochMs = z.number().int().nonnegative();

/**
 * The states the reconciler watches. `awaiting_confirmation`: a held-back operation stays indexed
 * with its confirmation deadline, which the sweep ends it at (`rolled_back`). `compensation_failed`:
 * only while its takeover is open (FM-20) — never swept, but listed by the takeover service until a
 * person resolves it. `compensation_requested`: an original waiting for its compensation, which the
 * sweep settles should its link be lost (docs/compensation.md).
 */
export const watchedStatuses = [
  'accepted',
  'running',
  'unknown',
  'awaiting_confirmation',
  'compensation_failed',
  'compensation_requested',
] as const;
/**
 * The states that take an operation out of the index (as a tombstone): every status whose attempt
 * ended (`endedStatuses`: committed, rejected, rolled back, or a committed one being compensated —
 * the compensation is its own operation, indexed as any).
 */
export const terminalStatuses = endedStatuses;

/** An operation the reconciler watches. Times in ms since the epoch. */
export const indexEntrySchema = z.object({
  /** Stream sequence (events stream) of the event this entry reflects. */
  seq,
  terminal: z.literal(false),
  operationKey: operationKeySchema,
  tenant: idSchema,
  status: z.enum(watchedStatuses),
  attempt: z.number().int().min(1),
  tool: z.string(),
  version: z.number().int(),
  effect: z.enum(effectClasses),
  acceptedAt: epochMs,
  /** When the current attempt reached `running` (absent while only accepted). */
  runningAt: epochMs.optional(),
  /** Absolute deadline sent downstream with the current attempt. */
  deadlineAt: epochMs.optional(),
  /** Time of the event this entry reflects. */
  updatedAt: epochMs,
  /** Set once the operation is under takeover: a person's, no longer probed. */
  takeoverAt: epochMs.optional(),
  /** A held-back operation's confirmation deadline (`awaiting_confirmation`). */
  confirmDeadlineAt: epochMs.optional(),
});
export type IndexEntry = z.infer<typeof indexEntrySchema>;

/** What is left of an operation that reached a terminal state: only enough to order later events. */
export const tombstoneSchema = z.object({
  seq,
  status: z.enum(terminalStatuses),
  terminal: z.literal(true),
});
export type Tombstone = z.infer<typeof tombstoneSchema>;

/** The value stored under `<tenant>.<opId>` in the reconcile bucket (msgpack). */
export const reconcileValueSchema = z.discriminatedUnion('terminal', [indexEntrySchema, tombstoneSchema]);
export type ReconcileValue = z.infer<typeof reconcileValueSchema>;

/**
 * The projection rule: the value after `event`, stored at stream sequence `seq`, or `null` when
 * nothing changes (the stored value is as new or newer: a duplicate or a late redelivery).
 * Pure; the state comes from the state the event carries, so a skipped intermediate event loses
 * nothing.
 */
export function applyToIndex(
  current: ReconcileValue | null,
  event: OperationEvent,
  seq: number,
): ReconcileValue | null {
  return applyStateToIndex(current, event.state, seq);
}

/** {@link applyToIndex} for an operation state read directly (the last event's folded state at stream sequence `seq`). */
export function applyStateToIndex(
  current: ReconcileValue | null,
  s: OperationRecord,
  seq: number,
): ReconcileValue | null {
  if (current && current.seq >= seq) return null;
  const takeover = openTakeoverOf(s);
  switch (s.status) {
    case 'compensation_failed':
      if (!takeover) return { seq, status: s.status, terminal: true };
      return openEntry(s, s.status, seq, { takeoverAt: takeover.times.openedAt });
    case 'committed':
    case 'rejected':
    case 'rolled_back':
    case 'compensated':
      return { seq, status: s.status, terminal: true };
    case 'compensation_requested':
      // Waiting for its compensation: its own attempt ended long ago (an earlier takeover of it, if
      // any, is resolved), so nothing of that attempt is indexed.
      return openEntry(s, s.status, seq, {});
    case 'accepted':
    case 'running':
    case 'unknown':
    case 'awaiting_confirmation':
      return openEntry(s, s.status, seq, {
        ...(s.running ? { runningAt: s.running.at, deadlineAt: s.running.deadlineAt } : {}),
        ...(s.takeover ? { takeoverAt: s.takeover.times.openedAt } : {}),
        ...(s.status === 'awaiting_confirmation' && s.confirmation?.deadlineAt !== undefined
          ? { confirmDeadlineAt: s.confirmation.deadlineAt }
          : {}),
      });
    default:
      return assertNever(s.status);
  }
}

/** The index entry of an operation the sweep watches (`status`, narrowed by the caller): where it is, what it is, and the times its status has. */
type OpenEntry = Extract<ReconcileValue, { terminal: false }>;
function openEntry(
  s: OperationRecord,
  status: OpenEntry['status'],
  seq: number,
  times: Partial<Pick<OpenEntry, 'runningAt' | 'deadlineAt' | 'takeoverAt' | 'confirmDeadlineAt'>>,
): OpenEntry {
  return {
    seq,
    terminal: false,
    operationKey: s.operationKey,
    tenant: s.tenant,
    status,
    attempt: s.attempt,
    tool: s.tool,
    version: s.version,
    effect: s.effect,
    acceptedAt: s.acceptedAt,
    ...times,
    updatedAt: s.updatedAt,
  };
}

function assertNever(x: never): never {
  throw new Error(`unhandled operation status ${String(x)}`);
}
