import { downstreamKeyOf, type Implementation } from '@tooltx/contracts';
import type { OperationRecord, OperationStore } from '@tooltx/lifecycle';
import type { Subjects } from '@tooltx/nats';
import { intentInputOf } from './compensation.js';
import type { Logger } from './logger.js';

/**
 * Drops what a held-back operation's prepare step left downstream (a draft) once it ended
 * `rolled_back`, through the implementation's `discard` step, under the operation's downstream
 * key. Best effort: nothing external happened either way, and a rolled-back operation never runs,
 * so what is left can never be sent by tooltx; a failure is logged. Never throws.
 */
export async function discardPrepared(
  store: OperationStore,
  subjects: Subjects,
  impl: Implementation | undefined,
  state: OperationRecord,
  log: Logger,
  timeoutMs = 5_000,
): Promise<void> {
  if (!impl?.discard || state.status !== 'rolled_back') return;
  try {
    const input = await intentInputOf(store, subjects, state, impl.contract);
    if (!input) return;
    await impl.discard(input, {
      tenant: state.tenant,
      actor: state.actor,
      operationKey: state.operationKey,
      downstreamKey: downstreamKeyOf(state.tenant, state.operationKey),
      attempt: state.attempt,
      inputDigest: state.inputDigest,
      deadlineAt: Date.now() + timeoutMs,
      signal: AbortSignal.timeout(timeoutMs),
    });
  } catch (err) {
    log.warn(
      { err, operationKey: state.operationKey },
      'the prepared draft of a rolled-back operation was not discarded',
    );
  }
}
