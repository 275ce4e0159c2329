import {
  AckPolicy,
  DeliverPolicy,
  DiscardPolicy,
  RetentionPolicy,
  StorageType,
  type ConsumerConfig,
  type StreamConfig,
} from '@nats-io/jetstream';
import { nanos } from '@nats-io/transport-node';
import type { Subjects } from '@tooltx/nats';
import type { TenantLimits, TenantSpec } from './tenancy.js';

const MINUTE = 60_000;
/** Deliveries of one message before the server gives up on it and raises an advisory. */
export const MAX_DELIVER = 50;
const DAY = 24 * 60 * MINUTE;
/** Max age of the debug-sampling buckets, ms: the longest sampling window (4 h, docs/debug-samples.md). */
export const SAMPLES_MAX_AGE_MS = 4 * 60 * MINUTE;

/** Retention and dedup settings of a deployment, all in milliseconds. */
export interface TopologyOptions {
  /** Intents (and so the inputs the executor and reconciler read back). Default 7 days. */
  intentsMaxAgeMs?: number;
  /** The event log: the registrations. Must be ≥ the longest contract key retention. Default 30 days. */
  eventsMaxAgeMs?: number;
  /** Decision subjects (pre-acceptance outcomes). Default 30 days. */
  decisionsMaxAgeMs?: number;
  /** The result store. Must be ≥ the event log's max_age. Default 31 days. */
  resultsMaxAgeMs?: number;
  /**
   * The projection buckets (reconciler index, audit records). Must be ≥ the event log's max_age:
   * a tombstone must outlive every event it shadows, or a redelivered older event could bring a
   * terminal operation back into the reconciler's index. Default the event log's max_age + 1 day.
   */
  projectionsMaxAgeMs?: number;
  /** The audit service's record of queries and exports. Default 365 days. */
  auditLogMaxAgeMs?: number;
  /** Nats-Msg-Id dedup window of every stream. Default 2 minutes (the server default). */
  duplicateWindowMs?: number;
  /** Stream replicas: 1 on one server, 3 on a cluster (2.9.21+, docs/cluster.md). */
  replicas?: number;
  /**
   * Deliveries of one message to a service's durable before the server gives up on it and raises
   * the max-deliveries advisory (default {@link MAX_DELIVER}; tests make it small to force one).
   */
  maxDeliver?: number;
  /**
   * The tenants, each with its own intake and decision streams (docs/tenancy.md). Given to the
   * provisioner (from the identity list); absent in a service, which learns them from the tenants
   * bucket and checks each tenant's streams when it starts serving it.
   */
  tenants?: TenantSpec[];
}

export interface ConsumerDef {
  stream: string;
  config: Partial<ConsumerConfig> & { durable_name: string; filter_subject: string };
}

export interface BucketDef {
  bucket: string;
  /** Max age of an entry, ms. */
  ttlMs: number;
  replicas: number;
  /**
   * Where the server keeps the bucket. `file` for what exists nowhere else (the result store, the
   * frozen tasks, the tenants). `memory` for the projections of the event log: derived, so they
   * can be rebuilt from it, and a memory write costs no fsync (the server is run with
   * `sync_interval: always`: docs/durability.md). A memory stream is gone after its server
   * restarts (a cluster keeps it while a majority of its replicas stays up); its service then
   * recreates and rebuilds it (libs/runtime/src/projection-rebuild.ts).
   */
  storage: 'file' | 'memory';
}

/** The streams, durable consumers and KV buckets of one prefix, in the server's own field names. */
/** One tenant's streams and their durables (docs/tenancy.md). */
export interface TenantTopology {
  id: string;
  limits: TenantLimits;
  /** Its intents: bounded, discard new (a bound refuses new messages, never drops stored ones). */
  intents: Partial<StreamConfig> & { name: string };
  /** Its refusal and alias records: bounded, discard old (only its own oldest go). */
  decisions: Partial<StreamConfig> & { name: string };
  consumers: ConsumerDef[];
}

export interface Topology {
  streams: {
    events: Partial<StreamConfig> & { name: string };
    /** The max-deliveries advisories of our consumers: no message dies silently. */
    advisories: Partial<StreamConfig> & { name: string };
    /** Every auditor query and export, recorded by the audit service before it answers. */
    auditLog: Partial<StreamConfig> & { name: string };
  };
  consumers: ConsumerDef[];
  /** The tenants' own streams; undefined when the topology was built without the tenant list (a service). */
  tenants: TenantTopology[] | undefined;
  /** The tenants and their limits (KV, key = tenant id): the provisioner writes it, the services watch it. */
  tenantsBucket: BucketDef;
  results: BucketDef;
  /**
   * Debug sampling (docs/debug-samples.md): the switches, and the samples the executor keeps while
   * one is on. File storage, max age {@link SAMPLES_MAX_AGE_MS} (the longest sampling window): a
   * sample is purged at its window's end and gone from storage within that bound whatever happens.
   */
  debug: { sampling: BucketDef; samples: BucketDef };
  /**
   * KV projections of the event log, one entry per operation under `<tenant>.<opId>`:
   * `reconcile` = the reconciler's index of non-terminal operations, `audit` = one audit record per
   * operation. Written only by their service, with compare-and-set on the entry's revision. Memory
   * storage ({@link BucketDef.storage}): their service rebuilds them from the log when lost.
   */
  projections: { reconcile: BucketDef; audit: BucketDef };
  /**
   * Frozen tasks (FM-14): one entry per task with an operation under takeover, written by
   * the reconciler, watched by the authorizer and the executor. No max age: a task stays frozen
   * until a person resolves it.
   */
  tasks: BucketDef;
  /**
   * The contract registry (docs/contracts.md): every contract version the services hold and which
   * one of each name is current, deprecations, retirements and reverts, with who made each change.
   * Not a projection: decisions that exist nowhere else, so file storage and no max age.
   */
  contracts: BucketDef;
}

/** Durable consumer names (one per service: limits retention gives every durable every message). */
export const Durables = {
  authorizer: 'authorizer',
  executor: 'executor',
  reconciler: 'reconciler',
  /** The reconciler's durable on the advisories stream: event-log messages a durable gave up on. */
  reconcilerAdvisories: 'reconciler-advisories',
  auditProjector: 'audit-projector',
  /** The audit-projector's durable on the decision stream: refusals and conflicts. */
  auditDecisions: 'audit-decisions',
  /**
   * The one reader of the event log of a process that hosts the executor, the reconciler and the
   * audit-projector together (`tooltx serve`): each event is delivered and acked once for the three
   * (docs/operating.md "One process or four").
   */
  host: 'host',
} as const;

/**
 * The topology for `subjects.prefix`. Every stream: file storage (the projection buckets alone
 * are in memory: {@link BucketDef.storage}), limits retention (a work-queue
 * stream would forget registrations once acked: docs/lifecycle.md), purge denied, direct get
 * allowed. The shared streams have no msg/byte or per-subject limit that could evict a
 * registration, and deny delete; each tenant's intake and decision streams are bounded by its
 * limits (docs/tenancy.md).
 */
export function topology(subjects: Subjects, opts: TopologyOptions = {}): Topology {
  const replicas = opts.replicas ?? 1;
  const eventsMaxAgeMs = opts.eventsMaxAgeMs ?? 30 * DAY;
  const projectionsMaxAgeMs = opts.projectionsMaxAgeMs ?? eventsMaxAgeMs + DAY;
  const dup = nanos(opts.duplicateWindowMs ?? 2 * MINUTE);
  const maxDeliver = opts.maxDeliver ?? MAX_DELIVER;
  const advisories = `${subjects.prefix.toUpperCase()}_ADVISORIES`;
  const maxDeliveriesOf = (stream: string) => `$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.${stream}.*`;
  const durable = (
    name: string,
    subjectsList: string[],
    maxAgeMs: number,
  ): Partial<StreamConfig> & { name: string } => ({
    name,
    subjects: subjectsList,
    retention: RetentionPolicy.Limits,
    storage: StorageType.File,
    discard: DiscardPolicy.Old,
    max_msgs: -1,
    max_bytes: -1,
    max_msgs_per_subject: -1,
    max_age: nanos(maxAgeMs),
    duplicate_window: dup,
    num_replicas: replicas,
    deny_delete: true,
    deny_purge: true,
    allow_direct: true,
  });
  /** A durable pull consumer over every operation event, explicit ack, from the start of the log. */
  const eventLogConsumer = (durable_name: string): ConsumerDef => ({
    stream: subjects.eventsStream,
    config: {
      durable_name,
      filter_subject: subjects.allOps,
      ack_policy: AckPolicy.Explicit,
      deliver_policy: DeliverPolicy.All,
      ack_wait: nanos(30_000),
      max_ack_pending: 1_000,
      // Finite: a message that keeps failing stops being redelivered, and the server's
      // max-deliveries advisory is kept in the advisories stream (the reconciler's sweep still
      // finds the operation by its state).
      max_deliver: maxDeliver,
    },
  });
  const tenants = opts.tenants?.map((t): TenantTopology => {
    const intents = {
      ...durable(subjects.intentsStream(t.id), [subjects.intentsOf(t.id)], opts.intentsMaxAgeMs ?? 7 * DAY),
      // The tenant's own bounds (docs/tenancy.md): past them a publish is refused (10077, 10054)
      // and nothing stored is dropped. An intent that registered nothing (a refusal) is deleted by
      // the authorizer once its decision is recorded, so a flood of refused intents does not hold
      // the tenant's quota for the stream's max_age.
      discard: DiscardPolicy.New,
      max_bytes: t.limits.intentBytes,
      max_msgs: t.limits.intentMessages,
      max_msg_size: t.limits.maxIntentBytes,
      deny_delete: false,
    };
    const decisions = {
      ...durable(subjects.decisionsStream(t.id), [subjects.decisionsOf(t.id)], opts.decisionsMaxAgeMs ?? 30 * DAY),
      // Past its bound the tenant's own oldest records go (their audit records stay in the audit
      // projection); a refusal is never itself refused for want of room.
      discard: DiscardPolicy.Old,
      max_bytes: t.limits.decisionBytes,
    };
    return {
      id: t.id,
      limits: t.limits,
      intents,
      decisions,
      consumers: [
        {
          stream: intents.name,
          config: {
            durable_name: Durables.authorizer,
            filter_subject: subjects.intentsOf(t.id),
            ack_policy: AckPolicy.Explicit,
            deliver_policy: DeliverPolicy.All,
            ack_wait: nanos(30_000),
            // Per tenant: one tenant's unacked intents never hold another's (docs/tenancy.md).
            max_ack_pending: 256,
            // Finite: a message that keeps failing stops being redelivered, and the server's
            // max-deliveries advisory is kept in the advisories stream.
            max_deliver: maxDeliver,
          },
        },
        // Pre-acceptance outcomes (refusals at intake, idempotency conflicts) for the audit records.
        {
          stream: decisions.name,
          config: {
            ...eventLogConsumer(Durables.auditDecisions).config,
            filter_subject: subjects.decisionsOf(t.id),
            max_ack_pending: 256,
          },
        },
      ],
    };
  });
  return {
    streams: {
      events: durable(subjects.eventsStream, [subjects.allOps], eventsMaxAgeMs),
      advisories: durable(
        `${subjects.prefix.toUpperCase()}_ADVISORIES`,
        [subjects.eventsStream, ...(tenants ?? []).flatMap((t) => [t.intents.name, t.decisions.name])].map(
          (s) => `$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.${s}.*`,
        ),
        opts.eventsMaxAgeMs ?? 30 * DAY,
      ),
      auditLog: durable(subjects.auditLogStream, [subjects.allAuditLog], opts.auditLogMaxAgeMs ?? 365 * DAY),
    },
    tenants,
    tenantsBucket: { bucket: subjects.tenantsBucket, ttlMs: 0, replicas, storage: 'file' },
    consumers: [
      eventLogConsumer(Durables.executor),
      // The projections: each reads every event of the log once per service (any number of instances).
      eventLogConsumer(Durables.reconciler),
      eventLogConsumer(Durables.auditProjector),
      // A process hosting those three roles reads the log once, on its own durable, for all three.
      eventLogConsumer(Durables.host),
      {
        // The reconciler reads the advisories of the event log's durables: each names a message
        // a service gave up on; the reconciler puts its operation back in its watch.
        // No max_deliver: an advisory is the last trace of that message and is never given up on.
        stream: advisories,
        config: {
          durable_name: Durables.reconcilerAdvisories,
          filter_subject: maxDeliveriesOf(subjects.eventsStream),
          ack_policy: AckPolicy.Explicit,
          deliver_policy: DeliverPolicy.All,
          ack_wait: nanos(30_000),
          max_ack_pending: 1_000,
        },
      },
    ],
    results: { bucket: subjects.resultsBucket, ttlMs: opts.resultsMaxAgeMs ?? 31 * DAY, replicas, storage: 'file' },
    debug: {
      sampling: { bucket: subjects.samplingBucket, ttlMs: SAMPLES_MAX_AGE_MS, replicas, storage: 'file' },
      samples: { bucket: subjects.samplesBucket, ttlMs: SAMPLES_MAX_AGE_MS, replicas, storage: 'file' },
    },
    projections: {
      reconcile: { bucket: subjects.reconcileBucket, ttlMs: projectionsMaxAgeMs, replicas, storage: 'memory' },
      audit: { bucket: subjects.auditBucket, ttlMs: projectionsMaxAgeMs, replicas, storage: 'memory' },
    },
    tasks: { bucket: subjects.tasksBucket, ttlMs: 0, replicas, storage: 'file' },
    contracts: { bucket: subjects.contractsBucket, ttlMs: 0, replicas, storage: 'file' },
  };
}
