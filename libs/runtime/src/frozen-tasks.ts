import { createHash } from 'node:crypto';
import type { KV } from '@nats-io/kv';
import { z } from 'zod';
import { OPERATION_KEY_PATTERN } from '@tooltx/contracts';
import type { Logger } from 'pino';
import { decode, encode, KvMirror } from '@tooltx/nats';

/**
 * Frozen tasks (FM-14: still unknown past the deadline → a takeover record, and the dependent
 * writes frozen). A task is frozen while at least one of its
 * operations is under takeover; every side-effecting intent of a frozen task is refused with
 * `task_frozen` at the authorizer and again by the executor right before `running`.
 *
 * Storage: KV `<prefix>_tasks`, key `<tenant>.<taskToken>` (taskToken = the first 32 hex digits of
 * SHA-256 of the task id: a task id is free text, a key token is not), value
 * `{ tenant, taskId, frozenBy: { <operationKey>: <openedAt ms> } }` (msgpack). Writers use
 * compare-and-set on the entry's revision; readers keep one watch of the bucket in memory.
 */

export const frozenTaskSchema = z.object({
  tenant: z.string(),
  taskId: z.string(),
  /** Operation key → when its takeover was opened (ms since the epoch). */
  frozenBy: z.record(z.string().regex(OPERATION_KEY_PATTERN), z.number().int().nonnegative()),
});
export type FrozenTask = z.infer<typeof frozenTaskSchema>;

/** The bucket key of a task: `<tenant>.<32 hex>`. */
export function taskKeyOf(tenant: string, taskId: string): string {
  return `${tenant}.${createHash('sha256').update(taskId, 'utf8').digest('hex').slice(0, 32)}`;
}

const CAS_ROUNDS = 16;

async function update(kv: KV, key: string, change: (cur: FrozenTask | null) => FrozenTask | null): Promise<void> {
  for (let round = 0; round < CAS_ROUNDS; round++) {
    const entry = await kv.get(key);
    const live = entry && entry.operation === 'PUT' && entry.length > 0 ? decode(frozenTaskSchema, entry.value) : null;
    const next = change(live);
    if (next === live) return;
    try {
      if (next === null) {
        await kv.delete(key, { previousSeq: entry!.revision });
      } else if (entry) {
        await kv.update(key, encode(next), entry.revision);
      } else {
        await kv.create(key, encode(next));
      }
      return;
    } catch (err) {
      // Another writer changed the entry between our read and our write: read again.
      if (round === CAS_ROUNDS - 1) throw err;
    }
  }
}

/**
 * Freezes `taskId` of `tenant` on behalf of `operationKey` (idempotent). Throws the KV's errors
 * when the bucket cannot be written after {@link CAS_ROUNDS} compare-and-set rounds.
 */
export async function freezeTask(
  kv: KV,
  tenant: string,
  taskId: string,
  operationKey: string,
  openedAt: number,
): Promise<void> {
  await update(kv, taskKeyOf(tenant, taskId), (cur) => {
    if (cur?.frozenBy[operationKey] !== undefined) return cur;
    return { tenant, taskId, frozenBy: { ...(cur?.frozenBy ?? {}), [operationKey]: openedAt } };
  });
}

/** Removes `operationKey` from the task's freezes; the task thaws when none is left (idempotent). */
export async function thawTask(kv: KV, tenant: string, taskId: string, operationKey: string): Promise<void> {
  await update(kv, taskKeyOf(tenant, taskId), (cur) => {
    if (!cur || cur.frozenBy[operationKey] === undefined) return cur;
    const { [operationKey]: _gone, ...rest } = cur.frozenBy;
    return Object.keys(rest).length ? { ...cur, frozenBy: rest } : null;
  });
}

/** Every frozen task of the bucket (a snapshot read; for operators' listings, not the hot path). */
export async function listFrozenTasks(kv: KV): Promise<FrozenTask[]> {
  const out: FrozenTask[] = [];
  for await (const k of await kv.keys()) {
    const e = await kv.get(k);
    if (e && e.operation === 'PUT' && e.length > 0) out.push(decode(frozenTaskSchema, e.value));
  }
  return out;
}

/**
 * The frozen tasks in memory, fed by one long-lived watch of the bucket ({@link KvMirror}: no round
 * trip per intent). A freeze is written before its takeover record is appended, so by the time
 * anyone can see the takeover the freeze is on its way to every watcher; the executor's re-check
 * before `running` closes the remaining window for intents accepted meanwhile.
 */
export class FrozenTaskWatch {
  readonly #mirror: KvMirror<FrozenTask>;

  constructor(kv: KV, log: Logger) {
    this.#mirror = new KvMirror(kv, frozenTaskSchema, { log, what: 'frozen-task' });
  }

  /** Starts watching; resolves once the current entries are loaded. */
  start(): Promise<void> {
    return this.#mirror.start();
  }

  /** True while `taskId` of `tenant` has an operation under takeover. */
  isFrozen(tenant: string, taskId: string): boolean {
    return this.#mirror.map.has(taskKeyOf(tenant, taskId));
  }

  /** A snapshot of every frozen task known to this watch. */
  entries(): FrozenTask[] {
    return [...this.#mirror.map.values()];
  }

  stop(): Promise<void> {
    return this.#mirror.stop();
  }
}
