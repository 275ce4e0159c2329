import { z } from 'zod';
import { digestOf } from './digest.js';
import { boundIssues, ERROR_BOUNDS, ErrorClass, TooltxError, type FieldIssue } from './errors.js';
import type { Normaliser } from './normalise.js';

/**
 * Effect classes decide control flow after a timeout: `read` and
 * `compute` are safe to retry; the others have side effects and need a status query, a
 * compensation or a human.
 */
export const EffectClass = {
  Read: 'read',
  Compute: 'compute',
  Create: 'create',
  Update: 'update',
  Delete: 'delete',
  Send: 'send',
  Charge: 'charge',
} as const;
export type EffectClass = (typeof EffectClass)[keyof typeof EffectClass];
export const effectClasses = Object.values(EffectClass) as [EffectClass, ...EffectClass[]];

/** True for effect classes whose repetition could change the world (create … charge). */
export function hasSideEffect(effect: EffectClass): boolean {
  return effect !== EffectClass.Read && effect !== EffectClass.Compute;
}

type JsonValue = string | number | boolean | null | JsonValue[] | { [k: string]: JsonValue };
type AnyObjectSchema = z.ZodObject<z.ZodRawShape>;

/** Timing of one contract, all in milliseconds. */
export interface ContractTiming {
  /** One attempt at the downstream; the absolute deadline sent downstream is start + timeoutMs. */
  timeoutMs: number;
  /** How long `running` may last before the reconciler looks. */
  runningBoundMs: number;
  /** How long the reconciler may try to resolve `unknown` before it writes a takeover record. */
  unknownDeadlineMs: number;
}

/** What the downstream promises, as part of the contract (docs/clocks.md "The rule"). */
export interface DownstreamGuarantees {
  /** The downstream deduplicates by the key we send: a repeat returns the original effect. */
  honoursKey: boolean;
  /** The downstream refuses a request that arrives after the absolute deadline we send. */
  enforcesDeadline: boolean;
}

/** Key scope and retention: the scope is always the tenant. */
export interface KeyPolicy {
  scope: 'tenant';
  /** How long a registration is kept and honoured, ms. Must not exceed the event log's max_age. */
  retentionMs: number;
}

/** The states an operation may be compensated from (the declaration's `allowedFrom`; the default is all of them). */
export const compensableStatuses = ['committed'] as const;
export type CompensableStatus = (typeof compensableStatuses)[number];

/**
 * What a compensation's input is built from: the original operation's normalised input and its
 * committed receipt (the fields of the receipt a builder may need; the receipt stays valid whatever
 * the compensation does).
 */
export interface CommittedOriginal<In = Record<string, unknown>> {
  input: In;
  receipt: {
    tenant: string;
    operationKey: string;
    tool: string;
    version: number;
    resourceId: string;
    resultDigest: string;
    committedAt: number;
  };
}

/**
 * How a committed operation of this contract is compensated (docs/compensation.md): by a new
 * operation of another contract, never by pretending the first did not happen. A contract without
 * one cannot be compensated (`compensation_not_allowed`).
 */
export interface CompensationDeclaration<I extends AnyObjectSchema = AnyObjectSchema> {
  /** The compensating contract, `name@version` (e.g. `kb.delete_note@1`). */
  tool: string;
  /** The original's states it may be asked from; default `['committed']`. */
  allowedFrom?: readonly CompensableStatus[];
  /** How long after the commit (the receipt's `committedAt`) it may be asked for, ms (`compensation_expired` after). */
  deadlineMs: number;
  /** The permission the compensation's requester needs, checked at its execution instant like any write's. */
  permission: string;
  /**
   * The compensating contract's input, from the original's normalised input and receipt and the
   * caller's `reason` (≤ {@link MAX_REASON_CHARS} characters; audit keeps only its digest). Pure:
   * the same original and reason give the same input. Its source text is part of the contract's
   * `digest`, like `target` and `intent`.
   */
  input: (original: CommittedOriginal<z.infer<I>>, reason: string) => Record<string, JsonValue>;
}

/**
 * Hold the side effect back until someone confirms it (docs/compensation.md "Held-back commits"):
 * the operation is accepted, may run the implementation's `prepare` step (no external effect; its
 * result, of schema `preview`, goes back to the caller), and waits in `awaiting_confirmation`. A
 * confirmation by an actor with `permission` runs it; a discard, or no confirmation within
 * `deadlineMs` of the hold, ends it `rolled_back`: nothing external happened.
 */
export interface ConfirmDeclaration {
  /** The permission a confirming (or discarding) actor needs. */
  permission: string;
  /** How long the operation waits for its confirmation after it is held, ms. */
  deadlineMs: number;
  /** The schema of `prepare`'s result, what the caller reads before confirming; required when the implementation prepares. */
  preview?: z.ZodType;
}

/** Longest `reason` of a compensation request, in characters. */
export const MAX_REASON_CHARS = 500;

/** The part of a contract shared with agents. */
export interface ContractSpec<I extends AnyObjectSchema = AnyObjectSchema, O extends z.ZodType = z.ZodType> {
  /** Dotted lower-case name, e.g. `kb.write_note`. */
  name: string;
  /** Positive integer; bumped on any change of parameters, results or permission semantics. */
  version: number;
  description: string;
  effect: EffectClass;
  /** Strict object schema (`z.strictObject`): unknown fields are refused, never stripped. */
  input: I;
  /** The business result the caller may read (and nothing else). */
  output: O;
  /** Per-field normalisers applied after the strict parse, before any digest. */
  normalise?: { [K in keyof z.infer<I>]?: Normaliser<NonNullable<z.infer<I>[K]>> };
  /** The normalised target: what the operation acts upon (a knowledge base, an account). */
  target: (input: z.infer<I>) => Record<string, JsonValue>;
  /** The normalised business intent: what the operation means to do to its target. */
  intent: (input: z.infer<I>) => Record<string, JsonValue>;
  key: KeyPolicy;
  timing: ContractTiming;
  downstream: DownstreamGuarantees;
  /** How a committed operation is compensated; absent = it cannot be. */
  compensation?: CompensationDeclaration<NoInfer<I>>;
  /** Hold the side effect back until it is confirmed; absent = it runs once accepted. */
  confirm?: ConfirmDeclaration;
}

/** A defined contract: the spec plus its identity and content digest. */
export interface Contract<I extends AnyObjectSchema = AnyObjectSchema, O extends z.ZodType = z.ZodType>
  extends ContractSpec<I, O> {
  /** `name@version`. */
  readonly id: string;
  /**
   * `sha256:` digest over the canonical description, schemas, normaliser names, the source text of
   * the target and intent functions, key, timing, downstream, and the compensation and confirm
   * declarations when there are (the compensation's input builder as its source text). Recorded in each operation's events;
   * the executor runs an operation only with the contract of this exact digest.
   */
  readonly digest: string;
  /**
   * `sha256:` digest of what a host (an agent's SDK) and the server must agree on for one
   * `name@version`: name, version, description, effect class, input and output schemas (JSON
   * Schema), normaliser names, key policy, and the compensation (without its input builder) and
   * confirm declarations when there are. Not the functions' source text, which differs
   * between builds of the same source (tsx, vite and esbuild each print a function differently),
   * nor timing and downstream guarantees, which describe the server's execution and are set per
   * deployment.
   * The SDK sends it with every intent and the authorizer refuses a write whose digest differs
   * from its own (`contract_mismatch`, FM-25). A host whose target
   * or intent function differs derives another operation key, which the authorizer refuses as
   * `idempotency_conflict` at `operationKey` (FM-03).
   */
  readonly interfaceDigest: string;
}

const NAME = /^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$/;
/** `name@version` of a contract. */
export const CONTRACT_ID_PATTERN = /^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*@[1-9][0-9]{0,8}$/;
/** A permission the policy seam checks: a lower-case token such as `kb.delete` or `mail:confirm`. */
const PERMISSION = /^[a-z][a-z0-9_.:-]{0,99}$/;
const ms = z.number().int().positive();
const fn = (what: string) => z.custom<(...args: never[]) => unknown>((v) => typeof v === 'function', `must be ${what}`);
const zodSchema = (what: string) =>
  z.custom<z.ZodType>((v) => typeof (v as z.ZodType | undefined)?.safeParse === 'function', `must be ${what}`);
export const compensationSchema = z.strictObject({
  tool: z.string().regex(CONTRACT_ID_PATTERN, 'must be name@version of the compensating contract'),
  allowedFrom: z.array(z.enum(compensableStatuses)).min(1).optional(),
  deadlineMs: ms,
  permission: z.string().regex(PERMISSION, 'must be a permission token such as kb.delete'),
  input: fn('a function (original, reason) => the compensating input'),
});
export const confirmSchema = z.strictObject({
  permission: z.string().regex(PERMISSION, 'must be a permission token such as mail.confirm'),
  deadlineMs: ms,
  preview: zodSchema("a zod schema (the prepare step's result)").optional(),
});
/** Every field of a spec: one it does not know is refused, never ignored (and never left out of the digest). */
const specSchema = z.strictObject({
  name: z.string().regex(NAME).max(100),
  version: z.number().int().min(1),
  description: z.string().min(1).max(2000),
  effect: z.enum(effectClasses),
  input: zodSchema('z.strictObject(...)'),
  output: zodSchema('a zod schema'),
  normalise: z.record(z.string(), fn('a normaliser (normalise.*)').optional()).optional(),
  target: fn('a function of the input'),
  intent: fn('a function of the input'),
  key: z.strictObject({ scope: z.literal('tenant'), retentionMs: ms }),
  timing: z.strictObject({ timeoutMs: ms, runningBoundMs: ms, unknownDeadlineMs: ms }),
  downstream: z.strictObject({ honoursKey: z.boolean(), enforcesDeadline: z.boolean() }),
  compensation: compensationSchema.optional(),
  confirm: confirmSchema.optional(),
});

/**
 * A malformed contract or tool spec: a `TypeError` whose `issues` name each wrong field by its path
 * (an unknown field as `unrecognized_key` at its own path) and whose message lists them.
 */
export class ContractSpecError extends TypeError {
  readonly issues: FieldIssue[];
  constructor(what: string, issues: FieldIssue[]) {
    super(`${what}: ${issues.map((i) => `${i.path.join('.') || '(spec)'}: ${i.message}`).join('; ')}`);
    this.name = 'ContractSpecError';
    this.issues = issues;
  }
}

/** The spec's issues in `schema`, or none. */
export function specIssues(schema: z.ZodType, spec: unknown): FieldIssue[] {
  const r = schema.safeParse(spec);
  return r.success
    ? []
    : fieldIssues(r.error).map((i) => ({
        ...i,
        message: i.code === 'unrecognized_key' ? 'not a known field' : i.message,
      }));
}

/**
 * Defines a contract. Throws {@link ContractSpecError} (a `TypeError` naming each field path) when
 * the spec is malformed — an unknown field (`compensate`), a missing or wrong one — when the input
 * schema is not strict (an extra field must be an `invalid_input`, never silently stripped —
 * FM-06), or when a declaration does not fit the effect class (a read or computation has nothing to
 * compensate or hold back) or names the contract itself as its own compensation.
 */
export function defineContract<I extends AnyObjectSchema, O extends z.ZodType>(
  spec: ContractSpec<I, O>,
): Contract<I, O> {
  const what = `invalid contract ${String((spec as { name?: unknown } | undefined)?.name)}`;
  const issues = specIssues(specSchema, spec);
  if (issues.length) throw new ContractSpecError(what, issues);
  const id = `${spec.name}@${spec.version}`;
  const catchall = (spec.input.def as { catchall?: z.ZodType }).catchall;
  if (catchall?.def.type !== 'never') {
    throw new ContractSpecError(`contract ${id}`, [
      { path: ['input'], code: 'not_strict', message: 'input must be z.strictObject(...)' },
    ]);
  }
  const sideEffect = hasSideEffect(spec.effect);
  for (const field of ['compensation', 'confirm'] as const) {
    if (spec[field] && !sideEffect) {
      throw new ContractSpecError(`contract ${id}`, [
        {
          path: [field],
          code: 'no_side_effect',
          message: `a ${spec.effect} contract has no side effect to ${field === 'confirm' ? 'hold back' : 'compensate'}`,
        },
      ]);
    }
  }
  if (spec.compensation?.tool === id) {
    throw new ContractSpecError(`contract ${id}`, [
      {
        path: ['compensation', 'tool'],
        code: 'compensates_itself',
        message: 'a contract cannot be its own compensation',
      },
    ]);
  }
  const compensation = spec.compensation && {
    ...spec.compensation,
    allowedFrom: [...(spec.compensation.allowedFrom ?? compensableStatuses)],
  };
  // Declarations enter the digests only when present, so a contract without them keeps the digests it had.
  const declared = (withBuilder: boolean) => ({
    ...(compensation
      ? {
          compensation: {
            tool: compensation.tool,
            allowedFrom: compensation.allowedFrom,
            deadlineMs: compensation.deadlineMs,
            permission: compensation.permission,
            ...(withBuilder ? { input: compensation.input.toString() } : {}),
          },
        }
      : {}),
    ...(spec.confirm
      ? {
          confirm: {
            permission: spec.confirm.permission,
            deadlineMs: spec.confirm.deadlineMs,
            ...(spec.confirm.preview
              ? { preview: z.toJSONSchema(spec.confirm.preview, { unrepresentable: 'any' }) }
              : {}),
          },
        }
      : {}),
  });
  const described = {
    name: spec.name,
    version: spec.version,
    description: spec.description,
    effect: spec.effect,
    input: z.toJSONSchema(spec.input, { unrepresentable: 'any' }),
    output: z.toJSONSchema(spec.output, { unrepresentable: 'any' }),
    normalise: Object.fromEntries(
      Object.entries(spec.normalise ?? {}).map(([k, n]) => [k, (n as Normaliser).normaliserName]),
    ),
    target: spec.target.toString(),
    intent: spec.intent.toString(),
    key: spec.key,
    timing: spec.timing,
    downstream: spec.downstream,
    ...declared(true),
  };
  // What a caller's request is made against; not the functions' source text (each build prints it
  // differently) nor how the server executes (timing, downstream guarantees: set per deployment,
  // e.g. KB_TIMING_MS and KB_DEDUP of the sample). The declarations are promises to the caller (what
  // may be compensated or confirmed, until when, with which permission): a host and the server agree
  // on them, all but the compensation's input builder, a function.
  const { target: _target, intent: _intent, timing: _timing, downstream: _downstream, ...rest } = described;
  const sharedWithHosts = { ...rest, ...declared(false) };
  return Object.freeze({
    ...spec,
    ...(compensation ? { compensation: Object.freeze(compensation) } : {}),
    id,
    digest: digestOf(described),
    interfaceDigest: digestOf(sharedWithHosts),
  });
}

/**
 * Field issues from a zod error: paths and codes only, never the received values; bounded
 * ({@link boundIssues}: the first ones, clipped, and how many more there were).
 */
export function fieldIssues(error: z.ZodError, prefix: (string | number)[] = []): FieldIssue[] {
  const out: FieldIssue[] = [];
  let total = 0;
  const add = (i: FieldIssue) => {
    total++;
    if (out.length < ERROR_BOUNDS.issues) out.push(i);
  };
  for (const issue of error.issues) {
    const path = [...prefix, ...issue.path.map((p) => (typeof p === 'symbol' ? String(p) : p))];
    if (issue.code === 'unrecognized_keys') {
      for (const key of issue.keys)
        add({ path: [...path, key], code: 'unrecognized_key', message: 'field not allowed' });
    } else {
      add({ path, code: issue.code, message: issue.message });
    }
  }
  return boundIssues(out, total);
}

/** Strict parse with a typed error: throws `TooltxError(invalid_input)` naming every field path. */
export function parseStrict<T extends z.ZodType>(
  schema: T,
  value: unknown,
  prefix: (string | number)[] = [],
): z.infer<T> {
  const r = schema.safeParse(value);
  if (!r.success) {
    const issues = fieldIssues(r.error, prefix);
    throw new TooltxError(ErrorClass.InvalidInput, `invalid input (${issues.length} issue(s))`, { issues });
  }
  return r.data;
}

/**
 * A registry of contracts by `name@version`. Running tasks keep the version they started with:
 * lookups are always by exact version (FM-23).
 */
export class ContractRegistry<C extends Contract = Contract> {
  readonly #byId = new Map<string, C>();
  constructor(contracts: Iterable<C> = []) {
    for (const c of contracts) this.add(c);
  }
  /** Adds a contract. Throws `TypeError` when another contract already holds its `name@version`. */
  add(contract: C): void {
    const prev = this.#byId.get(contract.id);
    if (prev && prev.digest !== contract.digest) throw new TypeError(`two different contracts named ${contract.id}`);
    this.#byId.set(contract.id, contract);
  }
  get(name: string, version: number): C | undefined {
    return this.#byId.get(`${name}@${version}`);
  }
  /** The versions registered under `name`, ascending (empty: no contract of that name). */
  versionsOf(name: string): number[] {
    return this.all()
      .filter((c) => c.name === name)
      .map((c) => c.version)
      .sort((a, b) => a - b);
  }
  all(): C[] {
    return [...this.#byId.values()];
  }
  /** The longest key retention among the contracts, ms (0 when empty). */
  longestKeyRetentionMs(): number {
    return Math.max(0, ...this.all().map((c) => c.key.retentionMs));
  }
}
