/**
 * The console (docs/console.md) in a real browser: Chromium (Debian's, driven by playwright-core)
 * against the console process on a real stack (nats-server with generated auth, the KB behind a
 * fault-injecting hop, the mail outbox, the roles). One stack and one browser for the file.
 * Logins (a wrong password refused, the session cookie HttpOnly and SameSite=Strict, a form without
 * its CSRF token refused, no session for visitors who never log in, the login limit per forwarded
 * client, cross-origin writes refused, logout), an `unknown` becoming `committed` on a live page, a
 * failed compensation's takeover resolved `effect_kept`, an unknown past its deadline resolved
 * `not_applied`, the compensation outcomes as distinct labels, an auditor of
 * another tenant who sees nothing of acme, and no canary (FM-16) in any page. Screenshots go to
 * test-output/console/ (git-ignored); their paths are printed.
 */
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { connect } from 'node:net';
import { join } from 'node:path';
import { chromium, type Browser, type BrowserContext, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { IdentityList } from '@tooltx/auth';
import { createTools, type Tools } from '@tooltx/client';
import { deriveCompensationKey, downstreamKeyOf, prepareCall } from '@tooltx/contracts';
import { HttpFaultProxy } from '@tooltx/dev/faults';
import { startStack, type Stack } from '@tooltx/dev/stack';
import { CANARY_KINDS, CanaryWeb, newCanaries, type Canaries } from '../examples/research-kb/canaries.js';
import { researchContracts } from '../examples/research-kb/contracts.js';
import { mailContracts } from '../examples/research-kb/mail-contracts.js';
import { ROOT } from './helpers/services.js';

const CHROMIUM = process.env.CHROMIUM_PATH || '/usr/bin/chromium';
/** The console's session bound here: small, so that a store anonymous visitors could fill would show. */
const MAX_SESSIONS = 8;
/** The console's default login limit, per client address and minute. */
const LOGINS_PER_MINUTE = 20;
const SHOTS = join(ROOT, 'test-output', 'console');
const IDENTITIES: IdentityList = {
  tenants: [
    { id: 'acme', actors: ['alice'], auditors: ['audrey'] },
    { id: 'globex', actors: ['gina'], auditors: ['gus'] },
  ],
  operators: [{ id: 'oscar', may: ['compensate', 'confirm', 'query', 'contracts'] }, 'olga'],
};

let dir: string;
let stack: Stack;
let hop: HttpFaultProxy;
let web: CanaryWeb;
let consoleUrl: string;
let browser: Browser;
let operator: BrowserContext;
let alice: Tools;
let gina: Tools;
let canaries: Canaries;
/** Probe paths the hop cuts (an outcome kept unknown until the test lets it through). */
const blocked = new Set<string>();
const contracts = researchContracts({ kbDedup: true });
const mail = mailContracts({ mailDedup: true });

const password = (user: string) =>
  readFileSync(join(dir, 'auth', 'console', 'passwords', `${user}.password`), 'utf8').trim();
const note = (title: string, body = `Notes on ${title}.`) => ({
  kb: 'research',
  title,
  body,
  sourceUrl: 'https://example.org/src',
  fetchedAt: '2026-12-01T06:00:00Z',
});
const keyOf = (taskId: string, title: string) => prepareCall(contracts.writeNote, taskId, note(title)).operationKey;
/** The KB's probe by key, which the hop cuts while the path is in `blocked`. */
const probePath = (downstreamKey: string) => `/v1/notes/by-key/${encodeURIComponent(downstreamKey)}`;
const STUCK_TITLE = 'Never arrived';
const STUCK_KEY = keyOf('console-stuck', STUCK_TITLE);
const deleteKeyOf = (key: string) => deriveCompensationKey(key, { tool: 'kb.delete_note', version: 1 });

async function shot(page: Page, name: string, fullPage = false): Promise<void> {
  const file = join(SHOTS, `${name}.png`);
  await page.screenshot({ path: file, fullPage });
  process.stdout.write(`console screenshot: ${file}\n`);
}

async function logIn(context: BrowserContext, login: string, pw: string): Promise<Page> {
  const page = await context.newPage();
  await page.goto(`${consoleUrl}/login`);
  await page.fill('input[name=login]', login);
  await page.fill('input[name=password]', pw);
  await page.click('button[type=submit]');
  return page;
}

/** `tooltx ops …` as an operator: exit code, stdout lines, stderr. */
function opsCli(operator: string, ...args: string[]): Promise<{ code: number; lines: string[]; stderr: string }> {
  return new Promise((resolve) =>
    execFile(
      process.execPath,
      ['--import', 'tsx', 'bin/tooltx.ts', 'ops', ...args],
      {
        cwd: ROOT,
        env: {
          PATH: process.env.PATH ?? '',
          NATS_URL: stack.natsUrl,
          TOOLTX_PREFIX: stack.prefix,
          NATS_NKEY_FILE: stack.seedFile({ kind: 'operator', operator }),
          TOOLTX_OPERATOR: operator,
        },
      },
      (err, out, stderr) =>
        resolve({
          code: err ? ((err as { code?: number }).code ?? 1) : 0,
          lines: out.split('\n').filter(Boolean),
          stderr,
        }),
    ),
  );
}

/** Every canary found in `html`. */
const leaks = (html: string) => CANARY_KINDS.filter((k) => html.includes(canaries[k]));

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'tooltx-console-'));
  mkdirSync(SHOTS, { recursive: true });
  canaries = newCanaries();
  web = await new CanaryWeb(canaries).start();
  stack = await startStack({
    stateDir: dir,
    identities: IDENTITIES,
    natsPort: -1,
    prefix: 'tconsole',
    kbPort: 0,
    kbDedup: true,
    kbSeed: 'acme:research,globex:research',
    kbAdminToken: canaries.token,
    layout: 'colocated',
    console: { port: 0 },
    logs: { dir: join(dir, 'logs') },
    kbHop: async (kbUrl) => {
      hop = await new HttpFaultProxy(kbUrl).start();
      hop.drop = (req) => req.method === 'GET' && blocked.has(req.url ?? '');
      return hop.url;
    },
    env: {
      KB_KEEPALIVE: 'off',
      TOOLTX_RECONCILE_INTERVAL_MS: '300',
      // Records at once: the pages show an operation as soon as its event is in the log.
      TOOLTX_AUDIT_BATCH_MS: '0',
      TOOLTX_CONSOLE_REFRESH_MS: '500',
      // An auditor's every read is recorded in the audit log: their pages poll less often.
      TOOLTX_CONSOLE_AUDITOR_REFRESH_MS: '1000',
      TOOLTX_CONSOLE_MAX_SESSIONS: String(MAX_SESSIONS),
      // kb.write_note's unknown deadline cut to 20 s (timeout and running bound as by default): an
      // unknown started in beforeAll is taken over while the other tests run (its test is the last).
      KB_TIMING_MS: '5000,15000,20000',
      // The test's requests come from 127.0.0.1: it plays the TLS proxy in front of the console.
      TOOLTX_CONSOLE_TRUST_PROXY: '127.0.0.1',
      WEB_ALLOWED_ORIGINS: web.url,
    },
  });
  consoleUrl = stack.console!.url;
  const agent = (tenant: string, actor: string) =>
    createTools({
      servers: stack.natsUrl,
      tenant,
      actor,
      nkeyFile: stack.seedFile({ kind: 'agent', tenant, actor }),
      contracts: [...contracts.all, ...mail.all],
      prefix: stack.prefix,
      receiptKeys: stack.receiptKeysFile,
      budgetMs: 4_000,
    });
  [alice, gina] = await Promise.all([agent('acme', 'alice'), agent('globex', 'gina')]);
  // An operation for the takeover queue: every attempt's request is cut before it reaches the KB and
  // every probe by its key is cut, so it stays unknown until its deadline opens a takeover.
  const stuck = downstreamKeyOf('acme', STUCK_KEY);
  blocked.add(probePath(stuck));
  hop.inject(stuck, { kind: 'drop' }, { times: Number.POSITIVE_INFINITY });
  void alice
    .execute({ tool: 'kb.write_note', taskId: 'console-stuck', input: note(STUCK_TITLE) }, { budgetMs: 1_000 })
    .catch(() => undefined);
  // playwright-core gives the browser a fresh --user-data-dir of its own (a temporary profile).
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
  operator = await browser.newContext({ viewport: { width: 1280, height: 800 } });
}, 120_000);

afterAll(async () => {
  blocked.clear();
  await browser?.close();
  await Promise.all([alice?.close(), gina?.close()]);
  await stack?.stop();
  // The console drained on the stack's SIGTERM: its last line says so.
  if (stack) expect(readFileSync(join(dir, 'logs', 'console.log'), 'utf8')).toMatch(/"msg":"stopped"/);
  await hop?.stop();
  await web?.stop();
  if (dir && existsSync(dir)) rmSync(dir, { recursive: true, force: true });
}, 60_000);

describe('console', () => {
  it('console: a wrong password is refused; an operator logs in with an HttpOnly, SameSite=Strict session; a form without its CSRF token is refused', async () => {
    const anon = await browser.newContext();
    const page = await anon.newPage();
    // No anonymous access: every page sends to the login.
    await page.goto(`${consoleUrl}/operations`);
    expect(new URL(page.url()).pathname).toBe('/login');
    await page.fill('input[name=login]', 'oscar');
    await page.fill('input[name=password]', `${password('operator.oscar')}x`);
    const [refused] = await Promise.all([
      page.waitForResponse((r) => r.url().endsWith('/login') && r.request().method() === 'POST'),
      page.click('button[type=submit]'),
    ]);
    expect(refused.status()).toBe(401);
    await expect(page.locator('#login-error').textContent()).resolves.toContain('Wrong login or password');
    await shot(page, 'login-refused');
    await anon.close();

    const op = await logIn(operator, 'oscar', password('operator.oscar'));
    expect(new URL(op.url()).pathname).toBe('/operations');
    await expect(op.locator('.who').getAttribute('data-who')).resolves.toBe('oscar');
    await expect(op.locator('#live').getAttribute('data-refresh-ms')).resolves.toBe('500');
    const cookie = (await operator.cookies()).find((c) => c.name === 'tooltx_console');
    expect(cookie).toMatchObject({ httpOnly: true, sameSite: 'Strict' });
    // A filter that is not one: refused with the field's path.
    const bad = await op.goto(`${consoleUrl}/operations?since=yesterday`);
    expect(bad?.status()).toBe(400);
    await expect(op.locator('#error').getAttribute('data-class')).resolves.toBe('invalid_input');
    await expect(op.locator('#issues li[data-path=since]').count()).resolves.toBe(1);
    // A write without the form's token, with the session cookie: refused, nothing done.
    const forged = await op.request.post(`${consoleUrl}/takeovers/resolve`, {
      form: { tenant: 'acme', operationKey: `opk_${'A'.repeat(43)}`, outcome: 'not_applied' },
      maxRedirects: 0,
    });
    expect(forged.status()).toBe(403);
    await op.close();
    // Bodies refused before any handler, by anyone: the caller's error, never a 500.
    const tooBig = await fetch(`${consoleUrl}/takeovers/resolve`, { method: 'POST', body: 'a'.repeat(100_000) });
    expect(tooBig.status).toBe(413);
    const notJson = await fetch(`${consoleUrl}/logout`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: '{bad',
    });
    expect(notJson.status).toBe(400);
  });

  it('console: no anonymous request evicts a logged-in session; the login limit counts the client a trusted proxy forwards; logout clears the cookie', async () => {
    // Login forms, unknown paths and refused logins, three times the session store's bound, by
    // visitors who never log in: none of them is given a session.
    for (let i = 0; i < 3 * MAX_SESSIONS; i++) {
      for (const [path, status] of [
        ['/login', 200],
        [`/no-such-page-${i}`, 404],
      ] as const) {
        const r = await fetch(`${consoleUrl}${path}`, { redirect: 'manual' });
        expect(r.status).toBe(status);
        expect(r.headers.getSetCookie().filter((c) => c.startsWith('tooltx_console='))).toEqual([]);
        const html = await r.text();
        // An unknown path gets the console's page, which offers a login, not the operations.
        if (status === 404) expect(html).toMatch(/href="\/login"[\s\S]*$/);
      }
    }
    // The operator logged in before them still is.
    const op = await operator.newPage();
    await op.goto(`${consoleUrl}/operations`);
    expect(new URL(op.url()).pathname).toBe('/operations');
    await op.close();

    // Behind the proxy, each client's attempts are its own: one client guessing is limited, the
    // next is not. (These carry no CSRF token: refused 403, and counted all the same.)
    const attempt = (client: string) =>
      fetch(`${consoleUrl}/login`, {
        method: 'POST',
        headers: { 'x-forwarded-for': client, 'content-type': 'application/x-www-form-urlencoded' },
        body: 'login=oscar&password=guess&_csrf=none',
        redirect: 'manual',
      }).then(async (r) => {
        await r.text();
        return r.status;
      });
    const codes: number[] = [];
    for (let i = 0; i <= LOGINS_PER_MINUTE; i++) codes.push(await attempt('203.0.113.7'));
    expect(codes).toEqual([...Array<number>(LOGINS_PER_MINUTE).fill(403), 429]);
    expect(await attempt('203.0.113.8')).toBe(403);
    // The refusal's log line names the client.
    const logFile = join(dir, 'logs', 'console.log');
    await expect
      .poll(() =>
        readFileSync(logFile, 'utf8')
          .split('\n')
          .some((l) => l.includes('"class":"quota_exceeded"') && l.includes('"client":"203.0.113.7"')),
      )
      .toBe(true);

    // A write a browser marks as from another origin (a sibling port or subdomain that planted the
    // login form's cookie) is refused, even with a valid token; the same from the console's page
    // logs in.
    const form = await fetch(`${consoleUrl}/login`);
    const loginCookie = form.headers
      .getSetCookie()
      .map((c) => c.split(';')[0])
      .join('; ');
    const token = /name="_csrf" value="([^"]+)"/.exec(await form.text())?.[1] ?? '';
    const login = (site: string) =>
      fetch(`${consoleUrl}/login`, {
        method: 'POST',
        headers: { cookie: loginCookie, 'sec-fetch-site': site, 'content-type': 'application/x-www-form-urlencoded' },
        body: new URLSearchParams({ _csrf: token, login: 'oscar', password: password('operator.oscar') }).toString(),
        redirect: 'manual',
      });
    const tossed = await login('same-site');
    expect(tossed.status).toBe(403);
    expect(await tossed.text()).toContain('cross_origin');
    const ours = await login('same-origin');
    expect(ours.status).toBe(303);
    expect(ours.headers.getSetCookie().some((c) => c.startsWith('tooltx_console='))).toBe(true);

    // Requests fastify would answer on its own get the console's page and headers; an absolute-form
    // request line is refused; a body its client abandons is the client's error, never logged as
    // the console's.
    const badUrl = await fetch(`${consoleUrl}/operations/%E0%A4%A`);
    expect(badUrl.status).toBe(400);
    expect(badUrl.headers.get('content-type')).toMatch(/^text\/html/);
    expect(badUrl.headers.get('content-security-policy')).toContain("default-src 'none'");
    const port = Number(new URL(consoleUrl).port);
    const raw = (bytes: string, abandon = false) =>
      new Promise<string>((resolve) => {
        let got = '';
        const sock = connect(port, '127.0.0.1', () => {
          sock.write(bytes);
          if (abandon) setTimeout(() => sock.destroy(), 200);
        });
        sock.on('data', (d) => {
          got += d.toString();
        });
        sock.on('close', () => resolve(got));
        sock.on('error', () => undefined);
      });
    const absolute = await raw(
      `POST ${consoleUrl}/login HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n`,
    );
    expect(absolute).toMatch(/^HTTP\/1\.1 400/);
    const logoutLines = () =>
      readFileSync(logFile, 'utf8')
        .split('\n')
        .filter((l) => l.includes('"route":"/logout"'));
    const before = logoutLines().length;
    await raw(
      'POST /logout HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\n_csrf=x',
      true,
    );
    await expect.poll(() => logoutLines().length).toBeGreaterThan(before);
    expect(
      readFileSync(logFile, 'utf8')
        .split('\n')
        .filter((l) => l.includes('"level":50')),
    ).toEqual([]);

    // Logging out ends the session on the server and removes the cookie from the browser.
    const leaving = await browser.newContext();
    const page = await logIn(leaving, 'oscar', password('operator.oscar'));
    expect((await leaving.cookies()).map((c) => c.name)).toContain('tooltx_console');
    await page.click('form[action="/logout"] button[type=submit]');
    expect(new URL(page.url()).pathname).toBe('/login');
    expect((await leaving.cookies()).map((c) => c.name)).not.toContain('tooltx_console');
    await leaving.close();
  });

  it('console: an unknown operation becomes committed on the live timeline, its receipt signature checked', async () => {
    const title = 'Cut after the commit';
    const key = keyOf('console-unknown', title);
    const dk = downstreamKeyOf('acme', key);
    // The KB commits, the executor's connection is cut before the answer (unknown), and every probe
    // by key is cut until the page has shown it unknown.
    blocked.add(probePath(dk));
    hop.inject(dk, { kind: 'cut_response' });
    void alice.execute({ tool: 'kb.write_note', taskId: 'console-unknown', input: note(title) }).catch(() => undefined);
    const page = await operator.newPage();
    await page.goto(`${consoleUrl}/operations?state=unknown`);
    await page.locator(`#operations tr[data-key="${key}"] [data-status=unknown]`).waitFor({ timeout: 20_000 });
    await page.goto(`${consoleUrl}/operations/acme/${key}`);
    await page.locator('#state [data-status=unknown]').waitFor();
    // The probe gets through: the reconciler finds the note under the key and commits it; the page,
    // left open, shows it.
    blocked.delete(probePath(dk));
    await page.locator('#state [data-status=committed]').waitFor({ timeout: 30_000 });
    await page.locator('#receipt-check[data-valid=true]').waitFor({ timeout: 10_000 });
    await expect(page.locator('#events').textContent()).resolves.toMatch(/unknown[\s\S]*committed/);
    await shot(page, 'timeline-committed', true);
    await page.close();
  });

  it('console: a failed compensation is taken over and resolved effect_kept from the takeover queue', async () => {
    const title = 'Refused delete';
    const w = await alice.execute({ tool: 'kb.write_note', taskId: 'console-failed', input: note(title) });
    expect(w.status).toBe('committed');
    hop.inject(downstreamKeyOf('acme', deleteKeyOf(w.operationKey!)), {
      kind: 'refuse',
      status: 409,
      body: { error: 'frozen' },
    });
    const c = await alice.compensate({ operationKey: w.operationKey!, reason: 'withdrawn' });
    expect(c.status).toBe('compensation_failed');
    const page = await operator.newPage();
    await page.goto(`${consoleUrl}/takeovers`);
    const row = page.locator(`#takeovers tr[data-key="${w.operationKey!}"]`);
    await row.waitFor({ timeout: 20_000 });
    // A failed compensation offers its two outcomes only (an unknown's are committed / not applied).
    await expect(row.locator('button[value=effect_kept]').count()).resolves.toBe(1);
    await expect(row.locator('button[value=undone_by_hand]').count()).resolves.toBe(1);
    await expect(row.locator('button[value=committed]').count()).resolves.toBe(0);
    await shot(page, 'takeovers');
    // The takeover service's rules hold through the console: an unknown's outcome does not resolve
    // a failed compensation (400, outcome.kind).
    const csrf = (await row.locator('input[name=_csrf]').first().getAttribute('value')) ?? '';
    const mismatch = await page.request.post(`${consoleUrl}/takeovers/resolve`, {
      form: { _csrf: csrf, tenant: 'acme', operationKey: w.operationKey!, outcome: 'not_applied' },
      maxRedirects: 0,
    });
    expect(mismatch.status()).toBe(400);
    expect(await mismatch.text()).toMatch(/data-path="outcome\.kind"[^>]*>.*outcome_mismatch/s);
    await Promise.all([page.waitForURL(/resolved=1/), row.locator('button[value=effect_kept]').click()]);
    await expect(page.locator('#notice').textContent()).resolves.toContain('Resolution recorded');
    await page.locator('#state [data-status=compensation_failed]').waitFor();
    await expect(page.locator('dl.compensation').textContent()).resolves.toContain('effect_kept by oscar');
    await shot(page, 'takeover-resolved', true);
    await page.goto(`${consoleUrl}/takeovers`);
    await expect(page.locator(`#takeovers tr[data-key="${w.operationKey!}"]`).count()).resolves.toBe(0);
    await page.close();
  });

  it('console: rolled back, compensation requested, compensated and compensation failed are distinct labels', async () => {
    // Rolled back: a held-back mail discarded before it ran.
    const held = await alice.execute({
      tool: 'mail.send_draft',
      taskId: 'console-digest',
      input: { to: ['team@example.org'], subject: 'Digest', body: 'Two notes.' },
    });
    expect(held.status).toBe('awaiting_confirmation');
    expect((await alice.discard({ operationKey: held.operationKey! })).status).toBe('rolled_back');
    // Compensated.
    const done = await alice.execute({ tool: 'kb.write_note', taskId: 'console-comp', input: note('To delete') });
    expect((await alice.compensate({ operationKey: done.operationKey!, reason: 'withdrawn' })).status).toBe(
      'compensated',
    );
    // Compensation requested: its delete never reaches the KB, nor any probe of it, while we look.
    const pending = await alice.execute({ tool: 'kb.write_note', taskId: 'console-req', input: note('Slow delete') });
    const dk = downstreamKeyOf('acme', deleteKeyOf(pending.operationKey!));
    const deleteProbe = `/v1/deletes/by-key/${encodeURIComponent(dk)}`;
    blocked.add(deleteProbe);
    const dropped = hop.inject(dk, { kind: 'drop' }, { times: Number.POSITIVE_INFINITY });
    void alice.compensate({ operationKey: pending.operationKey!, reason: 'withdrawn' }).catch(() => undefined);
    const page = await operator.newPage();
    await page.goto(`${consoleUrl}/operations?tenant=acme`);
    const label = (key: string, status: string) =>
      page.locator(`#operations tr[data-key="${key}"] [data-status=${status}]`);
    await label(pending.operationKey!, 'compensation_requested').waitFor({ timeout: 20_000 });
    await label(held.operationKey!, 'rolled_back').waitFor({ timeout: 10_000 });
    await label(done.operationKey!, 'compensated').waitFor({ timeout: 10_000 });
    await page.locator('#operations [data-status=compensation_failed]').first().waitFor({ timeout: 10_000 });
    const texts = new Map<string, string>();
    for (const s of ['rolled_back', 'compensation_requested', 'compensated', 'compensation_failed'])
      texts.set(s, ((await page.locator(`#operations [data-status=${s}]`).first().textContent()) ?? '').trim());
    expect(Object.fromEntries(texts)).toEqual({
      rolled_back: 'rolled back',
      compensation_requested: 'compensation requested',
      compensated: 'compensated',
      compensation_failed: 'compensation failed',
    });
    await shot(page, 'compensation-outcomes');
    dropped.cancel();
    // Only this test's probe: the stuck write's stays cut until its takeover is resolved.
    blocked.delete(deleteProbe);
    await page.close();
  });

  it("console: an auditor of another tenant sees nothing of acme, and an auditor cannot act nor open the operators' pages", async () => {
    const g = await gina.execute({ tool: 'kb.write_note', taskId: 'console-globex', input: note('Globex note') });
    expect(g.status).toBe('committed');
    const acmeKey = keyOf('console-unknown', 'Cut after the commit');
    const context = await browser.newContext();
    const page = await logIn(context, 'globex/gus', password('auditor.globex.gus'));
    await page.locator(`#operations tr[data-key="${g.operationKey!}"]`).waitFor({ timeout: 20_000 });
    const tenants = await page
      .locator('#operations tr[data-tenant]')
      .evaluateAll((rows) => rows.map((r) => r.getAttribute('data-tenant')));
    expect(new Set(tenants)).toEqual(new Set(['globex']));
    expect(await page.content()).not.toContain(acmeKey);
    await expect(page.locator('#live').getAttribute('data-refresh-ms')).resolves.toBe('1000');
    await shot(page, 'auditor-globex');
    // Asking for acme by hand: nothing.
    await page.goto(`${consoleUrl}/operations?tenant=acme`);
    await expect(page.locator('#operations tr[data-tenant=acme]').count()).resolves.toBe(0);
    const timeline = await page.goto(`${consoleUrl}/operations/acme/${acmeKey}`);
    expect(timeline?.status()).toBe(404);
    expect(await page.content()).not.toContain('Cut after the commit');
    // No takeover queue, no resolution: an auditor reads only.
    expect((await page.goto(`${consoleUrl}/contracts`))?.status()).toBe(403);
    expect((await page.goto(`${consoleUrl}/takeovers`))?.status()).toBe(403);
    const csrf = await page.locator('input[name=_csrf]').first().getAttribute('value');
    const act = await page.request.post(`${consoleUrl}/takeovers/resolve`, {
      form: { _csrf: csrf ?? '', tenant: 'globex', operationKey: g.operationKey!, outcome: 'not_applied' },
      maxRedirects: 0,
    });
    expect(act.status()).toBe(403);
    await context.close();
  });

  it('console: tooltx ops list and show read the same operations query, which only an operator granted query may use', async () => {
    const key = keyOf('console-unknown', 'Cut after the commit');
    const [list, shown, olga] = await Promise.all([
      opsCli('oscar', 'list', '--tenant', 'acme', '--state', 'committed', '--contract', 'kb.write_note@1'),
      opsCli('oscar', 'show', key, '--tenant', 'acme'),
      opsCli('olga', 'list'),
    ]);
    expect(list.code).toBe(0);
    const records = list.lines.map((l) => JSON.parse(l) as { operationKey: string; tenant: string; status: string });
    expect(records.map((r) => r.operationKey)).toContain(key);
    expect(records.every((r) => r.tenant === 'acme' && r.status === 'committed')).toBe(true);
    expect(shown.code).toBe(0);
    expect(JSON.parse(shown.lines.join('\n'))).toMatchObject({ operationKey: key, status: 'committed' });
    // An operator without the grant: the server refuses the subject.
    expect(olga.code).toBe(1);
    expect(olga.stderr).toContain('not granted query');
    // In the console, the same operator is told which grant is missing, with no link back to the
    // page that was refused (it looped), and can log out.
    const context = await browser.newContext();
    const page = await logIn(context, 'olga', password('operator.olga'));
    await page.waitForURL(/\/operations/);
    expect((await page.goto(`${consoleUrl}/operations`))?.status()).toBe(403);
    await expect(page.locator('#error').getAttribute('data-class')).resolves.toBe('forbidden');
    const issue = await page.locator('#issues li').first().textContent();
    expect(issue).toContain('not_granted');
    expect(issue).toContain('olga is not granted "query"');
    await expect(page.locator('main a[href="/operations"]').count()).resolves.toBe(0);
    await expect(page.locator('form[action="/logout"] button').count()).resolves.toBe(1);
    await context.close();
  });

  it('console: the Contracts page lists every registered version with its current marker, whether a running executor holds it, state and usage', async () => {
    const page = await operator.newPage();
    await page.goto(`${consoleUrl}/contracts`);
    const write = page.locator('#contracts tr[data-contract="kb.write_note@1"]');
    await expect(write.getAttribute('data-current')).resolves.toBe('1');
    await expect(write.getAttribute('data-state')).resolves.toBe('active');
    // The writes of this file are counted: operations, tasks and actors on that version.
    const cells = await write.locator('td').allTextContents();
    expect(Number(cells[5])).toBeGreaterThan(0);
    expect(Number(cells[7])).toBeGreaterThan(0);
    // The running executor holds it: a revert could make it current.
    await expect(write.locator('td.held').textContent()).resolves.toBe('yes');
    // One current version per name.
    const contracts = await page
      .locator('#contracts tr[data-contract]')
      .evaluateAll((rows) => rows.map((r) => [r.getAttribute('data-contract'), r.getAttribute('data-current')]));
    const names = new Set(contracts.map(([c]) => c!.slice(0, c!.lastIndexOf('@'))));
    expect(contracts.filter(([, cur]) => cur === '1').length).toBe(names.size);
    await shot(page, 'contracts');
    await page.close();
  });

  it('console: no canary appears in any page an operator or an auditor sees', async () => {
    // FM-16's canaries: the KB's operator token (the stack's), a note body, a page's text and its
    // cookie, a downstream's error message.
    const secret = await alice.execute({
      tool: 'kb.write_note',
      taskId: 'console-canary',
      input: note('Private', `Private observation: ${canaries.noteBody}.`),
    });
    expect(secret.status).toBe('committed');
    const fetched = await alice.execute({
      tool: 'web.fetch_page',
      taskId: 'console-canary',
      input: { url: web.pageUrl },
    });
    expect(fetched.status).toBe('committed');
    const failed = await alice.execute(
      { tool: 'web.fetch_page', taskId: 'console-canary', input: { url: web.flakyUrl } },
      { budgetMs: 1_000 },
    );
    expect(failed.status).not.toBe('committed');
    const keys = [secret.operationKey!, fetched.operationKey!, failed.operationKey!];
    const audrey = await browser.newContext();
    const seen: { who: string; path: string; found: string[] }[] = [];
    for (const [context, who] of [
      [operator, 'oscar'],
      [audrey, 'acme/audrey'],
    ] as const) {
      const page =
        who === 'oscar' ? await context.newPage() : await logIn(context, who, password('auditor.acme.audrey'));
      const paths = ['/operations', ...keys.map((k) => `/operations/acme/${k}`)];
      if (who === 'oscar') paths.push('/takeovers', '/contracts');
      for (const path of paths) {
        await page.goto(`${consoleUrl}${path}`);
        if (path === '/operations')
          await page.locator(`#operations tr[data-key="${failed.operationKey!}"]`).waitFor({ timeout: 20_000 });
        seen.push({ who, path, found: leaks(await page.content()) });
      }
      if (who === 'acme/audrey') await shot(page, 'auditor-acme-timeline');
    }
    expect(seen.filter((s) => s.found.length > 0)).toEqual([]);
    expect(seen.length).toBe(10);
    await audrey.close();
  });
  it('console: an unknown operation past its deadline is taken over and resolved not_applied from the takeover queue; committed without the resource id found downstream is refused', async () => {
    const page = await operator.newPage();
    await page.goto(`${consoleUrl}/takeovers`);
    const row = page.locator(`#takeovers tr[data-key="${STUCK_KEY}"]`);
    try {
      await row.waitFor({ timeout: 50_000 });
    } catch (err) {
      // What the operation and the queue showed, for whoever reads the failure.
      const p2 = await operator.newPage();
      await p2.goto(`${consoleUrl}/operations/acme/${STUCK_KEY}`);
      process.stdout.write(
        `${JSON.stringify({
          state: await p2
            .locator('#state')
            .textContent()
            .catch(() => null),
          events: await p2
            .locator('#events')
            .textContent()
            .catch(() => null),
          takeovers: await page
            .locator('#takeovers')
            .textContent()
            .catch(() => null),
          hop: hop.injected.slice(-20),
        })}\n`,
      );
      throw err;
    }
    // An unknown's two outcomes only.
    await expect(row.locator('button[value=committed]').count()).resolves.toBe(1);
    await expect(row.locator('button[value=not_applied]').count()).resolves.toBe(1);
    await expect(row.locator('button[value=effect_kept]').count()).resolves.toBe(0);
    const [refused] = await Promise.all([
      page.waitForResponse((r) => r.url().endsWith('/takeovers/resolve')),
      row.locator('button[value=committed]').click(),
    ]);
    expect(refused.status()).toBe(400);
    await expect(page.locator('#issues li[data-path=resourceId]').count()).resolves.toBe(1);
    // The request never reached the KB: not applied.
    await page.goto(`${consoleUrl}/takeovers`);
    await Promise.all([page.waitForURL(/resolved=1/), row.locator('button[value=not_applied]').click()]);
    await page.locator('#state [data-status=rejected]').waitFor();
    await expect(page.locator('#events').textContent()).resolves.toMatch(
      /unknown[\s\S]*not_applied[\s\S]*operator oscar/,
    );
    await shot(page, 'takeover-unknown-resolved', true);
    await page.goto(`${consoleUrl}/takeovers`);
    await expect(page.locator(`#takeovers tr[data-key="${STUCK_KEY}"]`).count()).resolves.toBe(0);
    await page.close();
  });
});
