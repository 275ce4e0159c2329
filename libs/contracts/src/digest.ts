import { createHash } from 'node:crypto';
import canonicalizeJson from 'canonicalize';

/**
 * RFC 8785 (JSON Canonicalization Scheme) text of a JSON value, via the `canonicalize`
 * library. Throws `TypeError` for values JSON cannot represent (undefined at the root,
 * non-finite numbers, BigInt).
 */
export function canonicalJson(value: unknown): string {
  const text = canonicalizeJson(value);
  if (text === undefined) throw new TypeError('value has no canonical JSON form');
  return text;
}

/** `sha256:` + lowercase hex SHA-256 of the RFC 8785 canonical JSON of `value`. */
export function digestOf(value: unknown): string {
  return `sha256:${sha256Hex(canonicalJson(value))}`;
}

/** Lowercase hex SHA-256 of a UTF-8 string or bytes. */
export function sha256Hex(data: string | Uint8Array): string {
  return createHash('sha256').update(data).digest('hex');
}

/** Base64url (no padding) SHA-256 of a UTF-8 string. */
export function sha256B64u(data: string): string {
  return createHash('sha256').update(data).digest('base64url');
}

/**
 * Digest of the empty business result `{}` — a write's result is its receipt only (FM-19). Such a
 * result is never stored in the result store: its digest alone says what it is.
 */
export const EMPTY_RESULT_DIGEST = digestOf({});
