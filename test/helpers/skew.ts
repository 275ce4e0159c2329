/**
 * The clock-skew bench: the research stack as separate processes (authorizer, executor, reconciler,
 * the KB with `KB_DEDUP=off` behind a delaying HTTP hop, a real nats-server), where one process at a
 * time has its wall clock shifted (./clock-skew.mjs) — stepped while it runs (`step`), or restarted
 * with it (`restart`; the KB always restarts: its clock never goes back by design) — and a few writes
 * are made through a slow downstream. Every request that reaches the KB's insert path makes a row, so
 * rows per key above 1 are duplicate side effects. docs/clocks.md says what must hold.
 */
import { fileURLToPath } from 'node:url';
import { downstreamKeyOf, prepareCall } from '@tooltx/contracts';
import { createTools, type ExecuteResult, type Tools } from '@tooltx/client';
import { freeLoopbackPort } from '@tooltx/dev/nats-server';
import { mkdtempSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { provisioned, type TestNats } from './nats.js';
import { startService, type ServiceName, type ServiceProcess } from './services.js';
import { kbRowsFor, RESEARCH_TOOLS, startKb, type TestKb } from './kb.js';
import { DelayProxy } from './delay-proxy.js';
import { researchContracts } from '../../examples/research-kb/contracts.js';

const PRELOAD = fileURLToPath(new URL('./clock-skew.mjs', import.meta.url));

/** Timing as in the recovery tests: `runningBoundMs` ≤ `timeoutMs`, so recovery looks within seconds. */
export const SKEW_TIMING = { timeoutMs: 1_500, runningBoundMs: 1_000, unknownDeadlineMs: 60_000 };
/** A first request that is slow but inside its attempt's time … */
export const SLOW_MS = 1_000;
/** … and one held past it: it reaches the KB after the executor gave up (outcome unknown). */
export const HELD_MS = 2_500;

/** The processes whose clock can be shifted alone (nats-server: see docs/clocks.md). */
export type SkewedRole = Extract<ServiceName, 'authorizer' | 'executor' | 'reconciler'> | 'kb';

/** What one case observed: for each write, its key, the caller's answer and the KB's rows for the key. */
export interface SkewCase {
  role: SkewedRole;
  skewMs: number;
  calls: {
    key: string;
    flavour: 'slow' | 'held';
    status: ExecuteResult<unknown>['status'];
    errorClass?: string;
    rows: number;
  }[];
  /** Rows beyond one per key: duplicate side effects. */
  duplicates: number;
}

export interface SkewBench {
  /** One case: `role`'s clock shifted by `skewMs`, `writes` writes (alternately slow and held), then the shift undone. */
  /** `stepAfterMs`: step the clock that long after the writes were sent instead of before (mode `step`): mid-attempt. */
  run(
    role: SkewedRole,
    skewMs: number,
    o?: { writes?: number; mode?: 'step' | 'restart'; stepAfterMs?: number },
  ): Promise<SkewCase>;
  close(): Promise<(number | null)[]>;
}

const note = (title: string) => ({
  kb: 'research',
  title,
  body: `Notes on ${title}.`,
  sourceUrl: 'https://example.org/src',
  fetchedAt: '2026-11-30T06:00:00Z',
});

export async function startSkewBench(): Promise<SkewBench> {
  const contracts = researchContracts({ kbDedup: false, timing: SKEW_TIMING });
  const t: TestNats = await provisioned();
  const dir = mkdtempSync(join(tmpdir(), 'tooltx-skew-'));
  const skewFile = (role: SkewedRole) => join(dir, `${role}.skew`);
  // Written whole through a rename: the preload never reads a half-written shift.
  const step = (role: SkewedRole, skewMs: number) => {
    writeFileSync(`${skewFile(role)}.tmp`, String(skewMs));
    renameSync(`${skewFile(role)}.tmp`, skewFile(role));
  };
  // The KB keeps its port and file across restarts (a skewed KB is the same KB with another clock).
  const kbPort = await freeLoopbackPort();
  const kbDb = join(dir, 'kb.sqlite');
  const seed = {
    tenants: [{ id: 'acme', quota: 100_000 }],
    knowledgeBases: [{ tenant: 'acme', name: 'research', defaultRole: 'writer' as const }],
  };
  const kbEnv = (skewMs: number): Record<string, string> => ({
    KB_DEDUP: 'off',
    KB_PORT: String(kbPort),
    KB_DB: kbDb,
    ...skewEnv(skewMs),
  });
  let kb: TestKb = await startKb(seed, kbEnv(0));
  const proxy = await new DelayProxy(kb.url).start();
  const env = {
    ...t.env,
    TOOLTX_TOOLS_MODULE: RESEARCH_TOOLS,
    KB_URL: proxy.url,
    KB_KEEPALIVE: 'off',
    KB_DEDUP: 'off',
    KB_TIMING_MS: `${SKEW_TIMING.timeoutMs},${SKEW_TIMING.runningBoundMs},${SKEW_TIMING.unknownDeadlineMs}`,
    TOOLTX_RECONCILE_INTERVAL_MS: '200',
  };
  const procs = new Map<ServiceName, ServiceProcess>();
  // Every service runs with the preload, its clock stepped through its own file (0 until a case).
  const started = (role: Exclude<SkewedRole, 'kb'>, skewMs: number) => {
    step(role, skewMs);
    return startService(role, {
      ...env,
      NODE_OPTIONS: `--import=${PRELOAD}`,
      TOOLTX_TEST_CLOCK_SKEW_FILE: skewFile(role),
    });
  };
  for (const role of ['authorizer', 'reconciler', 'executor'] as const) procs.set(role, await started(role, 0));
  const alice: Tools = await createTools({
    servers: t.url,
    tenant: 'acme',
    actor: 'alice',
    nkeyFile: t.agentSeed('acme', 'alice'),
    contracts: contracts.all,
    prefix: t.subjects.prefix,
    receiptKeys: t.auth.receiptKeysFile,
    budgetMs: 45_000,
  });
  let cases = 0;

  const shift = async (role: SkewedRole, skewMs: number, mode: 'step' | 'restart') => {
    if (role === 'kb') {
      await kb.stop();
      kb = await startKb(seed, kbEnv(skewMs));
    } else if (mode === 'restart') {
      await procs.get(role)!.stop();
      procs.set(role, await started(role, skewMs));
    } else {
      step(role, skewMs);
      await new Promise((r) => setTimeout(r, 250)); // the preload polls its file every 50 ms
    }
  };

  return {
    async run(role, skewMs, { writes = 2, mode = 'step', stepAfterMs } = {}) {
      const n = cases++;
      if (stepAfterMs === undefined) await shift(role, skewMs, mode);
      else setTimeout(() => void shift(role, skewMs, 'step'), stepAfterMs);
      try {
        const calls = await Promise.all(
          Array.from({ length: writes }, async (_, i) => {
            const flavour = i % 2 === 0 ? ('slow' as const) : ('held' as const);
            const input = note(`skew ${n} ${role} ${skewMs} ${i}`);
            const key = prepareCall(contracts.writeNote, `skew-${n}`, input).operationKey;
            // The first request of the key reaching the hop is delayed; a re-run goes straight through.
            const delayed = proxy.inject(downstreamKeyOf('acme', key), {
              kind: 'delay',
              ms: flavour === 'slow' ? SLOW_MS : HELD_MS,
            });
            const r = await alice.execute({ tool: 'kb.write_note', taskId: `skew-${n}`, input });
            // A request still held in the hop may land after the answer: wait until the KB answered it.
            await Promise.race([delayed.applied, new Promise((r) => setTimeout(r, HELD_MS + 5_000))]);
            delayed.cancel();
            return {
              key,
              flavour,
              status: r.status,
              ...(r.status === 'rejected' ? { errorClass: r.error.class } : {}),
            };
          }),
        );
        const withRows = await Promise.all(
          calls.map(async (c) => ({ ...c, rows: await kbRowsFor(kb, 'acme', c.key) })),
        );
        return { role, skewMs, calls: withRows, duplicates: withRows.reduce((d, c) => d + Math.max(0, c.rows - 1), 0) };
      } finally {
        await shift(role, 0, mode);
      }
    },
    async close() {
      await alice.close();
      const codes = await Promise.all([...procs.values()].map((p) => p.stop()));
      await proxy.stop();
      codes.push(await kb.stop());
      await t.close();
      rmSync(dir, { recursive: true, force: true });
      return codes;
    },
  };
}

function skewEnv(skewMs: number): Record<string, string> {
  return skewMs === 0 ? {} : { NODE_OPTIONS: `--import=${PRELOAD}`, TOOLTX_TEST_CLOCK_SKEW_MS: String(skewMs) };
}
