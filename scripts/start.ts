/**
 * `npm start` — the embedded default: a local nats-server (unless NATS_URL is set) with its
 * JetStream store in the state directory, the streams applied, the research-KB storage service and
 * the four tooltx services as separate processes. Prints where to connect; Ctrl-C (SIGINT) or
 * SIGTERM stops everything cleanly.
 */
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { Command } from 'commander';
import { createLogger } from '@tooltx/runtime';
import { z } from 'zod';
import { DEFAULT_KB_TENANTS, startStack, type Stack } from '../examples/research-kb/stack.js';

const program = new Command('tooltx-start')
  .description('run tooltx locally: nats-server (unless NATS_URL), streams, the research KB, authorizer, executor, reconciler, audit-projector')
  .option('--port <port>', 'port of the embedded nats-server', process.env.NATS_PORT ?? '4222')
  .option('--kb-port <port>', 'port of the knowledge-base service', process.env.KB_PORT ?? '4280')
  .option('--state-dir <dir>', 'state directory (JetStream store, KB database)', process.env.TOOLTX_STATE_DIR ?? '.state')
  .option('--kb-dedup <on|off>', 'whether the KB deduplicates by key (honoursKey)', process.env.KB_DEDUP ?? 'on')
  .option(
    '--kb-tenants <file>',
    'the KB\'s tenant list with each tenant\'s quota in notes per UTC day (KB_SEED_FILE format); every tenant of the identity list must be in it',
    process.env.KB_SEED_FILE ?? DEFAULT_KB_TENANTS,
  )
  .parse(process.argv);
const opts = program.opts<{ port: string; kbPort: string; stateDir: string; kbDedup: string; kbTenants: string }>();

const port = z.coerce.number().int().min(1).max(65535);
const settings = z
  .object({
    port,
    kbPort: port,
    stateDir: z.string().min(1),
    kbTenants: z.string().min(1),
    kbDedup: z.enum(['on', 'off']),
    prefix: z.string().regex(/^[a-z][a-z0-9_]{0,31}$/, 'must match ^[a-z][a-z0-9_]{0,31}$'),
  })
  .safeParse({ ...opts, prefix: process.env.TOOLTX_PREFIX ?? 'tooltx' });
if (!settings.success) {
  process.stderr.write(`tooltx-start: invalid configuration:\n${z.prettifyError(settings.error)}\n`);
  process.exit(2);
}
const { prefix } = settings.data;
const log = createLogger({ service: 'start', instance: String(process.pid), level: process.env.LOG_LEVEL ?? 'info' });

// One stack per state directory: a second one would share its JetStream store and rewrite its
// seeds under the running one (fresh-user trial). A lock with our pid; a stale lock is taken over.
const stateDir = resolve(settings.data.stateDir);
const lockFile = join(stateDir, 'stack.pid');
mkdirSync(stateDir, { recursive: true });
try {
  const holder = Number(readFileSync(lockFile, 'utf8').trim());
  if (Number.isInteger(holder) && holder > 0 && holder !== process.pid && alive(holder)) {
    log.fatal({ stateDir, pid: holder }, `another npm start (pid ${holder}) uses ${stateDir}: stop it, or give --state-dir another directory`);
    process.exit(2);
  }
} catch {
  // no lock yet
}
writeFileSync(lockFile, `${process.pid}\n`);
process.once('exit', () => {
  try {
    if (readFileSync(lockFile, 'utf8').trim() === String(process.pid)) rmSync(lockFile);
  } catch {
    // already gone
  }
});

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

let stack: Stack;
try {
  stack = await startStack({
    stateDir,
    natsUrl: process.env.NATS_URL,
    natsPort: settings.data.port,
    prefix,
    kbPort: settings.data.kbPort,
    kbDedup: settings.data.kbDedup !== 'off',
    kbSeed: process.env.KB_SEED ?? 'acme:research,acme:archive,globex:research',
    kbTenants: settings.data.kbTenants,
    logs: process.stdout.isTTY ? 'pretty' : 'inherit',
    onRestart: (name, code, signal) => log.warn({ process: name, code, signal }, 'a service exited on its own: starting it again'),
  });
} catch (err) {
  log.fatal({ err: { type: (err as Error).name, message: (err as Error).message } }, 'could not start the stack (nothing left running)');
  process.exit(1);
}
log.info(
  { NATS_URL: stack.natsUrl, TOOLTX_PREFIX: prefix, KB_URL: stack.kbUrl, agentSeeds: join(resolve(opts.stateDir), 'auth', 'nkeys') },
  `tooltx is up — agents connect to ${stack.natsUrl} (prefix ${prefix}) with their nkey seed from ${join(stateDir, 'auth', 'nkeys')} and trust the receipt keys in ${stack.receiptKeysFile}; the KB listens on ${stack.kbUrl}; try \`NATS_URL=${stack.natsUrl} TOOLTX_STATE_DIR=${stateDir} TOOLTX_PREFIX=${prefix} npm run quickstart\`; Ctrl-C stops`,
);

let stopping = false;
async function stop(code = 0): Promise<void> {
  if (stopping) return;
  stopping = true;
  log.info('stopping');
  await stack.stop();
  log.info('stopped');
  process.exit(code);
}
process.on('SIGINT', () => void stop());
process.on('SIGTERM', () => void stop());
// Whoever started us (npm, a shell) went away without passing a signal on: stop rather than orphan the stack.
const parent = process.ppid;
setInterval(() => {
  if (process.ppid !== parent) {
    log.warn({ parent }, 'the parent process is gone: stopping');
    void stop();
  }
}, 1_000).unref();
void stack.crashed.then((name) => {
  log.error({ process: name }, 'a process exited on its own: stopping everything');
  void stop(1);
});
