import { z } from 'zod';
import {
  compensationSchema,
  ContractSpecError,
  confirmSchema,
  defineContract,
  effectClasses,
  specIssues,
  type Contract,
  type ContractSpec,
  type ContractTiming,
  type DownstreamGuarantees,
  type EffectClass,
  type KeyPolicy,
} from './contract.js';
import {
  EFFECT_DEFAULTS,
  failureOutcomeOf,
  failureOutcomes,
  type FailureMapping,
  type FailureOutcome,
} from './defaults.js';
import { TooltxError } from './errors.js';
import type { Implementation } from './implementation.js';

type AnyObjectSchema = z.ZodObject<z.ZodRawShape>;
/** What a tool without an `output` returns: its receipt only (FM-19). */
type ReceiptOnly = z.ZodObject<Record<string, never>>;

/**
 * A tool in few lines: the fields of a contract ({@link ContractSpec}), of which only `name`,
 * `description`, `effect` and `input` are always required; everything else comes from the effect
 * class ({@link EFFECT_DEFAULTS}) and can be given field by field.
 */
export interface ToolSpec<I extends AnyObjectSchema, O extends z.ZodType> {
  /** Dotted lower-case name, e.g. `ledger.transfer`. */
  name: string;
  /** Default 1; bumped on any change of parameters, results or permission semantics. */
  version?: number;
  description: string;
  effect: EffectClass;
  /** Strict object schema (`z.strictObject`). */
  input: I;
  /** Required for `read` and `compute`; a side effect returns its receipt only by default (`{}`, FM-19). */
  output?: O;
  normalise?: ContractSpec<I, O>['normalise'];
  /**
   * What the operation acts upon. Default: the whole normalised input for every class but `send` and
   * `charge`, which must name it (their key is the target within the task).
   */
  target?: ContractSpec<I, O>['target'];
  /**
   * What the operation means to do to its target. Default: for `send` and `charge`, `{}` (a changed
   * amount or text under the same task and target is an `idempotency_conflict`); for every other
   * class, the normalised input minus the fields the target names.
   */
  intent?: ContractSpec<I, O>['intent'];
  /** Overrides of the effect class's key policy, field by field (`retentionMs` ≤ the event log's max age). */
  key?: Partial<KeyPolicy>;
  /** Overrides of the effect class's timing, field by field, ms. */
  timing?: Partial<ContractTiming>;
  /** Overrides of the effect class's downstream guarantees, field by field: claim only what the downstream promises. */
  downstream?: Partial<DownstreamGuarantees>;
  /** How a committed operation is compensated (docs/compensation.md); absent = it cannot be. */
  compensation?: ContractSpec<I, O>['compensation'];
  /** Hold the side effect back until it is confirmed (docs/compensation.md); absent = it runs once accepted. */
  confirm?: ContractSpec<I, O>['confirm'];
}

/**
 * The trusted half of a tool: an {@link Implementation} without its contract, plus `failures`,
 * overrides of the effect class's failure mapping by HTTP status (`{ '409': 'invalid_input' }`,
 * `{ '4xx': 'unknown' }`). `execute` may throw {@link HttpStatusError} for a downstream's error
 * answer: it becomes a `TooltxError` of the mapped class, or stays as it is when the mapping says
 * `unknown`.
 */
export type ToolImplementation<C extends Contract> = Omit<Implementation<C>, 'contract'> & {
  failures?: Record<string, FailureOutcome>;
};

/**
 * A defined tool. `contract` is the shared half (what agents import and give `createTools`);
 * `implement` makes the trusted half, in the module the services load (`TOOLTX_TOOLS_MODULE`).
 */
export interface Tool<I extends AnyObjectSchema = AnyObjectSchema, O extends z.ZodType = z.ZodType> {
  readonly contract: Contract<I, O>;
  /** The failure mapping `implement` starts from: the effect class's. */
  readonly failures: FailureMapping;
  /**
   * The trusted implementation of this tool, its `execute` wrapped in the failure mapping. Throws
   * `TypeError` naming the field when `impl` is malformed (`execute` missing, an unknown field, a
   * failure mapping key that is not a status or status class).
   */
  implement(impl: ToolImplementation<Contract<I, O>>): Implementation<Contract<I, O>>;
}

const fn = (what: string) => z.custom<(...args: never[]) => unknown>((v) => typeof v === 'function', `must be ${what}`);
const ms = z.number().int().positive();
const toolSpecSchema = z.strictObject({
  name: z.string(),
  version: z.number().int().min(1).optional(),
  description: z.string(),
  effect: z.enum(effectClasses),
  input: z.custom<AnyObjectSchema>(
    (v) => typeof (v as z.ZodType | undefined)?.safeParse === 'function' && (v as z.ZodType).def.type === 'object',
    'must be z.strictObject(...)',
  ),
  output: z
    .custom<z.ZodType>((v) => typeof (v as z.ZodType | undefined)?.safeParse === 'function', 'must be a zod schema')
    .optional(),
  normalise: z
    .record(
      z.string(),
      z.custom(
        (v) => typeof v === 'function' && typeof (v as { normaliserName?: unknown }).normaliserName === 'string',
        'must be a normaliser (normalise.*)',
      ),
    )
    .optional(),
  target: fn('a function of the input').optional(),
  intent: fn('a function of the input').optional(),
  key: z.strictObject({ scope: z.literal('tenant').optional(), retentionMs: ms.optional() }).optional(),
  timing: z
    .strictObject({ timeoutMs: ms.optional(), runningBoundMs: ms.optional(), unknownDeadlineMs: ms.optional() })
    .optional(),
  downstream: z
    .strictObject({ honoursKey: z.boolean().optional(), enforcesDeadline: z.boolean().optional() })
    .optional(),
  compensation: compensationSchema.optional(),
  confirm: confirmSchema.optional(),
});

/** A failure mapping's keys: an HTTP status (`404`) or a status class (`4xx`), 1xx to 5xx. */
const FAILURE_KEY = /^[1-5](\d\d|xx)$/;
const failuresSchema = z.record(z.string().regex(FAILURE_KEY), z.enum(failureOutcomes), {
  // zod's own message for a bad key ("Invalid key in record") says neither what is wrong nor what would do.
  error: (issue) =>
    issue.code === 'invalid_key'
      ? 'not an HTTP status or class: expected a status such as 404 (100 to 599) or a class such as 4xx (1xx to 5xx)'
      : undefined,
});
const implementationSchema = z.strictObject({
  execute: fn('a function (input, ctx) => { resourceId, result }'),
  prepare: fn('a function (input, ctx) => { preview }').optional(),
  discard: fn('a function (input, ctx) => void').optional(),
  probe: fn('a function').optional(),
  authorize: fn('a function').optional(),
  invariants: fn('a function').optional(),
  authorizeRead: fn('a function').optional(),
  clock: fn('a function').optional(),
  policyVersion: z.string().min(1).optional(),
  failures: failuresSchema.optional(),
});

/** The input minus the fields `target` names: every field the target does not hold tells one operation from another. */
function restOf(input: Record<string, unknown>, target: Record<string, unknown>): Record<string, never> {
  const rest: Record<string, unknown> = { ...input };
  for (const k of Object.keys(target)) delete rest[k];
  return rest as Record<string, never>;
}

/**
 * Defines a tool from the few fields that say what it is, the rest from its effect class
 * ({@link EFFECT_DEFAULTS}; docs/writing-tools.md). The contract is built by `defineContract` from
 * the filled-in spec, so it is an ordinary contract (same digest rules, FM-25): a default that
 * changes changes the digest of the tools that rely on it.
 *
 * Throws `TypeError` naming the field when the spec is malformed: an unknown field (`timing.timeout`),
 * a missing `output` of a read or computation, a missing `target` of a send or charge, or anything
 * `defineContract` refuses (a name that is not dotted lower case, an input that is not strict).
 */
export function defineTool<I extends AnyObjectSchema, O extends z.ZodType = ReceiptOnly>(
  spec: ToolSpec<I, O>,
): Tool<I, O> {
  const name = String((spec as { name?: unknown } | undefined)?.name ?? '(unnamed)');
  const issues = specIssues(toolSpecSchema, spec);
  if (issues.length) throw new ContractSpecError(`defineTool ${name}`, issues);
  const d = EFFECT_DEFAULTS[spec.effect];
  if (d.outputRequired && spec.output === undefined)
    throw new TypeError(`defineTool ${name}: output: required for a ${spec.effect} tool (what the caller may read)`);
  if (d.targetRequired && spec.target === undefined) {
    throw new TypeError(
      `defineTool ${name}: target: required for a ${spec.effect} tool (its operation key is the target within the task: name what it acts upon)`,
    );
  }
  // An intent alone would leave the default target (the whole input) holding every field the intent
  // left out, and a changed incidental field (a fetch time) would make a retry a new operation: a
  // second effect where the author meant a conflict. Both or neither (docs/writing-tools.md).
  if (spec.intent !== undefined && spec.target === undefined) {
    throw new TypeError(
      `defineTool ${name}: target: required when intent is given (the key is target + intent; the default target, the whole input, would keep in the key what the intent leaves out)`,
    );
  }
  type In = z.infer<I>;
  const target = spec.target ?? ((input: In) => ({ ...input }) as Record<string, never>);
  const intent = spec.intent ?? (d.intent === 'none' ? () => ({}) : (input: In) => restOf(input, target(input)));
  const contract = defineContract<I, O>({
    name: spec.name,
    version: spec.version ?? 1,
    description: spec.description,
    effect: spec.effect,
    input: spec.input,
    output: spec.output ?? (z.object({}) as z.ZodType as O),
    ...(spec.normalise ? { normalise: spec.normalise } : {}),
    target,
    intent,
    key: { ...d.key, ...spec.key },
    timing: { ...d.timing, ...spec.timing },
    downstream: { ...d.downstream, ...spec.downstream },
    ...(spec.compensation ? { compensation: spec.compensation } : {}),
    ...(spec.confirm ? { confirm: spec.confirm } : {}),
  });
  return Object.freeze({
    contract,
    failures: Object.freeze({ ...d.failures }),
    implement: (impl: ToolImplementation<Contract<I, O>>) => implementTool(contract, d.failures, impl),
  });
}

function implementTool<C extends Contract>(
  contract: C,
  defaults: FailureMapping,
  impl: ToolImplementation<C>,
): Implementation<C> {
  const issues = specIssues(implementationSchema, impl);
  if (issues.length) throw new ContractSpecError(`implement ${contract.id}`, issues);
  // The preview the caller is promised needs a step that makes it; a prepare step needs a hold to report to.
  for (const step of ['prepare', 'discard'] as const) {
    if (impl[step] && !contract.confirm) {
      throw new ContractSpecError(`implement ${contract.id}`, [
        { path: [step], code: 'no_confirm', message: `a ${step} step needs the contract to declare confirm` },
      ]);
    }
  }
  if (contract.confirm?.preview && !impl.prepare) {
    throw new ContractSpecError(`implement ${contract.id}`, [
      { path: ['prepare'], code: 'required', message: 'required: the contract declares a confirm preview' },
    ]);
  }
  const { failures, ...rest } = impl;
  const mapping = withOverrides(defaults, failures ?? {});
  return {
    ...rest,
    contract,
    async execute(input, ctx) {
      try {
        return await impl.execute(input, ctx);
      } catch (err) {
        throw mappedFailure(mapping, err);
      }
    },
  };
}

/**
 * The defaults with a tool's own entries over them. A class the tool names (`4xx`) takes over the
 * whole class: the defaults' exact statuses in it (`404`, `429`) go unless the tool names them too,
 * so `{ '4xx': 'unknown' }` means every 4xx is unknown, as written — never a default `rejected` that
 * would send the agent into a retry of a write that may have happened.
 */
export function withOverrides(defaults: FailureMapping, own: FailureMapping): FailureMapping {
  const classes = Object.keys(own)
    .filter((k) => /^[1-5]xx$/.test(k))
    .map((k) => k[0]);
  const kept = Object.entries(defaults).filter(([k]) => !(/^\d{3}$/.test(k) && classes.includes(k[0]!)));
  return Object.freeze({ ...Object.fromEntries(kept), ...own });
}

/**
 * What a throw of `execute` becomes under `mapping`: a `TooltxError` as it is (already classified);
 * an {@link HttpStatusError} whose status maps to an error class → a `TooltxError` of that class
 * (with its `retryAfterMs`); anything else — a mapped `unknown`, a lost connection, an abort — as
 * it is (the outcome is unknown). Pure.
 */
export function mappedFailure(mapping: FailureMapping, err: unknown): unknown {
  if (err instanceof TooltxError || !(err instanceof HttpStatusError)) return err;
  const outcome = failureOutcomeOf(mapping, err.status);
  if (outcome === 'unknown') return err;
  return new TooltxError(outcome, `downstream answered ${err.status}: ${outcome}`, {
    cause: err,
    ...(err.retryAfterMs !== undefined ? { retryAfterMs: err.retryAfterMs } : {}),
  });
}

/**
 * A downstream's error answer, for the failure mapping. Its message names the status only: the
 * answer's reason phrase and body are the downstream's own words and stay out of logs (FM-16).
 */
export class HttpStatusError extends Error {
  readonly status: number;
  /** From the answer's `Retry-After`, ms (absent when it gave none). */
  readonly retryAfterMs: number | undefined;
  constructor(status: number, opts: { retryAfterMs?: number } = {}) {
    super(`downstream answered ${status}`);
    this.name = 'HttpStatusError';
    this.status = status;
    this.retryAfterMs = opts.retryAfterMs;
  }

  /**
   * The error of an answer (`fetch`'s `Response`, or anything with `status` and `headers.get`):
   * `Retry-After` in seconds or as an HTTP date (against `now`, ms since the epoch) becomes `retryAfterMs`.
   */
  static of(
    res: { status: number; headers?: { get(name: string): string | null } },
    now = Date.now(),
  ): HttpStatusError {
    const retryAfterMs = retryAfterMsOf(res.headers?.get('retry-after') ?? null, now);
    return new HttpStatusError(res.status, retryAfterMs === undefined ? {} : { retryAfterMs });
  }
}

/** `Retry-After` (RFC 9110 §10.2.3: delay-seconds or an HTTP date) as ms from `now`; undefined when absent or unreadable. */
function retryAfterMsOf(value: string | null, now: number): number | undefined {
  if (value === null) return undefined;
  const v = value.trim();
  if (/^\d{1,9}$/.test(v)) return Number(v) * 1_000;
  const at = Date.parse(v);
  return Number.isNaN(at) ? undefined : Math.max(0, at - now);
}
