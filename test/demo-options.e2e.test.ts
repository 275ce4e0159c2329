/**
 * `npm run demo` refuses a bad number at once (exit 2, naming the flag) — before it serves pages or
 * starts a nats-server, the KB or any service — and its --help shows the defaults it uses.
 */
import { execFile } from 'node:child_process';
import { describe, expect, it } from 'vitest';

function demo(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) =>
    execFile(
      process.execPath,
      ['--import', 'tsx', 'examples/research-kb/demo.ts', ...args],
      { env: { PATH: process.env.PATH ?? '', NATS_URL: '' }, timeout: 60_000 },
      (err, stdout, stderr) =>
        resolve({ code: err ? (typeof err.code === 'number' ? err.code : 1) : 0, stdout, stderr }),
    ),
  );
}

describe('demo options', () => {
  it('--workers 0, --pages abc and friends are refused at once with exit 2, nothing started', async () => {
    for (const [args, flag] of [
      [['--workers', '0'], '--workers'],
      [['--pages', 'abc'], '--pages'],
      [['--pages', '2.5'], '--pages'],
      [['--pages', '0x10'], '--pages'],
      [['--workers', '1e1'], '--workers'],
      [['--workers', '65'], '--workers'],
      [['--quick', '--workers', '-1'], '--workers'],
    ] as const) {
      const r = await demo([...args]);
      expect(r.code, args.join(' ')).toBe(2);
      expect(r.stderr).toContain(`${flag}: expected a whole number from 1 to`);
      // The demo's progress lines ("demo: … pages … served", "demo: stack up") never appeared.
      expect(r.stderr).not.toContain('demo:');
    }
  });

  it('--help shows the defaults the demo uses: 250 pages, 8 workers', async () => {
    const r = await demo(['--help']);
    expect(r.code).toBe(0);
    const help = r.stdout.replace(/\s+/g, ' ');
    expect(help).toMatch(/--pages <n> [^-]*\(default: 250\)/);
    expect(help).toMatch(/--workers <n> [^-]*\(default: 8\)/);
  });
});
