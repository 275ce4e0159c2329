import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { KV } from '@nats-io/kv';
import { z } from 'zod';
import { decode, encode, type NatsConnection, openBucket } from '@tooltx/nats';
import { projectEntry, ProjectionCorruptError } from '@tooltx/runtime';
import { provisioned, type TestNats } from '../../../test/helpers/nats.js';
import { shuffled } from '../../../test/helpers/histories.js';

/** A minimal projection: keep the entry with the highest sequence. */
const entrySchema = z.object({ seq: z.number().int().positive(), by: z.string() });
type Entry = z.infer<typeof entrySchema>;
const newest =
  (seq: number, by: string) =>
  (cur: Entry | null): Entry | null =>
    cur && cur.seq >= seq ? null : { seq, by };

describe('KV projection entries with compare-and-set (real nats-server)', () => {
  let t: TestNats;
  let other: NatsConnection;
  let kvA: KV;
  let kvB: KV;
  beforeAll(async () => {
    t = await provisioned();
    // A second reconciler connection, with the reconciler's own identity and permissions.
    other = await t.connectAs({ kind: 'service', service: 'reconciler' });
    kvA = await openBucket(t.nc, t.subjects.reconcileBucket);
    kvB = await openBucket(other, t.subjects.reconcileBucket);
  });
  afterAll(async () => {
    await other?.drain().catch(() => undefined);
    await t?.close();
  });

  it('two connections racing on one key, with every sequence twice in a shuffled order, only ever move the entry forward', async () => {
    const key = 'acme.0123456789abcdef0123456789abcdef';
    const seqs = shuffled(
      [...Array(20).keys(), ...Array(20).keys()].map((i) => i + 1),
      11,
    );
    const outcomes = await Promise.all(
      seqs.map(async (seq, i) => ({
        seq,
        ...(await projectEntry({
          kv: i % 2 ? kvB : kvA,
          key,
          schema: entrySchema,
          apply: newest(seq, i % 2 ? 'b' : 'a'),
        })),
      })),
    );
    expect(decode(entrySchema, (await kvA.get(key))!.value).seq).toBe(20);
    // Ordered by KV revision, the sequences written only ever grow: nothing went backwards.
    const written = outcomes.flatMap((o) => (o.kind === 'written' ? [o] : [])).sort((a, b) => a.revision - b.revision);
    for (let i = 1; i < written.length; i++) expect(written[i]!.seq).toBeGreaterThan(written[i - 1]!.seq);
    expect(new Set(written.map((w) => w.seq)).size).toBe(written.length);
    // Forty concurrent applies on one key: the CAS did refuse some writes, which were retried.
    expect(outcomes.reduce((n, o) => n + o.conflicts, 0)).toBeGreaterThan(0);
  });

  it('writes over an entry deleted by hand, still under compare-and-set', async () => {
    const key = 'acme.1123456789abcdef0123456789abcdef';
    await projectEntry({ kv: kvA, key, schema: entrySchema, apply: newest(3, 'a') });
    await kvA.delete(key);
    const o = await projectEntry({ kv: kvA, key, schema: entrySchema, apply: newest(2, 'a') });
    expect(o.kind).toBe('written');
  });

  it('refuses to overwrite an entry that does not parse', async () => {
    const key = 'acme.2123456789abcdef0123456789abcdef';
    await kvA.put(key, encode({ something: 'else' }));
    await expect(projectEntry({ kv: kvA, key, schema: entrySchema, apply: newest(1, 'a') })).rejects.toBeInstanceOf(
      ProjectionCorruptError,
    );
  });
});
