import type { KV } from '@nats-io/kv';
import type { z } from 'zod';
import { ConcurrencyError, type OperationEvent } from '@tooltx/lifecycle';
import { CodecError, decode, encode, isWrongLastSequence } from '@tooltx/nats';
import type { ProjectionGuard } from './projection-rebuild.js';

/**
 * KV projections of the event log: one entry per operation, written with compare-and-set
 * on the entry's KV revision, so any number of projector instances and any redelivery order can
 * never move an entry backwards. The rule itself ("is this event newer than the entry?") is a pure
 * function of the service; this file is the shell around it: read → apply → create/update under
 * the read revision → on a CAS conflict read again.
 */

/**
 * The rule of one projection: the next entry after `event` (stored at stream sequence `seq`), or
 * `null` when the event changes nothing (already applied, or older than the entry).
 */
export type ProjectionRule<T> = (current: T | null, event: OperationEvent, seq: number) => T | null;

/** What one apply did: wrote a new revision, or left the entry as it was. `conflicts` = CAS retries. */
export type ProjectionOutcome =
  | { kind: 'written'; revision: number; conflicts: number }
  | { kind: 'unchanged'; conflicts: number };

/**
 * The stored entry is not a valid value of the projection's schema. Never overwritten blindly: the
 * message is nak'ed with backoff and logged as an error until a person looks.
 */
export class ProjectionCorruptError extends Error {
  readonly key: string;
  constructor(key: string, opts?: ErrorOptions) {
    super(`projection entry ${key} does not match its schema`, opts);
    this.name = 'ProjectionCorruptError';
    this.key = key;
  }
}

const MAX_CAS_ROUNDS = 16;

/**
 * The last entry this process wrote or read per key (value and KV revision), so the next event of
 * the same operation is applied without a read (a read per event was 2 of the ~93 NATS
 * messages of a call, per projection). Bounded, oldest first out. A stale entry costs nothing but
 * a CAS conflict: the write names the cached revision, the server refuses it, we read and retry.
 */
export class ProjectionCache<T> {
  readonly #max: number;
  readonly #m = new Map<string, { value: T | null; revision: number }>();
  constructor(max = 10_000) {
    this.#max = max;
  }
  get(key: string): { value: T | null; revision: number } | undefined {
    return this.#m.get(key);
  }
  set(key: string, value: T | null, revision: number): void {
    this.#m.delete(key);
    this.#m.set(key, { value, revision });
    if (this.#m.size > this.#max) this.#m.delete(this.#m.keys().next().value as string);
  }
  drop(key: string): void {
    this.#m.delete(key);
  }
  clear(): void {
    this.#m.clear();
  }
}

/**
 * Applies `apply` to the entry under `key` with compare-and-set: `kv.create` when there is no
 * entry (expected last subject sequence 0), `kv.update(key, value, revision)` otherwise. A CAS
 * conflict (JetStream 10071: another instance wrote in between) reloads and applies again, up to
 * 16 rounds, then throws {@link ConcurrencyError} (the consumer loop naks with backoff). Values are
 * msgpack, parsed with `schema` on read; an unparsable entry throws {@link ProjectionCorruptError}.
 * With a `cache`, the first round applies to the cached entry (or, for a key never seen, to none:
 * an optimistic `create`) and reads only after a conflict.
 */
export async function projectEntry<T>(opts: {
  kv: KV;
  key: string;
  schema: z.ZodType<T>;
  apply: (current: T | null) => T | null;
  cache?: ProjectionCache<T>;
}): Promise<ProjectionOutcome> {
  const { kv, key, schema, apply, cache } = opts;
  let conflicts = 0;
  let lastRevision = 0;
  let cached = cache ? (cache.get(key) ?? { value: null, revision: 0 }) : undefined;
  for (let round = 0; round < MAX_CAS_ROUNDS; round++) {
    let current: T | null = null;
    let revision = 0;
    if (cached) {
      ({ value: current, revision } = cached);
      cached = undefined;
    } else {
      const entry = await kv.get(key);
      // An entry that was deleted or purged by hand still has a revision to compare against.
      revision = entry?.revision ?? 0;
      if (entry && entry.operation === 'PUT') {
        try {
          current = decode(schema, entry.value);
        } catch (err) {
          if (err instanceof CodecError) throw new ProjectionCorruptError(key, { cause: err });
          throw err;
        }
      }
      cache?.set(key, current, revision);
    }
    const next = apply(current);
    if (next === null) return { kind: 'unchanged', conflicts };
    lastRevision = revision;
    try {
      const written = revision ? await kv.update(key, encode(next), revision) : await kv.create(key, encode(next));
      cache?.set(key, next, written);
      return { kind: 'written', revision: written, conflicts };
    } catch (err) {
      if (!isWrongLastSequence(err)) throw err;
      conflicts++;
      cache?.drop(key);
    }
  }
  throw new ConcurrencyError(key, lastRevision);
}

/**
 * One projection's writer in this process: {@link projectEntry} with a {@link ProjectionCache}, and
 * the applies of one key run one after another here (so the events of one operation, delivered
 * concurrently to this instance, never race each other into CAS conflicts; other instances still
 * can, which the CAS resolves). With the cache, an operation's entry costs one KV write per event
 * and no read.
 *
 * With a `guard` (the bucket on memory storage, rebuilt when lost: projection-rebuild.ts), every
 * apply waits until the bucket is whole, forgets the cache when the bucket was rebuilt since (its
 * revisions are of the old bucket: a coinciding one would let a stale value through the CAS), and a
 * write that fails because the bucket is gone is tried once more after the rebuild.
 */
export class ProjectionApplier<T> {
  readonly #kv: KV;
  readonly #schema: z.ZodType<T>;
  readonly #cache: ProjectionCache<T>;
  readonly #chains = new Map<string, Promise<unknown>>();
  readonly #guard: ProjectionGuard | undefined;
  #epoch = 0;
  constructor(kv: KV, schema: z.ZodType<T>, cacheEntries = 10_000, guard?: ProjectionGuard) {
    this.#kv = kv;
    this.#schema = schema;
    this.#cache = new ProjectionCache<T>(cacheEntries);
    this.#guard = guard;
    this.#epoch = guard?.epoch ?? 0;
  }
  /** Applies `apply` to the entry under `key` after the pending work on that key; throws what {@link projectEntry} throws. */
  apply(key: string, apply: (current: T | null) => T | null): Promise<ProjectionOutcome> {
    return this.inOrder(key, () => this.applyNow(key, apply));
  }

  /** {@link apply} without waiting for the key's pending work: only from inside {@link inOrder} of that key. */
  async applyNow(key: string, apply: (current: T | null) => T | null): Promise<ProjectionOutcome> {
    const g = this.#guard;
    const once = () => projectEntry({ kv: this.#kv, key, schema: this.#schema, cache: this.#cache, apply });
    if (!g) return once();
    for (let round = 0; ; round++) {
      await g.ready();
      if (g.epoch !== this.#epoch) {
        this.#cache.clear();
        this.#epoch = g.epoch;
      }
      try {
        return await once();
      } catch (err) {
        if (round > 0 || !(await g.lost(err))) throw err;
      }
    }
  }

  /** Runs `fn` after the pending work on `key` in this process (and before any work queued later). */
  async inOrder<R>(key: string, fn: () => Promise<R>): Promise<R> {
    const prev = this.#chains.get(key) ?? Promise.resolve();
    const run = prev.catch(() => undefined).then(fn);
    this.#chains.set(key, run);
    try {
      return await run;
    } finally {
      if (this.#chains.get(key) === run) this.#chains.delete(key);
    }
  }

  /** The entry this process last wrote or read under `key` (`undefined`: not known here). */
  cached(key: string): T | null | undefined {
    return this.#cache.get(key)?.value;
  }

  /** Drops `key` from the cache (its next apply reads the store first, or creates optimistically). */
  forget(key: string): void {
    this.#cache.drop(key);
  }
}

/**
 * Batches one projection's writes per key: the applies of an operation's in-flight
 * events wait, unacked, until its final event (or `delayMs`), then go to the store as ONE
 * compare-and-set write — one KV write per operation instead of one per event. The entry after a
 * batch equals the entry after the same applies one by one (they are folded in arrival order; the
 * projection rules order by stream sequence themselves). An entry is visible up to `delayMs` late.
 *
 * Use from a consumer-loop handler: `{ kind: 'defer', settled: batch.add(key, apply, false) }` for
 * an in-flight event, `await batch.add(key, apply, true)` for a final one. A final batch's entry
 * leaves the cache once written (memory stays flat with the number of operations). At most `maxHeld` keys
 * wait at once (beyond it the oldest batch is written early): keep `maxHeld × events per key +
 * concurrency` below the durable's `max_ack_pending` (NATS docs, JetStream "Consumers").
 */
export class ProjectionBatcher<T> {
  readonly #applier: ProjectionApplier<T>;
  readonly #delayMs: number;
  readonly #maxHeld: number;
  readonly #batches = new Map<
    string,
    {
      applies: ((current: T | null) => T | null)[];
      final: boolean;
      waiters: { resolve: (o: ProjectionOutcome) => void; reject: (e: unknown) => void }[];
      timer: NodeJS.Timeout;
    }
  >();
  #flushing = false;

  constructor(applier: ProjectionApplier<T>, o: { delayMs: number; maxHeld: number }) {
    this.#applier = applier;
    this.#delayMs = o.delayMs;
    this.#maxHeld = o.maxHeld;
  }

  /** Keys waiting right now. */
  get held(): number {
    return this.#batches.size;
  }

  /**
   * Adds `apply` to `key`'s batch; `final` (or `delayMs` 0, or after {@link flush}) writes the batch
   * now. Resolves with the batch's outcome once it is written; rejects with what the write threw.
   */
  add(key: string, apply: (current: T | null) => T | null, final: boolean): Promise<ProjectionOutcome> {
    let b = this.#batches.get(key);
    if (!b) {
      b = { applies: [], final: false, waiters: [], timer: setTimeout(() => void this.#write(key), this.#delayMs) };
      this.#batches.set(key, b);
      if (this.#batches.size > this.#maxHeld) void this.#write(this.#batches.keys().next().value as string);
    }
    b.applies.push(apply);
    b.final ||= final;
    const batch = b;
    const settled = new Promise<ProjectionOutcome>((resolve, reject) => batch.waiters.push({ resolve, reject }));
    if (final || this.#delayMs === 0 || this.#flushing) void this.#write(key);
    return settled;
  }

  /** Writes every waiting batch now, and every later one at once. */
  async flush(): Promise<void> {
    this.#flushing = true;
    await Promise.all([...this.#batches.keys()].map((k) => this.#write(k)));
  }

  async #write(key: string): Promise<void> {
    const b = this.#batches.get(key);
    if (!b) return;
    this.#batches.delete(key);
    clearTimeout(b.timer);
    try {
      const outcome = await this.#applier.apply(key, (current) => {
        let value = current;
        let changed = false;
        for (const f of b.applies) {
          const next = f(value);
          if (next !== null) {
            value = next;
            changed = true;
          }
        }
        return changed ? value : null;
      });
      // An ended operation's entry is not written again in the usual course: keeping it cached
      // would hold every recent operation's whole entry (audit records are ~5 KB) for nothing.
      if (b.final) this.#applier.forget(key);
      for (const w of b.waiters) w.resolve(outcome);
    } catch (err) {
      for (const w of b.waiters) w.reject(err);
    }
  }
}
