import type { z } from 'zod';
import { canonicalJson, digestOf, sha256B64u } from './digest.js';
import { parseStrict, type Contract } from './contract.js';
import { ErrorClass, TooltxError } from './errors.js';
import { OPERATION_KEY_PATTERN } from './ids.js';

/**
 * Inputs of an operation key, which binds the business intent (FM-04, FM-05): the task,
 * the contract name@version, the normalised target and the normalised intent. Never a
 * per-attempt id (a model's tool-call id, a request id).
 */
export interface KeyMaterial {
  taskId: string;
  tool: string;
  version: number;
  target: unknown;
  intent: unknown;
}

/**
 * `opk_` + base64url SHA-256 over the RFC 8785 canonical JSON of
 * `{ v: 1, taskId, contract: "name@version", target, intent: digest(intent) }`.
 * Deterministic across processes and languages that implement RFC 8785.
 */
export function deriveOperationKey(m: KeyMaterial): string {
  const material = {
    v: 1,
    taskId: m.taskId,
    contract: `${m.tool}@${m.version}`,
    target: m.target,
    intent: digestOf(m.intent),
  };
  return `opk_${sha256B64u(canonicalJson(material))}`;
}

/**
 * The operation key of the compensation of `originalKey` by the compensating contract
 * `tool@version`: `opk_` + base64url SHA-256 over the RFC 8785 canonical JSON of
 * `{ v: 1, compensates: originalKey, contract: "name@version" }`. Only these two are inputs —
 * never who asks or why — so every request to compensate one operation with one contract, from any
 * caller, with any reason, is one operation, and a repeat replays it (FM-21). Its material has no
 * `taskId`, `target` or `intent`, so it can never equal a key {@link deriveOperationKey} makes.
 * Throws `TypeError` when `originalKey` is not an operation key.
 */
export function deriveCompensationKey(originalKey: string, compensating: { tool: string; version: number }): string {
  if (!OPERATION_KEY_PATTERN.test(originalKey)) throw new TypeError('not an operation key');
  const material = { v: 1, compensates: originalKey, contract: `${compensating.tool}@${compensating.version}` };
  return `opk_${sha256B64u(canonicalJson(material))}`;
}

/** A request made ready for keying: normalised input, its digests and its key. */
export interface PreparedCall<I = Record<string, unknown>> {
  /** The strictly parsed, normalised input: what the executor runs with. */
  input: I;
  operationKey: string;
  /** `sha256:` digest of the whole normalised input: two requests under one key must share it. */
  inputDigest: string;
  /** `sha256:` digest of the normalised target (for audit and takeover records). */
  targetDigest: string;
}

/**
 * Strict parse, per-field normalisation, then key and digests. Used identically by the SDK (to
 * compute the key it will be held to) and by the authorizer (which derives it again, FM-03).
 * Throws `TooltxError(invalid_input)` with field paths under `input`.
 */
export function prepareCall<C extends Contract>(
  contract: C,
  taskId: string,
  rawInput: unknown,
): PreparedCall<z.infer<C['input']>> {
  if (illFormedPath(taskId, ['taskId'])) {
    throw new TooltxError(ErrorClass.InvalidInput, 'ill-formed Unicode', {
      issues: [{ path: ['taskId'], code: 'invalid_unicode', message: 'text contains a lone surrogate' }],
    });
  }
  const parsed = parseStrict(contract.input, rawInput, ['input']) as Record<string, unknown>;
  const broken = illFormedPath(parsed, ['input']);
  if (broken) {
    // RFC 8785 needs well-formed Unicode; a lone surrogate is the caller's to fix, not an internal error.
    throw new TooltxError(ErrorClass.InvalidInput, 'ill-formed Unicode', {
      issues: [{ path: broken, code: 'invalid_unicode', message: 'text contains a lone surrogate' }],
    });
  }
  const input: Record<string, unknown> = { ...parsed };
  for (const [field, normaliser] of Object.entries(contract.normalise ?? {})) {
    if (input[field] === undefined || normaliser === undefined) continue;
    try {
      input[field] = (normaliser as (v: unknown) => unknown)(input[field]);
    } catch {
      throw new TooltxError(ErrorClass.InvalidInput, `field ${field} cannot be normalised`, {
        issues: [{ path: ['input', field], code: 'invalid_format', message: 'value cannot be normalised' }],
      });
    }
  }
  // The normalised value must still satisfy the contract (e.g. a title that was only whitespace).
  parseStrict(contract.input, input, ['input']);
  const typed = input as z.infer<C['input']>;
  const target = contract.target(typed);
  const intent = contract.intent(typed);
  return {
    input: typed,
    operationKey: deriveOperationKey({ taskId, tool: contract.name, version: contract.version, target, intent }),
    inputDigest: digestOf(input),
    targetDigest: digestOf(target),
  };
}

/** The path of the first string that is not well-formed UTF-16 (a lone surrogate), or null. */
function illFormedPath(v: unknown, path: (string | number)[]): (string | number)[] | null {
  if (typeof v === 'string') return (v as string & { isWellFormed(): boolean }).isWellFormed() ? null : path;
  if (Array.isArray(v)) {
    for (const [i, x] of v.entries()) {
      const p = illFormedPath(x, [...path, i]);
      if (p) return p;
    }
    return null;
  }
  if (v && typeof v === 'object') {
    for (const [k, x] of Object.entries(v)) {
      const p = illFormedPath(x, [...path, k]);
      if (p) return p;
    }
  }
  return null;
}
