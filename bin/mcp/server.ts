/**
 * The MCP protocol side of `tooltx mcp` (docs/mcp.md): an MCP `Server` (the official SDK's) whose
 * tools are the deployment's contracts, each call made through the tooltx SDK as the one actor this
 * process authenticates as. The identity is the connection's; the task id is the host's
 * (`_meta["tooltx/taskId"]`, else the connection's); the operation key follows from the task and the
 * call, so a host's retry of the same call is the same operation.
 */
import { randomUUID } from 'node:crypto';
import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { ErrorCode, ListToolsRequestSchema } from '@modelcontextprotocol/sdk/types.js';
import { z } from 'zod';
import { ErrorClass, fieldIssues, hasSideEffect, TooltxError, type FieldIssue } from '@tooltx/contracts';
import type { Tools } from '@tooltx/client';
import type { Logger } from '@tooltx/runtime';
import { contextOfFields, inContext } from '@tooltx/nats';
import {
  BUDGET_META,
  callResult,
  compensateResult,
  COMPENSATE_TOOL,
  IDENTITY_ARGUMENTS,
  refusal,
  statusInput,
  statusResult,
  STATUS_TOOL,
  TASK_ID_META,
  type CallResult,
  type ToolCatalogue,
} from './tools.js';

/** What every MCP connection of this process shares. */
export interface McpDeps {
  tools: Tools;
  catalogue: ToolCatalogue;
  log: Logger;
  /** Default per-call budget, ms (a host may ask for another with `_meta["tooltx/budgetMs"]`). */
  budgetMs: number;
  version: string;
}

/** What one connection adds: the task id it carries (the stdio configuration's, an HTTP header's). */
export interface McpConnection {
  taskId?: string | undefined;
  /** Where that task id came from, for a refusal's path (`headers.tooltx-task-id`, `--task-id`). */
  taskIdSource?: string;
}

/**
 * A host's task id: 1 to 256 characters of well-formed Unicode with at least one that is not
 * blank, and no control characters (a blank or broken id is a host bug, never a task).
 */
const taskIdSchema = z
  .string()
  .min(1)
  .max(256)
  .refine((s) => !/[\uD800-\uDFFF]/u.test(s), 'not well-formed Unicode (a lone surrogate)')
  .refine((s) => s.trim().length > 0, 'blank')
  // biome-ignore lint/suspicious/noControlCharactersInRegex: refusing control characters is the point
  .refine((s) => !/[\u0000-\u001f\u007f]/.test(s), 'a control character');
const metaSchema = z.looseObject({
  [TASK_ID_META]: taskIdSchema.optional(),
  [BUDGET_META]: z.number().int().min(100).max(300_000).optional(),
  // W3C Trace Context of the host's own span (docs/tracing.md): the call joins the host's trace.
  traceparent: z.string().max(256).optional(),
  tracestate: z.string().max(512).optional(),
});

/**
 * A JSON-RPC error answer (the SDK sends a thrown error's `code`, `message` and `data`); unlike the
 * SDK's `McpError`, its message is sent as it is, without a prefix the client adds again.
 */
class ProtocolError extends Error {
  readonly code: number;
  readonly data: unknown;
  constructor(code: number, message: string, data: unknown) {
    super(message);
    this.code = code;
    this.data = data;
  }
}

/** Calls in flight in this process, so that a drain waits for their answers. */
const inFlight = new Set<Promise<unknown>>();

/** Resolves once every call in flight has answered. */
export async function callsSettled(): Promise<void> {
  while (inFlight.size) await Promise.allSettled([...inFlight]);
}

/** An MCP server for one connection. */
export function createMcpServer(deps: McpDeps, conn: McpConnection): Server {
  const server = new Server(
    { name: 'tooltx', version: deps.version },
    {
      capabilities: { tools: { listChanged: false } },
      instructions: `Every tool call here is a tooltx operation: a repeat of the same call in the same task is the same operation and never runs twice. An answer "unknown" is not a failure: call ${STATUS_TOOL} with its operationKey until it is final.`,
    },
  );
  server.setRequestHandler(ListToolsRequestSchema, () => ({ tools: deps.catalogue.tools }));
  server.setRequestHandler(callToolRequest, (request) => {
    const started = Date.now();
    const p = call(deps, conn, request.params).then((r) => {
      const s = r.structuredContent;
      deps.log.info(
        {
          tool: request.params.name.slice(0, 100),
          status: s.status,
          operationKey: s.operationKey,
          errorClass: (s.error as { class?: string } | undefined)?.class,
          ms: Date.now() - started,
        },
        'tool call',
      );
      return r;
    });
    inFlight.add(p);
    void p.finally(() => inFlight.delete(p)).catch(() => undefined);
    return p;
  });
  return server;
}

/**
 * `tools/call` as registered here: only its envelope. The SDK's server checks the full request
 * schema itself and answers a malformed one (`arguments` not an object, say) with a JSON-RPC
 * invalid-params error; registered under the full schema, the same request was first refused by
 * the handler's own parse as an internal error (-32603) carrying a schema dump.
 */
const callToolRequest = z.object({
  method: z.literal('tools/call'),
  params: z.looseObject({
    name: z.string(),
    arguments: z.unknown().optional(),
    _meta: z.unknown().optional(),
  }),
});
type CallParams = z.infer<typeof callToolRequest>['params'];

async function call(deps: McpDeps, conn: McpConnection, params: CallParams): Promise<CallResult> {
  const meta = metaSchema.safeParse(params._meta ?? {});
  if (!meta.success) return refusal({ class: ErrorClass.InvalidInput, issues: fieldIssues(meta.error, ['_meta']) });
  const budgetMs = meta.data[BUDGET_META] ?? deps.budgetMs;
  // An object by now: the SDK's server checked the request's full schema before this handler.
  const args = (params.arguments ?? {}) as Record<string, unknown>;
  if (params.name === STATUS_TOOL) return status(deps, args);
  if (params.name === COMPENSATE_TOOL) return compensate(deps, args, budgetMs);
  const contract = deps.catalogue.contractOf.get(params.name);
  if (!contract)
    throw new ProtocolError(
      ErrorCode.InvalidParams,
      `unknown tool ${JSON.stringify(params.name.slice(0, 100))}: tools/list names the tools`,
      {
        class: ErrorClass.InvalidInput,
        issues: [{ path: ['name'], code: 'unknown_tool', message: 'not a tool of this server' }],
      },
    );
  // The identity is the connection's: an argument that claims one is refused, never used or ignored.
  const declared = contract.input.shape as Record<string, unknown>;
  const claimed: FieldIssue[] = IDENTITY_ARGUMENTS.filter((k) => k in args && !(k in declared)).map((k) => ({
    path: ['arguments', k],
    code: 'identity_from_connection',
    message: 'the tenant and actor come from the connection (its token or seed), never from arguments',
  }));
  if (claimed.length) return refusal({ class: ErrorClass.InvalidInput, issues: claimed });
  let taskId = meta.data[TASK_ID_META] ?? conn.taskId;
  if (taskId === undefined) {
    if (hasSideEffect(contract.effect))
      return refusal({
        class: ErrorClass.InvalidInput,
        issues: [
          {
            path: ['_meta', TASK_ID_META],
            code: 'task_id_required',
            message: `a ${contract.effect} needs the host's task id (its run or conversation id, the same on every retry) in params._meta["${TASK_ID_META}"] or the connection's task id; it makes a retried call the same operation`,
          },
        ],
      });
    // A read changes nothing: without a task, each call is its own.
    taskId = `mcp-read-${randomUUID()}`;
  } else if (!taskIdSchema.safeParse(taskId).success) {
    return refusal({
      class: ErrorClass.InvalidInput,
      issues: [
        {
          path: (conn.taskIdSource ?? 'taskId').split('.'),
          code: 'invalid_task_id',
          message: '1 to 256 characters of well-formed Unicode, not blank, no control characters',
        },
      ],
    });
  }
  const traced = contextOfFields({ traceparent: meta.data.traceparent, tracestate: meta.data.tracestate });
  const r = await inContext(traced, () =>
    deps.tools.execute({ tool: contract.name, version: contract.version, taskId, input: args }, { budgetMs }),
  );
  return callResult(params.name, r);
}

async function status(deps: McpDeps, args: Record<string, unknown>): Promise<CallResult> {
  const parsed = statusInput.safeParse(args);
  if (!parsed.success)
    return refusal({ class: ErrorClass.InvalidInput, issues: fieldIssues(parsed.error, ['arguments']) });
  const { operationKey, waitMs } = parsed.data;
  try {
    const a = await deps.tools.status({ operationKey, ...(waitMs ? { waitMs, untilFinal: true } : {}) });
    const check =
      a.state === 'committed' && a.receipt
        ? deps.tools.verify({ operationKey: a.canonicalKey ?? a.operationKey, receipt: a.receipt, result: a.result })
        : undefined;
    return statusResult(a, check);
  } catch (err) {
    const info = err instanceof TooltxError ? err.toInfo() : { class: ErrorClass.DependencyUnavailable };
    return refusal(info, operationKey);
  }
}

async function compensate(deps: McpDeps, args: Record<string, unknown>, budgetMs: number): Promise<CallResult> {
  const r = await deps.tools.compensate(args as { operationKey: string; reason: string }, { budgetMs });
  if (r.status === 'rejected' && r.error.issues)
    return compensateResult({
      ...r,
      error: { ...r.error, issues: r.error.issues.map((i) => ({ ...i, path: ['arguments', ...i.path] })) },
    });
  return compensateResult(r);
}
