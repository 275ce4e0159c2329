/**
 * What an MCP host sees of a deployment's contracts (docs/mcp.md): one MCP tool per contract, with
 * its JSON Schemas and annotations from its effect class, plus `tooltx_status` and
 * `tooltx_compensate`; and how an SDK outcome becomes a `tools/call` result. Pure: no connection.
 */
import { z } from 'zod';
import {
  compensationRequestSchema,
  EffectClass,
  hasSideEffect,
  nextActionFor,
  operationKeySchema,
  type Contract,
  type ErrorInfo,
  type FieldIssue,
} from '@tooltx/contracts';
import { errorInfoSchema, MAX_STATUS_WAIT_MS, type StatusAnswer } from '@tooltx/lifecycle';
import type { CompensateResult, ExecuteResult, ReceiptCheck } from '@tooltx/client';

/** The `_meta` key a host puts its task id under (its run or conversation id) on each `tools/call`. */
export const TASK_ID_META = 'tooltx/taskId';
/** The `_meta` key of a host's own budget for one call, ms (how long before the answer is `unknown`). */
export const BUDGET_META = 'tooltx/budgetMs';
export const STATUS_TOOL = 'tooltx_status';
export const COMPENSATE_TOOL = 'tooltx_compensate';

/** The argument names that claim an identity: the connection gives it, an argument never does. */
export const IDENTITY_ARGUMENTS = ['tenant', 'tenantId', 'tenant_id', 'actor', 'actorId', 'actor_id'] as const;

/** The JSON Schema of a zod schema as MCP carries it: the default dialect, so without `$schema`. */
export function jsonSchemaOf(schema: z.ZodType, io: 'input' | 'output' = 'input'): Record<string, unknown> {
  const { $schema: _dialect, ...rest } = z.toJSONSchema(schema, { unrepresentable: 'any', io }) as Record<
    string,
    unknown
  >;
  return rest;
}

/** MCP's tool annotations (the hints a host shows and plans with). */
export interface ToolAnnotations {
  title?: string;
  readOnlyHint?: boolean;
  destructiveHint?: boolean;
  idempotentHint?: boolean;
  openWorldHint?: boolean;
}

/**
 * The annotations of an effect class. A read or a computation changes nothing. Among writes, a
 * delete, a charge and a send cannot be taken back by another call (MCP's `destructiveHint`), a
 * create or an update adds or changes a resource without destroying one (MCP's default is
 * destructive, so it is said explicitly). Every tool is idempotent under tooltx: a repeat in the same
 * task with the same intent derives the same operation key, and one key runs once (docs/mcp.md).
 */
export function annotationsOf(effect: Contract['effect']): ToolAnnotations {
  if (!hasSideEffect(effect)) return { readOnlyHint: true, idempotentHint: true };
  const destructive = effect === EffectClass.Delete || effect === EffectClass.Charge || effect === EffectClass.Send;
  return { readOnlyHint: false, destructiveHint: destructive, idempotentHint: true };
}

/** `structuredContent` of a contract tool's answer: the business `result` apart from the `receipt`. */
/**
 * A receipt as the schemas show it: an object, its fields in docs/lifecycle.md. Its full schema (two
 * formats) would make every tool's entry in the list several times longer; the SDK checks it.
 */
const receiptShown = z
  .looseObject({})
  .describe('the signed receipt (docs/lifecycle.md): operationKey, resourceId, committedAt, keyId, signature, …');

const callEnvelope = z.object({
  status: z.enum(['committed', 'rejected', 'unknown', 'awaiting_confirmation']),
  operationKey: z.string().nullable().optional(),
  result: z.unknown().optional(),
  receipt: receiptShown.optional(),
  error: errorInfoSchema.optional(),
  next: z.string(),
  /** Of a held-back call: its prepare step's result and until when it waits (ms since the epoch). */
  preview: z.unknown().optional(),
  deadlineAt: z.number().optional(),
  /** Of an unknown: what the server was last seen at (`running`, `accepted`, `not_seen`). */
  lastServerState: z.string().optional(),
});

/** `structuredContent` of `tooltx_status`. */
const statusEnvelope = z.object({
  status: z.enum(['not_seen', 'accepted', 'running', 'committed', 'rejected', 'unknown']),
  operationKey: z.string(),
  contract: z.string().optional(),
  result: z.unknown().optional(),
  receipt: receiptShown.optional(),
  error: errorInfoSchema.optional(),
  next: z.string(),
  compensation: z.object({ status: z.string(), operationKey: z.string() }).optional(),
  confirmation: z.object({ status: z.string() }).optional(),
});

/** `structuredContent` of `tooltx_compensate`. */
const compensateEnvelope = z.object({
  status: z.enum(['compensated', 'compensation_failed', 'compensation_requested', 'rejected']),
  operationKey: z.string(),
  compensationKey: z.string().nullable().optional(),
  receipt: receiptShown.optional(),
  error: errorInfoSchema.optional(),
  /** True when this request found the compensation already registered by an earlier one. */
  replayed: z.boolean().optional(),
  /** A failed compensation's takeover record (docs/compensation.md): what a person has in front of them. */
  takeover: z.record(z.string(), z.unknown()).optional(),
  next: z.string(),
});

export const statusInput = z.strictObject({
  operationKey: operationKeySchema,
  /** Wait up to this long for a final answer (committed or rejected), ms. */
  waitMs: z.number().int().min(0).max(MAX_STATUS_WAIT_MS).optional(),
});

/** One entry of `tools/list`. */
export interface ListedTool {
  name: string;
  title?: string;
  description: string;
  inputSchema: Record<string, unknown>;
  outputSchema: Record<string, unknown>;
  annotations: ToolAnnotations;
}

/** The tools a contract list is served as, and which contract each name calls. */
export interface ToolCatalogue {
  tools: ListedTool[];
  contractOf: Map<string, Contract>;
}

/**
 * One MCP tool per contract: the newest version of a name under the name itself (`kb.write_note`),
 * an older one as `<name>.v<version>`; then the status and compensation tools.
 */
export function catalogue(contracts: Contract[]): ToolCatalogue {
  const newest = new Map<string, number>();
  for (const c of contracts) newest.set(c.name, Math.max(newest.get(c.name) ?? 0, c.version));
  const contractOf = new Map<string, Contract>();
  const tools: ListedTool[] = [];
  for (const c of [...contracts].sort((a, b) => a.id.localeCompare(b.id))) {
    const name = newest.get(c.name) === c.version ? c.name : `${c.name}.v${c.version}`;
    if (contractOf.has(name)) continue;
    contractOf.set(name, c);
    const envelope = jsonSchemaOf(callEnvelope, 'output');
    (envelope.properties as Record<string, unknown>).result = jsonSchemaOf(c.output, 'input');
    tools.push({
      name,
      title: `${c.name}@${c.version}`,
      description: `${c.description} (${c.effect}; tooltx ${c.id})`,
      inputSchema: jsonSchemaOf(c.input),
      outputSchema: envelope,
      annotations: annotationsOf(c.effect),
    });
  }
  tools.push(
    {
      name: STATUS_TOOL,
      description:
        'Where a tooltx operation stands, by its operationKey (as an earlier answer named it): committed with its receipt, rejected with its error, or still unknown/running. Read-only; call it again until the status is final. waitMs waits for a final answer.',
      inputSchema: jsonSchemaOf(statusInput),
      outputSchema: jsonSchemaOf(statusEnvelope, 'output'),
      annotations: { readOnlyHint: true, idempotentHint: true },
    },
    {
      name: COMPENSATE_TOOL,
      description:
        'Compensate a committed tooltx operation with the compensation its contract declares: a new operation that undoes what can be undone (never a rollback). Asking again is the same compensation; it runs once. reason: why, kept as a digest.',
      inputSchema: jsonSchemaOf(compensationRequestSchema),
      outputSchema: jsonSchemaOf(compensateEnvelope, 'output'),
      annotations: { readOnlyHint: false, destructiveHint: true, idempotentHint: true },
    },
  );
  return { tools, contractOf };
}

/** A `tools/call` result. */
export interface CallResult {
  [key: string]: unknown;
  content: { type: 'text'; text: string }[];
  structuredContent: Record<string, unknown>;
  isError?: boolean;
}

/** Field paths of the SDK's request (`input.title`) as paths of the `tools/call` params (`arguments.title`). */
export function asCallPaths(error: ErrorInfo): ErrorInfo {
  if (!error.issues) return error;
  return {
    ...error,
    issues: error.issues.map((i) => ({
      ...i,
      path: i.path[0] === 'input' ? ['arguments', ...i.path.slice(1)] : i.path,
    })),
  };
}

const describeIssues = (issues: FieldIssue[] | undefined): string =>
  (issues ?? [])
    .slice(0, 5)
    .map((i) => `${i.path.join('.') || '(call)'}: ${i.message}`)
    .join('; ');

/** A refusal before anything was sent: `invalid_input` (or another class) at the call's own paths. */
export function refusal(error: ErrorInfo, operationKey: string | null = null): CallResult {
  const next = nextActionFor[error.class];
  const why = describeIssues(error.issues);
  return {
    content: [{ type: 'text', text: `rejected (${error.class})${why ? `: ${why}` : ''}; next: ${next}` }],
    structuredContent: { status: 'rejected', operationKey, error, next },
    isError: true,
  };
}

/** A contract tool's answer from the SDK's outcome. */
export function callResult(tool: string, r: ExecuteResult): CallResult {
  switch (r.status) {
    case 'committed': {
      const resource = r.receipt.resourceId ? `, resource ${r.receipt.resourceId}` : '';
      const hasResult = r.result !== undefined && !isEmptyObject(r.result);
      return {
        content: [
          {
            type: 'text',
            text: `committed: ${tool}, operation ${r.operationKey}${resource}. The same call in the same task answers this receipt again and does nothing twice.`,
          },
          ...(hasResult ? [{ type: 'text' as const, text: JSON.stringify(r.result) }] : []),
        ],
        structuredContent: {
          status: 'committed',
          operationKey: r.operationKey,
          result: r.result,
          receipt: r.receipt,
          next: r.next,
        },
      };
    }
    case 'rejected':
      return refusal(asCallPaths(r.error), r.operationKey);
    case 'unknown':
      return {
        content: [
          {
            type: 'text',
            text: `unknown: the outcome of ${tool} (operation ${r.operationKey}) is not known yet; it may have taken effect. This is not a failure: do not call it with other arguments. Call ${STATUS_TOOL} with {"operationKey":"${r.operationKey}"} until it is committed or rejected (the same call in the same task is safe too: it cannot run twice).`,
          },
        ],
        structuredContent: {
          status: 'unknown',
          operationKey: r.operationKey,
          lastServerState: r.lastServerState,
          ...(r.error ? { error: asCallPaths(r.error) } : {}),
          next: r.next,
        },
      };
    case 'awaiting_confirmation':
      return {
        content: [
          {
            type: 'text',
            text: `held back: ${tool} (operation ${r.operationKey}) was prepared and waits for a person's confirmation${r.deadlineAt ? ` until ${new Date(r.deadlineAt).toISOString()}` : ''}; nothing external happened yet.`,
          },
        ],
        structuredContent: {
          status: 'awaiting_confirmation',
          operationKey: r.operationKey,
          ...(r.preview !== undefined ? { preview: r.preview } : {}),
          ...(r.deadlineAt !== undefined ? { deadlineAt: r.deadlineAt } : {}),
          next: r.next,
        },
      };
  }
}

/**
 * `tooltx_status`'s answer. A committed answer counts only with a receipt the SDK verified
 * (`check`): one that does not verify is reported `unknown`, never committed.
 */
export function statusResult(a: StatusAnswer, check: ReceiptCheck | undefined): CallResult {
  const trusted = a.state !== 'committed' || check?.valid === true;
  const status = trusted ? a.state : 'unknown';
  const next =
    status === 'committed'
      ? 'continue'
      : status === 'rejected' && a.error
        ? nextActionFor[a.error.class]
        : a.takeover
          ? 'hand_over'
          : 'observe';
  const structured: Record<string, unknown> = {
    status,
    operationKey: a.canonicalKey ?? a.operationKey,
    ...(a.contract ? { contract: a.contract } : {}),
    ...(trusted && a.receipt ? { receipt: a.receipt } : {}),
    ...(trusted && a.result !== undefined ? { result: a.result } : {}),
    ...(a.error ? { error: a.error } : {}),
    ...(a.compensation
      ? { compensation: { status: a.compensation.status, operationKey: a.compensation.operationKey } }
      : {}),
    ...(a.confirmation ? { confirmation: { status: a.confirmation.status } } : {}),
    next,
  };
  const tail =
    status === 'committed'
      ? a.compensation
        ? ` (its compensation: ${a.compensation.status})`
        : ''
      : status === 'rejected'
        ? ` (${a.error?.class ?? 'refused'})`
        : status === 'not_seen'
          ? ': not registered (yet), or not yours to read'
          : `: not final; call ${STATUS_TOOL} again`;
  return {
    content: [
      { type: 'text', text: `${status}: operation ${structured.operationKey as string}${tail}; next: ${next}` },
    ],
    structuredContent: structured,
    ...(status === 'rejected' ? { isError: true } : {}),
  };
}

/** `tooltx_compensate`'s answer. */
export function compensateResult(r: CompensateResult): CallResult {
  const next = r.status === 'compensated' ? 'continue' : r.next;
  const structured: Record<string, unknown> = {
    status: r.status,
    operationKey: r.operationKey,
    compensationKey: r.compensationKey,
    ...('receipt' in r ? { receipt: r.receipt } : {}),
    ...('error' in r && r.error ? { error: r.error } : {}),
    ...('replayed' in r ? { replayed: r.replayed } : {}),
    ...('takeover' in r && r.takeover ? { takeover: r.takeover } : {}),
    next,
  };
  const text =
    r.status === 'compensated'
      ? `compensated: operation ${r.operationKey} by ${r.compensationKey}; the original's receipt stays valid`
      : r.status === 'rejected'
        ? `rejected (${r.error.class}): ${describeIssues(r.error.issues) || 'nothing was sent'}; next: ${next}`
        : `${r.status}: operation ${r.operationKey}, compensation ${r.compensationKey}; next: ${next}`;
  return {
    content: [{ type: 'text', text }],
    structuredContent: structured,
    ...(r.status === 'rejected' || r.status === 'compensation_failed' ? { isError: true } : {}),
  };
}

const isEmptyObject = (v: unknown) =>
  typeof v === 'object' && v !== null && !Array.isArray(v) && Object.keys(v).length === 0;
