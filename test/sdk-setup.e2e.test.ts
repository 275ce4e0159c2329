/**
 * The SDK's answers for calls it knows were never stored, and its set-up errors:
 * a real nats-server with auth on (its own: one test reloads its permissions), the authorizer and
 * executor as processes with the research sample's trusted module. Every answer here is definite
 * and comes at once: `rejected` with a field path when nothing was (or could be) stored, a thrown
 * typed error naming the option when `createTools` is misconfigured — never an `unknown` that only
 * burns its budget.
 */
import { spawn } from 'node:child_process';
import { writeFileSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createUser } from '@nats-io/nkeys';
import { prepareCall, TooltxError } from '@tooltx/contracts';
import { createTools, ToolsOptionError, type CreateToolsOptions, type Tools } from '@tooltx/client';
import { provisioned, reloadConfig, type TestNats } from './helpers/nats.js';
import { startService, type ServiceProcess } from './helpers/services.js';
import { history, waitForDecision } from './helpers/ops.js';
import { researchContracts } from '../examples/research-kb/contracts.js';
import { closedPort } from './helpers/net.js';

const TOOLS_MODULE = join(dirname(fileURLToPath(import.meta.url)), '..', 'examples', 'research-kb', 'tools.ts');
const QUICKSTART = join(dirname(TOOLS_MODULE), 'quickstart.ts');
const contracts = researchContracts({ kbDedup: false });
let t: TestNats;
let procs: ServiceProcess[] = [];
let alice: Tools;
let dir: string;
const base = (): CreateToolsOptions => ({
  servers: t.url,
  tenant: 'acme',
  actor: 'alice',
  nkeyFile: t.agentSeed('acme', 'alice'),
  contracts: contracts.all,
  prefix: t.subjects.prefix,
  receiptKeys: t.auth.receiptKeysFile,
  budgetMs: 15_000,
});
const note = (title: string) => ({
  kb: 'research',
  title,
  body: `Notes on ${title}.`,
  sourceUrl: 'https://example.org/src',
  fetchedAt: '2026-11-30T06:00:00Z',
});
const intentsStored = async () => (await t.jsm.streams.info(t.subjects.intentsStream('acme'))).state.messages;

beforeAll(async () => {
  t = await provisioned();
  dir = mkdtempSync(join(tmpdir(), 'tooltx-sdk-setup-'));
  // No KB: nothing here reaches it (refusals before any policy lookup; a page fetch refused by its URL).
  const env = { ...t.env, TOOLTX_TOOLS_MODULE: TOOLS_MODULE, KB_URL: 'http://127.0.0.1:9' };
  procs = await Promise.all([startService('authorizer', env), startService('executor', env)]);
  alice = await createTools(base());
});

afterAll(async () => {
  await alice?.close();
  const codes = await Promise.all(procs.map((p) => p.stop()));
  await t?.close();
  rmSync(dir, { recursive: true, force: true });
  expect(codes).toEqual(procs.map(() => 0));
});

describe('createTools refuses a bad set-up at once, naming the option', () => {
  it('an nkey seed file that does not exist: a TypeError naming nkeyFile and the path', async () => {
    const err = await createTools({ ...base(), nkeyFile: '/nope.nk' }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(TypeError);
    expect(err).toBeInstanceOf(ToolsOptionError);
    expect((err as Error).message).toContain('nkeyFile');
    expect((err as Error).message).toContain('/nope.nk');
    expect((err as ToolsOptionError).issues).toMatchObject([{ path: ['nkeyFile'], code: 'unreadable' }]);
  });

  it('a receipt keys file that is not JSON: a TypeError naming receiptKeys, or TOOLTX_RECEIPT_KEYS_FILE, and the path', async () => {
    const bad = join(dir, 'receipt-keys.json');
    writeFileSync(bad, 'version: 1\n');
    const err = await createTools({ ...base(), receiptKeys: bad }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(TypeError);
    expect((err as Error).message).toContain(`receiptKeys file ${bad} is not JSON`);
    expect((err as ToolsOptionError).issues).toMatchObject([{ path: ['receiptKeys'] }]);

    const { receiptKeys: _omitted, ...noKeys } = base();
    const before = process.env.TOOLTX_RECEIPT_KEYS_FILE;
    process.env.TOOLTX_RECEIPT_KEYS_FILE = bad;
    try {
      const fromEnv = await createTools(noKeys).catch((e: unknown) => e);
      expect(fromEnv).toBeInstanceOf(TypeError);
      expect((fromEnv as Error).message).toContain(`TOOLTX_RECEIPT_KEYS_FILE file ${bad} is not JSON`);
    } finally {
      if (before === undefined) delete process.env.TOOLTX_RECEIPT_KEYS_FILE;
      else process.env.TOOLTX_RECEIPT_KEYS_FILE = before;
    }
  });

  it('the same contract twice: a TypeError at contracts[i], as its docstring says', async () => {
    const err = await createTools({ ...base(), contracts: [contracts.writeNote, contracts.writeNote] }).catch(
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(TypeError);
    expect((err as ToolsOptionError).issues).toMatchObject([{ path: ['contracts', 1], code: 'duplicate' }]);
    expect((err as Error).message).toContain('kb.write_note@1 is given twice');
  });

  it('a bad option value is refused at its name (budgetMs, tenant)', async () => {
    const err = await createTools({ ...base(), budgetMs: 5, tenant: 'Acme' }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ToolsOptionError);
    expect((err as ToolsOptionError).issues.map((i) => i.path)).toEqual(
      expect.arrayContaining([['tenant'], ['budgetMs']]),
    );
  });

  it("FM-06: another tenant's seed (acme/alice's seed as globex/alice) fails fast with forbidden, saying the seed is not that tenant/actor", async () => {
    const seed = t.agentSeed('acme', 'alice');
    const err = await createTools({ ...base(), tenant: 'globex', actor: 'alice', nkeyFile: seed }).catch(
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(TooltxError);
    expect(err).toMatchObject({ class: 'forbidden', issues: [{ path: ['nkeyFile'], code: 'permission_violation' }] });
    expect((err as Error).message).toContain(`seed ${seed}) is not globex/alice`);
  });

  it("no nkeyFile against a server with auth on: TooltxError forbidden at nkeyFile saying credentials are required (not the client's raw AuthorizationError)", async () => {
    const { nkeyFile: _none, ...noSeed } = base();
    const err = await createTools(noSeed).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(TooltxError);
    expect(err).toMatchObject({
      name: 'TooltxError',
      class: 'forbidden',
      issues: [{ path: ['nkeyFile'], code: 'authorization_violation' }],
    });
    expect((err as Error).message).toContain(`the server at ${t.url} requires credentials`);
  });

  it('a seed the server does not know: TooltxError forbidden at nkeyFile naming the file', async () => {
    const stranger = join(dir, 'stranger.nk');
    writeFileSync(stranger, `${new TextDecoder().decode(createUser().getSeed())}\n`, { mode: 0o600 });
    const err = await createTools({ ...base(), nkeyFile: stranger }).catch((e: unknown) => e);
    expect(err).toMatchObject({
      name: 'TooltxError',
      class: 'forbidden',
      issues: [{ path: ['nkeyFile'], code: 'authorization_violation' }],
    });
    expect((err as Error).message).toContain(`does not know the seed in ${stranger}`);
  });

  it("a port where no server listens: TooltxError dependency_unavailable at servers naming the URL and the refusal (not the client's raw ConnectionError)", async () => {
    const closed = `nats://127.0.0.1:${await closedPort()}`;
    const err = await createTools({ ...base(), servers: closed }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(TooltxError);
    expect(err).toMatchObject({
      class: 'dependency_unavailable',
      issues: [{ path: ['servers'], code: 'unreachable' }],
    });
    expect((err as Error).message).toContain(`cannot connect to ${closed}: connection refused`);
    expect((err as Error).message).toContain('ECONNREFUSED');
    // A URL's user-info is never repeated.
    const withPassword = await createTools({ ...base(), servers: closed.replace('//', '//u:hunter2@') }).catch(
      (e: unknown) => e,
    );
    expect((withPassword as Error).message).not.toContain('hunter2');
  });

  it('servers that is not a URL: ToolsOptionError at servers', async () => {
    const err = await createTools({ ...base(), servers: 'not a url' }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ToolsOptionError);
    expect((err as ToolsOptionError).issues).toMatchObject([{ path: ['servers'], code: 'invalid_url' }]);
  });

  it('a prefix the identity is not provisioned for fails fast the same way', async () => {
    const err = await createTools({ ...base(), prefix: 'nosuchprefix' }).catch((e: unknown) => e);
    expect(err).toMatchObject({ class: 'forbidden', issues: [{ path: ['nkeyFile'] }] });
    expect((err as Error).message).toContain('under prefix nosuchprefix');
  });
});

describe('tools.execute: refusals at paths relative to the request', () => {
  it("request fields at their own names, options at the option's name", async () => {
    const r = await alice.execute({ tool: 'kb.write_note', taskId: '', input: note('Paths') }, { budgetMs: -5 });
    expect(r).toMatchObject({ status: 'rejected', next: 'replan', error: { class: 'invalid_input' } });
    if (r.status !== 'rejected') return;
    expect(r.error.issues?.map((i) => i.path)).toEqual([['taskId'], ['budgetMs']]);
    const input = await alice.execute({
      tool: 'kb.write_note',
      taskId: 'paths',
      input: { ...note('Paths'), title: 7 },
    });
    expect(input).toMatchObject({ status: 'rejected', error: { issues: [{ path: ['input', 'title'] }] } });
    const extra = await alice.execute({
      tool: 'kb.write_note',
      taskId: 'paths',
      input: note('Paths'),
      tenant: 'acme',
    } as never);
    expect(extra).toMatchObject({
      status: 'rejected',
      error: { issues: [{ path: ['tenant'], code: 'unrecognized_key' }] },
    });
  });

  it("an intent larger than the server's max_payload is rejected at input, before anything is published", async () => {
    const before = await intentsStored();
    const items = Array.from({ length: 50 }, (_, i) => ({ ...note(`Big ${i}`), body: '😀'.repeat(10_000) }));
    const r = await alice.execute({ tool: 'kb.write_notes', taskId: 'too-large', input: { items } });
    expect(r).toMatchObject({
      status: 'rejected',
      next: 'replan',
      error: { class: 'invalid_input', issues: [{ path: ['input'], code: 'too_large' }] },
    });
    if (r.status !== 'rejected') return;
    expect(r.error.issues![0]!.message).toContain(`max_payload of ${t.nc.info!.max_payload} bytes`);
    expect(await intentsStored()).toBe(before);
  });

  it("FM-06: a forged actorId is refused forbidden at actorId, by the authorizer's intake and in the SDK's answer; nothing registered", async () => {
    const r = await alice.execute({
      tool: 'kb.write_note',
      taskId: 'forged-path',
      actorId: 'bob',
      input: note('Forged'),
    });
    expect(r).toMatchObject({
      status: 'rejected',
      next: 'reauthorise',
      error: { class: 'forbidden', issues: [{ path: ['actorId'] }] },
    });
    const key = prepareCall(contracts.writeNote, 'forged-path', note('Forged')).operationKey;
    expect(await waitForDecision(t, 'acme', key, 'alice')).toMatchObject({
      error: { class: 'forbidden', issues: [{ path: ['actorId'], code: 'not_authenticated_actor' }] },
    });
    expect(await history(t, 'acme', key)).toEqual([]);
  });

  it('web.fetch_page on a loopback address is refused as invalid_input at input.url (private_address), next replan', async () => {
    const r = await alice.execute({
      tool: 'web.fetch_page',
      taskId: 'private-url',
      input: { url: 'http://127.0.0.1:4280/' },
    });
    expect(r).toMatchObject({
      status: 'rejected',
      next: 'replan',
      error: { class: 'invalid_input', issues: [{ path: ['input', 'url'], code: 'private_address' }] },
    });
  });
});

const reload = (edit: (conf: string) => string) => reloadConfig(t, edit);

describe('permissions the server withdraws later (its configuration reloaded)', () => {
  it("a refused publish of the intent is rejected forbidden at once (never stored), with the server's reason", async () => {
    const agent = await createTools({ ...base(), budgetMs: 60_000 });
    try {
      const intent = t.subjects.intent('acme', 'alice');
      await reload((c) => c.replace(`"${intent}", `, ''));
      const before = await intentsStored();
      const r = await agent.execute({ tool: 'kb.write_note', taskId: 'revoked', input: note('Revoked') });
      expect(r).toMatchObject({
        status: 'rejected',
        next: 'reauthorise',
        error: { class: 'forbidden', issues: [{ path: ['nkeyFile'], code: 'permission_violation' }] },
      });
      if (r.status === 'rejected') expect(r.error.issues![0]!.message).toContain(`refused publishing to ${intent}`);
      expect(await intentsStored()).toBe(before);
    } finally {
      await agent.close();
    }
  });

  it('a withdrawn inbox subscription ends the call at once: stored but unobservable, unknown with forbidden and next reauthorise', async () => {
    const bob = await createTools({ ...base(), actor: 'bob', nkeyFile: t.agentSeed('acme', 'bob'), budgetMs: 60_000 });
    try {
      await reload((c) =>
        c.replace('subscribe: { allow: ["_INBOX.acme.bob.>"', 'subscribe: { allow: ["_INBOX.acme.nobody.>"'),
      );
      const r = await bob.execute({ tool: 'kb.write_note', taskId: 'no-inbox', input: note('No inbox') });
      // The intent may well be stored (the server took the publish and refused only the reply's inbox):
      // unknown, not rejected — but at once, with the reason, not at the end of a 60 s budget.
      expect(r).toMatchObject({
        status: 'unknown',
        next: 'reauthorise',
        error: { class: 'forbidden', issues: [{ path: ['nkeyFile'], code: 'permission_violation' }] },
      });
      if (r.status === 'unknown') {
        expect(r.evidence.submissionIds).toHaveLength(1);
        expect(r.error!.issues![0]!.message).toContain('refused subscribing to _INBOX.acme.bob.');
        expect(r.error!.issues![0]!.message).toContain('may no longer act as acme/bob');
      }
    } finally {
      await bob.close();
    }
  });
});

describe('a key the server no longer accepts (rotated: its configuration reloaded)', () => {
  it('calls end at once with forbidden and next reauthorise, naming the seed, instead of burning their budget; nothing is stored', async () => {
    // researcher: used by no other test of this file (the rotation stays in the configuration).
    const seed = t.agentSeed('acme', 'researcher');
    const agent = await createTools({ ...base(), actor: 'researcher', nkeyFile: seed, budgetMs: 60_000 });
    try {
      const mine = t.auth.users.find((u) => u.seedFile === seed)!.publicKey;
      await reload((c) => c.replace(mine, createUser().getPublicKey()));
      const before = await intentsStored();
      let r = await agent.execute({ tool: 'kb.write_note', taskId: 'after-rotation', input: note('After') });
      // The first call may race the server's disconnect of the old key (then unknown, reauthorise);
      // once the refusal is known, a call is refused before anything is sent.
      if (r.status !== 'rejected')
        r = await agent.execute({ tool: 'kb.write_note', taskId: 'after-rotation-2', input: note('After 2') });
      expect(r).toMatchObject({
        status: 'rejected',
        next: 'reauthorise',
        error: { class: 'forbidden', issues: [{ path: ['nkeyFile'], code: 'credentials_refused' }] },
      });
      if (r.status === 'rejected') expect(r.error.issues![0]!.message).toContain(seed);
      expect(await intentsStored()).toBe(before);
    } finally {
      await agent.close();
    }
  });
});

describe('npm run quickstart that cannot set up: one line on stderr, exit 2, no stack trace', () => {
  /** `npm run quickstart` as npm runs it, with only `env` (plus PATH). */
  const quickstart = (env: Record<string, string>) =>
    new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) => {
      const child = spawn(process.execPath, ['--import', 'tsx', QUICKSTART], {
        cwd: join(dirname(QUICKSTART), '..', '..'),
        env: { PATH: process.env.PATH ?? '', ...env },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let stdout = '';
      let stderr = '';
      child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
      child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
      child.once('close', (code) => resolve({ code, stdout, stderr }));
    });
  const agentEnv = () => ({
    NATS_URL: t.url,
    TOOLTX_PREFIX: t.subjects.prefix,
    NATS_NKEY_FILE: t.agentSeed('acme', 'alice'),
    TOOLTX_RECEIPT_KEYS_FILE: t.auth.receiptKeysFile,
    KB_DEDUP: 'off',
  });

  it('NATS_URL where nothing listens: names the URL and the refusal', async () => {
    const url = `nats://127.0.0.1:${await closedPort()}`;
    const r = await quickstart({ ...agentEnv(), NATS_URL: url });
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(
      new RegExp(
        `^tooltx-quickstart: createTools: cannot connect to ${url.replace(/[.]/g, '\\.')}: connection refused[^\n]*\n$`,
      ),
    );
  });

  it('a TOOLTX_PREFIX the seed is not provisioned for: names the prefix', async () => {
    const r = await quickstart({ ...agentEnv(), TOOLTX_PREFIX: 'other' });
    expect(r.code).toBe(2);
    expect(r.stderr.trim().split('\n')).toHaveLength(1);
    expect(r.stderr).toMatch(/^tooltx-quickstart: createTools: .*prefix other/);
    expect(r.stderr).not.toMatch(/\n\s+at /);
  });

  it('no seed at all (TOOLTX_STATE_DIR without one): names nkeyFile and the path', async () => {
    const { NATS_NKEY_FILE: _seed, ...env } = agentEnv();
    const r = await quickstart({ ...env, TOOLTX_STATE_DIR: join(dir, 'no-state') });
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(
      /^tooltx-quickstart: createTools: nkeyFile: cannot read .*agent\.acme\.alice\.nk \(ENOENT\)\n$/,
    );
  });
});
