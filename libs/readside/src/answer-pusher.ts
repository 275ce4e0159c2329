import type { Implementation } from '@tooltx/contracts';
import { committedAnswer, readAllowed, type OperationRecord, type PushMessage, type Receipt } from '@tooltx/lifecycle';
import type { Logger } from 'pino';
import { encode, type Subjects } from '@tooltx/nats';

/**
 * Pushes the answer to one submission to its agent on `Subjects.push` (core NATS, best
 * effort: a lost push costs the agent one status request, never an answer). Used by the executor
 * (the answer of the attempt it ran) and the authorizer (a resubmission of a committed key).
 * Never throws.
 */
export class AnswerPusher {
  readonly #o: {
    subjects: Subjects;
    publish: (subject: string, data: Uint8Array) => void;
    log: Logger;
    now: () => number;
  };

  constructor(o: {
    subjects: Subjects;
    publish: (subject: string, data: Uint8Array) => void;
    log: Logger;
    now?: () => number;
  }) {
    this.#o = { ...o, now: o.now ?? Date.now };
  }

  /** "Poll now": this outcome is the status endpoint's to tell. */
  poll(tenant: string, actor: string, submissionId: string): void {
    this.#send(tenant, actor, submissionId, { poll: true, at: this.#o.now() });
  }

  /**
   * The committed answer the status endpoint would give `actor` (the submission's agent) for
   * `submittedKey`: under the same read policy ({@link readAllowed}), with `result` (the business
   * result it may read, `{}` when receipt-only). A "poll now" instead when the policy refuses.
   * The answer's `seq` is the operation's own event count, from `state` (never a stream sequence).
   * `seq`: deprecated and ignored, accepted so callers that still pass a stream sequence compile.
   */
  async committed(o: {
    impl: Implementation | undefined;
    tenant: string;
    actor: string;
    submissionId: string;
    submittedKey: string;
    state: OperationRecord & { receipt: Receipt };
    seq?: number;
    result: unknown;
  }): Promise<void> {
    const { now } = this.#o;
    if (!(await readAllowed(o.impl, o.tenant, o.actor, o.state, now())))
      return this.poll(o.tenant, o.actor, o.submissionId);
    this.#send(
      o.tenant,
      o.actor,
      o.submissionId,
      committedAnswer({
        submittedKey: o.submittedKey,
        state: o.state,
        submissionId: o.submissionId,
        result: o.result,
        at: now(),
      }),
    );
  }

  #send(tenant: string, actor: string, submissionId: string, body: PushMessage): void {
    const subject = this.#o.subjects.push(tenant, actor, submissionId);
    if (!subject) return;
    try {
      this.#o.publish(subject, encode(body));
    } catch (err) {
      this.#o.log.debug({ err }, 'push not sent');
    }
  }
}
