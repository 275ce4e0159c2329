import { randomUUID } from 'node:crypto';
import type { JetStreamClient, PubAck } from '@nats-io/jetstream';
import type { IntentEnvelope } from '@tooltx/lifecycle';
import { encode, traceHeadersOf, type Subjects } from '@tooltx/nats';

/** One submission of an intent: its random id is reused only for retransmissions of it. */
export interface Submission {
  /** Nats-Msg-Id of this submission — random, never the operation key (dedup is stream-wide). */
  submissionId: string;
  subject: string;
  data: Uint8Array;
}

/**
 * Builds a submission for `<prefix>.intent.<tenant>.<actor>`. `data`: the envelope already encoded
 * (msgpack), when the caller has it (the SDK encodes once per call, not once per submission).
 */
export function newSubmission(
  subjects: Subjects,
  tenant: string,
  actor: string,
  envelope: IntentEnvelope,
  submissionId: string = randomUUID(),
  data: Uint8Array = encode(envelope),
): Submission {
  return { submissionId, subject: subjects.intent(tenant, actor), data };
}

/**
 * Publishes (or retransmits) a submission and returns the PubAck — the evidence the server stored
 * the intent. Throws the client's error when no PubAck arrives within `timeoutMs` (default 5 000);
 * a failed publish does not mean "not stored": retransmit the same submission. The active trace
 * context, when the application traces (docs/tracing.md), rides in the `traceparent` and
 * `tracestate` headers.
 */
export function publishSubmission(js: JetStreamClient, s: Submission, timeoutMs = 5_000): Promise<PubAck> {
  const headers = traceHeadersOf();
  return js.publish(s.subject, s.data, { msgID: s.submissionId, timeout: timeoutMs, ...(headers ? { headers } : {}) });
}
