import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';
import { ensureStackBuild, type StackBuild } from '@tooltx/dev/compiled';
import { HOST_NODE_FLAGS, SERVICE_NODE_FLAGS } from '@tooltx/dev/stack';
import { kbServiceToken } from './kb-service-token.js';

export const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
export const SINK_TOOLS = join(ROOT, 'test', 'fixtures', 'sink-tools.ts');

/**
 * The tools modules the tests load, by the name of their entry in the tests' compiled build: the
 * stack's build (dev/src/compiled.ts) plus these fixtures, so a fixture and the service that loads
 * it share one `@tooltx/contracts`.
 */
const TEST_TOOLS_ENTRIES: Readonly<Record<string, string>> = {
  'sink-tools': 'test/fixtures/sink-tools.ts',
  'sink-tools-v2': 'test/fixtures/sink-tools-v2.ts',
  'sink-tools-v3': 'test/fixtures/sink-tools-v3.ts',
  'sink-tools-conflict': 'test/fixtures/sink-tools-conflict.ts',
  'research-plus-leaky-tools': 'test/fixtures/research-plus-leaky-tools.ts',
  'ledger-tools': 'examples/ledger/tools.ts',
  'debug-tools': 'test/fixtures/debug-tools.ts',
};
let testBuild: Promise<StackBuild> | undefined;
/** The tests' compiled build, built once per worker (cached on disk across runs by its inputs' hash). */
export const compiledTestBuild = (): Promise<StackBuild> =>
  (testBuild ??= ensureStackBuild({ extraEntries: TEST_TOOLS_ENTRIES }));

let cliBuild: Promise<StackBuild> | undefined;
/**
 * The `tooltx` CLI compiled (a run starts in about 0.5 s instead of 2.5 s under tsx), in a build of
 * its own: bundled with the stack's entries, bin/serve.ts would land in a chunk shared with the CLI,
 * where its "am I the entry" check never holds, and the stack's `serve` would start nothing.
 */
export const compiledCli = async (): Promise<string> =>
  (await (cliBuild ??= ensureStackBuild({ extraEntries: { 'tooltx-cli': 'bin/tooltx.ts' } }))).path('tooltx-cli');

/**
 * How a test process runs: `TOOLTX_TEST_RUNTIME=tsx` runs every spawned service under tsx (the
 * development path); by default a service whose tools module is in the compiled build runs compiled,
 * as `npm start` runs it (a process starts in ~0.35 s of CPU instead of ~0.7 s), and any other under tsx.
 */
async function serviceCommand(
  main: string,
  entry: ServiceName | 'kb-server' | 'serve',
  toolsModule: string | undefined,
  runtime: 'tsx' | undefined,
  nodeFlags: readonly string[] = SERVICE_NODE_FLAGS,
): Promise<{ args: string[]; toolsModule: string | undefined }> {
  const tsx = { args: [...nodeFlags, '--import', 'tsx', main], toolsModule };
  if (runtime === 'tsx' || process.env.TOOLTX_TEST_RUNTIME === 'tsx') return tsx;
  const byPath = new Map<string, string>([
    [join(ROOT, 'examples', 'research-kb', 'tools.ts'), 'tools'],
    ...Object.entries(TEST_TOOLS_ENTRIES).map(([name, rel]) => [join(ROOT, rel), name] as [string, string]),
  ]);
  const toolsEntry = toolsModule === undefined || toolsModule === '' ? undefined : byPath.get(toolsModule);
  if (toolsModule !== undefined && toolsModule !== '' && toolsEntry === undefined) return tsx;
  const build = await compiledTestBuild();
  return {
    args: [...nodeFlags, '--enable-source-maps', build.path(entry)],
    toolsModule: toolsEntry === undefined ? toolsModule : build.path(toolsEntry),
  };
}

export type ServiceName = 'authorizer' | 'executor' | 'reconciler' | 'audit-projector';

/**
 * Every process a test spawned, killed when the test worker exits: a `beforeAll` that fails half
 * way (one of several services never says "started") must not leave the others running.
 */
const spawned = new Set<ChildProcess>();
process.once('exit', () => {
  for (const c of spawned) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
});

/** A service running as its own OS process, with its JSON log lines collected. */
export class ServiceProcess {
  readonly name: string;
  readonly child: ChildProcess;
  readonly lines: Record<string, unknown>[] = [];
  stderr = '';
  readonly exited: Promise<number | null>;

  constructor(name: string, child: ChildProcess) {
    this.name = name;
    this.child = child;
    let buf = '';
    child.stdout!.setEncoding('utf8');
    child.stdout!.on('data', (c: string) => {
      buf += c;
      let i: number;
      while ((i = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, i);
        buf = buf.slice(i + 1);
        try {
          this.lines.push(JSON.parse(line) as Record<string, unknown>);
        } catch {
          this.lines.push({ raw: line });
        }
      }
    });
    child.stderr!.setEncoding('utf8');
    child.stderr!.on('data', (c: string) => (this.stderr += c));
    spawned.add(child);
    this.exited = new Promise((r) =>
      child.once('exit', (code) => {
        spawned.delete(child);
        r(code);
      }),
    );
  }

  /** Resolves when a log line with `msg === text` appears; rejects when the process exits first. */
  async waitForLog(text: string, timeoutMs = 20_000): Promise<Record<string, unknown>> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const hit = this.lines.find((l) => l.msg === text);
      if (hit) return hit;
      if (this.child.exitCode !== null)
        throw new Error(
          `${this.name} exited ${this.child.exitCode}: ${this.stderr}${JSON.stringify(this.lines.slice(-5))}`,
        );
      if (Date.now() > deadline)
        throw new Error(
          `${this.name}: no log "${text}" in ${timeoutMs} ms: ${JSON.stringify(this.lines.slice(-5))} ${this.stderr}`,
        );
      await new Promise((r) => setTimeout(r, 50));
    }
  }

  /** SIGTERM and wait for the exit code. */
  async stop(): Promise<number | null> {
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill('SIGTERM');
    return this.exited;
  }

  /** SIGKILL (a crash) and wait. */
  async kill(): Promise<void> {
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill('SIGKILL');
    await this.exited;
  }
}

/**
 * Spawns the service `name` with `env`, and waits for its "started" line. The V8 flags are the
 * stack's ({@link SERVICE_NODE_FLAGS}); compiled or under tsx as {@link serviceCommand} says.
 * `runtime: 'tsx'` when a test's own tsx-run code shares the deployment with it: a contract's full
 * digest covers its functions' source text, which tsx and esbuild print differently.
 */
export async function startService(
  name: ServiceName,
  env: Record<string, string>,
  opts: { wait?: boolean; runtime?: 'tsx' } = {},
): Promise<ServiceProcess> {
  // The service's own identity: its seed from the test server's generated auth.
  const seed = env.TOOLTX_TEST_NKEYS_DIR
    ? { NATS_NKEY_FILE: join(env.TOOLTX_TEST_NKEYS_DIR, `service.${name}.nk`) }
    : {};
  // The services that append `committed` sign receipts with their own key (FM-17).
  const signing =
    env.TOOLTX_TEST_NKEYS_DIR && (name === 'executor' || name === 'reconciler')
      ? { TOOLTX_SIGNING_KEY_FILE: join(env.TOOLTX_TEST_NKEYS_DIR, '..', 'signing', `${name}.pem`) }
      : {};
  // A service that talks to a KB carries the KB service token startKb gave that KB (helpers/kb.ts).
  const kbToken = env.KB_URL !== undefined ? { KB_SERVICE_TOKEN_FILE: kbServiceToken().file } : {};
  const fullEnv: Record<string, string | undefined> = {
    PATH: process.env.PATH ?? '',
    LOG_LEVEL: 'debug',
    TOOLTX_TOOLS_MODULE: SINK_TOOLS,
    TOOLTX_INSTANCE_ID: `${name}-${Math.random().toString(36).slice(2, 8)}`,
    ...seed,
    ...signing,
    ...kbToken,
    ...env,
  };
  const cmd = await serviceCommand(
    join(ROOT, 'services', name, 'src', 'main.ts'),
    name,
    fullEnv.TOOLTX_TOOLS_MODULE,
    opts.runtime,
  );
  if (cmd.toolsModule !== undefined) fullEnv.TOOLTX_TOOLS_MODULE = cmd.toolsModule;
  const child = spawn(process.execPath, cmd.args, {
    cwd: ROOT,
    env: fullEnv as NodeJS.ProcessEnv,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const p = new ServiceProcess(name, child);
  if (opts.wait !== false) await p.waitForLog('started');
  return p;
}

/**
 * Spawns `tooltx serve`: every role (or `roles`, comma-separated) in one process, each role on its
 * own connection as its own identity from the test server's generated auth (TOOLTX_AUTH_DIR), and
 * waits for its "started" lines. The process is named `tooltx`; its lines carry each role's `service`.
 */
export async function startHost(
  env: Record<string, string>,
  opts: { wait?: boolean; runtime?: 'tsx'; roles?: string } = {},
): Promise<ServiceProcess> {
  const auth = env.TOOLTX_TEST_NKEYS_DIR ? { TOOLTX_AUTH_DIR: join(env.TOOLTX_TEST_NKEYS_DIR, '..') } : {};
  const kbToken = env.KB_URL !== undefined ? { KB_SERVICE_TOKEN_FILE: kbServiceToken().file } : {};
  const fullEnv: Record<string, string | undefined> = {
    PATH: process.env.PATH ?? '',
    LOG_LEVEL: 'debug',
    TOOLTX_TOOLS_MODULE: SINK_TOOLS,
    TOOLTX_INSTANCE_ID: `tooltx-${Math.random().toString(36).slice(2, 8)}`,
    ...auth,
    ...kbToken,
    ...env,
    ...(opts.roles ? { TOOLTX_ROLES: opts.roles } : {}),
  };
  const cmd = await serviceCommand(
    join(ROOT, 'bin', 'serve.ts'),
    'serve',
    fullEnv.TOOLTX_TOOLS_MODULE,
    opts.runtime,
    HOST_NODE_FLAGS,
  );
  if (cmd.toolsModule !== undefined) fullEnv.TOOLTX_TOOLS_MODULE = cmd.toolsModule;
  const child = spawn(process.execPath, cmd.args, {
    cwd: ROOT,
    env: fullEnv as NodeJS.ProcessEnv,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const p = new ServiceProcess('tooltx', child);
  if (opts.wait !== false) {
    const roles = (opts.roles ?? 'audit-projector,reconciler,executor,authorizer').split(',').length;
    const deadline = Date.now() + 30_000;
    while (p.lines.filter((l) => l.msg === 'started').length < roles) {
      if (p.child.exitCode !== null) throw new Error(`tooltx serve exited ${p.child.exitCode}: ${p.stderr}`);
      if (Date.now() > deadline) throw new Error(`tooltx serve: not started in 30 s: ${p.stderr}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  return p;
}

/** Starts several services and returns a function that stops them all (SIGTERM) and their exit codes. */
export async function startAll(
  specs: [ServiceName, Record<string, string>][],
): Promise<{ procs: ServiceProcess[]; stopAll: () => Promise<(number | null)[]> }> {
  const procs = await Promise.all(specs.map(([n, e]) => startService(n, e)));
  return { procs, stopAll: () => Promise.all(procs.map((p) => p.stop())) };
}

/**
 * Runs a TypeScript script under tsx, as the services run, with only `env` (and PATH); its JSON
 * stdout lines are collected. `nice`: its scheduling priority (nice(1), 0 to 19).
 */
export function runScript(path: string, env: Record<string, string>, nice?: number): ServiceProcess {
  const [cmd, args] =
    nice === undefined
      ? [process.execPath, ['--import', 'tsx', path]]
      : ['nice', ['-n', String(nice), process.execPath, '--import', 'tsx', path]];
  const child = spawn(cmd, args, {
    cwd: ROOT,
    env: { PATH: process.env.PATH ?? '', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  return new ServiceProcess(path, child);
}
