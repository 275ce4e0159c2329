/**
 * Fault scenarios against the research KB that run on both layouts (separate services:
 * recovery.e2e.test.ts; one co-located process: colocated.e2e.test.ts), so each FM row is the same
 * test on both: the note of a call, the KB's write requests, and the scenarios themselves. Each
 * returns what it observed; the caller asserts what only its layout shows.
 */
import { expect, type TaskMeta } from 'vitest';
import { downstreamKeyOf, prepareCall, type Contract } from '@tooltx/contracts';
import { createTools, type ExecuteResult, type Tools } from '@tooltx/client';
import type { TestNats } from './nats.js';
import { kbRowsFor, type TestKb } from './kb.js';
import type { DelayProxy } from './delay-proxy.js';
import { TcpProxy } from './tcp-proxy.js';
import { beyondOne, figure } from './figures.js';

/** Short contract timing so recovery happens within seconds: timeout 1.5 s, running bound 1 s. */
export const RECOVERY_TIMING = { timeoutMs: 1_500, runningBoundMs: 1_000, unknownDeadlineMs: 60_000 };

/** The input of `kb.write_note` for a note titled `title`. */
export const note = (title: string) => ({
  kb: 'research',
  title,
  body: `Notes on ${title}.`,
  sourceUrl: 'https://example.org/src',
  fetchedAt: '2026-11-30T06:00:00Z',
});

/** A note write reaching the KB. */
export const isNotesPost = (req: { method?: string; url?: string }) => req.method === 'POST' && req.url === '/v1/notes';

export interface FaultContext {
  t: TestNats;
  kb: TestKb;
  /** The HTTP hop between the services and the KB. */
  proxy: DelayProxy;
  writeNote: Contract;
  contracts: Contract[];
  task: { meta: TaskMeta };
}

const keyOf = (c: FaultContext, taskId: string, title: string) =>
  prepareCall(c.writeNote, taskId, note(title)).operationKey;

/**
 * FM-02: the agent's own NATS connection is cut once the KB has answered the write (after the
 * commit, before the reply reaches the agent): the call still ends committed with the KB's row id,
 * and a retry returns the identical answer and writes nothing.
 */
export async function cutAfterCommit(c: FaultContext, taskId: string): Promise<void> {
  const natsHop = await new TcpProxy(c.t.server.port).start();
  const agent = await createTools({
    servers: natsHop.url,
    tenant: 'acme',
    actor: 'alice',
    nkeyFile: c.t.agentSeed('acme', 'alice'),
    contracts: c.contracts,
    prefix: c.t.subjects.prefix,
    receiptKeys: c.t.auth.receiptKeysFile,
    budgetMs: 30_000,
  });
  const title = 'Cut after commit';
  const key = keyOf(c, taskId, title);
  let cuts = 0;
  c.proxy.holdResponse = (req) => (isNotesPost(req) ? 200 : 0);
  c.proxy.onAnswered = () => void (cuts += natsHop.cutAll());
  try {
    const r = await agent.execute({ tool: 'kb.write_note', taskId, input: note(title) });
    expect(cuts).toBeGreaterThan(0);
    expect(r.status).toBe('committed');
    const probe = await c.kb.client.probe({ tenant: 'acme', key: downstreamKeyOf('acme', key) });
    if (r.status === 'committed' && probe.found) expect(r.receipt.resourceId).toBe(probe.id);
    const again = await agent.execute({ tool: 'kb.write_note', taskId, input: note(title) });
    const rows = await kbRowsFor(c.kb, 'acme', key);
    figure(c.task, { name: 'kb rows after the retry', value: rows, duplicates: beyondOne(rows) });
    expect(again).toEqual(r);
    expect(rows).toBe(1);
  } finally {
    c.proxy.holdResponse = () => 0;
    c.proxy.onAnswered = () => undefined;
    await agent.close();
    await natsHop.stop();
  }
}

/**
 * FM-28: 12 writes in flight (each held 150 ms at the KB) across a kill -9 and restart of
 * nats-server with its store intact: every one ends committed with exactly one KB row. A write that
 * reached the KB after its absolute deadline is refused there (not applied) and the caller's next
 * step is a backoff and a resubmission (FM-15): it is resubmitted, at most 3 rounds. Returns the
 * titles and final results, and the rows per key.
 */
export async function burstAcrossServerRestart(
  c: FaultContext & { alice: Tools },
  taskId: string,
): Promise<{ titles: string[]; keys: string[]; results: ExecuteResult[]; rowsPerKey: number[] }> {
  const titles = Array.from({ length: 12 }, (_, i) => `Restart ${i}`);
  const keys = titles.map((title) => keyOf(c, taskId, title));
  const call = (title: string) =>
    c.alice.execute({ tool: 'kb.write_note', taskId, input: note(title) }, { budgetMs: 60_000 });
  c.proxy.hold = (req) => (isNotesPost(req) ? 150 : 0);
  try {
    const calls = titles.map(call);
    await new Promise((r) => setTimeout(r, 300));
    await c.t.server.restart!();
    let results = await Promise.all(calls);
    for (let round = 0; round < 3 && results.some((r) => r.status === 'rejected'); round++) {
      for (const r of results)
        if (r.status === 'rejected')
          expect(r).toMatchObject({ error: { class: 'dependency_unavailable' }, next: 'backoff' });
      await new Promise((r) => setTimeout(r, 500));
      results = await Promise.all(
        titles.map((title, i) => (results[i]!.status === 'rejected' ? call(title) : results[i]!)),
      );
    }
    const rowsPerKey = await Promise.all(keys.map((key) => kbRowsFor(c.kb, 'acme', key)));
    figure(c.task, {
      name: 'writes committed',
      value: `${results.filter((r) => r.status === 'committed').length}/${titles.length}`,
    });
    figure(c.task, {
      name: 'keys with one kb row',
      value: `${rowsPerKey.filter((n) => n === 1).length}/${titles.length}`,
      duplicates: rowsPerKey.reduce((n, rows) => n + beyondOne(rows), 0),
    });
    return { titles, keys, results, rowsPerKey };
  } finally {
    c.proxy.hold = () => 0;
  }
}
