import { randomUUID } from 'node:crypto';
import { ErrorClass, TooltxError } from '@tooltx/contracts';
import {
  decideAwait,
  initialAwait,
  statusReplySchema,
  type AwaitCall,
  type AwaitEvent,
  type AwaitOutcome,
  type Receipt,
  type ReceiptCheck,
  type StatusAnswer,
  type StatusRequest,
} from '@tooltx/lifecycle';
import { decode, encode, permissionViolationOf } from '@tooltx/nats';
import type { Connection, PushWait } from './connection.js';
import { publishOne, sleep, type PreparedIntent } from './submit.js';

/**
 * One status request of this connection (read-only, repeatable), with a timeout of its wait plus
 * 2 s. Throws `TooltxError`: `forbidden` when the server refuses it (permissions), its own class
 * when the status endpoint refuses the request, `dependency_unavailable` when no status service answers.
 */
export function statusRequester(conn: Connection, subject: string): (req: StatusRequest) => Promise<StatusAnswer> {
  return async (req) => {
    let reply: Awaited<ReturnType<typeof conn.nc.request>>;
    try {
      reply = await conn.nc.request(subject, encode(req), { timeout: (req.waitMs ?? 0) + 2_000 });
    } catch (err) {
      const denied = permissionViolationOf(err);
      if (denied)
        throw new TooltxError(ErrorClass.Forbidden, 'status request refused by the server (permissions)', {
          issues: [conn.deniedIssue(denied, 'call')],
          cause: err,
        });
      throw new TooltxError(ErrorClass.DependencyUnavailable, 'status service did not answer', { cause: err });
    }
    const body = decode(statusReplySchema, reply.data);
    if (!('state' in body))
      throw new TooltxError(body.error.class, 'status request refused', { issues: body.error.issues });
    return body;
  };
}

/** What one call has done so far, for the evidence of a failure no rule knows. */
export interface Track {
  key: string | undefined;
  submissionIds: string[];
  intentStored: boolean;
  started: number;
}

/** What awaiting an outcome uses of the SDK: its connection, identity, status requests, receipt check and id factory. */
export interface AwaitIO {
  conn: Connection;
  tenant: string;
  actor: string;
  status(req: StatusRequest): Promise<StatusAnswer>;
  checkReceipt(operationKey: string, receipt: Receipt): ReceiptCheck;
  submissionIdFactory?: () => string;
}

/**
 * Submits `intent` and observes its operation until an outcome or the end of the budget
 * (`call.deadlineAt`): performs each step the lifecycle's `decideAwait` decides — publishes,
 * status requests, waits for pushed answers, pauses — and reports what came of it. Throws only what
 * no rule knows (a non-transient client error); `track` then holds the evidence.
 */
export async function awaitOutcome(
  io: AwaitIO,
  call: AwaitCall,
  intent: PreparedIntent,
  track: Track,
): Promise<AwaitOutcome> {
  let state = initialAwait(call);
  let event: AwaitEvent = { kind: 'start' };
  /** The push the latest submission waits for (cancelled when a newer submission is sent or its answer was taken). */
  let pending: PushWait | null = null;
  try {
    for (;;) {
      const { state: next, step } = decideAwait(state, event, {
        now: Date.now(),
        pushSeen: io.conn.pushes.seen,
        checkReceipt: io.checkReceipt,
      });
      state = next;
      track.intentStored = state.intentStored;
      switch (step.kind) {
        case 'answer':
          return step.outcome;
        case 'submit': {
          if (step.delayMs > 0) await sleep(step.delayMs);
          const id = !step.randomId && io.submissionIdFactory ? io.submissionIdFactory() : randomUUID();
          track.submissionIds.push(id);
          pending?.cancel();
          pending = io.conn.pushes.waitFor(id, call.operationKey, call.inputDigest);
          const { unanswered, result } = await publishOne(io.conn, io.tenant, io.actor, intent, id, call.deadlineAt);
          event = { kind: 'published', submissionId: id, pushable: pending !== null, unanswered, result };
          break;
        }
        case 'confirm_stored': {
          // No answer, or none before the budget ends, counts as "not stored".
          let timer: NodeJS.Timeout | undefined;
          const asked = io.status(step.request).catch(() => null);
          const answer = await Promise.race([
            asked,
            new Promise<null>((r) => (timer = setTimeout(() => r(null), Math.max(0, call.deadlineAt - Date.now())))),
          ]);
          clearTimeout(timer);
          event = { kind: 'stored_checked', answer };
          break;
        }
        case 'wait_push': {
          let timer: NodeJS.Timeout | undefined;
          const first = pending
            ? await Promise.race([
                pending.pushed,
                new Promise<null>((r) => (timer = setTimeout(() => r(null), step.ms))),
              ])
            : null;
          clearTimeout(timer);
          event =
            first && !('poll' in first) ? { kind: 'answered', answer: first, pushed: true } : { kind: 'push_missed' };
          break;
        }
        case 'ask_status':
          event = await ask(io, step.request, step.racePush ? pending : null);
          break;
        case 'pause':
          await Promise.race([sleep(step.ms), ...(step.wakeOnPush && pending ? [pending.final] : [])]);
          event = { kind: 'paused' };
          break;
      }
      // A pushed answer is taken once; whatever follows (a result not readable yet…) asks status.
      if (event.kind === 'answered' && event.pushed) {
        pending?.cancel();
        pending = null;
      }
    }
  } finally {
    // A call that ends without its push leaves no waiter behind.
    (pending as PushWait | null)?.cancel();
  }
}

/**
 * The status endpoint's answer, raced by the latest submission's push when it may still come (so a
 * status endpoint that is down does not hide a pushed receipt), or why there is none.
 */
async function ask(io: AwaitIO, request: StatusRequest, push: PushWait | null): Promise<AwaitEvent> {
  try {
    const asked = io.status(request);
    if (!push) return { kind: 'answered', answer: await asked, pushed: false };
    asked.catch(() => undefined);
    const r = await Promise.race([
      asked.then((a) => ({ a, pushed: false })),
      push.final.then((a) => ({ a, pushed: true })),
    ]);
    return { kind: 'answered', answer: r.a, pushed: r.pushed };
  } catch (err) {
    // Refused by the server's permissions: the intent is stored (or may be); only observing failed.
    if (err instanceof TooltxError && permissionViolationOf(err.cause))
      return { kind: 'status_failed', error: err.toInfo(), reauthorise: true };
    const refusedCredentials = io.conn.credentialsRefusal();
    if (refusedCredentials)
      return {
        kind: 'status_failed',
        error: new TooltxError(ErrorClass.Forbidden, 'credentials refused', {
          issues: refusedCredentials.issues,
        }).toInfo(),
        reauthorise: true,
      };
    return {
      kind: 'status_failed',
      error: err instanceof TooltxError ? err.toInfo() : { class: ErrorClass.DependencyUnavailable },
      reauthorise: false,
    };
  }
}
