import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ConcurrencyError, decide, type AcceptCommand, type OperationEvent } from '@tooltx/lifecycle';
import { DiscardPolicy, RetentionPolicy } from '@nats-io/jetstream';
import {
  encode,
  EVENT_TYPE_HEADER,
  eventTypeOf,
  isNoRespondersPublish,
  isTransient,
  newEventId,
  Subjects,
} from '@tooltx/nats';
import { applyTopology, checkTopology, topology } from '@tooltx/streams';
import { tenantsOf } from '@tooltx/auth';
import { provisioned, TEST_IDENTITIES, type TestNats } from '../../../test/helpers/nats.js';

const D = (c: string) => `sha256:${c.repeat(64)}`;
let opSeq = 0;
const nextOpId = () => (++opSeq).toString(16).padStart(32, '0');

function acceptedEvent(intentSeq = 1): OperationEvent {
  const cmd: AcceptCommand = {
    type: 'accept',
    eventId: newEventId(),
    at: Date.now(),
    operationKey: `opk_${'B'.repeat(43)}`,
    tenant: 'acme',
    actor: 'alice',
    taskId: 't',
    tool: 'sink.write',
    version: 1,
    contractDigest: D('1'),
    effect: 'create',
    inputDigest: D('2'),
    targetDigest: D('3'),
    intentSeq,
    submissionId: 's',
  };
  const d = decide(cmd, { status: 'none' });
  if (d.kind !== 'append') throw new Error('expected append');
  return d.event;
}

describe('the JetStream event store (real nats-server)', () => {
  let t: TestNats;
  beforeAll(async () => {
    t = await provisioned({ duplicateWindowMs: 1_000 });
  });
  afterAll(() => t.close());

  it('FM-29: a publish that reached no stream (nats.js: JetStreamNotEnabled from no responders) is transient — nothing was stored; a refused or wrong-sequence publish is not', async () => {
    const err = await t.js.publish(`${t.subjects.prefix}.nostream.x`, new Uint8Array([1]), { timeout: 2_000 }).then(
      () => null,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(Error);
    expect((err as Error).name).toBe('JetStreamNotEnabled');
    expect(isNoRespondersPublish(err)).toBe(true);
    expect(isTransient(err)).toBe(true);
    const opId = nextOpId();
    await t.store.append('acme', opId, acceptedEvent(), 0);
    const wrongSeq = await t.js
      .publish(t.subjects.op('acme', opId), new Uint8Array([1]), { expect: { lastSubjectSequence: 0 } })
      .then(
        () => null,
        (e: unknown) => e,
      );
    expect(isNoRespondersPublish(wrongSeq)).toBe(false);
    expect(isTransient(wrongSeq)).toBe(false);
  });

  it('lets exactly one of ten concurrent first appends win; the others get a ConcurrencyError', async () => {
    const opId = nextOpId();
    const results = await Promise.allSettled(
      Array.from({ length: 10 }, () => t.store.append('acme', opId, acceptedEvent(), 0)),
    );
    expect(results.filter((r) => r.status === 'fulfilled')).toHaveLength(1);
    const losers = results.filter((r): r is PromiseRejectedResult => r.status === 'rejected');
    expect(losers).toHaveLength(9);
    for (const l of losers) expect(l.reason).toBeInstanceOf(ConcurrencyError);
    const loaded = await t.store.load('acme', opId);
    expect(loaded.state.status).toBe('accepted');
  });

  it('treats a retransmission of the same event as the same append (dedup answer verified by reading back)', async () => {
    const opId = nextOpId();
    const e = acceptedEvent();
    const s1 = await t.store.append('acme', opId, e, 0);
    const s2 = await t.store.append('acme', opId, e, 0);
    expect(s2).toBe(s1);
  });

  it('does not believe a duplicate answer for a squatted msg id: the squatter is told it lost', async () => {
    const opId = nextOpId();
    const mine = acceptedEvent();
    // Someone else publishes first, on another subject of the stream, under my event id.
    await t.js.publish(t.subjects.op('other', nextOpId()), encode(acceptedEvent()), { msgID: mine.eventId });
    await expect(t.store.append('acme', opId, mine, 0)).rejects.toBeInstanceOf(ConcurrencyError);
  });

  it('FM-30 groundwork: a retransmission after the dedup window is recognised as its own landed append', async () => {
    const opId = nextOpId();
    const e = acceptedEvent();
    const s1 = await t.store.append('acme', opId, e, 0);
    await new Promise((r) => setTimeout(r, 1_300));
    expect(await t.store.append('acme', opId, e, 0)).toBe(s1);
    const info = await t.jsm.streams.info(t.subjects.eventsStream, { subjects_filter: t.subjects.op('acme', opId) });
    expect(info.state.subjects?.[t.subjects.op('acme', opId)]).toBe(1);
  });

  it('stores every event with its type in the Tooltx-Event-Type header, which a reader can act on without decoding the body', async () => {
    const opId = nextOpId();
    const seq = await t.store.append('acme', opId, acceptedEvent(), 0);
    const stored = await t.jsm.streams.getMessage(t.subjects.eventsStream, { seq });
    expect(stored?.header.get(EVENT_TYPE_HEADER)).toBe('accepted');
    expect(eventTypeOf({ headers: stored?.header })).toBe('accepted');
    // A message without the header (written before it existed) names no type: the reader decodes it.
    expect(eventTypeOf({ headers: undefined })).toBeUndefined();
  });

  it('refuses an append whose expected sequence is stale', async () => {
    const opId = nextOpId();
    const a = acceptedEvent();
    const seq = await t.store.append('acme', opId, a, 0);
    const start = decide(
      { type: 'start', eventId: newEventId(), at: Date.now(), attempt: 1, executor: 'x', deadlineAt: Date.now() + 1 },
      a.state,
    );
    if (start.kind !== 'append') throw new Error('expected append');
    await t.store.append('acme', opId, start.event, seq);
    const again = decide(
      { type: 'start', eventId: newEventId(), at: Date.now(), attempt: 1, executor: 'y', deadlineAt: Date.now() + 1 },
      a.state,
    );
    if (again.kind !== 'append') throw new Error('expected append');
    await expect(t.store.append('acme', opId, again.event, seq)).rejects.toBeInstanceOf(ConcurrencyError);
  });
});

describe('stream checks', () => {
  it('names every setting that breaks a guarantee', async () => {
    const t = await provisioned();
    try {
      // A careless operator creates another prefix's streams by hand (the server refuses to turn
      // deny_purge off later, so a bad stream can only be born bad).
      const bad = new Subjects(`${t.subjects.prefix}x`);
      const topo = topology(bad, { tenants: tenantsOf(TEST_IDENTITIES) });
      await t.jsm.streams.add({ ...topo.streams.events, deny_purge: false, max_msgs_per_subject: 1 });
      await t.jsm.streams.add({
        ...topo.tenants![0]!.intents,
        retention: RetentionPolicy.Workqueue,
        discard: DiscardPolicy.Old,
      });
      const v = await checkTopology(t.jsm, topo, { longestKeyRetentionMs: 365 * 24 * 3600_000 });
      expect(v).toEqual(
        expect.arrayContaining([
          expect.stringContaining(`stream ${bad.eventsStream} deny_purge`),
          expect.stringContaining(`stream ${bad.eventsStream} max_msgs_per_subject`),
          expect.stringContaining(`stream ${bad.intentsStream('acme')} retention`),
          expect.stringContaining(`stream ${bad.intentsStream('acme')} discard is old, must be new`),
          expect.stringContaining('shorter than the longest contract key retention'),
          expect.stringContaining(`stream ${bad.decisionsStream('acme')} does not exist`),
          expect.stringContaining(`consumer ${bad.intentsStream('acme')}/authorizer does not exist`),
          expect.stringContaining(`bucket ${bad.resultsBucket} does not exist`),
          expect.stringContaining(`consumer ${bad.eventsStream}/reconciler does not exist`),
          expect.stringContaining(`consumer ${bad.eventsStream}/audit-projector does not exist`),
        ]),
      );
      // A missing projection bucket is not a fault: it is in memory, and its service creates it again.
      expect(v.filter((x) => x.includes(bad.reconcileBucket) || x.includes(bad.auditBucket))).toEqual([]);
      expect(await checkTopology(t.jsm, t.topo, { longestKeyRetentionMs: 1 })).toEqual([]);
      // A service knows no tenant: it checks the shared streams only.
      expect(await checkTopology(t.jsm, topology(t.subjects), { longestKeyRetentionMs: 1 })).toEqual([]);
    } finally {
      await t.close();
    }
  });

  it('a projection bucket on file storage (a deployment from before): the check names it, apply deletes it and creates it in memory, saying so; the event log is untouched, and another bucket of the wrong storage is refused', async () => {
    const t = await provisioned({}, undefined, { apply: false });
    try {
      // The buckets as an older provisioner made them: every one on file storage.
      const old = {
        ...t.topo,
        projections: {
          reconcile: { ...t.topo.projections.reconcile, storage: 'file' as const },
          audit: { ...t.topo.projections.audit, storage: 'file' as const },
        },
      };
      await applyTopology(t.nc, t.jsm, old);
      await t.js.publish(`$KV.${t.subjects.auditBucket}.acme.x`, new Uint8Array([1]));
      await t.js.publish(t.subjects.op('acme', 'a'.repeat(32)), new Uint8Array([1]));
      const v = await checkTopology(t.jsm, t.topo, { longestKeyRetentionMs: 1 });
      expect(v).toEqual([
        expect.stringContaining(`bucket ${t.subjects.reconcileBucket} storage is file, must be memory`),
        expect.stringContaining(`bucket ${t.subjects.auditBucket} storage is file, must be memory`),
      ]);
      const report = await applyTopology(t.nc, t.jsm, t.topo);
      expect(report.recreated).toEqual([
        expect.stringMatching(
          new RegExp(`^bucket ${t.subjects.reconcileBucket}: storage file → memory .*rebuilt from the log`),
        ),
        expect.stringMatching(
          new RegExp(`^bucket ${t.subjects.auditBucket}: storage file → memory .*rebuilt from the log`),
        ),
      ]);
      for (const b of [t.subjects.reconcileBucket, t.subjects.auditBucket]) {
        const info = await t.jsm.streams.info(`KV_${b}`);
        expect({ b, storage: info.config.storage, messages: info.state.messages }).toEqual({
          b,
          storage: 'memory',
          messages: 0,
        });
      }
      expect((await t.jsm.streams.info(t.subjects.eventsStream)).state.messages).toBe(1);
      expect(await checkTopology(t.jsm, t.topo, { longestKeyRetentionMs: 1 })).toEqual([]);
      // Applied again: nothing to recreate.
      expect((await applyTopology(t.nc, t.jsm, t.topo)).recreated).toBeUndefined();
      // The result store holds what exists nowhere else: never deleted for its storage.
      const wrong = { ...t.topo, results: { ...t.topo.results, storage: 'memory' as const } };
      await expect(applyTopology(t.nc, t.jsm, wrong)).rejects.toThrow(
        `bucket ${t.subjects.resultsBucket} storage is file, must be memory; it is not a projection`,
      );
      expect((await t.jsm.streams.info(`KV_${t.subjects.resultsBucket}`)).config.storage).toBe('file');
    } finally {
      await t.close();
    }
  });

  it('refuses a result store that would forget results before the event log forgets their registrations (result store ≥ event log max_age)', async () => {
    const t = await provisioned({ resultsMaxAgeMs: 60_000 });
    try {
      const v = await checkTopology(t.jsm, topology(t.subjects), { longestKeyRetentionMs: 1 });
      expect(v).toEqual([
        expect.stringContaining(`bucket ${t.subjects.resultsBucket} max_age 60000 ms is shorter than the event log's`),
      ]);
    } finally {
      await t.close();
    }
  });

  it('refuses projection buckets whose entries (tombstones included) would expire before the events they shadow', async () => {
    const t = await provisioned({ projectionsMaxAgeMs: 60_000 });
    try {
      const v = await checkTopology(t.jsm, topology(t.subjects), { longestKeyRetentionMs: 1 });
      expect(v).toEqual([
        expect.stringContaining(
          `bucket ${t.subjects.reconcileBucket} max_age 60000 ms is shorter than the event log's`,
        ),
        expect.stringContaining(`bucket ${t.subjects.auditBucket} max_age 60000 ms is shorter than the event log's`),
      ]);
    } finally {
      await t.close();
    }
  });
});
