import { z } from 'zod';
import { sha256Hex } from './digest.js';

/**
 * Tenant, actor and service ids. One subject token each, so a tenant `a` with actor `b.c` can never
 * collide with tenant `a.b` and actor `c`; `*` and `>` are impossible.
 */
export const ID_PATTERN = /^[a-z0-9_-]{1,64}$/;
export const idSchema = z.string().regex(ID_PATTERN, 'must match ^[a-z0-9_-]{1,64}$');
export type TenantId = string;
export type ActorId = string;

/** Operation key format: `opk_` + 43 base64url chars (SHA-256). */
export const OPERATION_KEY_PATTERN = /^opk_[A-Za-z0-9_-]{43}$/;
export const operationKeySchema = z.string().regex(OPERATION_KEY_PATTERN, 'not an operation key');

/** True when `id` is a valid tenant/actor id (one subject token, no wildcard). */
export function isValidId(id: string): boolean {
  return ID_PATTERN.test(id);
}

/**
 * The subject token of an operation: 32 hex chars of SHA-256 over the operation key.
 * The key's scope is the tenant, which is its own subject token, so two tenants deriving the same
 * key still address two operations (FM-31).
 */
export function operationIdOf(operationKey: string): string {
  return sha256Hex(`tooltx-op\u0000${operationKey}`).slice(0, 32);
}

/**
 * The actor token an operator's requests carry on the intake stream: `_op-<operator>`. Ids starting
 * with `_` are reserved for tooltx (the identity list refuses them for tenants, actors, auditors and
 * operators), so no agent can hold this token, and only the authorizer's identity may publish on
 * such an intent subject: what arrives there was put there by the operator request service, for the
 * operator the subject names.
 */
export const OPERATOR_ACTOR_PREFIX = '_op-';
/** The longest operator id that still makes an actor token (`_op-` + id within 64 characters). */
export const MAX_OPERATOR_ACTOR_ID = 64 - OPERATOR_ACTOR_PREFIX.length;

/** `_op-<operator>`: the actor token of an operator's request (throws `TypeError` when it is not one token). */
export function operatorActorOf(operator: string): string {
  const actor = `${OPERATOR_ACTOR_PREFIX}${operator}`;
  if (!ID_PATTERN.test(operator) || operator.startsWith('_') || !ID_PATTERN.test(actor))
    throw new TypeError(`no operator actor token for ${JSON.stringify(operator)}`);
  return actor;
}

/** The operator an actor token stands for (`_op-<operator>`), or null for an agent's. */
export function operatorOfActor(actor: string): string | null {
  if (!actor.startsWith(OPERATOR_ACTOR_PREFIX)) return null;
  const operator = actor.slice(OPERATOR_ACTOR_PREFIX.length);
  return operator.length > 0 && !operator.startsWith('_') && ID_PATTERN.test(operator) ? operator : null;
}
