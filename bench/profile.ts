/**
 * Summarises the CPU profiles `npm run bench -- --cpu-prof DIR` wrote (V8 `.cpuprofile` JSON):
 * per profile, the sampled time and its self time by area (our packages by directory, npm packages
 * by name, node internals, GC, idle) and the heaviest functions. Self time is attributed with each
 * sample's time delta (the V8 profile format: `samples[i]` ran for `timeDeltas[i + 1]` µs). The
 * sampler runs on wall-clock time: on a loaded machine a descheduled thread's wait is charged to the
 * frame it was in, so compare shares, not milliseconds (CPU time per call comes from /proc, run.ts).
 *
 * Usage: `tsx bench/profile.ts DIR [--top N] [--json]`.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Command } from 'commander';
import { usageErrorsExitTwo } from '@tooltx/runtime';

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

/** True for frames that belong to no package of ours or npm's: node internals and native code. */
function isRuntime(area: string): boolean {
  return area.startsWith('node:') || area === '(native)' || area === '(program)';
}

export interface ProfileSummary {
  file: string;
  sampledMs: number;
  busyMs: number;
  areas: { area: string; ms: number; share: number }[];
  /**
   * Self time charged to the nearest package on the stack: node internals and native frames
   * (socket writes, hashing, SQLite) count for the npm package or our directory that called them,
   * so "@nats-io/nats-core" includes the socket writes of NATS messages and "undici" those of HTTP
   * requests. The Error objects nats.js builds per request (async stack traces, and the one `RequestOne.cancel()` builds after every answer) are their own line.
   */
  owners: { owner: string; ms: number; share: number }[];
  functions: { fn: string; area: string; ms: number; share: number }[];
}

export function summarise(file: string, p: CpuProfile, top = 20): ProfileSummary {
  const byId = new Map(p.nodes.map((n) => [n.id, n]));
  const parent = new Map<number, number>();
  for (const n of p.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const ownerCache = new Map<number, string>();
  const ownerOf = (id: number): string => {
    const hit = ownerCache.get(id);
    if (hit) return hit;
    const n = byId.get(id)!;
    const area = areaOf(n.callFrame);
    let owner: string;
    if (
      n.callFrame.url.includes('@nats-io/nats-core') &&
      /^(RequestError|TimeoutError)$/.test(n.callFrame.functionName)
    )
      owner = 'nats.js per-request Error objects';
    else if (area === '(gc)' || area === '(idle)' || area === '(program)') owner = area;
    else if (!isRuntime(area)) owner = area;
    else {
      const up = parent.get(id);
      owner = up === undefined ? area : ownerOf(up);
      if (owner === '(root)' || owner === '(native)') owner = area;
    }
    ownerCache.set(id, owner);
    return owner;
  };
  const self = new Map<number, number>();
  for (let i = 0; i < p.samples.length; i++) {
    const dt = p.timeDeltas[i + 1] ?? 0;
    self.set(p.samples[i]!, (self.get(p.samples[i]!) ?? 0) + dt);
  }
  const areas = new Map<string, number>();
  const owners = new Map<string, number>();
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
    const owner = ownerOf(id);
    owners.set(owner, (owners.get(owner) ?? 0) + us);
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
    areas: [...areas]
      .filter(([a]) => a !== '(idle)')
      .sort((a, b) => b[1] - a[1])
      .map(([area, us]) => ({ area, ms: ms(us), share: share(us) })),
    owners: [...owners]
      .filter(([a]) => a !== '(idle)')
      .sort((a, b) => b[1] - a[1])
      .map(([owner, us]) => ({ owner, ms: ms(us), share: share(us) })),
    functions: [...fns]
      .filter(([, v]) => v.area !== '(idle)')
      .sort((a, b) => b[1].us - a[1].us)
      .slice(0, top)
      .map(([fn, v]) => ({ fn, area: v.area, ms: ms(v.us), share: share(v.us) })),
  };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const program = usageErrorsExitTwo(new Command('tooltx-bench-profile'))
    .description('summarise the .cpuprofile files of `npm run bench -- --cpu-prof DIR`')
    .argument('<dir>', 'directory of .cpuprofile files')
    .option('--top <n>', 'functions listed per profile', '20')
    .option('--json', 'print the summaries as JSON')
    .parse(process.argv);
  const dir = program.args[0]!;
  const o = program.opts<{ top: string; json?: boolean }>();
  const files = readdirSync(dir)
    .filter((f) => f.endsWith('.cpuprofile'))
    .sort();
  const out = files.map((f) =>
    summarise(f, JSON.parse(readFileSync(join(dir, f), 'utf8')) as CpuProfile, Number(o.top)),
  );
  if (o.json) process.stdout.write(`${JSON.stringify(out)}\n`);
  else {
    for (const s of out) {
      process.stdout.write(`\n== ${s.file}: ${s.busyMs} ms busy of ${s.sampledMs} ms sampled\n`);
      process.stdout.write(
        `  by owner (self time charged to the nearest package on the stack):\n${s.owners
          .slice(0, 15)
          .map((a) => `    ${a.owner.padEnd(28)} ${String(a.ms).padStart(9)} ms  ${String(a.share).padStart(5)} %`)
          .join('\n')}\n`,
      );
      process.stdout.write(
        `  by area (self time):\n${s.areas
          .slice(0, 15)
          .map((a) => `    ${a.area.padEnd(28)} ${String(a.ms).padStart(9)} ms  ${String(a.share).padStart(5)} %`)
          .join('\n')}\n`,
      );
      process.stdout.write(
        `  heaviest functions (self time):\n${s.functions.map((f) => `    ${String(f.ms).padStart(8)} ms ${String(f.share).padStart(5)} %  ${f.fn}`).join('\n')}\n`,
      );
    }
  }
}
