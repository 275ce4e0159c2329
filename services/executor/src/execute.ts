import type { JsMsg } from '@nats-io/jetstream';
import type { KV } from '@nats-io/kv';
import {
  DeadlinePassedError,
  digestOf,
  downstreamKeyOf,
  EMPTY_RESULT_DIGEST,
  ErrorClass,
  operatorOfActor,
  prepareCall,
  TooltxError,
  type AuthorizationResult,
  type ErrorInfo,
  type Implementation,
} from '@tooltx/contracts';
import {
  confirmationDeadlineOf,
  decideAfterRun,
  executorAction,
  frozenTaskRefusal,
  handleCommand,
  operationEventSchema,
  redeliveredRunWaitMs,
  referenceMovedRefusal,
  runOutcomeOf,
  sendAfterStart,
  waitingToRun,
  type AuthDecision,
  type Evidence,
  type HandleOptions,
  type Handled,
  type OperationCommand,
  type OperationRecord,
  type OperationStore,
  type ReceiptSigner,
  type RunOutcome,
} from '@tooltx/lifecycle';
import {
  contextOfTraceparent,
  decodeMsg,
  encode,
  endSpan,
  eventStatusOf,
  eventTypeOf,
  newEventId,
  SpanKind,
  startSpan,
  toolSpanAttributes,
  traceparentOf,
  withSpan,
  type Settlement,
  type Span,
  type Subjects,
} from '@tooltx/nats';
import type { FrozenTaskWatch, Sampler } from '@tooltx/runtime';
import type { AnswerPusher } from '@tooltx/readside';
import {
  askPolicy,
  compensationInputOf,
  intentInputOf,
  type ImplementationRegistry,
  type Logger,
} from '@tooltx/runtime';
import type { LocalExecutor } from '@tooltx/runtime/service';
import { recoverOperation } from '@tooltx/runtime/recover-operation';
import { DownstreamClocks } from './downstream-clock.js';

export interface ExecutorDeps {
  subjects: Subjects;
  store: OperationStore;
  results: KV;
  tools: ImplementationRegistry;
  log: Logger;
  /** This executor's name in `running` events. */
  executorId: string;
  /** Signs the receipts of what it commits (FM-17). */
  signer: ReceiptSigner;
  /** Aborted on shutdown: in-flight attempts are abandoned as their contract says. */
  shutdown: AbortSignal;
  /** The frozen tasks, re-checked right before `running`; absent = none. */
  frozen?: Pick<FrozenTaskWatch, 'isFrozen'>;
  /** Pushes each submission's answer to its agent; absent = nothing is pushed and agents poll. */
  pusher?: AnswerPusher;
  now?: () => number;
  /** What it has learned of each downstream's clock (a fresh one per handler by default). */
  clocks?: DownstreamClocks;
  /** Debug sampling (docs/debug-samples.md); absent = none. */
  sampler?: Pick<Sampler, 'any' | 'offer'>;
}

/**
 * The event types the executor acts on; every other event of the log is acked unread. `confirmed`:
 * a held-back attempt released by its confirmation, accepted again and free to start.
 */
const ACTS_ON = new Set(['accepted', 'requeued', 'confirmed']);

/** How a sampled attempt ended, by the lifecycle's decision after its run. */
const SAMPLED_OUTCOME = {
  commit: 'committed',
  reject: 'rejected',
  mark_unknown: 'unknown',
  requeue: 'requeued',
} as const;

/** Largest preview of a prepare step kept for the caller (its JSON, bytes): it is read with the status answer. */
export const MAX_PREVIEW_BYTES = 16 * 1024;

/**
 * The executor's handler for one event-log message. It acts only on an `accepted` event that is
 * still the operation's state: re-check at the execution instant → `running` under the expected
 * sequence (only one executor wins) → `execute` with the tenant-scoped downstream key and an
 * absolute deadline → result store → `committed`. Read/compute timeouts become
 * `rejected: dependency_unavailable` (retryable); a side-effecting attempt whose request may have
 * left is never `rejected` — it stays `running` for recovery.
 */
export function eventHandler(deps: ExecutorDeps): (msg: JsMsg) => Promise<Settlement | void> {
  return executorHandlers(deps).events;
}

/** An attempt whose `running` state is stored at `seq`: what {@link executorHandlers}' run needs. */
interface StartedAttempt {
  tenant: string;
  opId: string;
  /** The operation's state after its start (status `running`, `running.eventId` the run's id). */
  state: OperationRecord;
  seq: number;
  impl: Implementation;
  input: Record<string, unknown>;
  /** The policy seam's answer at the execution instant. */
  allowed: AuthorizationResult | undefined;
  deadlineAt: number;
  /** ms since the attempt's deadline was fixed, on the monotonic clock. */
  elapsed: () => number;
  l: Logger;
}

/**
 * The executor's handler of event-log messages ({@link eventHandler}) and, for a process that
 * also hosts the authorizer, the in-process entry of attempts accepted and started in one append
 * (`local`, at most `localCapacity` at once; docs/operating.md "One process or four"). Both run an
 * attempt the same way once its start is stored. `idle()` resolves when no local attempt is in flight.
 */
export function executorHandlers(
  deps: ExecutorDeps,
  localCapacity = 16,
): {
  events: (msg: JsMsg) => Promise<Settlement | void>;
  local: LocalExecutor;
  idle: () => Promise<void>;
} {
  const { subjects, store, tools, log, results } = deps;
  const now = deps.now ?? Date.now;
  const clocks = deps.clocks ?? new DownstreamClocks();

  /** The one command handler, with this executor's receipt signer. */
  const transition = (
    tenant: string,
    opId: string,
    make: () => OperationCommand,
    o: HandleOptions = {},
  ): Promise<Handled> => handleCommand(store, tenant, opId, make, { ...o, signer: deps.signer });

  /**
   * An attempt starting at `at` (ms since the epoch): its absolute deadline, on the downstream's
   * clock as far as we have learned it, so an executor whose clock is off still gives its requests
   * their time; and the ms elapsed since, on the monotonic clock, so a wall clock stepped meanwhile
   * neither makes it negative nor decides whether to send (docs/clocks.md).
   */
  const attemptClock = (impl: Implementation, at: number) => {
    const mono = performance.now();
    return {
      deadlineAt: at + impl.contract.timing.timeoutMs + clocks.offsetMs(impl),
      elapsed: () => Math.max(0, Math.round(performance.now() - mono)),
    };
  };

  /** "Poll now" to the agent of the submission that started `state`'s attempt. */
  const pushPoll = (tenant: string, state: OperationRecord) =>
    deps.pusher?.poll(tenant, state.actor, state.intent.submissionId);

  const events = async (msg: JsMsg): Promise<Settlement | void> => {
    const where = subjects.parseOpSubject('op', msg.subject);
    if (!where) return { kind: 'term', reason: 'not an operation subject' };
    // Running, committed, rejected… are not this handler's: acked without decoding the body.
    const type = eventTypeOf(msg);
    if (type !== undefined && !ACTS_ON.has(type)) return;
    // Accepted and started in one append: the process that appended it runs it; a later delivery
    // (its executor died mid-attempt) is decoded and recovered below.
    if (msg.info.deliveryCount === 1 && (eventStatusOf(msg) ?? 'accepted') !== 'accepted') return;
    const event = decodeMsg(operationEventSchema, msg);
    if (!ACTS_ON.has(event.type)) return;
    const { tenant, opId } = where;
    // On a first delivery the event is, as a rule, still the operation's last one: act on the state
    // it carries at its own sequence (the `running` append names that sequence, so if anything was
    // appended since, it is refused and the newer event drives the operation). A redelivery reads.
    const { state, seq } =
      msg.info.deliveryCount === 1 ? { state: event.state, seq: msg.seq } : await store.load(tenant, opId);
    const action = executorAction(state, event.attempt, msg.info.deliveryCount);
    if (action === 'ignore' || state.status === 'none') return;
    const l = log.child({
      tenant,
      operationKey: state.operationKey,
      attempt: state.attempt,
      tool: `${state.tool}@${state.version}`,
    });

    const impl = tools.get(state.tool, state.version);
    if (!impl || impl.contract.digest !== state.contractDigest) {
      // Another executor instance may hold this contract version; never run a different one.
      l.error(
        { contractDigest: state.contractDigest, loaded: impl?.contract.digest ?? null },
        'contract version not loaded here: another tools module or another build (docs/operating.md "One process or four")',
      );
      return { kind: 'nak', delayMs: 5_000 };
    }

    if (action === 'recover' && state.running) {
      // Our earlier delivery of this operation died mid-attempt (FM-27). Verify before acting:
      // wait out the attempt's deadline (as far as we know the downstream's clock: only a schedule),
      // then probe the downstream by our key; its answer says whether the request may still land.
      const wait = redeliveredRunWaitMs(state.running.deadlineAt, now(), clocks.offsetMs(impl));
      if (wait > 0) return { kind: 'nak', delayMs: wait };
      const outcome = await recoverOperation({
        store,
        subjects,
        results,
        impl,
        tenant,
        opId,
        state,
        seq,
        log: l,
        now,
        signer: deps.signer,
      });
      l.info({ outcome: outcome.result }, 'redelivered running operation recovered');
      return;
    }
    if (action !== 'run') return;

    /**
     * A refusal before `running` applies only while the operation still waits to run (`accepted`,
     * this attempt): once another executor has moved it to `running`, that run is not ours to refuse.
     */
    // Every refusal is then pushed as "poll now": the status endpoint answers it under the read policy.
    const rejectBeforeRun = async (error: ErrorInfo, authorization?: AuthDecision) => {
      const d = await transition(
        tenant,
        opId,
        () => ({
          type: 'reject',
          eventId: newEventId(),
          at: now(),
          attempt: state.attempt,
          error,
          ...(authorization ? { authorization } : {}),
        }),
        {
          known: { state, seq },
          // Still waiting to run (a stale-accepted requeue only moves its sequence): the verdict holds.
          applies: (s) => waitingToRun(s, state.attempt),
        },
      );
      // Only a refusal this executor appended: otherwise the run is another's, and so is its answer.
      if (d.kind === 'appended') pushPoll(tenant, state);
      return d;
    };
    // The input, read back from the intent the `accepted` event names, checked against its digest.
    const input = state.compensates
      ? await compensationInputOf(store, subjects, state, impl, (t, v) => tools.get(t, v))
      : await intentInputOf(store, subjects, state, impl.contract);
    if (!input) {
      l.error('intent missing or does not match the registered digest');
      await rejectBeforeRun({ class: ErrorClass.Internal });
      return;
    }

    // Authorisation recomputed at the execution instant, from the authenticated identity recorded
    // at intake (the subject's actor) — never from the authorizer's earlier answer (FM-07, FM-08).
    const policyVersion = impl.policyVersion ?? 'none';
    const authCtx = {
      tenant,
      actor: state.actor,
      operationKey: state.operationKey,
      phase: 'execution' as const,
      now: now(),
      // A compensation: the permission the original's contract declares for it (docs/compensation.md).
      ...(state.compensates
        ? {
            compensates: {
              operationKey: state.compensates.operationKey,
              permission:
                tools.get(state.compensates.tool, state.compensates.version)?.contract.compensation?.permission ?? '',
              requestedBy: operatorOfActor(state.actor)
                ? { kind: 'operator' as const, id: operatorOfActor(state.actor)! }
                : { kind: 'actor' as const, id: state.actor },
            },
          }
        : {}),
    };
    const verdict = await askPolicy(impl, input, authCtx, { now });
    if (verdict.kind === 'refuse') {
      await rejectBeforeRun(verdict.error, verdict.authorization);
      l.info({ class: verdict.error.class }, 'rejected at execution');
      return;
    }
    const allowed = verdict.allowed;
    const authorization = verdict.authorization;

    // The references must still name what the operation was registered for: an alias moved to
    // another resource since intake would write somewhere the key does not bind (FM-10).
    const moved = allowed?.input
      ? referenceMovedRefusal(
          { operationKey: state.operationKey, inputDigest: state.inputDigest, compensation: !!state.compensates },
          canonicalOf(impl, state.taskId, allowed.input),
          { policyVersion, at: now() },
        )
      : null;
    if (moved) {
      await rejectBeforeRun(moved.error, moved.authorization);
      l.info('rejected at execution: a reference now names another resource');
      return;
    }

    // The task may have been frozen since intake (an operation of it went to takeover): an
    // accepted side effect stops here, definitively not applied (FM-14).
    const frozen = frozenTaskRefusal(impl.contract.effect, deps.frozen?.isFrozen(tenant, state.taskId) ?? false);
    if (frozen) {
      await rejectBeforeRun(frozen);
      l.info('rejected at execution: task frozen');
      return;
    }

    // Held back and not confirmed yet: prepare (no external effect) and wait for a confirmation
    // instead of starting it.
    if (state.confirmation && !state.confirmation.confirmed) {
      if (state.confirmation.heldAt !== undefined) return;
      return holdBack({ tenant, opId, state, seq, impl, input, l, rejectBeforeRun });
    }

    const { timeoutMs } = impl.contract.timing;
    if (impl.clock && !clocks.knows(impl)) {
      // Nothing learned of this downstream's clock yet: ask it, so even the first deadline is on it.
      const askedAt = now();
      const at = await impl.clock(AbortSignal.timeout(timeoutMs)).catch(() => undefined);
      clocks.observe(impl, at, askedAt, now());
    }
    const startedAt = now();
    const { deadlineAt, elapsed } = attemptClock(impl, startedAt);
    const runningId = newEventId();
    // Only one executor wins `running` (or a newer event drives the operation): a lost race is not ours.
    const start = await transition(
      tenant,
      opId,
      () => ({
        type: 'start',
        eventId: runningId,
        at: startedAt,
        attempt: state.attempt,
        executor: deps.executorId,
        deadlineAt,
        authorization,
      }),
      { known: { state, seq }, retry: false },
    );
    if (start.kind !== 'appended') return;
    if (start.event.state.status !== 'running') return;
    await runStarted({
      tenant,
      opId,
      state: start.event.state,
      seq: start.seq,
      impl,
      input,
      allowed: allowed ?? undefined,
      deadlineAt,
      elapsed,
      l,
    });
  };

  /**
   * A held-back attempt (its contract declares `confirm`): the implementation's prepare step, when
   * it has one, runs under the operation's downstream key with the attempt's deadline (no external
   * effect: a draft, a cost preview); its preview is checked against the contract's `confirm.preview`
   * and kept in the result store under the operation's result key with its digest (read back by the
   * status answer like a result, under the read policy); then `await_confirmation` holds the attempt
   * until the contract's `confirm.deadlineMs` from now. A prepare step that refuses (a `TooltxError`)
   * rejects the attempt — nothing was sent; any other failure leaves it accepted and the message is
   * delivered again (the reconciler re-drives it too).
   */
  async function holdBack(a: {
    tenant: string;
    opId: string;
    state: OperationRecord;
    seq: number;
    impl: Implementation;
    input: Record<string, unknown>;
    l: Logger;
    rejectBeforeRun: (error: ErrorInfo) => Promise<unknown>;
  }): Promise<Settlement | void> {
    const { tenant, opId, state, impl, l } = a;
    let previewDigest: string | undefined;
    if (impl.prepare) {
      const { timeoutMs } = impl.contract.timing;
      const { deadlineAt } = attemptClock(impl, now());
      // One controller per step, its listener on the long-lived shutdown signal removed afterwards.
      const step = new AbortController();
      const timer = setTimeout(() => step.abort(new DOMException('prepare step timed out', 'TimeoutError')), timeoutMs);
      const onShutdown = () => step.abort(deps.shutdown.reason);
      deps.shutdown.addEventListener('abort', onShutdown, { once: true });
      const signal = step.signal;
      let preview: unknown;
      try {
        const r = await impl.prepare(a.input, {
          tenant,
          actor: state.actor,
          operationKey: state.operationKey,
          downstreamKey: downstreamKeyOf(tenant, state.operationKey),
          attempt: state.attempt,
          inputDigest: state.inputDigest,
          deadlineAt,
          signal,
        });
        preview = r.preview;
      } catch (err) {
        if (err instanceof TooltxError) {
          await a.rejectBeforeRun(err.toInfo());
          l.info({ class: err.class }, 'prepare step refused: rejected, nothing sent');
          return;
        }
        l.warn({ err }, 'prepare step failed: delivered again');
        return { kind: 'nak', delayMs: 1_000 };
      } finally {
        clearTimeout(timer);
        deps.shutdown.removeEventListener('abort', onShutdown);
      }
      // A preview that is not what the contract promises the caller is the implementation's fault:
      // rejected (nothing was sent), never shown.
      const schema = impl.contract.confirm?.preview;
      if (schema) {
        const parsed = schema.safeParse(preview);
        if (!parsed.success) {
          l.error(
            { issues: parsed.error.issues.length },
            "prepare step's preview does not match confirm.preview: rejected",
          );
          await a.rejectBeforeRun({ class: ErrorClass.Internal });
          return;
        }
        preview = parsed.data;
      }
      if (preview !== undefined) {
        const bytes = Buffer.byteLength(JSON.stringify(preview) ?? '');
        if (bytes > MAX_PREVIEW_BYTES) {
          l.error({ bytes }, 'prepare step returned a preview larger than kept: rejected');
          await a.rejectBeforeRun({ class: ErrorClass.Internal });
          return;
        }
        previewDigest = digestOf(preview);
        await results.put(
          subjects.resultKey(tenant, opId),
          encode({
            operationKey: state.operationKey,
            attempt: state.attempt,
            resultDigest: previewDigest,
            result: preview,
          }),
        );
      }
    }
    const heldAt = now();
    const deadlineAt = confirmationDeadlineOf(impl.contract, heldAt) ?? heldAt;
    const d = await transition(
      tenant,
      opId,
      () => ({
        type: 'await_confirmation',
        eventId: newEventId(),
        at: heldAt,
        attempt: state.attempt,
        deadlineAt,
        ...(previewDigest ? { previewDigest } : {}),
      }),
      { known: { state, seq: a.seq } },
    );
    if (d.kind === 'appended') {
      pushPoll(tenant, state);
      l.info({ confirmDeadlineAt: deadlineAt }, 'held back: awaiting confirmation');
    }
  }

  /**
   * Runs an attempt whose start is stored, in a span of the caller's trace when tracing is on: its
   * parent is the span that accepted the attempt (the state's `intent.traceparent`), wherever and
   * whenever the attempt runs (in-process, from the log, after a crash).
   */
  async function runStarted(a: StartedAttempt): Promise<void> {
    const { state, impl } = a;
    const span = startSpan(
      `tooltx.run ${state.tool}`,
      SpanKind.INTERNAL,
      toolSpanAttributes({
        tool: state.tool,
        version: state.version,
        effect: impl.contract.effect,
        operationKey: state.operationKey,
      }),
      contextOfTraceparent(state.intent.traceparent),
    );
    let ended: { state: string; errorClass?: string } = { state: 'running' };
    try {
      await runAttempt(a, span, (st, errorClass) => (ended = { state: st, ...(errorClass ? { errorClass } : {}) }));
    } finally {
      endSpan(span, ended.state, ended.errorClass);
    }
  }

  /** Runs an attempt whose start is stored: send (unless stored too late), then commit, reject, unknown or requeue. */
  async function runAttempt(
    a: StartedAttempt,
    span: Span,
    ended: (state: string, errorClass?: string) => void,
  ): Promise<void> {
    const { tenant, opId, state, impl, input, allowed, deadlineAt, elapsed, l } = a;
    const runningId = state.running!.eventId;
    const { timeoutMs } = impl.contract.timing;
    const afterStart = { state, seq: a.seq };
    const reject = async (error: ErrorInfo, authorization?: AuthDecision, runId?: string) => {
      const d = await transition(tenant, opId, () => ({
        type: 'reject',
        eventId: newEventId(),
        at: now(),
        attempt: state.attempt,
        error,
        ...(authorization ? { authorization } : {}),
        ...(runId ? { runId } : {}),
      }));
      if (d.kind === 'appended') pushPoll(tenant, state);
      return d;
    };
    /**
     * Nothing of this run was applied: the same attempt runs again, bound to this run (after a
     * reload the operation may be running a later run that has sent).
     */
    const runAgain = async (reason: 'late_start' | 'refused_late', fields: Record<string, unknown>) => {
      const d = await transition(
        tenant,
        opId,
        () => ({ type: 'requeue', eventId: newEventId(), at: now(), attempt: state.attempt, runId: runningId, reason }),
        { known: afterStart },
      );
      l.warn({ ...fields, reason, outcome: d.kind }, 'nothing of this run was applied: requeued');
    };
    /** Nothing of this run was applied, and it was requeued too often already (decideRunAgain): rejected, the caller backs off. */
    const rejectNotApplied = async (reason: 'late_start' | 'refused_late', fields: Record<string, unknown>) => {
      await reject({ class: ErrorClass.DependencyUnavailable }, undefined, runningId);
      l.warn(
        { ...fields, reason, requeues: state.requeues },
        'nothing of this run was applied, again: rejected as dependency_unavailable',
      );
    };
    // Stored too late to be sent (a stalled append, e.g. a cluster's leader election): nothing has
    // left, so the attempt starts again with a fresh deadline rather than meet a refusal (FM-29).
    // Reads and computations are sent anyway: a late one is refused or times out, and is retryable.
    const go = sendAfterStart({
      effect: impl.contract.effect,
      timeoutMs,
      elapsedMs: elapsed(),
      requeues: state.requeues ?? 0,
    });
    if (go.kind !== 'send') {
      await (go.kind === 'requeue' ? runAgain : rejectNotApplied)('late_start', { elapsedMs: elapsed(), timeoutMs });
      return;
    }

    // Aborted at the attempt's deadline or on shutdown. One controller per attempt whose listener on
    // the long-lived shutdown signal is removed afterwards (AbortSignal.any on Node 20 keeps every
    // combined signal reachable from the shutdown signal: memory that grew with each call).
    const attempt = new AbortController();
    const timer = setTimeout(() => attempt.abort(new DOMException('attempt timed out', 'TimeoutError')), timeoutMs);
    const onShutdown = () => attempt.abort(deps.shutdown.reason);
    deps.shutdown.addEventListener('abort', onShutdown, { once: true });
    const signal = attempt.signal;
    let done: { resourceId: string; result: unknown } | undefined;
    let err: unknown;
    let outcome: RunOutcome;
    const sentAt = now();
    const traceparent = traceparentOf(span);
    try {
      const r = await withSpan(span, () =>
        impl.execute(input, {
          tenant,
          actor: state.actor,
          operationKey: state.operationKey,
          downstreamKey: downstreamKeyOf(tenant, state.operationKey),
          attempt: state.attempt,
          inputDigest: state.inputDigest,
          deadlineAt,
          signal,
          ...(allowed ? { authorization: allowed } : {}),
          ...(traceparent ? { traceparent } : {}),
        }),
      );
      clocks.observe(impl, r.downstreamAt, sentAt, now());
      done = { resourceId: r.resourceId, result: r.result };
      outcome = { kind: 'ok' };
    } catch (e) {
      err = e;
      if (e instanceof DeadlinePassedError) clocks.observe(impl, e.downstreamAt, sentAt, now());
      outcome = runOutcomeOf(e, signal.aborted);
    } finally {
      clearTimeout(timer);
      deps.shutdown.removeEventListener('abort', onShutdown);
    }

    // The effect-class failure mapping is the lifecycle's (decideAfterRun).
    const next = decideAfterRun(impl.contract.effect, outcome, state.requeues ?? 0);
    // Debug sampling: with no window open anywhere, this in-memory check is all it costs.
    if (deps.sampler?.any)
      void deps.sampler.offer({
        contract: `${state.tool}@${state.version}`,
        tenant,
        opId,
        operationKey: state.operationKey,
        outcome: SAMPLED_OUTCOME[next.kind],
        errorClass: next.kind === 'reject' ? next.error.class : undefined,
        input,
        result: () => {
          const r = impl.contract.output.safeParse(done?.result);
          return r.success ? r.data : undefined;
        },
      });
    switch (next.kind) {
      case 'commit': {
        const { resourceId } = done!;
        const result = impl.contract.output.parse(done!.result);
        const resultDigest = digestOf(result);
        // A receipt-only result ({}) is not stored: its digest says what it is (EMPTY_RESULT_DIGEST).
        if (resultDigest !== EMPTY_RESULT_DIGEST)
          await results.put(
            subjects.resultKey(tenant, opId),
            encode({ operationKey: state.operationKey, attempt: state.attempt, resultDigest, result }),
          );
        const d = await transition(
          tenant,
          opId,
          () => ({
            type: 'commit',
            eventId: newEventId(),
            at: now(),
            attempt: state.attempt,
            runId: runningId,
            resourceId,
            resultDigest,
          }),
          { known: afterStart },
        );
        // After the ack, not before it: the read policy may take a round trip (bounded by the policy's own timeout).
        const st = d.kind === 'appended' ? d.event.state : undefined;
        if (st?.status === 'committed' && st.receipt) {
          // To the submission that started this attempt, under the key it derived (an alias's, FM-10).
          void deps.pusher?.committed({
            impl,
            tenant,
            actor: st.actor,
            submissionId: st.intent.submissionId,
            submittedKey: st.intent.submitted?.operationKey ?? st.operationKey,
            state: { ...st, receipt: st.receipt },
            result: resultDigest === EMPTY_RESULT_DIGEST ? {} : result,
          });
        }
        ended(st?.status ?? 'committed');
        // Debug: one line per call is a synchronous write per call at info; the audit record holds it.
        l.debug({ resourceId, outcome: d.kind, elapsedMs: elapsed() }, 'committed');
        return;
      }
      case 'requeue':
        ended('requeued');
        // Refused as late by the downstream's own clock: not applied. The next run's deadline is on
        // the clock just learned.
        await runAgain('refused_late', {
          deadlineAt,
          downstreamAt: (err as DeadlinePassedError).downstreamAt,
          offsetMs: clocks.offsetMs(impl),
        });
        return;
      case 'reject':
        if (next.reason === 'late_again') {
          await rejectNotApplied('refused_late', {
            deadlineAt,
            downstreamAt: (err as DeadlinePassedError).downstreamAt,
          });
          return;
        }
        // Not applied by THIS run (a later run is not ours to judge).
        ended('rejected', next.error.class);
        await reject(next.error, undefined, runningId);
        if (next.reason === 'read_failed')
          l.warn(
            { err, elapsedMs: elapsed() },
            'read/compute attempt failed: rejected as dependency_unavailable (retryable)',
          );
        else l.info({ class: next.error.class }, 'rejected by the downstream');
        return;
      case 'mark_unknown': {
        // The request may have left: never `rejected`, never a blind retry. `unknown` with evidence;
        // the reconciler probes it.
        const evidence: Evidence = { kind: next.evidence, at: now(), elapsedMs: elapsed() };
        ended('unknown', evidence.kind);
        const d = await transition(tenant, opId, () => ({
          type: 'mark_unknown',
          eventId: newEventId(),
          at: now(),
          attempt: state.attempt,
          runId: runningId,
          evidence,
        }));
        if (d.kind === 'appended') pushPoll(tenant, state);
        l.warn(
          { err, elapsedMs: evidence.elapsedMs, evidence: evidence.kind, outcome: d.kind },
          'outcome unknown: recorded for the reconciler',
        );
        return;
      }
    }
  }

  /** Attempts handed over in-process and not yet ended. */
  const inFlight = new Set<Promise<void>>();
  let reserved = 0;
  const local: LocalExecutor = {
    begin(tool, version) {
      const impl = tools.get(tool, version);
      // Nothing learned yet of a downstream that tells its clock: the event log's path asks it first.
      if (!impl || reserved >= localCapacity || deps.shutdown.aborted || (impl.clock && !clocks.knows(impl)))
        return null;
      reserved++;
      const { deadlineAt, elapsed } = attemptClock(impl, now());
      let done = false;
      const release = () => {
        if (!done) {
          done = true;
          reserved--;
        }
      };
      return {
        executor: deps.executorId,
        deadlineAt,
        cancel: release,
        run(a) {
          const l = log.child({
            tenant: a.tenant,
            operationKey: a.state.operationKey,
            attempt: a.state.attempt,
            tool: `${a.state.tool}@${a.state.version}`,
          });
          const p = runStarted({
            ...a,
            impl,
            deadlineAt,
            elapsed,
            l,
          })
            .catch((err: unknown) =>
              // The attempt stays `running`: the reconciler verifies it past its deadline (FM-27).
              l.error({ err }, 'in-process attempt failed: left running for recovery'),
            )
            .finally(() => {
              release();
              inFlight.delete(p);
            });
          inFlight.add(p);
          return p;
        },
      };
    },
  };
  return { events, local, idle: async () => void (await Promise.all([...inFlight])) };
}

/** The key and input digest the policy seam's canonical input derives at the execution instant, or null when the contract refuses it. */
function canonicalOf(
  impl: Implementation,
  taskId: string,
  canonicalInput: Record<string, unknown>,
): { operationKey: string; inputDigest: string } | null {
  try {
    const { operationKey, inputDigest } = prepareCall(impl.contract, taskId, canonicalInput);
    return { operationKey, inputDigest };
  } catch {
    return null;
  }
}
