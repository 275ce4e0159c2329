import {
  DeliverPolicy,
  JetStreamApiError,
  type JetStreamClient,
  type JetStreamManager,
  type JsMsg,
  type StreamInfo,
} from '@nats-io/jetstream';
import type { NatsConnection } from '@nats-io/transport-node';
import { isTransient, openBucket } from '@tooltx/nats';
import { createBucket, type BucketDef } from '@tooltx/streams';
import type { Logger } from './logger.js';

/** The key of the marker a finished rebuild leaves in its bucket, last (never a `<tenant>.<opId>` key). */
const REBUILT_MARKER = '_rebuilt';

/**
 * A projection bucket on memory storage (the reconciler's index, the audit records) and what
 * keeps it whole: the bucket is derived from the event log (and, for the audit records, the
 * tenants' decision streams), so it is kept in memory — no fsync per write — and rebuilt from the
 * log whenever the server has lost it. A memory stream is gone after its server restarts (a
 * cluster keeps it while a majority of its replicas stays up: docs/cluster.md).
 *
 * When it rebuilds:
 * - at start, when the bucket does not exist, or does not hold the marker a finished rebuild writes
 *   last ({@link REBUILT_MARKER}) while the log holds messages: created again empty (e.g. by
 *   `tooltx streams apply` after the server restarted), or half written by a rebuild that died;
 * - later, when the bucket is gone or is another stream than the one this process last saw whole
 *   (its creation time changed: deleted and created again by anyone): looked at after each
 *   reconnect, every {@link ProjectionGuardOptions.checkEveryMs}, and after a write that failed
 *   as a write to a missing stream does (no responders, stream not found).
 *
 * How: the bucket is created with exactly the topology's settings ({@link createBucket}: the same
 * call the provisioner makes), then every source is read from its first message with an ordered
 * consumer (`$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>`, the only create form a service is
 * given: libs/auth/src/permissions.ts) up to the last message it held when the rebuild began, and
 * each message goes to the service's {@link ProjectionRebuilder}, which applies it with the same
 * pure rule as the live path. The durables then go on from where they were: what they deliver
 * again is applied again, which the rules make a no-op (each compares stream sequences), and what
 * is newer lands on the rebuilt entries. Cost: one read of the sources, at most
 * {@link ProjectionGuardOptions.window} messages applied at once.
 *
 * While it checks or rebuilds, {@link ready} does not resolve: the service's writes wait for it (a
 * live write must not be overtaken by a rebuild's older value in the cache, and is useless in a
 * bucket about to be rebuilt), and readers of the projection ask {@link rebuilding} before they
 * answer from it. Several instances may rebuild at once: every write is a compare-and-set under
 * the projection's rule, so they agree. An instance that starts while another is half way through
 * a rebuild finds no marker yet and rebuilds too; if the other dies, this one still finishes it.
 */

/** One stream a projection is fed from, and the subjects of it it reads. */
export interface RebuildSource {
  stream: string;
  filter: string;
}

/** A service's application of the messages of a rebuild, made afresh for each rebuild. */
export interface ProjectionRebuilder {
  /** Applies one message; a promise is waited for before the rebuild ends (at most `window` at once). */
  apply(source: RebuildSource, msg: JsMsg): Promise<unknown> | undefined;
  /** After the last message: writes whatever the rebuilder still holds. */
  finish(): Promise<void>;
}

export interface ProjectionGuardOptions {
  nc: NatsConnection;
  js: JetStreamClient;
  jsm: JetStreamManager;
  /** The bucket, exactly as the topology defines it. */
  bucket: BucketDef;
  log: Logger;
  /** The streams the projection is fed from, asked at each rebuild (the audit's tenants may change). */
  sources: () => RebuildSource[];
  rebuilder: () => ProjectionRebuilder;
  /** After each rebuild (e.g. a watch of the bucket watches again from its start). */
  onRebuilt?: () => void;
  /** How often the bucket is looked at while nothing else prompts it, ms (default 15 000). */
  checkEveryMs?: number;
  /** Messages applied at once during a rebuild (default 256). */
  window?: number;
}

/** JetStream "stream not found" (10059). */
function isStreamNotFound(err: unknown): boolean {
  return err instanceof JetStreamApiError && err.code === 10059;
}

/** Guards one projection bucket: {@link ready} once it is whole; rebuilds it when lost. */
export class ProjectionGuard {
  readonly #o: ProjectionGuardOptions;
  readonly #stream: string;
  readonly #log: Logger;
  /** Creation time of the bucket this process last saw whole. */
  #created: string | undefined;
  #epoch = 0;
  #whole = false;
  #ready!: Promise<void>;
  #markReady!: () => void;
  #check: Promise<boolean> | null = null;
  #timer: NodeJS.Timeout | undefined;
  #stopped = false;

  constructor(o: ProjectionGuardOptions) {
    this.#o = o;
    this.#stream = `KV_${o.bucket.bucket}`;
    this.#log = o.log.child({ component: 'projection', bucket: o.bucket.bucket });
    // Held until the first look found the bucket whole (or rebuilt it).
    this.#ready = new Promise<void>((r) => (this.#markReady = r));
  }

  /** True until the first check found the bucket whole, and during every rebuild. */
  get rebuilding(): boolean {
    return !this.#whole;
  }

  /** Counts the rebuilds: a writer's cached revisions are of an older bucket when it changed. */
  get epoch(): number {
    return this.#epoch;
  }

  /** Resolves once the bucket is whole (at once, most of the time). */
  ready(): Promise<void> {
    return this.#ready;
  }

  /**
   * Looks at the bucket now (rebuilding it when needed, in the background) and from then on after
   * each reconnect and every `checkEveryMs`.
   */
  start(): void {
    void this.check();
    void (async () => {
      for await (const s of this.#o.nc.status()) {
        if (this.#stopped) return;
        if (s.type === 'reconnect') void this.check();
      }
    })().catch(() => undefined);
    this.#timer = setInterval(() => void this.check(), this.#o.checkEveryMs ?? 15_000);
    this.#timer.unref();
  }

  stop(): void {
    this.#stopped = true;
    clearInterval(this.#timer);
    this.#markReady();
  }

  /**
   * After a write to the bucket failed with `err`: when it failed as a write to a missing stream
   * does, looks at the bucket and rebuilds it if it was lost. True when it rebuilt it (the write
   * may be tried again); false otherwise (the error stands).
   */
  async lost(err: unknown): Promise<boolean> {
    if (this.#stopped || !(isTransient(err) || isStreamNotFound(err))) return false;
    return this.check();
  }

  /** Looks at the bucket once (or joins the look in progress); true when it rebuilt it. */
  check(): Promise<boolean> {
    if (this.#stopped) return Promise.resolve(false);
    this.#check ??= this.#look().finally(() => (this.#check = null));
    return this.#check;
  }

  /** Holds writers back until the bucket is whole again; a no-op while they are held already (they wait on that promise). */
  #close(): void {
    if (!this.#whole) return;
    this.#whole = false;
    this.#ready = new Promise<void>((r) => (this.#markReady = r));
  }

  async #info(stream: string): Promise<StreamInfo | null> {
    try {
      return await this.#o.jsm.streams.info(stream);
    } catch (err) {
      if (isStreamNotFound(err)) return null;
      throw err;
    }
  }

  async #look(): Promise<boolean> {
    let info: StreamInfo | null;
    try {
      info = await this.#info(this.#stream);
      if (info && this.#created === undefined) {
        // The first look: a bucket is whole when a rebuild finished in it (its marker is there), or
        // when there is nothing to rebuild yet. A bucket written without the marker may be the half
        // of a rebuild that died (a crash, an out-of-memory kill): it is rebuilt, never trusted.
        const whole = info.state.last_seq > 0 ? await this.#marked() : !(await this.#sourcesHoldMessages());
        if (whole) {
          if (info.state.last_seq === 0) await this.#mark();
          this.#created = info.created;
          this.#whole = true;
          this.#markReady();
          return false;
        }
      } else if (info && info.created === this.#created) return false;
    } catch (err) {
      // No answer now (a reconnect, a cluster electing): the next look decides. The first look must
      // end in a decision, so it is tried again.
      this.#log.warn({ err }, 'projection bucket could not be looked at');
      if (this.#created === undefined && !this.#stopped) {
        await new Promise((r) => setTimeout(r, 1_000));
        return this.#look();
      }
      return false;
    }
    this.#close();
    for (let failures = 0; !this.#stopped; failures++) {
      try {
        await this.#rebuild(info === null);
        return true;
      } catch (err) {
        this.#log.warn({ err, failures }, 'projection rebuild failed; trying again');
        await new Promise((r) => setTimeout(r, Math.min(5_000, 250 * 2 ** failures)));
        info = await this.#info(this.#stream).catch(() => null);
      }
    }
    return false;
  }

  /** Whether the bucket holds the marker of a finished rebuild (a delete marker of {@link REBUILT_MARKER}). */
  async #marked(): Promise<boolean> {
    return (await (await openBucket(this.#o.nc, this.#o.bucket.bucket)).get(REBUILT_MARKER)) !== null;
  }

  /**
   * Writes the marker: a delete marker (no value), so no reader of entries ever sees it as one, and
   * a bucket whose rebuild wrote nothing (every operation ended before it would have been indexed)
   * is not taken for one made again empty by the next instance. It expires with the bucket's max
   * age; a bucket without it is rebuilt once more.
   */
  async #mark(): Promise<void> {
    await (await openBucket(this.#o.nc, this.#o.bucket.bucket)).delete(REBUILT_MARKER);
  }

  async #sourcesHoldMessages(): Promise<boolean> {
    for (const s of this.#o.sources()) {
      const i = await this.#info(s.stream);
      if (i && i.state.messages > 0) return true;
    }
    return false;
  }

  async #rebuild(missing: boolean): Promise<void> {
    const started = performance.now();
    this.#epoch++;
    if (missing) this.#log.warn({ missing }, 'projection bucket lost: creating it and rebuilding it from the log');
    else this.#log.info({ missing }, 'projection bucket new: rebuilding it from the log');
    if (missing) await createBucket(this.#o.nc, this.#o.bucket);
    const info = await this.#o.jsm.streams.info(this.#stream);
    const r = this.#o.rebuilder();
    const inFlight = new Set<Promise<unknown>>();
    const max = this.#o.window ?? 256;
    let messages = 0;
    let failed: unknown;
    for (const source of this.#o.sources()) {
      messages += await this.#read(source, async (m) => {
        const p = r.apply(source, m);
        if (!p) return;
        const tracked: Promise<unknown> = p.then(
          () => inFlight.delete(tracked),
          (err: unknown) => {
            inFlight.delete(tracked);
            failed ??= err;
          },
        );
        inFlight.add(tracked);
        if (inFlight.size >= max) await Promise.race(inFlight);
        if (failed) throw failed;
      });
    }
    await Promise.all(inFlight);
    if (failed) throw failed;
    await r.finish();
    // Last: the marker that says this bucket holds a finished rebuild (see #look).
    await this.#mark();
    this.#created = info.created;
    this.#whole = true;
    this.#markReady();
    this.#log.warn({ messages, ms: Math.round(performance.now() - started) }, 'projection rebuilt from the log');
    this.#o.onRebuilt?.();
  }

  /** Every message of `source` up to its last one now, in order, through an ordered consumer; returns how many. */
  async #read(source: RebuildSource, each: (m: JsMsg) => Promise<void>): Promise<number> {
    const info = await this.#info(source.stream);
    if (!info || info.state.messages === 0) return 0;
    const last = info.state.last_seq;
    const c = await this.#o.js.consumers.get(source.stream, {
      filter_subjects: source.filter,
      deliver_policy: DeliverPolicy.All,
    });
    let n = 0;
    try {
      for (let done = false; !done && !this.#stopped; ) {
        const batch = await c.fetch({ max_messages: 512, expires: 2_000 });
        let got = 0;
        for await (const m of batch) {
          got++;
          n++;
          await each(m);
          if (m.seq >= last || m.info.pending === 0) {
            // Not waiting for the rest of the batch until it expires: the end is reached.
            done = true;
            batch.stop();
            break;
          }
        }
        if (got === 0) done = true;
      }
    } finally {
      await c.delete().catch(() => undefined);
    }
    return n;
  }
}
