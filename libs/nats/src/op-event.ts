import type { JsMsg } from '@nats-io/jetstream';
import type { Logger } from 'pino';
import { operationIdOf } from '@tooltx/contracts';
import { operationEventSchema, type OperationEvent } from '@tooltx/lifecycle';
import { decodeMsg } from './codec.js';
import type { Settlement } from './consumer.js';
import type { Subjects } from './subjects.js';

/**
 * An event-log message as a projection reads it: the event decoded (an undecodable one throws
 * `CodecError`, which the consumer loop `term`s), its subject's tenant and operation, and the
 * projection key `<tenant>.<opId>` — or a `term` settlement when the message is not on an operation
 * subject or the state it carries belongs to another tenant or operation (logged as an error).
 */
export function opEventOf(
  subjects: Subjects,
  msg: JsMsg,
  log: Logger,
):
  | { kind: 'event'; tenant: string; opId: string; key: string; event: OperationEvent }
  | Extract<Settlement, { kind: 'term' }> {
  const where = subjects.parseOpSubject('op', msg.subject);
  if (!where) return { kind: 'term', reason: 'not an operation subject' };
  const event = decodeMsg(operationEventSchema, msg);
  if (event.state.tenant !== where.tenant || operationIdOf(event.state.operationKey) !== where.opId) {
    log.error({ seq: msg.seq, tenant: where.tenant }, 'event does not belong to its operation subject');
    return { kind: 'term', reason: 'event does not belong to its subject' };
  }
  return {
    kind: 'event',
    tenant: where.tenant,
    opId: where.opId,
    key: subjects.projectionKey(where.tenant, where.opId),
    event,
  };
}
