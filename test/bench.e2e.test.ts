/**
 * `npm run bench -- --quick --json` works end to end: both lower bounds and tooltx run,
 * the JSON line has every field bench/report.ts guarantees, and no phase produced a duplicate side
 * effect. So does the peers workload (`--workload peers`, bench/peers.ts) for tooltx's services and
 * the JetStream floor: every key's line appended once, no error.
 * No timing assertion: the bench reports figures, it does not judge them here.
 */
import { spawn } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { benchReportSchema } from '../bench/report.js';
import { peersReportSchema } from '../bench/peers-report.js';

/** Runs bench/run.ts with `args`; its exit code, stdout and the tail of its stderr. */
async function bench(args: string[]): Promise<{ code: number | null; out: string; err: string }> {
  const child = spawn(process.execPath, ['--import', 'tsx', 'bench/run.ts', ...args], {
    env: { ...process.env, NATS_URL: '', LOG_LEVEL: 'info' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  let err = '';
  child.stdout.on('data', (c: Buffer) => (out += c.toString()));
  child.stderr.on('data', (c: Buffer) => (err += c.toString()));
  const code = await new Promise<number | null>((r) => child.once('exit', r));
  return { code, out, err: err.slice(-4_000) };
}

describe('npm run bench --quick', () => {
  it('measures both lower bounds and tooltx in one run, with the server fsyncing and not, prints the guaranteed JSON fields, and finds no duplicate side effect', async () => {
    const { code, out, err } = await bench(['--quick', '--json']);
    expect({ code, err: code === 0 ? '' : err }).toEqual({ code: 0, err: '' });
    const report = benchReportSchema.parse(JSON.parse(out.trim().split('\n').pop() ?? ''));
    expect(report.duplicates).toBe(0);
    expect(report.ok).toBe(true);
    // The project's nats-server, both durabilities measured in the one run, the headline fsync'd.
    expect(report.natsServer.durability).toBe('fsync');
    expect(report.natsServer.version).toMatch(/^2\.(1\d|[2-9]\d)\.\d+$/);
    for (const d of ['fsync', 'os'] as const) {
      expect(report.durability[d]?.tooltx.mainCallsPerSecond, `tooltx ran with ${d}`).toBeGreaterThan(0);
      expect(report.durability[d]?.floorA.mainCallsPerSecond, `floor (a) ran with ${d}`).toBeGreaterThan(0);
    }
    for (const phase of ['main', 'dup', 'race', 'seq'] as const) {
      expect(report.tooltx[phase].errors, `tooltx ${phase} errors`).toBe(0);
      expect(report.tooltx[phase].callsPerSecond, `tooltx ${phase} ran`).toBeGreaterThan(0);
      expect(report.lowerBound.a[phase].callsPerSecond, `floor (a) ${phase} ran`).toBeGreaterThan(0);
      expect(report.lowerBound.b[phase].callsPerSecond, `floor (b) ${phase} ran`).toBeGreaterThan(0);
    }
    // Every service handled NATS messages and used CPU during the main phase.
    for (const name of ['authorizer', 'executor', 'reconciler', 'audit-projector'] as const) {
      expect(report.processes[name].natsMsgsPerCall, `${name} NATS messages`).toBeGreaterThan(0);
      expect(report.processes[name].rssPeakMB, `${name} RSS`).toBeGreaterThan(0);
    }
  }, 300_000);

  it('runs the peers workload on the co-located layout and floor-fsync: every phase, one line per key, no error', async () => {
    const { code, out, err } = await bench([
      '--workload',
      'peers',
      '--quick',
      '--json',
      '--systems',
      'tooltx-colocated,floor-fsync',
    ]);
    expect({ code, err: code === 0 ? '' : err }).toEqual({ code: 0, err: '' });
    const report = peersReportSchema.parse(JSON.parse(out.trim().split('\n').pop() ?? ''));
    expect(report.ok).toBe(true);
    expect(Object.keys(report.systems).sort()).toEqual(['floor-fsync', 'tooltx-colocated']);
    for (const name of ['tooltx-colocated', 'floor-fsync'] as const) {
      const s = report.systems[name]!;
      expect({ duplicates: s.duplicates, missing: s.missing }, name).toEqual({ duplicates: 0, missing: 0 });
      for (const phase of ['main', 'dup', 'race', 'seq'] as const) {
        expect(s[phase].errors, `${name} ${phase} errors`).toBe(0);
        expect(s[phase].callsPerSecond, `${name} ${phase} ran`).toBeGreaterThan(0);
      }
    }
    // No peer ran (--quick): every ratio against one is null.
    expect(Object.values(report.ratios).every((r) => r === null)).toBe(true);
  }, 120_000);
});
