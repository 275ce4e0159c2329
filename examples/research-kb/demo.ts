/**
 * `npm run demo` — the main job on real input. Starts the whole stack (nats-server unless NATS_URL,
 * streams, the KB with KB_DEDUP=off, the four services), serves the Markdown documents under
 * node_modules from a local HTTP server, and runs a research agent: for every page
 * `web.fetch_page`, then `kb.write_note` with a note built from the excerpt — every write submitted
 * twice at once, the second copy with its fields reordered, whitespace changed where the normaliser
 * allows and `fetchedAt` in an equivalent time form — through `tools.execute`, 8 workers.
 *
 * The KB inserts a row for every request that reaches it (KB_DEDUP=off), so its own count of rows
 * beyond one per key is the number of duplicate side effects tooltx let through.
 *
 * Options: --json (one JSON object on the last line), --quick (about 20 pages), --pages N,
 * --workers N, --keep (keep the state directory and logs).
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { randomBytes } from 'node:crypto';
import { Command } from 'commander';
import { createTools, type ExecuteResult } from '@tooltx/client';
import { connectNats } from '@tooltx/nats';
import { researchContracts } from './contracts.js';
import { DocsServer } from './docs-server.js';
import { KbClient } from './kb-client.js';
import { startStack } from './stack.js';

const program = new Command('tooltx-demo')
  .description('research agent demo: real pages, every write submitted twice, counted by the KB itself')
  .option('--json', 'print one JSON object with the figures on the last line')
  .option('--quick', 'about 20 pages')
  .option('--pages <n>', 'pages to read', '240')
  .option('--workers <n>', 'concurrent agent workers', '8')
  .option('--keep', 'keep the state directory (logs, JetStream store, KB database)')
  .parse(process.argv);
const opts = program.opts<{ json?: boolean; quick?: boolean; pages: string; workers: string; keep?: boolean }>();
const wantPages = opts.quick ? 20 : Number(opts.pages);
const workers = Number(opts.workers);
const say = (line: string) => process.stderr.write(`${line}\n`);

const stateDir = mkdtempSync(join(tmpdir(), 'tooltx-demo-'));
const runId = randomBytes(4).toString('hex');
const prefix = process.env.NATS_URL ? `demo_${runId}` : 'tooltx';
const TENANT = 'acme';
const RIVAL = 'globex';
const KB = 'research';

const docs = await new DocsServer(resolve('node_modules'), wantPages).start();
say(`demo: ${docs.pages.length} distinct Markdown pages from node_modules served at ${docs.url}`);
const stack = await startStack({
  stateDir,
  natsUrl: process.env.NATS_URL,
  natsPort: -1,
  prefix,
  kbPort: 0,
  kbDedup: false,
  kbSeed: `${TENANT}:${KB},${RIVAL}:${KB}`,
  logs: { dir: join(stateDir, 'logs') },
  // The docs server is on loopback, which web.fetch_page refuses unless the origin is allowed.
  env: { WEB_ALLOWED_ORIGINS: docs.url },
});
say(`demo: stack up (nats ${stack.natsUrl}, KB ${stack.kbUrl}, KB_DEDUP=off); logs in ${join(stateDir, 'logs')}`);

const contracts = researchContracts({ kbDedup: false });
const researcher = { kind: 'agent' as const, tenant: TENANT, actor: 'researcher' };
const tools = await createTools({ servers: stack.natsUrl, tenant: TENANT, actor: 'researcher', nkeyFile: stack.seedFile(researcher), contracts: contracts.all, prefix });
const taskId = `research-${runId}`;

const c = {
  pages: 0,
  fetchFailures: 0,
  writesSubmitted: 0,
  writesCommitted: 0,
  duplicatesSuppressed: 0,
  honestWritesRejected: 0,
  unknownAtFirst: 0,
  unknownUnresolved: 0,
  calls: 0,
};
const unknownKeys = new Set<string>();
const rejectedClasses: Record<string, number> = {};
const started = Date.now();

/** The second copy: fields reordered, whitespace changed where normalisers allow, fetchedAt +02:00. */
function variant(n: { kb: string; title: string; body: string; sourceUrl: string; fetchedAt: string }) {
  const ms = Date.parse(n.fetchedAt);
  const plus2 = new Date(ms + 2 * 3600_000).toISOString().replace('Z', '+02:00');
  return { fetchedAt: plus2, sourceUrl: n.sourceUrl, body: `${n.body.split('\n').map((l) => `${l}  `).join('\r\n')}\r\n\r\n`, title: `  ${n.title.replace(/ /g, '   ')} `, kb: n.kb };
}

async function onePage(url: string): Promise<void> {
  c.calls++;
  const page = await tools.execute<{ url: string; title: string; excerpt: string }>({ tool: 'web.fetch_page', taskId, input: { url } });
  if (page.status !== 'committed') {
    c.fetchFailures++;
    return;
  }
  c.pages++;
  const note = {
    kb: KB,
    title: page.result.title,
    body: `> ${page.result.excerpt || '(no prose on this page)'}\n\nSource: <${page.result.url}>`,
    sourceUrl: page.result.url,
    fetchedAt: new Date().toISOString(),
  };
  c.writesSubmitted += 2;
  c.calls += 2;
  const [a, b] = await Promise.all([
    tools.execute({ tool: 'kb.write_note', taskId, actorId: 'researcher', input: note }),
    tools.execute({ tool: 'kb.write_note', taskId, actorId: 'researcher', input: variant(note) }),
  ]);
  const results: ExecuteResult[] = [a, b];
  for (const r of results) {
    if (r.status === 'rejected') {
      c.honestWritesRejected++;
      rejectedClasses[r.error.class] = (rejectedClasses[r.error.class] ?? 0) + 1;
    }
    if (r.status === 'unknown') unknownKeys.add(r.operationKey);
  }
  if (a.status === 'committed' || b.status === 'committed') c.writesCommitted++;
  firstKey ??= a.operationKey ?? undefined;
  if (a.status === 'committed' && b.status === 'committed' && a.operationKey === b.operationKey && JSON.stringify(a.receipt) === JSON.stringify(b.receipt)) c.duplicatesSuppressed++;
}

/**
 * globex/mallory, authenticated as itself, tries: a forged actorId, a tenant field in the input, a
 * guessed id of acme's knowledge base, publishing on acme's intent subject, and reading an acme
 * operation's status. Every write attempt must be refused; the read must reveal nothing.
 */
async function runAdversary(): Promise<{ attempts: number; rejected: number; readsRevealed: number }> {
  const mallory = { kind: 'agent' as const, tenant: RIVAL, actor: 'mallory' };
  const evil = await createTools({ servers: stack.natsUrl, tenant: RIVAL, actor: 'mallory', nkeyFile: stack.seedFile(mallory), contracts: contracts.all, prefix });
  const acmeKb = (await new KbClient(stack.kbUrl).admin(stack.kbAdminToken).list(TENANT)).find((k) => k.name === KB)!;
  const note = { kb: KB, title: 'Injected', body: 'Not yours.', sourceUrl: 'https://example.org/x', fetchedAt: new Date().toISOString() };
  const writes = [
    () => evil.execute({ tool: 'kb.write_note', taskId: `evil-${runId}`, actorId: 'researcher', input: note }),
    () => evil.execute({ tool: 'kb.write_note', taskId: `evil-${runId}`, input: { ...note, tenant: TENANT } }),
    () => evil.execute({ tool: 'kb.write_note', taskId: `evil-${runId}`, input: { ...note, kb: acmeKb.kbId } }),
  ];
  let attempts = 0;
  let rejected = 0;
  for (const w of writes) {
    attempts++;
    const r = await w();
    if (r.status === 'rejected') rejected++;
  }
  // Publishing on acme's intent subject: the server refuses it (permissions).
  attempts++;
  const nc = await connectNats({ servers: stack.natsUrl, name: 'demo-adversary', nkeySeedFile: stack.seedFile(mallory), inboxPrefix: stack.inboxPrefix(mallory), reconnectForever: false });
  const refused = new Promise<boolean>((resolve) => {
    void (async () => {
      for await (const s of nc.status()) if (s.type === 'error') return resolve(true);
    })();
    setTimeout(() => resolve(false), 3_000);
  });
  nc.publish(`${prefix}.intent.${TENANT}.researcher`, new Uint8Array([0x80]));
  if (await refused) rejected++;
  await nc.close();
  // Reading an acme operation: the status of the quickest acme key the demo knows.
  let readsRevealed = 0;
  if (firstKey) {
    const a = await evil.status({ operationKey: firstKey });
    if (a.state !== 'not_seen') readsRevealed++;
  }
  await evil.close();
  return { attempts, rejected, readsRevealed };
}
let firstKey: string | undefined;

const queue = docs.pages.map((p) => p.url);
const progress = setInterval(() => say(`demo: pages ${c.pages}/${docs.pages.length}  writes submitted ${c.writesSubmitted}  committed ${c.writesCommitted}  suppressed ${c.duplicatesSuppressed}  rejected ${c.honestWritesRejected}  unknown ${unknownKeys.size}`), 2_000);
await Promise.all(
  Array.from({ length: workers }, async () => {
    for (let url = queue.shift(); url !== undefined; url = queue.shift()) await onePage(url);
  }),
);
clearInterval(progress);
const elapsedS = (Date.now() - started) / 1000;

// An adversary of another tenant (globex/mallory) tries forged identities and a guessed foreign id.
const adversary = await runAdversary();

// Unknown is not failure: ask the server again before counting anything as unresolved.
c.unknownAtFirst = unknownKeys.size;
for (const key of unknownKeys) {
  let settled = false;
  for (let i = 0; i < 6 && !settled; i++) {
    const s = await tools.status({ operationKey: key, waitMs: 5_000 }).catch(() => null);
    if (s?.state === 'committed') {
      settled = true;
      c.writesCommitted++;
    } else if (s?.state === 'rejected') settled = true;
  }
  if (!settled) c.unknownUnresolved++;
}

const kbClient = new KbClient(stack.kbUrl);
const stats = await kbClient.stats(TENANT);
// Rows a tenant holds in a knowledge base it does not own — from the KB's own count.
let unauthorisedWrites = 0;
for (const tenant of [TENANT, RIVAL]) {
  for (const kb of await kbClient.rowsPerKb({ tenant })) if (kb.owner !== tenant) unauthorisedWrites += kb.rows;
}
await kbClient.close();
const summary = {
  pages: c.pages,
  fetchFailures: c.fetchFailures,
  writesSubmitted: c.writesSubmitted,
  writesCommitted: c.writesCommitted,
  duplicatesSuppressed: c.duplicatesSuppressed,
  honestWritesRejected: c.honestWritesRejected,
  rejectedByClass: rejectedClasses,
  unknownAtFirst: c.unknownAtFirst,
  unknownUnresolved: c.unknownUnresolved,
  kbRows: stats.rows,
  duplicateSideEffects: stats.duplicateRows,
  forgedAttempts: adversary.attempts,
  forgedRejected: adversary.rejected,
  crossTenantReadsRevealed: adversary.readsRevealed,
  unauthorisedWrites,
  callsPerSecond: Math.round((c.calls / elapsedS) * 10) / 10,
  elapsedSeconds: Math.round(elapsedS * 10) / 10,
  workers,
};
const gates = {
  enoughPages: summary.pages >= Math.min(wantPages, 200),
  writesSubmittedIsTwicePages: summary.writesSubmitted === 2 * summary.pages,
  oneCommittedNotePerPage: summary.writesCommitted === summary.pages && summary.duplicatesSuppressed === summary.pages && summary.kbRows === summary.pages,
  noHonestRejection: summary.honestWritesRejected === 0,
  noUnresolvedUnknown: summary.unknownUnresolved === 0,
  noDuplicateSideEffect: summary.duplicateSideEffects === 0,
  everyForgeryRejected: summary.forgedRejected === summary.forgedAttempts && summary.forgedAttempts > 0,
  noUnauthorisedWrite: summary.unauthorisedWrites === 0 && summary.crossTenantReadsRevealed === 0,
};
const ok = Object.values(gates).every(Boolean);

await tools.close();
await stack.stop();
await docs.stop();
if (!opts.keep) rmSync(stateDir, { recursive: true, force: true });

const rows: [string, string | number][] = [
  ['pages read (distinct documents)', summary.pages],
  ['writes submitted (2 per page)', summary.writesSubmitted],
  ['operations committed', summary.writesCommitted],
  ['second copies suppressed (same receipt)', summary.duplicatesSuppressed],
  ['honest writes rejected', summary.honestWritesRejected],
  ['unknown at first / unresolved at the end', `${summary.unknownAtFirst} / ${summary.unknownUnresolved}`],
  ['KB rows', summary.kbRows],
  ['duplicate side effects (KB rows beyond one per key)', summary.duplicateSideEffects],
  ['forged attempts by another tenant / rejected', `${summary.forgedAttempts} / ${summary.forgedRejected}`],
  ['unauthorised writes (rows in a KB of another owner)', summary.unauthorisedWrites],
  ['tool calls per second', summary.callsPerSecond],
  ['gates', ok ? 'all hold' : `FAILED: ${Object.entries(gates).filter(([, v]) => !v).map(([k]) => k).join(', ')}`],
];
const width = Math.max(...rows.map(([k]) => k.length));
process.stdout.write(`\n${rows.map(([k, v]) => `  ${k.padEnd(width)}  ${v}`).join('\n')}\n`);
if (opts.keep) process.stdout.write(`  state kept in ${stateDir}\n`);
if (opts.json) process.stdout.write(`${JSON.stringify({ ...summary, gates, ok })}\n`);
process.exit(ok ? 0 : 1);
