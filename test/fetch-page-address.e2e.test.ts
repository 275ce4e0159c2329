/**
 * `web.fetch_page` connects to public addresses only (anything else would be SSRF into the trusted
 * network). The URL's host is resolved and refused when ANY address it resolves to is loopback,
 * private, link-local, unspecified, multicast or IPv4-mapped non-public — not only when its text
 * spells one — and the connection is made only to an address the same check passed at connect time
 * (DNS rebinding). Real parts: a real nats-server with auth on, the authorizer and executor as
 * processes loading the research sample's trusted module, a real HTTP server on the machine's own
 * addresses standing in for the KB's stats endpoint, and the system resolver (/etc/hosts).
 */
import { lookup } from 'node:dns/promises';
import { readFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { hostname } from 'node:os';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { fetch } from 'undici';
import type { Tools } from '@tooltx/client';
import { provisioned, type TestNats } from './helpers/nats.js';
import { RESEARCH_TOOLS } from './helpers/kb.js';
import { startService, type ServiceProcess } from './helpers/services.js';
import { researchContracts } from '../examples/research-kb/contracts.js';
import { isPublicAddress, PrivateAddressError, publicOnlyDispatcher } from '../examples/research-kb/public-address.js';

const contracts = researchContracts({ kbDedup: false });
let t: TestNats;
let procs: ServiceProcess[] = [];
let alice: Tools;
/** The local server an agent must not reach (stands in for the KB's /v1/stats), and what it was asked. */
let internal: Server;
let internalPort: number;
const internalHits: string[] = [];
/** A local server whose origin the operator allowed (by host name): reachable as configured. */
let allowed: Server;
let allowedPort: number;
/** A host name other than `localhost` that resolves to loopback addresses only on this machine. */
let loopName: string | undefined;

/** A name that resolves to loopback only: the machine's host name, else an alias of loopback in /etc/hosts. */
async function findLoopbackName(): Promise<string | undefined> {
  let aliases: string[] = [];
  try {
    aliases = readFileSync('/etc/hosts', 'utf8')
      .split('\n')
      .map((l) => l.replace(/#.*/, '').trim().split(/\s+/))
      .filter(([addr]) => addr === '127.0.0.1' || addr === '::1')
      .flatMap(([, ...names]) => names);
  } catch {
    // no hosts file
  }
  for (const name of [hostname(), ...aliases]) {
    if (!name || /^localhost$|\.localhost$/i.test(name) || name.includes('localhost')) continue;
    const addrs = await lookup(name, { all: true }).catch(() => []);
    if (addrs.length > 0 && addrs.every((a) => a.address.startsWith('127.') || a.address === '::1')) return name;
  }
  return undefined;
}

async function listen(handler: Parameters<typeof createServer>[1]): Promise<[Server, number]> {
  const s = createServer(handler);
  // Dual stack: reachable as 127.0.0.1, ::1 and the unspecified address alike.
  await new Promise<void>((r) => s.listen(0, '::', r));
  return [s, (s.address() as AddressInfo).port];
}

beforeAll(async () => {
  loopName = await findLoopbackName();
  [internal, internalPort] = await listen((req, res) => {
    internalHits.push(req.url ?? '');
    res.writeHead(200, { 'content-type': 'text/markdown' }).end('# KB stats\n\nrows: 42 per tenant');
  });
  [allowed, allowedPort] = await listen((_req, res) =>
    res.writeHead(200, { 'content-type': 'text/markdown' }).end('# Allowed page\n\nAn operator allowed this origin.'),
  );
  t = await provisioned();
  const env = {
    ...t.env,
    TOOLTX_TOOLS_MODULE: RESEARCH_TOOLS,
    KB_URL: 'http://127.0.0.1:9',
    // Allowed by name: the name resolves to loopback, and the operator said this origin is fine.
    WEB_ALLOWED_ORIGINS: loopName ? `http://${loopName}:${allowedPort}` : '',
  };
  procs = await Promise.all([startService('authorizer', env), startService('executor', env)]);
  alice = await t.agentTools('acme', 'alice', contracts.all, {
    budgetMs: 15_000,
  });
});

afterAll(async () => {
  await alice?.close();
  const codes = await Promise.all(procs.map((p) => p.stop()));
  await t?.close();
  for (const s of [internal, allowed]) {
    s?.closeAllConnections();
    await new Promise((r) => (s ? s.close(r) : r(undefined)));
  }
  await publicOnlyDispatcher.close();
  expect(codes).toEqual(procs.map(() => 0));
});

const refusal = {
  status: 'rejected',
  next: 'replan',
  error: { class: 'invalid_input', issues: [{ path: ['input', 'url'], code: 'private_address' }] },
};

describe('web.fetch_page refuses every host that is or resolves to a non-public address', () => {
  it("a host name resolving to 127.0.0.1 (the machine's own name, as in /etc/hosts) is refused private_address; the local server is never asked", async (ctx) => {
    if (!loopName)
      return ctx.skip(
        'no host name other than localhost resolves to loopback only on this machine (hostname and /etc/hosts checked)',
      );
    const before = internalHits.length;
    const r = await alice.execute({
      tool: 'web.fetch_page',
      taskId: 'ssrf-name',
      input: { url: `http://${loopName}:${internalPort}/v1/stats` },
    });
    expect(r).toMatchObject(refusal);
    // Another case of the name: the resolver answers the same, so does the check.
    const upper = await alice.execute({
      tool: 'web.fetch_page',
      taskId: 'ssrf-name-upper',
      input: { url: `http://${loopName.toUpperCase()}:${internalPort}/v1/stats` },
    });
    expect(upper).toMatchObject(refusal);
    expect(internalHits.length).toBe(before);
  });

  it('the unspecified address in any spelling ([::], [0:0:0:0:0:0:0:0], 0.0.0.0) and IPv4-mapped loopback are refused; nothing reaches the server', async () => {
    const before = internalHits.length;
    for (const [i, host] of [
      '[::]',
      '[0:0:0:0:0:0:0:0]',
      '0.0.0.0',
      '[::ffff:127.0.0.1]',
      '[::1]',
      '127.0.0.1',
      '2130706433',
      '0x7f000001',
      'localhost',
    ].entries()) {
      const r = await alice.execute({
        tool: 'web.fetch_page',
        taskId: `ssrf-literal-${i}`,
        input: { url: `http://${host}:${internalPort}/v1/stats` },
      });
      expect(r, host).toMatchObject(refusal);
    }
    expect(internalHits.length).toBe(before);
  });

  it("an origin in WEB_ALLOWED_ORIGINS is fetched even though its name resolves to loopback (the operator's exception, by origin)", async (ctx) => {
    if (!loopName) return ctx.skip('no host name other than localhost resolves to loopback only on this machine');
    const r = await alice.execute<{ title: string }>({
      tool: 'web.fetch_page',
      taskId: 'allowed-by-name',
      input: { url: `http://${loopName}:${allowedPort}/page` },
    });
    expect(r).toMatchObject({ status: 'committed', result: { title: 'Allowed page' } });
    // The same host on another port is another origin: refused.
    const other = await alice.execute({
      tool: 'web.fetch_page',
      taskId: 'allowed-other-port',
      input: { url: `http://${loopName}:${internalPort}/page` },
    });
    expect(other).toMatchObject(refusal);
  });
});

describe('the connection goes only to an address the check passed (DNS rebinding)', () => {
  it('the fetch dispatcher resolves again at connect time and refuses a name that now resolves to loopback: nothing is sent', async (ctx) => {
    if (!loopName) return ctx.skip('no host name other than localhost resolves to loopback only on this machine');
    // What a rebinding name looks like at connect time: it passed a check earlier, resolves to a
    // loopback address now. The dispatcher web.fetch_page uses refuses before connecting.
    const before = internalHits.length;
    const err = await fetch(`http://${loopName}:${internalPort}/v1/stats`, { dispatcher: publicOnlyDispatcher }).then(
      () => null,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(TypeError);
    expect((err as Error).cause).toBeInstanceOf(PrivateAddressError);
    expect(internalHits.length).toBe(before);
    // Without that dispatcher the same request reaches the server: the refusal was the check's.
    expect((await fetch(`http://${loopName}:${internalPort}/v1/stats`)).status).toBe(200);
    expect(internalHits.length).toBe(before + 1);
  });

  it('the rule: public unicast only, IPv4 and IPv6 (IPv4-mapped and NAT64 by their IPv4 address)', () => {
    const notPublic = [
      '127.0.0.1',
      '127.255.0.1',
      '10.1.2.3',
      '172.16.0.1',
      '172.31.255.255',
      '192.168.1.1',
      '169.254.169.254',
      '100.64.0.1',
      '0.0.0.0',
      '0.1.2.3',
      '224.0.0.1',
      '239.255.255.250',
      '255.255.255.255',
      '240.0.0.1',
      '192.0.2.1',
      '198.18.0.1',
      '::',
      '::1',
      '::ffff:127.0.0.1',
      '::ffff:7f00:1',
      '::ffff:10.0.0.1',
      '::127.0.0.1',
      '64:ff9b::7f00:1',
      'fc00::1',
      'fd00::2',
      'fe80::1',
      'fe80::1%eth0',
      'fec0::1',
      'ff02::1',
      '2001:db8::1',
      '2002:7f00:1::1',
      'not-an-address',
    ];
    const isPublic = [
      '8.8.8.8',
      '1.1.1.1',
      '172.32.0.1',
      '93.184.216.34',
      '::ffff:8.8.8.8',
      '64:ff9b::808:808',
      '2606:4700:4700::1111',
      '2a00:1450:4001::1',
    ];
    expect(notPublic.filter(isPublicAddress)).toEqual([]);
    expect(isPublic.filter((a) => !isPublicAddress(a))).toEqual([]);
  });
});
