import type { JsMsg } from '@nats-io/jetstream';
import type { KV } from '@nats-io/kv';
import { attemptEnded } from '@tooltx/lifecycle';
import { CodecError, opEventOf, type Subjects } from '@tooltx/nats';
import { projectEntry, type Logger, type ProjectionRebuilder } from '@tooltx/runtime';
import { mayHaveBeenIndexed } from './index-writer.js';
import { applyToIndex, reconcileValueSchema, type ReconcileValue } from './reconcile-index.js';

/**
 * A rebuild of the reconciler's index from the event log (ProjectionGuard in @tooltx/runtime):
 * every event is folded, in memory, into its operation's value with the live path's pure rule
 * ({@link applyToIndex}); once the log is read, each operation's value is written with
 * compare-and-set under the same rule (a value the live path wrote meanwhile from a newer event
 * stays). Written: every open operation, and a tombstone for an ended one only where the live path
 * would have left one ({@link mayHaveBeenIndexed}: where an open entry may have existed), so the
 * rebuilt index holds what the live one held — not one tombstone per operation ever. Memory: one
 * value per operation in the log (an index entry, ~300 bytes) until the rebuild ends.
 *
 * An event redelivered after the rebuild is applied by the live path as any redelivery is; an
 * older event that reopens an operation the rebuild saw end (no tombstone to stop it) is closed
 * again by the sweep, which reads the operation before it acts (reconcile.ts, `close_entry`).
 */
export function indexRebuilder(d: {
  kv: KV;
  subjects: Subjects;
  log: Logger;
  /** The live path's hold, ms (TOOLTX_RECONCILE_INDEX_DELAY_MS). */
  delayMs: number;
}): ProjectionRebuilder {
  const folded = new Map<string, { value: ReconcileValue; write: boolean }>();
  return {
    apply(_source, msg: JsMsg) {
      let m: ReturnType<typeof opEventOf>;
      try {
        m = opEventOf(d.subjects, msg, d.log);
      } catch (err) {
        // What the live path terms: never applied there either.
        if (err instanceof CodecError) return void d.log.error({ err, seq: msg.seq }, 'undecodable event skipped');
        throw err;
      }
      if (m.kind === 'term') return undefined;
      const cur = folded.get(m.key);
      const value = applyToIndex(cur?.value ?? null, m.event, msg.seq);
      if (!value) return undefined;
      const s = m.event.state;
      folded.set(m.key, {
        value,
        write: !attemptEnded(s.status) || mayHaveBeenIndexed(s, d.delayMs),
      });
      return undefined;
    },
    async finish() {
      const writes: Promise<unknown>[] = [];
      for (const [key, { value, write }] of folded) {
        if (!write) continue;
        writes.push(
          projectEntry({
            kv: d.kv,
            key,
            schema: reconcileValueSchema,
            apply: (current) => (current && current.seq >= value.seq ? null : value),
          }),
        );
        if (writes.length >= 256) await Promise.all(writes.splice(0));
      }
      await Promise.all(writes);
      folded.clear();
    },
  };
}
