/**
 * `npm start -- --cluster 3` (docs/cluster.md): three nats-server nodes on loopback with the stack on
 * them; stopped with SIGTERM and started again on the same state directory, it comes back on its
 * stores (the streams are applied through the cluster's election); a call made before the restart
 * is answered with its original receipt after it; a node that dies stops the stack, naming it.
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { createTools } from '@tooltx/client';
import { researchContracts } from '../../examples/research-kb/contracts.js';
import { ServiceProcess } from '../helpers/services.js';
import { closedPort as freePort } from '../helpers/net.js';

const ROOT = join(import.meta.dirname, '..', '..');
type Lock = { pid: number; processes: { name: string; pid: number }[] };

function start(args: string[]): ServiceProcess {
  const child = spawn(process.execPath, ['--import', 'tsx', join(ROOT, 'scripts', 'start.ts'), ...args], {
    cwd: ROOT,
    env: { PATH: process.env.PATH ?? '' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  return new ServiceProcess('start', child);
}

/** The "tooltx is up" line; rejects with the supervisor's last words when it exits first. */
async function up(p: ServiceProcess, ms = 120_000): Promise<Record<string, unknown>> {
  const until = Date.now() + ms;
  for (;;) {
    const line = p.lines.find((l) => typeof l.msg === 'string' && l.msg.startsWith('tooltx is up'));
    if (line) return line;
    if (p.child.exitCode !== null || Date.now() > until)
      throw new Error(
        `not up (exit ${p.child.exitCode}): ${p.stderr.slice(-800)} ${JSON.stringify(p.lines.slice(-5))}`,
      );
    await new Promise((r) => setTimeout(r, 200));
  }
}

describe('npm start -- --cluster 3', () => {
  it('comes up on three nodes, stops on SIGTERM, comes back on the same state directory with the earlier receipt; a node killed stops the stack naming it', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tooltx-cluster-start-'));
    const port = await freePort();
    const args = ['--cluster', '3', '--port', String(port), '--kb-port', String(await freePort()), '--state-dir', dir];
    const urls = [0, 1, 2].map((i) => `nats://127.0.0.1:${port + i}`).join(',');
    const call = async () => {
      const tools = await createTools({
        servers: urls,
        tenant: 'acme',
        actor: 'alice',
        nkeyFile: join(dir, 'auth', 'nkeys', 'agent.acme.alice.nk'),
        contracts: researchContracts({ kbDedup: true }).all,
        receiptKeys: join(dir, 'auth', 'receipt-keys.json'),
        budgetMs: 30_000,
      });
      try {
        return await tools.execute({
          tool: 'kb.write_note',
          taskId: 'cluster-restart',
          input: {
            kb: 'research',
            title: 'Across a restart',
            body: 'Still one note.',
            sourceUrl: 'https://example.org/r',
            fetchedAt: '2026-12-01T00:00:00Z',
          },
        });
      } finally {
        await tools.close();
      }
    };
    try {
      const first = start(args);
      const line = await up(first);
      expect(line).toMatchObject({ NATS_URL: urls, natsServer: { durability: 'fsync', nodes: 3 } });
      const before = await call();
      expect(before.status).toBe('committed');
      expect(await first.stop()).toBe(0);

      const second = start(args);
      await up(second);
      expect(await call()).toEqual(before);
      const lock = JSON.parse(readFileSync(join(dir, 'stack.pid'), 'utf8')) as Lock;
      const n2 = lock.processes.find((p) => p.name === 'nats-server-n2')!;
      expect(
        lock.processes
          .filter((p) => p.name.startsWith('nats-server'))
          .map((p) => p.name)
          .sort(),
      ).toEqual(['nats-server-n1', 'nats-server-n2', 'nats-server-n3']);
      process.kill(n2.pid, 'SIGKILL');
      expect(await second.exited).toBe(1);
      expect(second.lines.find((l) => l.level === 50 && l.service === 'start')).toMatchObject({
        process: 'nats-server-n2',
      });
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 300_000);
});
