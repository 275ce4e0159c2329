import { randomBytes, scrypt, scryptSync, timingSafeEqual } from 'node:crypto';
import { chmodSync, existsSync, mkdirSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { z } from 'zod';
import { ID_PATTERN } from '@tooltx/contracts';
import type { Role } from '@tooltx/nats';
import { writePrivate } from './private-file.js';

/**
 * Console logins (docs/console.md): every operator and auditor of the identity list gets a
 * password (`<out>/console/passwords/<user>.password`, mode 0600, given to that person) and the
 * console gets only their scrypt hashes (`<out>/console/logins.json`, mode 0600) and the user's nkey
 * seed file, through which it acts as that identity: what a login may see and do is what the
 * server lets that identity do. Agents, services and the provisioner have no login. A password
 * already there is kept (delete its file to rotate it); the password of a user no longer on the
 * list is removed.
 */

/** An operator or an auditor: the identities that log in to the console. */
export type ConsoleRole = Extract<Role, { kind: 'operator' } | { kind: 'auditor' }>;

/** The login name of an identity: an operator's id, or `<tenant>/<auditor>`. */
export function consoleLoginName(role: ConsoleRole): string {
  return role.kind === 'operator' ? role.operator : `${role.tenant}/${role.actor}`;
}

const id = z.string().regex(ID_PATTERN);
const b64 = z.string().regex(/^[A-Za-z0-9_-]+$/);
/** scrypt parameters: N = 2^14, r = 8, p = 1 (about 16 MB and tens of ms per check). */
const SCRYPT = { N: 16_384, r: 8, p: 1, keylen: 32 } as const;

export const consoleLoginSchema = z.strictObject({
  role: z.discriminatedUnion('kind', [
    z.strictObject({ kind: z.literal('operator'), operator: id }),
    z.strictObject({ kind: z.literal('auditor'), tenant: id, actor: id }),
  ]),
  /** The identity's nkey seed file (written by `tooltx auth generate`), relative to the auth directory. */
  seed: z.string().regex(/^nkeys\/[a-z0-9_.-]+\.nk$/),
  scrypt: z.strictObject({ salt: b64, hash: b64 }),
});
export type ConsoleLogin = z.infer<typeof consoleLoginSchema>;
export const consoleLoginsSchema = z.record(z.string().min(1).max(130), consoleLoginSchema);
export type ConsoleLogins = z.infer<typeof consoleLoginsSchema>;

const hashOf = (password: string, salt: Buffer): Promise<Buffer> =>
  new Promise((resolve, reject) =>
    scrypt(password, salt, SCRYPT.keylen, SCRYPT, (err, key) => (err ? reject(err) : resolve(key))),
  );

/**
 * Whether `password` is the password of `login` (scrypt, compared in constant time). An unknown
 * login costs the same hash as a known one, so the time taken does not tell which logins exist.
 */
export async function verifyConsoleLogin(
  logins: ConsoleLogins,
  login: string,
  password: string,
): Promise<ConsoleLogin | null> {
  const entry = Object.hasOwn(logins, login) ? logins[login] : undefined;
  const salt = entry ? Buffer.from(entry.scrypt.salt, 'base64url') : randomBytes(16);
  const expected = entry ? Buffer.from(entry.scrypt.hash, 'base64url') : randomBytes(SCRYPT.keylen);
  const got = await hashOf(password, salt);
  return entry && got.length === expected.length && timingSafeEqual(got, expected) ? entry : null;
}

/**
 * Writes `<outDir>/console/passwords/<user>.password` for every operator and auditor (kept when
 * present) and `<outDir>/console/logins.json` with their hashes. `seedName` is the seed file's
 * name under `nkeys/`. Returns the logins file.
 */
export function writeConsoleLogins(outDir: string, users: { role: ConsoleRole; userName: string }[]): string {
  const dir = join(outDir, 'console');
  const pwDir = join(dir, 'passwords');
  mkdirSync(pwDir, { recursive: true, mode: 0o700 });
  const logins: ConsoleLogins = {};
  for (const u of users) {
    const file = join(pwDir, `${u.userName}.password`);
    const kept = existsSync(file) ? readFileSync(file, 'utf8').trim() : '';
    // At least 32 characters, or a new one: an emptied or hand-shortened file is never a password.
    const password = /^[A-Za-z0-9_-]{32,}$/.test(kept) ? kept : randomBytes(24).toString('base64url');
    if (password !== kept) writePrivate(file, `${password}\n`);
    chmodSync(file, 0o600);
    const salt = randomBytes(16);
    logins[consoleLoginName(u.role)] = {
      role: u.role.kind === 'operator' ? { kind: 'operator', operator: u.role.operator } : { ...u.role },
      seed: `nkeys/${u.userName}.nk`,
      scrypt: {
        salt: salt.toString('base64url'),
        hash: scryptSync(password, salt, SCRYPT.keylen, SCRYPT).toString('base64url'),
      },
    };
  }
  const listed = new Set(users.map((u) => `${u.userName}.password`));
  for (const f of readdirSync(pwDir)) if (!listed.has(f)) rmSync(join(pwDir, f), { force: true });
  const file = join(dir, 'logins.json');
  writePrivate(file, `${JSON.stringify(logins, null, 2)}\n`);
  return file;
}
