/**
 * Per-hop breakdown of one tooltx call, from the nats-server's own protocol trace (`-V`): the
 * bench's stack (bench/tooltx.ts) runs `--calls` `kb.write_note` calls one at a time after a
 * warm-up, and every PUB/HPUB a connection sent and every MSG/HMSG the server delivered to it is
 * counted, per connection and per hop (what the message is: a pull request, a delivery, an ack, a
 * direct get and its answer, an append and its PubAck, a KV read or write, a status request and
 * its reply). A second table gives each call's timeline: when each step appeared at the server,
 * relative to the intent's publish (median over the calls).
 *
 * Tracing slows the server: use this for counting and for the order and relative size of the
 * gaps, never for throughput. Usage: `tsx bench/trace.ts [--calls N] [--json]`.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { Command } from 'commander';
import { usageErrorsExitTwo } from '@tooltx/runtime';
import { startTooltx } from './tooltx.js';

const program = usageErrorsExitTwo(new Command('tooltx-bench-trace'))
  .description('count the NATS messages of one tooltx call per connection and hop, from the nats-server trace')
  .option('--calls <n>', 'calls traced, one at a time', '20')
  .option('--warmup <n>', 'calls before tracing starts', '30')
  .option('--json', 'print the figures as one JSON object on the last line')
  .parse(process.argv);
const o = program.opts<{ calls: string; warmup: string; json?: boolean }>();
const calls = Number(o.calls);
const say = (s: string) => process.stderr.write(`${s}\n`);
const PREFIX = 'tooltx';

/** One protocol line of the trace: who, which direction, the verb and its arguments. */
interface TraceLine {
  atUs: number;
  conn: string;
  dir: 'in' | 'out';
  verb: 'PUB' | 'HPUB' | 'MSG' | 'HMSG';
  subject: string;
  reply: string | null;
  /** Total size (headers + payload), bytes. */
  bytes: number;
}

const LINE =
  /^\[\d+\] (\d{4})\/(\d\d)\/(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{6}) \[TRC\] \S+ - cid:\d+ - "[^"]*:nats\.js:([^"]*)" - (<<-|->>) \[(PUB|HPUB|MSG|HMSG) ([^\]]*)\]/;

export function parseTrace(text: string): TraceLine[] {
  const out: TraceLine[] = [];
  for (const l of text.split('\n')) {
    const m = LINE.exec(l);
    if (!m) continue;
    const [, y, mo, d, h, mi, s, us, conn, arrow, verb, args] = m as unknown as string[];
    const atUs = Date.UTC(Number(y), Number(mo) - 1, Number(d), Number(h), Number(mi), Number(s)) * 1000 + Number(us);
    const a = args!.split(' ').filter((x) => x !== '');
    const v = verb as TraceLine['verb'];
    // PUB subj [reply] size | HPUB subj [reply] hdr total | MSG subj sid [reply] size | HMSG subj sid [reply] hdr total
    const fixed = v === 'PUB' ? 2 : v === 'HPUB' ? 3 : v === 'MSG' ? 3 : 4;
    const reply = a.length > fixed ? (v === 'PUB' || v === 'HPUB' ? a[1]! : a[2]!) : null;
    out.push({
      atUs,
      conn: conn!,
      dir: arrow === '<<-' ? 'in' : 'out',
      verb: v,
      subject: a[0]!,
      reply,
      bytes: Number(a.at(-1)),
    });
  }
  return out;
}

/** The hop a message belongs to, in words; `requests` maps reply inboxes to what was asked. */
function hopOf(t: TraceLine, requests: Map<string, string>, durables: Set<string>): string {
  const s = t.subject;
  const stream = (x: string) => x.replace(/^TOOLTX_/, '').toLowerCase();
  if (t.dir === 'in') {
    let what: string;
    if (s.startsWith('$JS.API.CONSUMER.MSG.NEXT.')) {
      const [, , , , , st, c] = s.split('.');
      what = `pull request ${stream(st!)}/${durables.has(c!) ? c : 'ordered'}`;
    } else if (s.startsWith('$JS.ACK.')) {
      const [, , st, c] = s.split('.');
      what = `ack ${stream(st!)}/${durables.has(c!) ? c : 'ordered'}`;
    } else if (s.startsWith('$JS.API.DIRECT.GET.')) {
      const parts = s.split('.');
      const st = parts[4]!;
      what =
        parts.length > 5
          ? `direct get last ${st.startsWith('KV_') ? `KV ${st.slice(3)}` : stream(st)}`
          : `direct get by seq ${stream(st)}`;
    } else if (s.startsWith('$KV.')) what = `KV write ${s.split('.')[1]}`;
    else if (s.startsWith(`${PREFIX}.op.`)) what = 'append event';
    else if (s.startsWith(`${PREFIX}.intent.`)) what = 'publish intent';
    else if (s.startsWith(`${PREFIX}.status.`)) what = 'status request';
    else if (s.startsWith(`${PREFIX}.decision.`)) what = 'record decision';
    else if (s.startsWith('$JS.FC.')) what = 'flow control reply';
    else if (s.startsWith('$JS.API.')) what = `JS API ${s.split('.').slice(2, 4).join('.')}`;
    else if (s.startsWith('_INBOX.')) what = `reply to ${requests.get(s) ?? 'a request'}`;
    else what = s;
    if (t.reply) requests.set(t.reply, what);
    return what;
  }
  if (t.reply?.startsWith('$JS.ACK.')) {
    const [, , st, c] = t.reply.split('.');
    return `delivery ${stream(st!)}/${durables.has(c!) ? c : 'ordered'}`;
  }
  if (s.startsWith(`${PREFIX}.status.`)) {
    if (t.reply) requests.set(t.reply, 'status request');
    return 'status request delivered';
  }
  if (s.startsWith('_INBOX.')) {
    // A pull request's inbox gets its deliveries (with $JS.ACK replies, above) and status messages.
    const asked = requests.get(s) ?? [...requests].find(([r]) => s.startsWith(r.replace(/\*$/, '')))?.[1];
    return `answer to ${asked ?? 'a request'}`;
  }
  return `message on ${s.split('.').slice(0, 2).join('.')}`;
}

const median = (xs: number[]) => {
  const s = xs.slice().sort((a, b) => a - b);
  return s.length ? s[Math.floor((s.length - 1) / 2)]! : 0;
};

const root = mkdtempSync(join(tmpdir(), 'tooltx-trace-'));
const runId = randomBytes(4).toString('hex');
const sys = await startTooltx({ dir: root, prefix: PREFIX, runId, serverArgs: ['-V'] });
let text = '';
let capturing = false;
sys.server.handle.process!.stderr!.on('data', (c: string | Buffer) => {
  if (capturing) text += c.toString();
});
try {
  say(`trace: warm-up ${o.warmup} calls`);
  for (let k = 0; k < Number(o.warmup); k++) await sys.call(k);
  await new Promise((r) => setTimeout(r, 1_000));
  capturing = true;
  say(`trace: ${calls} calls, one at a time`);
  for (let k = 0; k < calls; k++) {
    const r = await sys.call(1_000_000 + k);
    if (!r.ok) throw new Error(`call failed: ${r.error}`);
  }
  await new Promise((r) => setTimeout(r, 1_000));
  capturing = false;
} finally {
  await sys.stop();
  rmSync(root, { recursive: true, force: true });
}

const lines = parseTrace(text);
const durables = new Set(['authorizer', 'executor', 'reconciler', 'audit-projector']);
const requests = new Map<string, string>();
const counts = new Map<string, Map<string, number>>();
for (const t of lines) {
  const hop = `${t.dir === 'in' ? '→ server' : '← server'}  ${hopOf(t, requests, durables)}`;
  const byHop = counts.get(t.conn) ?? new Map<string, number>();
  byHop.set(hop, (byHop.get(hop) ?? 0) + 1);
  counts.set(t.conn, byHop);
}

// Timeline of each call: the first time each step shows at the server, from the intent's publish.
const sdk = [...counts.keys()].find((c) => c.startsWith('tooltx-sdk')) ?? '';
const starts = lines
  .map((t, i) => ({ t, i }))
  .filter(({ t }) => t.conn === sdk && t.dir === 'in' && t.subject.startsWith(`${PREFIX}.intent.`));
const steps: Record<string, number[]> = {};
const add = (k: string, v: number) => (steps[k] ??= []).push(v / 1000);
for (let c = 0; c < starts.length; c++) {
  const from = starts[c]!;
  const to = starts[c + 1]?.i ?? lines.length;
  const seg = lines.slice(from.i, to);
  const t0 = from.t.atUs;
  const first = (f: (t: TraceLine) => boolean) => seg.find(f)?.atUs;
  const nth = (f: (t: TraceLine) => boolean, n: number) => seg.filter(f)[n]?.atUs;
  const points: [string, number | undefined][] = [
    ['intent PubAck at client', first((t) => t.conn === sdk && t.dir === 'out' && t.subject.startsWith('_INBOX.'))],
    [
      'intent delivered to authorizer',
      first((t) => t.conn.startsWith('authorizer') && t.dir === 'out' && t.subject.startsWith(`${PREFIX}.intent.`)),
    ],
    [
      'accepted appended (authorizer)',
      first((t) => t.conn.startsWith('authorizer') && t.dir === 'in' && t.subject.startsWith(`${PREFIX}.op.`)),
    ],
    [
      'accepted delivered to executor',
      first((t) => t.conn.startsWith('executor') && t.dir === 'out' && t.subject.startsWith(`${PREFIX}.op.`)),
    ],
    [
      'running appended (executor)',
      nth((t) => t.conn.startsWith('executor') && t.dir === 'in' && t.subject.startsWith(`${PREFIX}.op.`), 0),
    ],
    [
      'result stored (executor, KV)',
      first((t) => t.conn.startsWith('executor') && t.dir === 'in' && t.subject.startsWith('$KV.')),
    ],
    [
      'committed appended (executor)',
      nth((t) => t.conn.startsWith('executor') && t.dir === 'in' && t.subject.startsWith(`${PREFIX}.op.`), 1),
    ],
    ['final status answer at client', [...seg].reverse().find((t) => t.conn === sdk && t.dir === 'out')?.atUs],
  ];
  for (const [k, at] of points) if (at !== undefined) add(k, at - t0);
}

const perCall = Object.fromEntries(
  [...counts].map(([conn, byHop]) => [
    conn,
    {
      total: Math.round(([...byHop.values()].reduce((a, b) => a + b, 0) / calls) * 100) / 100,
      hops: Object.fromEntries(
        [...byHop].sort((a, b) => b[1] - a[1]).map(([h, n]) => [h, Math.round((n / calls) * 100) / 100]),
      ),
    },
  ]),
);
const timeline = Object.fromEntries(Object.entries(steps).map(([k, v]) => [k, Math.round(median(v) * 100) / 100]));

for (const [conn, f] of Object.entries(perCall)) {
  process.stdout.write(`\n${conn}: ${f.total} messages per call\n`);
  for (const [h, n] of Object.entries(f.hops)) process.stdout.write(`  ${String(n).padStart(6)}  ${h}\n`);
}
const total = Object.values(perCall).reduce((a, f) => a + f.total, 0);
// Sizes of what is stored per call: intents, lifecycle events, KV entries (headers + payload).
const stored = (f: (t: TraceLine) => boolean) => {
  const xs = lines.filter((t) => t.dir === 'in' && f(t)).map((t) => t.bytes);
  return {
    perCall: Math.round((xs.length / calls) * 100) / 100,
    meanBytes: xs.length ? Math.round(xs.reduce((a, b) => a + b, 0) / xs.length) : 0,
  };
};
const sizes = {
  intent: stored((t) => t.subject.startsWith(`${PREFIX}.intent.`)),
  event: stored((t) => t.subject.startsWith(`${PREFIX}.op.`)),
  kvResults: stored((t) => t.subject.startsWith(`$KV.${PREFIX}_results.`)),
  kvReconcile: stored((t) => t.subject.startsWith(`$KV.${PREFIX}_reconcile.`)),
  kvAudit: stored((t) => t.subject.startsWith(`$KV.${PREFIX}_audit.`)),
};
process.stdout.write(
  `\nall connections: ${Math.round(total * 100) / 100} messages per call (${calls} calls traced, one at a time)\n`,
);
process.stdout.write(
  `\npublished to streams per call (count, mean bytes with headers): ${Object.entries(sizes)
    .map(([k, v]) => `${k} ${v.perCall} × ${v.meanBytes} B`)
    .join(', ')}\n`,
);
process.stdout.write(
  `\ntimeline of a call at the server (median ms after the intent's publish; tracing slows every step):\n`,
);
for (const [k, v] of Object.entries(timeline)) process.stdout.write(`  ${String(v).padStart(8)}  ${k}\n`);
if (o.json) process.stdout.write(`${JSON.stringify({ calls, perCall, total, sizes, timeline })}\n`);
