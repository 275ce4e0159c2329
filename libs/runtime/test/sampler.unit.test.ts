/**
 * The executor's sampler (docs/debug-samples.md) on an in-memory bucket: what it stores while a
 * window is open (scrubbed by the logger's rules, within the window's max, the window's tenant
 * only), and the purge at the window's end. The same on real processes: test/debug-samples.e2e.test.ts.
 */
import { randomBytes } from 'node:crypto';
import { describe, expect, it, vi } from 'vitest';
import type { KV } from '@nats-io/kv';
import {
  contractTokenOf,
  type Sample,
  sampleSchema,
  type SamplingSwitch,
  samplingSwitchSchema,
} from '@tooltx/lifecycle';
import { decode, encode, Subjects } from '@tooltx/nats';
import { createLogger, scrubber } from '../src/logger.js';
import { Sampler, type SampleOffer } from '../src/sampler.js';

const subjects = new Subjects('tunit');
const log = createLogger({ service: 'executor', instance: 'unit', level: 'silent' });
const CONTRACT = 'dbg.note@1';
const TOKEN = contractTokenOf(CONTRACT);

type Entry = { key: string; value: Uint8Array; revision: number; operation: 'PUT' | 'DEL' | 'PURGE'; length: number };

/** A KV bucket in memory: get, put, create, update under a revision, delete, purge, status, and one watch. */
function memoryKv(): KV & { entries: Map<string, Entry> } {
  const entries = new Map<string, Entry>();
  let rev = 0;
  const watchers = new Set<(e: Entry & { isUpdate: boolean }) => void>();
  const set = (key: string, value: Uint8Array, operation: Entry['operation']) => {
    const e = { key, value, revision: ++rev, operation, length: value.length };
    entries.set(key, e);
    for (const w of watchers) w({ ...e, isUpdate: true });
    return e.revision;
  };
  const kv = {
    entries,
    get: async (key: string) => entries.get(key) ?? null,
    put: async (key: string, v: Uint8Array) => set(key, v, 'PUT'),
    update: async (key: string, v: Uint8Array, revision: number) => {
      if (entries.get(key)?.revision !== revision) throw new Error('wrong last sequence');
      return set(key, v, 'PUT');
    },
    delete: async (key: string) => void set(key, new Uint8Array(), 'DEL'),
    purge: async (key: string) => void set(key, new Uint8Array(), 'PURGE'),
    status: async () => ({ values: [...entries.values()].filter((e) => e.operation === 'PUT').length }),
    watch: async () => {
      const queue: (Entry & { isUpdate: boolean })[] = [...entries.values()].map((e) => ({ ...e, isUpdate: false }));
      let wake: (() => void) | null = null;
      let stopped = false;
      const push = (e: Entry & { isUpdate: boolean }) => {
        queue.push(e);
        wake?.();
      };
      watchers.add(push);
      return {
        stop: () => {
          stopped = true;
          watchers.delete(push);
          wake?.();
        },
        async *[Symbol.asyncIterator]() {
          while (!stopped) {
            const e = queue.shift();
            if (e) yield e;
            else await new Promise<void>((r) => (wake = r));
          }
        },
      };
    },
  };
  return kv as unknown as KV & { entries: Map<string, Entry> };
}

const windowOf = (over: Partial<SamplingSwitch> = {}): SamplingSwitch => ({
  schema: 1,
  windowId: '0b7e3b43-6f1e-4a39-9a57-2f9cd5f5f0a1',
  contract: CONTRACT,
  rate: 1,
  max: 100,
  taken: 0,
  startedAt: Date.now() - 1_000,
  until: Date.now() + 60_000,
  startedBy: 'oscar',
  ...over,
});
const offer = (tenant: string, n: number): SampleOffer => ({
  contract: CONTRACT,
  tenant,
  opId: n.toString(16).padStart(32, '0'),
  operationKey: `opk_${String(n).padStart(43, 'A')}`,
  outcome: 'committed',
  input: { title: `note ${n}`, body: 'private body', apiKey: 'k-123' },
  result: () => ({ echo: `note ${n}`, text: 'private body' }),
});

async function sampler(sw: SamplingSwitch | null) {
  const switches = memoryKv();
  const samples = memoryKv();
  const purged: string[] = [];
  if (sw) await switches.put(TOKEN, encode(sw));
  const s = new Sampler({
    switches,
    samples,
    subjects,
    log,
    scrub: scrubber(randomBytes(32)),
    purge: async (token) => {
      purged.push(token);
      for (const [k] of samples.entries) if (k.startsWith(`${token}.`)) samples.entries.delete(k);
    },
  });
  await s.start();
  const stored = () =>
    [...samples.entries.values()].filter((e) => e.operation === 'PUT').map((e) => decode(sampleSchema, e.value));
  return { s, switches, samples, purged, stored };
}

describe('the sampler', () => {
  it('given no window, when attempts end, then nothing is checked beyond memory and nothing is stored', async () => {
    const { s, stored } = await sampler(null);
    expect(s.any).toBe(false);
    await s.offer(offer('acme', 1));
    expect(stored()).toEqual([]);
    await s.stop();
  });

  it("given an open window, when an attempt ends, then its input and result are stored as the logger would write them, expiring at the window's end", async () => {
    const sw = windowOf();
    const { s, stored } = await sampler(sw);
    expect(s.any).toBe(true);
    await s.offer(offer('acme', 1));
    expect(stored()).toEqual([
      expect.objectContaining<Partial<Sample>>({
        contract: CONTRACT,
        tenant: 'acme',
        outcome: 'committed',
        input: { title: 'note 1', body: '[redacted]', apiKey: '[redacted]' },
        result: { echo: 'note 1', text: '[redacted]' },
        expiresAt: sw.until,
      }),
    ]);
    await s.stop();
  });

  it("given a window for one tenant and a max of 2, when three of its attempts and another tenant's end, then two of its own are stored and counted", async () => {
    const { s, stored, switches } = await sampler(windowOf({ tenant: 'acme', max: 2 }));
    for (const o of [offer('acme', 1), offer('globex', 2), offer('acme', 3), offer('acme', 4)]) await s.offer(o);
    expect(stored().map((x) => x.tenant)).toEqual(['acme', 'acme']);
    const e = await switches.get(TOKEN);
    expect(decode(samplingSwitchSchema, e!.value).taken).toBe(2);
    await s.stop();
  });

  it('given a window with a max of 100, when 100 attempts end at once, then every one is sampled exactly once and counted: none dropped', async () => {
    const { s, stored, switches } = await sampler(windowOf({ max: 100 }));
    await Promise.all(Array.from({ length: 100 }, (_, i) => s.offer(offer('acme', i))));
    expect(new Set(stored().map((x) => x.operationKey)).size).toBe(100);
    const e = await switches.get(TOKEN);
    expect(decode(samplingSwitchSchema, e!.value).taken).toBe(100);
    await s.stop();
  });

  it("given other executors' claims taking every compare-and-set round, when attempts end, then none is stored, and the drop is logged once, then totalled at the window's end, without content", async () => {
    const switches = memoryKv();
    const samples = memoryKv();
    await switches.put(TOKEN, encode(windowOf({ until: Date.now() + 1_500 })));
    // Another executor counts a sample between every read and update of this one.
    switches.update = async () => {
      throw new Error('wrong last sequence');
    };
    const warns: { obj: Record<string, unknown>; msg: string }[] = [];
    const spyLog = Object.create(log) as typeof log;
    spyLog.warn = ((obj: Record<string, unknown>, msg: string) => void warns.push({ obj, msg })) as typeof log.warn;
    const s = new Sampler({
      switches,
      samples,
      subjects,
      log: spyLog,
      scrub: scrubber(randomBytes(32)),
      purge: async () => undefined,
      random: () => 0,
    });
    await s.start();
    await Promise.all([0, 1, 2].map((i) => s.offer(offer('acme', i))));
    expect([...samples.entries.values()].filter((e) => e.operation === 'PUT')).toEqual([]);
    expect(warns).toEqual([expect.objectContaining({ msg: expect.stringContaining('debug sample dropped') })]);
    await vi.waitFor(() => expect(warns).toHaveLength(2), { timeout: 5_000, interval: 20 });
    expect(warns[1]!.obj).toMatchObject({ token: TOKEN, dropped: 3 });
    expect(JSON.stringify(warns)).not.toContain('private body');
    expect(JSON.stringify(warns)).not.toContain('note 1');
    await s.stop();
  });

  it("given a window that ends, when its end comes, then the contract's samples are purged and the ended switch removed", async () => {
    const { s, stored, purged, switches } = await sampler(windowOf({ until: Date.now() + 150 }));
    await s.offer(offer('acme', 1));
    expect(stored()).toHaveLength(1);
    const deadline = Date.now() + 5_000;
    while ((await switches.get(TOKEN))?.operation === 'PUT' && Date.now() < deadline)
      await new Promise((r) => setTimeout(r, 20));
    expect(purged).toContain(TOKEN);
    expect(stored()).toEqual([]);
    expect((await switches.get(TOKEN))?.operation).toBe('DEL');
    expect(s.any).toBe(false);
    await s.stop();
  });
});
