import { decide, type Decision, type OperationCommand } from './decider.js';
import type { OperationEvent, OperationState } from './events.js';
import type { ReceiptSigner } from './signing.js';
import { ConcurrencyError, type EventStore, type LoadedOperation } from './store.js';
import type { Transition } from './transitions.js';

/** Rounds of load → decide → append before a command that keeps losing its race gives up. */
export const MAX_DECIDE_ROUNDS = 8;

/** What {@link handleCommand} did. */
export type Handled =
  /** The command's event is stored at `seq`; `event.state` is the operation's state now. */
  | { kind: 'appended'; event: OperationEvent; seq: number }
  /** Nothing to append (`applied`, `replay`, `conflict`, `skip`), decided on the state loaded at `seq`. */
  | { kind: 'decided'; decision: Exclude<Decision, { kind: 'append' }>; seq: number }
  /** The command no longer applies: `applies` refused the state, or (`retry: false`) another writer won. */
  | { kind: 'moved_on' };

export interface HandleOptions {
  /** Signs the receipt a commit or a committed resolution carries. */
  signer?: ReceiptSigner;
  /** The allowed transitions (default: the one table). */
  transitions?: readonly Transition[];
  /**
   * A state and its sequence to decide on first, without a read (the event a consumer just
   * delivered, or `none` at 0 for a key that is most likely new): the append names that sequence,
   * so a stale guess costs one refused append, never a wrong event; a decision that appends nothing
   * (or a precondition that fails) on the guess is decided again on a read before it is answered.
   */
  known?: LoadedOperation;
  /** A precondition checked on every state the command is decided on: false → `moved_on`, nothing appended. */
  applies?: (state: OperationState) => boolean;
  /**
   * On a lost race: reload and decide again (default), up to {@link MAX_DECIDE_ROUNDS} rounds; or
   * (false) answer `moved_on` at once — for a command whose reason holds only for the state it was
   * decided on (a probe's verdict about one run).
   */
  retry?: boolean;
}

/**
 * The one command handler: load the operation → `make` the command for that state → decide →
 * append under the sequence it was decided on → on a lost race, again. Every service writes
 * through it; none writes an event any other way.
 *
 * `make` is called once per round, so a command with a fresh event id and time is built for each
 * state it is decided on. Throws the store's errors ({@link StoreUnavailableError}: the caller retries
 * the message), and {@link ConcurrencyError} when every round lost its race.
 */
export async function handleCommand(
  store: EventStore,
  tenant: string,
  opId: string,
  make: (state: OperationState) => OperationCommand,
  o: HandleOptions = {},
): Promise<Handled> {
  const rounds = o.retry === false ? 1 : MAX_DECIDE_ROUNDS;
  const ctx = { ...(o.signer ? { signer: o.signer } : {}), ...(o.transitions ? { transitions: o.transitions } : {}) };
  // A guessed state only ever leads to an append (which names its sequence, so a stale guess is
  // refused by the store). Anything else decided on a guess is decided again on a read: the guess
  // may be stale, and nothing else would refuse the answer.
  let guess = o.known;
  for (let round = 0; round < rounds; ) {
    const fromGuess = guess !== undefined;
    const { state, seq } = guess ?? (await store.load(tenant, opId));
    guess = undefined;
    const d = o.applies && !o.applies(state) ? null : decide(make(state), state, ctx);
    if (d?.kind !== 'append') {
      if (fromGuess) continue;
      return d ? { kind: 'decided', decision: d, seq } : { kind: 'moved_on' };
    }
    round++;
    try {
      return { kind: 'appended', event: d.event, seq: await store.append(tenant, opId, d.event, seq) };
    } catch (err) {
      if (!(err instanceof ConcurrencyError)) throw err;
    }
  }
  if (o.retry === false) return { kind: 'moved_on' };
  throw new ConcurrencyError(`${tenant}/${opId}`, -1);
}
