/**
 * Debug samples (docs/debug-samples.md) on real processes: a nats-server with file storage, the
 * authorizer, the executor and the audit-projector, the CLI as an operator. Sampling is switched on
 * for one contract and one tenant for a window of seconds (the deployment's minimum lowered with
 * TOOLTX_DEBUG_MIN_WINDOW_MS); what is kept is scrubbed by the logger's rules (FM-16), read only by
 * an operator granted `debug` through the executor's debug service, recorded in the audit log, and
 * gone after the window.
 */
import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { NatsConnection } from '@nats-io/transport-node';
import { prepareCall } from '@tooltx/contracts';
import { createTools, type ExecuteResult, type Tools } from '@tooltx/client';
import type { IdentityList } from '@tooltx/auth';
import { contractTokenOf, sampleAccessRecordSchema } from '@tooltx/lifecycle';
import { decode } from '@tooltx/nats';
import { LeakScanner, newCanaries, type Canaries } from '../examples/research-kb/canaries.js';
import { debugNote } from './fixtures/debug-tools.js';
import { provisioned, TEST_IDENTITIES, type TestNats } from './helpers/nats.js';
import { permissionError } from './helpers/permissions.js';
import { compiledCli, ROOT, startService, type ServiceProcess } from './helpers/services.js';
import { readStream } from './helpers/streams.js';

const DEBUG_TOOLS = join(ROOT, 'test', 'fixtures', 'debug-tools.ts');
const IDENTITIES: IdentityList = {
  ...TEST_IDENTITIES,
  operators: [
    { id: 'oscar', may: ['debug'] },
    { id: 'olga', may: ['query'] },
  ],
};
/** The window the test opens: long enough for a few calls and reads on a loaded machine. */
const WINDOW = '3s';

let t: TestNats;
let canaries: Canaries;
const procs: ServiceProcess[] = [];
const agents: Record<string, Tools> = {};
let oscar: NatsConnection;
let natsLog = '';
const returned: ExecuteResult[] = [];
const answers: unknown[] = [];
const keys: Record<string, string> = {};

type Answer = {
  ok: boolean;
  error?: { class: string; issues?: { path: (string | number)[]; code: string }[] };
} & Record<string, unknown>;
/** One request to the debug service as oscar, straight over NATS. */
const ask = async (req: Record<string, unknown>): Promise<Answer> => {
  const a = JSON.parse(
    (await oscar.request(t.subjects.opsDebug('oscar'), JSON.stringify(req), { timeout: 5_000 })).string(),
  ) as Answer;
  answers.push(a);
  return a;
};

/** `tooltx debug <args>` as a process (the compiled CLI), as `operator` with its own seed. */
async function debugCli(operator: string, args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const cli = await compiledCli();
  return new Promise((resolve) =>
    execFile(
      process.execPath,
      [cli, 'debug', ...args],
      {
        cwd: ROOT,
        env: {
          PATH: process.env.PATH ?? '',
          NATS_URL: t.url,
          TOOLTX_PREFIX: t.subjects.prefix,
          NATS_NKEY_FILE: t.auth.seedFile({ kind: 'operator', operator }),
          TOOLTX_OPERATOR: operator,
        },
      },
      (err, stdout, stderr) => resolve({ code: err ? ((err as { code?: number }).code ?? 1) : 0, stdout, stderr }),
    ),
  );
}

const note = (title: string) => ({
  title,
  body: `Private observation: ${canaries.noteBody}`,
  apiKey: canaries.token,
});
const call = async (actor: string, title: string) => {
  // Only acme's calls carry the canaries: another tenant's answers must never hold them.
  const input = actor === 'alice' ? note(title) : { title, body: 'a note of its own', apiKey: 'its own key' };
  const r = await agents[actor]!.execute({ tool: 'dbg.note', taskId: 'dbg', input });
  returned.push(r);
  return r;
};

/** Polls `probe` until it returns true, for at most `ms` (no timing assertion: the deadline only bounds the wait). */
async function until(probe: () => Promise<boolean>, ms = 15_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await probe())) {
    if (Date.now() > deadline) throw new Error('condition not met before the deadline');
    await new Promise((r) => setTimeout(r, 100));
  }
}

beforeAll(async () => {
  canaries = newCanaries();
  const cli = compiledCli();
  t = await provisioned({}, undefined, { identities: IDENTITIES });
  t.server.process?.stderr?.on('data', (c: Buffer) => (natsLog += c.toString()));
  const env = { ...t.env, TOOLTX_TOOLS_MODULE: DEBUG_TOOLS, TOOLTX_DEBUG_MIN_WINDOW_MS: '1000' };
  procs.push(
    ...(await Promise.all(
      (['authorizer', 'executor', 'audit-projector'] as const).map((name) => startService(name, env)),
    )),
  );
  for (const [tenant, actor] of [
    ['acme', 'alice'],
    ['globex', 'gina'],
  ] as const)
    agents[actor] = await createTools({
      servers: t.url,
      tenant,
      actor,
      nkeyFile: t.agentSeed(tenant, actor),
      contracts: [debugNote],
      prefix: t.subjects.prefix,
      receiptKeys: t.auth.receiptKeysFile,
      budgetMs: 15_000,
    });
  oscar = await t.connectAs({ kind: 'operator', operator: 'oscar' });
  await cli;
}, 120_000);

afterAll(async () => {
  for (const a of Object.values(agents)) await a.close().catch(() => undefined);
  await oscar?.close().catch(() => undefined);
  await Promise.all(procs.map((p) => p.stop()));
  await t?.close();
}, 60_000);

describe('debug samples', () => {
  it("FM-16: a tenant's sampled calls keep their input and result scrubbed by the logger's rules, another tenant's are never sampled, and no canary reaches a sample, a log line, the audit bucket or log, or another tenant", async () => {
    // The granted operator switches sampling on for acme through the CLI.
    const started = await debugCli('oscar', ['sample', 'start', 'dbg.note@1', '--for', WINDOW, '--tenant', 'acme']);
    expect(started.code, started.stderr).toBe(0);
    expect(JSON.parse(started.stdout)).toMatchObject({
      ok: true,
      started: { contract: 'dbg.note@1', tenant: 'acme', startedBy: 'oscar', rate: 1, taken: 0 },
    });
    expect((await call('alice', 'visible-title-one')).status).toBe('committed');
    expect((await call('alice', 'visible-title-two')).status).toBe('committed');
    expect((await call('gina', 'visible-title-globex')).status).toBe('committed');
    keys.one = prepareCall(debugNote, 'dbg', note('visible-title-one')).operationKey;
    keys.two = prepareCall(debugNote, 'dbg', note('visible-title-two')).operationKey;

    let list: Answer = { ok: false };
    await until(async () => {
      list = await ask({ action: 'list', contract: 'dbg.note@1' });
      return (list.samples as unknown[]).length >= 2;
    });
    const listed = list.samples as { tenant: string; operationKey: string; outcome: string }[];
    expect(listed.map((s) => [s.tenant, s.operationKey, s.outcome]).sort()).toEqual(
      [
        ['acme', keys.one, 'committed'],
        ['acme', keys.two, 'committed'],
      ].sort(),
    );
    expect(JSON.stringify(list)).not.toContain('visible-title');
    // Another tenant's operation under the tenant-scoped window: not sampled, by any key.
    const stored = await readStream(t, `KV_${t.subjects.samplesBucket}`);
    expect(stored.map((m) => m.subject.split('.').at(-2))).toEqual(['acme', 'acme']);

    const shown = await ask({ action: 'show', contract: 'dbg.note@1', tenant: 'acme', operationKey: keys.one });
    expect(shown).toMatchObject({
      ok: true,
      sample: {
        contract: 'dbg.note@1',
        tenant: 'acme',
        operationKey: keys.one,
        outcome: 'committed',
        // The plain field is kept (what a sample is for); content and secret fields are scrubbed.
        input: { title: 'visible-title-one', body: '[redacted]', apiKey: '[redacted]' },
        result: { echo: 'visible-title-one', text: '[redacted]' },
      },
    });
    // The same key under another tenant: nothing.
    expect(
      await ask({ action: 'show', contract: 'dbg.note@1', tenant: 'globex', operationKey: keys.one }),
    ).toMatchObject({ ok: true, sample: null });

    // No canary anywhere: every stream but the intents and the results (the samples bucket and the
    // audit log and bucket among them, while the samples exist), every answer, every result.
    const scan = new LeakScanner(canaries);
    const scanned = await scan.streams(t.js, t.jsm, t.subjects);
    for (const s of [`KV_${t.subjects.samplesBucket}`, t.subjects.auditLogStream, `KV_${t.subjects.auditBucket}`])
      expect(scanned).toContain(s);
    scan.text('answers to the operator', JSON.stringify(answers));
    scan.returned('returned to the agents', returned);
    scan.text('globex result', JSON.stringify(returned[2]));
    expect(scan.leaks).toEqual([]);
    // The scanner is not blind: the intents hold the canaries.
    const control = new LeakScanner(canaries);
    for (const m of await readStream(t, t.subjects.intentsStream('acme'))) control.bytes('intents', m.data);
    expect(new Set(control.leaks.map((l) => l.kind))).toEqual(new Set(['noteBody', 'token']));
  });

  it('only an operator granted debug reaches the debug service: another operator is refused, an auditor or an agent cannot reach the samples; a window beyond 4 h or under the minimum is refused at forMs', async () => {
    // (While the window opened by the test before runs: these refusals change nothing of it.)
    const [olga, tooLong] = await Promise.all([
      debugCli('olga', ['samples', 'list']),
      debugCli('oscar', ['sample', 'start', 'dbg.note@1', '--for', '5h']),
    ]);
    // Refused before anything is sent: a usage error naming the flag.
    expect(tooLong.code).toBe(2);
    expect(tooLong.stderr).toContain('--for: a sampling window is at most 4h');
    expect(olga.code).toBe(1);
    expect(olga.stderr).toContain('not granted debug');
    expect(olga.stdout).toBe('');

    expect(await ask({ action: 'start', contract: 'dbg.note@1', forMs: 4 * 3_600_000 + 1 })).toMatchObject({
      ok: false,
      error: { class: 'invalid_input', issues: [{ path: ['forMs'], code: 'too_big' }] },
    });
    expect(await ask({ action: 'start', contract: 'dbg.note@1', forMs: 500 })).toMatchObject({
      ok: false,
      error: { class: 'invalid_input', issues: [{ path: ['forMs'], code: 'too_small' }] },
    });
    // A tenant the identity list does not hold: refused at tenant, not a window that samples nothing.
    expect(await ask({ action: 'start', contract: 'dbg.note@1', forMs: 60_000, tenant: 'acmee' })).toMatchObject({
      ok: false,
      error: { class: 'invalid_input', issues: [{ path: ['tenant'], code: 'unknown_tenant' }] },
    });

    const api = '$JS.API';
    const samples = `KV_${t.subjects.samplesBucket}`;
    for (const role of [
      { kind: 'auditor', tenant: 'acme', actor: 'audrey' },
      { kind: 'agent', tenant: 'globex', actor: 'gina' },
    ] as const) {
      const nc = await t.connectAs(role);
      try {
        for (const subject of [
          t.subjects.opsDebug('oscar'),
          `${api}.DIRECT.GET.${samples}.$KV.${t.subjects.samplesBucket}.>`,
          `${api}.STREAM.MSG.GET.${samples}`,
          `${api}.STREAM.INFO.${samples}`,
          `${api}.CONSUMER.CREATE.${samples}`,
        ]) {
          const err = await permissionError(nc, () => nc.request(subject, '{}', { timeout: 2_000 }));
          expect([role.kind, err.operation, err.subject]).toEqual([role.kind, 'publish', subject]);
        }
        const err = await permissionError(nc, () => nc.subscribe(`$KV.${t.subjects.samplesBucket}.>`));
        expect([role.kind, err.operation]).toEqual([role.kind, 'subscription']);
      } finally {
        await nc.close();
      }
    }
  });

  it('every read of samples, and the start of sampling, is recorded in the audit log with the reader and the samples read, never their content', async () => {
    const records = (await readStream(t, t.subjects.auditLogStream))
      .filter((m) => m.subject === t.subjects.debugAuditLog('oscar'))
      .map((m) => decode(sampleAccessRecordSchema, m.data));
    expect(records.every((r) => r.operator === 'oscar')).toBe(true);
    expect(records.filter((r) => r.kind === 'sampling_start')).toEqual([
      expect.objectContaining({ contract: 'dbg.note@1', tenant: 'acme' }),
    ]);
    expect(records.filter((r) => r.kind === 'invalid')).toHaveLength(3);
    const lists = records.filter((r) => r.kind === 'samples_list');
    expect(lists.length).toBeGreaterThanOrEqual(1);
    expect(
      lists
        .at(-1)!
        .samples.map((s) => s.operationKey)
        .sort(),
    ).toEqual([keys.one, keys.two].sort());
    expect(records.filter((r) => r.kind === 'samples_show').map((r) => [r.tenant, r.samples])).toEqual([
      ['acme', [{ tenant: 'acme', operationKey: keys.one }]],
      ['globex', []],
    ]);
    expect(JSON.stringify(records)).not.toContain('visible-title');
  });

  it("FM-32: a debug request whose reply subject is another operator's inbox: the sample never reaches that operator (not granted debug), and the requester still gets its own", async () => {
    const olga = await t.connectAs({ kind: 'operator', operator: 'olga' });
    try {
      const spied: string[] = [];
      const spy = olga.subscribe('_INBOX._op.olga.>', {
        callback: (err, m) => void (err ? undefined : spied.push(m.string())),
      });
      await olga.flush();
      const show = JSON.stringify({ action: 'show', contract: 'dbg.note@1', tenant: 'acme', operationKey: keys.one });
      for (let i = 0; i < 3; i++) oscar.publish(t.subjects.opsDebug('oscar'), show, { reply: '_INBOX._op.olga.spy' });
      // Sent after the forged ones on the same connection: answered in oscar's own inbox, with the sample.
      const own = JSON.parse(
        (await oscar.request(t.subjects.opsDebug('oscar'), show, { timeout: 5_000 })).string(),
      ) as Answer;
      expect(own).toMatchObject({
        ok: true,
        sample: { operationKey: keys.one, input: { title: 'visible-title-one' } },
      });
      await new Promise((r) => setTimeout(r, 1_000));
      await olga.flush();
      expect(spied).toEqual([]);
      spy.unsubscribe();
    } finally {
      await olga.close();
    }
  });

  it('a window of max 100 over 60 calls at once: every call is sampled, once; none is dropped', async () => {
    // Replaces acme's window (its samples go with it): globex's calls only. A start over a window
    // still open says which one it replaced.
    const first = await ask({ action: 'start', contract: 'dbg.note@1', forMs: 8_000, tenant: 'globex', max: 100 });
    const started = await ask({ action: 'start', contract: 'dbg.note@1', forMs: 8_000, tenant: 'globex', max: 100 });
    expect(started).toMatchObject({
      ok: true,
      started: { tenant: 'globex', max: 100 },
      replaced: {
        windowId: (first.started as { windowId: string }).windowId,
        tenant: 'globex',
        startedBy: 'oscar',
      },
    });
    await until(
      async () => ((await ask({ action: 'list' })).switches as { tenant?: string }[])[0]?.tenant === 'globex',
    );
    const rs = await Promise.all(
      Array.from({ length: 60 }, (_, i) =>
        agents.gina!.execute({
          tool: 'dbg.note',
          taskId: 'dbg-burst',
          input: { title: `burst ${i}`, body: 'a burst note', apiKey: 'its own key' },
        }),
      ),
    );
    expect(rs.every((r) => r.status === 'committed')).toBe(true);
    const sampled = async () =>
      (
        (await ask({ action: 'list', contract: 'dbg.note@1', tenant: 'globex' })).samples as { operationKey: string }[]
      ).map((x) => x.operationKey);
    await until(async () => (await sampled()).length >= 60);
    const keysSampled = await sampled();
    expect(new Set(keysSampled).size).toBe(60);
    expect(keysSampled.sort()).toEqual(rs.map((r) => r.operationKey!).sort());
  });

  it('after the window the samples are gone: purged from their bucket, and none is answered; a stop is recorded too', async () => {
    const samples = `KV_${t.subjects.samplesBucket}`;
    await until(async () => (await t.jsm.streams.info(samples)).state.messages === 0);
    const token = contractTokenOf('dbg.note@1');
    expect(await ask({ action: 'show', contract: 'dbg.note@1', tenant: 'acme', operationKey: keys.one })).toMatchObject(
      { ok: true, sample: null },
    );
    await until(async () => {
      const l = await ask({ action: 'list' });
      return (l.switches as unknown[]).length === 0 && (l.samples as unknown[]).length === 0;
    });
    // Stopping an ended window: nothing was on any more; the stop is recorded all the same.
    expect(await ask({ action: 'stop', contract: 'dbg.note@1' })).toEqual({ ok: true, stopped: false });
    const stops = (await readStream(t, t.subjects.auditLogStream))
      .filter((m) => m.subject === t.subjects.debugAuditLog('oscar'))
      .map((m) => decode(sampleAccessRecordSchema, m.data))
      .filter((r) => r.kind === 'sampling_stop');
    expect(stops).toEqual([expect.objectContaining({ operator: 'oscar', contract: 'dbg.note@1', count: 0 })]);
    // Nothing of the contract's samples is left under its token (nor its switch).
    expect(
      (await t.jsm.streams.info(samples, { subjects_filter: `$KV.${t.subjects.samplesBucket}.${token}.>` })).state
        .messages,
    ).toBe(0);

    // Every log line of every process (after a clean stop) and the server's: no canary, no sample.
    expect(await Promise.all(procs.map((p) => p.stop()))).toEqual([0, 0, 0]);
    const scan = new LeakScanner(canaries);
    for (const p of procs) {
      for (const l of p.lines) scan.text(`${p.name} log`, JSON.stringify(l));
      scan.text(`${p.name} stderr`, p.stderr);
    }
    scan.text('nats-server log', natsLog);
    expect(scan.leaks).toEqual([]);
    expect(procs.flatMap((p) => p.lines).some((l) => JSON.stringify(l).includes('visible-title'))).toBe(false);
    expect(procs.find((p) => p.name === 'executor')!.lines.some((l) => l.msg === 'sampling on')).toBe(true);
  });
});
