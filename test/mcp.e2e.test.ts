/**
 * MCP: `tooltx mcp` in front of a real stack (nats-server with auth, the research KB as its own
 * process with KB_DEDUP=off, so every write request that reaches it is a row, and `tooltx serve`),
 * driven by the official MCP SDK's client over Streamable HTTP and over stdio. One stack for the file.
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { EmptyResultSchema, McpError } from '@modelcontextprotocol/sdk/types.js';
import { prepareCall } from '@tooltx/contracts';
import type { Tools } from '@tooltx/client';
import { researchContracts } from '../examples/research-kb/contracts.js';
import { provisioned, type TestNats } from './helpers/nats.js';
import { ROOT, ServiceProcess, startHost } from './helpers/services.js';
import { kbRowsFor, RESEARCH_TOOLS, startKb, type TestKb } from './helpers/kb.js';
import { DelayProxy } from './helpers/delay-proxy.js';
import { TcpProxy } from './helpers/tcp-proxy.js';
import { isNotesPost, note } from './helpers/kb-faults.js';
import { waitForOperation } from './helpers/ops.js';

const TIMING = { timeoutMs: 8_000, runningBoundMs: 15_000, unknownDeadlineMs: 60_000 };
const KB_TIMING_MS = `${TIMING.timeoutMs},${TIMING.runningBoundMs},${TIMING.unknownDeadlineMs}`;
const research = researchContracts({ kbDedup: false, timing: TIMING });
const TOKEN = `mcp-test-token-${'x'.repeat(24)}-${process.pid}`;
const CONTRACTS_MODULE = join(ROOT, 'examples', 'research-kb', 'agent-contracts.ts');

let t: TestNats;
let kb: TestKb;
let kbHop: DelayProxy;
let natsHop: TcpProxy;
let host: ServiceProcess;
let mcp: ServiceProcess;
let mcpUrl: string;
let page: Server;
let pageUrl: string;
let alice: Tools;
let tokenFile: string;
const clients: Client[] = [];
/** The stdio server, started beside the stack (it needs NATS only). */
let stdio: Promise<{ client: Client; stderr: () => string }>;

/** The environment of `tooltx mcp` acting as acme/alice against this stack. */
const mcpEnv = (extra: Record<string, string> = {}): Record<string, string> => ({
  PATH: process.env.PATH ?? '',
  LOG_LEVEL: 'info',
  NATS_URL: t.url,
  NATS_NKEY_FILE: t.agentSeed('acme', 'alice'),
  TOOLTX_PREFIX: t.subjects.prefix,
  TOOLTX_TENANT: 'acme',
  TOOLTX_ACTOR: 'alice',
  TOOLTX_CONTRACTS_MODULE: CONTRACTS_MODULE,
  TOOLTX_RECEIPT_KEYS_FILE: t.auth.receiptKeysFile,
  KB_DEDUP: 'off',
  KB_TIMING_MS,
  ...extra,
});

/** `tooltx mcp --transport http` on a free port; resolves once it listens. */
async function startMcpHttp(natsUrl: string): Promise<{ proc: ServiceProcess; url: string }> {
  const child = spawn(process.execPath, ['--import', 'tsx', join(ROOT, 'bin', 'tooltx.ts'), 'mcp'], {
    cwd: ROOT,
    env: mcpEnv({
      NATS_URL: natsUrl,
      TOOLTX_MCP_TRANSPORT: 'http',
      TOOLTX_MCP_PORT: '0',
      TOOLTX_MCP_TOKEN_FILE: tokenFile,
    }),
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const proc = new ServiceProcess('mcp', child);
  const line = await proc.waitForLog('listening', 30_000);
  return { proc, url: String(line.url) };
}

/**
 * `tooltx mcp` over stdio, spawned by the SDK's client transport as the README starts it: the
 * identity from the auth directory, the rest as flags.
 */
async function startStdio(): Promise<{ client: Client; stderr: () => string }> {
  const {
    NATS_NKEY_FILE: _s,
    TOOLTX_RECEIPT_KEYS_FILE: _k,
    TOOLTX_TENANT: _t,
    TOOLTX_ACTOR: _a,
    TOOLTX_CONTRACTS_MODULE: _c,
    ...env
  } = mcpEnv();
  const transport = new StdioClientTransport({
    command: process.execPath,
    args: [
      '--import',
      'tsx',
      join(ROOT, 'bin', 'tooltx.ts'),
      'mcp',
      '--auth-dir',
      dirname(t.auth.receiptKeysFile),
      '--tenant',
      'acme',
      '--actor',
      'alice',
      '--contracts',
      'examples/research-kb/agent-contracts.ts',
      '--task-id',
      'mcp-stdio-task',
    ],
    cwd: ROOT,
    env,
    stderr: 'pipe',
  });
  let stderr = '';
  transport.stderr?.on('data', (d: Buffer) => (stderr += d.toString()));
  const client = new Client({ name: 'tooltx-mcp-test', version: '1.0.0' });
  await client.connect(transport);
  return { client, stderr: () => stderr };
}

async function httpClient(url: string, o: { token?: string; fetch?: typeof fetch; taskId?: string } = {}) {
  const c = new Client({ name: 'tooltx-mcp-test', version: '1.0.0' });
  const headers: Record<string, string> = { authorization: `Bearer ${o.token ?? TOKEN}` };
  if (o.taskId) headers['tooltx-task-id'] = o.taskId;
  await c.connect(
    new StreamableHTTPClientTransport(new URL(url), {
      requestInit: { headers },
      ...(o.fetch ? { fetch: o.fetch } : {}),
    }),
  );
  clients.push(c);
  return c;
}

const structured = (r: unknown) => (r as { structuredContent: Record<string, unknown> }).structuredContent;
const writeCall = (title: string, taskId: string) => ({
  name: 'kb.write_note',
  arguments: note(title),
  _meta: { 'tooltx/taskId': taskId },
});
const keyOf = (title: string, taskId: string) => prepareCall(research.writeNote, taskId, note(title)).operationKey;
const rows = (title: string, taskId: string) => kbRowsFor(kb, 'acme', keyOf(title, taskId));

beforeAll(async () => {
  const dir = mkdtempSync(join(tmpdir(), 'tooltx-mcp-'));
  tokenFile = join(dir, 'mcp.token');
  writeFileSync(tokenFile, TOKEN, { mode: 0o600 });
  page = createServer((_req, res) => {
    res.setHeader('content-type', 'text/html');
    res.end('<html><head><title>Tides</title></head><body><p>High water at 06:12.</p></body></html>');
  });
  await new Promise<void>((r) => page.listen(0, '127.0.0.1', r));
  pageUrl = `http://127.0.0.1:${(page.address() as AddressInfo).port}/tides`;
  [t, kb] = await Promise.all([
    provisioned(),
    startKb(
      {
        tenants: [{ id: 'acme', quota: 10_000 }],
        knowledgeBases: [{ tenant: 'acme', name: 'research', defaultRole: 'writer' }],
      },
      { KB_DEDUP: 'off' },
    ),
  ]);
  kbHop = await new DelayProxy(kb.url).start();
  natsHop = await TcpProxy.forUrl(t.url).start();
  stdio = startStdio();
  // Awaited by its test; a failure to start is that test's.
  stdio.catch(() => undefined);
  [host, { proc: mcp, url: mcpUrl }] = await Promise.all([
    startHost({
      ...t.env,
      TOOLTX_TOOLS_MODULE: RESEARCH_TOOLS,
      KB_URL: kbHop.url,
      KB_KEEPALIVE: 'off',
      KB_DEDUP: 'off',
      KB_TIMING_MS,
      WEB_ALLOWED_ORIGINS: new URL(pageUrl).origin,
      TOOLTX_RECONCILE_INTERVAL_MS: '300',
    }),
    // The MCP server's NATS connection goes through a hop the kill test can stall.
    startMcpHttp(natsHop.url),
  ]);
  alice = await t.agentTools('acme', 'alice', research.all);
});

afterAll(async () => {
  await Promise.allSettled([...clients.map((c) => c.close()), stdio?.then((s) => s.client.close())]);
  await alice?.close();
  const [mcpCode, code] = await Promise.all([mcp?.stop(), host?.stop()]);
  if (code !== 0) console.log(code, host?.stderr);
  await natsHop?.stop();
  await kbHop?.stop();
  await kb?.stop();
  await t?.close();
  await new Promise<void>((r) => (page ? page.close(() => r()) : r()));
  // SIGTERM drains: the MCP server exits 0, and its log never held the bearer token.
  expect(mcpCode).toBe(0);
  expect(JSON.stringify(mcp.lines) + mcp.stderr).not.toContain(TOKEN);
  expect(code).toBe(0);
});

describe('MCP over Streamable HTTP', () => {
  it('MCP tools/list: every contract with its JSON Schemas and the annotations of its effect class, plus tooltx_status and tooltx_compensate', async () => {
    const c = await httpClient(mcpUrl);
    const { tools } = await c.listTools();
    const byName = new Map(tools.map((x) => [x.name, x]));
    expect([...byName.keys()].sort()).toEqual(
      [
        'kb.delete_note',
        'kb.write_note',
        'kb.write_notes',
        'mail.send',
        'mail.send_correction',
        'mail.send_draft',
        'tooltx_compensate',
        'tooltx_status',
        'web.fetch_page',
      ].sort(),
    );
    const write = byName.get('kb.write_note')!;
    expect(write.description).toContain(research.writeNote.description);
    const { $schema: _, ...inputSchema } = z.toJSONSchema(research.writeNote.input, { unrepresentable: 'any' });
    expect(write.inputSchema).toEqual(inputSchema);
    expect(write.inputSchema).toMatchObject({ additionalProperties: false });
    expect(write.outputSchema?.properties).toHaveProperty('receipt');
    expect(write.outputSchema?.properties).toHaveProperty('result');
    expect(write.annotations).toEqual({ readOnlyHint: false, destructiveHint: false, idempotentHint: true });
    expect(byName.get('kb.delete_note')!.annotations).toMatchObject({ destructiveHint: true, idempotentHint: true });
    expect(byName.get('mail.send')!.annotations).toMatchObject({ destructiveHint: true });
    expect(byName.get('web.fetch_page')!.annotations).toEqual({ readOnlyHint: true, idempotentHint: true });
    expect(byName.get('tooltx_status')!.annotations).toMatchObject({ readOnlyHint: true });
  });

  it('MCP a read needs no task id; a write commits with its receipt apart from the result, and the same call in the same task is the same operation', async () => {
    const c = await httpClient(mcpUrl);
    const read = await c.callTool({ name: 'web.fetch_page', arguments: { url: pageUrl } });
    expect(structured(read)).toMatchObject({
      status: 'committed',
      result: { url: pageUrl, title: expect.any(String) },
      next: 'continue',
    });
    const first = await c.callTool(writeCall('MCP write', 'mcp-task-write'));
    expect(first.isError).toBeFalsy();
    const s = structured(first);
    expect(s).toMatchObject({ status: 'committed', result: {}, next: 'continue' });
    expect(s.receipt).toMatchObject({ tenant: 'acme', operationKey: keyOf('MCP write', 'mcp-task-write') });
    expect((first.content as { text: string }[])[0]!.text).toMatch(/^committed: kb\.write_note/);
    const again = await c.callTool(writeCall('MCP write', 'mcp-task-write'));
    expect(structured(again).receipt).toEqual(s.receipt);
    expect(await rows('MCP write', 'mcp-task-write')).toBe(1);
    // A connection's task id (the tooltx-task-id header) serves calls without one; _meta's wins.
    const viaHeader = await httpClient(mcpUrl, { taskId: 'mcp-task-header' });
    const byHeader = await viaHeader.callTool({ name: 'kb.write_note', arguments: note('MCP header') });
    expect(structured(byHeader).operationKey).toBe(keyOf('MCP header', 'mcp-task-header'));
    const byMeta = await viaHeader.callTool(writeCall('MCP header', 'mcp-task-meta'));
    expect(structured(byMeta).operationKey).toBe(keyOf('MCP header', 'mcp-task-meta'));
  });

  it('MCP a write without a task id, a forged tenant, wrong arguments and an unknown tool get typed answers; the server keeps serving', async () => {
    const c = await httpClient(mcpUrl);
    const noTask = await c.callTool({ name: 'kb.write_note', arguments: note('No task') });
    expect(noTask.isError).toBe(true);
    expect(structured(noTask)).toMatchObject({
      status: 'rejected',
      error: { class: 'invalid_input', issues: [{ path: ['_meta', 'tooltx/taskId'], code: 'task_id_required' }] },
      next: 'replan',
    });
    const forged = await c.callTool({
      ...writeCall('Forged', 'mcp-task-forged'),
      arguments: { ...note('Forged'), tenant: 'globex' },
    });
    expect(structured(forged)).toMatchObject({
      status: 'rejected',
      error: { class: 'invalid_input', issues: [{ path: ['arguments', 'tenant'], code: 'identity_from_connection' }] },
    });
    const { title: _, ...untitled } = note('Untitled');
    const wrong = await c.callTool({ ...writeCall('x', 'mcp-task-wrong'), arguments: untitled });
    expect(structured(wrong)).toMatchObject({ status: 'rejected', error: { class: 'invalid_input' } });
    expect((structured(wrong).error as { issues: { path: unknown[] }[] }).issues[0]!.path).toEqual([
      'arguments',
      'title',
    ]);
    const unknown = await c.callTool({ name: 'kb.drop_everything', arguments: {} }).catch((e: unknown) => e);
    expect(unknown).toBeInstanceOf(McpError);
    expect(unknown).toMatchObject({ code: -32602, data: { class: 'invalid_input', issues: [{ path: ['name'] }] } });
    expect(await rows('Forged', 'mcp-task-forged')).toBe(0);
    // A task id that is blank or not well-formed Unicode: refused at its path.
    for (const taskId of [' ', '\ud800', 'a\nb']) {
      const bad = await c.callTool({ ...writeCall('Bad task', taskId) });
      expect(structured(bad)).toMatchObject({
        status: 'rejected',
        error: { class: 'invalid_input', issues: [{ path: ['_meta', 'tooltx/taskId'] }] },
      });
    }

    const post = (body: string, token = TOKEN) =>
      fetch(mcpUrl, {
        method: 'POST',
        headers: {
          authorization: `Bearer ${token}`,
          'content-type': 'application/json',
          accept: 'application/json, text/event-stream',
        },
        body,
      });
    // Arguments that are not an object: the MCP SDK's own check, a JSON-RPC invalid-params error.
    const listArgs = await post(
      JSON.stringify({
        jsonrpc: '2.0',
        id: 3,
        method: 'tools/call',
        params: { name: 'kb.write_note', arguments: [1] },
      }),
    );
    expect(await listArgs.json()).toMatchObject({ error: { code: -32602 } });
    const malformed = await post('{"jsonrpc": "2.0", "id": 1, "method": ');
    expect(malformed.status).toBe(400);
    expect(await malformed.json()).toMatchObject({ error: { code: -32700 } });
    const huge = await post(JSON.stringify({ jsonrpc: '2.0', id: 2, method: 'tools/list', pad: 'x'.repeat(2 << 20) }));
    expect(huge.status).toBe(413);
    expect(await huge.json()).toMatchObject({ error: { code: -32600, data: { class: 'invalid_input' } } });
    expect((await c.listTools()).tools.length).toBeGreaterThan(2);
  });

  it('MCP a wrong bearer token is answered 401 before anything else, and nothing of it is logged', async () => {
    const forged = `forged-${TOKEN}`;
    const r = await fetch(mcpUrl, {
      method: 'POST',
      headers: { authorization: `Bearer ${forged}`, 'content-type': 'application/json' },
      body: '{not even json',
    });
    expect(r.status).toBe(401);
    expect(r.headers.get('www-authenticate')).toMatch(/^Bearer/);
    await expect(httpClient(mcpUrl, { token: forged })).rejects.toThrow();
    expect(JSON.stringify(mcp.lines)).not.toContain('forged-');
  });

  it('MCP the HTTP connection cut after the commit, before the answer: the same tools/call again (a new JSON-RPC id) gets the same receipt, and the KB holds one row', async () => {
    let cut = true;
    const hop = await new DelayProxy(mcpUrl.replace(/\/mcp$/, '')).start();
    hop.cutResponse = () => cut;
    try {
      // Only tools/call goes through the hop: the MCP server answers it once the write committed,
      // and the hop cuts the connection before a byte of that answer.
      const viaHop: typeof fetch = (input, init) => {
        const body = typeof init?.body === 'string' ? init.body : '';
        if (!body.includes('"tools/call"')) return fetch(input, init);
        return fetch(`${hop.url}/mcp`, init);
      };
      const c = await httpClient(mcpUrl, { fetch: viaHop });
      const call = writeCall('MCP cut', 'mcp-task-cut');
      await expect(c.callTool(call)).rejects.toThrow();
      expect(await rows('MCP cut', 'mcp-task-cut')).toBe(1);
      cut = false;
      const retry = await c.callTool(call);
      expect(structured(retry)).toMatchObject({ status: 'committed', operationKey: keyOf('MCP cut', 'mcp-task-cut') });
      const status = await alice.status({ operationKey: keyOf('MCP cut', 'mcp-task-cut') });
      expect(structured(retry).receipt).toEqual(status.receipt);
      expect(await rows('MCP cut', 'mcp-task-cut')).toBe(1);
    } finally {
      await hop.stop();
    }
  });

  it('MCP unknown is answered honestly with its operation key, and tooltx_status reads it until committed', async () => {
    kbHop.holdResponse = (req) => (isNotesPost(req) ? 2_000 : 0);
    try {
      const c = await httpClient(mcpUrl);
      const call = writeCall('MCP unknown', 'mcp-task-unknown');
      const r = await c.callTool({ ...call, _meta: { ...call._meta, 'tooltx/budgetMs': 800 } });
      expect(r.isError).toBeFalsy();
      const s = structured(r);
      expect(s).toMatchObject({ status: 'unknown', operationKey: keyOf('MCP unknown', 'mcp-task-unknown') });
      expect(s.next).not.toBe('replan');
      expect((r.content as { text: string }[])[0]!.text).toContain('tooltx_status');
      // Each status call waits up to 5 s for a final answer: a few calls at most.
      const statusOf = () =>
        c.callTool({ name: 'tooltx_status', arguments: { operationKey: s.operationKey, waitMs: 5_000 } });
      let final = await statusOf();
      for (let i = 0; i < 5 && structured(final).status !== 'committed'; i++) final = await statusOf();
      expect(structured(final)).toMatchObject({ status: 'committed', next: 'continue' });
      expect(structured(final).receipt).toMatchObject({ operationKey: s.operationKey });
      expect(await rows('MCP unknown', 'mcp-task-unknown')).toBe(1);
    } finally {
      kbHop.holdResponse = () => 0;
    }
  });

  it('MCP tooltx_compensate on a committed write answers compensated, with the compensation receipt', async () => {
    const c = await httpClient(mcpUrl);
    const w = structured(await c.callTool(writeCall('MCP compensated', 'mcp-task-comp')));
    expect(w.status).toBe('committed');
    const r = await c.callTool({
      name: 'tooltx_compensate',
      arguments: { operationKey: w.operationKey, reason: 'wrong source' },
    });
    expect(structured(r)).toMatchObject({
      status: 'compensated',
      operationKey: w.operationKey,
      next: 'continue',
      replayed: false,
    });
    expect(structured(r).receipt).toMatchObject({ operationKey: structured(r).compensationKey });
    // Asked again: the same compensation, replayed with the same receipt.
    const again = await c.callTool({
      name: 'tooltx_compensate',
      arguments: { operationKey: w.operationKey, reason: 'asked twice' },
    });
    expect(structured(again)).toMatchObject({ status: 'compensated', replayed: true });
    expect(structured(again).receipt).toEqual(structured(r).receipt);
  });

  it('MCP kill -9 of the MCP server after the commit, before the answer: started again, the same call (same task id) gets the same receipt, and the KB holds one row', async () => {
    // Nothing more reaches the MCP server from NATS: the write commits, its answer stays on the hop.
    const conn = await natsHop.waitForConnection({ nth: 1 });
    conn.delay(600_000, 'down');
    const c = await httpClient(mcpUrl);
    const call = writeCall('MCP killed', 'mcp-task-kill');
    const pending = c.callTool(call).then(
      () => 'answered',
      () => 'lost',
    );
    const key = keyOf('MCP killed', 'mcp-task-kill');
    await waitForOperation(t, 'acme', key, (o) => o.status === 'committed');
    const committed = await alice.status({ operationKey: key });
    expect(committed.state).toBe('committed');
    await mcp.kill();
    expect(await pending).toBe('lost');
    ({ proc: mcp, url: mcpUrl } = await startMcpHttp(t.url));
    const again = await (await httpClient(mcpUrl)).callTool(call);
    expect(structured(again)).toMatchObject({ status: 'committed', operationKey: key });
    expect(structured(again).receipt).toEqual(committed.receipt);
    expect(await rows('MCP killed', 'mcp-task-kill')).toBe(1);
  });
  it('MCP SIGTERM drains: a call in flight is answered, committed, before the server exits 0', async () => {
    const c = await httpClient(mcpUrl);
    let answered!: () => void;
    const kbAnswered = new Promise<void>((r) => (answered = r));
    kbHop.holdResponse = (req) => (isNotesPost(req) ? 1_000 : 0);
    kbHop.onAnswered = () => answered();
    try {
      const call = c.callTool(writeCall('MCP drained', 'mcp-task-drain'));
      await kbAnswered;
      mcp.child.kill('SIGTERM');
      expect(structured(await call)).toMatchObject({ status: 'committed' });
      expect(await mcp.exited).toBe(0);
    } finally {
      kbHop.holdResponse = () => 0;
      kbHop.onAnswered = () => undefined;
    }
  });
});

describe('MCP over stdio', () => {
  it('MCP stdio: the configured seed and task id; list, a read and a write, repeated as one operation', async () => {
    const { client: c, stderr } = await stdio;
    try {
      const { tools } = await c.listTools();
      expect(tools.find((x) => x.name === 'kb.write_note')?.annotations).toMatchObject({ destructiveHint: false });
      const read = await c.callTool({ name: 'web.fetch_page', arguments: { url: pageUrl } });
      expect(structured(read)).toMatchObject({
        status: 'committed',
        result: { url: pageUrl, title: expect.any(String) },
      });
      const first = await c.callTool({ name: 'kb.write_note', arguments: note('MCP stdio') });
      expect(structured(first)).toMatchObject({
        status: 'committed',
        operationKey: keyOf('MCP stdio', 'mcp-stdio-task'),
      });
      const again = await c.callTool({ name: 'kb.write_note', arguments: note('MCP stdio') });
      expect(structured(again).receipt).toEqual(structured(first).receipt);
      expect(await rows('MCP stdio', 'mcp-stdio-task')).toBe(1);
      const forged = await c.callTool({ name: 'kb.write_note', arguments: { ...note('MCP stdio'), actor: 'bob' } });
      expect(structured(forged)).toMatchObject({
        error: { class: 'invalid_input', issues: [{ path: ['arguments', 'actor'] }] },
      });
      // A line over the stdio transport's limit (10 MiB) ends the session, and the process with it:
      // the transport stops reading, so it must not linger holding its NATS connection.
      const closed = new Promise<void>((r) => {
        c.onclose = () => r();
      });
      await c
        .request({ method: 'ping', params: { _meta: { filler: 'x'.repeat(11 * 1024 * 1024) } } }, EmptyResultSchema, {
          timeout: 20_000,
        })
        .catch(() => undefined);
      await closed;
      expect(stderr()).toContain('"reason":"line_too_long"');
      expect(stderr()).toContain('"msg":"stopped cleanly"');
    } finally {
      await c.close();
    }
    expect(stderr()).toContain('"msg":"started"');
  });
});
