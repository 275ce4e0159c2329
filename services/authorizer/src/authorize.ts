import type { JsMsg } from '@nats-io/jetstream';
import type { KV } from '@nats-io/kv';
import {
  compensationOf,
  EMPTY_RESULT_DIGEST,
  ErrorClass,
  reasonDigestOf,
  TooltxError,
  operationIdOf,
  operatorOfActor,
  prepareCall,
  type ErrorInfo,
  type Implementation,
} from '@tooltx/contracts';
import {
  aliasRecord,
  boundedRefusal,
  compensationAttemptFor,
  compensationSettlement,
  compensationVerdict,
  ConcurrencyError,
  contractAdmission,
  confirmVerdict,
  discardVerdict,
  decideIntakeFailure,
  frozenTaskRefusal,
  handleCommand,
  IDEMPOTENCY_CONFLICT,
  keylessRefusalKey,
  readAllowed,
  refusalRecord,
  refusedIntentDeletable,
  replayRecord,
  registrationOf,
  StoreUnavailableError,
  type AcceptCommand,
  type AuthDecision,
  type OperationRecord,
  type OperationStore,
  type Receipt,
  type RegistryView,
} from '@tooltx/lifecycle';
import {
  committedResult,
  contextOfHeaders,
  endSpan,
  isTransient,
  newEventId,
  SpanKind,
  startSpan,
  toolSpanAttributes,
  traceparentOf,
  type Settlement,
  type Span,
  type Subjects,
} from '@tooltx/nats';
import type { FrozenTaskWatch } from '@tooltx/runtime';
import type { AnswerPusher } from '@tooltx/readside';
import type { LocalExecutor } from '@tooltx/runtime/service';
import {
  askPolicy,
  compensatingCall,
  discardPrepared,
  intentInputOf,
  type ImplementationRegistry,
  type Logger,
} from '@tooltx/runtime';
import { intakeOf, type IntakeOutcome } from './intake.js';

/** Intents from this size on (bytes) have their intake checks' CPU time measured and charged (docs/tenancy.md). */
const MEASURED_INTENT_BYTES = 4 * 1024;

/** An error a later delivery may not meet: the store or the server did not answer (nak, retried). */
function retryable(err: unknown): boolean {
  return err instanceof StoreUnavailableError || err instanceof ConcurrencyError || isTransient(err);
}

export interface AuthorizerDeps {
  subjects: Subjects;
  store: OperationStore;
  tools: ImplementationRegistry;
  log: Logger;
  /**
   * The contract registry in memory (a watched copy): a new intent on a retired or withdrawn
   * version is refused from it (docs/contracts.md); absent = every version is admitted (unit use).
   */
  registry?: RegistryView;
  /** The frozen tasks; absent = none is ever frozen (unit use only). */
  frozen?: Pick<FrozenTaskWatch, 'isFrozen'>;
  /**
   * Pushes "poll now" to a submission's agent for every outcome but a new registration (whose answer
   * the executor pushes), and a known committed key's answer; absent = nothing is pushed.
   */
  pusher?: AnswerPusher;
  /** The result store, read for the pushed answer of a known committed key with a stored result. */
  results?: KV;
  now?: () => number;
  /**
   * Told what one intent cost: how long its pure intake checks took (ms of this process's CPU) and
   * its size (bytes): intake is paced per tenant by what it costs, not only by count (docs/tenancy.md).
   */
  onIntakeCost?: (tenant: string, ms: number, bytes: number) => void;
  /**
   * The executor of this process, when it hosts one (the co-located layout): an operation it can
   * take now is accepted and started in one append, checked once at that execution instant, and
   * handed to it in-process (docs/operating.md "One process or four"). Absent or null: accepted
   * alone, and the event log delivers it to an executor.
   */
  localExecutor?: () => LocalExecutor | undefined;
}

/**
 * The authorizer's handler for one intent message: intake checks → policy seam → frozen task
 * (side effects only) → tenant-scoped lookup → `accepted` under the expected subject sequence, or a decision record. Nothing is written
 * on the operation's subject by a refused or conflicting request (FM-03, FM-06).
 */
export function intentHandler(deps: AuthorizerDeps): (msg: JsMsg) => Promise<Settlement | void> {
  const { subjects, store, tools, log } = deps;
  const now = deps.now ?? Date.now;

  return async (msg) => {
    // CPU time, not wall time: a pause of this process (a GC, another process on the core) is not
    // the intent's cost. Measured for intents of 4 KiB and more only: a smaller one's checks stay
    // well inside the first millisecond, which is never charged, and reading the process's CPU time
    // (getrusage) was 4 % of a co-located process's CPU.
    const measured = msg.data.byteLength >= MEASURED_INTENT_BYTES;
    const started = measured ? process.cpuUsage() : undefined;
    const intake = intakeOf(
      subjects,
      { subject: msg.subject, data: msg.data, msgId: msg.headers?.get('Nats-Msg-Id') || undefined, seq: msg.seq },
      (t, v) => tools.contracts.get(t, v),
      (t) => tools.contracts.versionsOf(t),
    );
    const who = intake.who;
    if (who) {
      const used = started ? process.cpuUsage(started) : undefined;
      deps.onIntakeCost?.(who.tenant, used ? (used.user + used.system) / 1_000 : 0, msg.data.byteLength);
    }
    if (!who) return { kind: 'term', reason: 'not an intent subject' };
    const submissionId = intake.submissionId;
    let answerOnItsWay = false;
    let settled: Settlement | void;
    try {
      settled = await handle(msg, intake, who, submissionId, () => (answerOnItsWay = true));
    } catch (err) {
      // A throw is retried (nak): the answer is still to come, so nothing is pushed for it yet.
      // A failure that will fail again (not the store, the server or a dependency of the policy
      // being away) is terminal after a few deliveries: recorded as `internal` and terminated, never
      // redelivered for minutes (docs/tenancy.md).
      const dependencyAway = err instanceof TooltxError && err.class === ErrorClass.DependencyUnavailable;
      if (
        decideIntakeFailure({ retryable: retryable(err), dependencyAway, deliveryCount: msg.info.deliveryCount }) ===
        'retry'
      )
        throw err;
      settled = await terminal(msg, intake, who, submissionId, err);
    }
    if (!answerOnItsWay) deps.pusher?.poll(who.tenant, who.actor, submissionId);
    return settled;
  };

  /** Records an intent's permanent failure as an `internal` refusal under its key ({@link recordRefusal}) and terminates it. */
  async function terminal(
    msg: JsMsg,
    intake: IntakeOutcome,
    who: { tenant: string; actor: string },
    submissionId: string,
    err: unknown,
  ): Promise<Settlement> {
    const check = intake.kind === 'checked' ? intake.check : null;
    const key =
      check?.kind === 'proceed' ? check.prepared.operationKey : check?.kind === 'refuse' ? check.decisionKey : null;
    const l = log.child({ tenant: who.tenant, actor: who.actor, intentSeq: msg.seq });
    l.error(
      { err, deliveryCount: msg.info.deliveryCount },
      'intent failed for good: recorded as internal and terminated',
    );
    await recordRefusal(msg, who, submissionId, l, key, { class: ErrorClass.Internal }, {}).catch((e: unknown) =>
      l.error({ err: e }, 'its record was not stored either'),
    );
    return { kind: 'term', reason: 'failed for good' };
  }

  /**
   * Records a refusal and deletes the intent, which registered nothing, from the tenant's intake
   * stream (docs/tenancy.md: refused intents stop counting against the tenant's bound). A refusal
   * before any key is known is recorded under the key {@link keylessRefusalKey} derives from the
   * submission, so that the audit has it. A record the store refuses for good (e.g. larger than it
   * takes) is replaced by a bounded one naming the class only; if even that is refused, the
   * intent is terminated: never redelivered (a failure that will fail again).
   */
  async function recordRefusal(
    msg: JsMsg,
    who: { tenant: string; actor: string },
    submissionId: string,
    l: Logger,
    key: string | null,
    error: ErrorInfo,
    ids: { tool?: string; version?: number },
    authorization?: AuthDecision,
  ): Promise<Settlement | void> {
    const recordKey = key ?? keylessRefusalKey(who.tenant, submissionId);
    const record = (e: ErrorInfo) =>
      store.recordDecision(
        refusalRecord(
          { ...who, submissionId },
          {
            eventId: newEventId(),
            at: now(),
            key,
            keylessKey: recordKey,
            error: e,
            ...ids,
            ...(authorization ? { authorization } : {}),
          },
        ),
        operationIdOf(recordKey),
      );
    let settlement: Settlement | void = undefined;
    try {
      await record(error);
    } catch (err) {
      if (retryable(err)) throw err;
      l.error({ err, operationKey: recordKey, class: error.class }, 'refusal record not stored: storing a bounded one');
      try {
        await record(boundedRefusal(error));
      } catch (again) {
        if (retryable(again)) throw again;
        l.error({ err: again, operationKey: recordKey }, 'no refusal record can be stored: intent terminated');
        settlement = { kind: 'term', reason: 'refusal not recordable' };
      }
    }
    if (refusedIntentDeletable(msg.info.deliveryCount))
      await store
        .deleteIntent(who.tenant, msg.seq)
        .catch((err: unknown) =>
          l.warn({ err }, "refused intent not deleted: it counts against the tenant's bound until its max age"),
        );
    l.info({ operationKey: recordKey, class: error.class, ...(key ? {} : { keyless: true }) }, 'intent refused');
    return settlement;
  }

  /**
   * The committed answer of a known key, pushed to the agent of `submissionId` (a resubmission,
   * FM-01/FM-26) with the same result as the status endpoint's answer; "poll now" when no result
   * is readable. The pusher applies the read policy.
   */
  async function pushCommitted(
    pusher: AnswerPusher,
    who: { tenant: string; actor: string },
    submissionId: string,
    impl: Implementation,
    submittedKey: string,
    st: OperationRecord & { receipt: Receipt },
    seq: number,
  ): Promise<void> {
    const readable = deps.results
      ? await committedResult(deps.results, subjects, who.tenant, operationIdOf(st.operationKey), {
          attempt: st.attempt,
          resultDigest: st.receipt.resultDigest,
        }).catch(() => null)
      : st.receipt.resultDigest === EMPTY_RESULT_DIGEST
        ? { result: {} }
        : null;
    if (!readable) return pusher.poll(who.tenant, who.actor, submissionId);
    await pusher.committed({
      impl,
      tenant: who.tenant,
      actor: who.actor,
      submissionId,
      submittedKey,
      state: st,
      seq,
      result: readable.result,
    });
  }

  /**
   * A request to compensate a committed operation (docs/compensation.md): the original is loaded
   * (this tenant's only: its subject is), `compensationVerdict` judges it, the compensating input is
   * built from the original's input and receipt and the reason, the compensating contract's policy
   * grants the declared permission at the execution instant, `compensation_requested` is appended on
   * the original under its expected sequence (one compensation at a time: a second request of the
   * same one is a replay, FM-21, to a requester the policy allows; another one loses, FM-22), and
   * the compensation is accepted as an
   * operation of its own under its derived key, started at once when this process's executor has
   * room. Every refusal is recorded under the compensation's key, and nothing is sent (FM-22).
   */
  async function compensate(
    msg: JsMsg,
    check: Extract<IntakeOutcome, { kind: 'checked' }>['check'] & { kind: 'compensate' },
    who: { tenant: string; actor: string },
    submissionId: string,
    l: Logger,
    refuse: (
      key: string | null,
      error: ErrorInfo,
      ids: { tool?: string; version?: number },
      a?: AuthDecision,
    ) => Promise<Settlement | void>,
    answerOnItsWay: () => void,
  ): Promise<Settlement | void> {
    const { contract, compensationKey } = check;
    const ids = { tool: contract.name, version: contract.version };
    // An operator's request (`tooltx compensate`) arrives under `_op-<operator>`, which only the
    // operator request service may publish on, for an operator granted `compensate`: that grant is
    // the permission, and the policy is told so instead of being asked it of an agent.
    const operator = operatorOfActor(who.actor);
    const requestedBy = operator
      ? { kind: 'operator' as const, id: operator }
      : { kind: 'actor' as const, id: who.actor };
    const impl = tools.get(contract.name, contract.version)!;
    const notAllowed = { class: ErrorClass.CompensationNotAllowed };
    const { state: original, seq: originalSeq } = await store.load(who.tenant, operationIdOf(check.original));
    const originalImpl = original.status === 'none' ? undefined : tools.get(original.tool, original.version);
    // An operation the requester may not read is answered as one that does not exist, before
    // anything about its state is judged (the status endpoint's rule; an operator's grant covers
    // every tenant, as for confirmations).
    if (
      original.status !== 'none' &&
      !operator &&
      !(await readAllowed(originalImpl, who.tenant, who.actor, original, now()))
    )
      return refuse(compensationKey, { class: ErrorClass.NotFound }, ids);
    const declared = originalImpl && compensationOf(originalImpl.contract, check.original);
    // The compensating contract asked for must be the one the original's contract declares.
    if (declared && (declared.tool !== contract.name || declared.version !== contract.version))
      return refuse(compensationKey, notAllowed, ids);
    const verdict = compensationVerdict(originalImpl?.contract, original, now());
    if (verdict.kind === 'refuse') return refuse(compensationKey, verdict.error, ids);
    if (original.status === 'none' || !originalImpl || !declared) return refuse(compensationKey, notAllowed, ids);
    // A task with an operation a person has (a takeover, a failed compensation) takes no new side
    // effect, a compensation included, until it is resolved (FM-14, FM-20). A replay still answers.
    if (verdict.kind === 'request') {
      const frozen = frozenTaskRefusal(contract.effect, deps.frozen?.isFrozen(who.tenant, original.taskId) ?? false);
      if (frozen) return refuse(compensationKey, frozen, ids);
    }
    const compId = operationIdOf(compensationKey);
    const { state: comp } = await store.load(who.tenant, compId);
    // The same compensation again: its operation answers (FM-21) — once it is registered. A request
    // recorded on the original whose accept never followed (the process died between the two
    // appends, or only an earlier, refused attempt is there) is completed below instead of
    // answering that half-done state.
    const registered =
      verdict.kind === 'replay' && comp.status !== 'none' && compensationSettlement(original, comp).kind !== 'register';
    const call = await compensatingCall(store, subjects, original, originalImpl.contract, contract, check.reason).catch(
      (err: unknown) => {
        // The store or the server away: retried (nak). Anything else is the declaration's builder or
        // the compensating contract refusing what it built: not allowed.
        if (retryable(err)) throw err;
        l.warn({ err, operationKey: check.original }, "the compensation's input cannot be built from the original");
        return null;
      },
    );
    if (!call) return refuse(compensationKey, notAllowed, ids);
    // Every requester on record: an allowed request of a registered compensation is answered with
    // it, and recorded on the requester's decision subject with its reason's digest.
    const replayed = async (): Promise<void> => {
      await store.recordDecision(
        replayRecord(
          { ...who, submissionId },
          {
            eventId: newEventId(),
            at: now(),
            key: compensationKey,
            ...ids,
            requestedBy,
            reasonDigest: reasonDigestOf(check.reason),
          },
        ),
        compId,
      );
      l.info({ operationKey: compensationKey, compensates: check.original }, 'compensation asked again: replayed');
    };
    // The permission the declaration names, granted or refused by the compensating contract's policy.
    const authCtxAt = (phase: 'intake' | 'execution') => ({
      tenant: who.tenant,
      actor: who.actor,
      operationKey: compensationKey,
      phase,
      now: now(),
      compensates: {
        operationKey: check.original,
        permission: originalImpl.contract.compensation!.permission,
        requestedBy,
      },
    });
    if (registered) {
      // Each requester is authorised on its own: the replay goes only to one the policy allows now;
      // one it refuses gets that refusal under the compensation's key, and nothing of its state.
      const pv = await askPolicy(impl, call.input, authCtxAt('intake'), { now, invariants: false });
      if (pv.kind === 'refuse') return refuse(compensationKey, pv.error, ids, pv.authorization);
      return replayed();
    }
    const begun = deps.localExecutor?.()?.begin(contract.name, contract.version) ?? null;
    let handed = false;
    try {
      const pv = await askPolicy(impl, call.input, authCtxAt(begun ? 'execution' : 'intake'), { now });
      if (pv.kind === 'refuse') return refuse(compensationKey, pv.error, ids, pv.authorization);
      const { authorization, allowed } = pv;
      // The original was written through an alias (FM-10), so the input built from it names the
      // alias: registered under the compensating policy's canonical input, as any aliased write is,
      // with the built one as what was submitted. The executor's check at the execution instant then
      // compares like with like, and the input it builds again matches what was submitted.
      let canonical: ReturnType<typeof prepareCall> | null = null;
      if (allowed?.input) {
        try {
          canonical = prepareCall(contract, original.taskId, allowed.input);
        } catch (err) {
          l.error({ err }, 'the policy seam returned a canonical input the compensating contract refuses');
          throw err;
        }
      }
      const registered =
        canonical && canonical.inputDigest !== call.inputDigest
          ? {
              inputDigest: canonical.inputDigest,
              targetDigest: canonical.targetDigest,
              submitted: { operationKey: compensationKey, inputDigest: call.inputDigest },
            }
          : { inputDigest: call.inputDigest, targetDigest: call.targetDigest };
      // One compensation at a time, on the original's own chain.
      const requested = await handleCommand(
        store,
        who.tenant,
        operationIdOf(check.original),
        () => ({
          type: 'request_compensation',
          eventId: newEventId(),
          at: now(),
          compensation: {
            operationKey: compensationKey,
            tool: contract.name,
            version: contract.version,
            attempt: compensationAttemptFor(comp),
          },
          requestedBy,
          reasonDigest: reasonDigestOf(check.reason),
        }),
        { known: { state: original, seq: originalSeq } },
      );
      if (requested.kind === 'decided' && requested.decision.kind === 'skip') {
        const st = requested.decision.state;
        const same = st.status !== 'none' && st.compensation?.operationKey === compensationKey;
        if (!same) return refuse(compensationKey, notAllowed, ids);
      }
      const h = await handleCommand(
        store,
        who.tenant,
        compId,
        (): AcceptCommand => ({
          type: 'accept',
          eventId: newEventId(),
          at: now(),
          operationKey: compensationKey,
          tenant: who.tenant,
          actor: who.actor,
          taskId: original.taskId,
          tool: contract.name,
          version: contract.version,
          contractDigest: contract.digest,
          effect: contract.effect,
          ...registered,
          intentSeq: msg.seq,
          submissionId,
          authorization,
          compensates: { operationKey: check.original, tool: original.tool, version: original.version },
          ...(begun ? { start: { executor: begun.executor, deadlineAt: begun.deadlineAt, authorization } } : {}),
        }),
        { known: { state: { status: 'none' }, seq: 0 } },
      );
      if (h.kind !== 'appended') {
        // Registered meanwhile by another request: this one is answered with it, on record.
        const st = h.kind === 'decided' ? h.decision.state : undefined;
        if (st && st.status !== 'none' && st.intent.submissionId !== submissionId) await replayed();
        return;
      }
      l.info({ operationKey: compensationKey, compensates: check.original }, 'compensation accepted');
      answerOnItsWay();
      if (begun && h.event.state.status === 'running') {
        void begun.run({
          tenant: who.tenant,
          opId: compId,
          state: h.event.state,
          seq: h.seq,
          input: call.input,
          allowed: allowed ?? undefined,
        });
        handed = true;
      }
      return;
    } finally {
      if (!handed) begun?.cancel();
    }
  }

  /**
   * A confirmation or a discard of a held-back operation (docs/compensation.md "Held-back
   * commits"), by the actor of the intent subject. The operation is loaded (this tenant's only: its
   * subject is), judged (`confirmVerdict`, `discardVerdict`), and the contract's policy grants the
   * permission its `confirm` declares (`AuthorizationContext.confirms`); then `confirm` releases it
   * (the executor runs it from the event log, checked again at its execution instant for its
   * submitter) or `discard` ends it `rolled_back`. Confirming twice, or discarding twice, appends
   * nothing the second time. A confirmation is never started in this process: the check at the
   * execution instant is the submitter's, not the confirmer's. Every refusal is recorded under the
   * submission's own key (`keylessRefusalKey`), where the SDK reads it; the operation answers its
   * state as usual.
   */
  async function confirmOrDiscard(
    check: { kind: 'confirm' | 'discard'; operationKey: string },
    who: { tenant: string; actor: string },
    l: Logger,
    refuse: (
      key: string | null,
      error: ErrorInfo,
      ids: { tool?: string; version?: number },
      a?: AuthDecision,
    ) => Promise<Settlement | void>,
  ): Promise<Settlement | void> {
    const field = check.kind === 'confirm' ? 'confirms' : 'discards';
    const opId = operationIdOf(check.operationKey);
    const { state, seq } = await store.load(who.tenant, opId);
    if (state.status === 'none') return refuse(null, { class: ErrorClass.NotFound }, {});
    const ids = { tool: state.tool, version: state.version };
    const impl = tools.get(state.tool, state.version);
    // An operator's request (`tooltx confirm`, `tooltx discard`) arrives under `_op-<operator>`,
    // which only the operator request service may publish on, for an operator granted `confirm`:
    // that grant is the permission, and the policy is told so instead of being asked it of an agent.
    const operator = operatorOfActor(who.actor);
    const by = operator ? { kind: 'operator' as const, id: operator } : { kind: 'actor' as const, id: who.actor };
    // An operation the actor may not read is answered as one that does not exist: nothing about it
    // is revealed (the status endpoint's rule). A tenant's read policy knows its agents, not the
    // deployment's operators: an operator's grant covers every tenant's held operations, as its
    // compensate grant covers their committed ones.
    if (!operator && !(await readAllowed(impl, who.tenant, who.actor, state, now())))
      return refuse(null, { class: ErrorClass.NotFound }, {});
    const declared = impl?.contract.confirm;
    const invalid = (code: string, message: string): ErrorInfo => ({
      class: ErrorClass.InvalidInput,
      issues: [{ path: [field, 'operationKey'], code, message }],
    });
    if (!impl || !declared || !state.confirmation)
      return refuse(null, invalid('not_held_back', "the operation's contract holds nothing back"), ids);
    const verdict = check.kind === 'confirm' ? confirmVerdict(state, now()) : discardVerdict(state);
    switch (verdict.kind) {
      case 'refuse':
        return refuse(null, verdict.error, ids);
      case 'replay':
        // Confirmed (or rolled back) already: one run, one discard. The operation answers its state.
        return;
      case 'not_awaiting':
        // Still preparing: asked again shortly, once it waits (its prepare step is bounded by the
        // attempt's timeout).
        if (state.status === 'accepted' && state.confirmation.heldAt === undefined && !state.confirmation.confirmed)
          return { kind: 'nak', delayMs: 500 };
        if (state.confirmation.confirmed)
          return refuse(null, invalid('already_confirmed', 'the operation was confirmed: it may have run'), ids);
        // E.g. its prepare step refused it: it never waited, and nothing was sent.
        return refuse(
          null,
          invalid('not_awaiting', `the operation does not wait for a confirmation (${state.status})`),
          ids,
        );
      case 'expire':
      case 'confirm':
      case 'discard':
        break;
    }
    // The permission the contract declares, granted or refused by its policy, for this actor.
    const input = await intentInputOf(store, subjects, state, impl.contract);
    if (!input) {
      l.error({ operationKey: check.operationKey }, 'intent missing or does not match the registered digest');
      return refuse(null, { class: ErrorClass.Internal }, ids);
    }
    const pv = await askPolicy(
      impl,
      input,
      {
        tenant: who.tenant,
        actor: who.actor,
        operationKey: check.operationKey,
        phase: 'intake',
        now: now(),
        confirms: {
          operationKey: check.operationKey,
          permission: declared.permission,
          owner: state.actor,
          action: check.kind,
          requestedBy: by,
        },
      },
      { now, invariants: false },
    );
    if (pv.kind === 'refuse') return refuse(null, pv.error, ids, pv.authorization);
    const h = await handleCommand(
      store,
      who.tenant,
      opId,
      () =>
        check.kind === 'confirm'
          ? { type: 'confirm', eventId: newEventId(), at: now(), by, attempt: state.attempt }
          : { type: 'discard', eventId: newEventId(), at: now(), by, attempt: state.attempt },
      { known: { state, seq } },
    );
    const discarded = { class: ErrorClass.OperationDiscarded };
    if (h.kind === 'appended') {
      l.info({ operationKey: check.operationKey, event: h.event.type }, `held-back operation: ${h.event.type}`);
      // Rolled back: what its prepare step left downstream goes too, once the intent is settled.
      if (h.event.state.status === 'rolled_back') void discardPrepared(store, subjects, impl, h.event.state, l);
      // Asked too late: the hold ended at its deadline instead of running.
      if (h.event.type === 'confirmation_expired') return refuse(null, discarded, ids);
      return;
    }
    if (h.kind === 'decided' && h.decision.kind === 'skip') {
      if (h.decision.reason === 'discarded') return refuse(null, discarded, ids);
      if (h.decision.reason === 'confirmed')
        return refuse(null, invalid('already_confirmed', 'the operation was confirmed: it may have run'), ids);
    }
  }

  async function handle(
    msg: JsMsg,
    intake: IntakeOutcome,
    who: { tenant: string; actor: string },
    submissionId: string,
    answerOnItsWay: () => void,
  ): Promise<Settlement | void> {
    const l = log.child({ tenant: who.tenant, actor: who.actor, intentSeq: msg.seq });

    const refuse = (
      key: string | null,
      error: ErrorInfo,
      ids: { tool?: string; version?: number },
      authorization?: AuthDecision,
    ) => recordRefusal(msg, who, submissionId, l, key, error, ids, authorization);

    if (intake.kind === 'term') {
      // Bytes that are not msgpack: refused with no key known, recorded under the submission's.
      l.warn({ class: intake.error.class, submissionId, bytes: msg.data.byteLength }, 'intent is not msgpack: refused');
      return (await refuse(null, intake.error, {})) ?? { kind: 'term', reason: intake.reason };
    }

    const check = intake.check;
    if (check.kind === 'refuse')
      return refuse(check.decisionKey, check.error, { tool: check.tool, version: check.version });
    if (check.kind === 'compensate') return compensate(msg, check, who, submissionId, l, refuse, answerOnItsWay);
    if (check.kind === 'confirm' || check.kind === 'discard') return confirmOrDiscard(check, who, l, refuse);
    // An operator's token carries compensation, confirmation and discard requests only: nothing
    // else is ever run for one.
    if (operatorOfActor(who.actor) !== null)
      return refuse(
        check.prepared.operationKey,
        { class: ErrorClass.Forbidden },
        { tool: check.contract.name, version: check.contract.version },
      );

    const { contract, prepared, envelope } = check;
    const key = prepared.operationKey;
    const ids = { tool: contract.name, version: contract.version };
    const impl = tools.get(contract.name, contract.version)!;
    // A retired or withdrawn version takes no new operation (docs/contracts.md), decided from the
    // registry in memory; only then is the key looked up, so that a registered key still answers
    // its original outcome (its resubmission goes on as any other).
    if (deps.registry) {
      const admission = contractAdmission(deps.registry, contract.name, contract.version, now());
      if (admission.kind === 'refuse') {
        const { state } = await store.load(who.tenant, operationIdOf(key));
        if (state.status === 'none') return refuse(key, admission.error, ids);
      }
    }
    // The authorizer's part of the caller's trace (the intent's headers carry its context), when
    // tracing is on: the accepted event stores this span's context for the executor's span.
    const span = startSpan(
      `tooltx.authorize ${contract.name}`,
      SpanKind.CONSUMER,
      toolSpanAttributes({
        tool: contract.name,
        version: contract.version,
        effect: contract.effect,
        operationKey: key,
      }),
      contextOfHeaders(msg.headers),
    );
    let spanState = 'unknown';
    let spanError: string | undefined;
    const refuseTraced: typeof refuse = (k, error, i, authorization) => {
      spanState = 'rejected';
      spanError = error.class;
      return refuse(k, error, i, authorization);
    };
    try {
      return await accept(refuseTraced, span);
    } finally {
      endSpan(span, spanState, spanError);
    }

    async function accept(refuse: typeof refuseTraced, span: Span): Promise<Settlement | void> {
      // Run here at once when this process's executor has room: the policy check below is then the one
      // at the execution instant, and the start goes into the same append as the acceptance. A slot
      // not handed over is given back however this ends.
      // A held-back contract is accepted alone, never started with it: the executor runs its prepare
      // step from the event log and holds it there until someone confirms it.
      const heldBack = contract.confirm !== undefined;
      const begun = heldBack ? null : (deps.localExecutor?.()?.begin(contract.name, contract.version) ?? null);
      let handed = false;
      try {
        // Policy seam, then the business invariants: before anything about the key is looked up or revealed.
        // Started here at once: this check is the one at the execution instant (FM-07, FM-08). A
        // dependency of the policy being down is not a refusal: the intent is retried later.
        const phase = begun ? ('execution' as const) : ('intake' as const);
        const verdict = await askPolicy(
          impl,
          prepared.input,
          { tenant: who.tenant, actor: who.actor, operationKey: key, phase, now: now() },
          { now },
        );
        if (verdict.kind === 'refuse') return refuse(key, verdict.error, ids, verdict.authorization);
        const { authorization, allowed } = verdict;
        const canonicalInput = allowed?.input;

        // A task with an operation under takeover takes no new side effect until a person resolves it
        // (FM-14). Before the lookup, so nothing about the key is revealed or registered.
        const frozen = frozenTaskRefusal(contract.effect, deps.frozen?.isFrozen(who.tenant, envelope.taskId) ?? false);
        if (frozen) return refuse(key, frozen, ids);

        // Two references to one resource are one operation (FM-10): a submission that named its target
        // through an alias is registered under the canonical input's key, and its own key is recorded
        // as an alias of that one (before the registration, so status can always follow it).
        let canonical: ReturnType<typeof prepareCall> | null = null;
        if (canonicalInput) {
          try {
            canonical = prepareCall(contract, envelope.taskId, canonicalInput);
          } catch (err) {
            l.error({ err }, 'the policy seam returned a canonical input the contract refuses');
            throw err;
          }
        }
        const { registered, submitted } = registrationOf(prepared, canonical);
        if (submitted && canonical) {
          await store.recordDecision(
            aliasRecord(
              { ...who, submissionId },
              {
                eventId: newEventId(),
                at: now(),
                key,
                inputDigest: prepared.inputDigest,
                canonicalKey: canonical.operationKey,
                canonicalInputDigest: canonical.inputDigest,
                ...ids,
              },
            ),
            operationIdOf(key),
          );
        }

        const opId = operationIdOf(registered.operationKey);
        const traceparent = traceparentOf(span);
        // Most keys are new: registered optimistically at sequence 0 (a known key refuses the append,
        // and the handler reads it and replays or reports the conflict as usual).
        const h = await handleCommand(
          store,
          who.tenant,
          opId,
          (): AcceptCommand => ({
            type: 'accept',
            eventId: newEventId(),
            at: now(),
            operationKey: registered.operationKey,
            tenant: who.tenant,
            actor: who.actor,
            taskId: envelope.taskId,
            tool: contract.name,
            version: contract.version,
            contractDigest: contract.digest,
            effect: contract.effect,
            inputDigest: registered.inputDigest,
            targetDigest: registered.targetDigest,
            intentSeq: msg.seq,
            submissionId,
            ...(submitted ? { submitted } : {}),
            authorization,
            ...(begun ? { start: { executor: begun.executor, deadlineAt: begun.deadlineAt, authorization } } : {}),
            ...(heldBack ? { awaitsConfirmation: true as const } : {}),
            ...(traceparent ? { traceparent } : {}),
          }),
          { known: { state: { status: 'none' }, seq: 0 } },
        );
        spanState =
          h.kind === 'appended' ? h.event.state.status : h.kind === 'decided' ? h.decision.state.status : spanState;
        if (h.kind === 'appended') {
          // Debug: one line per call is a synchronous write per call at info; the audit record holds it.
          l.debug(
            {
              operationKey: registered.operationKey,
              ...(submitted ? { submittedKey: key } : {}),
              attempt: h.event.attempt,
              tool: contract.id,
            },
            'accepted',
          );
          answerOnItsWay();
          if (begun && h.event.state.status === 'running') {
            // Handed over: the executor of this process runs it now; the intent is acked meanwhile (the
            // log holds the start: a crash from here on is the reconciler's to verify, FM-27).
            void begun.run({
              tenant: who.tenant,
              opId,
              state: h.event.state,
              seq: h.seq,
              input: prepared.input,
              allowed: allowed ?? undefined,
            });
            handed = true;
          }
          return;
        }
        if (h.kind === 'moved_on') return;
        const d = h.decision;
        switch (d.kind) {
          case 'conflict':
            return refuse(key, IDEMPOTENCY_CONFLICT, ids);
          case 'replay':
          case 'applied':
            l.debug({ operationKey: key, state: d.state.status }, 'known key: nothing new');
            // A committed key's answer is final: pushed as the status endpoint would give it, after
            // the ack (the read policy and a result read may take round trips); "poll now" otherwise.
            if (d.state.status === 'committed' && d.state.receipt && deps.pusher) {
              answerOnItsWay();
              void pushCommitted(
                deps.pusher,
                who,
                submissionId,
                impl,
                key,
                { ...d.state, receipt: d.state.receipt },
                h.seq,
              );
            }
            return;
          case 'skip':
            return;
        }
      } finally {
        if (!handed) begun?.cancel();
      }
    }
  }
}
