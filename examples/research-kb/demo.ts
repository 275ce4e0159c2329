/**
 * `npm run demo` — the main job on real input. Starts the whole stack (nats-server unless NATS_URL,
 * streams, the KB with KB_DEDUP=off and the sample's tenant list with its quotas, the four
 * services), serves the Markdown documents under node_modules (the project's, then the Node
 * installation's: ./docs-server.ts) from a local HTTP server, and runs a research agent: for every page
 * `web.fetch_page`, then `kb.write_note` with a note built from the excerpt — every write submitted
 * twice at once, the second copy with its fields reordered, whitespace changed where the normaliser
 * allows and `fetchedAt` in an equivalent time form — through `tools.execute`, 8 workers.
 *
 * The KB inserts a row for every request that reaches it (KB_DEDUP=off), so its own count of rows
 * beyond one per key is the number of duplicate side effects tooltx let through.
 *
 * Under a fault mix, injected with the shared harness (`@tooltx/dev/faults`): 10 % of the
 * writes have the executor–KB connection cut after the KB committed, 5 % have the KB's answer held
 * past the SDK's budget (the SDK returns unknown; the demo then observes status until it
 * converges), the agent's NATS connection is cut once (a TCP hop between the agent and
 * nats-server), and the executor is SIGKILLed once midway (the stack starts it again). Every one of
 * these is resolvable by probing the KB by key, so none may end in a takeover or a second row.
 *
 * The adversary: globex/mallory, authenticated as itself, tries a forged actorId, a tenant
 * field in the input (a raw intent on its own intent subject: the SDK would refuse it locally), a
 * guessed id of acme's knowledge base and acme's intent subject. An attempt counts as rejected only
 * when the server says so: its status endpoint answers `rejected` for the attempt's key (or the
 * server refuses the publish). `unauthorisedWrites` compares the KB's rows with the demo's own record
 * of which tenant submitted which write: a row whose knowledge base is owned by another tenant than
 * the one the demo submitted it as — or whose key the demo never submitted — is unauthorised.
 *
 * FM-16 (`demo-fm16.ts`): five canaries are planted in the run (the KB's operator token, a
 * page's cookie and text, a downstream's error message, a note body); the demo prints the audit view
 * of a few operations through the audit service and scans everything the run produced for them.
 *
 * Then the three outcomes of docs/compensation.md: a few notes are compensated (deleted), one
 * compensation refused by the KB's hop, which ends in a takeover (the run's only one: FM-20); and
 * two digest mails are drafted
 * through `mail.send_draft`, held back with their preview: one is confirmed (one send in the mail
 * outbox, which runs with MAIL_DEDUP=off, so a second send would show), the other discarded
 * (rolled back, nothing sent).
 *
 * Options: --json (one JSON object on the last line), --quick (about 20 pages), --pages N (default
 * 250), --workers N (default 8), --keep (keep the state directory and logs). A bad number exits 2
 * at once, before anything starts.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { Command, Option } from 'commander';
import { envInt, usageErrorsExitTwo } from '@tooltx/runtime';
import {
  createTools,
  newSubmission,
  publishSubmission,
  type ExecuteOptions,
  type ExecuteRequest,
  type ExecuteResult,
  type Tools,
} from '@tooltx/client';
import { deriveCompensationKey, downstreamKeyOf, operationIdOf, prepareCall } from '@tooltx/contracts';
import { HttpFaultProxy, TcpFaultProxy } from '@tooltx/dev/faults';
import { connectNats, decodeRaw, jetStreamOf, Subjects } from '@tooltx/nats';
import { DEFAULT_KB_TIMING, researchContracts } from './contracts.js';
import { DocsServer, nodeModulesRoots } from './docs-server.js';
import { KbClient } from './kb-client.js';
import { MailClient } from './mail-client.js';
import { mailContracts } from './mail-contracts.js';
import { readLiveRows } from './kb-store.js';
import { startStack } from '@tooltx/dev/stack';
import { CanaryWeb, newCanaries, runFm16 } from './demo-fm16.js';

const DEFAULT_PAGES = 250;
const QUICK_PAGES = 20;
const DEFAULT_WORKERS = 8;
const program = usageErrorsExitTwo(new Command('tooltx-demo'))
  .description('research agent demo: real pages, every write submitted twice, counted by the KB itself')
  .option('--json', 'print one JSON object with the figures on the last line')
  .option('--quick', `about ${QUICK_PAGES} pages (instead of --pages)`)
  .addOption(
    new Option(
      '--pages <n>',
      'distinct pages to read, at most: a whole number ≥ 1 (fewer when node_modules holds fewer distinct Markdown documents)',
    ).default(DEFAULT_PAGES),
  )
  .addOption(
    new Option('--workers <n>', 'concurrent agent workers: a whole number from 1 to 64').default(DEFAULT_WORKERS),
  )
  .option('--keep', 'keep the state directory (logs, JetStream store, KB database)')
  .parse(process.argv);
const opts = program.opts<{
  json?: boolean;
  quick?: boolean;
  pages: string | number;
  workers: string | number;
  keep?: boolean;
}>();
/** A whole-number option, checked before anything starts: a bad one exits 2 naming the flag. */
const countOption = (flag: string, v: string | number, max: number): number => {
  // Decimal digits only: 0x10 and 1e3 are not counts.
  const r = envInt(1, max).safeParse(String(v));
  return r.success
    ? r.data
    : program.error(`error: ${flag}: expected a whole number from 1 to ${max}, got ${JSON.stringify(v)}`, {
        exitCode: 2,
        code: 'tooltx.demo.usage',
      });
};
const pagesOption = countOption('--pages', opts.pages, 100_000);
const workers = countOption('--workers', opts.workers, 64);
const wantPages = opts.quick ? QUICK_PAGES : pagesOption;
const demoStart = Date.now();
/** A progress line on stderr, stamped with the seconds since the demo started. */
const say = (line: string) =>
  process.stderr.write(
    `${line.replace(/^demo:/, `demo [${((Date.now() - demoStart) / 1000).toFixed(1).padStart(5)} s]:`)}\n`,
  );

const stateDir = mkdtempSync(join(tmpdir(), 'tooltx-demo-'));
const runId = randomBytes(4).toString('hex');
const prefix = process.env.NATS_URL ? `demo_${runId}` : 'tooltx';
const TENANT = 'acme';
const RIVAL = 'globex';
const KB = 'research';

/**
 * The fault mix, by the page's position in the queue (the same mix every run): every 10th write
 * has its KB connection cut after the commit, every 20th has the KB's answer held past the SDK's
 * budget. A held write's budget is shorter than the contract's timeout (so the SDK gives up first);
 * the hop holds the answer past that timeout too (the executor gives up as well, records unknown,
 * and the reconciler's probe finds the row).
 */
const CUT_EVERY = 10;
const HOLD_EVERY = 20;
const faultOf = (i: number): 'cut_after_commit' | 'held_past_budget' | undefined =>
  i % CUT_EVERY === 3 ? 'cut_after_commit' : i % HOLD_EVERY === 8 ? 'held_past_budget' : undefined;
const HELD_BUDGET_MS = Math.min(3_000, DEFAULT_KB_TIMING.timeoutMs - 1_000);
const HOLD_MS = DEFAULT_KB_TIMING.timeoutMs * 2;
/** How long the demo observes an operation the SDK answered unknown, at most. */
const OBSERVE_MS = 180_000;

const roots = nodeModulesRoots();
const docs = await new DocsServer(roots, wantPages).start();
say(
  `demo: ${docs.pages.length} distinct Markdown pages from node_modules (${roots.map((r) => `${docs.pages.filter((p) => p.root === r).length} from ${r}`).join(', ')}) served at ${docs.url}`,
);
// FM-16: this run's canaries, and the small web that carries two of them.
const canaries = newCanaries();
const canaryWeb = await new CanaryWeb(canaries).start();
// The executor → KB hop: faults keyed on a write's downstream key; the tools run with keep-alive off
// (one request per connection), so one cut touches one request.
let kbHop: HttpFaultProxy | undefined;
const restarts: string[] = [];
const stack = await startStack({
  stateDir,
  kbHop: async (kbUrl) => (kbHop = await new HttpFaultProxy(kbUrl).start()).url,
  onRestart: (name) => restarts.push(name),
  natsUrl: process.env.NATS_URL,
  natsPort: -1,
  prefix,
  kbPort: 0,
  kbDedup: false,
  kbSeed: `${TENANT}:${KB},${RIVAL}:${KB}`,
  // Quotas from the sample's tenant list (stack.ts's default, examples/research-kb/tenants.json).
  logs: { dir: join(stateDir, 'logs') },
  // The docs server is on loopback, which web.fetch_page refuses unless the origin is allowed.
  env: { WEB_ALLOWED_ORIGINS: `${docs.url},${canaryWeb.url}`, KB_KEEPALIVE: 'off' },
  // The KB's operator token is the credential canary.
  kbAdminToken: canaries.token,
});
// The agent → nats-server hop: the agent's connection is cut once, midway.
const natsHop = await TcpFaultProxy.forUrl(stack.natsUrl).start();
say(`demo: stack up (nats ${stack.natsUrl}, KB ${stack.kbUrl}, KB_DEDUP=off); logs in ${join(stateDir, 'logs')}`);

const contracts = researchContracts({ kbDedup: false });
// The stack's outbox runs with MAIL_DEDUP=off (it follows kbDedup), and the contracts agree.
const mail = mailContracts({ mailDedup: false });
// The demo reads the KB (probes, stats) as the trusted side does: with its service token.
const kbClient = new KbClient(stack.kbUrl, { serviceToken: stack.kbServiceToken });
const kbAdmin = kbClient.admin(stack.kbAdminToken);
const researcher = { kind: 'agent' as const, tenant: TENANT, actor: 'researcher' };
const tools = await createTools({
  servers: natsHop.url,
  tenant: TENANT,
  actor: 'researcher',
  nkeyFile: stack.seedFile(researcher),
  contracts: [...contracts.all, ...mail.all],
  prefix,
  receiptKeys: stack.receiptKeysFile,
});
const taskId = `research-${runId}`;

const c = {
  pages: 0,
  fetchFailures: 0,
  /** Pages whose fetch and both writes have ended (fetched or not): the progress line's count. */
  pagesDone: 0,
  writesSubmitted: 0,
  calls: 0,
  resubmittedAfterBackoff: 0,
};
/** One page's write: both copies' outcomes, the first copy's request (to resubmit it) and its fault. */
interface PageWrite {
  key: string;
  request: ExecuteRequest;
  fault: ReturnType<typeof faultOf>;
  copies: ExecuteResult[];
}
const writes: PageWrite[] = [];
const started = Date.now();

/**
 * The demo's own record of every write it submitted, by the downstream key the KB stores it under
 * (tenant-scoped: `downstreamKeyOf(tenant, operationKey)`): the tenant it submitted the write as.
 */
const submittedAs = new Map<string, string>();
function recordWrite(tenant: string, operationKey: string | null | undefined): void {
  if (operationKey) submittedAs.set(downstreamKeyOf(tenant, operationKey), tenant);
}

/** The second copy: fields reordered, whitespace changed where normalisers allow, fetchedAt +02:00. */
function variant(n: { kb: string; title: string; body: string; sourceUrl: string; fetchedAt: string }) {
  const ms = Date.parse(n.fetchedAt);
  const plus2 = new Date(ms + 2 * 3600_000).toISOString().replace('Z', '+02:00');
  return {
    fetchedAt: plus2,
    sourceUrl: n.sourceUrl,
    body: `${n.body
      .split('\n')
      .map((l) => `${l}  `)
      .join('\r\n')}\r\n\r\n`,
    title: `  ${n.title.replace(/ /g, '   ')} `,
    kb: n.kb,
  };
}

/**
 * One call under the SDK's decision table for a write (FM-15): a refusal whose next action is a
 * bounded backoff (e.g. the KB refused a request that reached it after its deadline: not applied)
 * is resubmitted after a pause, at most 3 times; anything else is the outcome.
 */
async function execute(t: Tools, req: ExecuteRequest, o: ExecuteOptions): Promise<ExecuteResult> {
  let r = await t.execute(req, o);
  for (let i = 0; i < 3 && r.status === 'rejected' && r.next === 'backoff'; i++) {
    c.resubmittedAfterBackoff++;
    await new Promise((res) => setTimeout(res, 1_000 * 2 ** i));
    c.calls++;
    r = await t.execute(req, o);
  }
  return r;
}

async function onePage(url: string, index: number): Promise<void> {
  c.calls++;
  const page = await tools.execute<{ url: string; title: string; excerpt: string }>({
    tool: 'web.fetch_page',
    taskId,
    input: { url },
  });
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
  const request: ExecuteRequest = { tool: 'kb.write_note', taskId, actorId: 'researcher', input: note };
  // The key the server will derive (the SDK derives the same): the hop's faults are keyed on the
  // downstream key the executor sends with the write.
  const key = prepareCall(contracts.writeNote, taskId, note).operationKey;
  const fault = faultOf(index);
  if (fault === 'cut_after_commit') kbHop!.inject(downstreamKeyOf(TENANT, key), { kind: 'cut_response' });
  if (fault === 'held_past_budget') kbHop!.inject(downstreamKeyOf(TENANT, key), { kind: 'hold_response', ms: HOLD_MS });
  const options: ExecuteOptions = fault === 'held_past_budget' ? { budgetMs: HELD_BUDGET_MS } : {};
  const w: PageWrite = { key, request, fault, copies: [] };
  writes.push(w);
  recordWrite(TENANT, key);
  w.copies = await Promise.all([
    execute(tools, request, options),
    execute(tools, { ...request, input: variant(note) }, options),
  ]);
  // The key that holds the effect, should the server have named a canonical one (FM-10).
  for (const r of w.copies) recordWrite(TENANT, r.operationKey);
  firstKey ??= w.copies[0]!.operationKey ?? undefined;
}

/**
 * The machine-level faults, each once, as the run passes its marks: the executor is SIGKILLed at
 * 30 % of the pages (the stack's supervisor starts it again), the agent's NATS connection is cut at
 * 50 % (the SDK reconnects through the hop).
 */
const machineFaults = { executorKilled: 0, agentCutProgrammed: false };
function onPageDone(): void {
  const done = c.pages + c.fetchFailures;
  if (!machineFaults.executorKilled && done >= Math.ceil(docs.pages.length * 0.3)) {
    const executor = stack.processes.find(
      (p) => p.name === 'executor-1' && p.child.exitCode === null && p.child.signalCode === null,
    );
    if (executor?.child.kill('SIGKILL')) machineFaults.executorKilled++;
  }
  if (!machineFaults.agentCutProgrammed && done >= Math.ceil(docs.pages.length * 0.5)) {
    // Addressed by the client name of its CONNECT line; the hop counts it once it has cut it.
    machineFaults.agentCutProgrammed = true;
    natsHop.program({ name: `tooltx-sdk:${TENANT}/researcher` }, { kind: 'cut' });
  }
}

/** How a forgery ended: the server's error class, `permission` (the server refused the publish), or `not rejected (…)`. */
type ForgeryOutcome = string;

/**
 * globex/mallory, authenticated as itself, tries: a forged actorId, a tenant field in the input, a
 * guessed id of acme's knowledge base, publishing on acme's intent subject, and reading an acme
 * operation's status. Every write attempt must reach the server and be refused BY THE SERVER: it
 * counts as rejected only when mallory's status endpoint answers `rejected` for the attempt's key
 * (or the server refuses the publish); the read must reveal nothing. Every key is recorded as
 * submitted by globex.
 */
async function runAdversary(): Promise<{
  attempts: number;
  rejected: number;
  readsRevealed: number;
  outcomes: Record<string, ForgeryOutcome>;
}> {
  const mallory = { kind: 'agent' as const, tenant: RIVAL, actor: 'mallory' };
  const evil = await createTools({
    servers: stack.natsUrl,
    tenant: RIVAL,
    actor: 'mallory',
    nkeyFile: stack.seedFile(mallory),
    contracts: contracts.all,
    prefix,
    receiptKeys: stack.receiptKeysFile,
  });
  const nc = await connectNats({
    servers: stack.natsUrl,
    name: 'demo-adversary',
    nkeySeedFile: stack.seedFile(mallory),
    inboxPrefix: stack.inboxPrefix(mallory),
    reconnectForever: false,
  });
  const acmeKb = (await kbAdmin.list(TENANT)).find((k) => k.name === KB)!;
  const note = {
    kb: KB,
    title: 'Injected',
    body: 'Not yours.',
    sourceUrl: 'https://example.org/x',
    fetchedAt: new Date().toISOString(),
  };
  const outcomes: Record<string, ForgeryOutcome> = {};
  let attempts = 0;
  let rejected = 0;

  /** The server's answer for `key`, as mallory sees it, observed until final or 60 s. */
  const serverVerdict = async (key: string, submissionIds?: string[]): Promise<ForgeryOutcome> => {
    const until = Date.now() + 60_000;
    let last = 'no answer';
    while (Date.now() < until) {
      const a = await evil
        .status({ operationKey: key, waitMs: 10_000, untilFinal: true, ...(submissionIds ? { submissionIds } : {}) })
        .catch(() => null);
      if (a?.state === 'rejected') return a.error?.class ?? 'rejected';
      if (a) last = a.state;
      if (a?.state === 'committed') break;
      if (!a) await new Promise((r) => setTimeout(r, 500));
    }
    return `not rejected (${last})`;
  };
  const judge = (kind: string, outcome: ForgeryOutcome) => {
    attempts++;
    outcomes[kind] = outcome;
    if (!outcome.startsWith('not rejected')) rejected++;
  };

  try {
    // (1) A forged actorId through the SDK: the envelope names acme's researcher.
    const taskId1 = `evil-${runId}-actor`;
    const k1 = prepareCall(contracts.writeNote, taskId1, note).operationKey;
    recordWrite(RIVAL, k1);
    await evil.execute({ tool: 'kb.write_note', taskId: taskId1, actorId: 'researcher', input: note });
    judge('forgedActorId', await serverVerdict(k1));

    // (2) A tenant field in the input. The SDK refuses an input its contract does not allow before
    // sending anything, so this goes out as a raw intent on mallory's own intent subject, under the
    // key of the same note without the field: the server records its refusal under that key.
    const taskId2 = `evil-${runId}-tenant`;
    const k2 = prepareCall(contracts.writeNote, taskId2, note).operationKey;
    recordWrite(RIVAL, k2);
    const { js } = await jetStreamOf(nc);
    const raw = newSubmission(new Subjects(prefix), RIVAL, 'mallory', {
      tool: 'kb.write_note',
      version: contracts.writeNote.version,
      taskId: taskId2,
      operationKey: k2,
      input: { ...note, tenant: TENANT },
    });
    await publishSubmission(js, raw);
    judge('tenantField', await serverVerdict(k2, [raw.submissionId]));

    // (3) A guessed id of acme's knowledge base.
    const taskId3 = `evil-${runId}-guess`;
    const guessed = { ...note, kb: acmeKb.kbId };
    const k3 = prepareCall(contracts.writeNote, taskId3, guessed).operationKey;
    recordWrite(RIVAL, k3);
    recordWrite(RIVAL, (await evil.execute({ tool: 'kb.write_note', taskId: taskId3, input: guessed })).operationKey);
    judge('guessedKbId', await serverVerdict(k3));

    // (4) Publishing on acme's intent subject: the server refuses it (permissions).
    const refused = new Promise<boolean>((resolve) => {
      void (async () => {
        for await (const s of nc.status()) if (s.type === 'error') return resolve(true);
      })();
      setTimeout(() => resolve(false), 3_000);
    });
    nc.publish(`${prefix}.intent.${TENANT}.researcher`, new Uint8Array([0x80]));
    judge('foreignIntentSubject', (await refused) ? 'permission' : 'not rejected (no permission error)');
  } finally {
    await nc.close().catch(() => undefined);
  }
  // Reading an acme operation: the status of the quickest acme key the demo knows.
  let readsRevealed = 0;
  if (firstKey) {
    const a = await evil.status({ operationKey: firstKey });
    if (a.state !== 'not_seen') readsRevealed++;
  }
  await evil.close();
  return { attempts, rejected, readsRevealed, outcomes };
}
let firstKey: string | undefined;

/**
 * The event types of every operation of the demo's tenant, by operation subject, in order: one
 * ordered read of the event log as the provisioner (agents cannot read it). Event types are read
 * without their schema, so a type this demo does not know is still counted.
 */
/**
 * The tenant's event log, read as the operator: each operation's event types by subject, and the
 * subjects of operations handed to a person — a `takeover` event (an unknown outcome, FM-14) or a
 * `compensation_failed` event with its takeover record (FM-20).
 */
async function histories(): Promise<{ types: Map<string, string[]>; takenOver: Set<string> }> {
  const nc = await connectNats({
    servers: stack.natsUrl,
    name: 'demo-operator',
    nkeySeedFile: stack.seedFile({ kind: 'provisioner' }),
    inboxPrefix: stack.inboxPrefix({ kind: 'provisioner' }),
    reconnectForever: false,
  });
  try {
    const { js } = await jetStreamOf(nc);
    const subjects = new Subjects(prefix);
    const consumer = await js.consumers.get(subjects.eventsStream, { filter_subjects: `${prefix}.op.${TENANT}.>` });
    const out = new Map<string, string[]>();
    const takenOver = new Set<string>();
    for (let more = true; more; ) {
      more = false;
      for await (const m of await consumer.fetch({ max_messages: 1_000, expires: 3_000 })) {
        const e = decodeRaw(m.data) as { type?: unknown; takeover?: unknown };
        const list = out.get(m.subject) ?? [];
        list.push(typeof e.type === 'string' ? e.type : '?');
        out.set(m.subject, list);
        if (e.type === 'takeover' || (e.type === 'compensation_failed' && e.takeover)) takenOver.add(m.subject);
        more = m.info.pending > 0;
      }
    }
    return { types: out, takenOver };
  } finally {
    await nc.close();
  }
}

const queue = docs.pages.map((p, index) => ({ url: p.url, index }));
const unknownNow = () => writes.filter((w) => w.copies.some((r) => r.status === 'unknown')).length;
const faultsNow = () => (kbHop?.injected.length ?? 0) + natsHop.injected.length + machineFaults.executorKilled;
const progressLine = () =>
  `demo: pages done ${c.pagesDone}/${docs.pages.length}${c.fetchFailures ? ` (${c.fetchFailures} not fetched)` : ''}  writes submitted ${c.writesSubmitted}  faults injected ${faultsNow()}  unknown ${unknownNow()}  executor restarts ${restarts.filter((n) => n.startsWith('executor')).length}`;
let lastProgress = '';
// A line only when something moved, so a slow last write does not repeat the same line.
const progress = setInterval(() => {
  const line = progressLine();
  if (line !== lastProgress) say((lastProgress = line));
}, 2_000);
await Promise.all(
  Array.from({ length: workers }, async () => {
    for (let p = queue.shift(); p !== undefined; p = queue.shift()) {
      await onePage(p.url, p.index);
      c.pagesDone++;
      onPageDone();
    }
  }),
);
clearInterval(progress);
say(progressLine());
const elapsedS = (Date.now() - started) / 1000;

// An adversary of another tenant (globex/mallory) tries forged identities and a guessed foreign id.
const adversary = await runAdversary();

// Unknown is not failure (FM-12, FM-13): observe the operation's status until it converges. A copy
// whose intent the server never saw (the agent's connection was cut before its PubAck) is
// resubmitted under the same key — which cannot make a second operation.
const unknownWrites = writes.filter((w) => w.copies.some((r) => r.status === 'unknown'));
await Promise.all(
  unknownWrites.map(async (w) => {
    const until = Date.now() + OBSERVE_MS;
    const settled = (r: ExecuteResult) => r.status !== 'unknown';
    while (!w.copies.every(settled) && Date.now() < until) {
      const s = await tools.status({ operationKey: w.key, waitMs: 5_000 }).catch(() => null);
      if (s?.state === 'committed' || s?.state === 'rejected' || s?.state === 'not_seen') {
        // The SDK's own call returns the final outcome with its receipt (a replay of a known key).
        w.copies = await Promise.all(
          w.copies.map((r, i) =>
            settled(r)
              ? r
              : execute(
                  tools,
                  i === 0
                    ? w.request
                    : { ...w.request, input: variant(w.request.input as Parameters<typeof variant>[0]) },
                  {},
                ),
          ),
        );
      } else await new Promise((res) => setTimeout(res, 500));
    }
  }),
);

// The event log, read as the operator: which operations went through `unknown` (every injected
// fault is resolvable by probing, so none may end in a takeover; read again after the
// compensations below, where the planned failure must).
const { types: log } = await histories();
const typesOf = (key: string) => log.get(new Subjects(prefix).op(TENANT, operationIdOf(key))) ?? [];
const terminal = (key: string) => ['committed', 'rejected'].includes(typesOf(key).at(-1) ?? '');
const everUnknown = writes.filter(
  (w) => w.copies.some((r) => r.status === 'unknown') || typesOf(w.key).includes('unknown'),
);

// Every write the hop faulted: committed with the row the KB's probe finds under its key, one row.
let faultsResolvedByProbe = 0;
for (const w of writes.filter((x) => x.fault)) {
  const probe = await kbClient.probe({ tenant: TENANT, key: downstreamKeyOf(TENANT, w.key) });
  const receipt = w.copies.find((r) => r.status === 'committed');
  if (probe.found && probe.count === 1 && receipt?.status === 'committed' && receipt.receipt.resourceId === probe.id)
    faultsResolvedByProbe++;
}
const stats = await kbClient.stats(TENANT);
// Every row the KB holds, against the demo's own record of who submitted it (never the row's own
// tenant column): a row in a knowledge base whose owner is not the tenant the demo submitted it as
// — or a row under a key the demo never submitted — is an unauthorised write. A batch item's key is
// `<key>#<index>`.
let unauthorisedWrites = 0;
const kbRowsAll = readLiveRows(stack.kbDb);
for (const row of kbRowsAll) if (submittedAs.get(row.key.replace(/#\d+$/, '')) !== row.owner) unauthorisedWrites++;
// The tenants' quotas, from the tenant list, as the KB counts them (notes in the current UTC day).
const quotas: Record<string, { limit: number | null; used: number }> = {};
for (const tenant of [TENANT, RIVAL]) {
  const v = (await kbAdmin.list(tenant))[0];
  if (v) quotas[tenant] = { limit: v.quotaLimit, used: v.quotaUsed };
}
await kbClient.close();
const rejectedByClass: Record<string, number> = {};
for (const w of writes)
  for (const r of w.copies)
    if (r.status === 'rejected') rejectedByClass[r.error.class] = (rejectedByClass[r.error.class] ?? 0) + 1;
const committedReceipts = (w: PageWrite) =>
  w.copies.map((r) => (r.status === 'committed' && r.operationKey === w.key ? JSON.stringify(r.receipt) : null));
const faultsByKind = {
  cutAfterCommit: kbHop?.injected.filter((f) => f.kind === 'cut_response').length ?? 0,
  heldPastBudget: kbHop?.injected.filter((f) => f.kind === 'hold_response').length ?? 0,
  agentConnectionCut: natsHop.injected.length,
  executorKilled: machineFaults.executorKilled,
};
// FM-16: plant the five canaries, take the audit view, scan everything the run produced.
const firstCommitted = writes.find((w) => w.copies.some((r) => r.status === 'committed'));
const fm16 = await runFm16({
  stack,
  prefix,
  canaries,
  web: canaryWeb,
  agent: tools,
  contracts: contracts.all,
  tenant: TENANT,
  auditor: 'audrey',
  rival: RIVAL,
  rivalActor: 'gina',
  kb: KB,
  taskId,
  logsDir: join(stateDir, 'logs'),
  since: started - 60_000,
  committed: firstCommitted?.key,
  conflictOf: firstCommitted?.request,
  unknownResolved: everUnknown.find((w) => terminal(w.key))?.key,
});
// Compensation (docs/compensation.md), after the rows were counted: a few committed notes are
// deleted by compensating their writes, and the KB's hop refuses the delete of the last one, as a
// frozen knowledge base would: that compensation fails and ends in a takeover (its task frozen,
// the takeover record written with the failure, FM-20).
const toCompensate = writes.filter((w) => committedReceipts(w).some(Boolean)).slice(0, opts.quick ? 3 : 5);
const failing = toCompensate.at(-1);
if (failing && kbHop)
  kbHop.inject(downstreamKeyOf(TENANT, deriveCompensationKey(failing.key, { tool: 'kb.delete_note', version: 1 })), {
    kind: 'refuse',
    status: 409,
    body: { error: 'frozen' },
  });
const compensations: string[] = [];
for (const w of toCompensate)
  compensations.push((await tools.compensate({ operationKey: w.key, reason: 'the note is withdrawn' })).status);
const compensation = {
  planned: toCompensate.length,
  plannedFailures: failing && kbHop ? 1 : 0,
  compensated: compensations.filter((x) => x === 'compensated').length,
  compensationFailed: compensations.filter((x) => x === 'compensation_failed').length,
};
// Every takeover of the run, read from the event log once the compensations ended: only the
// planned compensation failure may be one.
const { takenOver } = await histories();
const plannedTakeovers = new Set(failing && kbHop ? [new Subjects(prefix).op(TENANT, operationIdOf(failing.key))] : []);
const heldStarted = Date.now();
const held = await heldBackMails();
say(
  `demo: held-back digest mails: ${held.held} held with a preview, ${held.mailsSent} sent after confirmation, ${held.rolledBack} rolled back (${((Date.now() - heldStarted) / 1000).toFixed(1)} s)`,
);

/**
 * Held-back commits (docs/compensation.md "Held-back commits"): two digest mails of the committed
 * notes' titles, each drafted through `mail.send_draft` (its own task: the same recipients under
 * one task would be one operation), both at once. Each answers `awaiting_confirmation` with the
 * draft's preview and nothing sent; the researcher (the drafter, whom the sample's policy grants
 * `mail.confirm`) confirms the first, which then sends once, and discards the second, which ends
 * `rolled_back`. What the outbox itself holds under each key is the count: sends (MAIL_DEDUP=off:
 * every send request that reached it is a row) and the discarded draft.
 */
async function heldBackMails(): Promise<{
  planned: { sent: number; rolledBack: number };
  held: number;
  mailsSent: number;
  rolledBack: number;
  draftsDiscarded: number;
}> {
  const titles = writes
    .filter((w) => committedReceipts(w).some(Boolean))
    .slice(0, 5)
    .map((w) => (w.request.input as { title: string }).title);
  const body = `New notes in the research knowledge base:\n\n${titles.map((t) => `- ${t}`).join('\n')}`;
  const digest = (decision: 'confirm' | 'discard') =>
    (async () => {
      const r = await tools.execute({
        tool: 'mail.send_draft',
        taskId: `digest-${runId}-${decision}`,
        input: { to: ['research-team@example.org'], subject: `Research digest (${decision})`, body },
      });
      if (r.status !== 'awaiting_confirmation' || r.preview === undefined)
        return { held: false, decided: false, key: r.operationKey };
      const d =
        decision === 'confirm'
          ? (await tools.confirm({ operationKey: r.operationKey })).status === 'committed'
          : (await tools.discard({ operationKey: r.operationKey })).status === 'rolled_back';
      return { held: true, decided: d, key: r.operationKey };
    })();
  const [confirmed, discarded] = await Promise.all([digest('confirm'), digest('discard')]);
  if (!stack.mail)
    return { planned: { sent: 1, rolledBack: 1 }, held: 0, mailsSent: 0, rolledBack: 0, draftsDiscarded: 0 };
  const outbox = new MailClient(stack.mail.url, { serviceToken: stack.mail.serviceToken });
  try {
    const sentUnder = async (key: string | null | undefined) => {
      if (!key) return 0;
      const p = await outbox.probeSent({ tenant: TENANT, key: downstreamKeyOf(TENANT, key) });
      return p.found ? p.count : 0;
    };
    // The discard step drops the draft after the rollback is recorded: waited for, briefly.
    let draftsDiscarded = 0;
    for (const until = Date.now() + 5_000; discarded.key && Date.now() < until; ) {
      const p = await outbox.probeDiscard({ tenant: TENANT, key: downstreamKeyOf(TENANT, discarded.key) });
      if (p.found) {
        draftsDiscarded = 1;
        break;
      }
      await new Promise((r) => setTimeout(r, 100));
    }
    return {
      planned: { sent: 1, rolledBack: 1 },
      held: [confirmed, discarded].filter((x) => x.held).length,
      mailsSent: (await sentUnder(confirmed.key)) + (await sentUnder(discarded.key)),
      rolledBack: discarded.decided ? 1 : 0,
      draftsDiscarded,
    };
  } finally {
    await outbox.close();
  }
}
const summary = {
  // The server of this run: its version, and what its acknowledgements promise (docs/durability.md);
  // `unknown` for a server given by NATS_URL, whose configuration is not ours to read.
  natsServer: { version: stack.natsServer.version, durability: stack.natsServer.durability },
  pages: c.pages,
  fetchFailures: c.fetchFailures,
  writesSubmitted: c.writesSubmitted,
  writesCommitted: writes.filter((w) => committedReceipts(w).some(Boolean)).length,
  duplicatesSuppressed: writes.filter((w) => {
    const [a, b] = committedReceipts(w);
    return a !== null && a === b;
  }).length,
  honestWritesRejected: writes.reduce((n, w) => n + w.copies.filter((r) => r.status === 'rejected').length, 0),
  rejectedByClass,
  resubmittedAfterBackoff: c.resubmittedAfterBackoff,
  faultsInjected: Object.values(faultsByKind).reduce((a, b) => a + b, 0),
  faultsByKind,
  faultsPlanned: writes.filter((w) => w.fault).length + 2,
  faultsResolvedByProbe,
  executorRestarts: restarts.filter((n) => n.startsWith('executor')).length,
  unknownAtFirst: unknownWrites.length,
  unknownRecorded: writes.filter((w) => typesOf(w.key).includes('unknown')).length,
  unknownResolved: everUnknown.filter((w) => terminal(w.key) && w.copies.every((r) => r.status !== 'unknown')).length,
  unknownUnresolved: everUnknown.filter((w) => !(terminal(w.key) && w.copies.every((r) => r.status !== 'unknown')))
    .length,
  /** Operations handed to a person: the planned failed compensation, and nothing else may be. */
  takeovers: takenOver.size,
  kbRows: stats.rows,
  duplicateSideEffects: stats.duplicateRows,
  forgedAttempts: adversary.attempts,
  forgedRejected: adversary.rejected,
  forgedOutcomes: adversary.outcomes,
  crossTenantReadsRevealed: adversary.readsRevealed,
  unauthorisedWrites,
  kbRowsChecked: kbRowsAll.length,
  quotas,
  callsPerSecond: Math.round((c.calls / elapsedS) * 10) / 10,
  elapsedSeconds: Math.round(elapsedS * 10) / 10,
  workers,
  canariesPlanted: fm16.canariesPlanted,
  leakedSecrets: fm16.leakedSecrets,
  compensated: compensation.compensated,
  compensationFailed: compensation.compensationFailed,
  /** Held-back commits (digest mails) discarded before they ran: nothing of them was sent. */
  rolledBack: held.rolledBack,
  /** Mails the outbox sent for the demo's digests: only the confirmed one's, once. */
  mailsSent: held.mailsSent,
};
const gates = {
  enoughPages: summary.pages >= Math.min(wantPages, 200),
  writesSubmittedIsTwicePages: summary.writesSubmitted === 2 * summary.pages,
  oneCommittedNotePerPage:
    summary.writesCommitted === summary.pages &&
    summary.duplicatesSuppressed === summary.pages &&
    summary.kbRows === summary.pages,
  noHonestRejection: summary.honestWritesRejected === 0,
  noUnresolvedUnknown: summary.unknownUnresolved === 0,
  // Exactly the planned compensation failures taken over, and no other takeover (every injected
  // fault of the writes is resolved by probing).
  onlyPlannedCompensationFailuresTakenOver:
    takenOver.size === plannedTakeovers.size && [...plannedTakeovers].every((s) => takenOver.has(s)),
  everyFaultInjected: summary.faultsInjected === summary.faultsPlanned,
  everyFaultResolvedByProbe:
    summary.faultsResolvedByProbe === summary.faultsByKind.cutAfterCommit + summary.faultsByKind.heldPastBudget,
  noDuplicateSideEffect: summary.duplicateSideEffects === 0,
  everyForgeryRejected: summary.forgedRejected === summary.forgedAttempts && summary.forgedAttempts > 0,
  noUnauthorisedWrite: summary.unauthorisedWrites === 0 && summary.crossTenantReadsRevealed === 0,
  quotasFromTenantList: [TENANT, RIVAL].every(
    (t) => typeof quotas[t]?.limit === 'number' && quotas[t]!.limit! > quotas[t]!.used,
  ),
  noLeakedSecret: summary.canariesPlanted === 5 && summary.leakedSecrets === 0,
  // Exactly the planned compensations: every one compensated but the one whose delete was refused,
  // which failed and was handed to a person.
  compensationsAsPlanned:
    summary.compensated === compensation.planned - compensation.plannedFailures &&
    summary.compensationFailed === compensation.plannedFailures,
  // Both digests held back with a preview; the confirmed one sent once, the discarded one rolled
  // back with nothing sent and its draft discarded in the outbox.
  heldBackMailsAsPlanned:
    held.held === 2 &&
    summary.mailsSent === held.planned.sent &&
    summary.rolledBack === held.planned.rolledBack &&
    held.draftsDiscarded === held.planned.rolledBack,
};
const ok = Object.values(gates).every(Boolean);

await tools.close();
await stack.stop();
await natsHop.stop();
await kbHop?.stop();
await docs.stop();
await canaryWeb.stop();
if (!opts.keep) rmSync(stateDir, { recursive: true, force: true });

const rows: [string, string | number][] = [
  ['nats-server (version, durability)', `${summary.natsServer.version}, ${summary.natsServer.durability}`],
  ['pages read (distinct documents)', summary.pages],
  ['writes submitted (2 per page)', summary.writesSubmitted],
  ['operations committed', summary.writesCommitted],
  ['second copies suppressed (same receipt)', summary.duplicatesSuppressed],
  ['honest writes rejected', summary.honestWritesRejected],
  [
    'faults injected (cut after commit / held / agent cut / executor killed)',
    `${summary.faultsInjected} (${Object.values(summary.faultsByKind).join(' / ')})`,
  ],
  ['faulted writes resolved by probing the KB', summary.faultsResolvedByProbe],
  [
    'unknown (SDK / recorded) / resolved / unresolved',
    `${summary.unknownAtFirst} / ${summary.unknownRecorded} / ${summary.unknownResolved} / ${summary.unknownUnresolved}`,
  ],
  ['takeovers (planned: the failed compensations)', `${summary.takeovers} (${plannedTakeovers.size})`],
  [
    'compensations: compensated / failed, handed to a person (planned)',
    `${summary.compensated} / ${summary.compensationFailed} (${compensation.planned - compensation.plannedFailures} / ${compensation.plannedFailures})`,
  ],
  [
    'held-back digest mails: sent once confirmed / rolled back, none sent (planned)',
    `${summary.mailsSent} / ${summary.rolledBack} (${held.planned.sent} / ${held.planned.rolledBack})`,
  ],
  ['KB rows', summary.kbRows],
  ['duplicate side effects (KB rows beyond one per key)', summary.duplicateSideEffects],
  ['forged attempts by another tenant / rejected', `${summary.forgedAttempts} / ${summary.forgedRejected}`],
  [
    'unauthorised writes (rows in a KB not owned by the tenant the demo submitted them as)',
    `${summary.unauthorisedWrites} of ${summary.kbRowsChecked} rows`,
  ],
  [
    'quota used / limit per tenant (notes today, from the tenant list)',
    Object.entries(summary.quotas)
      .map(([t, q]) => `${t} ${q.used} / ${q.limit ?? 'unlimited'}`)
      .join(', '),
  ],
  ['tool calls per second', summary.callsPerSecond],
  ['canaries planted / found where they must not be (FM-16)', `${summary.canariesPlanted} / ${summary.leakedSecrets}`],
  [
    'gates',
    ok
      ? 'all hold'
      : `FAILED: ${Object.entries(gates)
          .filter(([, v]) => !v)
          .map(([k]) => k)
          .join(', ')}`,
  ],
];
process.stdout.write(fm16.auditText);
for (const l of fm16.leaks) process.stderr.write(`demo: LEAK of the ${l.kind} canary in ${l.source}\n`);
const width = Math.max(...rows.map(([k]) => k.length));
process.stdout.write(`\n${rows.map(([k, v]) => `  ${k.padEnd(width)}  ${v}`).join('\n')}\n`);
if (opts.keep) process.stdout.write(`  state kept in ${stateDir}\n`);
if (opts.json) process.stdout.write(`${JSON.stringify({ ...summary, gates, ok })}\n`);
process.exit(ok ? 0 : 1);
