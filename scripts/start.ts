/**
 * `npm start` — the embedded default: a local nats-server (unless NATS_URL is set) with its
 * JetStream store in the state directory, the streams applied, and the four services as separate
 * processes. Prints where to connect; Ctrl-C (SIGINT) or SIGTERM stops everything cleanly.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { Command } from 'commander';
import { connectNats, jetStreamOf, spawnNatsServer, Subjects, type NatsServerHandle } from '@tooltx/nats';
import { applyTopology, topology } from '@tooltx/streams';
import { createLogger } from '@tooltx/runtime';

const program = new Command('tooltx-start')
  .description('run tooltx locally: nats-server (unless NATS_URL), streams, authorizer, executor, reconciler, audit-projector')
  .option('--port <port>', 'port of the embedded nats-server', process.env.NATS_PORT ?? '4222')
  .option('--state-dir <dir>', 'state directory (JetStream store, sample data)', process.env.TOOLTX_STATE_DIR ?? '.state')
  .option('--tools <module>', 'trusted tools module', process.env.TOOLTX_TOOLS_MODULE ?? 'examples/quickstart/tools.ts')
  .parse(process.argv);
const opts = program.opts<{ port: string; stateDir: string; tools: string }>();

const log = createLogger({ service: 'start', instance: String(process.pid), level: process.env.LOG_LEVEL ?? 'info' });
const stateDir = resolve(opts.stateDir);
mkdirSync(stateDir, { recursive: true });
const prefix = process.env.TOOLTX_PREFIX ?? 'tooltx';

let server: NatsServerHandle | null = null;
let url = process.env.NATS_URL;
if (!url) {
  server = await spawnNatsServer({ port: Number(opts.port), storeDir: join(stateDir, 'jetstream') });
  url = server.url;
  log.info({ url, store: server.storeDir }, 'nats-server started');
}

const nc = await connectNats({ servers: url, name: 'tooltx-start', reconnectForever: false });
const { jsm } = await jetStreamOf(nc);
const report = await applyTopology(nc, jsm, topology(new Subjects(prefix)));
await nc.drain();
log.info(report, 'streams applied');

const pretty = process.stdout.isTTY;
const children: ChildProcess[] = [];
for (const name of ['authorizer', 'executor', 'reconciler', 'audit-projector']) {
  const child = spawn(process.execPath, ['--import', 'tsx', join('services', name, 'src', 'main.ts')], {
    env: { ...process.env, NATS_URL: url, TOOLTX_PREFIX: prefix, TOOLTX_TOOLS_MODULE: resolve(opts.tools), TOOLTX_STATE_DIR: stateDir, TOOLTX_INSTANCE_ID: `${name}-1` },
    stdio: ['ignore', pretty ? 'pipe' : 'inherit', 'inherit'],
  });
  if (pretty && child.stdout) {
    const fmt = spawn(process.execPath, [join('node_modules', 'pino-pretty', 'bin.js'), '--colorize', '--ignore', 'pid,hostname,instance'], { stdio: ['pipe', 'inherit', 'inherit'] });
    child.stdout.pipe(fmt.stdin!);
  }
  child.once('exit', (code, signal) => {
    if (!stopping) {
      log.error({ service: name, code, signal }, 'service exited: stopping everything');
      void stop(1);
    }
  });
  children.push(child);
}
log.info({ NATS_URL: url, TOOLTX_PREFIX: prefix }, `tooltx is up — connect agents to ${url} (prefix ${prefix}); try \`npm run quickstart\`; Ctrl-C stops`);

let stopping = false;
async function stop(code = 0): Promise<void> {
  if (stopping) return;
  stopping = true;
  log.info('stopping services');
  await Promise.all(children.map((c) => (c.exitCode !== null || c.signalCode !== null ? undefined : new Promise((r) => { c.once('exit', r); c.kill('SIGTERM'); }))));
  await server?.stop({ removeStore: false });
  log.info('stopped');
  process.exit(code);
}
process.on('SIGINT', () => void stop());
process.on('SIGTERM', () => void stop());
