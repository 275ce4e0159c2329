/**
 * Summarises the CPU profiles `npm run bench -- --cpu-prof DIR` wrote (V8 `.cpuprofile` JSON):
 * per profile, the sampled time and its self time by area (our packages by directory, npm packages
 * by name, node internals, GC, idle) and the heaviest functions. Self time is attributed with each
 * sample's time delta (the V8 profile format: `samples[i]` ran for `timeDeltas[i + 1]` µs).
 *
 * Usage: `tsx bench/profile.ts DIR [--top N] [--json]`.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Command } from 'commander';

interface CallFrame {
  functionName: string;
  url: string;
  lineNumber: number;
}
interface ProfileNode {
  id: number;
  callFrame: CallFrame;
  children?: number[];
}
interface CpuProfile {
  nodes: ProfileNode[];
  startTime: number;
  endTime: number;
  samples: number[];
  timeDeltas: number[];
}

/** The area a frame's code belongs to: `node_modules/<pkg>`, our directory, node internals, or a V8 pseudo-frame. */
export function areaOf(f: CallFrame): string {
  const u = f.url;
  if (!u) {
    if (f.functionName === '(garbage collector)') return '(gc)';
    if (f.functionName === '(idle)') return '(idle)';
    if (f.functionName === '(program)') return '(program)';
    return '(native)';
  }
  if (u.startsWith('node:')) return `node:${u.slice(5).split('/')[0]}`;
  const nm = u.lastIndexOf('/node_modules/');
  if (nm >= 0) {
    const rest = u.slice(nm + '/node_modules/'.length).split('/');
    return rest[0]!.startsWith('@') ? `${rest[0]}/${rest[1]}` : rest[0]!;
  }
  const m = /\/(libs\/[^/]+|services\/[^/]+|examples\/[^/]+|streams|bench)\//.exec(u);
  if (m) return m[1]!;
  return u.replace(/^file:\/\//, '');
}

export interface ProfileSummary {
  file: string;
  sampledMs: number;
  busyMs: number;
  areas: { area: string; ms: number; share: number }[];
  functions: { fn: string; area: string; ms: number; share: number }[];
}

export function summarise(file: string, p: CpuProfile, top = 20): ProfileSummary {
  const byId = new Map(p.nodes.map((n) => [n.id, n]));
  const self = new Map<number, number>();
  for (let i = 0; i < p.samples.length; i++) {
    const dt = p.timeDeltas[i + 1] ?? 0;
    self.set(p.samples[i]!, (self.get(p.samples[i]!) ?? 0) + dt);
  }
  const areas = new Map<string, number>();
  const fns = new Map<string, { area: string; us: number }>();
  let total = 0;
  let idle = 0;
  for (const [id, us] of self) {
    const n = byId.get(id);
    if (!n) continue;
    total += us;
    const area = areaOf(n.callFrame);
    if (area === '(idle)') idle += us;
    areas.set(area, (areas.get(area) ?? 0) + us);
    const short = n.callFrame.url.replace(/^.*\/(node_modules|libs|services|examples|streams|bench)\//, '$1/');
    const key = `${n.callFrame.functionName || '(anonymous)'} ${short}:${n.callFrame.lineNumber + 1}`;
    const cur = fns.get(key) ?? { area, us: 0 };
    cur.us += us;
    fns.set(key, cur);
  }
  const busy = total - idle;
  const ms = (us: number) => Math.round(us / 100) / 10;
  const share = (us: number) => (busy ? Math.round((us / busy) * 1000) / 10 : 0);
  return {
    file,
    sampledMs: ms(total),
    busyMs: ms(busy),
    areas: [...areas].filter(([a]) => a !== '(idle)').sort((a, b) => b[1] - a[1]).map(([area, us]) => ({ area, ms: ms(us), share: share(us) })),
    functions: [...fns].filter(([, v]) => v.area !== '(idle)').sort((a, b) => b[1].us - a[1].us).slice(0, top).map(([fn, v]) => ({ fn, area: v.area, ms: ms(v.us), share: share(v.us) })),
  };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const program = new Command('tooltx-bench-profile')
    .description('summarise the .cpuprofile files of `npm run bench -- --cpu-prof DIR`')
    .argument('<dir>', 'directory of .cpuprofile files')
    .option('--top <n>', 'functions listed per profile', '20')
    .option('--json', 'print the summaries as JSON')
    .parse(process.argv);
  const dir = program.args[0]!;
  const o = program.opts<{ top: string; json?: boolean }>();
  const files = readdirSync(dir).filter((f) => f.endsWith('.cpuprofile')).sort();
  const out = files.map((f) => summarise(f, JSON.parse(readFileSync(join(dir, f), 'utf8')) as CpuProfile, Number(o.top)));
  if (o.json) process.stdout.write(`${JSON.stringify(out)}\n`);
  else {
    for (const s of out) {
      process.stdout.write(`\n== ${s.file}: ${s.busyMs} ms busy of ${s.sampledMs} ms sampled\n`);
      process.stdout.write(`  by area (self time):\n${s.areas.slice(0, 15).map((a) => `    ${a.area.padEnd(28)} ${String(a.ms).padStart(9)} ms  ${String(a.share).padStart(5)} %`).join('\n')}\n`);
      process.stdout.write(`  heaviest functions (self time):\n${s.functions.map((f) => `    ${String(f.ms).padStart(8)} ms ${String(f.share).padStart(5)} %  ${f.fn}`).join('\n')}\n`);
    }
  }
}
