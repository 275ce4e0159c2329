/** The main job in quick mode: `npm run demo -- --quick --json` must meet its gates (issue 4). */
import { spawn } from 'node:child_process';
import { describe, expect, it } from 'vitest';

describe('npm run demo --quick', () => {
  it('reads ~20 real pages, submits every write twice and ends with one KB row per page and no duplicate side effect', async () => {
    const child = spawn(process.execPath, ['--import', 'tsx', 'examples/research-kb/demo.ts', '--quick', '--json'], {
      env: { ...process.env, NATS_URL: '', LOG_LEVEL: 'info' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    let err = '';
    child.stdout.on('data', (c: Buffer) => (out += c.toString()));
    child.stderr.on('data', (c: Buffer) => (err += c.toString()));
    const code = await new Promise<number | null>((r) => child.once('exit', r));
    const last = out.trim().split('\n').pop() ?? '';
    const s = JSON.parse(last) as Record<string, number | boolean>;
    expect({ code, err: code === 0 ? '' : err }).toEqual({ code: 0, err: '' });
    expect(s.pages).toBeGreaterThanOrEqual(18);
    expect(s.writesSubmitted).toBe(2 * (s.pages as number));
    expect(s.writesCommitted).toBe(s.pages);
    expect(s.duplicatesSuppressed).toBe(s.pages);
    expect(s.kbRows).toBe(s.pages);
    expect(s.honestWritesRejected).toBe(0);
    expect(s.unknownUnresolved).toBe(0);
    expect(s.duplicateSideEffects).toBe(0);
    expect(s.ok).toBe(true);
  });
});
