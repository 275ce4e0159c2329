import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { Subjects } from '@tooltx/nats';
import { topology } from '@tooltx/streams';
import {
  checkIdentityList,
  consoleLoginsSchema,
  permissionsFor,
  queryingOperators,
  verifyConsoleLogin,
  writeConsoleLogins,
  type IdentityList,
} from '../src/index.js';

const dir = mkdtempSync(join(tmpdir(), 'tooltx-console-logins-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const users = [
  { role: { kind: 'operator' as const, operator: 'oscar' }, userName: 'operator.oscar' },
  { role: { kind: 'auditor' as const, tenant: 'acme', actor: 'audrey' }, userName: 'auditor.acme.audrey' },
];
const passwordOf = (user: string) => readFileSync(join(dir, 'console', 'passwords', `${user}.password`), 'utf8').trim();

describe('console logins', () => {
  it('one password per operator and auditor (mode 0600), only hashes in logins.json; the right password logs in as that identity, nothing else does', async () => {
    const file = writeConsoleLogins(dir, users);
    const logins = consoleLoginsSchema.parse(JSON.parse(readFileSync(file, 'utf8')));
    expect(Object.keys(logins).sort()).toEqual(['acme/audrey', 'oscar']);
    expect(statSync(file).mode & 0o777).toBe(0o600);
    const oscar = passwordOf('operator.oscar');
    expect(statSync(join(dir, 'console', 'passwords', 'operator.oscar.password')).mode & 0o777).toBe(0o600);
    expect(readFileSync(file, 'utf8')).not.toContain(oscar);
    await expect(verifyConsoleLogin(logins, 'oscar', oscar)).resolves.toMatchObject({
      role: { kind: 'operator', operator: 'oscar' },
      seed: 'nkeys/operator.oscar.nk',
    });
    await expect(verifyConsoleLogin(logins, 'oscar', `${oscar}x`)).resolves.toBeNull();
    await expect(verifyConsoleLogin(logins, 'acme/audrey', oscar)).resolves.toBeNull();
    await expect(verifyConsoleLogin(logins, 'nobody', oscar)).resolves.toBeNull();
    await expect(verifyConsoleLogin(logins, '__proto__', oscar)).resolves.toBeNull();
  });

  it('a password is kept when the list is generated again, a short one is replaced, a user no longer listed loses it', () => {
    const before = passwordOf('operator.oscar');
    writeFileSync(join(dir, 'console', 'passwords', 'auditor.acme.audrey.password'), 'short\n');
    writeConsoleLogins(dir, users);
    expect(passwordOf('operator.oscar')).toBe(before);
    expect(passwordOf('auditor.acme.audrey')).toMatch(/^[A-Za-z0-9_-]{32,}$/);
    writeConsoleLogins(dir, users.slice(0, 1));
    expect(() => passwordOf('auditor.acme.audrey')).toThrow();
  });
});

describe('the query grant', () => {
  const list: IdentityList = {
    tenants: [{ id: 'acme', actors: ['alice'], auditors: ['audrey'] }],
    operators: ['oscar', { id: 'quinn', may: ['query'] }, { id: `q${'x'.repeat(63)}`, may: ['query'] }],
  };
  const s = new Subjects('tq');
  const topo = topology(s);
  const perms = (operator: string) =>
    permissionsFor({ kind: 'operator', operator }, s, topo, [], ['acme'], [], [], queryingOperators(list));

  it('lets only a granted operator publish its operations query, and the audit-projector answer every one', () => {
    expect(queryingOperators(list)).toEqual(['quinn', `q${'x'.repeat(63)}`]);
    expect(perms('quinn').publish.allow).toContain('tq.ops.query.quinn');
    expect(perms('oscar').publish.allow).not.toContain('tq.ops.query.oscar');
    expect(perms('oscar').publish.allow.some((a) => a.startsWith('tq.ops.query'))).toBe(false);
    const projector = permissionsFor({ kind: 'service', service: 'audit-projector' }, s, topo, [], ['acme']);
    expect(projector.subscribe.allow).toContain('tq.ops.query.*');
  });

  it('a querying operator may have a 64-character id: a query is not an intent under _op-<id>', () => {
    expect(() => checkIdentityList(list)).not.toThrow();
  });
});
