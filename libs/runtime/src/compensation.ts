import {
  compensatingInput,
  operationIdOf,
  prepareCall,
  type Contract,
  type Implementation,
  type PreparedCall,
} from '@tooltx/contracts';
import {
  compensationEnvelopeSchema,
  compensationOutcomeOf,
  compensationSettlement,
  handleCommand,
  intentEnvelopeSchema,
  type OperationCommand,
  type OperationRecord,
  type OperationState,
  type OperationStore,
} from '@tooltx/lifecycle';
import { decodeRaw, newEventId, type Subjects } from '@tooltx/nats';

/**
 * What compensation needs of the event log beyond one operation's own events (docs/compensation.md):
 * the original's normalised input, read back from its intent; a compensation's input, built again
 * from the original and the request's reason; and the link that moves the original when its
 * compensation ends. Shared by the authorizer, the executor and the reconciler.
 */

/**
 * The normalised input of the operation in `state`, read back from the intent its current attempt
 * names and checked against the registered key and input digest (of the submission, for one that
 * named its target through an alias: FM-10). Null when the intent is gone, is another tenant's, or
 * does not match.
 */
export async function intentInputOf(
  store: OperationStore,
  subjects: Subjects,
  state: OperationRecord,
  contract: Contract,
): Promise<Record<string, unknown> | null> {
  const stored = await store.readIntent(state.tenant, state.intent.seq);
  if (!stored) return null;
  const who = subjects.parseActorSubject('intent', stored.subject);
  if (!who || who.tenant !== state.tenant) return null;
  try {
    const envelope = intentEnvelopeSchema.parse(decodeRaw(stored.data));
    const prepared = prepareCall(contract, envelope.taskId, envelope.input);
    const own = state.intent.submitted ?? { operationKey: state.operationKey, inputDigest: state.inputDigest };
    if (prepared.inputDigest !== own.inputDigest || prepared.operationKey !== own.operationKey) return null;
    return prepared.input;
  } catch {
    return null;
  }
}

/**
 * The compensating call for `original` (committed, of `originalContract`) and `reason`: the
 * declaration's input built from the original's input and receipt, parsed and digested by the
 * compensating contract under the original's task. Null when the original's input cannot be read
 * back. Throws what the declaration's builder or the compensating contract's parse throws.
 */
export async function compensatingCall(
  store: OperationStore,
  subjects: Subjects,
  original: OperationRecord,
  originalContract: Contract,
  compensating: Contract,
  reason: string,
): Promise<PreparedCall | null> {
  const r = original.receipt;
  if (!r) return null;
  const input = await intentInputOf(store, subjects, original, originalContract);
  if (!input) return null;
  const built = compensatingInput(
    originalContract,
    {
      input,
      receipt: {
        tenant: original.tenant,
        operationKey: original.operationKey,
        tool: original.tool,
        version: original.version,
        resourceId: r.resourceId,
        resultDigest: r.resultDigest,
        committedAt: r.committedAt,
      },
    },
    reason,
  );
  return prepareCall(compensating, original.taskId, built);
}

/**
 * The input of the compensation operation in `state` (`state.compensates` set), built again from
 * its request's reason (read from its intent) and the original, and checked against the digest it
 * was built with at intake (`intent.submitted` when it was registered under the compensating
 * policy's canonical input, else its registered one). Null when anything of that is gone or differs.
 */
export async function compensationInputOf(
  store: OperationStore,
  subjects: Subjects,
  state: OperationRecord,
  impl: Implementation,
  find: (tool: string, version: number) => Implementation | undefined,
): Promise<Record<string, unknown> | null> {
  const link = state.compensates;
  if (!link) return null;
  const stored = await store.readIntent(state.tenant, state.intent.seq);
  if (!stored) return null;
  const who = subjects.parseActorSubject('intent', stored.subject);
  if (!who || who.tenant !== state.tenant) return null;
  try {
    const request = compensationEnvelopeSchema.parse(decodeRaw(stored.data));
    const { state: original } = await store.load(state.tenant, operationIdOf(link.operationKey));
    if (original.status === 'none') return null;
    const originalImpl = find(original.tool, original.version);
    if (!originalImpl) return null;
    const call = await compensatingCall(
      store,
      subjects,
      original,
      originalImpl.contract,
      impl.contract,
      request.compensates.reason,
    );
    // Registered under the compensating policy's canonical input when it named one (an alias of
    // the original's reference, FM-10): the input built here is then the submitted one.
    const built = state.intent.submitted?.inputDigest ?? state.inputDigest;
    return call && call.inputDigest === built ? call.input : null;
  } catch {
    return null;
  }
}

/**
 * Moves the original of the compensation operation in `state` once that compensation has an
 * outcome (`compensationOutcomeOf`): `compensated` with the compensation's receipt, or
 * `compensation_failed`, or back to `committed` when it was refused before it ran — only when the
 * original waits for this attempt of it (`compensationSettlement`: `link`; the command names the
 * attempt, and the decider skips it on an original that asked for another). Idempotent (a second
 * call is a replay or a skip of the decider), so every consumer of the log may call it on every
 * event of a compensation, and the reconciler's sweep on an original left waiting. Returns what it
 * appended, or null.
 */
export async function linkCompensation(
  store: OperationStore,
  state: OperationState,
  o: {
    now?: () => number;
    /**
     * Freezes the original's task before `compensation_failed` is appended (FM-20: the task's
     * later steps stop until a person has it; the same order as a takeover's, so nobody sees the
     * failure while the task still takes side effects).
     */
    freeze?: (tenant: string, taskId: string, operationKey: string, at: number) => Promise<void>;
  } = {},
): Promise<OperationCommand['type'] | null> {
  if (state.status === 'none' || !state.compensates) return null;
  const outcome = compensationOutcomeOf(state);
  if (outcome.kind === 'pending') return null;
  const now = o.now ?? Date.now;
  const compensationKey = state.operationKey;
  const originalId = operationIdOf(state.compensates.operationKey);
  // Only an original waiting for this very attempt is moved (a late event of an earlier attempt is
  // not its outcome), and its task is frozen only then.
  const original = await store.load(state.tenant, originalId);
  if (compensationSettlement(original.state, state).kind !== 'link') return null;
  if (outcome.kind === 'fail') await o.freeze?.(state.tenant, state.taskId, state.compensates.operationKey, now());
  const make = (): OperationCommand => {
    // Tied to this state's attempt: the decider skips it on an original that asked for another.
    const base = { eventId: newEventId(), at: now(), compensationKey, compensationAttempt: state.attempt };
    switch (outcome.kind) {
      case 'complete':
        return { type: 'complete_compensation', ...base, receipt: outcome.receipt };
      case 'fail':
        return {
          type: 'fail_compensation',
          ...base,
          kind: outcome.failure,
          ...(outcome.error ? { error: outcome.error } : {}),
          ...(outcome.evidence ? { evidence: outcome.evidence } : {}),
        };
      case 'refuse':
        return { type: 'refuse_compensation', ...base, error: outcome.error };
    }
  };
  const h = await handleCommand(store, state.tenant, originalId, make, { known: original });
  return h.kind === 'appended' ? make().type : null;
}
