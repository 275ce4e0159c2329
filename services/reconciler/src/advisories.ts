import type { JsMsg } from '@nats-io/jetstream';
import type { KV } from '@nats-io/kv';
import { z } from 'zod';
import { attemptEnded } from '@tooltx/lifecycle';
import type { JetStreamStore, Settlement, Subjects } from '@tooltx/nats';
import { projectEntry } from '@tooltx/runtime';
import type { Logger } from '@tooltx/runtime';
import { applyStateToIndex, reconcileValueSchema } from './reconcile-index.js';

/**
 * The server's max-deliveries advisory (NATS docs, "Monitoring JetStream: advisories",
 * `$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.<stream>.<consumer>`): the durable `consumer` gave up
 * on the message `stream_seq` of `stream` after `deliveries` deliveries.
 */
export const maxDeliveriesAdvisorySchema = z.object({
  type: z.literal('io.nats.jetstream.advisory.v1.max_deliver'),
  stream: z.string(),
  consumer: z.string(),
  stream_seq: z.number().int().positive(),
  deliveries: z.number().int().nonnegative(),
});
export type MaxDeliveriesAdvisory = z.infer<typeof maxDeliveriesAdvisorySchema>;

/**
 * The reconciler's handler of the advisories stream ("no message dies silently, even while
 * the reconciler is down"). For each advisory naming a message of the event log: read that message
 * (its subject names the operation), read the operation's LAST event, and put the operation back in
 * the reconciler's index from it, with the projection's own rule and compare-and-set — so the sweep
 * watches it again and acts as for any other operation: a stale `accepted` is re-driven, a `running`
 * past its deadline is probed and recovered, an `unknown` probed; a terminal one leaves a tombstone.
 *
 * Settlement: acked once the index holds the operation's latest state (or there is nothing to do: a
 * message no longer stored, another stream, not an operation); an unreadable advisory is `term`ed;
 * a store or NATS failure is thrown (the consumer loop naks with backoff, the advisory is never
 * given up on: its durable has no max_deliver).
 */
export function advisoryHandler(deps: {
  store: Pick<JetStreamStore, 'subjectAt' | 'load'>;
  subjects: Subjects;
  index: KV;
  log: Logger;
}): (msg: JsMsg) => Promise<Settlement | void> {
  const { store, subjects, index, log } = deps;
  const events = subjects.eventsStream;
  return async (msg) => {
    let a: MaxDeliveriesAdvisory;
    try {
      a = maxDeliveriesAdvisorySchema.parse(JSON.parse(new TextDecoder().decode(msg.data)));
    } catch (err) {
      log.error({ err, seq: msg.seq, subject: msg.subject }, 'unreadable max-deliveries advisory');
      return { kind: 'term', reason: 'unreadable advisory' };
    }
    const l = log.child({ consumer: a.consumer, streamSeq: a.stream_seq, deliveries: a.deliveries });
    if (a.stream !== events)
      return void l.warn({ stream: a.stream }, 'max-deliveries advisory of another stream: nothing to do');
    const subject = await store.subjectAt(a.stream_seq);
    if (!subject) return void l.error('max-deliveries advisory names a message no longer stored');
    const where = subjects.parseOpSubject('op', subject);
    if (!where)
      return void l.error({ subject }, 'max-deliveries advisory names a message that is not an operation event');
    const { state, seq } = await store.load(where.tenant, where.opId);
    if (state.status === 'none') return void l.error({ subject }, 'operation has no event any more');
    const outcome = await projectEntry({
      kv: index,
      key: subjects.projectionKey(where.tenant, where.opId),
      schema: reconcileValueSchema,
      apply: (current) => applyStateToIndex(current, state, seq),
    });
    l.warn(
      { tenant: where.tenant, operationKey: state.operationKey, status: state.status, index: outcome.kind },
      attemptEnded(state.status)
        ? 'max-deliveries advisory: operation already settled'
        : "max-deliveries advisory: operation back in the reconciler's watch",
    );
  };
}
