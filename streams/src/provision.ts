import {
  jetstream,
  JetStreamApiError,
  type JetStreamManager,
  type StreamConfig,
  type StreamInfo,
} from '@nats-io/jetstream';
import { Kvm, type KV } from '@nats-io/kv';
import { millis, type NatsConnection } from '@nats-io/transport-node';
import { decodeRaw, encode } from '@tooltx/nats';
import type { TenantEntry } from './tenancy.js';
import type { BucketDef, ConsumerDef, Topology } from './topology.js';

/** Thrown when a stream, consumer or bucket breaks a guarantee; lists every violated setting. */
export class StreamConfigError extends Error {
  readonly violations: string[];
  constructor(violations: string[]) {
    super(
      `JetStream configuration breaks tooltx guarantees (run \`tooltx streams apply\`):\n  - ${violations.join('\n  - ')}`,
    );
    this.name = 'StreamConfigError';
    this.violations = violations;
  }
}

export interface ApplyReport {
  created: string[];
  updated: string[];
  unchanged: string[];
  /** Tenants taken out of the tenants bucket (no longer listed): their streams are kept, with their data. */
  unlisted?: string[];
  /**
   * Projection buckets deleted and created again, each with why: JetStream cannot change a
   * stream's storage in place. A projection is derived from the event log: its service rebuilds
   * it from the log (the log itself is never touched).
   */
  recreated?: string[];
}

/**
 * Creates the KV bucket `b` (or opens it when it exists: nothing of an existing bucket is changed),
 * with the settings every tooltx bucket has: one value per key, `b`'s max age, replicas and
 * storage, direct get allowed. The one way a bucket is made, by the provisioner and by a projection's
 * service recreating its lost bucket, so both make the same stream. Sends `$JS.API.STREAM.INFO` and,
 * when the bucket is missing, `$JS.API.STREAM.CREATE` of `KV_<bucket>` (never `$JS.API.INFO`).
 */
export function createBucket(nc: NatsConnection, b: BucketDef): Promise<KV> {
  return new Kvm(jetstream(nc, { checkAPI: false })).create(b.bucket, {
    history: 1,
    ttl: b.ttlMs,
    replicas: b.replicas,
    storage: b.storage,
    allow_direct: true,
  });
}

/** The projection buckets of a topology: derived from the event log, rebuilt by their services when lost. */
export function projectionBuckets(t: Topology): BucketDef[] {
  return [t.projections.reconcile, t.projections.audit];
}

/** The debug-sampling buckets of a topology: the switches and the samples (docs/debug-samples.md). */
export function debugBuckets(t: Topology): BucketDef[] {
  return t.debug ? [t.debug.sampling, t.debug.samples] : [];
}

/**
 * The provisioner: creates or updates the streams, durable consumers and KV buckets (result store,
 * projections) of a topology. Only the provisioner may do this (nobody else gets the API
 * subjects; a projection's service may only create its own bucket again: {@link createBucket});
 * services only {@link checkTopology}. Throws the server's `JetStreamApiError` when an update is
 * refused (e.g. changing a stream's storage type). A projection bucket whose storage differs from
 * the topology's is deleted and created again (listed in `recreated`; its service rebuilds it from
 * the event log); any other bucket with another storage is refused ({@link StreamConfigError}).
 */
export async function applyTopology(
  nc: NatsConnection,
  jsm: JetStreamManager,
  t: Topology,
  opts: { timeoutMs?: number } = {},
): Promise<ApplyReport> {
  const deadline = Date.now() + (opts.timeoutMs ?? 60_000);
  // A cluster that has just (re)started has no meta leader for a few seconds (about 3–13 s on
  // loopback here), and once it has one, its streams still elect their own and the meta leader may
  // not know every peer yet: a step times out, answers 10008 or finds "no suitable peers". Applying
  // is idempotent, so the whole of it is tried again until the deadline; one server answers at once.
  for (;;) {
    try {
      return await applyOnce(nc, jsm, t);
    } catch (err) {
      if (!electing(err) || Date.now() > deadline) throw err;
      await new Promise((r) => setTimeout(r, 500));
    }
  }
}

async function applyOnce(nc: NatsConnection, jsm: JetStreamManager, t: Topology): Promise<ApplyReport> {
  const report: ApplyReport = { created: [], updated: [], unchanged: [] };
  for (const cfg of allStreams(t)) {
    const cur = await streamInfo(jsm, cfg.name);
    if (!cur) {
      await jsm.streams.add(cfg);
      report.created.push(`stream ${cfg.name}`);
    } else if (differs(cur.config, cfg)) {
      await jsm.streams.update(cfg.name, { ...cur.config, ...cfg });
      report.updated.push(`stream ${cfg.name}`);
    } else report.unchanged.push(`stream ${cfg.name}`);
  }
  for (const c of allConsumers(t)) {
    const name = `consumer ${c.stream}/${c.config.durable_name}`;
    const cur = await jsm.consumers
      .info(c.stream, c.config.durable_name)
      .catch((e: unknown) => (isNotFound(e) ? null : Promise.reject(e)));
    if (!cur) {
      await jsm.consumers.add(c.stream, c.config);
      report.created.push(name);
    } else if (differs(cur.config, c.config)) {
      await jsm.consumers.update(c.stream, c.config.durable_name, c.config);
      report.updated.push(name);
    } else report.unchanged.push(name);
  }
  for (const b of buckets(t)) {
    const existed = await streamInfo(jsm, `KV_${b.bucket}`);
    if (existed && existed.config.storage !== b.storage) {
      // JetStream cannot change a stream's storage in place (10052). Only a projection may be
      // deleted to be made again: anything else is refused, naming what to do.
      if (!projectionBuckets(t).includes(b))
        throw new StreamConfigError([
          `bucket ${b.bucket} storage is ${existed.config.storage}, must be ${b.storage}; it is not a projection and holds what exists nowhere else: it is left as it is (move its data to a ${b.storage} bucket by hand)`,
        ]);
      await jsm.streams.delete(`KV_${b.bucket}`);
      await createBucket(nc, b);
      (report.recreated ??= []).push(
        `bucket ${b.bucket}: storage ${existed.config.storage} → ${b.storage} (deleted and created again: a projection of the event log, rebuilt from the log by its service; the log is untouched)`,
      );
      continue;
    }
    await createBucket(nc, b);
    (existed ? report.unchanged : report.created).push(`bucket ${b.bucket}`);
  }
  // The debug-sampling buckets: short-lived by design, so outside the event-log age rule below.
  for (const b of debugBuckets(t)) {
    const existed = await streamInfo(jsm, `KV_${b.bucket}`);
    await createBucket(nc, b);
    (existed ? report.unchanged : report.created).push(`bucket ${b.bucket}`);
  }
  if (t.tenants) {
    // The tenants bucket is the list the services serve: every listed tenant's limits, written after
    // its streams exist; a tenant no longer listed is taken out (its streams and data are kept).
    const kv = await new Kvm(nc).open(t.tenantsBucket.bucket);
    const listed = new Set(t.tenants.map((x) => x.id));
    for (const x of t.tenants) {
      const entry: TenantEntry = { limits: x.limits };
      const cur = await kv.get(x.id);
      if (cur?.operation === 'PUT' && cur.length > 0 && JSON.stringify(decodeRaw(cur.value)) === JSON.stringify(entry))
        continue;
      await kv.put(x.id, encode(entry));
    }
    for await (const key of await kv.keys()) {
      if (listed.has(key)) continue;
      await kv.delete(key);
      (report.unlisted ??= []).push(key);
    }
  }
  return report;
}

/** Every stream of a topology: the shared ones and each tenant's intake and decision streams. */
export function allStreams(t: Topology): (Partial<StreamConfig> & { name: string })[] {
  return [...Object.values(t.streams), ...(t.tenants ?? []).flatMap((x) => [x.intents, x.decisions])];
}

/** Every durable of a topology: the shared ones and each tenant's. */
export function allConsumers(t: Topology): ConsumerDef[] {
  return [...t.consumers, ...(t.tenants ?? []).flatMap((x) => x.consumers)];
}

/**
 * What a cluster that is still electing answers: a timeout, 10008 (JetStream temporarily
 * unavailable), or "no suitable peers for placement" while the meta leader does not yet know every
 * node.
 */
function electing(err: unknown): boolean {
  for (let e: unknown = err, depth = 0; e instanceof Error && depth < 4; e = e.cause, depth++) {
    if (e.name === 'TimeoutError' || /timeout|temporarily unavailable|no suitable peers/i.test(e.message)) return true;
    if (e instanceof JetStreamApiError && e.code === 10008) return true;
  }
  return false;
}

/**
 * What a service runs at start-up: reads the configuration and lists every setting that breaks a
 * guarantee (Message-ID dedup is only the first layer: the registrations behind it must outlive
 * it, FM-30). `longestKeyRetentionMs` comes from the loaded contracts. Returns the violations;
 * {@link assertTopology} throws them.
 */
export async function checkTopology(
  jsm: JetStreamManager,
  t: Topology,
  opts: { longestKeyRetentionMs: number; longestOperationMs?: number },
): Promise<string[]> {
  const v: string[] = [];
  const infos: Record<string, StreamInfo | null> = {};
  const wanted: [string, Partial<StreamConfig> & { name: string }][] = [
    ...Object.entries(t.streams),
    ...(t.tenants ?? []).flatMap(
      (x) =>
        [
          [`intents:${x.id}`, x.intents],
          [`decisions:${x.id}`, x.decisions],
        ] as [string, Partial<StreamConfig> & { name: string }][],
    ),
  ];
  for (const [role, want] of wanted) {
    const cur = await streamInfo(jsm, want.name);
    infos[role] = cur;
    if (!cur) {
      v.push(`stream ${want.name} does not exist`);
      continue;
    }
    const c = cur.config;
    const at = (k: string) => `stream ${want.name} ${k}`;
    const have = new Set(c.subjects ?? []);
    // The advisories stream also lists each tenant's streams, which a service does not know: it
    // must hold at least the shared ones.
    const subjectsOk =
      role === 'advisories' && !t.tenants
        ? (want.subjects ?? []).every((x) => have.has(x))
        : JSON.stringify([...have].sort()) === JSON.stringify([...(want.subjects ?? [])].sort());
    if (!subjectsOk)
      v.push(`${at('subjects')} is ${JSON.stringify(c.subjects)}, expected ${JSON.stringify(want.subjects)}`);
    if (c.retention !== 'limits') v.push(`${at('retention')} is ${c.retention}, must be limits`);
    if (c.storage !== 'file') v.push(`${at('storage')} is ${c.storage}, must be file`);
    if (want.deny_delete && !c.deny_delete) v.push(`${at('deny_delete')} is false, must be true`);
    if (!c.deny_purge) v.push(`${at('deny_purge')} is false, must be true`);
    if (!c.allow_direct) v.push(`${at('allow_direct')} is false, must be true`);
    if (role.startsWith('intents:')) {
      // A tenant's intake bound must refuse new intents, never drop stored ones (docs/tenancy.md).
      if (c.discard !== 'new')
        v.push(`${at('discard')} is ${c.discard}, must be new (a full intake stream would drop stored intents)`);
      for (const k of ['max_bytes', 'max_msgs', 'max_msg_size'] as const) {
        if (c[k] !== want[k]) v.push(`${at(k)} is ${c[k]}, the tenant's limit is ${want[k]}`);
      }
      if ((c.max_msgs_per_subject ?? -1) > 0)
        v.push(`${at('max_msgs_per_subject')} is ${c.max_msgs_per_subject}, must be -1`);
      continue;
    }
    if (role.startsWith('decisions:')) {
      if (c.max_bytes !== want.max_bytes)
        v.push(`${at('max_bytes')} is ${c.max_bytes}, the tenant's limit is ${want.max_bytes}`);
      continue;
    }
    for (const k of ['max_msgs', 'max_bytes', 'max_msgs_per_subject'] as const) {
      if ((c[k] ?? -1) > 0) v.push(`${at(k)} is ${c[k]}, must be -1 (a limit could evict a registration)`);
    }
  }
  const events = infos.events?.config;
  const age = (c: StreamConfig | undefined) => (c ? (c.max_age ? millis(c.max_age) : Infinity) : NaN);
  if (events && age(events) < opts.longestKeyRetentionMs)
    v.push(
      `stream ${events.name} max_age ${age(events)} ms is shorter than the longest contract key retention ${opts.longestKeyRetentionMs} ms`,
    );
  // The result store must outlive the registrations; a projection's entries (tombstones included)
  // must outlive the events they shadow, or a redelivered old event could bring an entry back.
  for (const b of buckets(t)) {
    const kv = await streamInfo(jsm, `KV_${b.bucket}`);
    const projection = projectionBuckets(t).includes(b);
    // A projection in memory is gone after a server restart: its service recreates and rebuilds it.
    if (!kv) {
      if (!projection) v.push(`bucket ${b.bucket} does not exist`);
    } else if (kv.config.storage !== b.storage)
      v.push(
        projection
          ? `bucket ${b.bucket} storage is ${kv.config.storage}, must be ${b.storage} (a projection of the event log: \`tooltx streams apply\` recreates it and its service rebuilds it from the log)`
          : `bucket ${b.bucket} storage is ${kv.config.storage}, must be ${b.storage} (it holds what exists nowhere else)`,
      );
    else if (!kv.config.allow_direct)
      v.push(`bucket ${b.bucket} allow_direct is false, must be true (services read it by direct get)`);
    else if (events && age(kv.config) < age(events))
      v.push(`bucket ${b.bucket} max_age ${age(kv.config)} ms is shorter than the event log's ${age(events)} ms`);
    else if ((b === t.tasks || b === t.tenantsBucket || b === t.contracts) && age(kv.config) !== Infinity)
      v.push(
        `bucket ${b.bucket} max_age is ${age(kv.config)} ms, must be unlimited (${b === t.tasks ? 'a frozen task must never thaw by itself' : b === t.contracts ? 'a contract version must never be forgotten by itself' : 'a tenant must never be forgotten by itself'})`,
      );
  }
  for (const b of debugBuckets(t)) {
    const kv = await streamInfo(jsm, `KV_${b.bucket}`);
    if (!kv) v.push(`bucket ${b.bucket} does not exist`);
    else if (!(age(kv.config) <= b.ttlMs))
      v.push(
        `bucket ${b.bucket} max_age is ${age(kv.config)} ms, must be at most ${b.ttlMs} ms (debug samples expire: docs/debug-samples.md)`,
      );
  }
  for (const x of t.tenants ?? []) {
    const intents = infos[`intents:${x.id}`]?.config;
    if (intents && opts.longestOperationMs !== undefined && age(intents) < opts.longestOperationMs) {
      v.push(
        `stream ${intents.name} max_age ${age(intents)} ms is shorter than the longest operation lifetime ${opts.longestOperationMs} ms (inputs must stay readable)`,
      );
    }
  }
  for (const c of allConsumers(t)) {
    const cur = await jsm.consumers
      .info(c.stream, c.config.durable_name)
      .catch((e: unknown) => (isNotFound(e) ? null : Promise.reject(e)));
    if (!cur) v.push(`consumer ${c.stream}/${c.config.durable_name} does not exist`);
    else {
      if (cur.config.filter_subject !== c.config.filter_subject)
        v.push(
          `consumer ${c.stream}/${c.config.durable_name} filter_subject is ${cur.config.filter_subject}, expected ${c.config.filter_subject}`,
        );
      if (cur.config.ack_policy !== 'explicit')
        v.push(
          `consumer ${c.stream}/${c.config.durable_name} ack_policy is ${cur.config.ack_policy}, must be explicit`,
        );
      if (
        c.config.max_deliver !== undefined &&
        c.config.max_deliver > 0 &&
        !(cur.config.max_deliver && cur.config.max_deliver > 0)
      )
        v.push(
          `consumer ${c.stream}/${c.config.durable_name} max_deliver is unlimited, must be ${c.config.max_deliver} (a poison message would loop forever)`,
        );
    }
  }
  return v;
}

/**
 * The provisioner's audit of durable consumers (only the provisioner creates durables).
 * nats-server 2.9.10 cannot stop a service from creating a durable under a NEW name on a stream and
 * filter it already reads (the durable name travels in the request body; generated permissions
 * deny every known durable's name): this lists, on every stream and bucket of the topology, each
 * durable consumer that is neither in the topology nor in `extraDurables` (e.g. the identity list's
 * `executorDurables`). Needs the provisioner's `$JS.API.CONSUMER.LIST`; services cannot run it.
 * Returns one violation per unknown durable.
 */
export async function checkDurables(
  jsm: JetStreamManager,
  t: Topology,
  extraDurables: string[] = [],
): Promise<string[]> {
  const known = new Set([...allConsumers(t).map((c) => `${c.stream}/${c.config.durable_name}`)]);
  const names = [...allStreams(t).map((s) => s.name), ...buckets(t).map((b) => `KV_${b.bucket}`)];
  const v: string[] = [];
  for (const stream of names) {
    if (!(await streamInfo(jsm, stream))) continue;
    for await (const ci of jsm.consumers.list(stream)) {
      const durable = ci.config.durable_name;
      if (!durable || known.has(`${stream}/${durable}`) || extraDurables.includes(durable)) continue;
      v.push(
        `consumer ${stream}/${durable} is a durable the topology does not define (only the provisioner creates durables: delete it with \`nats consumer rm\` after finding who made it)`,
      );
    }
  }
  return v;
}

/** {@link checkTopology}, throwing {@link StreamConfigError} when anything is wrong. */
export async function assertTopology(...args: Parameters<typeof checkTopology>): Promise<void> {
  const v = await checkTopology(...args);
  if (v.length) throw new StreamConfigError(v);
}

/** Every KV bucket of a topology: the result store, the projections, the frozen tasks, the tenants, the contract registry. */
function buckets(t: Topology): BucketDef[] {
  return [t.results, t.projections.reconcile, t.projections.audit, t.tasks, t.tenantsBucket, t.contracts];
}

async function streamInfo(jsm: JetStreamManager, name: string): Promise<StreamInfo | null> {
  try {
    return await jsm.streams.info(name);
  } catch (err) {
    if (isNotFound(err)) return null;
    throw err;
  }
}

function isNotFound(err: unknown): boolean {
  return err instanceof JetStreamApiError && (err.code === 10059 || err.code === 10014);
}

function differs(cur: object, want: object): boolean {
  const c = cur as Record<string, unknown>;
  return Object.entries(want).some(([k, v]) => JSON.stringify(c[k]) !== JSON.stringify(v));
}
