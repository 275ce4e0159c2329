/**
 * What the bench reads about processes and the nats-server, without touching them:
 * - CPU time of a process from `/proc/<pid>/stat` (utime + stime, fields 14 and 15, in clock ticks
 *   of `getconf CLK_TCK`, 100 on Linux x86-64 → 10 ms resolution; proc(5));
 * - peak resident memory from `/proc/<pid>/status` `VmHWM` (kB; proc(5));
 * - messages per NATS connection from the server's monitoring endpoint `/connz` (`in_msgs` = messages
 *   the client published to the server, `out_msgs` = messages the server delivered to it; NATS docs
 *   "Monitoring → Connection Information"). Services name their connections `<service>@<instance>`.
 */
import { readFileSync } from 'node:fs';

/** Clock ticks per second of `/proc/<pid>/stat` (CLK_TCK; 100 on every Linux we run on). */
const CLK_TCK = 100;

/** CPU ms (user + system) a process has used so far; the bench's own process via `process.cpuUsage()`. */
export function cpuMsOf(pid: number): number {
  if (pid === process.pid) {
    const u = process.cpuUsage();
    return (u.user + u.system) / 1000;
  }
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  // The command name (field 2) may contain spaces and parentheses: split after the last ')'.
  const rest = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // rest[0] is field 3 (state); utime is field 14 → rest[11], stime field 15 → rest[12].
  return ((Number(rest[11]) + Number(rest[12])) * 1000) / CLK_TCK;
}

/** Peak resident set size (VmHWM) of a process in MB, or null when it is gone. */
export function rssPeakMbOf(pid: number): number | null {
  try {
    const m = /VmHWM:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) / 1024 : null;
  } catch {
    return null;
  }
}

/** Messages of one NATS connection so far, as the server counts them. */
export interface ConnCounts {
  in: number;
  out: number;
}

/** `/connz` of the server's monitoring port: in/out messages per connection name (summed over same-named connections). */
export async function connCounts(monitorUrl: string): Promise<Map<string, ConnCounts>> {
  const res = await fetch(`${monitorUrl}/connz?limit=4096`);
  if (!res.ok) throw new Error(`connz answered ${res.status}`);
  const body = (await res.json()) as { connections?: { name?: string; in_msgs: number; out_msgs: number }[] };
  const out = new Map<string, ConnCounts>();
  for (const c of body.connections ?? []) {
    const name = c.name ?? '(unnamed)';
    const cur = out.get(name) ?? { in: 0, out: 0 };
    out.set(name, { in: cur.in + c.in_msgs, out: cur.out + c.out_msgs });
  }
  return out;
}

/** The server's total message counters (`/varz`). */
export async function serverCounts(monitorUrl: string): Promise<ConnCounts> {
  const res = await fetch(`${monitorUrl}/varz`);
  if (!res.ok) throw new Error(`varz answered ${res.status}`);
  const v = (await res.json()) as { in_msgs: number; out_msgs: number };
  return { in: v.in_msgs, out: v.out_msgs };
}
