/**
 * The SDK as a user outside the repository gets it: `npm run pack:sdk`'s tarball installed into a
 * fresh project under the system's temporary directory, a plain-`node` ESM script there importing
 * only the package (and zod, to write its contract), one call against a running stack. Then the
 * installed tree holds no workspace package from a registry, and the package's types check.
 */
import { execFile, spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { downstreamKeyOf, prepareCall } from '@tooltx/contracts';
import { filesUnder, npmEnv, packSdk, type SdkPack } from '../scripts/pack-sdk.js';
import { provisioned, type TestNats } from './helpers/nats.js';
import { ROOT, startService, type ServiceProcess } from './helpers/services.js';
import { Sink } from './helpers/sink.js';
import { sinkWrite } from './fixtures/sink-tools.js';

const run = promisify(execFile);
const TENANT = 'acme';
const ACTOR = 'alice';
const rootPackage = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as {
  dependencies: Record<string, string>;
  devDependencies: Record<string, string>;
};

/**
 * The user's script: the sink.write contract written out again in plain JavaScript (the server
 * loads test/fixtures/sink-tools.ts; the test checks that both have one interface digest), one
 * call, the outcome and its verification as one JSON line.
 */
const CALL_SCRIPT = `
import { z } from 'zod';
import { createTools } from '@tooltx/client';
import { defineContract, normalise } from '@tooltx/client/contracts';

const sinkWrite = defineContract({
  name: 'sink.write',
  version: 1,
  description: 'Write a note into a bucket of the test sink.',
  effect: 'create',
  input: z.strictObject({
    bucket: z.string().min(1).max(64),
    title: z.string().min(1).max(200),
    body: z.string().max(10_000),
    at: z.iso.datetime({ offset: true }),
    priority: z.enum(['low', 'high']).optional(),
  }),
  output: z.object({ noteId: z.string() }),
  normalise: { bucket: normalise.token, title: normalise.title, body: normalise.markdown, at: normalise.instant },
  target: (i) => ({ bucket: i.bucket }),
  intent: (i) => ({ title: i.title, body: i.body, at: i.at }),
  key: { scope: 'tenant', retentionMs: 7 * 24 * 3600_000 },
  timing: { timeoutMs: 3_000, runningBoundMs: 10_000, unknownDeadlineMs: 60_000 },
  downstream: { honoursKey: false, enforcesDeadline: false },
});

const env = process.env;
const tools = await createTools({
  servers: env.NATS_URL,
  tenant: env.TOOLTX_TENANT,
  actor: env.TOOLTX_ACTOR,
  nkeyFile: env.NATS_NKEY_FILE,
  prefix: env.TOOLTX_PREFIX,
  receiptKeys: env.TOOLTX_RECEIPT_KEYS_FILE,
  contracts: [sinkWrite],
});
try {
  const outcome = await tools.execute({ tool: 'sink.write', taskId: env.TASK_ID, input: JSON.parse(env.INPUT) }, { budgetMs: 20_000 });
  const verified = outcome.status === 'committed' ? tools.verify(outcome) : null;
  console.log(JSON.stringify({ interfaceDigest: sinkWrite.interfaceDigest, outcome, verified }));
} finally {
  await tools.close();
}
`;

/** A user's TypeScript against the package's declarations: what must compile, and what must not. */
const TYPES_CHECK = `
import { z } from 'zod';
import { createTools, runTask, ToolsOptionError, type ExecuteResult, type Tools } from '@tooltx/client';
import { defineContract, ErrorClass, normalise, prepareCall, TooltxError, type Contract } from '@tooltx/client/contracts';

const note = defineContract({
  name: 'notes.write',
  version: 1,
  description: 'Write a note.',
  effect: 'create',
  input: z.strictObject({ title: z.string() }),
  output: z.object({ id: z.string() }),
  normalise: { title: normalise.title },
  target: () => ({}),
  intent: (i) => ({ title: i.title }),
  key: { scope: 'tenant', retentionMs: 1_000 },
  timing: { timeoutMs: 1_000, runningBoundMs: 2_000, unknownDeadlineMs: 3_000 },
  downstream: { honoursKey: true, enforcesDeadline: false },
});
const contracts: Contract[] = [note];
const key: string = prepareCall(note, 'task-1', { title: 'A' }).operationKey;

export async function call(): Promise<string> {
  const tools: Tools = await createTools({ servers: 'nats://127.0.0.1:4222', tenant: 'acme', actor: 'alice', contracts });
  const r: ExecuteResult<{ id: string }> = await tools.execute<{ id: string }>({ tool: 'notes.write', taskId: 'task-1', input: { title: 'A' } });
  await runTask(tools, { taskId: 'task-2', steps: [] });
  if (r.status === 'committed') return r.result.id + r.receipt.operationKey;
  if (r.status === 'rejected') return r.error.class === ErrorClass.InvalidInput ? 'replan' : r.next;
  // Held back by a contract that declares confirm: a person decides (tools.confirm / tools.discard).
  if (r.status === 'awaiting_confirmation') return r.next;
  return r.evidence.submissionIds.join(',') + key;
}

// Each line below must be refused: the declarations hold real types, none of them \`any\`.
export function typed(err: unknown, r: ExecuteResult<{ id: string }>): boolean {
  // @ts-expect-error createTools has no option "server"
  void createTools({ server: 'nats://127.0.0.1:4222', tenant: 'acme', actor: 'alice', contracts });
  // @ts-expect-error an outcome's status is one of three
  const s: ExecuteResult['status'] = 'failed';
  // @ts-expect-error a receipt's operation key is a string (the lifecycle's types are bundled)
  const n: number = r.status === 'committed' ? r.receipt.operationKey : 0;
  // @ts-expect-error a normaliser maps a value to one of its type
  const m: number = normalise.title('A');
  // @ts-expect-error an effect class is one of the contracts' own
  void defineContract({ ...note, effect: 'explode' });
  return s !== undefined && n !== m && (err instanceof TooltxError || err instanceof ToolsOptionError);
}
`;

let work: string;
let app: string;
/** `tsc --noEmit` in the fresh project, started once the package is installed: its exit code and output. */
let typeCheck: Promise<{ code: number | undefined; out: string }>;
let pack: SdkPack;
let t: TestNats;
let sink: Sink;
let procs: ServiceProcess[] = [];

beforeAll(async () => {
  work = mkdtempSync(join(tmpdir(), 'tooltx-sdk-package-'));
  app = join(work, 'app');
  mkdirSync(app);
  writeFileSync(
    join(app, 'package.json'),
    `${JSON.stringify({ name: 'sdk-user', version: '1.0.0', private: true, type: 'module' }, null, 2)}\n`,
  );
  // The package and the stack at the same time: neither needs the other until the call.
  const installing = (async () => {
    pack = await packSdk({ destination: work });
    // zod to write contracts with, @types/node for the type check: what a user's project has.
    await run(
      'npm',
      [
        'install',
        '--prefer-offline',
        '--no-audit',
        '--no-fund',
        pack.tarball,
        `zod@${rootPackage.dependencies.zod}`,
        `@types/node@${rootPackage.devDependencies['@types/node']}`,
      ],
      { cwd: app, env: npmEnv(), maxBuffer: 16 << 20 },
    );
    // The type check runs beside the call (it needs nothing of the stack).
    writeFileSync(join(app, 'types-check.ts'), TYPES_CHECK);
    // As \`tsc --init\` writes it for Node: libraries' own declarations are not checked (skipLibCheck).
    const compilerOptions = {
      target: 'ES2022',
      module: 'NodeNext',
      moduleResolution: 'NodeNext',
      strict: true,
      types: ['node'],
      noEmit: true,
      skipLibCheck: true,
    };
    writeFileSync(
      join(app, 'tsconfig.json'),
      `${JSON.stringify({ compilerOptions, files: ['types-check.ts'] }, null, 2)}\n`,
    );
    typeCheck = run(
      process.execPath,
      [join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', join(app, 'tsconfig.json')],
      { cwd: app, maxBuffer: 16 << 20 },
    ).then(
      () => ({ code: 0, out: '' }),
      (err: { code?: number; stdout?: string }) => ({ code: err.code, out: err.stdout ?? '' }),
    );
  })();
  const stack = (async () => {
    t = await provisioned();
    sink = await new Sink().start();
    const env = { ...t.env, SINK_URL: sink.url };
    procs = await Promise.all([startService('authorizer', env), startService('executor', env)]);
  })();
  const settled = await Promise.allSettled([installing, stack]);
  for (const s of settled) if (s.status === 'rejected') throw s.reason;
});

afterAll(async () => {
  await typeCheck;
  await Promise.all(procs.map((p) => p.stop()));
  await sink?.stop();
  await t?.close();
  if (work) rmSync(work, { recursive: true, force: true });
});

describe('the SDK package', () => {
  it("holds compiled JavaScript and bundled declarations only, and depends on npm packages at the repository's pins", () => {
    expect(pack.tarball).toBe(join(work, `tooltx-client-${pack.version}.tgz`));
    expect(pack.files).toContain('dist/index.js');
    expect(pack.files).toContain('dist/index.d.ts');
    expect(pack.files).toContain('dist/contracts.js');
    expect(pack.files).toContain('dist/contracts.d.ts');
    expect(
      pack.files.filter((f) => !/^(package\.json|README\.md|dist\/(chunks\/)?[\w.-]+\.(js|d\.ts))$/.test(f)),
    ).toEqual([]);
    expect(pack.files.filter((f) => /test|\.map$|\.env|\.pem$|\.nk$/.test(f))).toEqual([]);
    const manifest = JSON.parse(
      readFileSync(join(app, 'node_modules', '@tooltx', 'client', 'package.json'), 'utf8'),
    ) as { dependencies: Record<string, string> };
    expect(manifest.dependencies).toEqual(pack.dependencies);
    expect(Object.keys(manifest.dependencies)).toContain('zod');
    for (const [name, version] of Object.entries(manifest.dependencies))
      expect({ name, version }).toEqual({ name, version: rootPackage.dependencies[name] });
    // Nothing in it names where it was built or holds a key (a PEM block, an nkey seed), and no
    // module of it imports a workspace package.
    const dir = join(app, 'node_modules', '@tooltx', 'client');
    const leaks = filesUnder(dir).filter((f) => {
      const text = readFileSync(join(dir, f), 'utf8');
      if (text.includes(ROOT) || text.includes(work) || /-----BEGIN |\bS[UAOCNP][A-Z2-7]{56}\b/.test(text)) return true;
      return f.startsWith('dist/') && /(?:\bfrom\s*|\bimport\s*\(\s*|\bimport\s+)['"]@tooltx\//.test(text);
    });
    expect(leaks).toEqual([]);
  });

  it('installs without any workspace package from a registry', () => {
    // npm's record of the installed tree (what `npm ls` reads), nested installs included.
    const tree = JSON.parse(readFileSync(join(app, 'node_modules', '.package-lock.json'), 'utf8')) as {
      packages: Record<string, { resolved?: string }>;
    };
    const ours = Object.entries(tree.packages).filter(([path]) => /(^|\/)node_modules\/@tooltx\//.test(path));
    expect(ours).toEqual([
      ['node_modules/@tooltx/client', expect.objectContaining({ resolved: `file:../${basename(pack.tarball)}` })],
    ]);
    expect(Object.keys(tree.packages)).toContain('node_modules/@nats-io/transport-node');
    expect(filesUnder(join(app, 'node_modules', '@tooltx')).filter((f) => !f.startsWith('client/'))).toEqual([]);
  });

  it("a plain-node script importing only the package commits a call whose receipt verifies, under the server's interface digest", async () => {
    const input = {
      bucket: 'kb-main',
      title: 'From the package',
      body: 'Installed with npm.',
      at: '2026-12-01T06:00:00Z',
    };
    const taskId = 'sdk-package-1';
    writeFileSync(join(app, 'call.mjs'), CALL_SCRIPT);
    const child = spawn(process.execPath, ['call.mjs'], {
      cwd: app,
      env: {
        PATH: process.env.PATH ?? '',
        NATS_URL: t.url,
        TOOLTX_PREFIX: t.subjects.prefix,
        TOOLTX_TENANT: TENANT,
        TOOLTX_ACTOR: ACTOR,
        NATS_NKEY_FILE: t.agentSeed(TENANT, ACTOR),
        TOOLTX_RECEIPT_KEYS_FILE: t.auth.receiptKeysFile,
        TASK_ID: taskId,
        INPUT: JSON.stringify(input),
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (c: string) => (stdout += c));
    child.stderr.setEncoding('utf8').on('data', (c: string) => (stderr += c));
    const code = await new Promise<number | null>((r) => child.once('close', r));
    expect({ code, stderr }).toEqual({ code: 0, stderr: '' });
    const { interfaceDigest, outcome, verified } = JSON.parse(stdout) as {
      interfaceDigest: string;
      outcome: { status: string; operationKey: string; result: unknown; receipt: { resourceId: string } };
      verified: unknown;
    };
    expect(interfaceDigest).toBe(sinkWrite.interfaceDigest);
    const key = prepareCall(sinkWrite, taskId, input).operationKey;
    expect(outcome).toMatchObject({
      status: 'committed',
      operationKey: key,
      receipt: { operationKey: key, tool: 'sink.write', state: 'committed' },
    });
    expect(outcome.result).toEqual({ noteId: outcome.receipt.resourceId });
    expect(verified).toEqual({ valid: true });
    expect(sink.writesFor((b) => b.key === downstreamKeyOf(TENANT, key))).toHaveLength(1);
  });

  it("its declarations type a user's TypeScript (tsc --noEmit in the fresh project)", async () => {
    expect(await typeCheck).toEqual({ code: 0, out: '' });
  });
});
