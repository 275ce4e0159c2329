import { createHmac, randomBytes } from 'node:crypto';
import { chmodSync, existsSync, readFileSync, statSync, writeFileSync } from 'node:fs';

/**
 * Keys for keyed digests (HMAC-SHA256) and the files they live in (secrets come from files named
 * in the environment; `npm start` generates development ones).
 *
 * Why keyed: a plain SHA-256 of a guessable value (a knowledge-base id, a short note, a status
 * phrase) is reversed by hashing the guesses; an HMAC without the key is not.
 */

/** Shortest accepted key, in characters of the file (a generated key is 64 hex characters = 32 bytes). */
export const MIN_KEY_CHARS = 32;

/** Thrown when a key file is missing, unreadable, too open or too short; names the file and the rule. */
export class SecretFileError extends Error {
  readonly file: string;
  /** What is wrong with the file, without its path. */
  readonly problem: string;
  constructor(file: string, problem: string) {
    super(`${file}: ${problem}`);
    this.name = 'SecretFileError';
    this.file = file;
    this.problem = problem;
  }
}

/**
 * Reads a key from `file`: its trimmed contents, at least {@link MIN_KEY_CHARS} characters, no
 * whitespace inside. The file must not be readable by group or others (mode `0600` or stricter),
 * as ssh insists for private keys. Throws {@link SecretFileError}; never puts the key in a message.
 */
export function readKeyFile(file: string): Buffer {
  let mode: number;
  let text: string;
  try {
    mode = statSync(file).mode;
    text = readFileSync(file, 'utf8').trim();
  } catch (err) {
    throw new SecretFileError(file, `cannot read the key file (${(err as NodeJS.ErrnoException).code ?? 'error'})`);
  }
  if ((mode & 0o077) !== 0)
    throw new SecretFileError(file, `mode ${(mode & 0o777).toString(8)} lets others read the key; chmod 600 it`);
  if (text.length < MIN_KEY_CHARS || /\s/.test(text))
    throw new SecretFileError(file, `a key must be at least ${MIN_KEY_CHARS} characters without whitespace`);
  return Buffer.from(text, 'utf8');
}

/**
 * Writes a fresh random key (32 bytes as 64 hex characters, mode 0600) to `file` unless the file
 * exists; returns the path. Keys must survive restarts: a projection rebuilt under another key
 * would not equal the one it replaces.
 */
export function ensureKeyFile(file: string): string {
  if (!existsSync(file)) {
    writeFileSync(file, `${randomBytes(32).toString('hex')}\n`, { mode: 0o600, flag: 'wx' });
  }
  chmodSync(file, 0o600);
  return file;
}

/**
 * `hmac-sha256:<64 hex>` of `value` under `key`, with `purpose` bound in (so the HMAC of a target
 * and of a result digest are never comparable even for equal inputs). Deterministic: the same key,
 * purpose and value give the same string in every process and on every rebuild.
 */
export function keyedDigest(key: Buffer, purpose: string, value: string): string {
  return `hmac-sha256:${createHmac('sha256', key).update(purpose).update('\n').update(value).digest('hex')}`;
}

/** The shape of {@link keyedDigest}'s output. */
export const KEYED_DIGEST_PATTERN = /^hmac-sha256:[0-9a-f]{64}$/;
