/**
 * The README's first ten minutes, exactly as written: its example block is examples/first-call.ts
 * word for word; the stack comes up the way the README starts it (`npm start`, i.e. `node --import
 * tsx scripts/start.ts`, here with free ports and a temporary state directory, as
 * `npm start -- --port … --kb-port … --state-dir …` would) and says where the seeds and receipt keys
 * are; `node --import tsx examples/first-call.ts` then prints what the README shows — committed with
 * a receipt, the same receipt on the repeat, `idempotency_conflict` for another `fetchedAt` under
 * the same task — and a second run tells the same story with a note of its own. The KB holds one
 * row per run: the repeat and the conflict wrote nothing.
 */
import { execFile, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import Database from 'better-sqlite3';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { closedPort as freePort } from './helpers/net.js';
import { ROOT, ServiceProcess } from './helpers/services.js';

const README = readFileSync(join(ROOT, 'README.md'), 'utf8');
const EXAMPLE = 'examples/first-call.ts';

/** The fenced block between `<!-- name:begin -->` and `<!-- name:end -->`, without its fences. */
function block(name: string): string {
  const m = new RegExp(`<!-- ${name}:begin -->\\n\`\`\`[a-z]*\\n([\\s\\S]*?)\`\`\`\\n<!-- ${name}:end -->`).exec(
    README,
  );
  if (!m) throw new Error(`README.md: no fenced block between <!-- ${name}:begin --> and <!-- ${name}:end -->`);
  return m[1]!;
}

let dir: string;
let natsPort: number;
let stack: ServiceProcess;
let upLine: Record<string, unknown>;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'tooltx-readme-'));
  natsPort = await freePort();
  const kbPort = await freePort();
  stack = new ServiceProcess(
    'npm start',
    spawn(
      process.execPath,
      [
        '--import',
        'tsx',
        join(ROOT, 'scripts', 'start.ts'),
        '--port',
        String(natsPort),
        '--kb-port',
        String(kbPort),
        '--state-dir',
        dir,
      ],
      {
        cwd: ROOT,
        env: {
          PATH: process.env.PATH ?? '',
          ...(process.env.NATS_SERVER_BIN ? { NATS_SERVER_BIN: process.env.NATS_SERVER_BIN } : {}),
        },
        stdio: ['ignore', 'pipe', 'pipe'],
      },
    ),
  );
  const until = Date.now() + 60_000;
  for (;;) {
    const line = stack.lines.find((l) => typeof l.msg === 'string' && l.msg.startsWith('tooltx is up'));
    if (line) {
      upLine = line;
      break;
    }
    if (stack.child.exitCode !== null || Date.now() > until)
      throw new Error(`npm start did not come up (exit ${stack.child.exitCode}): ${stack.stderr}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}, 90_000);

afterAll(async () => {
  await stack?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
}, 60_000);

/** `node --import tsx examples/first-call.ts` from the repository root, as the README runs it. */
async function runExample(): Promise<string> {
  const { stdout } = await promisify(execFile)(process.execPath, ['--import', 'tsx', EXAMPLE], {
    cwd: ROOT,
    // What the README says to set when `npm start` was given another port and state directory.
    env: { PATH: process.env.PATH ?? '', NATS_URL: `nats://127.0.0.1:${natsPort}`, TOOLTX_STATE_DIR: dir },
    timeout: 60_000,
  });
  return stdout;
}

describe('README: the first ten minutes', () => {
  it('the README shows examples/first-call.ts word for word, and the commands that run it', () => {
    expect(block('first-call')).toBe(readFileSync(join(ROOT, EXAMPLE), 'utf8'));
    expect(README).toContain('npm ci && npm run demo');
    expect(README).toMatch(/^npm start\b/m);
    expect(README).toMatch(/^node --import tsx examples\/first-call\.ts\b/m);
  });

  it("npm start says where the agents' seeds and the receipt keys are: under the state directory's auth/", () => {
    expect(upLine.msg).toContain(
      `with their nkey seed from ${join(dir, 'auth', 'nkeys')} and trust the receipt keys in ${join(dir, 'auth', 'receipt-keys.json')}`,
    );
    expect(existsSync(join(dir, 'auth', 'nkeys', 'agent.acme.alice.nk'))).toBe(true);
  });

  it('the example commits with a receipt, gets the same receipt on the repeat and idempotency_conflict for another fetchedAt; a second run tells the same story', async () => {
    const runs = [await runExample(), await runExample()];
    const notes: string[] = [];
    for (const out of runs) {
      expect(out).toMatch(/^1\. write: committed \{\n/);
      const resourceId = /resourceId: '(note_[^']+)'/.exec(out)?.[1];
      expect(resourceId, out).toBeDefined();
      notes.push(resourceId!);
      expect(out).toMatch(/operationKey: 'opk_[A-Za-z0-9_-]{43}'/);
      expect(out).toMatch(/keyId: 'ed25519:/);
      // The lines after the receipt, as the README shows them.
      const tail = out.split('\n').filter((l) => /^[23]\. /.test(l));
      expect(tail).toEqual([
        '2. repeat: committed with the same receipt',
        '3. same task, other fetchedAt: rejected idempotency_conflict next: replan',
      ]);
      for (const line of tail) expect(README).toContain(line);
    }
    // A new task per run: a note of its own each time, and nothing else written.
    expect(notes[0]).not.toBe(notes[1]);
    const db = new Database(join(dir, 'kb.sqlite'), { readonly: true, fileMustExist: true });
    try {
      const rows = db.prepare('SELECT id FROM notes').all() as { id: string }[];
      expect(rows.map((r) => r.id).sort()).toEqual([...notes].sort());
    } finally {
      db.close();
    }
  }, 60_000);
});
