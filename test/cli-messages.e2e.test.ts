/**
 * `tooltx` tells the user what is wrong and which flag, variable or file to fix:
 * bad flags exit 2 naming the flag before anything is connected; a missing or wrong seed says which
 * identity is needed; a refusal by the takeover service says what it means. The CLI runs as a real
 * process against a real nats-server with auth on; the takeover service runs in a real reconciler.
 */
import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createTools, type Tools } from '@tooltx/client';
import { decodeRaw, openBucket } from '@tooltx/nats';
import { applyTopology } from '@tooltx/streams';
import { provisioned, TEST_IDENTITIES, type TestNats } from './helpers/nats.js';
import { startService, type ServiceProcess } from './helpers/services.js';
import { Sink } from './helpers/sink.js';
import { closedPort } from './helpers/net.js';
import { contracts } from './fixtures/sink-tools.js';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..');
let t: TestNats;
let sink: Sink;
let procs: ServiceProcess[] = [];
let alice: Tools;
let dir: string;

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs `tooltx <args>` with only `env` (plus PATH): nothing of the test's own environment leaks in. */
function tooltx(args: string[], env: Record<string, string>): Promise<Run> {
  return new Promise((resolve) =>
    execFile(
      process.execPath,
      ['--import', 'tsx', join(ROOT, 'bin', 'tooltx.ts'), ...args],
      { cwd: ROOT, env: { PATH: process.env.PATH ?? '', ...env } },
      (err, stdout, stderr) =>
        resolve({ code: err ? (typeof err.code === 'number' ? err.code : 1) : 0, stdout, stderr }),
    ),
  );
}

const server = () => ({ NATS_URL: t.url, TOOLTX_PREFIX: t.subjects.prefix });
const asAuditor = () => ({
  ...server(),
  NATS_NKEY_FILE: t.auth.seedFile({ kind: 'auditor', tenant: 'acme', actor: 'audrey' }),
  TOOLTX_TENANT: 'acme',
  TOOLTX_AUDITOR: 'audrey',
});
const asOperator = (operator = 'oscar') => ({
  ...server(),
  NATS_NKEY_FILE: t.auth.seedFile({ kind: 'operator', operator: 'oscar' }),
  TOOLTX_OPERATOR: operator,
});

beforeAll(async () => {
  t = await provisioned();
  sink = await new Sink().start();
  dir = mkdtempSync(join(tmpdir(), 'tooltx-cli-'));
  const env = { ...t.env, SINK_URL: sink.url };
  procs = await Promise.all([
    startService('authorizer', env),
    startService('executor', env),
    startService('reconciler', env),
    startService('audit-projector', env),
  ]);
  alice = await createTools({
    servers: t.url,
    tenant: 'acme',
    actor: 'alice',
    nkeyFile: t.agentSeed('acme', 'alice'),
    contracts,
    prefix: t.subjects.prefix,
    receiptKeys: t.auth.receiptKeysFile,
  });
});

afterAll(async () => {
  await alice?.close();
  const codes = await Promise.all(procs.map((p) => p.stop()));
  await sink?.stop();
  await t?.close();
  rmSync(dir, { recursive: true, force: true });
  expect(codes).toEqual(procs.map(() => 0));
});

describe('audit list|export|counts: flags are validated, exit 2 naming the flag', () => {
  it('--state must be a known state', async () => {
    const r = await tooltx(['audit', 'list', '--state', 'bogus'], asAuditor());
    expect(r.code).toBe(2);
    expect(r.stderr).toContain(
      '--state: one of accepted, running, committed, rejected, unknown, awaiting_confirmation, rolled_back, compensation_requested, compensated, compensation_failed, refused; got "bogus"',
    );
    expect(r.stderr).not.toContain('record(s)');
  });

  it('--contract must be name@version', async () => {
    const r = await tooltx(['audit', 'list', '--contract', 'nope'], asAuditor());
    expect(r.code).toBe(2);
    expect(r.stderr).toContain('--contract: name@version');
  });

  it('--since must not be later than --until', async () => {
    for (const cmd of [['list'], ['counts'], ['export', '--format', 'jsonl']]) {
      const r = await tooltx(['audit', ...cmd, '--since', '24h', '--until', '48h'], asAuditor());
      expect(r.code).toBe(2);
      expect(r.stderr).toContain('--since 24h');
      expect(r.stderr).toContain('is later than --until 48h');
    }
  });

  it('a duration reaching before 1970 names --since, not a raw schema message', async () => {
    const r = await tooltx(['audit', 'list', '--since', '999999999999999d'], asAuditor());
    expect(r.code).toBe(2);
    expect(r.stderr).toContain('--since: 999999999999999d ago is before 1970-01-01');
    expect(r.stderr).not.toMatch(/ZodError|✖/);
  });

  it('a valid query still runs (exit 0)', async () => {
    const r = await tooltx(
      ['audit', 'list', '--state', 'committed', '--contract', 'sink.write@1', '--since', '48h', '--until', '0s'],
      asAuditor(),
    );
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr).toContain('record(s)');
  });
});

describe('takeover: refusals and identities in words', () => {
  it('resolve of a committed operation says it is not under takeover and names its state (exit 1)', async () => {
    const done = await alice.execute({
      tool: 'sink.write',
      taskId: 'cli-resolve',
      input: { bucket: 'kb-main', title: 'Done', body: 'Done.', at: '2026-11-30T06:00:00Z' },
    });
    expect(done.status).toBe('committed');
    const r = await tooltx(
      ['takeover', 'resolve', done.operationKey!, '--not-applied', '--tenant', 'acme'],
      asOperator(),
    );
    expect(r.code).toBe(1);
    // Said once, the machine-readable class first.
    expect(r.stderr).toContain('refused: idempotency_conflict: not under takeover: its state is committed');
    expect(r.stderr.match(/tooltx takeover: refused/g)).toHaveLength(1);
    expect(r.stderr.trim().split('\n')).toHaveLength(1);
  });

  it('a seed that is not TOOLTX_OPERATOR\'s: "this identity is not operator eve" (exit 1)', async () => {
    const r = await tooltx(['takeover', 'list'], asOperator('eve'));
    expect(r.code).toBe(1);
    expect(r.stderr).toContain('is not operator eve');
    // Where eve's seed is: next to the seed given, as `tooltx auth generate` writes them.
    expect(r.stderr).toMatch(/\/nkeys\/operator\.eve\.nk, next to the one given/);
    expect(r.stderr).not.toContain('<out>');
    expect(r.stderr).not.toContain('RequestError');
  });

  it('resolve without an outcome, or with two, is a usage error (exit 2)', async () => {
    const said = 'give exactly one of --committed <resourceId>, --not-applied, --effect-kept or --undone-by-hand';
    const [none, two] = await Promise.all([
      tooltx(['takeover', 'resolve', 'opk_x'], asOperator()),
      tooltx(['takeover', 'resolve', 'opk_x', '--effect-kept', '--not-applied'], asOperator()),
    ]);
    for (const r of [none, two]) {
      expect(r.code).toBe(2);
      expect(r.stderr).toContain(said);
    }
  });
});

describe('identities and files', () => {
  it('no seed: says to set NATS_NKEY_FILE and which identity the command needs (exit 2)', async () => {
    const ops = await tooltx(['ops', 'pending'], server());
    expect(ops.code).toBe(2);
    expect(ops.stderr).toContain('requires authentication: set NATS_NKEY_FILE to the seed of the provisioner');
    expect(ops.stderr).toContain('provisioner.nk');
    const op = await tooltx(['takeover', 'list'], { ...server(), TOOLTX_OPERATOR: 'oscar' });
    expect(op.code).toBe(2);
    expect(op.stderr).toContain('set NATS_NKEY_FILE to the seed of operator oscar');
    const seedless = await tooltx(['ops', 'pending'], { ...server(), NATS_NKEY_FILE: join(dir, 'nope.nk') });
    expect(seedless.code).toBe(2);
    expect(seedless.stderr).toContain(`NATS_NKEY_FILE: cannot read ${join(dir, 'nope.nk')} (ENOENT)`);
  });

  it("an agent's seed for streams check: this identity is not the provisioner (exit 1)", async () => {
    const r = await tooltx(['streams', 'check'], { ...server(), NATS_NKEY_FILE: t.agentSeed('acme', 'alice') });
    expect(r.code).toBe(1);
    expect(r.stderr).toContain('is not the provisioner');
  });

  it('auth generate names the identities file that is not JSON, and refuses a port out of range (exit 2)', async () => {
    const empty = join(dir, 'identities.json');
    writeFileSync(empty, '');
    const notJson = await tooltx(['auth', 'generate', '--identities', empty, '--out', join(dir, 'auth')], {});
    expect(notJson.code).toBe(2);
    expect(notJson.stderr).toContain(`--identities: ${empty} is not JSON`);
    writeFileSync(
      empty,
      JSON.stringify({
        tenants: [{ id: 'acme', actors: ['alice'], auditors: [] }],
        operators: [],
        executorDurables: [],
      }),
    );
    const port = await tooltx(
      ['auth', 'generate', '--identities', empty, '--out', join(dir, 'auth'), '--listen', '0.0.0.0:99999'],
      {},
    );
    expect(port.code).toBe(2);
    expect(port.stderr).toContain('--listen: expected <host>:<port> with a port 1-65535');
  });

  it('auth generate refuses an identity list whose ids share an inbox as bad input (exit 2, naming the file and the field), writing nothing', async () => {
    const file = join(dir, 'dup-identities.json');
    writeFileSync(
      file,
      JSON.stringify({
        tenants: [{ id: 'acme', actors: ['alice', 'alice'], auditors: [] }],
        operators: [],
        executorDurables: [],
      }),
    );
    const out = join(dir, 'dup-auth');
    const r = await tooltx(['auth', 'generate', '--identities', file, '--out', out], {});
    expect(r.code).toBe(2);
    expect(r.stderr).toContain(`--identities: ${file}: identity list: tenants.0.actors.1`);
    expect(existsSync(out)).toBe(false);
  });
});

describe('settings the CLI cannot use are named, exit 2, and never show a secret', () => {
  it("a URL's password never shows: not in a refused connection, not in an authentication hint; a bad URL, a bad seed and a bad creds file are named", async () => {
    const url = t.url.replace('nats://', 'nats://bob:s3cret-pw@');
    const noSeed = await tooltx(['streams', 'check'], { ...server(), NATS_URL: url });
    expect(noSeed.code).toBe(2);
    expect(noSeed.stderr).toContain('requires authentication');
    const refused = await tooltx(['ops', 'pending'], {
      NATS_URL: `nats://bob:s3cret-pw@127.0.0.1:${await closedPort()}`,
    });
    expect(refused).toMatchObject({
      code: 2,
      stderr: expect.stringMatching(
        /^tooltx: NATS_URL=nats:\/\/\[redacted\]@127\.0\.0\.1:\d+: cannot connect: connection refused/,
      ),
    });
    for (const r of [noSeed, refused]) expect(r.stderr + r.stdout).not.toContain('s3cret-pw');

    const badUrl = await tooltx(['streams', 'check'], { NATS_URL: 'nats://127.0.0.1:99999' });
    expect(badUrl).toMatchObject({
      code: 2,
      stderr: 'tooltx: NATS_URL=nats://127.0.0.1:99999: not a valid server URL (nats://host:port, comma-separated)\n',
    });
    const seed = join(dir, 'not-a-seed.nk');
    writeFileSync(seed, 'SUAXXXXNOTASEEDXXXX\n');
    const badSeed = await tooltx(['streams', 'check'], { ...server(), NATS_NKEY_FILE: seed });
    expect(badSeed).toMatchObject({
      code: 2,
      stderr: `tooltx: NATS_NKEY_FILE=${seed}: not an nkey seed (\`tooltx auth generate\` writes one per user)\n`,
    });
    const realSeed = t.auth.seedFile({ kind: 'provisioner' });
    const badCreds = await tooltx(['streams', 'check'], { ...server(), NATS_CREDS_FILE: realSeed });
    expect(badCreds).toMatchObject({
      code: 2,
      stderr: `tooltx: NATS_CREDS_FILE=${realSeed}: not a .creds file (a JWT and an nkey seed)\n`,
    });
    const module = await tooltx(['streams', 'check'], {
      ...server(),
      NATS_NKEY_FILE: realSeed,
      TOOLTX_TOOLS_MODULE: join(dir, 'nope.ts'),
    });
    expect(module).toMatchObject({
      code: 2,
      stderr: `tooltx: TOOLTX_TOOLS_MODULE=${join(dir, 'nope.ts')}: no such file (ERR_MODULE_NOT_FOUND)\n`,
    });
    const config = await tooltx(['streams', 'check'], { ...server(), LOG_LEVEL: 'verbose' });
    expect(config).toMatchObject({
      code: 2,
      stderr: expect.stringMatching(/^tooltx: invalid configuration: LOG_LEVEL=verbose: .*\n$/),
    });
  });

  it('auth generate refuses an empty or blank --out and a file as --out, writes no seed into the current directory, and quotes nothing of a seed given as the identity list', async () => {
    const ids = join(dir, 'ok-identities.json');
    writeFileSync(
      ids,
      JSON.stringify({
        tenants: [{ id: 'acme', actors: ['alice'], auditors: [] }],
        operators: [],
        executorDurables: [],
      }),
    );
    const cwdBefore = readdirSync(ROOT).sort();
    const empty = await tooltx(['auth', 'generate', '--identities', ids, '--out', ''], {});
    expect(empty).toMatchObject({ code: 2, stderr: 'tooltx: --out "": empty: name a directory\n' });
    const blank = await tooltx(['auth', 'generate', '--identities', ids, '--out', '  '], {});
    expect(blank).toMatchObject({
      code: 2,
      stderr: 'tooltx: --out "  ": spaces alone are not a value: name a directory\n',
    });
    expect(readdirSync(ROOT).sort()).toEqual(cwdBefore);
    const aFile = await tooltx(['auth', 'generate', '--identities', ids, '--out', ids], {});
    expect(aFile).toMatchObject({ code: 2, stderr: `tooltx: --out ${ids}: exists and is not a directory\n` });
    const seed = t.auth.seedFile({ kind: 'provisioner' });
    const seedText = readFileSync(seed, 'utf8').trim();
    const asList = await tooltx(['auth', 'generate', '--identities', seed, '--out', join(dir, 'never')], {});
    expect(asList).toMatchObject({ code: 2, stderr: `tooltx: --identities: ${seed} is not JSON\n` });
    expect(asList.stderr).not.toContain(seedText.slice(0, 6));
  });
});

describe('arguments that are not what they name exit 2 before anything connects', () => {
  it('an operation key that is not one (audit show, takeover show and resolve), a --limit in hex, a missing TOOLTX_OPERATOR', async () => {
    const said = 'tooltx: <operationKey>: expected opk_ and 43 base64url characters, got "opk_nope"\n';
    expect(await tooltx(['audit', 'show', 'opk_nope'], asAuditor())).toMatchObject({ code: 2, stderr: said });
    expect(await tooltx(['takeover', 'show', 'opk_nope'], asOperator())).toMatchObject({ code: 2, stderr: said });
    expect(await tooltx(['takeover', 'resolve', 'opk_nope', '--not-applied'], asOperator())).toMatchObject({
      code: 2,
      stderr: said,
    });
    expect(await tooltx(['audit', 'list', '--limit', '0x10'], asAuditor())).toMatchObject({
      code: 2,
      stderr: 'tooltx: --limit: a positive integer, got "0x10"\n',
    });
    const { TOOLTX_OPERATOR: _o, ...noOperator } = asOperator();
    expect(await tooltx(['takeover', 'list'], noOperator)).toMatchObject({
      code: 2,
      stderr: expect.stringContaining("TOOLTX_OPERATOR: required: the operator's id"),
    });
  });
});

describe('usage errors of commander itself exit 2 like every other bad usage', () => {
  it("an unknown option, an unknown command, a missing required option: exit 2 with commander's message; --help exits 0", async () => {
    const unknownOption = await tooltx(['--bogus'], {});
    expect(unknownOption).toMatchObject({ code: 2, stderr: expect.stringContaining("unknown option '--bogus'") });
    const unknownCommand = await tooltx(['nope'], {});
    expect(unknownCommand).toMatchObject({ code: 2, stderr: expect.stringContaining("unknown command 'nope'") });
    const missing = await tooltx(['auth', 'generate'], {});
    expect(missing).toMatchObject({
      code: 2,
      stderr: expect.stringContaining("required option '--identities <file>' not specified"),
    });
    const subOption = await tooltx(['streams', 'check', '--bogus'], {});
    expect(subOption.code).toBe(2);
    // A request the contracts service would refuse is refused before connecting, naming the field.
    expect(await tooltx(['contracts', 'deprecate', 'sink.write', '--sunset', '2027-01-31'], {})).toMatchObject({
      code: 2,
      stderr: expect.stringContaining('<name@version> (contract): must be name@version'),
    });
    expect((await tooltx(['auth', 'generate', '--help'], {})).code).toBe(0);
  });
});

describe('--help lists the environment each command reads', () => {
  it('tooltx, streams apply, streams check, ops pending, contracts deprecate', async () => {
    for (const args of [
      ['--help'],
      ['streams', 'apply', '--help'],
      ['streams', 'check', '--help'],
      ['ops', 'pending', '--help'],
      ['contracts', 'deprecate', '--help'],
    ]) {
      const r = await tooltx(args, {});
      expect(r.code, args.join(' ')).toBe(0);
      for (const v of ['NATS_URL', 'NATS_NKEY_FILE', 'NATS_CREDS_FILE', 'TOOLTX_PREFIX'])
        expect(r.stdout, `${args.join(' ')}: ${v}`).toContain(v);
    }
    expect((await tooltx(['streams', 'check', '--help'], {})).stdout).toContain('TOOLTX_TOOLS_MODULE');
  });
});

describe('tooltx streams apply --identities (docs/tenancy.md)', () => {
  it("provisions each listed tenant's streams with its limits, takes an unlisted tenant out of service, and applies the provisioned tenants again without --identities", async () => {
    const asProvisioner = { ...server(), NATS_NKEY_FILE: t.auth.seedFile({ kind: 'provisioner' }) };
    const file = join(dir, 'identities.json');
    const limits = (tenant: string) =>
      t.jsm.streams
        .info(t.subjects.intentsStream(tenant))
        .then((i) => ({ maxBytes: i.config.max_bytes, discard: i.config.discard }));
    const tenantsBucket = async () => {
      const kv = await openBucket(t.nc, t.subjects.tenantsBucket);
      const out: Record<string, unknown> = {};
      for await (const k of await kv.keys()) out[k] = decodeRaw((await kv.get(k))!.value);
      return out;
    };
    try {
      // globex gets a bound of its own; initech leaves the list.
      writeFileSync(
        file,
        JSON.stringify({
          ...TEST_IDENTITIES,
          tenants: TEST_IDENTITIES.tenants
            .filter((x) => x.id !== 'initech')
            .map((x) => (x.id === 'globex' ? { ...x, limits: { intentBytes: 2_097_152 } } : x)),
        }),
      );
      const r = await tooltx(['streams', 'apply', '--identities', file], asProvisioner);
      expect(r.code, r.stderr).toBe(0);
      expect(JSON.parse(r.stdout)).toMatchObject({
        tenants: ['acme', 'globex'],
        unlisted: ['initech'],
        updated: expect.arrayContaining([`stream ${t.subjects.intentsStream('globex')}`]),
      });
      expect(await limits('globex')).toEqual({ maxBytes: 2_097_152, discard: 'new' });
      expect(Object.keys(await tenantsBucket()).sort()).toEqual(['acme', 'globex']);
      // The authorizer stops serving the tenant taken out; its streams and data are kept.
      await procs[0]!.waitForLog('tenant no longer listed: not served');
      expect((await t.jsm.streams.info(t.subjects.intentsStream('initech'))).config.name).toBe(
        t.subjects.intentsStream('initech'),
      );
      // Without --identities: the tenants already provisioned, unchanged.
      const again = await tooltx(['streams', 'apply'], asProvisioner);
      expect(again.code, again.stderr).toBe(0);
      expect(JSON.parse(again.stdout)).toMatchObject({ tenants: ['acme', 'globex'], updated: [] });
      const check = await tooltx(['streams', 'check'], asProvisioner);
      expect(JSON.parse(check.stdout)).toEqual({ ok: true, violations: [] });
      // A bad list is refused before anything is connected (exit 2), naming the file.
      writeFileSync(file, JSON.stringify({ tenants: [{ id: 'acme', limits: { intentsPerSecond: -1 } }] }));
      const bad = await tooltx(['streams', 'apply', '--identities', file], asProvisioner);
      expect(bad.code).toBe(2);
      expect(bad.stderr).toContain(`--identities: ${file} is not an identity list`);
      expect(bad.stderr).toContain('intentsPerSecond');
    } finally {
      await applyTopology(t.nc, t.jsm, t.topo);
    }
  });
});
