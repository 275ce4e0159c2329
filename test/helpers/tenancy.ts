/**
 * A hostile or careless tenant, on real processes: amplifiers (intents that look valid up to their
 * input and carry thousands of unknown fields), floods of junk and of valid calls published as fast
 * as one connection can, and the other tenants' calls measured meanwhile (docs/tenancy.md).
 */
import { randomUUID } from 'node:crypto';
import { jetstream, JetStreamApiError } from '@nats-io/jetstream';
import { createTools, type Tools } from '@tooltx/client';
import { prepareCall } from '@tooltx/contracts';
import { join } from 'node:path';
import { connectNats, encode, Subjects } from '@tooltx/nats';
import type { IdentityList } from '@tooltx/auth';
import { inboxPrefixOf } from '@tooltx/nats';
import { contracts, sinkWrite } from '../fixtures/sink-tools.js';
import type { TestNats } from './nats.js';
import { ROOT, runScript } from './services.js';

/** An identity list of `n` tenants `t01`… with one actor `agent` each, plus `flood` (actor `mallory`). */
export function manyTenants(n: number, limits?: IdentityList['limits']): IdentityList {
  return {
    tenants: [
      ...Array.from({ length: n }, (_, i) => ({ id: `t${String(i + 1).padStart(2, '0')}`, actors: ['agent'] })),
      { id: 'flood', actors: ['mallory'] },
    ],
    operators: ['oscar'],
    ...(limits ? { limits } : {}),
  };
}

export const note = (title: string) => ({
  bucket: 'kb-main',
  title,
  body: `Body of ${title}.`,
  at: '2026-11-30T06:00:00Z',
});

/** The SDK of one agent of the test deployment. */
export function toolsOf(t: TestNats, tenant: string, actor: string): Promise<Tools> {
  return createTools({
    servers: t.url,
    tenant,
    actor,
    nkeyFile: t.agentSeed(tenant, actor),
    contracts,
    prefix: t.subjects.prefix,
    receiptKeys: t.auth.receiptKeysFile,
  });
}

/** What a run of calls gave: how many failed (anything but `committed`) and each call's latency, ms. */
export interface CallRun {
  calls: number;
  failed: number;
  failures: string[];
  latenciesMs: number[];
}

/**
 * `callsEach` calls per agent, one after another per agent, all agents at once; each call a new
 * note with `budgetMs`. Returns every call's latency and the failures (status and error class).
 */
export async function callRun(
  agents: { tenant: string; tools: Tools }[],
  callsEach: number,
  budgetMs: number,
  label: string,
): Promise<CallRun> {
  const run: CallRun = { calls: 0, failed: 0, failures: [], latenciesMs: [] };
  await Promise.all(
    agents.map(async ({ tenant, tools }) => {
      for (let i = 0; i < callsEach; i++) {
        const started = performance.now();
        const r = await tools.execute(
          {
            tool: 'sink.write',
            taskId: `${label}-${tenant}-${i}`,
            input: note(`${label} ${tenant} ${i} ${randomUUID()}`),
          },
          { budgetMs },
        );
        run.calls++;
        run.latenciesMs.push(performance.now() - started);
        if (r.status !== 'committed') {
          run.failed++;
          if (run.failures.length < 10)
            run.failures.push(`${tenant}: ${r.status}${'error' in r && r.error ? ` ${r.error.class}` : ''}`);
        }
      }
    }),
  );
  return run;
}

/** The `q` quantile (0–1) of `xs`, ms. */
export function quantile(xs: number[], q: number): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.ceil(q * s.length) - 1)]!;
}

/**
 * An amplifier: an envelope of `sink.write` with a well-formed operation key whose input carries
 * `fields` unknown fields (about 6 bytes each), so that the refusal it causes could be far larger
 * than itself.
 */
export function amplifier(i: number, fields: number): Uint8Array {
  const input: Record<string, unknown> = { ...note(`amplifier ${i}`) };
  for (let f = 0; f < fields; f++) input[`f${f}`] = 1;
  const key = prepareCall(sinkWrite, `amp-${i}`, note(`amplifier ${i}`)).operationKey;
  return encode({ tool: 'sink.write', version: 1, taskId: `amp-${i}`, operationKey: key, input });
}

/** One valid intent of `sink.write` as the SDK would send it (a fresh task each). */
export function validIntent(i: number): Uint8Array {
  const input = note(`flood ${i} ${randomUUID()}`);
  return encode({
    tool: 'sink.write',
    version: 1,
    taskId: `flood-${i}`,
    operationKey: prepareCall(sinkWrite, `flood-${i}`, input).operationKey,
    input,
  });
}

/** What a flood did: publishes sent, stored (acknowledged), refused by the server, by error code. */
export interface FloodRun {
  sent: number;
  stored: number;
  refused: Record<string, number>;
  bytesSent: number;
  ms: number;
}

/** Who floods: the agent's server, seed, prefix and identity. */
export interface Flooder {
  url: string;
  /** The agent's seed; absent: a server without auth (the control flood of the matrix). */
  seedFile?: string;
  prefix: string;
  tenant: string;
  actor: string;
}

/**
 * Publishes on the agent's own intent subject as fast as one connection can (`window` publishes in
 * flight), as the agent itself (its seed, its account), until `until()` says stop or `maxBytes` are
 * sent. `next(i)` gives the i-th message's bytes.
 */
export function flood(
  t: TestNats,
  tenant: string,
  actor: string,
  next: (i: number) => Uint8Array,
  o: { until: () => boolean; maxBytes?: number; window?: number },
): Promise<FloodRun> {
  return floodWith(
    { url: t.url, seedFile: t.agentSeed(tenant, actor), prefix: t.subjects.prefix, tenant, actor },
    next,
    o,
  );
}

/**
 * The flooding agent's scheduling priority (nice 19, the lowest). The deployment and the flooder
 * share this machine's two cores; an agent of a deployment runs on a machine of its own, so the
 * flooder takes the cores only when the deployment leaves them idle. It still publishes as fast as
 * its connection goes: what the flood costs nats-server and the services is what is measured.
 */
const FLOODER_NICE = 19;

/**
 * {@link flood} from a process of its own (test/helpers/flood-agent.ts), for `ms` or `maxBytes`.
 * `to`: another server (no auth) and subject prefix instead of the deployment's (a control run).
 */
export async function floodProcess(
  t: TestNats,
  tenant: string,
  actor: string,
  kind: 'amplifiers' | 'junk' | 'valid',
  o: { ms?: number; maxBytes?: number; window?: number; to?: { url: string; prefix: string } },
): Promise<FloodRun> {
  const p = runScript(
    join(ROOT, 'test', 'helpers', 'flood-agent.ts'),
    {
      FLOOD_URL: o.to?.url ?? t.url,
      ...(o.to ? {} : { FLOOD_SEED: t.agentSeed(tenant, actor) }),
      FLOOD_PREFIX: o.to?.prefix ?? t.subjects.prefix,
      FLOOD_TENANT: tenant,
      FLOOD_ACTOR: actor,
      FLOOD_KIND: kind,
      ...(o.ms !== undefined ? { FLOOD_MS: String(o.ms) } : {}),
      ...(o.maxBytes !== undefined ? { FLOOD_MAX_BYTES: String(o.maxBytes) } : {}),
      FLOOD_WINDOW: String(o.window ?? 64),
    },
    FLOODER_NICE,
  );
  const code = await p.exited;
  const line = p.lines.find((l) => typeof l.sent === 'number');
  if (code !== 0 || !line) throw new Error(`flood agent exited ${code}: ${p.stderr.slice(0, 2_000)}`);
  return line as unknown as FloodRun;
}

export async function floodWith(
  f: Flooder,
  next: (i: number) => Uint8Array,
  o: { until: () => boolean; maxBytes?: number; window?: number },
): Promise<FloodRun> {
  const nc = await connectNats({
    servers: f.url,
    name: `flood-${f.tenant}`,
    ...(f.seedFile ? { nkeySeedFile: f.seedFile } : {}),
    inboxPrefix: inboxPrefixOf({ kind: 'agent', tenant: f.tenant, actor: f.actor }),
    reconnectForever: false,
  });
  const js = jetstream(nc, { timeout: 10_000 });
  const subject = new Subjects(f.prefix).intent(f.tenant, f.actor);
  const run: FloodRun = { sent: 0, stored: 0, refused: {}, bytesSent: 0, ms: 0 };
  const started = performance.now();
  const inFlight = new Set<Promise<void>>();
  const window = o.window ?? 64;
  try {
    for (let i = 0; !o.until() && (o.maxBytes === undefined || run.bytesSent < o.maxBytes); i++) {
      const data = next(i);
      run.sent++;
      run.bytesSent += data.byteLength;
      const p = js.publish(subject, data, { msgID: randomUUID() }).then(
        () => void run.stored++,
        (err: unknown) => {
          const code = err instanceof JetStreamApiError ? String(err.code) : err instanceof Error ? err.name : 'error';
          run.refused[code] = (run.refused[code] ?? 0) + 1;
        },
      );
      inFlight.add(p);
      void p.finally(() => inFlight.delete(p));
      if (inFlight.size >= window) await Promise.race(inFlight);
    }
    await Promise.all(inFlight);
  } finally {
    run.ms = performance.now() - started;
    await nc.close();
  }
  return run;
}
