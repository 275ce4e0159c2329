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
}

/** A defined contract: the spec plus its identity and content digest. */
export interface Contract<I extends AnyObjectSchema = AnyObjectSchema, O extends z.ZodType = z.ZodType>
  extends ContractSpec<I, O> {
  /** `name@version`. */
  readonly id: string;
  /**
   * `sha256:` digest over the canonical description, schemas, normaliser names, the source text of
   * the target and intent functions, key, timing, downstream. Recorded in each operation's events;
   * the executor runs an operation only with the contract of this exact digest.
   */
  readonly digest: string;
  /**
   * `sha256:` digest of what a host (an agent's SDK) and the server must agree on for one
   * `name@version`: name, version, description, effect class, input and output schemas (JSON
   * Schema), normaliser names and key policy. Not the functions' source text, which differs
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
const ms = z.number().int().positive();
const specSchema = z.object({
  name: z.string().regex(NAME).max(100),
  version: z.number().int().min(1),
  description: z.string().min(1).max(2000),
  effect: z.enum(effectClasses),
  key: z.object({ scope: z.literal('tenant'), retentionMs: ms }),
  timing: z.object({ timeoutMs: ms, runningBoundMs: ms, unknownDeadlineMs: ms }),
  downstream: z.object({ honoursKey: z.boolean(), enforcesDeadline: z.boolean() }),
});

/**
 * Defines a contract. Throws `TypeError` when the spec is malformed or the input schema is not
 * strict (an extra field must be an `invalid_input`, never silently stripped — FM-06).
 */
export function defineContract<I extends AnyObjectSchema, O extends z.ZodType>(
  spec: ContractSpec<I, O>,
): Contract<I, O> {
  const checked = specSchema.safeParse(spec);
  if (!checked.success) {
    throw new TypeError(`invalid contract ${String(spec.name)}: ${z.prettifyError(checked.error)}`);
  }
  const catchall = (spec.input.def as { catchall?: z.ZodType }).catchall;
  if (catchall?.def.type !== 'never') {
    throw new TypeError(`contract ${spec.name}@${spec.version}: input must be z.strictObject(...)`);
  }
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
  };
  // What a caller's request is made against; not the functions' source text (each build prints it
  // differently) nor how the server executes (timing, downstream guarantees: set per deployment,
  // e.g. KB_TIMING_MS and KB_DEDUP of the sample).
  const { target: _target, intent: _intent, timing: _timing, downstream: _downstream, ...sharedWithHosts } = described;
  return Object.freeze({
    ...spec,
    id: `${spec.name}@${spec.version}`,
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
