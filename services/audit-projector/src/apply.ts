import type { JsMsg } from '@nats-io/jetstream';
import type { KV } from '@nats-io/kv';
import { operationIdOf } from '@tooltx/contracts';
import { operationEventSchema } from '@tooltx/lifecycle';
import { CodecError, decode, decodeMsg, type Settlement, type Subjects } from '@tooltx/nats';
import { ProjectionApplier, ProjectionBatcher, type ProjectionGuard, type ProjectionRebuilder } from '@tooltx/runtime';
import type { Logger } from '@tooltx/runtime';
import { z } from 'zod';
import {
  applyDecisionToAudit,
  applyEventToAudit,
  auditedDecisionSchema,
  auditedEventSchema,
  auditRecordSchema,
  type AuditHmac,
} from './audit-record.js';

/** Only the outcome of a decision-stream record: a refusal is projected, an alias is not. */
const decisionOutcomeSchema = z.object({ outcome: z.string().optional() });

export interface AuditApplyDeps {
  subjects: Subjects;
  kv: KV;
  hmac: AuditHmac;
  log: Logger;
  /**
   * How long an in-flight operation's events (accepted, running) wait to be written with the next
   * ones as one record write, ms (0 = each at once). An operation's final event writes its batch.
   */
  batchMs: number;
  /** Most operations waiting at once (see {@link ProjectionBatcher}). */
  maxHeld: number;
  /** The bucket's guard (memory storage, rebuilt when lost): writes wait until it is whole. */
  guard?: ProjectionGuard;
}

const IN_FLIGHT = new Set(['accepted', 'running']);

/**
 * The consumer-loop handlers of the audit projection, one per stream. For each message on
 * `<p>.op.<tenant>.<opId>` (event log) or `<p>.decision.<tenant>.<opId>` (decision stream): decode
 * it leniently (an undecodable one is `term`ed by the loop), check it belongs to its subject's
 * tenant and operation (else `term`), then compare-and-set the record under `<tenant>.<opId>` with
 * the pure rule and the message's stream sequence, through one {@link ProjectionApplier} (cached
 * entries, one key's applies in order: no read per message) and a {@link ProjectionBatcher} (an
 * in-flight operation's events wait, unacked, for its final one: one record write per operation).
 * Ack once written or found already applied.
 */
export function auditHandlers(d: AuditApplyDeps): {
  events: (msg: JsMsg) => Promise<Settlement | void>;
  decisions: (msg: JsMsg) => Promise<Settlement | void>;
  /** Writes every waiting batch now (on shutdown). */
  flush: () => Promise<void>;
} {
  // One writer for both streams: an operation's events and decisions land on the same record.
  const batcher = new ProjectionBatcher(new ProjectionApplier(d.kv, auditRecordSchema, 10_000, d.guard), {
    delayMs: d.batchMs,
    maxHeld: d.maxHeld,
  });
  const project = async (kind: 'op' | 'decision', msg: JsMsg): Promise<Settlement | void> => {
    const where = d.subjects.parseOpSubject(kind, msg.subject);
    if (!where) return { kind: 'term', reason: `not a ${kind} subject` };
    // An alias record (a submission that named its target through an alias, FM-10) is not an
    // outcome: its attempt is audited on the canonical operation, whose `accepted` names it.
    if (kind === 'decision' && decode(decisionOutcomeSchema, msg.data).outcome === 'aliased') return;
    const key = d.subjects.projectionKey(where.tenant, where.opId);
    const apply =
      kind === 'op'
        ? (() => {
            // An event this process appended was validated with the strict schema, which implies the
            // lenient one (audit-record.unit.test.ts); the rules below pick their fields.
            const e = decodeMsg(auditedEventSchema, msg, { impliedBy: operationEventSchema });
            if (e.state.tenant !== where.tenant || operationIdOf(e.state.operationKey) !== where.opId) return null;
            return {
              type: e.type,
              final: !IN_FLIGHT.has(e.state.status),
              fn: (cur: Parameters<typeof applyEventToAudit>[0]) => applyEventToAudit(cur, e, msg.seq, d.hmac),
            };
          })()
        : (() => {
            const r = decode(auditedDecisionSchema, msg.data);
            if (r.tenant !== where.tenant || r.actor !== where.actor || operationIdOf(r.operationKey) !== where.opId)
              return null;
            return {
              type: 'decision',
              final: true,
              fn: (cur: Parameters<typeof applyDecisionToAudit>[0]) => applyDecisionToAudit(cur, r, msg.seq),
            };
          })();
    if (!apply) {
      d.log.error({ seq: msg.seq, tenant: where.tenant, stream: kind }, 'message does not belong to its subject');
      return { kind: 'term', reason: 'message does not belong to its subject' };
    }
    const written = batcher.add(key, apply.fn, apply.final).then((outcome) => {
      d.log.debug(
        { key, seq: msg.seq, type: apply.type, deliveryCount: msg.info.deliveryCount, ...outcome },
        outcome.kind === 'written' ? 'projected' : 'projection unchanged',
      );
    });
    if (!apply.final) return { kind: 'defer', settled: written };
    await written;
  };
  return { events: (m) => project('op', m), decisions: (m) => project('decision', m), flush: () => batcher.flush() };
}

/**
 * A rebuild of the audit records from the event log and the tenants' decision streams
 * (ProjectionGuard in @tooltx/runtime): each message goes through the live path's own handlers
 * ({@link auditHandlers}: the same checks and the same pure rules), with a batch that waits up to a
 * minute for an operation's final event, so a rebuilt record costs about one write. The rules make
 * the records independent of order and repetition (audit-record.ts), so the rebuilt records equal
 * the live ones.
 */
export function auditRebuilder(d: Omit<AuditApplyDeps, 'guard' | 'batchMs' | 'maxHeld'>): ProjectionRebuilder {
  const h = auditHandlers({ ...d, batchMs: 60_000, maxHeld: 1_024 });
  /** In-flight events' writes: they wait for their operation's final event, or for `finish`. */
  const deferred: Promise<unknown>[] = [];
  const skipUndecodable = (seq: number) => (err: unknown) => {
    // What the live path terms (bytes that never decode): skipped here too.
    if (err instanceof CodecError) return void d.log.error({ err, seq }, 'undecodable message skipped');
    throw err;
  };
  return {
    apply: (source, msg) =>
      (source.stream === d.subjects.eventsStream ? h.events(msg) : h.decisions(msg)).then((r) => {
        if (r?.kind !== 'defer') return;
        // Awaited in `finish`; handled here so a failure before then is no unhandled rejection.
        r.settled.catch(() => undefined);
        deferred.push(r.settled);
      }, skipUndecodable(msg.seq)),
    async finish() {
      await h.flush();
      await Promise.all(deferred);
    },
  };
}
