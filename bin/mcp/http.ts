/**
 * `tooltx mcp --transport http`: MCP's Streamable HTTP transport on `POST /mcp`, stateless (no MCP
 * session: one restarts with the server, and nothing here depends on one) and answered as one JSON
 * body. In front of the SDK's transport, in this order: the bearer token (401, and nothing of it is
 * logged), the body's size (413) and its JSON (a JSON-RPC parse error); then one MCP server per
 * request, whose connection task id is the `tooltx-task-id` header.
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import { createServer, type IncomingMessage, type Server as HttpServer, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { createMcpServer, type McpDeps } from './server.js';

/** The header a remote host sends its task id in, for every call of the request that carries it. */
import { MCP_PATH, TASK_ID_HEADER } from './names.js';

export { MCP_PATH, TASK_ID_HEADER };

export interface HttpOptions {
  host: string;
  port: number;
  /** The bearer token a host must send; it maps to this process's one tenant and actor. */
  token: Buffer;
  maxBodyBytes: number;
}

const digest = (b: Buffer) => createHash('sha256').update(b).digest();

/** Starts the HTTP front; resolves once it listens, with its address and a `close` that stops accepting. */
export async function startHttp(
  deps: McpDeps,
  o: HttpOptions,
): Promise<{ server: HttpServer; url: string; close(): Promise<void> }> {
  const expected = digest(o.token);
  const authorised = (req: IncomingMessage) => {
    const m = /^Bearer ([^\s]+)$/i.exec(req.headers.authorization ?? '');
    // Compared as digests: equal lengths for timingSafeEqual, and no early exit on a prefix.
    return m !== null && timingSafeEqual(digest(Buffer.from(m[1]!, 'utf8')), expected);
  };
  const server = createServer((req, res) => {
    handle(deps, o, authorised, req, res).catch((err: unknown) => {
      deps.log.error({ err }, 'mcp request failed');
      if (!res.headersSent) jsonRpcError(res, 500, -32603, 'internal error');
      else res.destroy();
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(o.port, o.host, () => resolve());
  });
  const addr = server.address() as AddressInfo;
  return {
    server,
    url: `http://${addr.address}:${addr.port}${MCP_PATH}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeIdleConnections();
      }),
  };
}

async function handle(
  deps: McpDeps,
  o: HttpOptions,
  authorised: (req: IncomingMessage) => boolean,
  req: IncomingMessage,
  res: ServerResponse,
): Promise<void> {
  // The token first: nothing else about the request is looked at, answered or logged without it.
  if (!authorised(req)) {
    res.writeHead(401, { 'www-authenticate': 'Bearer realm="tooltx"', 'content-type': 'application/json' });
    res.end(JSON.stringify({ error: 'unauthorized' }));
    req.resume();
    return;
  }
  const path = new URL(req.url ?? '/', 'http://localhost').pathname;
  if (path !== MCP_PATH) {
    res.writeHead(404, { 'content-type': 'application/json' }).end(JSON.stringify({ error: `not found: ${MCP_PATH}` }));
    req.resume();
    return;
  }
  if (req.method !== 'POST') {
    // Stateless: no server-initiated stream (GET) and no session to end (DELETE).
    res.writeHead(405, { allow: 'POST', 'content-type': 'application/json' });
    res.end(
      JSON.stringify({ jsonrpc: '2.0', error: { code: -32000, message: 'method not allowed: POST only' }, id: null }),
    );
    req.resume();
    return;
  }
  const body = await readBody(req, o.maxBodyBytes);
  if (body === 'too_large')
    return jsonRpcError(res, 413, -32600, `request too large: at most ${o.maxBodyBytes} bytes`, {
      class: 'invalid_input',
      issues: [{ path: [], code: 'too_large', message: `at most ${o.maxBodyBytes} bytes` }],
    });
  let parsed: unknown;
  try {
    parsed = JSON.parse(body.toString('utf8'));
  } catch {
    return jsonRpcError(res, 400, -32700, 'parse error: the body is not JSON');
  }
  const header = req.headers[TASK_ID_HEADER];
  const mcp = createMcpServer(deps, {
    taskId: typeof header === 'string' ? header : undefined,
    taskIdSource: `headers.${TASK_ID_HEADER}`,
  });
  const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true });
  res.on('close', () => {
    void transport.close();
    void mcp.close();
  });
  await mcp.connect(transport);
  await transport.handleRequest(req, res, parsed);
}

/**
 * The body, or `too_large` as soon as it passes `max` bytes; the rest is read and dropped, so that
 * the answer reaches a client still sending.
 */
function readBody(req: IncomingMessage, max: number): Promise<Buffer | 'too_large'> {
  return new Promise((resolve, reject) => {
    const declared = Number(req.headers['content-length']);
    if (Number.isFinite(declared) && declared > max) {
      req.resume();
      resolve('too_large');
      return;
    }
    const chunks: Buffer[] = [];
    let size = 0;
    req.on('data', (chunk: Buffer) => {
      if (size > max) return;
      size += chunk.length;
      if (size <= max) chunks.push(chunk);
      else {
        chunks.length = 0;
        resolve('too_large');
      }
    });
    req.on('end', () => resolve(Buffer.concat(chunks)));
    req.on('error', reject);
  });
}

function jsonRpcError(res: ServerResponse, status: number, code: number, message: string, data?: unknown): void {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify({ jsonrpc: '2.0', error: { code, message, ...(data ? { data } : {}) }, id: null }));
}
