/**
 * No message dies silently: a finite max_deliver on every durable, the server's
 * max-deliveries advisories kept in `<P>_ADVISORIES`, and the reconciler reading them on its own
 * durable. Real processes, the real KB with KB_DEDUP=off (every request that reaches it is a row).
 * The topology of this file's prefix has max_deliver 2, so a test can exhaust a message quickly.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { downstreamKeyOf, operationIdOf, prepareCall } from '@tooltx/contracts';
import { newSubmission, publishSubmission } from '@tooltx/client';
import type { OperationRecord } from '@tooltx/lifecycle';
import { jetStreamOf } from '@tooltx/nats';
import { Durables } from '@tooltx/streams';
import { provisioned, type TestNats } from './helpers/nats.js';
import { startService, type ServiceProcess } from './helpers/services.js';
import { history, waitForOperation } from './helpers/ops.js';
import { RESEARCH_TOOLS, startKb, type TestKb } from './helpers/kb.js';
import { researchContracts } from '../examples/research-kb/contracts.js';

const TIMING = { timeoutMs: 1_500, runningBoundMs: 1_000, unknownDeadlineMs: 60_000 };
const MAX_DELIVER = 2;
const contracts = researchContracts({ kbDedup: false, timing: TIMING });
const note = (title: string) => ({
  kb: 'research',
  title,
  body: `Notes on ${title}.`,
  sourceUrl: 'https://example.org/src',
  fetchedAt: '2026-11-30T06:00:00Z',
});

let t: TestNats;
let kb: TestKb;
let env: Record<string, string>;
const procs: ServiceProcess[] = [];

/** Advisories stored for `consumer` naming the events-stream message `seq`. */
async function advisoriesFor(consumer: string, seq: number): Promise<number> {
  const name = `${t.subjects.prefix.toUpperCase()}_ADVISORIES`;
  const info = await t.jsm.streams.info(name);
  let n = 0;
  for (let s = info.state.first_seq; s <= info.state.last_seq && info.state.messages > 0; s++) {
    const m = await t.jsm.streams.getMessage(name, { seq: s }).catch(() => null);
    if (!m) continue;
    const a = m.json<{ consumer: string; stream_seq: number }>();
    if (a.consumer === consumer && a.stream_seq === seq) n++;
  }
  return n;
}

/**
 * Acts as a durable's broken service (connected as that service: only it may ack on its durable):
 * every delivery of the operation's message is nak'ed until the server gives up on it
 * (max_deliver) and has stored its advisory. Other messages are acked.
 */
async function exhaust(service: 'executor' | 'reconciler', subject: string, seq: number): Promise<void> {
  const nc = await t.connectAs({ kind: 'service', service });
  try {
    const { js } = await jetStreamOf(nc);
    const c = await js.consumers.get(t.subjects.eventsStream, service);
    const end = Date.now() + 30_000;
    while ((await advisoriesFor(service, seq)) === 0) {
      if (Date.now() > end) throw new Error(`no max-deliveries advisory for ${service}`);
      const m = await c.next({ expires: 1_000 });
      if (!m) continue;
      if (m.subject === subject) m.nak();
      else m.ack();
      await nc.flush();
    }
  } finally {
    await nc.close();
  }
}

describe('max-deliveries advisories', () => {
  beforeAll(async () => {
    t = await provisioned({ maxDeliver: MAX_DELIVER });
    kb = await startKb(
      {
        tenants: [{ id: 'acme', quota: 10_000 }],
        knowledgeBases: [{ tenant: 'acme', name: 'research', defaultRole: 'writer' }],
      },
      { KB_DEDUP: 'off' },
    );
    env = {
      ...t.env,
      TOOLTX_TOOLS_MODULE: RESEARCH_TOOLS,
      KB_URL: kb.url,
      KB_KEEPALIVE: 'off',
      KB_DEDUP: 'off',
      KB_TIMING_MS: `${TIMING.timeoutMs},${TIMING.runningBoundMs},${TIMING.unknownDeadlineMs}`,
      TOOLTX_RECONCILE_INTERVAL_MS: '300',
      TOOLTX_MAX_DELIVER: String(MAX_DELIVER),
    };
    procs.push(await startService('authorizer', env));
  });

  afterAll(async () => {
    const codes = await Promise.all(procs.map((p) => p.stop()));
    procs.forEach((p, i) => {
      if (codes[i] !== 0)
        console.log(
          p.name,
          codes[i],
          p.stderr,
          JSON.stringify(p.lines.filter((l) => Number(l.level) >= 40).slice(-30), null, 1),
        );
    });
    await kb?.stop();
    await t?.close();
    expect(codes.every((c) => c === 0)).toBe(true);
  });

  it('the topology gives every event-log durable the finite max_deliver and the reconciler a durable on the advisories', async () => {
    for (const d of [Durables.executor, Durables.reconciler, Durables.auditProjector]) {
      expect((await t.jsm.consumers.info(t.subjects.eventsStream, d)).config.max_deliver).toBe(MAX_DELIVER);
    }
    const adv = await t.jsm.consumers.info(
      `${t.subjects.prefix.toUpperCase()}_ADVISORIES`,
      Durables.reconcilerAdvisories,
    );
    expect(adv.config.filter_subject).toBe(`$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.${t.subjects.eventsStream}.*`);
  });

  it('an accepted operation whose message the executor AND the reconciler gave up on while the reconciler was down: found through the advisory, re-driven, committed once', async () => {
    const input = note('Given up on');
    const key = prepareCall(contracts.writeNote, 'maxdel', input).operationKey;
    await publishSubmission(
      t.js,
      newSubmission(t.subjects, 'acme', 'alice', { tool: 'kb.write_note', version: 1, taskId: 'maxdel', input }),
    );
    await waitForOperation(t, 'acme', key, (s) => s.status === 'accepted');
    const subject = t.subjects.op('acme', operationIdOf(key));
    const { seq } = await t.store.load('acme', operationIdOf(key));
    // Neither the executor nor the reconciler runs: their durables fail the message until the
    // server stops delivering it. Neither will ever see this `accepted` event again; only the
    // advisories stream remembers it.
    await exhaust('executor', subject, seq);
    await exhaust('reconciler', subject, seq);

    const reconciler = await startService('reconciler', env);
    procs.push(reconciler);
    procs.push(await startService('executor', env));
    const s = (await waitForOperation(t, 'acme', key, (x) => x.status === 'committed', 45_000)) as OperationRecord;
    expect(s.requeues).toBeGreaterThanOrEqual(1);
    const types = (await history(t, 'acme', key)).map((e) => e.type);
    expect(types[0]).toBe('accepted');
    expect(types.filter((x) => x === 'running')).toHaveLength(1);
    expect(types.at(-1)).toBe('committed');
    const probe = await kb.client.probe({ tenant: 'acme', key: downstreamKeyOf('acme', key) });
    expect(probe).toMatchObject({ found: true, count: 1 });
    // The reconciler read both advisories (its own durable's and the executor's).
    const seen = () =>
      new Set(
        reconciler.lines
          .filter(
            (l) => typeof l.msg === 'string' && l.msg.startsWith('max-deliveries advisory') && l.operationKey === key,
          )
          .map((l) => l.consumer),
      );
    for (let i = 0; i < 200 && seen().size < 2; i++) await new Promise((r) => setTimeout(r, 100));
    expect(seen()).toEqual(new Set([Durables.executor, Durables.reconciler]));
  });
});
