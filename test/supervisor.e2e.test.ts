/**
 * `npm start` as a supervisor: a `kill -9` of it leaves nothing running, its lock
 * names the processes it started and a new start refuses while one of them is alive, and no process
 * of the stack hangs in a log write to a pipe nobody reads. Real processes throughout: the
 * supervisor (scripts/start.ts), its nats-server, KB and services, `kill -KILL`.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawnNatsServer } from '@tooltx/dev/nats-server';
import { spawnKbProcess } from './helpers/kb.js';
import { ServiceProcess } from './helpers/services.js';
import { closedPort as freePort } from './helpers/net.js';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..');
const START = join(ROOT, 'scripts', 'start.ts');

/** `npm start` as npm runs it (node --import tsx scripts/start.ts), JSON lines collected (stdout is not a TTY). */
function start(args: string[], env: Record<string, string> = {}): ServiceProcess {
  const child = spawn(process.execPath, ['--import', 'tsx', START, ...args], {
    cwd: ROOT,
    env: {
      PATH: process.env.PATH ?? '',
      ...(process.env.NATS_SERVER_BIN ? { NATS_SERVER_BIN: process.env.NATS_SERVER_BIN } : {}),
      ...env,
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  return new ServiceProcess('start', child);
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** Polls until none of `pids` is alive; rejects (naming the survivors) after `ms`. */
async function allGone(pids: number[], ms: number): Promise<void> {
  const until = Date.now() + ms;
  while (pids.some(alive)) {
    if (Date.now() > until) throw new Error(`still running: ${pids.filter(alive).join(', ')}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

type Lock = { pid: number; processes: { name: string; pid: number }[] };

/** Resolves when the supervisor logs that the stack is up; rejects with its output when it exits first. */
async function up(p: ServiceProcess, ms = 90_000): Promise<void> {
  const until = Date.now() + ms;
  while (!p.lines.some((l) => typeof l.msg === 'string' && l.msg.startsWith('tooltx is up'))) {
    if (p.child.exitCode !== null || Date.now() > until)
      throw new Error(`npm start did not come up (exit ${p.child.exitCode}): ${p.stderr}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

describe('npm start supervisor', () => {
  it('kill -9 of the supervisor: every process it started (recorded in its lock) stops by itself, and a new start on the same state directory comes up', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tooltx-start-'));
    const args = ['--port', String(await freePort()), '--kb-port', String(await freePort()), '--state-dir', dir];
    const leftovers: number[] = [];
    try {
      const first = start(args);
      await up(first);
      const lock = JSON.parse(readFileSync(join(dir, 'stack.pid'), 'utf8')) as Lock;
      expect(lock.pid).toBe(first.child.pid);
      // The default layout: every role in one process (tooltx serve).
      expect(lock.processes.map((p) => p.name).sort()).toEqual(['kb', 'mail', 'nats-server', 'tooltx-1']);
      const pids = lock.processes.map((p) => p.pid);
      leftovers.push(...pids);
      expect(pids.every(alive)).toBe(true);

      await first.kill(); // SIGKILL: no handler runs, nothing is passed on
      // The KB and the services watch their parent (TOOLTX_EXIT_WITH_PARENT); nats-server has
      // setpriv's parent-death signal. Their stdout pipes have no reader any more either.
      await allGone(pids, 40_000);

      const second = start(args);
      try {
        await up(second);
        const again = JSON.parse(readFileSync(join(dir, 'stack.pid'), 'utf8')) as Lock;
        expect(again.pid).toBe(second.child.pid);
        leftovers.push(...again.processes.map((p) => p.pid));
      } finally {
        const code = await second.stop();
        // On failure, say how it ended and what it said last (a signal leaves code null).
        expect({
          code,
          signal: second.child.signalCode,
          said: code === 0 ? '' : `${second.stderr.slice(-800)} ${JSON.stringify(second.lines.slice(-5))}`,
        }).toEqual({ code: 0, signal: null, said: '' });
      }
      expect(second.lines.some((l) => l.msg === 'stopped')).toBe(true);
    } finally {
      for (const pid of leftovers) if (alive(pid)) process.kill(pid, 'SIGKILL');
      rmSync(dir, { recursive: true, force: true });
    }
  }, 240_000);

  it('a service that dies a 6th time within a minute stops the stack (exit 1), and the supervisor says it was the restart limit; a state directory with a blank is quoted in the hint to copy', async () => {
    const parent = mkdtempSync(join(tmpdir(), 'tooltx-start-'));
    const dir = join(parent, 'state dir');
    const p = start(['--port', String(await freePort()), '--kb-port', String(await freePort()), '--state-dir', dir]);
    const leftovers: number[] = [];
    try {
      await up(p);
      const upLine = p.lines.find((l) => typeof l.msg === 'string' && l.msg.startsWith('tooltx is up'));
      expect(upLine!.msg).toContain(`TOOLTX_STATE_DIR='${dir}' `);
      // The co-located process (every role): what the supervisor restarts.
      const hostPid = () =>
        (JSON.parse(readFileSync(join(dir, 'stack.pid'), 'utf8')) as Lock).processes.find((x) => x.name === 'tooltx-1')
          ?.pid;
      leftovers.push(...(JSON.parse(readFileSync(join(dir, 'stack.pid'), 'utf8')) as Lock).processes.map((x) => x.pid));
      for (let death = 1; death <= 6; death++) {
        let pid = hostPid();
        // The supervisor records the restarted executor's pid in its lock.
        for (let i = 0; i < 100 && (pid === undefined || !alive(pid) || (death > 1 && leftovers.includes(pid))); i++) {
          await new Promise((r) => setTimeout(r, 100));
          pid = hostPid();
        }
        expect(pid !== undefined && alive(pid), `the co-located process before death ${death}`).toBe(true);
        leftovers.push(pid!);
        process.kill(pid!, 'SIGKILL');
        await allGone([pid!], 10_000);
      }
      expect(await p.exited).toBe(1);
      const restarts = p.lines.filter(
        (l) => l.msg === 'a service exited on its own: starting it again' && l.process === 'tooltx-1',
      );
      expect(restarts).toHaveLength(5);
      expect(p.lines.find((l) => l.level === 50 && l.service === 'start')).toMatchObject({
        process: 'tooltx-1',
        msg: 'tooltx-1 exited (SIGKILL) a 6th time within a minute; a service is restarted at most 5 times a minute: stopping everything',
      });
      await allGone(leftovers, 20_000);
    } finally {
      for (const pid of leftovers) if (alive(pid)) process.kill(pid, 'SIGKILL');
      if (p.child.exitCode === null) await p.kill();
      rmSync(parent, { recursive: true, force: true });
    }
  }, 180_000);

  it('SIGTERM while the stack is still starting: the supervisor stops cleanly (exit 0, its lock removed) instead of dying by the signal', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tooltx-start-'));
    const args = ['--port', String(await freePort()), '--kb-port', String(await freePort()), '--state-dir', dir];
    const p = start(args);
    try {
      // The lock is written before the stack starts: from then on a signal must not kill it.
      const until = Date.now() + 30_000;
      while (!existsSync(join(dir, 'stack.pid')) && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
      const code = await p.stop();
      expect({ code, signal: p.child.signalCode }).toEqual({ code: 0, signal: null });
      const lock = existsSync(join(dir, 'stack.pid'))
        ? (JSON.parse(readFileSync(join(dir, 'stack.pid'), 'utf8')) as Lock)
        : null;
      expect(lock).toBeNull();
    } finally {
      await p.kill();
      rmSync(dir, { recursive: true, force: true });
    }
  }, 120_000);

  it('a new start refuses while a process recorded in the lock is still running, naming it, and leaves the lock as it was', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tooltx-start-'));
    const server = await spawnNatsServer({ storeDir: join(dir, 'orphan-js') });
    try {
      // The lock of a supervisor that is gone (a pid that has exited), whose nats-server still runs.
      const gone = spawn(process.execPath, ['-e', '']);
      await new Promise((r) => gone.once('exit', r));
      const lock = `${JSON.stringify({ pid: gone.pid, processes: [{ name: 'nats-server', pid: server.process!.pid }] })}\n`;
      writeFileSync(join(dir, 'stack.pid'), lock);
      const p = start(['--port', String(await freePort()), '--kb-port', String(await freePort()), '--state-dir', dir]);
      expect(await p.exited).toBe(2);
      expect(p.stderr).toContain(`nats-server (pid ${server.process!.pid})`);
      expect(p.stderr).toContain('--state-dir');
      expect(p.stderr.trim().split('\n')).toHaveLength(1);
      expect(p.lines.find((l) => l.msg === 'failed to start')).toMatchObject({ setting: '--state-dir', value: dir });
      expect(readFileSync(join(dir, 'stack.pid'), 'utf8')).toBe(lock);
    } finally {
      await server.stop({ removeStore: true });
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('a KB whose stdout pipe has no reader any more (its supervisor died) still stops on SIGTERM: no log write retries forever', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tooltx-kb-'));
    const kb = spawnKbProcess({ KB_DB: join(dir, 'kb.sqlite'), LOG_LEVEL: 'debug' });
    try {
      await kb.waitForLog('listening');
      // The read end of its stdout is closed, as when the supervisor that piped it is killed: every
      // later write gets EPIPE. Shutting down writes two lines and exits.
      closeReader(kb.child);
      kb.child.kill('SIGTERM');
      const code = await kb.exited;
      // On failure, say how it ended (a signal leaves code null; seen in CI, signal unknown).
      expect({ code, signal: kb.child.signalCode, said: code === 0 ? '' : kb.stderr.slice(-800) }).toEqual({
        code: 0,
        signal: null,
        said: '',
      });
    } finally {
      await kb.kill();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

function closeReader(child: ChildProcess): void {
  child.stdout!.removeAllListeners('data');
  child.stdout!.destroy();
}

describe('npm start at LOG_LEVEL=error: readiness is not a log line', () => {
  let dir: string;
  let stack: ServiceProcess;
  let lock: Lock;

  beforeAll(async () => {
    dir = join(mkdtempSync(join(tmpdir(), 'tooltx-quiet-')), 'state');
    // A user's command. Readiness must not wait for the KB's info-level "listening" line, which
    // LOG_LEVEL=error hides: that wait took 30 s and ended in a bare "Error".
    stack = start(['--port', String(await freePort()), '--kb-port', String(await freePort()), '--state-dir', dir], {
      LOG_LEVEL: 'error',
    });
    await up(stack);
    lock = JSON.parse(readFileSync(join(dir, 'stack.pid'), 'utf8')) as Lock;
  }, 120_000);

  afterAll(async () => {
    const code = await stack?.stop();
    for (const p of lock?.processes ?? []) if (alive(p.pid)) process.kill(p.pid, 'SIGKILL');
    rmSync(dirname(dir), { recursive: true, force: true });
    expect(code).toBe(0);
  });

  it("the stack comes up with every process, says where to connect, writes nothing else below error, and an agent's call commits", async () => {
    // The default layout: every role in one process (tooltx serve).
    expect(lock.processes.map((p) => p.name).sort()).toEqual(['kb', 'mail', 'nats-server', 'tooltx-1']);
    const upLine = stack.lines.find((l) => typeof l.msg === 'string' && l.msg.startsWith('tooltx is up'));
    expect(upLine).toMatchObject({
      service: 'start',
      NATS_URL: expect.stringMatching(/^nats:\/\/127\.0\.0\.1:\d+$/),
      KB_URL: expect.stringMatching(/^http:\/\/127\.0\.0\.1:\d+$/),
    });
    // Every other line of the supervisor and of the processes it started respects the level.
    expect(stack.lines.filter((l) => l !== upLine && !(typeof l.level === 'number' && l.level >= 50))).toEqual([]);
    // The stack works: npm run quickstart against it commits.
    const qs = spawn(process.execPath, ['--import', 'tsx', join(ROOT, 'examples', 'research-kb', 'quickstart.ts')], {
      cwd: ROOT,
      env: { PATH: process.env.PATH ?? '', NATS_URL: upLine!.NATS_URL as string, TOOLTX_STATE_DIR: dir },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const quick = new ServiceProcess('quickstart', qs);
    expect(await quick.exited, quick.stderr).toBe(0);
    expect(quick.lines.map((l) => String(l.raw ?? '')).join('\n')).toContain('"status": "committed"');
  }, 60_000);

  it("the state directory is 0700 and the KB's database files (kb.sqlite, its -wal and -shm) are 0600 like the keys beside them", () => {
    const mode = (f: string) => statSync(join(dir, f)).mode & 0o777;
    expect(mode('.').toString(8)).toBe('700');
    for (const f of [
      'kb.sqlite',
      'kb.sqlite-wal',
      'kb.sqlite-shm',
      'audit-hmac.key',
      'log-hmac.key',
      'kb-service.token',
      'kb-admin.token',
    ])
      expect([f, mode(f).toString(8)]).toEqual([f, '600']);
  });
});
