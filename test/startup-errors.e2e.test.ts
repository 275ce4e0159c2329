/**
 * A process that cannot start says which setting and which value: error
 * messages are redacted from logs at run time (FM-16), but a failure to START is the operator's own
 * configuration — one line on stderr naming the variable or flag and its value (never a secret: a
 * URL's password, a seed), and a `failed to start` log line with `setting`. Real processes: the
 * services, the KB and `npm start`; a real nats-server where one is needed.
 */
import { spawn } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { provisioned, type TestNats } from './helpers/nats.js';
import { RESEARCH_TOOLS, spawnKbProcess } from './helpers/kb.js';
import { ServiceProcess, startService, type ServiceName } from './helpers/services.js';
import { closedPort as freePort } from './helpers/net.js';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..');
const ALL: ServiceName[] = ['authorizer', 'executor', 'reconciler', 'audit-projector'];

let dir: string;
/** A port something listens on (taken), and one nothing listens on. */
let taken: Server;
let takenPort: number;
let closedPort: number;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'tooltx-startup-'));
  taken = createServer();
  await new Promise<void>((r) => taken.listen(0, '127.0.0.1', r));
  takenPort = (taken.address() as { port: number }).port;
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  closedPort = (s.address() as { port: number }).port;
  await new Promise((r) => s.close(r));
});
afterAll(async () => {
  await new Promise((r) => taken.close(r));
  rmSync(dir, { recursive: true, force: true });
});

/** The one `failed to start` line of a process that exited 2, and its stderr. */
async function failure(p: ServiceProcess): Promise<{ line: Record<string, unknown>; stderr: string }> {
  expect(await p.exited, p.stderr).toBe(2);
  const lines = p.lines.filter((l) => l.msg === 'failed to start');
  expect(lines).toHaveLength(1);
  expect(p.stderr).not.toMatch(/\n\s+at /); // never a stack trace
  return { line: lines[0]!, stderr: p.stderr };
}

/** Runs `script` with only `env` (plus PATH), in `cwd` (tsx is loaded by its path: it resolves from any directory). */
function run(script: string, args: string[], env: Record<string, string>, cwd = ROOT): ServiceProcess {
  const tsx = pathToFileURL(join(ROOT, 'node_modules', 'tsx', 'dist', 'loader.mjs')).href;
  const child = spawn(process.execPath, ['--import', tsx, join(ROOT, script), ...args], {
    cwd,
    env: { PATH: process.env.PATH ?? '', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  return new ServiceProcess(script, child);
}

describe('a service that cannot start', () => {
  it("names the tools module, the nkey or credentials file, or the server, with the value — never a URL's password", async () => {
    const cases: { env: Record<string, string>; setting: string; value: string; says: string }[] = [
      {
        env: { TOOLTX_TOOLS_MODULE: join(dir, 'nope', 'tools.ts') },
        setting: 'TOOLTX_TOOLS_MODULE',
        value: join(dir, 'nope', 'tools.ts'),
        says: 'no such file',
      },
      {
        env: { TOOLTX_TOOLS_MODULE: join(ROOT, 'libs', 'runtime', 'src', 'config.ts') },
        setting: 'TOOLTX_TOOLS_MODULE',
        value: join(ROOT, 'libs', 'runtime', 'src', 'config.ts'),
        says: 'must export a non-empty `implementations` array',
      },
      {
        env: { NATS_NKEY_FILE: join(dir, 'nope.nk') },
        setting: 'NATS_NKEY_FILE',
        value: join(dir, 'nope.nk'),
        says: 'ENOENT',
      },
      { env: { NATS_CREDS_FILE: dir }, setting: 'NATS_CREDS_FILE', value: dir, says: 'EISDIR' },
      {
        env: { NATS_URL: `nats://alice:s3cret-pw@127.0.0.1:${closedPort}` },
        setting: 'NATS_URL',
        value: `nats://[redacted]@127.0.0.1:${closedPort}`,
        says: 'ECONNREFUSED',
      },
      // `.invalid` never resolves (RFC 2606): ENOTFOUND, or EAI_AGAIN without a resolver.
      {
        env: { NATS_URL: 'nats://tooltx-trial.invalid:4222' },
        setting: 'NATS_URL',
        value: 'nats://tooltx-trial.invalid:4222',
        says: 'the host name does not resolve',
      },
      // The research tools module's own settings, named the same way.
      {
        env: { TOOLTX_TOOLS_MODULE: RESEARCH_TOOLS, KB_TIMING_MS: '5000,abc' },
        setting: 'KB_TIMING_MS',
        value: '5000,abc',
        says: 'three positive integers',
      },
      {
        env: { TOOLTX_TOOLS_MODULE: RESEARCH_TOOLS, KB_DEDUP: 'maybe' },
        setting: 'KB_DEDUP',
        value: 'maybe',
        says: 'expected "on" or "off"',
      },
      {
        env: { TOOLTX_TOOLS_MODULE: RESEARCH_TOOLS, KB_KEEPALIVE: 'yes' },
        setting: 'KB_KEEPALIVE',
        value: 'yes',
        says: 'expected "on" or "off"',
      },
      {
        env: { TOOLTX_TOOLS_MODULE: RESEARCH_TOOLS, KB_READ_POLICY_CACHE_MS: '1e3' },
        setting: 'KB_READ_POLICY_CACHE_MS',
        value: '1e3',
        says: 'integer number of ms from 0 to 60000',
      },
      // The mail tools' settings, read by the same module.
      {
        env: { TOOLTX_TOOLS_MODULE: RESEARCH_TOOLS, MAIL_DEDUP: 'sometimes' },
        setting: 'MAIL_DEDUP',
        value: 'sometimes',
        says: 'expected "on" or "off"',
      },
      {
        env: { TOOLTX_TOOLS_MODULE: RESEARCH_TOOLS, MAIL_TIMING_MS: '1,2' },
        setting: 'MAIL_TIMING_MS',
        value: '1,2',
        says: 'three positive integers',
      },
    ];
    for (const c of cases) {
      const p = await startService(
        'authorizer',
        { NATS_URL: `nats://127.0.0.1:${closedPort}`, ...c.env },
        { wait: false },
      );
      const { line, stderr } = await failure(p);
      expect(line).toMatchObject({ setting: c.setting, value: c.value });
      expect(String(line.problem)).toContain(c.says);
      // One line on stderr: the program, the setting with its value, the problem.
      expect(stderr.trim().split('\n')).toEqual([
        expect.stringContaining(`tooltx-authorizer: cannot start: ${c.setting}=${c.value}: `),
      ]);
      expect(stderr).toContain(c.says);
      expect(JSON.stringify(p.lines) + stderr).not.toContain('s3cret-pw');
    }
  });

  it('names the nkey file the server refuses: not a seed, or an identity the server does not know', async () => {
    const t: TestNats = await provisioned();
    try {
      writeFileSync(join(dir, 'not-a-seed.nk'), 'hello\n', { mode: 0o600 });
      const p = await startService(
        'authorizer',
        { ...t.env, NATS_NKEY_FILE: join(dir, 'not-a-seed.nk') },
        { wait: false },
      );
      const { line } = await failure(p);
      expect(line).toMatchObject({
        setting: 'NATS_NKEY_FILE',
        value: join(dir, 'not-a-seed.nk'),
        problem: expect.stringContaining('not an nkey seed'),
      });
      // A seed file given as a creds file: named, its text never shown.
      const creds = await failure(
        await startService(
          'authorizer',
          {
            ...t.env,
            NATS_NKEY_FILE: '',
            NATS_CREDS_FILE: t.auth.seedFile({ kind: 'service', service: 'authorizer' }),
          },
          { wait: false },
        ),
      );
      expect(creds.line).toMatchObject({
        setting: 'NATS_CREDS_FILE',
        problem: 'not a .creds file (a JWT and an nkey seed)',
      });
      // Another service's seed: the identity is named, not the prefix.
      const otherSeed = await failure(
        await startService(
          'authorizer',
          { ...t.env, NATS_NKEY_FILE: t.auth.seedFile({ kind: 'service', service: 'reconciler' }) },
          { wait: false },
        ),
      );
      expect(otherSeed.line).toMatchObject({
        setting: 'NATS_NKEY_FILE',
        problem: expect.stringContaining("this identity is not the authorizer service's"),
      });
      // A durable that is not there.
      const durable = await failure(
        await startService('executor', { ...t.env, TOOLTX_EXECUTOR_DURABLE: 'nosuch' }, { wait: false }),
      );
      expect(durable.line).toMatchObject({
        setting: 'TOOLTX_EXECUTOR_DURABLE',
        value: 'nosuch',
        problem: expect.stringContaining('no durable consumer of that name'),
      });
      // Someone else's server: a valid seed of another deployment.
      const other: TestNats = await provisioned();
      try {
        const q = await startService(
          'authorizer',
          { ...t.env, NATS_NKEY_FILE: other.auth.seedFile({ kind: 'service', service: 'authorizer' }) },
          { wait: false },
        );
        const refused = await failure(q);
        expect(refused.line).toMatchObject({
          setting: 'NATS_NKEY_FILE',
          problem: expect.stringContaining('refused this identity'),
        });
      } finally {
        await other.close();
      }
    } finally {
      await t.close();
    }
  });

  it('every bad variable is named with its value, spaces alone are refused, and a variable set empty counts as unset (docs/operating.md "Configuration")', async () => {
    const p = await startService(
      'executor',
      {
        NATS_URL: '  ',
        LOG_LEVEL: 'verbose',
        TOOLTX_CONCURRENCY: '0',
        TOOLTX_INSTANCE_ID: '',
        TOOLTX_PREFIX: '',
        TOOLTX_TOOLS_MODULE: RESEARCH_TOOLS,
      },
      { wait: false },
    );
    const { line, stderr } = await failure(p);
    // The empty TOOLTX_INSTANCE_ID and TOOLTX_PREFIX took their defaults: not among the problems.
    expect(line.settings).toEqual(['NATS_URL', 'LOG_LEVEL', 'TOOLTX_CONCURRENCY']);
    expect(line).toMatchObject({ setting: 'NATS_URL', value: '  ' });
    expect(stderr.split('\n')).toEqual([
      'tooltx-executor: invalid configuration:',
      '  - NATS_URL="  ": spaces alone are not a value: unset it (or set it empty) for the default',
      expect.stringMatching(/^ {2}- LOG_LEVEL=verbose: Invalid option: expected one of "fatal"/),
      '  - TOOLTX_CONCURRENCY=0: expected an integer 1..1024',
      '',
    ]);
    // A URL's user-info never shows, even in a configuration error next to it.
    const q = await failure(
      await startService(
        'executor',
        { NATS_URL: 'nats://alice:s3cret-pw@127.0.0.1:1', LOG_LEVEL: 'verbose', TOOLTX_TOOLS_MODULE: RESEARCH_TOOLS },
        { wait: false },
      ),
    );
    expect(q.stderr).toContain('LOG_LEVEL=verbose: ');
    expect(JSON.stringify(q.line) + q.stderr).not.toContain('s3cret-pw');
  });

  it("the reconciler's own settings are validated: an interval that is not a positive integer, a sweep that is not on|off (exit 2, each named)", async () => {
    for (const env of [
      { TOOLTX_RECONCILE_INTERVAL_MS: '-5', TOOLTX_RECONCILE_SWEEP: 'maybe' },
      { TOOLTX_RECONCILE_INTERVAL_MS: 'abc', TOOLTX_RECONCILE_SWEEP: 'OFF' },
      { TOOLTX_RECONCILE_INTERVAL_MS: '0', TOOLTX_RECONCILE_SWEEP: 'false' },
    ]) {
      const p = await startService(
        'reconciler',
        { NATS_URL: `nats://127.0.0.1:${closedPort}`, TOOLTX_SIGNING_KEY_FILE: join(dir, 'unused.pem'), ...env },
        { wait: false },
      );
      const { line, stderr } = await failure(p);
      expect(line.settings).toEqual(['TOOLTX_RECONCILE_INTERVAL_MS', 'TOOLTX_RECONCILE_SWEEP']);
      expect(stderr).toContain('tooltx-reconciler: invalid configuration:');
      expect(stderr).toContain('TOOLTX_RECONCILE_INTERVAL_MS');
      expect(stderr).toContain('TOOLTX_RECONCILE_SWEEP');
    }
  });

  it('the hold and batch settings take decimal integers only: a blank, hex, an exponent or a fraction is refused, never read as 0 or as a number (exit 2, each named)', async () => {
    for (const bad of [' ', '0x10', '1e3', '1.5', '-1', '60001']) {
      const r = await failure(
        await startService(
          'reconciler',
          {
            NATS_URL: `nats://127.0.0.1:${closedPort}`,
            TOOLTX_SIGNING_KEY_FILE: join(dir, 'unused.pem'),
            TOOLTX_RECONCILE_INDEX_DELAY_MS: bad,
          },
          { wait: false },
        ),
      );
      expect(r.line.settings, JSON.stringify(bad)).toEqual(['TOOLTX_RECONCILE_INDEX_DELAY_MS']);
      const a = await failure(
        await startService(
          'audit-projector',
          {
            NATS_URL: `nats://127.0.0.1:${closedPort}`,
            TOOLTX_AUDIT_HMAC_KEY_FILE: join(dir, 'unused.key'),
            TOOLTX_AUDIT_BATCH_MS: bad,
          },
          { wait: false },
        ),
      );
      expect(a.stderr, JSON.stringify(bad)).toContain('TOOLTX_AUDIT_BATCH_MS');
    }
  });

  it('the audit-projector reports a bad key file as the others report configuration: a plain list on stderr, before connecting', async () => {
    const key = join(dir, 'audit.key');
    writeFileSync(key, `${'k'.repeat(64)}\n`);
    chmodSync(key, 0o644);
    const p = await startService(
      'audit-projector',
      { NATS_URL: `nats://127.0.0.1:${closedPort}`, TOOLTX_AUDIT_HMAC_KEY_FILE: key },
      { wait: false },
    );
    const { line, stderr } = await failure(p);
    expect(stderr).toBe(
      `tooltx-audit-projector: invalid configuration: TOOLTX_AUDIT_HMAC_KEY_FILE: ${key}: mode 644 lets others read the key; chmod 600 it\n`,
    );
    expect(line).toMatchObject({ setting: 'TOOLTX_AUDIT_HMAC_KEY_FILE' });
    expect(JSON.stringify(p.lines) + stderr).not.toContain('k'.repeat(32));
  });

  it("--help lists every variable the service reads, the tools module's among them", async () => {
    for (const name of ALL) {
      const p = run(`services/${name}/src/main.ts`, ['--help'], { TOOLTX_TOOLS_MODULE: RESEARCH_TOOLS });
      expect(await p.exited).toBe(0);
      const out = p.lines.map((l) => String(l.raw ?? '')).join('\n');
      for (const v of [
        'NATS_URL',
        'NATS_NKEY_FILE',
        'NATS_CREDS_FILE',
        'TOOLTX_PREFIX',
        'TOOLTX_TOOLS_MODULE',
        'TOOLTX_CONCURRENCY',
        'TOOLTX_INSTANCE_ID',
        'LOG_LEVEL',
        'TOOLTX_LOG_HMAC_KEY_FILE',
        'TOOLTX_EXIT_WITH_PARENT',
        'TOOLTX_MAX_DELIVER',
        'TOOLTX_REPLICAS',
        'TOOLTX_EVENTS_MAX_AGE_MS',
        'KB_URL',
        'KB_DEDUP',
        'KB_TIMING_MS',
        'KB_KEEPALIVE',
        'KB_READ_POLICY_CACHE_MS',
        'WEB_ALLOWED_ORIGINS',
      ]) {
        expect(out, `${name} --help`).toContain(v);
      }
      // The sample's settings come from its own module, not from tooltx's text.
      expect(out).toContain(`Read by the tools module (${RESEARCH_TOOLS}) — settings of that module, not of tooltx:`);
    }
    // Without a tools module named, --help says where its settings would appear, and names none of the sample's.
    const bare = run('services/executor/src/main.ts', ['--help'], {});
    expect(await bare.exited).toBe(0);
    const bareOut = bare.lines.map((l) => String(l.raw ?? '')).join('\n');
    expect(bareOut).toContain("The tools module's own settings are listed here when TOOLTX_TOOLS_MODULE names it.");
    expect(bareOut).not.toContain('KB_URL');
    const help = async (name: ServiceName) => {
      const p = run(`services/${name}/src/main.ts`, ['--help'], {});
      await p.exited;
      return p.lines.map((l) => String(l.raw ?? '')).join('\n');
    };
    expect(await help('executor')).toContain('TOOLTX_EXECUTOR_DURABLE');
    expect(await help('reconciler')).toMatch(/TOOLTX_RECONCILE_SWEEP\s+on\|off/);
    expect(await help('audit-projector')).toContain('TOOLTX_AUDIT_HMAC_KEY_FILE');
  });
});

describe('the KB that cannot start', () => {
  it('names KB_DB when the database cannot be created, and KB_PORT when the port is taken', async () => {
    const file = join(dir, 'a-file');
    writeFileSync(file, 'x');
    const db = await failure(spawnKbProcess({ KB_DB: join(file, 'kb.sqlite') }));
    expect(db.line).toMatchObject({ setting: 'KB_DB', value: join(file, 'kb.sqlite') });
    expect(db.stderr).toMatch(
      /^kb-server: cannot start: KB_DB=.*kb\.sqlite: cannot open or create the database: .*\n$/,
    );

    const port = await failure(spawnKbProcess({ KB_DB: join(dir, 'kb.sqlite'), KB_PORT: String(takenPort) }));
    expect(port.line).toMatchObject({ setting: 'KB_PORT', value: String(takenPort) });
    expect(port.stderr).toContain(`KB_PORT=${takenPort}`);
    expect(port.stderr).toContain('EADDRINUSE');
  });
});

describe('npm start that cannot start', () => {
  const start = (args: string[], env: Record<string, string> = {}) => run('scripts/start.ts', args, env);

  it('names the flag, or the variable it was set by, and the value, in one line without a stack trace', async () => {
    const file = join(dir, 'hostname');
    writeFileSync(file, 'x');
    // Ports of its own: the defaults (4222, the KB's) may be taken by any other stack on the
    // machine (another `npm start`, say), which is refused first.
    const notDir = await failure(
      start([
        '--state-dir',
        join(file, 'x'),
        '--port',
        String(await freePort()),
        '--kb-port',
        String(await freePort()),
      ]),
    );
    expect(notDir.stderr).toBe(
      `tooltx-start: cannot start: --state-dir ${join(file, 'x')}: cannot create the state directory: a part of the path is not a directory (ENOTDIR)\n`,
    );
    expect(notDir.line).toMatchObject({ setting: '--state-dir', value: join(file, 'x') });

    const flag = await failure(start(['--port', '70000', '--state-dir', join(dir, 'unused')]));
    expect(flag.stderr).toBe('tooltx-start: invalid configuration: --port 70000: expected an integer 1..65535\n');
    expect(flag.line).toMatchObject({ setting: '--port' });
    const env = await failure(start(['--state-dir', join(dir, 'unused')], { NATS_PORT: '70000', KB_DEDUP: 'maybe' }));
    expect(env.stderr).toContain('NATS_PORT=70000');
    expect(env.stderr).toContain('KB_DEDUP=maybe');
    expect(env.line.settings).toEqual(['NATS_PORT', 'KB_DEDUP']);

    const auth = await failure(
      start(['--state-dir', join(dir, 'external'), '--kb-port', String(await freePort())], {
        NATS_URL: `nats://127.0.0.1:${closedPort}`,
      }),
    );
    expect(auth.line).toMatchObject({ setting: 'TOOLTX_AUTH_DIR' });
    expect(auth.stderr).toContain('required when NATS_URL is set');
  });

  it('a variable set empty counts as unset; spaces alone, one port for both servers and an unknown flag are refused (exit 2, named, nothing created)', async () => {
    const file = join(dir, 'not-a-dir');
    writeFileSync(file, 'x');
    // Every variable empty: the settings pass (their defaults apply) and the start gets as far as the state directory.
    const empty = {
      NATS_PORT: '',
      KB_PORT: '',
      KB_DEDUP: '',
      KB_SEED_FILE: '',
      TOOLTX_PREFIX: '',
      LOG_LEVEL: '',
      TOOLTX_STATE_DIR: '',
      NATS_URL: '',
    };
    const unset = await failure(
      start(
        ['--state-dir', join(file, 'x'), '--port', String(await freePort()), '--kb-port', String(await freePort())],
        empty,
      ),
    );
    expect(unset.stderr).toBe(
      `tooltx-start: cannot start: --state-dir ${join(file, 'x')}: cannot create the state directory: a part of the path is not a directory (ENOTDIR)\n`,
    );

    const spaces = await failure(
      start(['--port', String(await freePort()), '--kb-port', String(await freePort())], { TOOLTX_STATE_DIR: '   ' }),
    );
    expect(spaces.stderr).toBe(
      'tooltx-start: invalid configuration: TOOLTX_STATE_DIR="   ": spaces alone are not a value\n',
    );
    const flag = await failure(
      start(['--state-dir', ' ', '--port', String(await freePort()), '--kb-port', String(await freePort())]),
    );
    expect(flag.stderr).toBe('tooltx-start: invalid configuration: --state-dir " ": spaces alone are not a value\n');

    const port = await freePort();
    const stateDir = join(dir, 'same-port');
    const same = await failure(start(['--state-dir', stateDir, '--port', String(port), '--kb-port', String(port)]));
    expect(same.stderr).toBe(
      `tooltx-start: invalid configuration: --kb-port ${port}: the same port as --port (the embedded nats-server's): give the KB another one\n`,
    );
    expect(same.line).toMatchObject({ setting: '--kb-port', settings: ['--kb-port'] });
    expect(existsSync(stateDir)).toBe(false);

    // A named binary is never replaced by another one, and is checked before anything is written.
    for (const [bin, says] of [
      ['/nonexistent/nats-server', 'no such file or directory (ENOENT)'],
      ['  ', 'spaces alone are not a value'],
      [dir, 'not a file'],
    ] as const) {
      const r = await failure(
        start(
          [
            '--state-dir',
            join(dir, 'not-nats'),
            '--port',
            String(await freePort()),
            '--kb-port',
            String(await freePort()),
          ],
          { NATS_SERVER_BIN: bin },
        ),
      );
      expect(r.line, bin).toMatchObject({ setting: 'NATS_SERVER_BIN', problem: says });
    }
    // Decimal ports only: 0x10 is not port 16.
    const hex = await failure(
      start(['--state-dir', join(dir, 'not-nats'), '--port', '0x10', '--kb-port', String(await freePort())]),
    );
    expect(hex.stderr).toBe(
      'tooltx-start: invalid configuration: --port 0x10: expected an integer 1..65535 (decimal digits)\n',
    );
    // A binary that exits without a word is named, with why it is suspect (not an empty reason).
    const notNats = await failure(
      start(
        [
          '--state-dir',
          join(dir, 'not-nats'),
          '--port',
          String(await freePort()),
          '--kb-port',
          String(await freePort()),
        ],
        { NATS_SERVER_BIN: '/bin/false' },
      ),
    );
    expect(notNats.stderr).toBe(
      'tooltx-start: cannot start: NATS_SERVER_BIN=/bin/false: exited with 1 without a word on stderr: is it a nats-server?\n',
    );
    expect(existsSync(join(dir, 'not-nats'))).toBe(false);

    const bogus = start(['--bogus']);
    expect(await bogus.exited).toBe(2);
    expect(bogus.stderr).toContain("unknown option '--bogus'");
  });

  it("--cluster: only 1 or 3 nodes, ports that fit, a KB port outside the nodes', and a state directory keeps its layout (exit 2, named, nothing added)", async () => {
    const port = await freePort();
    const two = await failure(
      start([
        '--cluster',
        '2',
        '--state-dir',
        join(dir, 'cluster-2'),
        '--port',
        String(port),
        '--kb-port',
        String(await freePort()),
      ]),
    );
    expect(two.line).toMatchObject({ setting: '--cluster' });
    expect(two.stderr).toContain('tooltx-start: invalid configuration: --cluster 2: ');
    const high = await failure(
      start([
        '--cluster',
        '3',
        '--port',
        '65534',
        '--kb-port',
        String(await freePort()),
        '--state-dir',
        join(dir, 'cluster-high'),
      ]),
    );
    expect(high.stderr).toBe(
      "tooltx-start: invalid configuration: --port 65534: the cluster's nodes listen on --port to --port+2: at most 65533\n",
    );
    const kbInside = await failure(
      start([
        '--cluster',
        '3',
        '--port',
        String(port),
        '--kb-port',
        String(port + 2),
        '--state-dir',
        join(dir, 'cluster-kb'),
      ]),
    );
    expect(kbInside.stderr).toBe(
      `tooltx-start: invalid configuration: --kb-port ${port + 2}: a port of the embedded cluster's nodes (--port to --port+2 with --cluster 3): give the KB another one\n`,
    );
    for (const d of ['cluster-2', 'cluster-high', 'cluster-kb']) expect(existsSync(join(dir, d))).toBe(false);
    // A single server's store: a cluster would start from empty streams beside it.
    const single = join(dir, 'was-single');
    mkdirSync(join(single, 'jetstream'), { recursive: true });
    const layout = await failure(
      start([
        '--cluster',
        '3',
        '--state-dir',
        single,
        '--port',
        String(await freePort()),
        '--kb-port',
        String(await freePort()),
      ]),
    );
    expect(layout.line).toMatchObject({ setting: '--state-dir', value: single });
    expect(layout.stderr).toContain('holds the JetStream store of a single server (jetstream/)');
    expect(readdirSync(single)).toEqual(['jetstream']);
  });

  it("refuses TOOLTX_TOOLS_MODULE instead of silently serving the sample's tools in its place, creating nothing", async () => {
    const stateDir = join(dir, 'own-tools');
    const p = start(['--state-dir', stateDir], { TOOLTX_TOOLS_MODULE: 'mytools/tools.ts' });
    expect(await p.exited).toBe(2);
    expect(p.stderr).toContain(
      'tooltx-start: cannot start: TOOLTX_TOOLS_MODULE=mytools/tools.ts: npm start always serves the research-KB sample',
    );
    expect(existsSync(stateDir)).toBe(false);
  });

  it("a state directory that cannot be created is named at once, never waited on (a path under /proc: Node 20's recursive mkdir never returns there)", async () => {
    const p = start([
      '--state-dir',
      '/proc/tooltx-nowhere/state',
      '--port',
      String(await freePort()),
      '--kb-port',
      String(await freePort()),
    ]);
    expect(await p.exited).toBe(2);
    expect(p.lines.find((l) => l.msg === 'failed to start' && l.service === 'start')).toMatchObject({
      setting: '--state-dir',
      value: '/proc/tooltx-nowhere/state',
      problem: expect.stringContaining('cannot create the state directory'),
    });
  });

  it("names --kb-port when the KB's port is taken, and leaves nothing running", async () => {
    const free = createServer();
    await new Promise<void>((r) => free.listen(0, '127.0.0.1', r));
    const natsPort = (free.address() as { port: number }).port;
    await new Promise((r) => free.close(r));
    const stateDir = join(dir, 'kb-port');
    const p = start(['--state-dir', stateDir, '--port', String(natsPort), '--kb-port', String(takenPort)]);
    expect(await p.exited).toBe(2);
    const line = p.lines.find((l) => l.msg === 'failed to start' && l.service === 'start');
    expect(line).toMatchObject({
      setting: '--kb-port',
      value: String(takenPort),
      problem: expect.stringContaining('EADDRINUSE'),
    });
    expect(p.stderr).toContain(`tooltx-start: cannot start: --kb-port ${takenPort}: `);
    // Refused before anything was written: no state directory, no generated keys.
    expect(existsSync(stateDir)).toBe(false);
    const nats = await failure(
      start(['--state-dir', stateDir, '--port', String(takenPort), '--kb-port', String(natsPort)]),
    );
    expect(nats.line).toMatchObject({
      setting: '--port',
      value: String(takenPort),
      problem: expect.stringContaining('EADDRINUSE'),
    });
    expect(existsSync(stateDir)).toBe(false);
    // The nats-server it had started is stopped: its port is free again.
    const again = createServer();
    await new Promise<void>((r, j) => {
      again.once('error', j);
      again.listen(natsPort, '127.0.0.1', r);
    });
    await new Promise((r) => again.close(r));
  });

  it('a process that exits before it is ready is named even when LOG_LEVEL hides its own failed-to-start line; what the start created in an existing state directory is removed', async () => {
    const stateDir = join(dir, 'existing');
    mkdirSync(stateDir);
    writeFileSync(join(stateDir, 'mine.txt'), "the operator's own file");
    // An address that is not this host's: the KB cannot listen, and at LOG_LEVEL=silent it logs nothing.
    const p = start(
      ['--state-dir', stateDir, '--port', String(await freePort()), '--kb-port', String(await freePort())],
      { LOG_LEVEL: 'silent', KB_HOST: '192.0.2.1' },
    );
    expect(await p.exited).toBe(2);
    // Which process, how it ended, where its words are — not a bare "Error" after a 30 s wait.
    expect(p.stderr).toContain(
      'tooltx-start: failed to start: kb exited (code 2) before it was ready; its output above says why\n',
    );
    expect(p.stderr).toContain('kb-server: cannot start: KB_HOST=192.0.2.1');
    expect(p.stderr).not.toMatch(/\n\s+at /);
    // The keys, auth/, jetstream/ and kb.sqlite this start generated are gone; the operator's file stays.
    expect(readdirSync(stateDir)).toEqual(['mine.txt']);
  });

  it('the quickstart takes a variable set empty for unset and refuses spaces alone (exit 2, one line)', async () => {
    // In an empty directory: the defaults (.state/…) name files that are not there.
    const cwd = join(dir, 'quickstart');
    mkdirSync(cwd);
    const q = run(
      'examples/research-kb/quickstart.ts',
      [],
      { NATS_URL: '', TOOLTX_PREFIX: '', TOOLTX_STATE_DIR: '', KB_DEDUP: '', NATS_NKEY_FILE: '' },
      cwd,
    );
    expect(await q.exited).toBe(2);
    expect(q.stderr).toBe(
      'tooltx-quickstart: createTools: receiptKeys: cannot read receiptKeys file .state/auth/receipt-keys.json (ENOENT)\n',
    );
    // A seed given as the receipt keys file: "not JSON", never the seed's first characters.
    const seed = join(cwd, 'agent.nk');
    writeFileSync(seed, 'SUAFHE7JHDSECRETSEEDTEXT\n');
    const notJson = run(
      'examples/research-kb/quickstart.ts',
      [],
      { TOOLTX_RECEIPT_KEYS_FILE: seed, NATS_NKEY_FILE: seed },
      cwd,
    );
    expect(await notJson.exited).toBe(2);
    expect(notJson.stderr).toContain(`receiptKeys file ${seed} is not JSON`);
    expect(notJson.stderr).not.toContain('SUAFHE');
    const spaces = run('examples/research-kb/quickstart.ts', [], { NATS_URL: ' ' }, cwd);
    expect(await spaces.exited).toBe(2);
    expect(spaces.stderr).toBe(
      'tooltx-quickstart: NATS_URL=" ": spaces alone are not a value: unset it for the default\n',
    );
  });

  it('--help lists the environment it reads', async () => {
    const p = start(['--help']);
    expect(await p.exited).toBe(0);
    const out = p.lines.map((l) => String(l.raw ?? '')).join('\n');
    for (const v of [
      'NATS_PORT',
      'KB_PORT',
      'TOOLTX_STATE_DIR',
      'KB_DEDUP',
      'KB_SEED_FILE',
      'TOOLTX_PREFIX',
      'NATS_URL',
      'TOOLTX_AUTH_DIR',
      'TOOLTX_IDENTITIES',
      'KB_SEED',
      'NATS_SERVER_BIN',
      'TOOLTX_AUDIT_HMAC_KEY_FILE',
      'TOOLTX_LOG_HMAC_KEY_FILE',
      'LOG_LEVEL',
    ])
      expect(out).toContain(v);
    expect(out).toMatch(/TOOLTX_AUTH_DIR\s+required with NATS_URL/);
  });
});
