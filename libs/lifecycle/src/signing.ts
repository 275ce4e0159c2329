import {
  createHash,
  createPrivateKey,
  createPublicKey,
  generateKeyPairSync,
  sign,
  verify,
  type KeyObject,
} from 'node:crypto';
import { readFileSync, statSync } from 'node:fs';
import { isDeepStrictEqual } from 'node:util';
import { canonicalJson } from '@tooltx/contracts';
import { receiptSchema, type Receipt } from './events.js';

/**
 * Signed receipts (FM-17): every appender of
 * `committed` — the executor, the reconciler, a person's resolution — signs the RFC 8785 canonical
 * bytes of the receipt (every field but `signature`) with Ed25519 (RFC 8032) through Node's
 * built-in `crypto`, under its own key id. A client accepts a receipt only when its key id is one
 * it was configured with and the signature verifies; a forged "success" without one never counts.
 *
 * Key id: `ed25519:` + the first 16 bytes of SHA-256 over the public key's SPKI DER, base64url —
 * derived from the key itself, so a key id can never name another key.
 *
 * Formats (docs/lifecycle.md "Receipt formats"): signers write format 2 (`schema: 2`, the
 * operation's own `prevEventCount`); format 1 (no `schema`, the shared event log's `prevSeq`) is
 * still verified, so receipts already handed out keep counting. Both are signed over the same
 * canonical bytes, and the `schema` field is among them: a receipt cannot be moved from one format
 * to the other without breaking its signature.
 */

/** The receipt before it is signed (either format; signers build format 2). */
export type UnsignedReceipt = Receipt extends infer R ? (R extends unknown ? Omit<R, 'signature'> : never) : never;

/** Signs receipts with one private key. */
export interface ReceiptSigner {
  readonly keyId: string;
  /** The base64url Ed25519 signature of the canonical receipt (without `signature`). */
  sign(receipt: UnsignedReceipt): string;
}

/** `ed25519:<22 base64url chars>` of a public key. */
export function keyIdOf(publicKey: KeyObject): string {
  const der = publicKey.export({ type: 'spki', format: 'der' });
  return `ed25519:${createHash('sha256').update(der).digest().subarray(0, 16).toString('base64url')}`;
}

function bytesOf(receipt: UnsignedReceipt): Buffer {
  const { signature: _s, ...rest } = receipt as Receipt;
  return Buffer.from(canonicalJson(rest), 'utf8');
}

/** A signer over an Ed25519 private key (a `KeyObject` or PKCS#8 PEM text). Throws `TypeError` for another key type. */
export function receiptSigner(privateKey: KeyObject | string): ReceiptSigner {
  const key = typeof privateKey === 'string' ? createPrivateKey(privateKey) : privateKey;
  if (key.asymmetricKeyType !== 'ed25519')
    throw new TypeError(`a receipt signing key must be Ed25519, got ${key.asymmetricKeyType}`);
  const keyId = keyIdOf(createPublicKey(key));
  return { keyId, sign: (r) => sign(null, bytesOf({ ...r, keyId }), key).toString('base64url') };
}

/**
 * Reads a PKCS#8 PEM Ed25519 private key file (`tooltx auth generate` writes one per signing
 * service). Throws `Error` naming the file when it cannot be read, lets group or others read it
 * (mode must be 0600 or stricter, as ssh insists), or is not an Ed25519 key; never the key itself.
 */
export function loadReceiptSigner(file: string): ReceiptSigner {
  let text: string;
  try {
    if ((statSync(file).mode & 0o077) !== 0) throw new Error(`${file}: others may read this private key; chmod 600 it`);
    text = readFileSync(file, 'utf8');
  } catch (err) {
    throw err instanceof Error && err.message.startsWith(file)
      ? err
      : new Error(`${file}: cannot read the key file (${(err as NodeJS.ErrnoException).code ?? 'error'})`);
  }
  try {
    return receiptSigner(text);
  } catch {
    throw new Error(`${file}: not an Ed25519 private key in PKCS#8 PEM`);
  }
}

/** A new Ed25519 key pair as PEM (PKCS#8 private, SPKI public) and its key id. */
export function generateReceiptKey(): { privatePem: string; publicPem: string; keyId: string } {
  const { privateKey, publicKey } = generateKeyPairSync('ed25519');
  return {
    privatePem: privateKey.export({ type: 'pkcs8', format: 'pem' }).toString(),
    publicPem: publicKey.export({ type: 'spki', format: 'pem' }).toString(),
    keyId: keyIdOf(publicKey),
  };
}

/**
 * An existing private key (PKCS#8 PEM) with its public PEM and key id, or null when the text is not
 * an Ed25519 private key (a file to replace, never to trust).
 */
export function receiptKeyOf(privatePem: string): { privatePem: string; publicPem: string; keyId: string } | null {
  try {
    const key = createPrivateKey(privatePem);
    if (key.asymmetricKeyType !== 'ed25519') return null;
    const pub = createPublicKey(key);
    return { privatePem, publicPem: pub.export({ type: 'spki', format: 'pem' }).toString(), keyId: keyIdOf(pub) };
  } catch {
    return null;
  }
}

/**
 * The public keys a client trusts, by key id, from `{ "<keyId>": "<SPKI PEM>" }`. Throws
 * `TypeError` when a key is not Ed25519 or its id is not the id derived from it.
 */
export function trustedReceiptKeys(keys: Record<string, string>): ReadonlyMap<string, KeyObject> {
  const out = new Map<string, KeyObject>();
  for (const [id, pem] of Object.entries(keys)) {
    const k = createPublicKey(pem);
    if (k.asymmetricKeyType !== 'ed25519') throw new TypeError(`receipt key ${id} is not Ed25519`);
    if (keyIdOf(k) !== id) throw new TypeError(`receipt key id ${id} does not match its key (${keyIdOf(k)})`);
    out.set(id, k);
  }
  return out;
}

/**
 * True only when `receipt` is a receipt of a known format (2 or 1), its `keyId` is trusted and its
 * signature verifies over the receipt's canonical bytes.
 */
export function verifyReceipt(receipt: Receipt, trusted: ReadonlyMap<string, KeyObject>): boolean {
  const key = trusted.get(receipt.keyId);
  if (!key) return false;
  if (!receiptSchema.safeParse(receipt).success) return false;
  return signatureVerifies(receipt, key);
}

function signatureVerifies(receipt: Receipt, key: KeyObject): boolean {
  try {
    return verify(null, bytesOf(receipt), key, Buffer.from(receipt.signature, 'base64url'));
  } catch {
    return false;
  }
}

/**
 * {@link verifyReceipt} over one set of trusted keys, remembering the receipts it found valid: a
 * receipt equal, field for field, to one verified before is valid without verifying its signature
 * again (the same bytes under the same key give the same answer). A repeat of a finished call
 * reads its status and gets the receipt it already checked: that answer then costs no Ed25519
 * verify (≈ 145 µs on the 2-core machine, docs/performance.md). Bounded: the newest `max`
 * receipts (default 4,096, about 3 MB); an older one is verified again.
 */
export class ReceiptVerifier {
  readonly #trusted: ReadonlyMap<string, KeyObject>;
  readonly #verified = new Map<string, Receipt>();
  readonly #max: number;

  constructor(trusted: ReadonlyMap<string, KeyObject>, max = 4_096) {
    this.#trusted = trusted;
    this.#max = max;
  }

  /** Whether `keyId` names a trusted key. */
  trusts(keyId: string): boolean {
    return this.#trusted.has(keyId);
  }

  /** Whether `receipt`, already parsed with `receiptSchema`, is signed by a trusted key. */
  verifyParsed(receipt: Receipt): boolean {
    const key = this.#trusted.get(receipt.keyId);
    if (!key) return false;
    const seen = this.#verified.get(receipt.signature);
    if (seen !== undefined && isDeepStrictEqual(seen, receipt)) return true;
    if (!signatureVerifies(receipt, key)) return false;
    this.#verified.set(receipt.signature, receipt);
    if (this.#verified.size > this.#max) this.#verified.delete(this.#verified.keys().next().value as string);
    return true;
  }
}
