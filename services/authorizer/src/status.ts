import { DeliverPolicy, type JetStreamClient } from '@nats-io/jetstream';
import type { KV } from '@nats-io/kv';
import type { Msg, NatsConnection, Subscription } from '@nats-io/transport-node';
import { z } from 'zod';
import { EMPTY_RESULT_DIGEST, ErrorClass, fieldIssues, operationIdOf, toErrorInfo, type ErrorInfo } from '@tooltx/contracts';
import { statusRequestSchema, type StatusAnswer, type StatusRequest, type OperationRecord } from '@tooltx/lifecycle';
import { decode, decodeRaw, encode, type OperationStore, type Subjects } from '@tooltx/nats';
import type { ImplementationRegistry, Logger } from '@tooltx/runtime';
import { isOwnReplyInbox } from '@tooltx/streams';

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

const resultEntrySchema = z.object({ operationKey: z.string(), attempt: z.number().int(), resultDigest: z.string(), result: z.unknown() });

/** Queue group shared by every status responder, so several authorizer instances split requests. */
export const STATUS_QUEUE = 'tooltx-status';

/**
 * The status endpoint: request/reply on `<prefix>.status.<tenant>.<actor>` (identity from the
 * subject). Read-only, repeatable, cheap: the first answer is one direct get of the operation's
 * last event; long-polls wait on ONE watch of the event log and one of the decision stream
 * (ordered consumers, new messages only, headers only) shared by every waiting request — never a
 * consumer or a poll per request (issue 3).
 */
export class StatusService {
  readonly #d: StatusDeps;
  readonly #now: () => number;
  /** subject → callbacks of waiting requests. */
  readonly #waiters = new Map<string, Set<() => void>>();
  #sub: Subscription | null = null;
  readonly #watches: { stop(): void }[] = [];
  readonly #inFlight = new Set<Promise<void>>();

  constructor(deps: StatusDeps) {
    this.#d = deps;
    this.#now = deps.now ?? Date.now;
  }

  async start(): Promise<void> {
    const { js, subjects } = this.#d;
    for (const [stream, filter] of [
      [subjects.eventsStream, subjects.allOps],
      [subjects.decisionsStream, subjects.allDecisions],
    ] as const) {
      const c = await js.consumers.get(stream, { filter_subjects: filter, deliver_policy: DeliverPolicy.New, headers_only: true });
      const it = await c.consume({ max_messages: 256 });
      this.#watches.push(it);
      void (async () => {
        for await (const m of it) this.#notify(m.subject);
      })().catch((err: unknown) => this.#d.log.error({ err, stream }, 'status watch ended'));
    }
    this.#sub = this.#d.nc.subscribe(subjects.allStatus, {
      queue: STATUS_QUEUE,
      callback: (err, msg) => {
        if (err) return void this.#d.log.warn({ err }, 'status subscription error');
        const p = this.#handle(msg).catch((e: unknown) => this.#d.log.error({ err: e }, 'status request failed'));
        this.#inFlight.add(p);
        void p.finally(() => this.#inFlight.delete(p));
      },
    });
  }

  /** Stops taking requests, answers the waiting ones with what is known now, stops the watches. */
  async stop(): Promise<void> {
    await this.#sub?.drain();
    for (const set of this.#waiters.values()) for (const w of set) w();
    await Promise.all(this.#inFlight);
    for (const w of this.#watches) w.stop();
  }

  #notify(subject: string): void {
    const set = this.#waiters.get(subject);
    if (set) for (const w of set) w();
  }

  #wait(subjectsToWatch: string[], ms: number): { changed: Promise<void>; cancel: () => void } {
    let cb!: () => void;
    const changed = new Promise<void>((r) => (cb = r));
    const timer = setTimeout(cb, ms);
    for (const s of subjectsToWatch) {
      let set = this.#waiters.get(s);
      if (!set) this.#waiters.set(s, (set = new Set()));
      set.add(cb);
    }
    const cancel = () => {
      clearTimeout(timer);
      for (const s of subjectsToWatch) {
        const set = this.#waiters.get(s);
        set?.delete(cb);
        if (set?.size === 0) this.#waiters.delete(s);
      }
    };
    return { changed, cancel };
  }

  async #handle(msg: Msg): Promise<void> {
    const { subjects } = this.#d;
    const who = subjects.parseActorSubject('status', msg.subject);
    // Answers go only to the requester's own inbox: the reply subject is the requester's choice,
    // and this service may publish on operation subjects (FM-31).
    if (who && !isOwnReplyInbox({ kind: 'agent', tenant: who.tenant, actor: who.actor }, msg.reply)) {
      this.#d.log.warn({ subject: msg.subject }, 'status request with a reply subject outside the requester\'s inbox: not answered');
      return;
    }
    const reply = (body: unknown) => msg.respond(encode(body));
    if (!who) return void reply({ error: { class: ErrorClass.InvalidInput, issues: [{ path: ['subject'], code: 'invalid_subject', message: 'not a status subject' }] }, at: this.#now() });
    let req: StatusRequest;
    try {
      const r = statusRequestSchema.safeParse(decodeRaw(msg.data));
      if (!r.success) return void reply({ error: { class: ErrorClass.InvalidInput, issues: fieldIssues(r.error) } satisfies ErrorInfo, at: this.#now() });
      req = r.data;
    } catch {
      return void reply({ error: { class: ErrorClass.InvalidInput, issues: [{ path: [], code: 'invalid_encoding', message: 'not msgpack' }] }, at: this.#now() });
    }
    const opId = operationIdOf(req.operationKey);
    const watched = [subjects.op(who.tenant, opId), subjects.decision(who.tenant, opId, who.actor)];
    const watchAlias = (a: StatusAnswer): boolean => {
      if (!a.canonicalKey) return false;
      const s = subjects.op(who.tenant, operationIdOf(a.canonicalKey));
      if (watched.includes(s)) return false;
      watched.push(s);
      return true;
    };
    const waitMs = req.waitMs ?? 0;
    const until = this.#now() + waitMs;
    // Register before reading, so a change between the read and the wait is not missed.
    let w = waitMs > 0 ? this.#wait(watched, waitMs) : null;
    try {
      let answer = await this.answer(who.tenant, who.actor, req);
      // An alias: wait on the operation it names too, registered before reading it again.
      if (w && watchAlias(answer)) {
        w.cancel();
        w = this.#wait(watched, Math.max(0, until - this.#now()));
        answer = await this.answer(who.tenant, who.actor, req);
      }
      while (w && !this.#settled(answer, req)) {
        await w.changed;
        w.cancel();
        const left = until - this.#now();
        // With `untilFinal`, keep waiting through intermediate states while time is left.
        w = req.untilFinal && left > 0 ? this.#wait(watched, left) : null;
        answer = await this.answer(who.tenant, who.actor, req);
      }
      reply(answer);
    } catch (err) {
      reply({ error: toErrorInfo(err).class === ErrorClass.Internal ? { class: ErrorClass.DependencyUnavailable } : toErrorInfo(err), at: this.#now() });
      throw err;
    } finally {
      w?.cancel();
    }
  }

  /** True when the answer should go back at once rather than wait for a change. */
  #settled(a: StatusAnswer, req: StatusRequest): boolean {
    if (a.source === 'decision') return true;
    const after = req.afterSeq ?? 0;
    if (req.untilFinal) {
      if (a.state === 'unknown' && a.takeover) return a.seq !== after;
      // An earlier attempt's refusal is not the caller's final answer: its resubmission is coming.
      if (a.state === 'rejected' && a.ownAttempt === false) return false;
      return (a.state === 'committed' || a.state === 'rejected') && a.seq !== after;
    }
    // A final state answers at once unless the caller already saw exactly it (it then waits for a
    // new attempt, e.g. after resubmitting a retryable rejection).
    if ((a.state === 'committed' || a.state === 'rejected') && a.seq !== after) return true;
    return a.seq > after;
  }

  /** The answer for `actor` of `tenant` now, with DESIGN.md's precedence and the read policy. */
  async answer(tenant: string, actor: string, req: StatusRequest): Promise<StatusAnswer> {
    const { store } = this.#d;
    const opId = operationIdOf(req.operationKey);
    const at = this.#now();
    const { state, seq } = await store.load(tenant, opId);
    if (state.status !== 'none' && (await this.#mayRead(tenant, actor, state, req))) return this.#fromOperation(tenant, actor, req, opId, state, seq, at);
    // Never registered, or not readable by this caller (same answer): an alias of another key, the
    // caller's own refusal, or nothing.
    const d = await store.lastDecision(tenant, opId, actor);
    if (d?.outcome === 'aliased') {
      const canonicalOpId = operationIdOf(d.canonicalKey);
      const c = await store.load(tenant, canonicalOpId);
      // The caller's digest is its own input's: the same as the alias's means the canonical one.
      const asked = req.inputDigest === undefined ? req : { ...req, inputDigest: req.inputDigest === d.inputDigest ? d.canonicalInputDigest : req.inputDigest };
      if (c.state.status !== 'none' && (await this.#mayRead(tenant, actor, c.state, asked))) {
        return { ...(await this.#fromOperation(tenant, actor, asked, canonicalOpId, c.state, c.seq, at)), operationKey: req.operationKey, canonicalKey: d.canonicalKey };
      }
      return { operationKey: req.operationKey, canonicalKey: d.canonicalKey, state: 'not_seen', source: 'none', seq: 0, at };
    }
    if (d && (req.submissionIds === undefined || req.submissionIds.includes(d.submissionId))) {
      return { operationKey: req.operationKey, state: 'rejected', source: 'decision', seq: 0, error: d.error, submissionId: d.submissionId, at };
    }
    return { operationKey: req.operationKey, state: 'not_seen', source: 'none', seq: 0, at };
  }

  /** The answer from a registered operation the caller may read (state, receipt, permitted result). */
  async #fromOperation(tenant: string, actor: string, req: StatusRequest, opId: string, state: OperationRecord, seq: number, at: number): Promise<StatusAnswer> {
    const { store, results, subjects } = this.#d;
    const a: StatusAnswer = { operationKey: req.operationKey, state: state.status, source: 'operation', seq, attempt: state.attempt, at };
    if (req.inputDigest !== undefined) a.inputMatches = req.inputDigest === state.inputDigest;
    if (req.submissionIds !== undefined) {
      a.ownAttempt = req.submissionIds.includes(state.intent.submissionId);
      if (state.status === 'rejected' && !a.ownAttempt) {
        // An earlier attempt's refusal: if the caller's own resubmission was refused at intake
        // (e.g. task_frozen), that refusal is the answer it waits for.
        const d = await store.lastDecision(tenant, opId, actor);
        if (d?.outcome === 'rejected' && d.actor === actor && req.submissionIds.includes(d.submissionId) && d.at >= state.updatedAt) {
          return { operationKey: req.operationKey, state: 'rejected', source: 'decision', seq: 0, error: d.error, submissionId: d.submissionId, at };
        }
      }
    }
    if (state.status === 'committed' && state.receipt) {
      a.receipt = state.receipt;
      // A receipt-only result (`{}`, a write's: FM-19) is not stored; its digest says what it is.
      if (a.inputMatches !== false && state.receipt.resultDigest === EMPTY_RESULT_DIGEST) a.result = {};
      else if (a.inputMatches !== false) {
        const entry = await results.get(subjects.resultKey(tenant, opId));
        if (entry && entry.operation === 'PUT') {
          const r = decode(resultEntrySchema, entry.value);
          if (r.attempt === state.attempt && r.resultDigest === state.receipt.resultDigest) a.result = r.result;
        }
      }
    }
    if (state.status === 'rejected' && state.error) a.error = state.error;
    if (state.status === 'unknown' && state.takeover) a.takeover = state.takeover;
    return a;
  }

  /**
   * The read policy seam. Run before anything final is revealed (a receipt, a result, an error, a
   * takeover) and before anything at all is revealed to another actor; the submitting actor asking
   * about its own operation while it is still in flight learns only its state, so the policy (a
   * round trip to the system of record in the sample) is not asked again for each long-poll step.
   */
  async #mayRead(tenant: string, actor: string, state: OperationRecord, req: StatusRequest): Promise<boolean> {
    const impl = this.#d.tools.get(state.tool, state.version);
    if (!impl?.authorizeRead) return true;
    const inFlight = state.status === 'accepted' || state.status === 'running' || (state.status === 'unknown' && !state.takeover);
    if (inFlight && actor === state.actor && req.submissionIds?.includes(state.intent.submissionId)) return true;
    try {
      const resources = state.authorization?.intake?.resources;
      await impl.authorizeRead({ tenant, actor, owner: state.actor, operationKey: state.operationKey, now: this.#now(), ...(resources ? { resources } : {}) });
      return true;
    } catch {
      return false;
    }
  }
}
