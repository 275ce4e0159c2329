import { AckPolicy, DeliverPolicy, DiscardPolicy, RetentionPolicy, StorageType, type ConsumerConfig, type StreamConfig } from '@nats-io/jetstream';
import { nanos } from '@nats-io/transport-node';
import type { Subjects } from '@tooltx/nats';

const MINUTE = 60_000;
const DAY = 24 * 60 * MINUTE;

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
  /** Nats-Msg-Id dedup window of every stream. Default 2 minutes (the server default). */
  duplicateWindowMs?: number;
  /** Stream replicas: 1 on one server, 3 on a cluster (2.9.21+, DESIGN.md "Scale-out"). */
  replicas?: number;
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
}

/** The streams, durable consumers and KV buckets of one prefix, in the server's own field names. */
export interface Topology {
  streams: { intents: Partial<StreamConfig> & { name: string }; events: Partial<StreamConfig> & { name: string }; decisions: Partial<StreamConfig> & { name: string } };
  consumers: ConsumerDef[];
  results: BucketDef;
}

/** Durable consumer names (one per service: limits retention gives every durable every message). */
export const Durables = {
  authorizer: 'authorizer',
  executor: 'executor',
} as const;

/**
 * The topology for `subjects.prefix`. Every stream: file storage, limits retention (a work-queue
 * stream would forget registrations once acked, NATS-NOTES "First writer wins"), no msg/byte or
 * per-subject limits that could evict a registration, delete and purge denied, direct get allowed.
 */
export function topology(subjects: Subjects, opts: TopologyOptions = {}): Topology {
  const replicas = opts.replicas ?? 1;
  const dup = nanos(opts.duplicateWindowMs ?? 2 * MINUTE);
  const durable = (name: string, subjectsList: string[], maxAgeMs: number): Partial<StreamConfig> & { name: string } => ({
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
  return {
    streams: {
      intents: durable(subjects.intentsStream, [subjects.allIntents], opts.intentsMaxAgeMs ?? 7 * DAY),
      events: durable(subjects.eventsStream, [subjects.allOps], opts.eventsMaxAgeMs ?? 30 * DAY),
      decisions: durable(subjects.decisionsStream, [subjects.allDecisions], opts.decisionsMaxAgeMs ?? 30 * DAY),
    },
    consumers: [
      {
        stream: subjects.intentsStream,
        config: {
          durable_name: Durables.authorizer,
          filter_subject: subjects.allIntents,
          ack_policy: AckPolicy.Explicit,
          deliver_policy: DeliverPolicy.All,
          ack_wait: nanos(30_000),
          max_ack_pending: 1_000,
        },
      },
      {
        stream: subjects.eventsStream,
        config: {
          durable_name: Durables.executor,
          filter_subject: subjects.allOps,
          ack_policy: AckPolicy.Explicit,
          deliver_policy: DeliverPolicy.All,
          ack_wait: nanos(30_000),
          max_ack_pending: 1_000,
        },
      },
    ],
    results: { bucket: subjects.resultsBucket, ttlMs: opts.resultsMaxAgeMs ?? 31 * DAY, replicas },
  };
}
