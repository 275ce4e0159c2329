import type { KV } from '@nats-io/kv';
import { operationIdOf } from '@tooltx/contracts';
import {
  freezeBacked,
  handleCommand,
  takeoverOpenable,
  takeoverRecordOf,
  type OperationStore,
  type TakeoverRecord,
} from '@tooltx/lifecycle';
import { newEventId } from '@tooltx/nats';
import { freezeTask, thawTask, type FrozenTaskWatch } from '@tooltx/runtime';
import type { Logger } from '@tooltx/runtime';

/**
 * Takeover (FM-14): after a timeout the outcome is verified before acting; when evidence runs
 * out, the operation becomes a person's. Order of writes: the task is frozen FIRST, then the
 * takeover record is appended — so nobody can see a takeover whose task still takes side effects.
 * A person's resolution (the takeover service, `@tooltx/readside`) is appended first and the task
 * thawed after; a thaw lost to a crash is repaired by {@link repairFreezes}.
 */
export interface TakeoverDeps {
  store: OperationStore;
  /** The frozen-task bucket. */
  tasks: KV;
  log: Logger;
  now?: () => number;
}

/**
 * Opens a takeover on an `unknown` operation (idempotent: a second call finds it open). `probed`
 * (for `probe_mismatch`): what the probe found under our key — its resource id and the input digest
 * the downstream recorded — kept in the record as `probed`. Returns
 * false when the operation is no longer `unknown` or another writer moved it meanwhile.
 * Throws the store's and the KV's errors.
 */
export async function openTakeover(
  d: TakeoverDeps,
  tenant: string,
  opId: string,
  why: { reason: TakeoverRecord['reason']; probes: number; probed?: TakeoverRecord['probed'] },
): Promise<boolean> {
  const now = d.now ?? Date.now;
  const { state, seq } = await d.store.load(tenant, opId);
  const openable = takeoverOpenable(state);
  if (openable !== 'open' || state.status === 'none') return openable === 'already';
  const openedAt = now();
  const takeover = takeoverRecordOf(state, why, openedAt);
  await freezeTask(d.tasks, tenant, state.taskId, state.operationKey, openedAt);
  const h = await handleCommand(
    d.store,
    tenant,
    opId,
    () => ({ type: 'open_takeover', eventId: newEventId(), at: openedAt, attempt: state.attempt, takeover }),
    { known: { state, seq }, retry: false },
  );
  if (h.kind !== 'appended') return false;
  d.log.error(
    {
      tenant,
      operationKey: state.operationKey,
      taskId: state.taskId,
      reason: why.reason,
      probes: why.probes,
      ...(why.probed ? { probedResourceId: why.probed.resourceId } : {}),
    },
    'takeover opened: the task is frozen until a person resolves it',
  );
  return true;
}

/**
 * Thaws freezes that no open takeover backs any more (a resolution whose thaw was lost, or a
 * takeover append that lost its race). A freeze is thawed only once this process has seen it for
 * `graceMs` on its own monotonic clock (`seen`, kept by the caller across sweeps): its takeover
 * append may still be on its way, and the time the freeze carries was written by another process,
 * whose clock may disagree with this one by any amount (docs/clocks.md).
 */
export async function repairFreezes(
  d: TakeoverDeps,
  frozen: Pick<FrozenTaskWatch, 'entries'>,
  seen: Map<string, number>,
  o: { graceMs?: number; elapsed?: () => number } = {},
): Promise<number> {
  const graceMs = o.graceMs ?? 60_000;
  const elapsed = o.elapsed ?? (() => performance.now());
  const current = new Set<string>();
  let thawed = 0;
  for (const task of frozen.entries()) {
    for (const key of Object.keys(task.frozenBy)) {
      const id = `${task.tenant}/${task.taskId}/${key}`;
      current.add(id);
      const since = seen.get(id) ?? elapsed();
      seen.set(id, since);
      if (elapsed() - since < graceMs) continue;
      const { state } = await d.store.load(task.tenant, operationIdOf(key));
      if (freezeBacked(state)) continue;
      await thawTask(d.tasks, task.tenant, task.taskId, key);
      seen.delete(id);
      thawed++;
      d.log.info(
        { tenant: task.tenant, operationKey: key, taskId: task.taskId },
        'freeze without an open takeover thawed',
      );
    }
  }
  for (const id of [...seen.keys()]) if (!current.has(id)) seen.delete(id);
  return thawed;
}
