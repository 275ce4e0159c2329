/**
 * The lower bounds of a call, in the bench's own process, no services:
 * - (a) per call, three sequential JetStream publishes on one per-operation subject
 *   (`<p>.op.<tenant>.<opId>` of a stream configured exactly like tooltx's event log), each with a
 *   msg id and the expected last subject sequence (0, then the seq of the previous publish) —
 *   accepted, running, committed;
 * - (b) the same plus the KB's SQLite insert between running and committed: `KbStore.writeNote` of
 *   examples/research-kb/kb-store.ts (WAL, `synchronous=FULL`, one IMMEDIATE transaction with the
 *   KB's resolve, role, quota and deadline checks) with dedup off, like the KB service runs in the bench.
 * - with `effectsFile` (the peers workload's `floor-fsync`, bench/peers.ts): (a) plus the line
 *   `<key> <execId>` appended to that file between running and committed (bench/peers-effects.ts).
 *
 * A call whose first publish answers `duplicate: true` (same msg id inside the dedup window) or
 * 10071 (the subject already has events) found a known key: it ends there, one round trip, no
 * side effect — the least any system must do for a resubmission. Status = one direct get of the
 * last event on the operation's subject (the least a status read costs).
 */
import { createHash, randomBytes } from 'node:crypto';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import {
  connectNats,
  isWrongLastSequence,
  jetStreamOf,
  Subjects,
  type Durability,
  type NatsConnection,
} from '@tooltx/nats';
import { topology } from '@tooltx/streams';
import { KbStore } from '../examples/research-kb/kb-store.js';
import { countEffects, effectsAppender, effectsKey } from './peers-effects.js';
import { startBenchServer, type BenchServer } from './server.js';
import type { BenchSystem, Outcome } from './workload.js';

export const FLOOR_CONNECTION = 'bench-floor';

/** The operation id of call `k` of run `runId` in the floors: 32 hex digits, as tooltx's are. */
export function floorOpId(runId: string, k: number): string {
  return createHash('sha256').update(`${runId}:${k}`).digest('hex').slice(0, 32);
}
const TENANT = 'acme';
const ACTOR = 'researcher';

export interface FloorOptions {
  dir: string;
  prefix: string;
  /** With the KB's SQLite insert (floor b). */
  sqlite: boolean;
  /** Bytes of each published event's payload (run.ts: a tooltx lifecycle event's mean size). */
  payloadBytes: number;
  runId: string;
  /** What the server's acknowledgements promise (default `fsync`). */
  durability?: Durability;
  /** The peers workload's side effect: one line per call appended to this file (bench/peers-effects.ts). */
  effectsFile?: string;
  /** The system's name in progress lines (default `floor(a)` or `floor(b)`). */
  label?: string;
}

export async function startFloor(o: FloorOptions): Promise<BenchSystem> {
  const server: BenchServer = await startBenchServer(join(o.dir, 'nats'), o.prefix, {
    durability: o.durability ?? 'fsync',
  });
  let nc: NatsConnection | undefined;
  let store: KbStore | undefined;
  try {
    const subjects = new Subjects(o.prefix);
    nc = await connectNats({
      servers: server.url,
      name: FLOOR_CONNECTION,
      nkeySeedFile: server.seedFile({ kind: 'provisioner' }),
      inboxPrefix: '_INBOX._provisioner',
      reconnectForever: false,
    });
    const { js, jsm } = await jetStreamOf(nc);
    const events = topology(subjects).streams.events;
    await jsm.streams.add(events);
    let kbId = '';
    let authVersion = 0;
    if (o.sqlite) {
      mkdirSync(join(o.dir, 'kb'), { recursive: true });
      store = new KbStore({ path: join(o.dir, 'kb', 'kb.sqlite'), dedup: false });
      store.ensureKnowledgeBase(TENANT, 'research');
      const r = store.resolveFor(TENANT, ACTOR, 'research');
      if (!r) throw new Error('floor KB not seeded');
      kbId = r.kbId;
      authVersion = r.authVersion;
    }
    const payload = randomBytes(o.payloadBytes);
    const subjectOf = (k: number) => subjects.op(TENANT, floorOpId(o.runId, k));
    const conn = nc;
    const kb = store;
    const effects = o.effectsFile ? effectsAppender(o.effectsFile) : undefined;

    const call = async (k: number): Promise<Outcome> => {
      const subject = subjectOf(k);
      const id = `${o.runId}.${k}`;
      let s1: number;
      try {
        const a = await js.publish(subject, payload, { msgID: `${id}.accepted`, expect: { lastSubjectSequence: 0 } });
        if (a.duplicate) return { ok: true };
        s1 = a.seq;
      } catch (err) {
        if (isWrongLastSequence(err)) return { ok: true };
        throw err;
      }
      const r = await js.publish(subject, payload, { msgID: `${id}.running`, expect: { lastSubjectSequence: s1 } });
      let resourceId = subject;
      if (kb) {
        const w = kb.writeNote(
          {
            tenant: TENANT,
            actor: ACTOR,
            key: `${TENANT}:${id}`,
            deadlineAt: Date.now() + 5_000,
            ifMatch: authVersion,
          },
          {
            kb: kbId,
            title: `bench note ${k}`,
            body: `Body of bench note ${k}.`,
            sourceUrl: `https://example.org/bench/${k}`,
            fetchedAt: new Date().toISOString(),
          },
        );
        if (w.kind !== 'created') return { ok: false, error: `kb ${w.kind}` };
        resourceId = w.note.id;
      }
      if (effects) resourceId = effects.append(effectsKey(o.runId, k));
      await js.publish(subject, payload, { msgID: `${id}.committed`, expect: { lastSubjectSequence: r.seq } });
      return { ok: true, resourceId };
    };

    return {
      label: o.label ?? (o.sqlite ? 'floor(b)' : 'floor(a)'),
      call,
      async status(k) {
        const m = await jsm.direct.getMessage(events.name, { last_by_subj: subjectOf(k) });
        return m !== null && m !== undefined;
      },
      async rows() {
        if (o.effectsFile) {
          const c = countEffects(o.effectsFile);
          return { rows: c.rows, duplicateRows: c.duplicateRows };
        }
        if (!kb) return null;
        const s = kb.stats({ tenant: TENANT });
        return { rows: s.rows, duplicateRows: s.duplicateRows };
      },
      processes: [
        { name: 'client', pid: process.pid, connections: [FLOOR_CONNECTION] },
        { name: 'nats-server', pid: server.pid, connections: [] },
      ],
      monitorUrl: server.monitorUrl,
      async stop() {
        await conn.drain().catch(() => undefined);
        kb?.close();
        effects?.close();
        await server.stop();
      },
    };
  } catch (err) {
    await nc?.close().catch(() => undefined);
    store?.close();
    await server.stop();
    throw err;
  }
}
