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
