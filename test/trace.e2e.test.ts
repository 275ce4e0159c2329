/**
 * One trace per call (docs/tracing.md): a loopback OTLP/HTTP receiver, every process pointed at it
 * with the standard `OTEL_EXPORTER_OTLP_ENDPOINT`. One `kb.write_note` through the SDK: its
 * `execute_tool` span, the authorizer's span and the executor's span share one trace id, each the
 * child of the one before (across the intent's headers and the event log); the KB received that
 * trace id in `traceparent`; no span holds a canary. Real nats-server, the co-located process
 * (`tooltx serve`), the real KB.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Tools } from '@tooltx/client';
import { startTracing, type Tracing } from '@tooltx/runtime';
import { provisioned, type TestNats } from './helpers/nats.js';
import { startHost, type ServiceProcess } from './helpers/services.js';
import { RESEARCH_TOOLS, startKb, type TestKb } from './helpers/kb.js';
import { newCanaries } from '../examples/research-kb/canaries.js';
import { researchContracts } from '../examples/research-kb/contracts.js';

interface OtlpSpan {
  traceId: string;
  spanId: string;
  parentSpanId?: string;
  name: string;
  kind: number;
  attributes?: { key: string; value: Record<string, unknown> }[];
}

/** A loopback OTLP/HTTP (JSON) trace receiver: every request body as received, and the spans in them. */
class OtlpReceiver {
  readonly bodies: string[] = [];
  readonly spans: (OtlpSpan & { service: string })[] = [];
  #server: Server | undefined;
  url = '';

  async start(): Promise<this> {
    this.#server = createServer((req, res) => {
      let body = '';
      req.setEncoding('utf8');
      req.on('data', (c: string) => (body += c));
      req.on('end', () => {
        this.bodies.push(body);
        try {
          const j = JSON.parse(body) as {
            resourceSpans?: {
              resource?: { attributes?: { key: string; value: { stringValue?: string } }[] };
              scopeSpans?: { spans?: OtlpSpan[] }[];
            }[];
          };
          for (const rs of j.resourceSpans ?? []) {
            const service =
              rs.resource?.attributes?.find((a) => a.key === 'service.name')?.value.stringValue ?? '(none)';
            for (const ss of rs.scopeSpans ?? []) for (const s of ss.spans ?? []) this.spans.push({ ...s, service });
          }
        } catch {
          // Not JSON (another encoding): kept in `bodies` for the canary scan.
        }
        res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
      });
    });
    await new Promise<void>((r) => this.#server!.listen(0, '127.0.0.1', r));
    this.url = `http://127.0.0.1:${(this.#server.address() as AddressInfo).port}`;
    return this;
  }

  async stop(): Promise<void> {
    await new Promise((r) => this.#server?.close(r));
  }
}

const attr = (s: OtlpSpan, key: string): unknown => {
  const v = s.attributes?.find((a) => a.key === key)?.value;
  return v ? Object.values(v)[0] : undefined;
};

const contracts = researchContracts({ kbDedup: false });
const canaries = newCanaries();
let t: TestNats;
let kb: TestKb;
let otlp: OtlpReceiver;
let host: ServiceProcess;
let tools: Tools;
let tracing: Tracing;
const saved: Record<string, string | undefined> = {};

beforeAll(async () => {
  otlp = await new OtlpReceiver().start();
  const otel = { OTEL_EXPORTER_OTLP_ENDPOINT: otlp.url, OTEL_BSP_SCHEDULE_DELAY: '100' };
  t = await provisioned();
  kb = await startKb(
    {
      tenants: [{ id: 'acme', quota: 10_000 }],
      knowledgeBases: [{ tenant: 'acme', name: 'research', defaultRole: 'writer' }],
    },
    otel,
  );
  host = await startHost({ ...t.env, ...otel, TOOLTX_TOOLS_MODULE: RESEARCH_TOOLS, KB_URL: kb.url, KB_DEDUP: 'off' });
  // The agent's process traces too: its SDK's span is the root of the call's trace.
  for (const [k, v] of Object.entries(otel)) {
    saved[k] = process.env[k];
    process.env[k] = v;
  }
  tracing = await startTracing({ serviceName: 'agent' });
  tools = await t.agentTools('acme', 'alice', contracts.all, {
    budgetMs: 30_000,
  });
}, 120_000);

afterAll(async () => {
  await tools?.close();
  await tracing?.shutdown();
  for (const [k, v] of Object.entries(saved)) {
    if (v === undefined) delete process.env[k];
    else process.env[k] = v;
  }
  // Tracing on, the process still drains and exits 0 on SIGTERM (its spans flushed on the way out).
  const code = await host?.stop();
  await kb?.stop();
  await t?.close();
  await otlp?.stop();
  expect(code).toBe(0);
});

describe('trace: one trace per call across the SDK, the authorizer, the executor and the downstream', () => {
  it('trace: the spans of one write share one trace id, each the child of the hop before it, and the KB got it in traceparent; no span holds a canary', async () => {
    const r = await tools.execute({
      tool: 'kb.write_note',
      taskId: 'trace-1',
      input: {
        kb: 'research',
        title: `traced ${canaries.noteBody}`,
        body: `body ${canaries.noteBody} ${canaries.token}`,
        sourceUrl: 'https://example.org/src',
        fetchedAt: '2026-11-30T06:00:00Z',
      },
    });
    expect(r.status).toBe('committed');
    const key = r.operationKey;

    // The agent's spans leave at its own shutdown; the services' within their batch delay.
    await tracing.shutdown();
    const byName = (name: string) =>
      otlp.spans.filter((s) => s.name === name && attr(s, 'tooltx.operation.key') === key);
    const deadline = Date.now() + 20_000;
    while (
      (byName('tooltx.authorize kb.write_note').length === 0 || byName('tooltx.run kb.write_note').length === 0) &&
      Date.now() < deadline
    )
      await new Promise((res) => setTimeout(res, 100));

    const [agent] = byName('execute_tool kb.write_note');
    const [authorize] = byName('tooltx.authorize kb.write_note');
    const [run] = byName('tooltx.run kb.write_note');
    expect(agent, 'the SDK span').toBeDefined();
    expect(authorize, 'the authorizer span').toBeDefined();
    expect(run, 'the executor span').toBeDefined();
    // One trace, each hop the child of the one before: SDK → intent headers → authorizer → event log → executor.
    expect(new Set([agent!.traceId, authorize!.traceId, run!.traceId]).size).toBe(1);
    expect(authorize!.parentSpanId).toBe(agent!.spanId);
    expect(run!.parentSpanId).toBe(authorize!.spanId);
    expect(agent!.service).toBe('agent');
    expect(authorize!.service).toBe('tooltx-serve');
    // GenAI semantic conventions, plus tooltx's own attributes.
    for (const s of [agent!, authorize!, run!]) {
      expect(attr(s, 'gen_ai.operation.name')).toBe('execute_tool');
      expect(attr(s, 'gen_ai.tool.name')).toBe('kb.write_note');
      expect(attr(s, 'tooltx.effect')).toBe('create');
      expect(Number(attr(s, 'tooltx.contract.version'))).toBe(1);
    }
    expect(attr(agent!, 'tooltx.state')).toBe('committed');
    expect(attr(run!, 'tooltx.state')).toBe('committed');

    // The downstream got the same trace in its `traceparent` header.
    const kbLine = await kb.proc.waitForLog('request');
    const traced = kb.proc.lines.filter((l) => l.msg === 'request' && l.route === 'POST /v1/notes');
    expect(kbLine).toBeDefined();
    expect(traced.map((l) => l.traceId)).toContain(agent!.traceId);

    // Spans name the tool and the operation, never an input or a result.
    const everything = otlp.bodies.join('\n');
    expect(everything.length).toBeGreaterThan(0);
    for (const c of Object.values(canaries)) expect(everything).not.toContain(c);
  }, 60_000);
});
