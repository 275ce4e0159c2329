import { createHash } from 'node:crypto';
import {
  deriveCompensationKey,
  ErrorClass,
  hasSideEffect,
  OPERATION_KEY_PATTERN,
  parseStrict,
  prepareCall,
  toErrorInfo,
  TooltxError,
  type Contract,
  type ErrorInfo,
  type PreparedCall,
} from '@tooltx/contracts';
import {
  compensationEnvelopeSchema,
  confirmEnvelopeSchema,
  discardEnvelopeSchema,
  intentEnvelopeSchema,
  type CompensationEnvelope,
  type IntentEnvelope,
} from './intent.js';

/**
 * The checks an intent meets at intake once its bytes are decoded (the authorizer decodes them:
 * msgpack and its bounds are the NATS adapter's), in their order: identity, envelope, contract,
 * the caller's contract digest, identity inside the input, strict input parse and key derivation.
 * Each refusal carries its error class, its field paths and the key it is recorded under. Pure: no
 * I/O, no clock.
 */

/** The outcome of the pure intake checks, before any lookup or registration. */
export type IntakeCheck =
  | {
      kind: 'refuse';
      error: ErrorInfo;
      /** The key the refusal is recorded under (derived, else the supplied one), or null: none known. */
      decisionKey: string | null;
      tool?: string;
      version?: number;
    }
  | { kind: 'proceed'; envelope: IntentEnvelope; contract: Contract; prepared: PreparedCall }
  | {
      /**
       * A request to compensate `original` with `contract` (the compensating one, which the
       * original's contract must declare: checked once the original is loaded), registered under
       * `compensationKey` (derived from the original's key and that contract only: FM-21).
       */
      kind: 'compensate';
      contract: Contract;
      original: string;
      reason: string;
      compensationKey: string;
    }
  | {
      /**
       * A confirmation (`confirm`) or a discard (`discard`) of the held-back operation `operationKey`
       * (docs/compensation.md "Held-back commits"); judged once the operation is loaded.
       */
      kind: 'confirm';
      operationKey: string;
    }
  | { kind: 'discard'; operationKey: string };

/**
 * The key a refusal is recorded under when the intent gave none and none can be derived (bytes that
 * are not msgpack, an envelope that does not parse): `opk_` + base64url(SHA-256) of the tenant and
 * the submission id, so that every refusal has an audit record and a repeat of the same submission
 * lands on the same subject. Never a key any contract derives: those hash other inputs. Pure.
 */
export function keylessRefusalKey(tenant: string, submissionId: string): string {
  return `opk_${createHash('sha256').update(`tooltx-keyless-refusal\0${tenant}\0${submissionId}`).digest('base64url')}`;
}

/**
 * Intake checks, in this order: identity from the
 * subject (an envelope `actorId` that disagrees is `forbidden`, FM-06) → contract exists, the
 * caller's contract digest equals it for a write (`contract_mismatch`, FM-25) and strict
 * parse (field paths, FM-18) → derive the key and input digest (a supplied key that differs is an
 * `idempotency_conflict` at `operationKey`, FM-03). The policy seam and the lookup follow in the
 * authorizer. Pure: no I/O, no clock.
 */
export function checkIntake(
  who: { tenant: string; actor: string },
  raw: unknown,
  findContract: (tool: string, version: number) => Contract | undefined,
  /** The versions registered under a tool's name: an unknown version of a known tool is refused at `version`, an unknown tool at `tool`. */
  versionsOf: (tool: string) => number[] = (tool) => (findContract(tool, 1) ? [1] : []),
): IntakeCheck {
  const rawObj = (raw && typeof raw === 'object' ? raw : {}) as Record<string, unknown>;
  const supplied =
    typeof rawObj.operationKey === 'string' && OPERATION_KEY_PATTERN.test(rawObj.operationKey)
      ? rawObj.operationKey
      : null;
  const refuse = (
    err: unknown,
    decisionKey: string | null,
    extra: { tool?: string; version?: number } = {},
  ): IntakeCheck => ({
    kind: 'refuse',
    error: toErrorInfo(err),
    decisionKey,
    ...extra,
  });

  // 1. Identity: the subject is the truth; a payload that names someone else is forged. Refused
  // first, whatever else the intent holds; recorded under the supplied key, else under the key its
  // own request derives to when it parses under the contract (FM-06: recorded on the decision
  // subject also for a raw intent that sends no key). Only pure parsing runs for that key: no
  // policy, no lookup.
  if (rawObj.actorId !== undefined && rawObj.actorId !== who.actor) {
    const forged = new TooltxError(ErrorClass.Forbidden, 'envelope actorId differs from the subject actor', {
      issues: [
        {
          path: ['actorId'],
          code: 'not_authenticated_actor',
          message: 'actorId must be the actor this connection authenticated as',
        },
      ],
    });
    if (supplied) return refuse(forged, supplied);
    const derived = derivedKeyOf(raw, findContract);
    return refuse(
      forged,
      derived?.operationKey ?? null,
      derived ? { tool: derived.tool, version: derived.version } : {},
    );
  }

  // 2'. A compensation request names the operation it compensates instead of an input.
  if (rawObj.compensates !== undefined) return checkCompensation(raw, supplied, findContract, refuse);
  // 2''. A confirmation or a discard names the held-back operation; its refusals are recorded under
  // the submission's own key (keylessRefusalKey), never on the operation's.
  if (rawObj.confirms !== undefined || rawObj.discards !== undefined) {
    const confirms = rawObj.confirms !== undefined;
    try {
      const e = confirms ? parseStrict(confirmEnvelopeSchema, raw) : parseStrict(discardEnvelopeSchema, raw);
      return 'confirms' in e
        ? { kind: 'confirm', operationKey: e.confirms.operationKey }
        : { kind: 'discard', operationKey: e.discards.operationKey };
    } catch (err) {
      return refuse(err, null);
    }
  }

  // 2. Envelope and contract.
  let envelope: IntentEnvelope;
  try {
    envelope = parseStrict(intentEnvelopeSchema, raw);
  } catch (err) {
    return refuse(err, supplied);
  }
  const contract = findContract(envelope.tool, envelope.version);
  if (!contract) {
    // A retired or future version of a known tool names `version` (and the versions there are); an unknown tool `tool`.
    const known = versionsOf(envelope.tool);
    const path = known.length || envelope.version !== 1 ? 'version' : 'tool';
    return refuse(
      new TooltxError(ErrorClass.InvalidInput, 'unknown contract', {
        issues: [
          {
            path: [path],
            code: 'unknown_contract',
            message: `no contract ${envelope.tool}@${envelope.version}${known.length ? ` (registered: ${known.map((v) => `@${v}`).join(', ')})` : ': the tools module of this deployment does not define it'}`,
          },
        ],
      }),
      supplied,
      { tool: envelope.tool, version: envelope.version },
    );
  }
  const ids = { tool: contract.name, version: contract.version };

  // 2b. The caller's contract (FM-25): a write made with a cached
  // contract whose interface digest differs from this registry's under the same name@version is refused
  // before its input is read by either — the caller's schema, key or authorisation fields may not
  // be the server's. Recorded under the supplied key (the one the caller waits on). Reads and
  // computations have no side effect to protect and go on.
  if (
    envelope.interfaceDigest !== undefined &&
    envelope.interfaceDigest !== contract.interfaceDigest &&
    hasSideEffect(contract.effect)
  ) {
    return refuse(
      new TooltxError(ErrorClass.ContractMismatch, "the caller's contract differs from the registry's", {
        issues: [
          {
            path: ['interfaceDigest'],
            code: 'contract_mismatch',
            // Both digests (of public contract text, never of an input): the caller can tell which
            // definition it holds and compare it with the one the deployment loads.
            message: `the server's ${contract.id} has another digest: refresh the contract (server ${contract.interfaceDigest}, caller ${String(envelope.interfaceDigest).slice(0, 80)})`,
          },
        ],
      }),
      supplied,
      ids,
    );
  }

  // 1b. Identity named inside the input (FM-06: a payload field that disagrees is a forged
  // identity): a tenant or actor field the contract does not declare, with another value
  // than the subject's, is forbidden — not merely an unknown field. Recorded under the supplied key,
  // else under the key the input derives to without that field.
  const forgedField = forgedIdentityField(who, envelope.input, contract);
  if (forgedField) {
    const forged = new TooltxError(ErrorClass.Forbidden, 'the input names another tenant or actor', {
      issues: [
        {
          path: ['input', forgedField],
          code: 'not_authenticated_identity',
          message: 'identity comes from the connection, never from the input',
        },
      ],
    });
    if (supplied) return refuse(forged, supplied, ids);
    const rest = { ...(envelope.input as Record<string, unknown>) };
    for (const f of Object.keys(IDENTITY_FIELDS)) delete rest[f];
    let key: string | null = null;
    try {
      key = prepareCall(contract, envelope.taskId, rest).operationKey;
    } catch {
      // nothing derivable: refused without a record
    }
    return refuse(forged, key, ids);
  }

  // 3. Strict input parse, normalisation, key and digests.
  let prepared: PreparedCall;
  try {
    prepared = prepareCall(contract, envelope.taskId, envelope.input);
  } catch (err) {
    return refuse(err, supplied, ids);
  }
  if (envelope.operationKey !== undefined && envelope.operationKey !== prepared.operationKey) {
    return refuse(
      new TooltxError(ErrorClass.IdempotencyConflict, 'supplied operation key does not match the request', {
        issues: [
          {
            path: ['operationKey'],
            code: 'key_mismatch',
            message: 'the operation key is derived by the server from taskId, contract, target and intent',
          },
        ],
      }),
      supplied ?? prepared.operationKey,
      ids,
    );
  }
  return { kind: 'proceed', envelope, contract, prepared };
}

/** Field names that carry an identity, and which part of the subject they must equal. */
const IDENTITY_FIELDS: Record<string, 'tenant' | 'actor'> = {
  tenant: 'tenant',
  tenantId: 'tenant',
  tenant_id: 'tenant',
  actor: 'actor',
  actorId: 'actor',
  actor_id: 'actor',
};

/**
 * The first identity field of `input` that the contract's input schema does not declare and whose
 * value differs from the authenticated subject's tenant or actor, or null. Pure.
 */
function forgedIdentityField(
  who: { tenant: string; actor: string },
  input: unknown,
  contract: Contract,
): string | null {
  if (!input || typeof input !== 'object' || Array.isArray(input)) return null;
  const declared = (contract.input as { shape?: Record<string, unknown> }).shape ?? {};
  for (const [field, part] of Object.entries(IDENTITY_FIELDS)) {
    if (!Object.hasOwn(input, field) || Object.hasOwn(declared, field)) continue;
    if ((input as Record<string, unknown>)[field] !== who[part]) return field;
  }
  return null;
}

/**
 * The operation key `raw` derives to when it is a well-formed envelope of a known contract whose
 * input parses (the same derivation as for any intent), with
 * its contract's name and version; null otherwise. Pure; never throws.
 */
function derivedKeyOf(
  raw: unknown,
  findContract: (tool: string, version: number) => Contract | undefined,
): { operationKey: string; tool: string; version: number } | null {
  try {
    const envelope = parseStrict(intentEnvelopeSchema, raw);
    const contract = findContract(envelope.tool, envelope.version);
    if (!contract) return null;
    return {
      operationKey: prepareCall(contract, envelope.taskId, envelope.input).operationKey,
      tool: contract.name,
      version: contract.version,
    };
  } catch {
    return null;
  }
}

/**
 * The intake checks of a compensation request (docs/compensation.md): the envelope
 * `{ tool, version, operationKey?, actorId?, interfaceDigest?, compensates: { operationKey, reason } }`
 * (strict, field paths), the compensating contract known and a write, the caller's digest of it
 * equal to the registry's (FM-25), and the supplied key, when given, the one derived from the
 * original's key and that contract (else `idempotency_conflict` at `operationKey`). Pure.
 */
function checkCompensation(
  raw: unknown,
  supplied: string | null,
  findContract: (tool: string, version: number) => Contract | undefined,
  refuse: (err: unknown, key: string | null, extra?: { tool?: string; version?: number }) => IntakeCheck,
): IntakeCheck {
  let envelope: CompensationEnvelope;
  try {
    envelope = parseStrict(compensationEnvelopeSchema, raw);
  } catch (err) {
    return refuse(err, supplied);
  }
  const ids = { tool: envelope.tool, version: envelope.version };
  const contract = findContract(envelope.tool, envelope.version);
  const key = deriveCompensationKey(envelope.compensates.operationKey, ids);
  if (!contract || !hasSideEffect(contract.effect))
    return refuse(
      new TooltxError(ErrorClass.CompensationNotAllowed, 'not a compensating contract of this deployment', {
        issues: [
          {
            path: ['tool'],
            code: 'unknown_contract',
            message: `no write contract ${envelope.tool}@${envelope.version} to compensate with`,
          },
        ],
      }),
      key,
      ids,
    );
  if (envelope.interfaceDigest !== undefined && envelope.interfaceDigest !== contract.interfaceDigest)
    return refuse(
      new TooltxError(ErrorClass.ContractMismatch, "the caller's contract differs from the registry's", {
        issues: [
          {
            path: ['interfaceDigest'],
            code: 'contract_mismatch',
            message: `the server's ${contract.id} has another digest: refresh the contract (server ${contract.interfaceDigest})`,
          },
        ],
      }),
      supplied ?? key,
      ids,
    );
  if (envelope.operationKey !== undefined && envelope.operationKey !== key)
    return refuse(
      new TooltxError(ErrorClass.IdempotencyConflict, 'supplied operation key does not match the request', {
        issues: [
          {
            path: ['operationKey'],
            code: 'key_mismatch',
            message: "a compensation's key is derived from the original's key and the compensating contract",
          },
        ],
      }),
      supplied,
      ids,
    );
  return {
    kind: 'compensate',
    contract,
    original: envelope.compensates.operationKey,
    reason: envelope.compensates.reason,
    compensationKey: key,
  };
}
