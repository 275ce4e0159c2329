/**
 * docker-compose.yml's three-node layout (docs/cluster.md). No Docker engine runs on the project's
 * machines, so the file is never started here: what is checked is that Compose accepts it
 * (`docker-compose config`, Debian's docker-compose 1.29, which needs no engine) and that the
 * configurations its `auth` step generates are three valid nats-server nodes, each started by its
 * own service, routed to the other two, fsyncing every acknowledgement, with the services given
 * every node and R3 streams.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { natsServerBinary } from '@tooltx/dev/nats-server';

const ROOT = join(import.meta.dirname, '..');
const compose = parse(readFileSync(join(ROOT, 'docker-compose.yml'), 'utf8'), { merge: true }) as {
  services: Record<
    string,
    { command?: string[]; environment?: Record<string, string>; image?: string; ports?: string[]; volumes?: string[] }
  >;
};
const hasDockerCompose = spawnSync('docker-compose', ['version'], { stdio: 'ignore' }).status === 0;
const NODES = ['n1', 'n2', 'n3'];

describe('docker-compose.yml: a three-node cluster', () => {
  // The check needs Debian's docker-compose package (.ci/run installs it); without it only the
  // structural checks below run.
  it.skipIf(!hasDockerCompose)('docker-compose config accepts the file and lists the three nodes', () => {
    const r = spawnSync('docker-compose', ['-f', join(ROOT, 'docker-compose.yml'), 'config', '--services'], {
      encoding: 'utf8',
    });
    expect({ status: r.status, stderr: r.stderr }).toMatchObject({ status: 0 });
    expect(r.stdout.split('\n').filter(Boolean).sort()).toEqual(
      [
        'audit-projector',
        'auth',
        'authorizer',
        'executor',
        'kb',
        'nats-1',
        'nats-2',
        'nats-3',
        'provisioner',
        'reconciler',
      ].sort(),
    );
  });

  it('each node starts from its own generated configuration on its own volume; services and the provisioner get every node and R3', () => {
    NODES.forEach((n, i) => {
      const svc = compose.services[`nats-${i + 1}`]!;
      expect(svc.command).toEqual(['-c', `/auth/nats-server-${n}.conf`, '-m', '8222']);
      expect(svc.volumes).toContain(`nats-${i + 1}-data:/data`);
      expect(svc.ports).toEqual([`${4222 + i}:4222`]);
    });
    for (const name of ['provisioner', 'authorizer', 'executor', 'reconciler', 'audit-projector']) {
      const env = compose.services[name]!.environment!;
      expect([name, env.NATS_URL]).toEqual([name, 'nats://nats-1:4222,nats://nats-2:4222,nats://nats-3:4222']);
      expect([name, env.TOOLTX_REPLICAS]).toEqual([name, '3']);
    }
  });

  it("the auth step's `tooltx auth generate --cluster-node …` writes three valid node configurations, routed to each other, with sync_interval: always", () => {
    const command = compose.services.auth!.command!.join(' ');
    const nodes = [...command.matchAll(/--cluster-node ([^\s)]+)/g)].map((m) => m[1]!);
    expect(nodes).toEqual([
      'n1,0.0.0.0:4222,nats-1:6222',
      'n2,0.0.0.0:4222,nats-2:6222',
      'n3,0.0.0.0:4222,nats-3:6222',
    ]);
    const out = mkdtempSync(join(tmpdir(), 'tooltx-compose-'));
    try {
      execFileSync(
        process.execPath,
        [
          '--import',
          'tsx',
          'bin/tooltx.ts',
          'auth',
          'generate',
          '--identities',
          'examples/research-kb/identities.json',
          '--out',
          out,
          '--store-dir',
          '/data',
          '--durability',
          'fsync',
          ...nodes.flatMap((n) => ['--cluster-node', n]),
        ],
        { cwd: ROOT, encoding: 'utf8' },
      );
      NODES.forEach((n, i) => {
        const file = join(out, `nats-server-${n}.conf`);
        const conf = readFileSync(file, 'utf8');
        expect(conf).toContain(`server_name: "${n}"`);
        expect(conf).toContain(`jetstream { store_dir: "/data/${n}", sync_interval: always }`);
        const routes = [...conf.matchAll(/nats-route:\/\/route:[0-9a-f]+@(nats-\d):6222/g)].map((m) => m[1]);
        expect(routes).toEqual([1, 2, 3].filter((k) => k !== i + 1).map((k) => `nats-${k}`));
        // The server itself parses it (its -t checks a configuration without starting).
        const t = spawnSync(natsServerBinary()!, ['-c', file, '-t'], { encoding: 'utf8' });
        expect([n, t.status, t.stderr.trim().split('\n').pop()]).toEqual([
          n,
          0,
          `nats-server: configuration file ${file} is valid`,
        ]);
      });
    } finally {
      rmSync(out, { recursive: true, force: true });
    }
  });
});
