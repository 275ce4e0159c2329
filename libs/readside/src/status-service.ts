import { DeliverPolicy, type JetStreamClient, type JsMsg } from '@nats-io/jetstream';
import type { KV } from '@nats-io/kv';
import type { NatsConnection } from '@nats-io/transport-node';
import { LRUCache } from 'lru-cache';
import { ErrorClass, operationIdOf } from '@tooltx/contracts';
import {
  compensationResolutionOf,
  isFinalStatus,
  ownCallInFlight,
  readAllowed,
  statusRequestSchema,
  statusSettled,
  statusStep,
  type LoadedOperation,
  type OperationRecord,
  type OperationStore,
  type StatusAnswer,
  type StatusReads,
  type StatusRequest,
} from '@tooltx/lifecycle';
import { committedResult, opEventOf, type Subjects } from '@tooltx/nats';
import type { ImplementationRegistry, Logger } from '@tooltx/runtime';
import { msgpackCodec, startResponder, type Responder } from './responder.js';

export interface StatusDeps {
  nc: NatsConnection;
  js: JetStreamClient;
  subjects: Subjects;
  store: OperationStore;
  results: KV;
  tools: ImplementationRegistry;
  log: Logger;
  now?: () => number;
}

/**
 * What one waiting request has been told since it last looked: the newest operation state the
 * event-log watch delivered per watched operation subject (the event's folded state and its stream
 * sequence, as a direct get would have read it), and whether something arrived that only a fresh
 * read can answer (a decision, an event that did not decode). Registered for the whole request, so
 * a change between two looks is never missed.
 */
/** Whether two answers say the same (their time apart): a re-read that found nothing new. */
function sameAnswer(a: StatusAnswer, b: StatusAnswer): boolean {
  const { at: _a, ...x } = a;
  const { at: _b, ...y } = b;
  return JSON.stringify(x) === JSON.stringify(y);
}

/**
 * How long the event-log watch outlives the last waiting request, ms: a burst of long-polls shares
 * one watch. Short, because a running watch delivers every event of every tenant to this process (two
 * messages per event at the server) while starting one costs a consumer create: a few long-polls at
 * an agent's start (before its first push) kept it running through the next 30 s of calls, ~2 of a
 * call's ~18 NATS messages (docs/performance.md).
 */
const EVENTS_WATCH_IDLE_MS = 2_000;

class Wake {
  readonly latest = new Map<string, LoadedOperation>();
  reload = false;
  #dirty = false;
  #resolve: (() => void) | undefined;

  notify(subject: string, update: LoadedOperation | undefined): void {
    if (update) {
      const cur = this.latest.get(subject);
      if (!cur || update.seq > cur.seq) this.latest.set(subject, update);
    } else this.reload = true;
    this.#dirty = true;
    this.#resolve?.();
  }

  /** Resolves true at the next change (at once if one is pending), false after `ms`. Clears the pending flag. */
  next(ms: number): Promise<boolean> {
    if (this.#dirty) {
      this.#dirty = false;
      return Promise.resolve(true);
    }
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.#resolve = undefined;
        resolve(false);
      }, ms);
      this.#resolve = () => {
        clearTimeout(timer);
        this.#resolve = undefined;
        this.#dirty = false;
        resolve(true);
      };
    });
  }
}

/**
 * An answer with the events-stream sequence of the operation event it was read from (0 when it was
 * not read from the asked key's own operation). The sequence stays here: it only tells whether an
 * event the watch delivers is newer than what was answered. What the caller gets as `seq` is the
 * operation's own event count.
 */
interface Answered {
  answer: StatusAnswer;
  streamSeq: number;
}

/** Queue group shared by every status responder, so several authorizer instances split requests. */
export const STATUS_QUEUE = 'tooltx-status';

/**
 * The status endpoint: request/reply on `<prefix>.status.<tenant>.<actor>` (identity from the
 * subject). Read-only, repeatable, cheap: the first answer is one direct get of the operation's
 * last event; long-polls wait on ONE watch of the event log (running only while a request waits)
 * and one of the decision stream (ordered consumers, new messages only) shared by every waiting
 * request — never a consumer or a poll per request. A waiting request is answered from the event the watch delivered
 * (every event carries the operation's folded state), decoded only when someone waits on its
 * subject: no direct get per wake-up (they were ~8 of a call's 68 NATS messages). A
 * decision, an alias or a timeout is answered by a fresh read.
 *
 * Wire format (msgpack, through the read side's responder): a {@link StatusAnswer}, or
 * `{ error: ErrorInfo, at }` (`at` in ms since the epoch) — `invalid_input` for a subject that
 * names no agent, bytes that are not msgpack or a request the schema refuses;
 * `dependency_unavailable` when the store could not be read. Answered only into the requesting
 * agent's own inbox (FM-31).
 */
export class StatusService {
  readonly #d: StatusDeps;
  readonly #now: () => number;
  /** subject → waiting requests. */
  readonly #waiters = new Map<string, Set<Wake>>();
  #responder: Responder | null = null;
  readonly #watches: { stop(): void }[] = [];
  /**
   * Committed operations' last state and sequence by `<tenant>/<opId>`, as read or delivered: a
   * committed state never changes, so a repeated status request (a caller verifying before acting,
   * a status query) is answered without a direct get. Bounded (1,000 entries, a few MB).
   */
  readonly #final = new LRUCache<string, LoadedOperation>({ max: 1_000 });
  /** Set by stop(): waiting requests are answered with what is known now instead of waiting on. */
  #stopping = false;

  constructor(deps: StatusDeps) {
    this.#d = deps;
    this.#now = deps.now ?? Date.now;
  }

  async start(): Promise<void> {
    const { subjects } = this.#d;
    // The event log is watched only while a request waits (#eventsWatchNeeded): most calls get their
    // answer pushed and never wait here, and a watch of every event cost two deliveries per call.
    // Each tenant's decisions are watched by watchDecisions, from the tenant watch.
    this.#responder = startResponder(this.#d.nc, this.#d.log, {
      name: 'status',
      subject: subjects.allStatus,
      queue: STATUS_QUEUE,
      identify: (subject) => {
        const who = subjects.parseActorSubject('status', subject);
        return who && { who, role: { kind: 'agent', tenant: who.tenant, actor: who.actor } };
      },
      unidentified: {
        class: ErrorClass.InvalidInput,
        issues: [{ path: ['subject'], code: 'invalid_subject', message: 'not a status subject' }],
      },
      codec: msgpackCodec,
      schema: statusRequestSchema,
      handle: (req, who) => this.#handle(req, who),
      // What failed inside (the store, the results bucket) is not the caller's business: it may retry.
      errorBody: (info) => ({
        error: info.class === ErrorClass.Internal ? { class: ErrorClass.DependencyUnavailable } : info,
        at: this.#now(),
      }),
      onDrained: () => {
        this.#stopping = true;
        for (const [subject, set] of this.#waiters) for (const w of set) w.notify(subject, undefined);
      },
    });
  }

  /**
   * Watches one tenant's decision records (headers only: a waiter on one reads afresh), one
   * ordered consumer per tenant stream (docs/tenancy.md). Returns what stops it.
   */
  async watchDecisions(tenant: string): Promise<{ stop(): void }> {
    const { subjects } = this.#d;
    return this.#watch(subjects.decisionsStream(tenant), subjects.decisionsOf(tenant), true);
  }

  async #watch(stream: string, filter: string, headersOnly: boolean, onEnd?: () => void): Promise<{ stop(): void }> {
    const c = await this.#d.js.consumers.get(stream, {
      filter_subjects: filter,
      deliver_policy: DeliverPolicy.New,
      headers_only: headersOnly,
    });
    const it = await c.consume({ max_messages: 256 });
    void (async () => {
      for await (const m of it) this.#notify(m.subject, headersOnly ? undefined : m);
    })()
      .catch((err: unknown) => this.#d.log.error({ err, stream }, 'status watch ended'))
      .finally(() => onEnd?.());
    return it;
  }

  /** Stops taking requests, answers the waiting ones with what is known now, stops the watches. */
  async stop(): Promise<void> {
    await this.#responder?.stop();
    for (const w of this.#watches) w.stop();
    this.#stopEventsWatch();
  }

  /**
   * The event-log watch (with bodies: a waiter is answered from the state the event carries),
   * started when the first request waits and stopped {@link EVENTS_WATCH_IDLE_MS} after the last
   * one is answered. A watch delivers only events appended after it starts, so once it is running
   * every waiting request reads again: nothing appended between a request's read and the watch's
   * start is missed.
   */
  #eventsWatch: Promise<{ stop(): void } | null> | null = null;
  #eventsIdle: NodeJS.Timeout | undefined;

  #eventsWatchNeeded(): void {
    clearTimeout(this.#eventsIdle);
    this.#eventsIdle = undefined;
    if (this.#eventsWatch || this.#stopping) return;
    const { subjects } = this.#d;
    // A watch that ends (stopped, or its consumer gone) is forgotten: the next waiter starts another.
    let started: Promise<{ stop(): void } | null> | null = null;
    const ended = () => {
      if (this.#eventsWatch === started) this.#eventsWatch = null;
    };
    started = this.#eventsWatch = this.#watch(subjects.eventsStream, subjects.allOps, false, ended).then(
      (w) => {
        for (const [subject, set] of this.#waiters) for (const wake of set) wake.notify(subject, undefined);
        return w;
      },
      (err: unknown) => {
        this.#d.log.warn({ err }, 'status watch of the event log not started: waiting requests read at their end');
        this.#eventsWatch = null;
        return null;
      },
    );
  }

  #stopEventsWatch(): void {
    clearTimeout(this.#eventsIdle);
    this.#eventsIdle = undefined;
    const w = this.#eventsWatch;
    this.#eventsWatch = null;
    void w?.then((x) => x?.stop());
  }

  /** A watched message arrived: tells the requests waiting on its subject, with the event's state when it has one. */
  #notify(subject: string, m: JsMsg | undefined): void {
    const set = this.#waiters.get(subject);
    if (!set) return;
    let update: LoadedOperation | undefined;
    if (m) {
      try {
        // Only an event that belongs to its subject answers for it; anything else is read afresh.
        const e = opEventOf(this.#d.subjects, m, this.#d.log);
        if (e.kind === 'event') update = { state: e.event.state, seq: m.seq };
      } catch {
        update = undefined;
      }
    }
    for (const w of set) w.notify(subject, update);
  }

  #register(wake: Wake, subject: string): void {
    this.#eventsWatchNeeded();
    let set = this.#waiters.get(subject);
    if (!set) this.#waiters.set(subject, (set = new Set()));
    set.add(wake);
  }

  #unregister(wake: Wake, subjectsWatched: readonly string[]): void {
    for (const s of subjectsWatched) {
      const set = this.#waiters.get(s);
      set?.delete(wake);
      if (set?.size === 0) this.#waiters.delete(s);
    }
    if (this.#waiters.size === 0 && this.#eventsWatch && !this.#eventsIdle) {
      this.#eventsIdle = setTimeout(() => this.#stopEventsWatch(), EVENTS_WATCH_IDLE_MS);
      this.#eventsIdle.unref();
    }
  }

  /**
   * The answer to one valid request of `who`: at once without `waitMs`, else after the first
   * change (with `untilFinal`, a settled answer) or when `waitMs` ran out. Throws the store's
   * errors (answered `dependency_unavailable` by the responder).
   */
  async #handle(req: StatusRequest, who: { tenant: string; actor: string }): Promise<StatusAnswer> {
    const { subjects } = this.#d;
    const opId = operationIdOf(req.operationKey);
    const own = subjects.op(who.tenant, opId);
    const watched = [own, subjects.decision(who.tenant, opId, who.actor)];
    const waitMs = req.waitMs ?? 0;
    const until = this.#now() + waitMs;
    // Registered before reading and kept until the answer goes, so no change between a read and
    // the next wait is missed.
    const wake = waitMs > 0 ? new Wake() : null;
    if (wake) for (const s of watched) this.#register(wake, s);
    try {
      // An alias (known now, or learnt from a decision while waiting): wait on the operation it
      // names too — registered, then read again, so none of its changes is missed. Without this, a
      // decision that arrived after the first read left the request deaf to the canonical
      // operation until its time ran out (up to 30 s).
      const followed = async (r: Answered): Promise<Answered> => {
        if (!wake || !r.answer.canonicalKey) return r;
        const s = subjects.op(who.tenant, operationIdOf(r.answer.canonicalKey));
        if (watched.includes(s)) return r;
        watched.push(s);
        this.#register(wake, s);
        return this.#answer(who.tenant, who.actor, req);
      };
      let r = await followed(await this.#answer(who.tenant, who.actor, req));
      while (wake && !statusSettled(r.answer, req)) {
        const woke = await wake.next(Math.max(0, until - this.#now()));
        if (!woke || this.#stopping) {
          // Out of time (or shutting down): one fresh read, in case the watch lags behind the stream.
          r = await this.#answer(who.tenant, who.actor, req);
          break;
        }
        const update = wake.latest.get(own);
        if (wake.reload || r.answer.canonicalKey || !update) {
          wake.reload = false;
          const before = r;
          r = await followed(await this.#answer(who.tenant, who.actor, req));
          // Read again on a hint (a decision record, the event-log watch starting): only a different
          // answer is a change.
          if (sameAnswer(before.answer, r.answer)) continue;
        } else if (update.seq > r.streamSeq) {
          r = await this.#answer(who.tenant, who.actor, req, update);
        } else continue; // an event we had already read: not a change
        // Without `untilFinal` the first change is the answer; with it, wait through intermediate
        // states while time is left.
        if (!req.untilFinal || until - this.#now() <= 0) break;
      }
      return r.answer;
    } finally {
      if (wake) this.#unregister(wake, watched);
    }
  }

  /**
   * The answer for `actor` of `tenant` now, with the status precedence (`statusStep`: aliases, the
   * caller's own refusal, the fields each state reveals) and the read policy.
   * `loaded`: the operation's last state and stream sequence when the caller already has them (an
   * event the watch just delivered); read with one direct get otherwise.
   */
  async answer(tenant: string, actor: string, req: StatusRequest, loaded?: LoadedOperation): Promise<StatusAnswer> {
    return (await this.#answer(tenant, actor, req, loaded)).answer;
  }

  /**
   * {@link answer} with the stream sequence it was read at (see {@link Answered}). Does the reads
   * the precedence rule `statusStep` asks for — the operation's last state (one direct get, or the
   * committed cache), the caller's decision record, the result, an alias's canonical operation —
   * and the read policy ({@link mayRead}); the rule decides what they answer.
   */
  async #answer(tenant: string, actor: string, req: StatusRequest, loaded?: LoadedOperation): Promise<Answered> {
    const { store, results, subjects } = this.#d;
    const opId = operationIdOf(req.operationKey);
    const at = this.#now();
    const { state, seq } = loaded ?? this.#final.get(`${tenant}/${opId}`) ?? (await store.load(tenant, opId));
    // A final state (docs/lifecycle.md: no transition leaves it — `committed` only when its contract
    // declares no compensation) has nothing appended after it, so it answers every later request
    // without a read. Who may see it is still checked below.
    if (state.status !== 'none' && this.#isFinal(state)) this.#final.set(`${tenant}/${opId}`, { state, seq });
    const readable = state.status !== 'none' && (await this.#mayRead(tenant, actor, state, req)) ? state : null;
    // Answered from the asked key's own operation: its stream sequence tells a later event apart.
    const streamSeq = readable ? seq : 0;
    let reads: StatusReads = { req, actor, at, operation: readable };
    for (;;) {
      const step = statusStep(reads);
      switch (step.kind) {
        case 'answer':
          return { answer: step.answer, streamSeq };
        case 'read_decision':
          reads = {
            ...reads,
            decision:
              (step.submissionIds
                ? await store.decisionOf(tenant, operationIdOf(step.operationKey), actor, step.submissionIds)
                : await store.lastDecision(tenant, operationIdOf(step.operationKey), actor)) ?? null,
          };
          break;
        case 'read_result':
          reads = {
            ...reads,
            result:
              (await committedResult(results, subjects, tenant, operationIdOf(step.operationKey), {
                attempt: step.attempt,
                resultDigest: step.resultDigest,
              })) ?? null,
          };
          break;
        case 'follow_alias': {
          const c = await store.load(tenant, operationIdOf(step.alias.canonicalKey));
          const operation =
            c.state.status !== 'none' && (await this.#mayRead(tenant, actor, c.state, step.asked)) ? c.state : null;
          reads = { req: step.asked, actor, at, operation, alias: step.alias };
          break;
        }
      }
    }
  }

  /**
   * The read policy seam. Run before anything final is revealed (a receipt, a result, an error, a
   * takeover) and before anything at all is revealed to another actor; the submitting actor asking
   * about its own operation while it is still in flight learns only its state, so the policy (a
   * round trip to the system of record in the sample) is not asked again for each long-poll step.
   */
  #isFinal(state: OperationRecord): boolean {
    const compensable = this.#d.tools.get(state.tool, state.version)?.contract.compensation !== undefined;
    return isFinalStatus(state.status, { compensable, resolved: compensationResolutionOf(state) !== undefined });
  }

  async #mayRead(tenant: string, actor: string, state: OperationRecord, req: StatusRequest): Promise<boolean> {
    if (ownCallInFlight(state, actor, req)) return true;
    return readAllowed(this.#d.tools.get(state.tool, state.version), tenant, actor, state, this.#now());
  }
}
