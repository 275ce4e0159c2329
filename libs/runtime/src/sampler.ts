import type { KV } from '@nats-io/kv';
import {
  contractTokenOf,
  decideSample,
  type Sample,
  type SamplingSwitch,
  samplingSwitchSchema,
} from '@tooltx/lifecycle';
import { decode, encode, KvMirror, type Subjects } from '@tooltx/nats';
import { CAS_ROUNDS, CasContendedError, casUpdate } from './kv-cas.js';
import type { Logger } from './logger.js';

/** Largest encoded input or result a sample keeps, bytes; a larger one is kept as `[elided: N bytes]`. */
export const MAX_SAMPLE_FIELD_BYTES = 32 * 1024;

/** What the executor offers of one ended attempt (docs/debug-samples.md). */
export interface SampleOffer {
  /** `name@version`. */
  contract: string;
  tenant: string;
  opId: string;
  operationKey: string;
  outcome: string;
  errorClass?: string | undefined;
  input: unknown;
  /** The result, computed only when the attempt is sampled (undefined: none). */
  result: () => unknown;
}

export interface SamplerDeps {
  /** KV `<p>_sampling`: the switches. */
  switches: KV;
  /** KV `<p>_samples`: the samples. */
  samples: KV;
  subjects: Subjects;
  log: Logger;
  /** The logger's scrubber ({@link scrubber}): a sample holds what a log line would, never more. */
  scrub: (v: unknown) => unknown;
  /** Removes every sample of a contract token from the samples bucket (the window ended or was stopped). */
  purge: (contractToken: string) => Promise<void>;
  now?: () => number;
  random?: () => number;
}

/**
 * Debug sampling on the executor's side (docs/debug-samples.md). The switches are held in memory
 * by one watch of their bucket ({@link KvMirror}): with no window open, {@link any} is false and the
 * executor's per-call cost is that one check, no read. With a window open for a contract, each
 * ended attempt of it is offered: {@link decideSample} says whether it is sampled; a sampled one
 * claims one of the window's `max` under compare-and-set on the switch, then its input and result,
 * scrubbed by the logger's rules, are put under `<contract token>.<tenant>.<opId>` with the
 * window's end as `expiresAt`. At a window's end (a timer per switch) or when its switch is gone,
 * the contract's samples are purged and an ended switch removed. Failures are logged, never thrown:
 * sampling never changes an operation's course.
 */
export class Sampler {
  readonly #d: SamplerDeps;
  readonly #now: () => number;
  readonly #random: () => number;
  readonly #mirror: KvMirror<SamplingSwitch>;
  readonly #byContract = new Map<string, SamplingSwitch>();
  readonly #timers = new Map<string, NodeJS.Timeout>();
  readonly #pending = new Set<Promise<void>>();
  /** Samples being stored: a purge waits for them, so none is written after it. */
  readonly #storing = new Set<Promise<void>>();
  /** The last claim queued per contract token: this process's claims on one window go one at a time. */
  readonly #claims = new Map<string, Promise<unknown>>();
  /** Samples dropped per window because its count kept changing under other executors' claims. */
  readonly #dropped = new Map<string, number>();

  constructor(d: SamplerDeps) {
    this.#d = d;
    this.#now = d.now ?? Date.now;
    this.#random = d.random ?? Math.random;
    this.#mirror = new KvMirror(d.switches, samplingSwitchSchema, {
      log: d.log,
      what: 'sampling-switch',
      onChange: (token, sw) => this.#changed(token, sw),
    });
  }

  /** Starts watching the switches; resolves once the current ones are loaded. */
  start(): Promise<void> {
    return this.#mirror.start();
  }

  /** True while any switch is known: the executor offers nothing otherwise (the hot-path check). */
  get any(): boolean {
    return this.#byContract.size > 0;
  }

  /** The switches known to this watch (open or ended and not yet removed). */
  switches(): SamplingSwitch[] {
    return [...this.#byContract.values()];
  }

  /** Offers one ended attempt; resolves when it is stored or skipped (never rejects). */
  offer(o: SampleOffer): Promise<void> {
    const sw = this.#byContract.get(o.contract);
    if (decideSample(sw, o, this.#now(), this.#random()) === 'skip') return Promise.resolve();
    const p = this.#store(sw!, o).catch((err: unknown) =>
      this.#d.log.warn({ err, contract: o.contract, tenant: o.tenant }, 'debug sample not stored'),
    );
    this.#storing.add(p);
    void p.finally(() => this.#storing.delete(p));
    return p;
  }

  async stop(): Promise<void> {
    for (const t of this.#timers.values()) clearTimeout(t);
    this.#timers.clear();
    await this.#mirror.stop();
    await Promise.all([...this.#storing, ...this.#pending]);
  }

  async #store(sw: SamplingSwitch, o: SampleOffer): Promise<void> {
    const token = contractTokenOf(o.contract);
    const prev = this.#claims.get(token) ?? Promise.resolve();
    const claim = prev.then(() => this.#claim(token, sw.windowId, o.tenant));
    const tail = claim.catch(() => undefined);
    this.#claims.set(token, tail);
    void tail.finally(() => {
      if (this.#claims.get(token) === tail) this.#claims.delete(token);
    });
    const claimed = await claim;
    if (claimed === 'contended') {
      const n = (this.#dropped.get(sw.windowId) ?? 0) + 1;
      this.#dropped.set(sw.windowId, n);
      // Once per window here, and the total at its end: a dropped sample is never silent.
      if (n === 1)
        this.#d.log.warn(
          { contract: o.contract, windowId: sw.windowId, rounds: CAS_ROUNDS },
          "debug sample dropped: the window's count kept changing under other executors' claims",
        );
    }
    if (claimed !== 'claimed') return;
    const sample: Sample = {
      schema: 1,
      windowId: sw.windowId,
      contract: o.contract,
      tenant: o.tenant,
      operationKey: o.operationKey,
      outcome: o.outcome,
      ...(o.errorClass ? { errorClass: o.errorClass } : {}),
      input: this.#bounded(o.input),
      ...(o.outcome === 'committed' ? { result: this.#bounded(o.result()) } : {}),
      at: this.#now(),
      expiresAt: sw.until,
    };
    await this.#d.samples.put(this.#d.subjects.sampleKey(token, o.tenant, o.opId), encode(sample));
  }

  /**
   * Counts one sample against the window's `max` (compare-and-set on the switch, {@link casUpdate}):
   * `claimed`; `skip` when the window is gone, full or ended; `contended` when other executors'
   * claims took every round. This process's claims on a window are made one after another
   * ({@link #store}), so only other executors' claims can take a round.
   */
  async #claim(token: string, windowId: string, tenant: string): Promise<'claimed' | 'skip' | 'contended'> {
    try {
      const taken = await casUpdate(this.#d.switches, token, samplingSwitchSchema, (cur) =>
        // Gone, another window, or this one full or ended meanwhile: the draw already passed, so 0 here.
        !cur || cur.windowId !== windowId || decideSample(cur, { tenant }, this.#now(), 0) === 'skip'
          ? null
          : { ...cur, taken: cur.taken + 1 },
      );
      return taken ? 'claimed' : 'skip';
    } catch (err) {
      if (err instanceof CasContendedError) return 'contended';
      throw err;
    }
  }

  /** The logger's scrubbing of `v`, kept when its encoding is at most {@link MAX_SAMPLE_FIELD_BYTES}. */
  #bounded(v: unknown): unknown {
    const scrubbed = this.#d.scrub(v);
    if (scrubbed === undefined) return undefined;
    const bytes = encode(scrubbed).byteLength;
    return bytes > MAX_SAMPLE_FIELD_BYTES ? `[elided: ${bytes} bytes]` : scrubbed;
  }

  #changed(token: string, sw: SamplingSwitch | null): void {
    const old = this.#timers.get(token);
    if (old) clearTimeout(old);
    this.#timers.delete(token);
    for (const contract of [...this.#byContract.keys()])
      if (contractTokenOf(contract) === token) this.#byContract.delete(contract);
    if (!sw) {
      // Stopped (or removed at its end): nothing of it stays readable.
      this.#purgeLater(token);
      return;
    }
    this.#byContract.set(sw.contract, sw);
    const wait = Math.max(0, sw.until - this.#now());
    const timer = setTimeout(() => {
      this.#timers.delete(token);
      this.#byContract.delete(sw.contract);
      this.#purgeLater(token, sw.windowId);
    }, wait);
    timer.unref();
    this.#timers.set(token, timer);
  }

  /** Purges the token's samples; with `windowId`, also removes that ended switch. */
  #purgeLater(token: string, windowId?: string): void {
    const p = (async () => {
      // A sample claimed before the window ended is written first, then purged with the rest: none
      // is left behind (one claimed after is refused by the claim's own check of the window).
      await Promise.all([...this.#storing]);
      await this.#d.purge(token);
      if (windowId === undefined) return;
      const dropped = this.#dropped.get(windowId);
      this.#dropped.delete(windowId);
      if (dropped)
        this.#d.log.warn({ token, windowId, dropped }, 'debug samples dropped in this window (claims contended)');
      const e = await this.#d.switches.get(token);
      if (e?.operation !== 'PUT' || e.length === 0) return;
      if (decode(samplingSwitchSchema, e.value).windowId !== windowId) return;
      await this.#d.switches.delete(token, { previousSeq: e.revision });
    })().catch((err: unknown) => this.#d.log.warn({ err, token }, 'debug samples not purged at the window end'));
    this.#pending.add(p);
    void p.finally(() => this.#pending.delete(p));
  }
}
