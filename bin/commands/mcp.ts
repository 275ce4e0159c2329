/**
 * `tooltx mcp`: serves the deployment's contracts as MCP tools (docs/mcp.md), over stdio (a desktop
 * host starts it) or Streamable HTTP (a remote host connects), as one tenant/actor: the seed in
 * NATS_NKEY_FILE, so the server's permissions pin every call it makes. Drains on SIGTERM/SIGINT:
 * stops taking requests, answers the calls in flight, closes the NATS connection.
 */
import { readFileSync } from 'node:fs';
import { isAbsolute, join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { Option, type Command } from 'commander';
import { z } from 'zod';
import { ID_PATTERN, TooltxError, type Contract } from '@tooltx/contracts';
import { createTools, ToolsOptionError, type Tools } from '@tooltx/client';
import {
  baseConfigSchema,
  createLogger,
  envInt,
  loadConfig,
  onShutdown,
  readKeyFile,
  SecretFileError,
  stdoutDestination,
  startTracing,
} from '@tooltx/runtime';
import { MCP_PATH, TASK_ID_HEADER } from '../mcp/names.js';
import type { McpDeps } from '../mcp/server.js';
import { CliRefusal, UsageError } from './cli-support.js';

const ROOT = join(import.meta.dirname, '..', '..');
/** The stdio transport's limit on one line (one JSON-RPC message), bytes: the MCP SDK's default. */
const STDIO_MAX_LINE_BYTES = 10 * 1024 * 1024;

const mcpConfig = baseConfigSchema.extend({
  TOOLTX_MCP_TRANSPORT: z.enum(['stdio', 'http']).default('stdio'),
  TOOLTX_TENANT: z
    .string({ error: 'required: the tenant this server acts in (the seed’s tenant)' })
    .regex(ID_PATTERN, 'a tenant id (^[a-z0-9_-]{1,64}$)'),
  TOOLTX_ACTOR: z
    .string({ error: 'required: the actor this server acts as (the seed’s actor)' })
    .regex(ID_PATTERN, 'an actor id (^[a-z0-9_-]{1,64}$)'),
  TOOLTX_CONTRACTS_MODULE: z.string({
    error: 'required: the module exporting the deployment’s `contracts` (the half shared with agents)',
  }),
  TOOLTX_AUTH_DIR: z.string().min(1).optional(),
  TOOLTX_RECEIPT_KEYS_FILE: z.string().min(1).optional(),
  TOOLTX_MCP_TASK_ID: z.string().min(1).max(256).optional(),
  TOOLTX_MCP_BUDGET_MS: envInt(100, 300_000).default(30_000),
  TOOLTX_MCP_HOST: z.string().min(1).default('127.0.0.1'),
  TOOLTX_MCP_PORT: envInt(0, 65_535).default(4290),
  TOOLTX_MCP_TOKEN_FILE: z.string().min(1).optional(),
  TOOLTX_MCP_MAX_BODY_BYTES: envInt(1_024, 64 * 1024 * 1024).default(1024 * 1024),
});
type McpConfig = z.infer<typeof mcpConfig>;

/** The flags and the variable each one sets (a flag wins over the environment). */
const FLAGS = {
  transport: 'TOOLTX_MCP_TRANSPORT',
  tenant: 'TOOLTX_TENANT',
  actor: 'TOOLTX_ACTOR',
  contracts: 'TOOLTX_CONTRACTS_MODULE',
  taskId: 'TOOLTX_MCP_TASK_ID',
  budgetMs: 'TOOLTX_MCP_BUDGET_MS',
  host: 'TOOLTX_MCP_HOST',
  port: 'TOOLTX_MCP_PORT',
  tokenFile: 'TOOLTX_MCP_TOKEN_FILE',
  authDir: 'TOOLTX_AUTH_DIR',
} as const;

const HELP = `
Environment (a flag wins over its variable):
  NATS_URL                  server URL(s) (default nats://127.0.0.1:4222)
  NATS_NKEY_FILE            the actor's seed (<out>/nkeys/agent.<tenant>.<actor>.nk); NATS_CREDS_FILE instead
  TOOLTX_AUTH_DIR           the directory \`tooltx auth generate\` wrote (<out>): the defaults of NATS_NKEY_FILE
                            (its nkeys/agent.<tenant>.<actor>.nk) and TOOLTX_RECEIPT_KEYS_FILE (its receipt-keys.json)
  TOOLTX_PREFIX             subject prefix of the deployment (default tooltx)
  TOOLTX_TENANT, TOOLTX_ACTOR  who this server acts as: the seed's tenant and actor
  TOOLTX_CONTRACTS_MODULE   the module exporting \`contracts\` (e.g. examples/research-kb/agent-contracts.ts)
  TOOLTX_RECEIPT_KEYS_FILE  the receipt keys to trust (<out>/receipt-keys.json; required without TOOLTX_AUTH_DIR)
  TOOLTX_MCP_TRANSPORT      stdio (default) or http
  TOOLTX_MCP_TASK_ID        stdio: the task id of calls whose _meta carries none
  TOOLTX_MCP_BUDGET_MS      how long a call waits before answering unknown (default 30000)
  TOOLTX_MCP_HOST, TOOLTX_MCP_PORT  http: where to listen (default 127.0.0.1:4290; port 0 = any)
  TOOLTX_MCP_TOKEN_FILE     http: a file holding the bearer token (mode 0600, >= 32 characters)
  TOOLTX_MCP_TOKEN          http: the bearer token itself (>= 32 characters), instead of the file
  TOOLTX_MCP_MAX_BODY_BYTES http: the largest request body (default 1048576)
  LOG_LEVEL, TOOLTX_LOG_HMAC_KEY_FILE  logs (JSON lines: stderr with stdio, stdout with http)
Over HTTP, a host sends "Authorization: Bearer <token>" and its task id in _meta["tooltx/taskId"] of
each tools/call (or the ${TASK_ID_HEADER} header); the endpoint is POST ${MCP_PATH}. docs/mcp.md.`;

/** The deployment's contracts from the module: its `contracts` export, a non-empty list of defined contracts. */
async function loadContracts(path: string): Promise<Contract[]> {
  const abs = isAbsolute(path) ? path : resolve(process.cwd(), path);
  let mod: { contracts?: unknown };
  try {
    mod = (await import(pathToFileURL(abs).href)) as { contracts?: unknown };
  } catch (err) {
    throw new UsageError(
      `TOOLTX_CONTRACTS_MODULE=${path}: cannot load it (${(err as NodeJS.ErrnoException).code ?? (err as Error).name})`,
    );
  }
  const list = mod.contracts;
  const isContract = (c: unknown) =>
    typeof c === 'object' && c !== null && typeof (c as Contract).id === 'string' && 'interfaceDigest' in c;
  if (!Array.isArray(list) || list.length === 0 || !list.every(isContract))
    throw new UsageError(
      `TOOLTX_CONTRACTS_MODULE=${path}: must export \`contracts\`, a non-empty array of contracts (defineContract)`,
    );
  return list as Contract[];
}

/** The setting each option of createTools comes from, to name it in a refusal. */
const SETTING_OF: Record<string, string> = {
  servers: 'NATS_URL',
  nkeyFile: 'NATS_NKEY_FILE (or TOOLTX_AUTH_DIR)',
  credsFile: 'NATS_CREDS_FILE',
  receiptKeys: 'TOOLTX_RECEIPT_KEYS_FILE (or TOOLTX_AUTH_DIR)',
  tenant: 'TOOLTX_TENANT',
  actor: 'TOOLTX_ACTOR',
  prefix: 'TOOLTX_PREFIX',
  contracts: 'TOOLTX_CONTRACTS_MODULE',
};

/** The bearer token of the HTTP transport: the file's (checked like every key file) or the variable's. */
function bearerToken(config: McpConfig): Buffer {
  if (config.TOOLTX_MCP_TOKEN_FILE) {
    try {
      return readKeyFile(config.TOOLTX_MCP_TOKEN_FILE);
    } catch (err) {
      if (err instanceof SecretFileError) throw new UsageError(`TOOLTX_MCP_TOKEN_FILE: ${err.message}`);
      throw err;
    }
  }
  // Read outside the zod schema: a configuration error quotes the value of the variable it names.
  const token = process.env.TOOLTX_MCP_TOKEN?.trim();
  if (!token)
    throw new UsageError('http needs a bearer token: set TOOLTX_MCP_TOKEN_FILE (or TOOLTX_MCP_TOKEN), never a flag');
  if (token.length < 32 || /\s/.test(token))
    throw new UsageError('TOOLTX_MCP_TOKEN: at least 32 characters without blanks');
  return Buffer.from(token, 'utf8');
}

async function connect(config: McpConfig, contracts: Contract[]): Promise<Tools> {
  const auth = config.TOOLTX_AUTH_DIR;
  const nkeyFile =
    config.NATS_NKEY_FILE ??
    (auth && !config.NATS_CREDS_FILE
      ? join(auth, 'nkeys', `agent.${config.TOOLTX_TENANT}.${config.TOOLTX_ACTOR}.nk`)
      : undefined);
  const receiptKeys = config.TOOLTX_RECEIPT_KEYS_FILE ?? (auth ? join(auth, 'receipt-keys.json') : undefined);
  if (!receiptKeys)
    throw new UsageError('TOOLTX_RECEIPT_KEYS_FILE: required (or TOOLTX_AUTH_DIR): the receipt keys agents trust');
  try {
    return await createTools({
      servers: config.NATS_URL,
      tenant: config.TOOLTX_TENANT,
      actor: config.TOOLTX_ACTOR,
      contracts,
      prefix: config.TOOLTX_PREFIX,
      receiptKeys,
      budgetMs: config.TOOLTX_MCP_BUDGET_MS,
      ...(nkeyFile ? { nkeyFile } : {}),
      ...(config.NATS_CREDS_FILE ? { credsFile: config.NATS_CREDS_FILE } : {}),
    });
  } catch (err) {
    if (err instanceof ToolsOptionError)
      throw new UsageError(
        err.issues.map((i) => `${SETTING_OF[String(i.path[0])] ?? String(i.path[0])}: ${i.message}`).join('; '),
      );
    if (err instanceof TooltxError)
      throw new CliRefusal(`cannot act as ${config.TOOLTX_TENANT}/${config.TOOLTX_ACTOR}: ${err.message}`);
    throw err;
  }
}

async function mcp(flags: Partial<Record<keyof typeof FLAGS, string>>): Promise<void> {
  const env: NodeJS.ProcessEnv = { ...process.env };
  for (const [flag, variable] of Object.entries(FLAGS)) {
    const v = flags[flag as keyof typeof FLAGS];
    if (v !== undefined) env[variable] = v;
  }
  const config = loadConfig(mcpConfig, env);
  // The MCP SDK and the server's code load only when this command runs: every other command, and
  // `tooltx --help`, start without them (a third of a second per CLI process).
  const [{ StdioServerTransport }, { startHttp }, { callsSettled, createMcpServer }, { catalogue }] = await Promise.all(
    [
      import('@modelcontextprotocol/sdk/server/stdio.js'),
      import('../mcp/http.js'),
      import('../mcp/server.js'),
      import('../mcp/tools.js'),
    ],
  );
  const stdio = config.TOOLTX_MCP_TRANSPORT === 'stdio';
  const token = stdio ? undefined : bearerToken(config);
  const contracts = await loadContracts(config.TOOLTX_CONTRACTS_MODULE);
  // With stdio, stdout is the protocol's: the logs go to stderr.
  const log = createLogger({
    service: 'mcp',
    instance: config.TOOLTX_INSTANCE_ID,
    level: config.LOG_LEVEL,
    hmacKeyFile: config.TOOLTX_LOG_HMAC_KEY_FILE,
    destination: stdoutDestination(stdio ? 2 : 1),
  });
  // Spans go out only when the OpenTelemetry variables ask for it (docs/tracing.md); a host's
  // `_meta.traceparent` makes each call a child of the host's span.
  const tracing = await startTracing({ serviceName: 'tooltx-mcp', instanceId: config.TOOLTX_INSTANCE_ID });
  const tools = await connect(config, contracts);
  const version = (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { version: string }).version;
  const deps: McpDeps = { tools, catalogue: catalogue(contracts), log, budgetMs: config.TOOLTX_MCP_BUDGET_MS, version };
  const who = { tenant: config.TOOLTX_TENANT, actor: config.TOOLTX_ACTOR, tools: deps.catalogue.tools.length };

  if (token) {
    const http = await startHttp(deps, {
      host: config.TOOLTX_MCP_HOST,
      port: config.TOOLTX_MCP_PORT,
      token,
      maxBodyBytes: config.TOOLTX_MCP_MAX_BODY_BYTES,
    });
    onShutdown(log, async () => {
      const closed = http.close();
      await callsSettled();
      // A keep-alive connection that answered its last call since is idle now: it would hold the close.
      setImmediate(() => http.server.closeIdleConnections());
      await closed;
      await tools.close();
      await tracing.shutdown();
    });
    const port = (http.server.address() as { port: number }).port;
    log.info({ ...who, url: http.url, port }, 'listening');
    return;
  }
  const server = createMcpServer(deps, { taskId: config.TOOLTX_MCP_TASK_ID, taskIdSource: 'TOOLTX_MCP_TASK_ID' });
  const transport = new StdioServerTransport();
  // A line that is not JSON-RPC is answered, not only dropped: the host sees why.
  transport.onerror = (err) => {
    // A line longer than the transport's buffer (10 MiB) closes the transport: said plainly here,
    // as the error's own message is kept out of the logs like any error message.
    if (err instanceof Error && /^ReadBuffer exceeded maximum size/.test(err.message)) {
      log.warn(
        { reason: 'line_too_long', maxBytes: STDIO_MAX_LINE_BYTES },
        'a line over the stdio limit: session ends',
      );
      return;
    }
    const parse = err instanceof SyntaxError;
    log.warn({ err }, parse ? 'not JSON' : 'not a JSON-RPC message');
    void transport
      .send({
        jsonrpc: '2.0',
        id: null,
        error: { code: parse ? -32700 : -32600, message: parse ? 'parse error: not JSON' : 'invalid request' },
      } as never)
      .catch(() => undefined);
  };
  let ending = false;
  const endSession = () => {
    if (!ending) process.kill(process.pid, 'SIGTERM');
  };
  const stop = async () => {
    ending = true;
    await callsSettled();
    await server.close();
    await tools.close();
    await tracing.shutdown();
  };
  onShutdown(log, stop);
  // The host closing stdin ends the session: drain as on SIGTERM. So does the transport closing on
  // its own (a line over its limit: it stops reading, and stdin never ends), or the process would
  // keep its NATS connection with no one left to answer.
  process.stdin.once('end', endSession);
  transport.onclose = endSession;
  await server.connect(transport);
  log.info(who, 'started');
}

/** Registers `mcp` on the CLI. */
export function registerMcp(program: Command): void {
  program
    .command('mcp')
    .description(
      "serve the deployment's contracts as MCP tools, as one tenant/actor (NATS_NKEY_FILE), over stdio or Streamable HTTP",
    )
    .addOption(new Option('--transport <kind>', 'stdio or http (env TOOLTX_MCP_TRANSPORT)').choices(['stdio', 'http']))
    .option('--tenant <id>', 'the tenant this server acts in (env TOOLTX_TENANT)')
    .option('--actor <id>', 'the actor this server acts as (env TOOLTX_ACTOR)')
    .option('--contracts <module>', 'the module exporting `contracts` (env TOOLTX_CONTRACTS_MODULE)')
    .option('--task-id <id>', 'stdio: the task id of calls whose _meta carries none (env TOOLTX_MCP_TASK_ID)')
    .option('--budget-ms <ms>', 'how long a call waits before answering unknown (env TOOLTX_MCP_BUDGET_MS)')
    .option('--host <host>', 'http: the address to listen on (env TOOLTX_MCP_HOST)')
    .option('--port <port>', 'http: the port, 0 = any free one (env TOOLTX_MCP_PORT)')
    .option('--token-file <file>', 'http: the bearer token file (env TOOLTX_MCP_TOKEN_FILE)')
    .option('--auth-dir <dir>', 'the directory `tooltx auth generate` wrote (env TOOLTX_AUTH_DIR)')
    .addHelpText('after', HELP)
    .action((o: Partial<Record<keyof typeof FLAGS, string>>) => mcp(o));
}
