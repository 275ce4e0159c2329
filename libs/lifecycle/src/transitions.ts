import type { OperationEventType, OperationStatus } from './events.js';

/**
 * The operation lifecycle's allowed transitions, written once, as data: every event the decider may
 * append names the status it leaves (`none` before the first event) and the status it leaves the
 * operation in. `decide` refuses any append whose `from → to` under its event type is not a row
 * here (one guard, in decider.ts), and docs/lifecycle.md is generated from these rows
 * ({@link transitionsMarkdown}; a test keeps the two equal).
 *
 * To extend it: add the status to `operationStatuses` and the event to the event union in
 * events.ts, then add its rows below — a row is the whole permission, nothing else needs editing
 * for the guard to let the new event through.
 */

/** A status an operation can be in, and `none`: not registered. */
export type LifecycleStatus = 'none' | OperationStatus;

export interface Transition {
  from: LifecycleStatus;
  event: OperationEventType;
  to: LifecycleStatus;
  /** Which command appends it, and when (for the docs table). */
  when: string;
}

export const TRANSITIONS: readonly Transition[] = [
  { from: 'none', event: 'accepted', to: 'accepted', when: 'accept: a new key is registered (attempt 1)' },
  {
    from: 'rejected',
    event: 'accepted',
    to: 'accepted',
    when: 'accept: the identical input after a rejection starts the next attempt',
  },
  {
    from: 'none',
    event: 'accepted',
    to: 'running',
    when: 'accept with start: registered and started in one append by the process that runs it',
  },
  {
    from: 'rejected',
    event: 'accepted',
    to: 'running',
    when: 'accept with start: the next attempt, registered and started in one append',
  },
  { from: 'accepted', event: 'running', to: 'running', when: 'start: an executor takes the attempt' },
  {
    from: 'accepted',
    event: 'rejected',
    to: 'rejected',
    when: 'reject: the re-check at the execution instant refused',
  },
  {
    from: 'accepted',
    event: 'requeued',
    to: 'accepted',
    when: 'requeue (stale_accepted): never started within its bound',
  },
  { from: 'running', event: 'committed', to: 'committed', when: 'commit: the downstream applied it (signed receipt)' },
  { from: 'running', event: 'rejected', to: 'rejected', when: 'reject: the downstream definitively refused it' },
  {
    from: 'running',
    event: 'unknown',
    to: 'unknown',
    when: 'mark_unknown: the outcome is not known (timeout, lost connection)',
  },
  {
    from: 'running',
    event: 'requeued',
    to: 'accepted',
    when: 'requeue: verified not applied, or never sent; a repeat under the same key is safe',
  },
  {
    from: 'unknown',
    event: 'committed',
    to: 'committed',
    when: 'commit after a probe found the effect, or resolve (committed) by a person',
  },
  { from: 'unknown', event: 'rejected', to: 'rejected', when: 'resolve (not_applied) by a person' },
  {
    from: 'unknown',
    event: 'requeued',
    to: 'accepted',
    when: 'requeue (probe_not_found): verified not applied, a repeat is safe',
  },
  {
    from: 'unknown',
    event: 'takeover',
    to: 'unknown',
    when: 'open_takeover: unknown past its deadline, handed to a person (FM-14)',
  },
  {
    from: 'accepted',
    event: 'awaiting_confirmation',
    to: 'awaiting_confirmation',
    when: 'await_confirmation: a held-back attempt (its contract declares confirm) waits, after its prepare step if any',
  },
  {
    from: 'awaiting_confirmation',
    event: 'confirmed',
    to: 'accepted',
    when: 'confirm: released; an executor starts it as any accepted attempt (a second confirm is a replay)',
  },
  {
    from: 'awaiting_confirmation',
    event: 'confirmed',
    to: 'running',
    when: 'confirm with start: released and started in one append by the process that runs it',
  },
  {
    from: 'awaiting_confirmation',
    event: 'discarded',
    to: 'rolled_back',
    when: 'discard: dropped before it ran, nothing external happened (final)',
  },
  {
    from: 'awaiting_confirmation',
    event: 'confirmation_expired',
    to: 'rolled_back',
    when: 'expire_confirmation, or a confirm after the deadline: nothing external happened (final)',
  },
  {
    from: 'committed',
    event: 'compensation_requested',
    to: 'compensation_requested',
    when: 'request_compensation: its compensation is registered as an operation of its own (the receipt stays valid)',
  },
  {
    from: 'compensation_requested',
    event: 'compensated',
    to: 'compensated',
    when: 'complete_compensation: the compensation committed; its receipt is linked (final)',
  },
  {
    from: 'compensation_requested',
    event: 'compensation_failed',
    to: 'compensation_failed',
    when: 'fail_compensation: the compensation was refused after it ran, or taken over (final; the task is frozen and the takeover record written in the same append, FM-20)',
  },
  {
    from: 'compensation_failed',
    event: 'compensation_failure_resolved',
    to: 'compensation_failed',
    when: 'resolve_compensation_failure by a person (effect_kept or undone_by_hand): the status and the receipt stay, the resolution is recorded and the task thaws (FM-20)',
  },
  {
    from: 'compensation_requested',
    event: 'compensation_refused',
    to: 'committed',
    when: "refuse_compensation: the compensation was refused before it ran (e.g. its permission was revoked); the refusal's class is recorded",
  },
];

/** True when `table` has the row `from --event--> to`. */
export function isAllowedTransition(
  from: LifecycleStatus,
  event: string,
  to: LifecycleStatus,
  table: readonly Transition[] = TRANSITIONS,
): boolean {
  return table.some((t) => t.from === from && t.event === event && t.to === to);
}

/** The rows as a Markdown table (docs/lifecycle.md holds exactly this text between its markers). */
export function transitionsMarkdown(table: readonly Transition[] = TRANSITIONS): string {
  const cell = (s: string) => s.replaceAll('|', '\\|');
  return [
    '| from | event | to | when |',
    '| --- | --- | --- | --- |',
    ...table.map((t) => `| \`${t.from}\` | \`${t.event}\` | \`${t.to}\` | ${cell(t.when)} |`),
  ].join('\n');
}

/** The statuses in which an operation's own attempt has ended (see {@link attemptEnded}). */
export const endedStatuses = [
  'committed',
  'rejected',
  'rolled_back',
  'compensation_requested',
  'compensated',
  'compensation_failed',
] as const satisfies readonly OperationStatus[];

/**
 * Whether an operation in `status` has ended its current attempt: `committed` (final: every replay
 * returns its receipt), `rejected` (definitively not applied; only the identical input may start a
 * new attempt), `rolled_back` (a held-back attempt dropped before it ran), or one of the
 * compensation states (the attempt committed; what follows is the compensation's, its own operation
 * watched as any). Nothing runs, waits or is verified for this operation's attempt any more
 * (docs/lifecycle.md). `awaiting_confirmation` has not ended: its deadline is still to be watched.
 * Pure.
 */
export function attemptEnded(status: LifecycleStatus | string): status is (typeof endedStatuses)[number] {
  return (endedStatuses as readonly string[]).includes(status);
}

/**
 * Whether no event can follow `status` (`table`'s rows: none leaves it), so a state in it may be
 * cached as the answer to every later read. `committed` is final only for an operation whose
 * contract declares no compensation (`compensable` false): its one way out is a compensation
 * request. `compensation_failed` is final only once a person resolved it (`resolved`): its one row
 * records that resolution. Pure.
 */
export function isFinalStatus(
  status: LifecycleStatus,
  o: { compensable: boolean; resolved?: boolean },
  table: readonly Transition[] = TRANSITIONS,
): boolean {
  return table
    .filter((t) => t.from === status)
    .every(
      (t) =>
        (t.event === 'compensation_requested' && !o.compensable) ||
        (t.event === 'compensation_failure_resolved' && o.resolved === true),
    );
}
