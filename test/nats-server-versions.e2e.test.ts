/**
 * Which nats-server tooltx runs on (docs/nats-server.md): the project's own Debian 13 2.10 by
 * default, fsyncing every acknowledgement; 2.10.0 the oldest supported — a service on Debian 12's
 * 2.9.10 refuses to start, naming it, and a 2.9.10 on PATH is never picked; newer servers (sid's
 * current release) keep working: FM-01 and FM-02 run on it here.
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, symlinkSync, mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { downstreamKeyOf, prepareCall } from '@tooltx/contracts';
import { createTools, type Tools } from '@tooltx/client';
import { serverVersionAtLeast, UnsupportedServerError } from '@tooltx/nats';
import { binaryVersion, natsServerBinary, projectServerBinary, spawnNatsServer } from '@tooltx/dev/nats-server';
import { provisioned, type TestNats } from './helpers/nats.js';
import { startService, type ServiceProcess } from './helpers/services.js';
import { waitForOperation } from './helpers/ops.js';
import { Sink } from './helpers/sink.js';
import { TcpProxy } from './helpers/tcp-proxy.js';
import { contracts, sinkWrite } from './fixtures/sink-tools.js';

const ROOT = join(import.meta.dirname, '..');
const BOOKWORM = projectServerBinary('bookworm');
const SID = projectServerBinary('sid');

describe('the default server', () => {
  it("is the project's own Debian 13 nats-server, 2.10.27 or later, and its generated configuration fsyncs before every acknowledgement", async () => {
    const bin = natsServerBinary({ PATH: process.env.PATH });
    expect(bin).toMatch(/\.nats-server\/trixie\/usr\/sbin\/nats-server$/);
    const version = binaryVersion(bin!);
    expect(serverVersionAtLeast(version!, '2.10.27')).toBe(true);
    const t = await provisioned();
    try {
      expect(readFileSync(t.auth.configFile, 'utf8')).toMatch(
        /jetstream \{ store_dir: "[^"]+", sync_interval: always \}/,
      );
      expect(t.nc.info!.version).toBe(version);
    } finally {
      await t.close();
    }
  });
});

describe("servers older than 2.10 (Debian 12's 2.9.10)", () => {
  it("a 2.9.10 first on PATH is never picked: the project's own wins, and without it only a 2.10+ on PATH is", () => {
    expect(BOOKWORM, 'scripts/ensure-nats-server --test-servers fetches it').not.toBeNull();
    expect(binaryVersion(BOOKWORM!)).toBe('2.9.10');
    const dir = mkdtempSync(join(tmpdir(), 'tooltx-path-'));
    try {
      const old = join(dir, 'old');
      const newer = join(dir, 'newer');
      mkdirSync(old);
      mkdirSync(newer);
      symlinkSync(BOOKWORM!, join(old, 'nats-server'));
      symlinkSync(SID!, join(newer, 'nats-server'));
      expect(natsServerBinary({ PATH: old })).toBe(projectServerBinary('trixie'));
      expect(natsServerBinary({ PATH: old }, { project: false })).toBeNull();
      expect(natsServerBinary({ PATH: `${old}:${newer}` }, { project: false })).toBe(join(newer, 'nats-server'));
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('is refused when named: spawning one throws UnsupportedServerError naming its version', async () => {
    await expect(spawnNatsServer({ binary: BOOKWORM! })).rejects.toThrow(UnsupportedServerError);
    await expect(spawnNatsServer({ binary: BOOKWORM! })).rejects.toThrow(
      /nats-server 2\.9\.10; tooltx needs 2\.10\.0 or later/,
    );
  });

  it("a service connected to one refuses to start (exit 2), naming the server's version and how to get a newer one", async () => {
    // 2.9.10 has no sync_interval: its configuration is written without it.
    const t = await provisioned({}, undefined, { binary: BOOKWORM!, allowUnsupported: true, durability: 'os' });
    try {
      expect(t.nc.info!.version).toBe('2.9.10');
      const p = await startService('authorizer', t.env, { wait: false });
      expect(await p.exited).toBe(2);
      expect(p.stderr).toContain(
        `cannot start: NATS_URL=${t.url}: the server there is nats-server 2.9.10; tooltx needs 2.10.0 or later`,
      );
      expect(p.stderr).toContain('scripts/ensure-nats-server');
      expect(p.lines.some((l) => l.msg === 'started')).toBe(false);
      // The provisioner's CLI applies nothing to it either.
      const cli = spawnSync(process.execPath, ['--import', 'tsx', 'bin/tooltx.ts', 'streams', 'apply'], {
        cwd: ROOT,
        env: {
          PATH: process.env.PATH ?? '',
          NATS_URL: t.url,
          TOOLTX_PREFIX: `${t.subjects.prefix}x`,
          NATS_NKEY_FILE: t.auth.seedFile({ kind: 'provisioner' }),
        },
        encoding: 'utf8',
      });
      expect({ status: cli.status, stderr: cli.stderr.trim() }).toMatchObject({
        status: 1,
        stderr: expect.stringContaining(
          'tooltx: NATS_URL: the server there is nats-server 2.9.10; tooltx needs 2.10.0 or later',
        ),
      });
    } finally {
      await t.close();
    }
  });
});

describe(`a newer server: sid's current release`, () => {
  let t: TestNats;
  let sink: Sink;
  let procs: ServiceProcess[] = [];
  let alice: Tools;
  let bob: Tools;
  const note = (title: string) => ({
    bucket: 'kb-main',
    title,
    body: `About ${title}.`,
    at: '2026-11-30T06:00:00.000Z',
  });
  const sdk = (actor: string, servers = t.url) =>
    createTools({
      servers,
      tenant: 'acme',
      actor,
      nkeyFile: t.agentSeed('acme', actor),
      contracts,
      prefix: t.subjects.prefix,
      receiptKeys: t.auth.receiptKeysFile,
      budgetMs: 30_000,
    });

  beforeAll(async () => {
    expect(SID, 'scripts/ensure-nats-server --test-servers fetches it').not.toBeNull();
    t = await provisioned({}, undefined, { binary: SID! });
    sink = await new Sink().start();
    const env = { ...t.env, SINK_URL: sink.url };
    procs = await Promise.all([
      startService('authorizer', env),
      startService('executor', env),
      startService('reconciler', env),
    ]);
    [alice, bob] = await Promise.all([sdk('alice'), sdk('bob')]);
  });

  afterAll(async () => {
    await alice?.close();
    await bob?.close();
    const codes = await Promise.all(procs.map((p) => p.stop()));
    await sink?.stop();
    await t?.close();
    expect(codes).toEqual([0, 0, 0]);
  });

  it('is newer than the default and every service starts on it (the version check passes)', () => {
    const version = t.nc.info!.version;
    expect(serverVersionAtLeast(version, '2.11.0')).toBe(true);
    expect(version).toBe(binaryVersion(SID!));
    for (const p of procs) expect(p.lines.some((l) => l.msg === 'started')).toBe(true);
  });

  it('FM-01: two workers submit the same key at the same moment: one sink request, both get the same receipt', async () => {
    const input = note('Same moment on sid');
    const key = prepareCall(sinkWrite, 'sid-fm01', input).operationKey;
    const [a, b] = await Promise.all([
      alice.execute({ tool: 'sink.write', taskId: 'sid-fm01', input }),
      bob.execute({ tool: 'sink.write', taskId: 'sid-fm01', input }),
    ]);
    expect(a.status).toBe('committed');
    expect(b).toEqual(a);
    expect(sink.writesFor((w) => w.key === downstreamKeyOf('acme', key))).toHaveLength(1);
  });

  it("FM-02: the server commits while the agent's connection is cut: status returns the original resource id, a retry writes nothing", async () => {
    const hop = await new TcpProxy(t.server.port).start();
    const agent = await sdk('alice', hop.url);
    const input = note('Cut on sid');
    const key = prepareCall(sinkWrite, 'sid-fm02', input).operationKey;
    const writes = () => sink.writesFor((w) => w.key === downstreamKeyOf('acme', key));
    sink.delayMs = 500;
    try {
      const call = agent.execute({ tool: 'sink.write', taskId: 'sid-fm02', input });
      while (writes().length === 0) await new Promise((r) => setTimeout(r, 10));
      // The sink holds its answer: the commit comes after the agent lost its connection.
      expect(hop.cutAll()).toBeGreaterThan(0);
      await waitForOperation(t, 'acme', key, (s) => s.status === 'committed');
      const r = await call;
      expect(r.status).toBe('committed');
      if (r.status !== 'committed') return;
      expect(r.receipt.resourceId).toBe(writes()[0]!.answeredId);
      const status = await agent.status({ operationKey: key });
      expect(status).toMatchObject({ state: 'committed', receipt: { resourceId: r.receipt.resourceId } });
      expect(await agent.execute({ tool: 'sink.write', taskId: 'sid-fm02', input })).toEqual(r);
      expect(writes()).toHaveLength(1);
    } finally {
      sink.delayMs = 0;
      await agent.close();
      await hop.stop();
    }
  });
});
