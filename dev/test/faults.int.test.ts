/**
 * The fault harness itself, on real sockets: a TCP echo target and a real nats-server with auth
 * on (every test) for the per-connection hop, a small HTTP target that counts what it "committed" for the keyed hop.
 * Behaviour only (what arrived, what was cut), never how long anything took.
 */
import { createServer as createHttpServer, type Server as HttpServer } from 'node:http';
import { createServer, connect as tcpConnect, type AddressInfo, type Server, type Socket } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { request } from 'undici';
import { readFileSync } from 'node:fs';
import { connect as natsConnect, nkeyAuthenticator } from '@nats-io/transport-node';
import { inboxPrefixOf } from '@tooltx/nats';
import { provisioned, type TestNats } from '../../test/helpers/nats.js';
import { HttpFaultProxy, TcpFaultProxy } from '../src/faults/index.js';

/** A client of the proxy that collects every byte it gets back and notes when it is closed. */
function client(port: number): Promise<{ sock: Socket; got: () => string; closed: Promise<void> }> {
  return new Promise((resolve, reject) => {
    let buf = '';
    const sock = tcpConnect(port, '127.0.0.1', () => resolve({ sock, got: () => buf, closed }));
    const closed = new Promise<void>((r) => sock.on('close', () => r()));
    sock.on('data', (c: Buffer) => (buf += c.toString('latin1')));
    sock.on('error', () => undefined);
    sock.once('error', reject);
  });
}
const until = async (cond: () => boolean, what: string, timeoutMs = 20_000) => {
  const end = Date.now() + timeoutMs;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
};
const portOf = (url: string) => Number(new URL(url).port);

describe('TcpFaultProxy: per connection', () => {
  let echo: Server;
  let proxy: TcpFaultProxy;
  beforeAll(async () => {
    echo = createServer((s) => s.on('data', (c) => s.write(c)).on('error', () => undefined));
    await new Promise<void>((r) => echo.listen(0, '127.0.0.1', r));
    proxy = await new TcpFaultProxy((echo.address() as AddressInfo).port, { scheme: 'tcp' }).start();
  });
  afterAll(async () => {
    await proxy.stop();
    await new Promise((r) => echo.close(r));
  });

  it('addresses connections by accept order: a cut of the 2nd leaves the 1st working', async () => {
    const base = proxy.accepted;
    const a = await client(portOf(proxy.url));
    const b = await client(portOf(proxy.url));
    await until(() => proxy.accepted === base + 2, 'two accepts');
    const cut = proxy.program({ nth: base + 2 }, { kind: 'cut' });
    expect((await cut.applied).connection).toBe(base + 2);
    await b.closed;
    a.sock.write('still here');
    await until(() => a.got() === 'still here', 'echo on the first connection');
    a.sock.destroy();
  });

  it('cuts after exactly N more bytes back to the client', async () => {
    const a = await client(portOf(proxy.url));
    const conn = await proxy.waitForConnection((c) => c.id === proxy.accepted);
    conn.cutAfterBytesDown(5);
    a.sock.write('hello world');
    await a.closed;
    expect(a.got()).toBe('hello');
    expect(conn.bytesDown).toBe(5);
  });

  it('delays each way and keeps the order of the bytes', async () => {
    const a = await client(portOf(proxy.url));
    const conn = await proxy.waitForConnection((c) => c.id === proxy.accepted);
    conn.delay(150, 'both');
    for (let i = 0; i < 20; i++) a.sock.write(`${i};`);
    conn.delay(0, 'up'); // what follows may not overtake what is still held
    a.sock.write('end');
    const want = `${Array.from({ length: 20 }, (_, i) => `${i};`).join('')}end`;
    await until(() => a.got() === want, 'every byte back, in order');
    conn.delay(0);
    a.sock.write('!');
    await until(() => a.got() === `${want}!`, 'undelayed byte');
    a.sock.destroy();
  });

  it('rejects a nonsensical fault instead of ignoring it', async () => {
    const a = await client(portOf(proxy.url));
    const conn = await proxy.waitForConnection((c) => c.id === proxy.accepted);
    expect(() => conn.delay(-1)).toThrow(RangeError);
    expect(() => conn.cutAfterBytesDown(1.5)).toThrow(RangeError);
    a.sock.destroy();
  });
});

describe('TcpFaultProxy: NATS clients addressed by the name of their CONNECT line', () => {
  let t: TestNats;
  let proxy: TcpFaultProxy;
  /** Connection options of an agent of the test server's generated auth: its nkey and inbox prefix. */
  const asAgent = (actor: string) => ({
    authenticator: nkeyAuthenticator(new TextEncoder().encode(readFileSync(t.agentSeed('acme', actor), 'utf8').trim())),
    inboxPrefix: inboxPrefixOf({ kind: 'agent', tenant: 'acme', actor }),
  });
  beforeAll(async () => {
    t = await provisioned({}, undefined, { apply: false });
    proxy = await TcpFaultProxy.forUrl(t.url).start();
  });
  afterAll(async () => {
    await proxy.stop();
    await t.close();
  });

  it('a cut programmed for one client name cuts that client once; it reconnects through the proxy, the other is untouched', async () => {
    const victim = await natsConnect({
      servers: proxy.url,
      name: 'victim',
      reconnectTimeWait: 100,
      maxReconnectAttempts: -1,
      ...asAgent('alice'),
    });
    const bystander = await natsConnect({ servers: proxy.url, name: 'bystander', ...asAgent('bob') });
    const seen = await proxy.waitForConnection({ name: 'bystander' });
    const disconnects: string[] = [];
    void (async () => {
      for await (const s of victim.status()) if (s.type === 'disconnect') disconnects.push(s.type);
    })();
    const firstVictim = await proxy.waitForConnection({ name: /^vict/ });
    const cut = proxy.program({ name: 'victim' }, { kind: 'cut' });
    expect(await cut.applied).toMatchObject({ connection: firstVictim.id, name: 'victim', kind: 'cut' });
    await until(() => disconnects.length === 1, 'the victim to see the cut');
    // It comes back on a new proxied connection, which the one-shot fault leaves alone.
    await proxy.waitForConnection((c) => c.name === 'victim' && c.id > firstVictim.id);
    await victim.flush();
    expect(seen.closed).toBe(false);
    await bystander.flush();
    expect(proxy.injected.filter((f) => f.name === 'victim')).toHaveLength(1);
    await victim.close();
    await bystander.close();
  });
});

describe('HttpFaultProxy: keyed on a request header', () => {
  let target: HttpServer;
  let proxy: HttpFaultProxy;
  const committed: string[] = [];
  beforeAll(async () => {
    target = createHttpServer((req, res) => {
      req.resume();
      req.on('end', () => {
        if (req.method === 'POST') committed.push(String(req.headers['idempotency-key']));
        res.writeHead(req.method === 'POST' ? 201 : 200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ ok: true }));
      });
    });
    await new Promise<void>((r) => target.listen(0, '127.0.0.1', r));
    proxy = await new HttpFaultProxy(`http://127.0.0.1:${(target.address() as AddressInfo).port}`).start();
  });
  afterAll(async () => {
    await proxy.stop();
    await new Promise((r) => target.close(r));
  });
  const post = (key: string, signal?: AbortSignal) =>
    request(`${proxy.url}/v1/notes`, {
      method: 'POST',
      headers: { 'idempotency-key': key, 'content-type': 'application/json' },
      body: '{"a":1}',
      signal,
      reset: true,
    }).then(async (r) => ({ status: r.statusCode, body: await r.body.text() }));
  const count = (key: string) => committed.filter((k) => k === key).length;

  it('drop: the caller sees a cut, the target never saw the request; the next request with the key passes', async () => {
    const f = proxy.inject('k-drop', { kind: 'drop' });
    await expect(post('k-drop')).rejects.toThrow();
    expect(await f.applied).toMatchObject({ key: 'k-drop', kind: 'drop', method: 'POST' });
    expect(count('k-drop')).toBe(0);
    expect((await post('k-drop')).status).toBe(201);
    expect(count('k-drop')).toBe(1);
  });

  it('cut_response: the target committed, the caller saw nothing', async () => {
    const f = proxy.inject('k-cut', { kind: 'cut_response' });
    await expect(post('k-cut')).rejects.toThrow();
    expect(await f.applied).toMatchObject({ kind: 'cut_response', status: 201 });
    expect(count('k-cut')).toBe(1);
  });

  it('hold_response: the target committed, the caller gave up at its deadline first', async () => {
    const f = proxy.inject('k-hold', { kind: 'hold_response', ms: 60_000 });
    await expect(post('k-hold', AbortSignal.timeout(1_000))).rejects.toThrow();
    expect(await f.applied).toMatchObject({ kind: 'hold_response', status: 201 });
    expect(count('k-hold')).toBe(1);
  });

  it('delay: the request still arrives and is answered', async () => {
    const f = proxy.inject('k-delay', { kind: 'delay', ms: 200 });
    expect(await post('k-delay')).toEqual({ status: 201, body: '{"ok":true}' });
    expect(await f.applied).toMatchObject({ kind: 'delay', status: 201 });
  });

  it('touches only requests with its key (and by default only writes); other keys and reads pass', async () => {
    const f = proxy.inject('k-only', { kind: 'drop' }, { times: 2 });
    expect((await post('k-other')).status).toBe(201);
    const read = await request(`${proxy.url}/v1/notes/x`, { headers: { 'idempotency-key': 'k-only' }, reset: true });
    expect(read.statusCode).toBe(200);
    await read.body.dump();
    await expect(post('k-only')).rejects.toThrow();
    await expect(post('k-only')).rejects.toThrow();
    expect((await post('k-only')).status).toBe(201);
    await f.applied;
    expect(proxy.injected.filter((x) => x.key === 'k-only')).toHaveLength(2);
  });

  it('the predicate API still works for requests without a key', async () => {
    proxy.cutResponse = (req) => req.url === '/v1/notes';
    const answered: number[] = [];
    proxy.onAnswered = (_req, status) => answered.push(status);
    try {
      await expect(
        request(`${proxy.url}/v1/notes`, { method: 'POST', body: '{}', reset: true }).then((r) => r.body.text()),
      ).rejects.toThrow();
      expect(answered).toEqual([201]);
    } finally {
      proxy.clear();
    }
  });
});
