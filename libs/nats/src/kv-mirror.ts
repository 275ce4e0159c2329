import type { KV } from '@nats-io/kv';
import type { Logger } from 'pino';
import type { z } from 'zod';
import { decode } from './codec.js';

/**
 * An in-memory mirror of a KV bucket, fed by ONE long-lived watch (an ordered consumer that resumes
 * after a reconnect; started again from the last values if it ever ends) — never a key listing or
 * a read per lookup (a listing per sweep hung across a server restart; no round
 * trip a watch can replace). Values are msgpack parsed with `schema`; an undecodable one is logged
 * and skipped; `keep` drops values the mirror should not hold (e.g. tombstones). After a restart
 * of the watch, keys the replay did not deliver are removed once it has loaded — the mirror never
 * goes empty in between.
 */
export class KvMirror<T> {
  readonly #kv: KV;
  readonly #schema: z.ZodType<T>;
  readonly #keep: (v: T) => boolean;
  readonly #log: Logger;
  readonly #what: string;
  readonly #onChange: ((key: string, value: T | null) => void) | undefined;
  readonly #map = new Map<string, T>();
  #it: { stop(): void } | null = null;
  #stopped = false;
  #done: Promise<void> = Promise.resolve();

  /** `onChange`: called after each change of the mirror (a value set, or null: the key removed). */
  constructor(
    kv: KV,
    schema: z.ZodType<T>,
    opts: { log: Logger; what: string; keep?: (v: T) => boolean; onChange?: (key: string, value: T | null) => void },
  ) {
    this.#onChange = opts.onChange;
    this.#kv = kv;
    this.#schema = schema;
    this.#keep = opts.keep ?? (() => true);
    this.#log = opts.log;
    this.#what = opts.what;
  }

  /** The mirrored entries (read-only view). */
  get map(): ReadonlyMap<string, T> {
    return this.#map;
  }

  /** Starts watching; resolves once the bucket's current values are loaded (or after 5 s, logged). */
  async start(): Promise<void> {
    let markReady!: () => void;
    const ready = new Promise<void>((r) => (markReady = r));
    this.#done = (async () => {
      while (!this.#stopped) {
        try {
          // Loaded once as many initial values arrived as the bucket holds (or at the first update).
          const { values } = await this.#kv.status();
          const seen = new Set<string>();
          let loaded = false;
          const load = () => {
            if (loaded) return;
            loaded = true;
            for (const k of [...this.#map.keys()]) if (!seen.has(k)) this.#remove(k);
            markReady();
          };
          if (values === 0) load();
          const it = await this.#kv.watch({ key: '>' });
          this.#it = it;
          if (this.#stopped) it.stop();
          for await (const e of it) {
            seen.add(e.key);
            this.#apply(e.key, e.operation === 'PUT' && e.length > 0 ? e.value : null);
            if (e.isUpdate || seen.size >= values) load();
          }
        } catch (err) {
          if (!this.#stopped) this.#log.warn({ err }, `${this.#what} watch ended; watching again`);
        }
        if (!this.#stopped) await new Promise((r) => setTimeout(r, 1_000));
      }
    })();
    const fallback = setTimeout(() => {
      this.#log.warn(`${this.#what} watch slow to load; going on with what it has`);
      markReady();
    }, 5_000);
    await ready;
    clearTimeout(fallback);
  }

  /**
   * Watches again from the bucket's first value (the mirror keeps its entries meanwhile; keys the
   * new watch does not deliver are removed once it has loaded). For a bucket that was deleted and
   * created again: a watch that outlived it would resume after the old bucket's last sequence and
   * miss the new bucket's first values.
   */
  resync(): void {
    this.#it?.stop();
  }

  #remove(key: string): void {
    if (this.#map.delete(key)) this.#onChange?.(key, null);
  }

  #apply(key: string, bytes: Uint8Array | null): void {
    if (bytes === null) return void this.#remove(key);
    let v: T;
    try {
      v = decode(this.#schema, bytes);
    } catch (err) {
      this.#log.error({ err, key }, `undecodable ${this.#what} entry skipped`);
      return;
    }
    if (this.#keep(v)) {
      this.#map.set(key, v);
      this.#onChange?.(key, v);
    } else this.#remove(key);
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    this.#it?.stop();
    await this.#done;
  }
}
