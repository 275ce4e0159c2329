/**
 * tenancy, full size (docs/tenancy.md): one tenant floods or poisons its own intake while six
 * others call, on a 400 MB store. For each flood — amplifiers, 1 MB junk intents, valid calls —
 * published as fast as one connection can for 30 s, the six others call for the same 30 s; the
 * baseline is the same 30 s of calls without the flood, in the same run (15 s before it, 15 s after). Reported: their failed
 * calls (asserted 0), their p99 with and without the flood and the ratio (a report, not an
 * assertion), and the bytes each tenant holds. Then the full-size cases: 1,000 amplifiers, and a
 * 1 GB junk flood on the 400 MB store.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Tools } from '@tooltx/client';
import { DiscardPolicy, StorageType } from '@nats-io/jetstream';
import { connectNats, jetStreamOf } from '@tooltx/nats';
import { spawnNatsServer, type NatsServerHandle } from '@tooltx/dev/nats-server';
import { figure } from '../helpers/figures.js';
import { provisioned, type TestNats } from '../helpers/nats.js';
import { startService, type ServiceProcess } from '../helpers/services.js';
import { Sink } from '../helpers/sink.js';
import { floodProcess, manyTenants, note, quantile, toolsOf, type CallRun } from '../helpers/tenancy.js';

const MiB = 1024 * 1024;
const OTHERS = 6;
/** 7 tenants × 40 MiB reserved of the 400 MB store. */
const LIMITS = { intentBytes: 32 * MiB, intentMessages: 10_000, decisionBytes: 8 * MiB };
const WINDOW_MS = 30_000;
/** Each other tenant calls every 500 ms: 6 tenants, 360 calls in a window. */
const CALL_INTERVAL_MS = 500;

let t: TestNats;
let sink: Sink;
let services: ServiceProcess[] = [];
/** Another nats-server on this machine, for the control flood: a full bounded stream refuses it as the tenant's does. */
let other: NatsServerHandle | undefined;
const agents: { tenant: string; tools: Tools }[] = [];

beforeAll(async () => {
  t = await provisioned({}, undefined, {
    identities: manyTenants(OTHERS, LIMITS),
    jetstreamExtra: 'max_file_store: 400MB',
  });
  sink = await new Sink().start();
  const env = { ...t.env, SINK_URL: sink.url, LOG_LEVEL: 'info' };
  services = await Promise.all(
    (['authorizer', 'executor', 'reconciler', 'audit-projector'] as const).map((n) => startService(n, env)),
  );
  for (let i = 1; i <= OTHERS; i++) {
    const tenant = `t${String(i).padStart(2, '0')}`;
    agents.push({ tenant, tools: await toolsOf(t, tenant, 'agent') });
  }
  other = await spawnNatsServer({});
  const onc = await connectNats({ servers: other.url, name: 'control', reconnectForever: false });
  const { jsm } = await jetStreamOf(onc);
  // Full from the start: every flood publish is refused (10077), as most of the tenant's are.
  await jsm.streams.add({
    name: 'CONTROL',
    subjects: ['control.intent.>'],
    max_bytes: 64 * 1024,
    discard: DiscardPolicy.New,
    storage: StorageType.File,
  });
  await (await jetStreamOf(onc)).js.publish('control.intent.flood.mallory', new Uint8Array(60 * 1024));
  await onc.close();
  // Warm: the first calls of a fresh stack (connections, JIT) are not the baseline.
  await callFor(5_000, 'warm');
}, 120_000);

afterAll(async () => {
  await Promise.all(agents.map((a) => a.tools.close()));
  expect(await Promise.all(services.map((s) => s.stop()))).toEqual(services.map(() => 0));
  await sink?.stop();
  await other?.stop({ removeStore: true });
  await t?.close();
});

/**
 * Every other tenant's agent starts a call every `intervalMs` for `ms`, whatever the earlier ones
 * are doing (an open loop: the same calls, on the same schedule, with and without a flood, so the
 * two runs differ only by the flood); every call's latency and failure.
 */
async function callFor(ms: number, label: string, intervalMs = CALL_INTERVAL_MS): Promise<CallRun> {
  const run: CallRun = { calls: 0, failed: 0, failures: [], latenciesMs: [] };
  const calls: Promise<void>[] = [];
  const call = async (tenant: string, tools: Tools, i: number) => {
    const started = performance.now();
    const r = await tools.execute(
      { tool: 'sink.write', taskId: `${label}-${tenant}-${i}`, input: note(`${label} ${tenant} ${i}`) },
      { budgetMs: 30_000 },
    );
    run.calls++;
    run.latenciesMs.push(performance.now() - started);
    if (r.status !== 'committed') {
      run.failed++;
      if (run.failures.length < 10) run.failures.push(`${tenant}: ${r.status}`);
    }
  };
  const start = performance.now();
  for (let i = 0; performance.now() - start < ms; i++) {
    for (const { tenant, tools } of agents) calls.push(call(tenant, tools, i).catch(() => undefined));
    const due = start + (i + 1) * intervalMs;
    await new Promise((r) => setTimeout(r, Math.max(0, due - performance.now())));
  }
  await Promise.all(calls);
  return run;
}

/**
 * Starts the next case from an empty intake of the flooding tenant: what the last flood left there
 * is deleted (at its own pace it could take minutes to work through, and the next baseline must not
 * run beside it; intake streams deny purge, not delete), then waits until its consumer has nothing
 * in hand, up to 2 minutes.
 */
async function floodDrained(): Promise<void> {
  const stream = t.subjects.intentsStream('flood');
  const { state } = await t.jsm.streams.info(stream);
  for (let seq = state.first_seq; state.messages > 0 && seq <= state.last_seq; seq++) {
    await t.jsm.streams.deleteMessage(stream, seq, false).catch(() => undefined); // 10057: already gone
  }
  for (let i = 0; i < 600; i++) {
    const c = await t.jsm.consumers.info(t.subjects.intentsStream('flood'), 'authorizer');
    if (c.num_pending === 0 && c.num_ack_pending === 0) return;
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** Bytes each tenant holds in its intake and decision streams now. */
async function storedBytes(): Promise<string> {
  const out: string[] = [];
  for (const id of t.tenants) {
    const [i, d] = await Promise.all([
      t.jsm.streams.info(t.subjects.intentsStream(id)),
      t.jsm.streams.info(t.subjects.decisionsStream(id)),
    ]);
    if (i.state.bytes + d.state.bytes > 0)
      out.push(`${id} ${(i.state.bytes / MiB).toFixed(1)}+${(d.state.bytes / MiB).toFixed(1)} MiB`);
  }
  return out.join(', ') || 'none';
}

const AMPLIFIER_BYTES = 189_083;
const floods: [string, 'amplifiers' | 'junk' | 'valid', number][] = [
  ['amplifiers (25,000 unknown fields, 189 KB)', 'amplifiers', 16],
  ['1 MB junk intents', 'junk', 8],
  ['valid calls', 'valid', 64],
];

/**
 * One flood of `kind` for 30 s, with the other tenants' calls measured with and without it. With
 * `control`, the same flood goes to another nats-server on this machine, which tooltx does not use:
 * what the flooder's own share of the machine costs the others, whatever tooltx does.
 */
function floodCase(what: string, kind: 'amplifiers' | 'junk' | 'valid', window: number, control = false): void {
  it(`tenant-flood: ${what} for 30 s${control ? ', sent to another nats-server on this machine (control)' : ''} — the other tenants' calls all commit; their p99 with and without it`, {
    timeout: 180_000,
  }, async ({ task }) => {
    await floodDrained();
    const before = await callFor(WINDOW_MS / 2, `before-${kind}`);
    // The flooder is a process of its own: its publishing does not slow this one, which measures.
    const flooding = floodProcess(t, 'flood', 'mallory', kind, {
      ms: WINDOW_MS,
      window,
      ...(control ? { to: { url: other!.url, prefix: 'control' } } : {}),
    });
    const during = await callFor(WINDOW_MS, `flood-${kind}`);
    const sent = await flooding;
    await floodDrained();
    // The baseline is taken half before and half after the flood: this machine's own latency drifts
    // (its disk's fsync above all) by as much as 3× between two windows without any flood, and a
    // baseline on one side only would measure that drift.
    const after = await callFor(WINDOW_MS / 2, `after-${kind}`);
    const base: CallRun = {
      calls: before.calls + after.calls,
      failed: before.failed + after.failed,
      failures: [...before.failures, ...after.failures],
      latenciesMs: [...before.latenciesMs, ...after.latenciesMs],
    };
    const p99 = (r: CallRun) => quantile(r.latenciesMs, 0.99);
    figure(task, {
      name: 'flood: publishes sent / stored, MB sent',
      value: `${sent.sent} / ${sent.stored}, ${(sent.bytesSent / 1e6).toFixed(0)} MB${Object.keys(sent.refused).length ? `; refused ${JSON.stringify(sent.refused)}` : ''}`,
    });
    figure(task, { name: 'other tenants: calls without / with the flood', value: `${base.calls} / ${during.calls}` });
    figure(task, { name: 'other tenants: failed calls with the flood', value: during.failed });
    figure(task, {
      name: 'other tenants: p50 without / with the flood',
      value: `${quantile(base.latenciesMs, 0.5).toFixed(1)} / ${quantile(during.latenciesMs, 0.5).toFixed(1)}`,
      unit: 'ms',
    });
    // Each half of the baseline on its own: whether the flood leaves the stack slower after it ends.
    figure(task, {
      name: 'other tenants: p50 / p99 in the window before / after the flood',
      value: `${quantile(before.latenciesMs, 0.5).toFixed(1)} / ${p99(before).toFixed(1)}, ${quantile(after.latenciesMs, 0.5).toFixed(1)} / ${p99(after).toFixed(1)}`,
      unit: 'ms',
    });
    figure(task, {
      name: 'other tenants: p99 without / with the flood',
      value: `${p99(base).toFixed(1)} / ${p99(during).toFixed(1)}`,
      unit: 'ms',
    });
    const ratio = p99(during) / p99(base);
    // The control flood does not count for the gate: it says what the flooder's own share of this machine costs.
    figure(task, {
      name: 'other tenants: p99 ratio (must be ≤ 2)',
      value: Number(ratio.toFixed(2)),
      ...(control ? {} : { floodsMeasured: 1, floodsWithin2x: ratio <= 2 ? 1 : 0 }),
    });
    figure(task, { name: 'stored per tenant (intents + decisions)', value: await storedBytes() });
    expect(during.failures).toEqual([]);
    expect(base.failures).toEqual([]);
    expect(during.calls).toBeGreaterThanOrEqual(200);
  });
}

describe('tenancy grid', () => {
  for (const [what, kind, window] of floods.filter((f) => f[1] !== 'valid')) floodCase(what, kind, window);
  // The same floods, refused the same way (a full bounded stream), by a server tooltx does not use.
  floodCase(floods[0]![0], 'amplifiers', 16, true);
  floodCase(floods[1]![0], 'junk', 8, true);

  it("poison-intake: 1,000 amplifiers — the other tenants' calls all commit, the flooding tenant's intake is worked through with nothing redelivered", {
    timeout: 300_000,
  }, async ({ task }) => {
    await floodDrained();
    const poison = floodProcess(t, 'flood', 'mallory', 'amplifiers', { maxBytes: 1_000 * AMPLIFIER_BYTES, window: 16 });
    const during = await callFor(10_000, 'poison');
    const sent = await poison;
    const c = await t.jsm.consumers.info(t.subjects.intentsStream('flood'), 'authorizer');
    figure(task, { name: 'amplifiers sent / stored', value: `${sent.sent} / ${sent.stored}` });
    figure(task, { name: 'other tenants: failed calls', value: during.failed });
    figure(task, { name: 'flooding tenant: redelivered intents', value: c.num_redelivered });
    expect(during.failures).toEqual([]);
    expect(sent.sent).toBe(1_000);
    expect(c.num_redelivered).toBe(0);
  });

  it("tenant-flood: 1 GB of 1 MB junk intents on a 400 MB store — the other tenants' writes all commit; the flooding tenant holds at most its own bound", {
    timeout: 600_000,
  }, async ({ task }) => {
    await floodDrained();
    const flooded = floodProcess(t, 'flood', 'mallory', 'junk', { maxBytes: 1_000 * 1_000_000, window: 8 });
    const during = await callFor(10_000, 'gb');
    const sent = await flooded;
    const after = await callFor(2_000, 'gb-after');
    const intake = await t.jsm.streams.info(t.subjects.intentsStream('flood'));
    figure(task, {
      name: 'junk sent / stored, MB',
      value: `${(sent.bytesSent / 1e6).toFixed(0)} / ${sent.stored}; refused ${JSON.stringify(sent.refused)}`,
    });
    figure(task, { name: 'other tenants: failed calls during / after', value: `${during.failed} / ${after.failed}` });
    figure(task, { name: 'flooding tenant: intake bytes (bound 32 MiB)', value: intake.state.bytes, unit: 'bytes' });
    figure(task, { name: 'stored per tenant (intents + decisions)', value: await storedBytes() });
    expect(during.failures).toEqual([]);
    expect(after.failures).toEqual([]);
    expect(intake.state.bytes).toBeLessThanOrEqual(LIMITS.intentBytes);
  });
  // Last: the valid calls it leaves in the flooding tenant's own intake are worked through at its pace after the window.
  floodCase(...floods.find((f) => f[1] === 'valid')!);
});
