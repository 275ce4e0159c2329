/**
 * `npx tsx bench/reply-perms.ts [--rate 300] [--seconds 150] [--window 15] [--off-first]` — isolates the cause of
 * nats-server's CPU per call growing during a long tooltx run (docs/performance.md, "nats-server CPU
 * growing with calls"): a user with `allow_responses: true` that receives JetStream deliveries.
 *
 * One nats-server 2.9.10 (file storage, one stream `R` on `r.>`), two users: `pub` publishes
 * `--rate` messages/s to the stream; `svc` reads them through an ordered consumer (every delivery
 * carries a `$JS.ACK.…` reply subject, as the status watch's and the KV watches' deliveries do).
 * Run twice, on a fresh server each: `svc` with `allow_responses: true` (what the authorizer, the
 * audit-projector and the reconciler had), then with the same explicit allow-list and no
 * `allow_responses`. Per window: nats-server CPU µs per message (/proc/<pid>/stat). Prints a table
 * and one JSON object on the last line.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { connect } from '@nats-io/transport-node';
import { jetstream, jetstreamManager } from '@nats-io/jetstream';
import { spawnNatsServer } from '@tooltx/dev/nats-server';
import { cpuMsOf } from './proc.js';
import { round3 } from './workload.js';

const arg = (name: string, d: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : d;
};
const rate = arg('rate', 300);
const seconds = arg('seconds', 150);
const windowS = arg('window', 15);
const say = (s: string) => process.stderr.write(`${s}\n`);

async function run(allowResponses: boolean): Promise<{ t: number; usPerMsg: number; msgs: number }[]> {
  const dir = mkdtempSync(join(tmpdir(), 'reply-perms-'));
  const conf = join(dir, 'nats.conf');
  writeFileSync(
    conf,
    [
      `jetstream { store_dir: ${JSON.stringify(join(dir, 'js'))} }`,
      'authorization { users: [',
      '  { user: pub, password: pub, permissions: { publish: { allow: [">"] }, subscribe: { allow: [">"] } } },',
      `  { user: svc, password: svc, permissions: { publish: { allow: ["$JS.API.>", "$JS.ACK.>", "$JS.FC.>"] }, subscribe: { allow: ["_INBOX.>"] }${allowResponses ? ', allow_responses: true' : ''} } }`,
      ']}',
      '',
    ].join('\n'),
  );
  const server = await spawnNatsServer({ storeDir: join(dir, 'js'), extraArgs: ['-c', conf] });
  const pid = server.process!.pid!;
  const pub = await connect({ servers: server.url, user: 'pub', pass: 'pub', noAsyncTraces: true });
  const svc = await connect({ servers: server.url, user: 'svc', pass: 'svc', noAsyncTraces: true });
  const out: { t: number; usPerMsg: number; msgs: number }[] = [];
  try {
    await (await jetstreamManager(pub)).streams.add({ name: 'R', subjects: ['r.>'], storage: 'file' as never });
    let received = 0;
    const c = await jetstream(svc).consumers.get('R'); // ordered consumer: no acks, like a watch
    const it = await c.consume();
    void (async () => {
      for await (const _m of it) received++;
    })();
    const js = jetstream(pub);
    let sent = 0;
    const started = Date.now();
    let stop = false;
    const publisher = (async () => {
      while (!stop) {
        const due = Math.floor(((Date.now() - started) / 1000) * rate);
        const batch: Promise<unknown>[] = [];
        while (sent < due) batch.push(js.publish(`r.${sent++}`, new Uint8Array(200)));
        await Promise.all(batch);
        await new Promise((r) => setTimeout(r, 10));
      }
    })();
    for (let t = windowS; t <= seconds; t += windowS) {
      const cpu0 = cpuMsOf(pid);
      const r0 = received;
      await new Promise((r) => setTimeout(r, windowS * 1000));
      const msgs = received - r0;
      const usPerMsg = round3(((cpuMsOf(pid) - cpu0) * 1000) / Math.max(1, msgs));
      out.push({ t, usPerMsg, msgs });
      say(
        `  allow_responses ${allowResponses ? 'on ' : 'off'} t=${t}s: ${msgs} msgs, nats-server ${usPerMsg} µs/msg, load ${loadavg()[0]!.toFixed(2)}`,
      );
    }
    stop = true;
    await publisher;
    it.stop();
  } finally {
    await svc.close();
    await pub.close();
    await server.stop({ removeStore: true });
    rmSync(dir, { recursive: true, force: true });
  }
  return out;
}

const load0 = loadavg();
// `--off-first`: the run without allow_responses first (the two orders, to rule out the load moving).
const offFirst = process.argv.includes('--off-first');
const off0 = offFirst ? await run(false) : null;
const on = await run(true);
const off = off0 ?? (await run(false));
const load1 = loadavg();
process.stdout.write(`\nt (s)  allow_responses on µs/msg  off µs/msg\n`);
for (let i = 0; i < on.length; i++)
  process.stdout.write(
    `${String(on[i]!.t).padStart(5)}  ${String(on[i]!.usPerMsg).padStart(24)}  ${String(off[i]?.usPerMsg ?? '').padStart(10)}\n`,
  );
process.stdout.write(
  `load average at start ${load0.map((x) => x.toFixed(2)).join(' ')}, at end ${load1.map((x) => x.toFixed(2)).join(' ')}\n`,
);
process.stdout.write(`${JSON.stringify({ rate, seconds, windowS, load0, load1, on, off })}\n`);
