/**
 * `npm start` — the embedded default: a local nats-server (unless NATS_URL is set) with its
 * JetStream store in the state directory, the streams applied, the research-KB storage service and
 * the tooltx roles: by default in one process (`--layout colocated`, `tooltx serve`), or each in its
 * own (`--layout services`). Prints where to connect; Ctrl-C (SIGINT) or SIGTERM stops everything
 * cleanly.
 *
 * No orphans: every process it starts stops by itself when this one is gone,
 * even after a SIGKILL (the KB and the services watch their parent, TOOLTX_EXIT_WITH_PARENT; the
 * nats-server gets SIGTERM through setpriv's parent-death signal where util-linux has it). The lock
 * `<state dir>/stack.pid` records this process and the pids of what it started, and a new start
 * refuses, naming them, while any of them is still alive — two nats-servers on one JetStream store
 * or two KBs on one SQLite file would corrupt them.
 *
 * A failure to start names the flag or variable and its value in one line (stderr, and a `failed
 * to start` log line with `setting`), never a stack trace; exit 2. A port already taken is refused
 * before anything is written, and a start that fails later removes what it created in the state
 * directory (the directory itself when it made it). The state directory is created 0700.
 *
 * Readiness does not depend on LOG_LEVEL: each process tells the supervisor over IPC when it is
 * ready (libs/runtime announceReady), and "tooltx is up — …" is printed at every level.
 */
import {
  accessSync,
  constants as fsConstants,
  existsSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { createServer } from 'node:net';
import { dirname, join, resolve } from 'node:path';
import { Command, Option } from 'commander';
import { z } from 'zod';
import {
  ConfigError,
  envInt,
  showValue,
  createLogger,
  describeError,
  displayUrl,
  failStartup,
  makeDirs,
  StartupError,
  stdoutDestination,
  type Logger,
  type StartupReporter,
  usageErrorsExitTwo,
} from '@tooltx/runtime';
import { DEFAULT_KB_TENANTS, startStack, type Stack, type StackPid } from '@tooltx/dev/stack';

const ENV_HELP = `
Environment (a flag given wins over its variable, shown above as "env:"):
  TOOLTX_PREFIX      subject prefix, ^[a-z][a-z0-9_]{0,31}$ (default tooltx)
  NATS_URL           use this nats-server instead of starting one; the streams are applied to it
  TOOLTX_AUTH_DIR    required with NATS_URL: the directory \`tooltx auth generate\` wrote for that
                     server (nkeys/*.nk, signing/*.pem, receipt-keys.json)
  TOOLTX_IDENTITIES  without NATS_URL: the identity list (JSON) the generated nats-server
                     configuration and nkeys are made from (default examples/research-kb/identities.json)
  KB_SEED            knowledge bases the KB creates if absent, tenant:kb[:actor+actor][,...]
                     (default acme:research,acme:archive,globex:research)
  NATS_SERVER_BIN    the nats-server binary, 2.10 or later (default: the project's own from
                     scripts/ensure-nats-server, .nats-server/trixie/; else one on PATH that is
                     2.10 or later — an older one is never used)
  TOOLTX_STACK_RUNTIME
                     compiled (default): the KB and the services run as JavaScript bundled on demand
                     into node_modules/.cache/tooltx-stack; tsx: from their TypeScript sources
  TOOLTX_AUDIT_HMAC_KEY_FILE, TOOLTX_LOG_HMAC_KEY_FILE
                     key files of the audit and log HMACs (default: generated in the state directory)
  LOG_LEVEL          fatal|error|warn|info|debug|trace|silent, for every process (default info);
                     the "tooltx is up" line is printed at every level
  Every other variable reaches the KB and the services as it is (their --help lists what they
  read, e.g. TOOLTX_CONCURRENCY, TOOLTX_RECONCILE_INTERVAL_MS, KB_TIMING_MS, WEB_ALLOWED_ORIGINS),
  but TOOLTX_TOOLS_MODULE, which is refused: the stack serves the research-KB sample's tools
  module (your own: docs/writing-tools.md).

State directory: jetstream/ (the JetStream store; jetstream-n1..n3/ with --cluster 3), kb.sqlite, auth/ (nats-server.conf or nats-server-n1..n3.conf, nkeys/,
signing/, receipt-keys.json), audit-hmac.key, log-hmac.key, kb-admin.token, kb-service.token (the
KB's service credential, given to the KB and the services that call it; KB_SERVICE_TOKEN_FILE
names another), and stack.pid — the lock naming this process and the processes it started; a second start on the same directory
refuses while any of them runs.

Exits 2 when it cannot start, naming the flag or variable and its value; 1 when a process of the
running stack fails for good. On a terminal the log lines are pretty-printed; else JSON lines.`;

// A variable set to the empty string counts as unset, here and in every process started from here
// (docs/operating.md "Configuration"; commander's .env() took `NATS_PORT=` for the value '').
for (const [name, value] of Object.entries(process.env)) if (value === '') delete process.env[name];

const program = usageErrorsExitTwo(new Command('tooltx-start'))
  .description(
    'run tooltx locally: nats-server (unless NATS_URL), streams, the research KB, and the roles (authorizer, executor, reconciler, audit-projector) in one process or each in its own',
  )
  .addOption(
    new Option(
      '--layout <colocated|services>',
      'colocated: every role in one process (tooltx serve), an accepted operation started in the same append; services: each role its own process (docs/performance.md)',
    )
      .env('TOOLTX_STACK_LAYOUT')
      .default('colocated'),
  )
  .addOption(new Option('--port <port>', 'port of the embedded nats-server').env('NATS_PORT').default('4222'))
  .addOption(new Option('--kb-port <port>', 'port of the knowledge-base service').env('KB_PORT').default('4280'))
  .addOption(
    new Option(
      '--console-port <port>',
      'start the console for operators and auditors on this port (docs/console.md); unset = no console',
    ).env('TOOLTX_CONSOLE_PORT'),
  )
  .addOption(
    new Option('--state-dir <dir>', 'state directory (JetStream store, KB database, keys, lock)')
      .env('TOOLTX_STATE_DIR')
      .default('.state'),
  )
  .addOption(
    new Option('--kb-dedup <on|off>', 'whether the KB deduplicates by key (honoursKey)').env('KB_DEDUP').default('on'),
  )
  .addOption(
    new Option(
      '--durability <fsync|os>',
      "fsync: the embedded nats-server fsyncs before every acknowledgement (sync_interval: always); os: it acknowledges what is in the OS's buffers and flushes every 2 minutes — a power failure or an OS crash can lose what was acknowledged since (docs/durability.md)",
    )
      .env('TOOLTX_DURABILITY')
      .default('fsync'),
  )
  .addOption(
    new Option(
      '--cluster <1|3>',
      'nodes of the embedded nats-server: 3 = a cluster on loopback (ports --port to --port+2), every stream and bucket R3 (docs/cluster.md)',
    )
      .env('TOOLTX_CLUSTER')
      .default('1'),
  )
  .addOption(
    new Option(
      '--kb-tenants <file>',
      "the KB's tenant list with each tenant's quota in notes per UTC day (KB_SEED_FILE format); every tenant of the identity list must be in it",
    )
      .env('KB_SEED_FILE')
      .default(DEFAULT_KB_TENANTS),
  )
  .addHelpText('after', ENV_HELP)
  .parse(process.argv);
const opts = program.opts<{
  port: string;
  kbPort: string;
  consolePort?: string;
  stateDir: string;
  kbDedup: string;
  kbTenants: string;
  durability: string;
  cluster: string;
  layout: string;
}>();

/** The flag of each option and the variable it falls back to. */
const FLAGS = {
  port: ['--port', 'NATS_PORT'],
  kbPort: ['--kb-port', 'KB_PORT'],
  consolePort: ['--console-port', 'TOOLTX_CONSOLE_PORT'],
  stateDir: ['--state-dir', 'TOOLTX_STATE_DIR'],
  kbDedup: ['--kb-dedup', 'KB_DEDUP'],
  kbTenants: ['--kb-tenants', 'KB_SEED_FILE'],
  durability: ['--durability', 'TOOLTX_DURABILITY'],
  cluster: ['--cluster', 'TOOLTX_CLUSTER'],
  layout: ['--layout', 'TOOLTX_STACK_LAYOUT'],
} as const;
type Flag = keyof typeof FLAGS;

/** How the operator set an option: the flag given, the variable set, or neither (both named). */
function named(key: Flag): { setting: string; env?: string } {
  const [flag, env] = FLAGS[key];
  const source = program.getOptionValueSource(key);
  if (source === 'env') return { setting: env };
  return source === 'cli' ? { setting: flag } : { setting: flag, env };
}
function optionError(key: Flag, problem: string, cause?: unknown): StartupError {
  const n = named(key);
  return new StartupError(n.setting, opts[key], problem, { cause, ...(n.env ? { env: n.env } : {}) });
}

/** The lock's content: this process and the processes of its stack. */
const lockSchema = z.object({
  pid: z.number().int().positive(),
  processes: z.array(z.object({ name: z.string(), pid: z.number().int().positive() })).default([]),
});
type Lock = z.infer<typeof lockSchema>;

const who: StartupReporter = { program: 'tooltx-start', service: 'start', instance: String(process.pid) };

// SIGTERM/SIGINT are handled from the module's first statement on, before anything is written that
// tells another process this one is there (the lock, the "up" line): a signal while the stack starts
// is kept and acted on once it is up. Handlers installed after such a write leave a window in which
// a preempted supervisor dies by the signal's default action (seen as CI flakes). A signal while
// the imports still load (the first ~0.5–1 s) ends the process by its default action (exit 143):
// nothing exists yet then — no lock, no state, no process.
let stopRequested = false;
let onStopSignal: () => void = () => void (stopRequested = true);
process.on('SIGINT', () => onStopSignal());
process.on('SIGTERM', () => onStopSignal());

/** Spaces alone are refused (docs/operating.md "Configuration"): never a directory named '  ', never port 0. */
const nonBlank = z.string().refine((v) => v.trim() !== '', 'spaces alone are not a value');
/** Decimal digits only: `0x10` and `1e3` are not ports (envInt). */
const port = nonBlank.pipe(envInt(1, 65535));
const path = nonBlank;
const settings = z
  .object({
    port,
    kbPort: port,
    consolePort: port.optional(),
    stateDir: path,
    kbTenants: path,
    kbDedup: z.enum(['on', 'off']),
    durability: z.enum(['fsync', 'os'], 'expected fsync or os'),
    layout: z.enum(['colocated', 'services'], 'expected colocated or services'),
    cluster: z
      .enum(['1', '3'], 'expected 1 (one server) or 3 (a cluster)')
      .transform((v) => (v === '3' ? 3 : 1) as 1 | 3),
    prefix: z.string().regex(/^[a-z][a-z0-9_]{0,31}$/, 'must match ^[a-z][a-z0-9_]{0,31}$'),
    logLevel: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']),
  })
  // The embedded nats-server and the KB cannot share a port; with NATS_URL there is no embedded one.
  .superRefine((o, ctx) => {
    if (process.env.NATS_URL) return;
    if (o.kbPort === o.port)
      ctx.addIssue({
        code: 'custom',
        path: ['kbPort'],
        message: "the same port as --port (the embedded nats-server's): give the KB another one",
      });
    else if (o.cluster === 3 && o.kbPort > o.port && o.kbPort <= o.port + 2)
      ctx.addIssue({
        code: 'custom',
        path: ['kbPort'],
        message:
          "a port of the embedded cluster's nodes (--port to --port+2 with --cluster 3): give the KB another one",
      });
    if (o.cluster === 3 && o.port > 65533)
      ctx.addIssue({
        code: 'custom',
        path: ['port'],
        message: "the cluster's nodes listen on --port to --port+2: at most 65533",
      });
  })
  .safeParse({ ...opts, prefix: process.env.TOOLTX_PREFIX ?? 'tooltx', logLevel: process.env.LOG_LEVEL ?? 'info' });
if (!settings.success) {
  const problems = settings.error.issues.map((i) => {
    const key = String(i.path[0]);
    if (key in FLAGS) return optionError(key as Flag, i.message).message;
    const env = key === 'prefix' ? 'TOOLTX_PREFIX' : 'LOG_LEVEL';
    return `${env}=${showValue(process.env[env] ?? '')}: ${i.message}`;
  });
  const names = settings.error.issues.map((i) => {
    const key = String(i.path[0]);
    return key in FLAGS ? named(key as Flag).setting : key === 'prefix' ? 'TOOLTX_PREFIX' : 'LOG_LEVEL';
  });
  failStartup(who, new ConfigError(problems, names));
}
const { prefix } = settings.data;
// The stack serves the research-KB sample, whose services load its own tools module: a module named
// here would be silently replaced. Your own tools run with the steps of docs/writing-tools.md.
if (process.env.TOOLTX_TOOLS_MODULE)
  failStartup(
    who,
    new StartupError(
      'TOOLTX_TOOLS_MODULE',
      process.env.TOOLTX_TOOLS_MODULE,
      'npm start always serves the research-KB sample and its tools module; to run your own tools module, start the services as docs/writing-tools.md "Run it" shows (or unset TOOLTX_TOOLS_MODULE)',
    ),
  );

// On a terminal, the supervisor's own lines are pretty like the services' (pino-pretty, a
// devDependency: JSON lines where it is not installed).
const log: Logger = createLogger({
  service: 'start',
  instance: String(process.pid),
  level: settings.data.logLevel,
  ...(process.stdout.isTTY ? await prettyStdout() : {}),
});
who.log = log;

// One stack per state directory: a second one would share its JetStream store and SQLite file and
// rewrite its seeds under the running one.
const stateDir = resolve(settings.data.stateDir);
const lockFile = join(stateDir, 'stack.pid');
// A nats-server binary named but not runnable, and a port something else listens on, refuse the
// start before anything is created or generated.
if (!process.env.NATS_URL && process.env.NATS_SERVER_BIN !== undefined)
  refuseNatsServerBin(process.env.NATS_SERVER_BIN);
if (!process.env.NATS_URL) {
  for (let i = 0; i < settings.data.cluster; i++) {
    await refuseTakenPort('port', '127.0.0.1', settings.data.port + i, (e, host, p) =>
      i === 0 ? describeError(e) : `node ${i + 1} of the cluster listens on ${host}:${p}: ${describeError(e)}`,
    );
  }
}
await refuseTakenPort(
  'kbPort',
  process.env.KB_HOST || '127.0.0.1',
  settings.data.kbPort,
  (e, host, p) => `cannot listen on ${host}:${p}: ${describeError(e)}`,
);
if (settings.data.consolePort !== undefined)
  await refuseTakenPort(
    'consolePort',
    '127.0.0.1',
    settings.data.consolePort,
    (e, host, p) => `cannot listen on ${host}:${p}: ${describeError(e)}`,
  );
/** What this run created in the state directory (removed again when the stack does not start). */
let createdDir: string | undefined;
let entriesBefore: Set<string>;
try {
  entriesBefore = new Set(existsSync(stateDir) ? readdirSync(stateDir) : []);
  // 0700: it holds keys, seeds and every tenant's notes.
  createdDir = makeDirs(stateDir, 0o700);
} catch (err) {
  failStartup(who, optionError('stateDir', `cannot create the state directory: ${describeError(err)}`, err));
}
takeLock();

let stack: Stack;
try {
  stack = await startStack({
    stateDir,
    natsUrl: process.env.NATS_URL || undefined,
    natsPort: settings.data.port,
    prefix,
    kbPort: settings.data.kbPort,
    kbDedup: settings.data.kbDedup !== 'off',
    durability: settings.data.durability,
    cluster: settings.data.cluster,
    layout: settings.data.layout,
    kbSeed: process.env.KB_SEED ?? 'acme:research,acme:archive,globex:research',
    kbTenants: settings.data.kbTenants,
    ...(settings.data.consolePort !== undefined ? { console: { port: settings.data.consolePort } } : {}),
    logs: process.stdout.isTTY ? 'pretty' : 'inherit',
    onRestart: (name, code, signal) =>
      log.warn({ process: name, code, signal }, 'a service exited on its own: starting it again'),
    onPids: writeLock,
  });
} catch (err) {
  removeWhatThisRunCreated();
  failStartup(who, asOption(err));
}
// Where to connect is printed at every LOG_LEVEL (an info line even when the level hides info).
const announce = log.isLevelEnabled('info') ? log : log.child({}, { level: 'info' });
// A NATS_URL given with a user and password is shown without them (the hint says where to put it back).
const shownUrl = displayUrl(stack.natsUrl);
// The seeds and receipt keys are in the state directory, or in TOOLTX_AUTH_DIR with an external server.
const aliceSeed = stack.seedFile({ kind: 'agent', tenant: 'acme', actor: 'alice' });
const agentSeeds = dirname(aliceSeed);
const quickstartEnv = process.env.NATS_URL
  ? `NATS_URL=${shellWord(shownUrl)} NATS_NKEY_FILE=${shellWord(aliceSeed)} TOOLTX_RECEIPT_KEYS_FILE=${shellWord(stack.receiptKeysFile)}`
  : `NATS_URL=${shellWord(shownUrl)} TOOLTX_STATE_DIR=${shellWord(stateDir)}`;
if (
  process.env.NATS_URL &&
  (program.getOptionValueSource('cluster') !== 'default' || program.getOptionValueSource('durability') !== 'default')
) {
  announce.warn(
    { NATS_URL: shownUrl },
    "--cluster and --durability shape the embedded nats-server only: with NATS_URL they change nothing (that server's own configuration decides; docs/durability.md)",
  );
}
if (stack.natsServer.durability === 'os') {
  announce.warn(
    { durability: 'os' },
    "durability os: nats-server acknowledges writes that are only in the OS's buffers (flushed every 2 minutes); a power failure or an OS crash can lose acknowledged operations, receipts included — use --durability fsync (the default) wherever that matters (docs/durability.md)",
  );
}
announce.info(
  {
    NATS_URL: shownUrl,
    TOOLTX_PREFIX: prefix,
    KB_URL: stack.kbUrl,
    ...(stack.mail ? { MAIL_URL: stack.mail.url } : {}),
    ...(stack.console ? { CONSOLE_URL: stack.console.url } : {}),
    agentSeeds,
    natsServer: stack.natsServer,
  },
  `tooltx is up — agents connect to ${shownUrl} (prefix ${prefix}) with their nkey seed from ${agentSeeds} and trust the receipt keys in ${stack.receiptKeysFile}; the KB listens on ${stack.kbUrl}${stack.mail ? `, the mail outbox on ${stack.mail.url}` : ''}${stack.console ? `; the console on ${stack.console.url} (each operator's and auditor's password in ${stack.console.passwordsDir})` : ''}; try \`${quickstartEnv} TOOLTX_PREFIX=${prefix} npm run quickstart\`; Ctrl-C stops`,
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
onStopSignal = () => void stop();
if (stopRequested) void stop();
// Whoever started us (npm, a shell) went away without passing a signal on: stop rather than orphan the stack.
const parent = process.ppid;
setInterval(() => {
  if (process.ppid !== parent) {
    log.warn({ parent }, 'the parent process is gone: stopping');
    void stop();
  }
}, 1_000).unref();
void stack.crashed.then(({ name, reason }) => {
  log.error({ process: name, reason }, `${reason}: stopping everything`);
  void stop(1);
});

/** Exits 2 naming NATS_SERVER_BIN when it is blank, missing, not a file or not executable. */
function refuseNatsServerBin(bin: string): void {
  const refuse = (problem: string): never => failStartup(who, new StartupError('NATS_SERVER_BIN', bin, problem));
  if (bin.trim() === '') refuse('spaces alone are not a value');
  try {
    const st = statSync(bin);
    if (!st.isFile()) refuse('not a file');
    // The mode bits too: access(X_OK) succeeds for root on a file nobody may execute.
    if ((st.mode & 0o111) === 0) refuse('not executable (chmod +x it, or name the nats-server binary)');
    accessSync(bin, fsConstants.X_OK);
  } catch (err) {
    refuse(describeError(err));
  }
}

/** `word` as one shell word (POSIX single quotes when it holds anything but safe characters), for a command line to copy. */
function shellWord(word: string): string {
  return /^[A-Za-z0-9_/.:,=@%+-]+$/.test(word) ? word : `'${word.replace(/'/g, `'\\''`)}'`;
}

/**
 * Exits 2 naming the option when `host:port` is taken (EADDRINUSE) or not ours to bind (EACCES): a
 * refused start must leave no state directory or keys behind. Port 0 (any free
 * one) and other errors are left to the process that listens there, which names them itself.
 */
async function refuseTakenPort(
  key: 'port' | 'kbPort' | 'consolePort',
  host: string,
  p: number,
  problem: (err: unknown, host: string, port: number) => string,
): Promise<void> {
  if (p === 0) return;
  const err = await new Promise<unknown>((done) => {
    const probe = createServer();
    probe.once('error', done);
    probe.listen({ port: p, host, exclusive: true }, () => probe.close(() => done(undefined)));
  });
  const code = (err as NodeJS.ErrnoException | undefined)?.code;
  if (code === 'EADDRINUSE' || code === 'EACCES') failStartup(who, optionError(key, problem(err, host, p), err));
}

/**
 * After a start that failed (the stack stopped everything it started): removes the state directory
 * when this run created it, else the entries this run added to it (keys, auth/, jetstream/,
 * kb.sqlite) — a refused start leaves nothing behind. Runs only while this
 * process holds the lock, so nothing of another start is touched.
 */
function removeWhatThisRunCreated(): void {
  try {
    if (createdDir !== undefined) {
      rmSync(createdDir, { recursive: true, force: true });
      return;
    }
    for (const entry of readdirSync(stateDir))
      if (!entriesBefore.has(entry) && entry !== 'stack.pid')
        rmSync(join(stateDir, entry), { recursive: true, force: true });
  } catch (err) {
    log.warn({ err, stateDir }, 'could not remove what the failed start created');
  }
}

/**
 * A setting of the stack named as the operator gave it: `KB_PORT` of the KB is `--kb-port` here
 * (or KB_PORT when that is how it was set), the KB's database is in `--state-dir`.
 */
function asOption(err: unknown): unknown {
  if (!(err instanceof StartupError)) return err;
  const keyOf: Record<string, Flag> = {
    NATS_PORT: 'port',
    KB_PORT: 'kbPort',
    TOOLTX_CONSOLE_PORT: 'consolePort',
    TOOLTX_STATE_DIR: 'stateDir',
    KB_DB: 'stateDir',
    KB_SEED_FILE: 'kbTenants',
    KB_DEDUP: 'kbDedup',
    TOOLTX_DURABILITY: 'durability',
  };
  const key = keyOf[err.setting];
  if (!key) return err;
  return optionError(
    key,
    err.setting === 'KB_DB' ? `${err.value ?? 'the KB database'}: ${err.problem}` : err.problem,
    err,
  );
}

/**
 * Takes the state directory's lock, or exits 2 naming who holds it: a live `npm start`, or processes
 * an earlier one started that still run (its supervisor was killed and they have not stopped yet —
 * or cannot, like a nats-server without setpriv). A lock whose processes are all gone is stale and
 * taken over. Created exclusively, so two starts at once cannot both take it.
 */
function takeLock(): void {
  for (let attempt = 0; attempt < 3; attempt++) {
    try {
      writeFileSync(lockFile, lockText([]), { flag: 'wx' });
      process.once('exit', () => {
        try {
          if (readLock()?.pid === process.pid) rmSync(lockFile);
        } catch {
          // already gone
        }
      });
      return;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST')
        failStartup(who, optionError('stateDir', `cannot write the lock ${lockFile}: ${describeError(err)}`, err));
    }
    const held = readLock();
    if (held && held.pid !== process.pid && ours(held.pid, 'start.ts')) {
      failStartup(
        who,
        optionError(
          'stateDir',
          `another npm start (pid ${held.pid}) uses this state directory: stop it (kill ${held.pid}), or give --state-dir another directory`,
        ),
      );
    }
    const alive = (held?.processes ?? []).filter((p) => ours(p.pid, markerOf(p.name)));
    if (alive.length) {
      const list = alive.map((p) => `${p.name} (pid ${p.pid})`).join(', ');
      failStartup(
        who,
        optionError(
          'stateDir',
          `processes of an earlier npm start on this state directory are still running: ${list}. They stop by themselves within seconds of their supervisor's end; if they do not, stop them (kill ${alive.map((p) => p.pid).join(' ')}) and start again`,
        ),
      );
    }
    // Stale: nobody of that stack runs any more.
    rmSync(lockFile, { force: true });
  }
  failStartup(
    who,
    optionError('stateDir', `cannot take the lock ${lockFile}: another start takes it at the same time`),
  );
}

function lockText(processes: StackPid[]): string {
  const lock: Lock = { pid: process.pid, processes };
  return `${JSON.stringify(lock)}\n`;
}

/** Rewrites the lock with the stack's processes (atomically: a reader never sees half of it). */
function writeLock(processes: StackPid[]): void {
  try {
    const tmp = `${lockFile}.${process.pid}.tmp`;
    writeFileSync(tmp, lockText(processes));
    renameSync(tmp, lockFile);
  } catch (err) {
    log.warn({ err, lockFile }, "could not record the stack's processes in the lock");
  }
}

/** The lock as written by this version (JSON) or an earlier one (the bare pid); null when unreadable. */
function readLock(): Lock | null {
  let text: string;
  try {
    text = readFileSync(lockFile, 'utf8').trim();
  } catch {
    return null;
  }
  if (/^\d+$/.test(text)) return { pid: Number(text), processes: [] };
  try {
    const r = lockSchema.safeParse(JSON.parse(text));
    return r.success ? r.data : null;
  } catch {
    return null;
  }
}

/** What a recorded process's command line holds (a recycled pid runs something else). */
function markerOf(name: string): string {
  return name.startsWith('nats-server') ? 'nats-server' : name === 'kb' ? 'kb-server.ts' : 'main.ts';
}

/**
 * Whether `pid` is alive and, where /proc tells (Linux), still runs the program `marker` names: a
 * pid recorded by a stack long gone may since belong to anything.
 */
function ours(pid: number, marker: string): boolean {
  try {
    process.kill(pid, 0);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EPERM') return false;
  }
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes(marker);
  } catch {
    return true;
  }
}

/** The logger's destination on a terminal: pino-pretty's formatter over stdout, line by line. */
async function prettyStdout(): Promise<{ destination?: { write(line: string): void } }> {
  try {
    const { prettyFactory } = (await import('pino-pretty')).default;
    const pretty = prettyFactory({ colorize: true, ignore: 'pid,hostname,instance' });
    const out = stdoutDestination();
    return { destination: { write: (line: string) => void out.write(pretty(line)) } };
  } catch {
    return {};
  }
}
