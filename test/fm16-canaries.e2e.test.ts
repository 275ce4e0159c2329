/**
 * FM-16: logs and everything else tooltx writes are scanned for planted credentials,
 * cookies, bodies, page text and a downstream's error message — zero hits. Real processes (the four
 * services and the research KB, debug logs on), the real sample tools, a real HTTP page server, a
 * real HTTP hop that holds a write past its deadline (unknown → the reconciler). The intent and
 * result stores legitimately hold business data: instead, another tenant's agent and an auditor
 * are shown, by the server, to be unable to read them.
 */
import { chmodSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { NatsConnection } from '@nats-io/transport-node';
import { jetstream } from '@nats-io/jetstream';
import { operationIdOf, prepareCall } from '@tooltx/contracts';
import { createTools, type ExecuteResult, type Tools } from '@tooltx/client';
import { auditRecordSchema } from '@tooltx/lifecycle';
import { decode, encode, openBucket } from '@tooltx/nats';
import { keyedDigest, readKeyFile } from '@tooltx/runtime';
import {
  CanaryWeb,
  LeakScanner,
  newCanaries,
  plantCanaries,
  type Canaries,
  type PlantedCanaries,
} from '../examples/research-kb/canaries.js';
import { researchContracts } from '../examples/research-kb/contracts.js';
import { auditCli } from './helpers/audit-cli.js';
import { DelayProxy } from './helpers/delay-proxy.js';
import { RESEARCH_TOOLS, startKb, type TestKb } from './helpers/kb.js';
import { provisioned, type TestNats } from './helpers/nats.js';
import { history } from './helpers/ops.js';
import { permissionError } from './helpers/permissions.js';
import { startService, type ServiceProcess } from './helpers/services.js';
import { readStream } from './helpers/streams.js';
import { figure } from './helpers/figures.js';

const TIMING = { timeoutMs: 1_500, runningBoundMs: 1_000, unknownDeadlineMs: 60_000 };
const contracts = researchContracts({ kbDedup: false, timing: TIMING });

let canaries: Canaries;
let t: TestNats;
let web: CanaryWeb;
let kb: TestKb;
let proxy: DelayProxy;
let env: Record<string, string>;
const procs: ServiceProcess[] = [];
let tokenDir: string;
let natsLog = '';
const agents: Record<string, Tools> = {};
const returned: ExecuteResult[] = [];
const statusAnswers: unknown[] = [];
let planted: PlantedCanaries;
const keys: Record<string, string> = {};

const note = (title: string, over: Record<string, unknown> = {}) => ({
  kb: 'research',
  title,
  body: `Private observation: ${canaries.noteBody} (${title}).`,
  sourceUrl: 'https://example.org/src',
  fetchedAt: '2026-11-30T06:00:00Z',
  ...over,
});
const keyOf = (title: string, over: Record<string, unknown> = {}) =>
  prepareCall(contracts.writeNote, 'fm16', note(title, over)).operationKey;
/** Every secret file of the test deployment, by file name: seeds, the lines of PEM keys, HMAC keys. */
function keyMaterial(): Record<string, string> {
  const out: Record<string, string> = {};
  const auth = dirname(t.env.TOOLTX_TEST_NKEYS_DIR!);
  const read = (dir: string, ext: string) =>
    existsSync(dir)
      ? readdirSync(dir)
          .filter((f) => f.endsWith(ext))
          .map((f) => [f, readFileSync(join(dir, f), 'utf8')] as const)
      : [];
  for (const [f, text] of read(join(auth, 'nkeys'), '.nk')) out[f] = text.trim();
  for (const [f, text] of read(join(auth, 'signing'), '.pem'))
    text
      .split('\n')
      .filter((l) => l.length >= 40 && !l.startsWith('-----'))
      .forEach((l, i) => {
        out[`${f}#${i}`] = l;
      });
  for (const v of ['TOOLTX_AUDIT_HMAC_KEY_FILE', 'TOOLTX_LOG_HMAC_KEY_FILE'])
    out[v] = readFileSync(t.env[v]!, 'utf8').trim();
  return out;
}
const isNotesPost = (req: { method?: string; url?: string }) => req.method === 'POST' && req.url === '/v1/notes';
const write = async (actor: string, title: string, over: Record<string, unknown> = {}) => {
  const r = await agents[actor]!.execute({ tool: 'kb.write_note', taskId: 'fm16', input: note(title, over) });
  returned.push(r);
  return r;
};

beforeAll(async () => {
  canaries = newCanaries();
  t = await provisioned();
  t.server.process?.stderr?.on('data', (c: Buffer) => (natsLog += c.toString()));
  web = await new CanaryWeb(canaries).start();
  // The KB's operator token is the credential canary.
  tokenDir = mkdtempSync(join(tmpdir(), 'tooltx-fm16-'));
  writeFileSync(join(tokenDir, 'admin.token'), canaries.token, { mode: 0o600 });
  chmodSync(join(tokenDir, 'admin.token'), 0o600);
  kb = await startKb(
    {
      tenants: [
        { id: 'acme', quota: 10_000 },
        { id: 'globex', quota: 10_000 },
      ],
      knowledgeBases: [
        {
          tenant: 'acme',
          name: 'research',
          members: [
            { actor: 'alice', role: 'writer' },
            { actor: 'bob', role: 'writer' },
          ],
        },
        { tenant: 'acme', name: 'private', members: [{ actor: 'alice', role: 'writer' }] },
        { tenant: 'acme', name: 'frozen-kb', members: [{ actor: 'alice', role: 'writer' }] },
        { tenant: 'globex', name: 'research', defaultRole: 'writer' },
      ],
    },
    {
      KB_ADMIN_TOKEN_FILE: join(tokenDir, 'admin.token'),
      LOG_LEVEL: 'debug',
      TOOLTX_LOG_HMAC_KEY_FILE: t.env.TOOLTX_LOG_HMAC_KEY_FILE!,
    },
  );
  proxy = await new DelayProxy(kb.url).start();
  env = {
    ...t.env,
    TOOLTX_TOOLS_MODULE: RESEARCH_TOOLS,
    KB_URL: proxy.url,
    KB_DEDUP: 'off',
    KB_KEEPALIVE: 'off',
    KB_TIMING_MS: `${TIMING.timeoutMs},${TIMING.runningBoundMs},${TIMING.unknownDeadlineMs}`,
    TOOLTX_RECONCILE_INTERVAL_MS: '300',
    WEB_ALLOWED_ORIGINS: web.url,
  };
  // One at a time: on a loaded 2-core machine four tsx start-ups at once can starve each other.
  for (const name of ['authorizer', 'executor', 'reconciler', 'audit-projector'] as const)
    procs.push(await startService(name, env));
  for (const [tenant, actor] of [
    ['acme', 'alice'],
    ['acme', 'bob'],
    ['globex', 'gina'],
  ] as const) {
    agents[actor] = await createTools({
      servers: t.url,
      tenant,
      actor,
      nkeyFile: t.agentSeed(tenant, actor),
      contracts: contracts.all,
      prefix: t.subjects.prefix,
      receiptKeys: t.auth.receiptKeysFile,
      budgetMs: 30_000,
    });
  }
}, 240_000);

afterAll(async () => {
  for (const a of Object.values(agents)) await a.close().catch(() => undefined);
  await Promise.all(procs.map((p) => p.stop()));
  await proxy?.stop();
  await kb?.stop();
  await web?.stop();
  await t?.close();
  if (tokenDir) rmSync(tokenDir, { recursive: true, force: true });
}, 120_000);

describe('FM-16: planted secrets and content never leave their place', () => {
  it('a workload through every service: commits, refusals at intake and at execution, a conflict, a retryable failure, an unknown the reconciler resolves', {
    timeout: 180_000,
  }, async ({ task }) => {
    // The token (KB admin call), the cookie (the page sets it; a request to the KB carries it),
    // the page text, the downstream's error message (a 503 whose reason phrase carries it), a note body.
    planted = await plantCanaries({
      canaries,
      web,
      kbUrl: kb.url,
      reader: agents.alice!,
      writer: agents.alice!,
      kb: 'research',
      taskId: 'fm16',
    });
    returned.push(...planted.returned);
    expect(planted.reached).toEqual({ token: true, cookie: true, noteBody: true, pageText: true, errorMessage: true });
    expect(figure(task, { name: 'canaries planted', value: planted.planted })).toBe(5);
    expect(planted.returned[1]).toMatchObject({ status: 'rejected', error: { class: 'dependency_unavailable' } });

    expect((await write('alice', 'Committed')).status).toBe('committed');
    keys.committed = keyOf('Committed');
    // The same key with another fetch time (outside the intent): idempotency_conflict.
    expect(await write('alice', 'Committed', { fetchedAt: '2026-11-30T07:00:00Z' })).toMatchObject({
      status: 'rejected',
      error: { class: 'idempotency_conflict' },
    });
    // Refused at intake: bob has no role on `private`; a publishAt outside the window (invariants).
    expect(await write('bob', 'No role', { kb: 'private' })).toMatchObject({
      status: 'rejected',
      error: { class: 'forbidden' },
    });
    expect(await write('alice', 'Too old', { publishAt: '2000-01-01T00:00:00Z' })).toMatchObject({
      status: 'rejected',
      error: { class: 'invalid_input' },
    });
    // Refused by the system of record's state, set with the operator token.
    const frozen = (await kb.client.admin(canaries.token).list('acme')).find((k) => k.name === 'frozen-kb')!;
    await kb.client.admin(canaries.token).setState(frozen.kbId, 'frozen');
    expect(await write('alice', 'Into frozen', { kb: 'frozen-kb' })).toMatchObject({
      status: 'rejected',
      error: { class: 'forbidden' },
    });
    // Held past its deadline on the way to the KB: unknown, the reconciler probes and re-drives it.
    let held = 0;
    proxy.hold = (req) => (isNotesPost(req) && held++ === 0 ? TIMING.timeoutMs + 700 : 0);
    try {
      expect((await write('alice', 'Held')).status).toBe('committed');
    } finally {
      proxy.hold = () => 0;
    }
    keys.held = keyOf('Held');
    const types = (await history(t, 'acme', keys.held)).map((e) => e.type);
    // accepted → (requeued, when the machine is slow to start it) → running → unknown → … → committed.
    expect(types[0]).toBe('accepted');
    expect(types).toContain('unknown');
    expect(types.slice(0, types.indexOf('unknown')).at(-1)).toBe('running');
    expect(types.at(-1)).toBe('committed');
    // Another tenant asks for alice's operations: the uniform answer, no result.
    for (const k of [keys.committed, planted.keys.page!])
      statusAnswers.push(await agents.gina!.status({ operationKey: k }));
    expect(statusAnswers).toEqual([
      expect.objectContaining({ state: 'not_seen' }),
      expect.objectContaining({ state: 'not_seen' }),
    ]);
  });

  it("the canaries did reach their places: the KB, the intent stream, the result store, and the executor's logger (as an HMAC)", async () => {
    const intents = await readStream(t, t.subjects.intentsStream('acme'));
    expect(intents.some((m) => Buffer.from(m.data).includes(canaries.noteBody))).toBe(true);
    const results = await readStream(t, `KV_${t.subjects.resultsBucket}`);
    expect(results.some((m) => Buffer.from(m.data).includes(canaries.pageText))).toBe(true);
    // The downstream error reached the executor's logger: logged as class, code and an HMAC of its message.
    const executor = procs.find((p) => p.name === 'executor')!;
    const message = `page answered 503 Upstream failure ${canaries.errorMessage}`;
    const line = executor.lines.find((l) => (l.err as { type?: string } | undefined)?.type === 'PageError');
    expect(line?.err).toEqual({
      type: 'PageError',
      code: 'http_503',
      status: 503,
      messageHmac: keyedDigest(readKeyFile(t.env.TOOLTX_LOG_HMAC_KEY_FILE!), 'log-error-message', message),
    });
  });

  it("another tenant's agent and an auditor cannot read the intent/input or result stores (refused by the server)", async () => {
    const opId = operationIdOf(keys.committed!);
    const api = '$JS.API';
    const readers: [string, NatsConnection][] = [
      ['globex agent', await t.connectAs({ kind: 'agent', tenant: 'globex', actor: 'gina' })],
      ['acme auditor', await t.connectAs({ kind: 'auditor', tenant: 'acme', actor: 'audrey' })],
    ];
    try {
      for (const [who, nc] of readers) {
        for (const subject of [
          `${api}.DIRECT.GET.${t.subjects.intentsStream('acme')}`,
          `${api}.STREAM.MSG.GET.${t.subjects.intentsStream('acme')}`,
          `${api}.DIRECT.GET.KV_${t.subjects.resultsBucket}.$KV.${t.subjects.resultsBucket}.acme.${opId}`,
          `${api}.STREAM.MSG.GET.KV_${t.subjects.resultsBucket}`,
          // A consumer on either store, or even its info.
          `${api}.CONSUMER.CREATE.${t.subjects.intentsStream('acme')}`,
          `${api}.CONSUMER.CREATE.KV_${t.subjects.resultsBucket}`,
          `${api}.STREAM.INFO.${t.subjects.intentsStream('acme')}`,
          `${api}.STREAM.INFO.KV_${t.subjects.resultsBucket}`,
        ]) {
          const err = await permissionError(nc, () => nc.request(subject, encode({ seq: 1 }), { timeout: 2_000 }));
          expect([who, err.operation, err.subject]).toEqual([who, 'publish', subject]);
        }
        // What the client library does for an ordered read of the intent stream: refused at its first request.
        const err = await permissionError(nc, async () =>
          (await jetstream(nc).consumers.get(t.subjects.intentsStream('acme'))).info(),
        );
        expect(err.subject.startsWith(`${api}.`), `${who}: ${err.subject}`).toBe(true);
        for (const subject of [t.subjects.allIntents, `$KV.${t.subjects.resultsBucket}.>`]) {
          const err = await permissionError(nc, () => nc.subscribe(subject));
          expect([who, err.operation]).toEqual([who, 'subscription']);
        }
      }
    } finally {
      for (const [, nc] of readers) await nc.close();
    }
  });

  it('zero occurrences in every log line of every process, the event log, decisions, advisories, the audit bucket and log, every audit record and export, and every error returned to the agent', {
    timeout: 180_000,
  }, async ({ task }) => {
    // And the key material of this deployment: every nkey seed, receipt signing key and HMAC key.
    const scan = new LeakScanner(canaries, keyMaterial());
    expect(Object.keys(keyMaterial()).length).toBeGreaterThan(10);
    // The audit view through the service, as the auditor (records and an export).
    const kv = await openBucket(t.nc, t.subjects.auditBucket);
    const auditKey = (k: string) => t.subjects.projectionKey('acme', operationIdOf(k));
    for (const k of [keys.held!, keys.committed!]) {
      for (let i = 0; i < 200; i++) {
        const e = await kv.get(auditKey(k));
        if (e && decode(auditRecordSchema, e.value).status === 'committed') break;
        await new Promise((r) => setTimeout(r, 100));
      }
    }
    for (const args of [
      ['show', keys.held!],
      ['show', keys.committed!],
      ['show', planted.keys.flaky!],
      ['list', '--since', '1h'],
      ['export', '--since', '1h', '--format', 'jsonl'],
    ]) {
      const run = await auditCli(t, 'acme', 'audrey', args);
      expect(run.code, `${args.join(' ')}: ${run.stderr}`).toBe(0);
      scan.text(`tooltx audit ${args[0]} stdout`, run.stdout);
      scan.text(`tooltx audit ${args[0]} stderr`, run.stderr);
      if (args[0] === 'export') expect(run.json.length).toBeGreaterThanOrEqual(8);
    }
    const heldRecord = (await auditCli(t, 'acme', 'audrey', ['show', keys.held!])).json[0]!;
    expect((heldRecord.states as { event: string }[]).map((s) => s.event)).toContain('unknown');
    // Every stream but the two that hold business data, raw and decoded.
    const scannedStreams = await scan.streams(t.js, t.jsm, t.subjects);
    for (const s of [
      t.subjects.eventsStream,
      t.subjects.decisionsStream('acme'),
      t.subjects.auditLogStream,
      `KV_${t.subjects.auditBucket}`,
      `KV_${t.subjects.reconcileBucket}`,
    ])
      expect(scannedStreams).toContain(s);
    // Every result and status answer the agents got back (a committed result's business fields apart).
    scan.returned('returned to an agent', returned);
    scan.text('status answers to another tenant', JSON.stringify(statusAnswers));
    // Every log line of every process, after a clean stop (their last lines are flushed).
    expect(await Promise.all(procs.map((p) => p.stop()))).toEqual([0, 0, 0, 0]);
    for (const p of [...procs, kb.proc]) {
      for (const l of p.lines) scan.text(`${p.name} log`, JSON.stringify(l));
      scan.text(`${p.name} stderr`, p.stderr);
    }
    scan.text('nats-server log', natsLog);
    figure(task, { name: 'canary hits', value: scan.leaks.length, leakedCanaries: scan.leaks.length });
    figure(task, { name: 'places scanned', value: scan.scanned });
    expect(scan.leaks).toEqual([]);
    expect(scan.scanned).toBeGreaterThan(200);
    // The same scanner does find the canaries where they legitimately are (it is not blind).
    const control = new LeakScanner(canaries);
    for (const m of await readStream(t, t.subjects.intentsStream('acme'))) control.bytes('intents', m.data);
    for (const m of await readStream(t, `KV_${t.subjects.resultsBucket}`)) control.bytes('results', m.data);
    control.returned('a committed page fetch, with its result', [
      { ...planted.returned[0]!, status: 'unknown' } as ExecuteResult,
    ]);
    expect(new Set(control.leaks.map((l) => l.kind))).toEqual(new Set(['noteBody', 'pageText']));
    // The KB did log its requests (the canaries passed through it), and the services logged at debug.
    expect(kb.proc.lines.filter((l) => l.msg === 'request').length).toBeGreaterThan(5);
  });
});
