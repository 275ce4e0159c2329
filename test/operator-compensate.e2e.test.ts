/**
 * Operators' requests through the agents' path (docs/compensation.md): `tooltx compensate`, and
 * `tooltx confirm` / `tooltx discard` of a held-back `mail.send_draft` in the real mail outbox
 * (MAIL_DEDUP=off: a second send would show).
 *
 * `tooltx compensate` ("An operator asks"): an operator granted `compensate` in
 * the identity list compensates a committed `kb.write_note` through the authorizer's operator
 * compensation service, which registers it through the agents' path (a compensation intent under
 * the actor token `_op-<operator>`). One without the grant is refused `forbidden` by the server and
 * learns nothing; an agent cannot publish under an operator's token; an agent and an operator asking
 * for the same compensation make one delete in the KB (KB_DEDUP=off: a second one would show).
 * Real nats-server with auth, one co-located process, the CLI as a process.
 */
import { execFile } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { deriveCompensationKey, downstreamKeyOf, operationIdOf, prepareCall, type Contract } from '@tooltx/contracts';
import { createTools, type Tools } from '@tooltx/client';
import { decode, encode, openBucket, permissionViolationOf } from '@tooltx/nats';
import { auditRecordSchema, type AuditRecord } from '@tooltx/lifecycle';
import { jetStreamOf } from '@tooltx/nats';
import { provisioned, TEST_IDENTITIES, type TestNats } from './helpers/nats.js';
import { startHost, type ServiceProcess } from './helpers/services.js';
import { history, waitForDecision } from './helpers/ops.js';
import { RESEARCH_TOOLS, startKb, type TestKb } from './helpers/kb.js';
import { note, RECOVERY_TIMING } from './helpers/kb-faults.js';
import { sampleMail, startMail, type TestMail } from './helpers/mail.js';
import { researchContracts } from '../examples/research-kb/contracts.js';
import { mailContracts } from '../examples/research-kb/mail-contracts.js';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..');
const TIMING = RECOVERY_TIMING;
const contracts = researchContracts({ kbDedup: false, timing: TIMING });
const mailTools = mailContracts({ mailDedup: false });
let t: TestNats;
let kb: TestKb;
let mail: TestMail;
let host: ServiceProcess;
let alice: Tools;
/** alice with the mail contracts: she drafts the held-back mails. */
let aliceMail: Tools;

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

/** `tooltx <command> <args>` as `operator` (seed and id), with only these variables. */
function operatorCli(operator: string, command: string, args: string[]): Promise<Run> {
  return new Promise((resolve) =>
    execFile(
      process.execPath,
      ['--import', 'tsx', join(ROOT, 'bin', 'tooltx.ts'), command, ...args],
      {
        cwd: ROOT,
        env: {
          PATH: process.env.PATH ?? '',
          ...(t
            ? {
                NATS_URL: t.url,
                TOOLTX_PREFIX: t.subjects.prefix,
                NATS_NKEY_FILE: t.auth.seedFile({ kind: 'operator', operator }),
              }
            : {}),
          TOOLTX_OPERATOR: operator,
        },
      },
      (err, stdout, stderr) =>
        resolve({ code: err ? (typeof err.code === 'number' ? err.code : 1) : 0, stdout, stderr }),
    ),
  );
}
const compensateCli = (operator: string, args: string[]) => operatorCli(operator, 'compensate', args);

/** Delete requests the KB stored under the compensation's key (KB_DEDUP=off: each one is a row). */
const deletesUnder = async (compensationKey: string) => {
  const p = await kb.client.probeDelete({ tenant: 'acme', key: downstreamKeyOf('acme', compensationKey) });
  return p.found ? p.count : 0;
};

const written = async (taskId: string, title: string) => {
  const r = await alice.execute({ tool: 'kb.write_note', taskId, input: note(title) });
  if (r.status !== 'committed') throw new Error(`the write did not commit: ${JSON.stringify(r)}`);
  return r;
};

const compensationKeyOf = (operationKey: string) =>
  deriveCompensationKey(operationKey, { tool: 'kb.delete_note', version: 1 });

const UNKNOWN_KEY = 'opk_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA';
/** Bad flags and the flag each message must name: refused before the CLI connects to anything. */
const FLAG_CASES: [string[], string][] = [
  [[UNKNOWN_KEY, '--tenant', 'acme'], '--reason'],
  [[UNKNOWN_KEY, '--tenant', 'Acme.Corp', '--reason', 'why'], '--tenant'],
  [[UNKNOWN_KEY, '--tenant', 'acme', '--reason', 'x'.repeat(501), '--wait', '5'], '--reason'],
  [[UNKNOWN_KEY, '--tenant', 'acme', '--reason', 'why', '--wait', '61'], '--wait'],
];
/** Bad flags of `tooltx confirm` and `tooltx discard`, and the flag (or argument) each message must name. */
const CONFIRM_FLAG_CASES: [string, string[], string][] = [
  ['confirm', [UNKNOWN_KEY, '--tenant', 'Acme.Corp'], '--tenant'],
  ['discard', [UNKNOWN_KEY, '--tenant', 'acme', '--wait', '61'], '--wait'],
  ['discard', ['opk_short', '--tenant', 'acme'], '<operationKey>'],
];
/** Started before the deployment (they need none): the CLI's start-up overlaps the servers'. */
let flagRuns: Promise<Run[]> | undefined;
let confirmFlagRuns: Promise<Run[]> | undefined;

beforeAll(async () => {
  flagRuns = Promise.all([
    compensateCli('olga', ['--help']),
    ...FLAG_CASES.map(([args]) => compensateCli('olga', args)),
  ]);
  confirmFlagRuns = flagRuns.then(() =>
    Promise.all([
      operatorCli('carl', 'confirm', ['--help']),
      ...CONFIRM_FLAG_CASES.map(([command, args]) => operatorCli('carl', command, args)),
    ]),
  );
  // `oscar` resolves takeovers only (an entry of the older form); `olga` may also compensate, `carl`
  // may also confirm and discard.
  t = await provisioned({}, undefined, {
    identities: {
      ...TEST_IDENTITIES,
      operators: ['oscar', { id: 'olga', may: ['compensate'] }, { id: 'carl', may: ['confirm'] }],
    },
  });
  [mail, kb] = await Promise.all([
    startMail({ MAIL_DEDUP: 'off' }),
    startKb(
      {
        tenants: [{ id: 'acme', quota: 10_000 }],
        // bob may read the research notes, not write or delete them.
        knowledgeBases: [
          { tenant: 'acme', name: 'research', defaultRole: 'writer', members: [{ actor: 'bob', role: 'reader' }] },
        ],
      },
      { KB_DEDUP: 'off' },
    ),
  ]);
  host = await startHost({
    ...t.env,
    TOOLTX_TOOLS_MODULE: RESEARCH_TOOLS,
    KB_URL: kb.url,
    KB_KEEPALIVE: 'off',
    KB_DEDUP: 'off',
    KB_TIMING_MS: `${TIMING.timeoutMs},${TIMING.runningBoundMs},${TIMING.unknownDeadlineMs}`,
    TOOLTX_RECONCILE_INTERVAL_MS: '300',
    MAIL_URL: mail.url,
    MAIL_SERVICE_TOKEN_FILE: mail.serviceToken.file,
    MAIL_DEDUP: 'off',
  });
  [alice, aliceMail] = await Promise.all([agentTools('alice'), agentTools('alice', mailTools.all)]);
});

const agentTools = (actor: string, list: Contract[] = contracts.all) =>
  createTools({
    servers: t.url,
    tenant: 'acme',
    actor,
    nkeyFile: t.agentSeed('acme', actor),
    contracts: list,
    prefix: t.subjects.prefix,
    receiptKeys: t.auth.receiptKeysFile,
    budgetMs: 30_000,
  });

afterAll(async () => {
  await alice?.close();
  await aliceMail?.close();
  const code = await host?.stop();
  if (code !== 0) console.log(code, host?.stderr);
  await kb?.stop();
  await mail?.stop();
  await t?.close();
  expect(code).toBe(0);
});

describe('tooltx compensate: an operator compensates a committed operation', () => {
  it('an operator granted compensate compensates a committed write: one delete, the original committed with its receipt and compensated, the operator recorded as the requester', async () => {
    const w = await written('op-comp-1', 'Compensated by an operator');
    const r = await compensateCli('olga', [w.operationKey, '--tenant', 'acme', '--reason', 'wrong source', '--json']);
    expect(r.code, r.stderr).toBe(0);
    const answer = JSON.parse(r.stdout) as Record<string, unknown>;
    const compensationKey = compensationKeyOf(w.operationKey);
    expect(answer).toMatchObject({ status: 'compensated', operationKey: w.operationKey, compensationKey });
    expect(await deletesUnder(compensationKey)).toBe(1);
    const s = await alice.status({ operationKey: w.operationKey });
    expect(s).toMatchObject({
      state: 'committed',
      receipt: w.receipt,
      compensation: { status: 'compensated', operationKey: compensationKey },
    });
    // The compensation's receipt is a receipt the SDK verifies.
    const c = await alice.status({ operationKey: compensationKey });
    expect(c.receipt).toEqual(answer.receipt);
    expect(alice.verify({ operationKey: compensationKey, receipt: c.receipt! }).valid).toBe(true);
    // Who asked: the operator, from the subject the server pinned them to.
    const { state } = await t.store.load('acme', operationIdOf(w.operationKey));
    expect(state).toMatchObject({ compensation: { requestedBy: { kind: 'operator', id: 'olga' } } });
    expect((await history(t, 'acme', compensationKey))[0]).toMatchObject({ state: { actor: '_op-olga' } });
  });

  it('an operator without the grant is refused forbidden and learns nothing; an agent cannot publish under an operator token, and nothing but a compensation request runs under one', async () => {
    const w = await written('op-comp-2', 'Not compensated by oscar');
    // An unknown key, asked at the same time, gets the very same answer.
    const [r, unknown] = await Promise.all([
      compensateCli('oscar', [w.operationKey, '--tenant', 'acme', '--reason', 'not mine', '--json']),
      compensateCli('oscar', [UNKNOWN_KEY, '--tenant', 'acme', '--reason', 'no such call', '--json']),
    ]);
    expect(r.code).toBe(1);
    // Nothing about the operation: no key, no state, only the class.
    expect(JSON.parse(r.stdout)).toEqual({ status: 'rejected', error: { class: 'forbidden' } });
    expect(r.stderr).toContain('forbidden');
    expect(unknown.code).toBe(1);
    expect(unknown.stdout).toBe(r.stdout);
    expect(await deletesUnder(compensationKeyOf(w.operationKey))).toBe(0);
    const s = await alice.status({ operationKey: w.operationKey });
    expect(s.state).toBe('committed');
    expect(s.compensation).toBeUndefined();

    // An agent publishing a compensation request under olga's token: refused by the server.
    const nc = await t.connectAs({ kind: 'agent', tenant: 'acme', actor: 'mallory' });
    try {
      const { js } = await jetStreamOf(nc);
      const err = await js
        .publish(
          t.subjects.intent('acme', '_op-olga'),
          encode({
            tool: 'kb.delete_note',
            version: 1,
            compensates: { operationKey: w.operationKey, reason: 'posing as an operator' },
          }),
          { timeout: 2_000 },
        )
        .then(
          () => null,
          (e: unknown) => e,
        );
      expect(permissionViolationOf(err)).toMatchObject({ operation: 'publish' });
    } finally {
      await nc.close();
    }
    expect(await deletesUnder(compensationKeyOf(w.operationKey))).toBe(0);

    // Under an operator's token the authorizer runs compensation requests only: any other call
    // stored there (only the authorizer's identity could) is refused forbidden, nothing registered.
    const svc = await t.connectAs({ kind: 'service', service: 'authorizer' });
    try {
      const input = note('Never under an operator token');
      const key = prepareCall(contracts.writeNote, 'op-comp-2b', input).operationKey;
      await (await jetStreamOf(svc)).js.publish(
        t.subjects.intent('acme', '_op-olga'),
        encode({ tool: 'kb.write_note', version: 1, taskId: 'op-comp-2b', input }),
      );
      expect(await waitForDecision(t, 'acme', key, '_op-olga')).toMatchObject({ error: { class: 'forbidden' } });
      expect((await t.store.load('acme', operationIdOf(key))).state.status).toBe('none');
    } finally {
      await svc.close();
    }
  });

  it('an agent and an operator asking for the same compensation at once: one delete reaches the KB, both get the same receipt; a third requester the policy refuses gets forbidden; the audit records all three', async () => {
    const w = await written('op-comp-3', 'Compensated by an agent and an operator');
    const [sdk, cli] = await Promise.all([
      alice.compensate({ operationKey: w.operationKey, reason: 'duplicate' }),
      compensateCli('olga', [w.operationKey, '--tenant', 'acme', '--reason', 'wrong source']),
    ]);
    expect(sdk.status).toBe('compensated');
    if (sdk.status !== 'compensated') return;
    // The operator's answer in words: the same compensation, the same resource.
    expect(cli.code, cli.stderr).toBe(0);
    expect(cli.stdout).toBe(
      `compensated ${w.operationKey} by ${sdk.compensationKey} (resource ${sdk.receipt.resourceId}); the original's receipt stays valid\n`,
    );
    expect(await deletesUnder(sdk.compensationKey)).toBe(1);

    // Each requester is authorised on its own: a third, whom the compensating contract's policy
    // refuses (a reader of the knowledge base), is refused forbidden and gets nothing of the
    // compensation; nothing is sent again.
    const bob = await agentTools('bob');
    try {
      const refused = await bob.compensate({ operationKey: w.operationKey, reason: 'me too' });
      expect(refused).toMatchObject({ status: 'rejected', error: { class: 'forbidden' } });
      expect(refused).not.toHaveProperty('receipt');
    } finally {
      await bob.close();
    }
    expect(await deletesUnder(sdk.compensationKey)).toBe(1);

    // The audit records every requester: the one that registered it (the compensation's actor),
    // the one answered with the replay (who, and its reason's digest), the one refused.
    const kv = await openBucket(t.nc, t.subjects.auditBucket);
    const auditKey = t.subjects.projectionKey('acme', operationIdOf(sdk.compensationKey));
    let record: AuditRecord | undefined;
    for (const until = Date.now() + 10_000; Date.now() < until; await new Promise((r) => setTimeout(r, 100))) {
      const e = await kv.get(auditKey);
      record = e?.operation === 'PUT' ? decode(auditRecordSchema, e.value) : undefined;
      if (record?.decisions.length === 2 && record.status === 'committed') break;
    }
    const first = record!.actor;
    expect(['alice', '_op-olga']).toContain(first);
    const second = first === 'alice' ? { kind: 'operator', id: 'olga' } : { kind: 'actor', id: 'alice' };
    expect(record!.decisions).toEqual([
      expect.objectContaining({
        actor: second.kind === 'operator' ? '_op-olga' : 'alice',
        replayed: expect.objectContaining({ requestedBy: second }),
      }),
      expect.objectContaining({ actor: 'bob', errorClass: 'forbidden' }),
    ]);
  });

  it('--help, and bad flags exit 2 naming the flag before anything connects', async () => {
    const [help, ...runs] = await flagRuns!;
    expect(help!.code).toBe(0);
    for (const s of ['--tenant', '--reason', '--wait', '--json', 'TOOLTX_OPERATOR', 'forbidden'])
      expect(help!.stdout).toContain(s);
    FLAG_CASES.forEach(([args, flag], i) => {
      const r = runs[i]!;
      expect({ args: args.slice(1), code: r.code, names: r.stderr.includes(flag) }).toEqual({
        args: args.slice(1),
        code: 2,
        names: true,
      });
    });
  });
});

/** Send requests the outbox stored under the operation's key (MAIL_DEDUP=off: each one is a row). */
const sendsUnder = async (operationKey: string) => {
  const p = await mail.client.probeSent({ tenant: 'acme', key: downstreamKeyOf('acme', operationKey) });
  return p.found ? p.count : 0;
};

/** A mail alice drafted, held back: its key and what execute answered. */
const drafted = async (taskId: string, subject: string) => {
  const r = await aliceMail.execute({ tool: 'mail.send_draft', taskId, input: sampleMail({ subject }) });
  if (r.status !== 'awaiting_confirmation') throw new Error(`not held back: ${JSON.stringify(r)}`);
  return r;
};

describe('tooltx confirm and tooltx discard: an operator decides a held-back operation', () => {
  it('an operator granted confirm confirms a held draft: one send, the operator recorded as the confirmer; confirming again answers the same', async () => {
    const r = await drafted('op-confirm-1', 'Digest, confirmed by an operator');
    expect(await sendsUnder(r.operationKey)).toBe(0);
    const c = await operatorCli('carl', 'confirm', [r.operationKey, '--tenant', 'acme', '--json']);
    expect(c.code, c.stderr).toBe(0);
    const answer = JSON.parse(c.stdout) as { status: string; receipt: unknown };
    expect(answer).toMatchObject({ status: 'committed', operationKey: r.operationKey });
    expect(await sendsUnder(r.operationKey)).toBe(1);
    // The receipt is the operation's own, which the SDK verifies; the drafter reads it committed.
    const s = await aliceMail.status({ operationKey: r.operationKey });
    expect(s).toMatchObject({ state: 'committed', confirmation: { status: 'confirmed' } });
    expect(s.receipt).toEqual(answer.receipt);
    expect(aliceMail.verify({ operationKey: r.operationKey, receipt: s.receipt! }).valid).toBe(true);
    const { state } = await t.store.load('acme', operationIdOf(r.operationKey));
    expect(state).toMatchObject({
      actor: 'alice',
      confirmation: { confirmed: { by: { kind: 'operator', id: 'carl' } } },
    });
    // Again, in words: the same outcome, nothing sent again; the drafter's own confirmation too.
    // A confirmed operation is never discarded, by an operator either.
    const [again, sdk, late] = await Promise.all([
      operatorCli('carl', 'confirm', [r.operationKey, '--tenant', 'acme']),
      aliceMail.confirm({ operationKey: r.operationKey }),
      operatorCli('carl', 'discard', [r.operationKey, '--tenant', 'acme', '--json']),
    ]);
    expect(again.code, again.stderr).toBe(0);
    expect(again.stdout).toMatch(new RegExp(`^confirmed ${r.operationKey}: it ran once and committed \\(resource `));
    expect(sdk).toMatchObject({ status: 'committed', receipt: s.receipt });
    expect(await sendsUnder(r.operationKey)).toBe(1);
    expect(late.code).toBe(1);
    expect(JSON.parse(late.stdout)).toMatchObject({
      status: 'rejected',
      error: { class: 'invalid_input', issues: [{ code: 'already_confirmed' }] },
    });
    expect(late.stderr).toContain('confirmed already');
  });

  it('an operator discards a held draft: rolled_back, nothing sent, the draft discarded; a later confirmation is refused operation_discarded', async () => {
    const r = await drafted('op-confirm-2', 'Digest, discarded by an operator');
    const d = await operatorCli('carl', 'discard', [r.operationKey, '--tenant', 'acme', '--json']);
    expect(d.code, d.stderr).toBe(0);
    expect(JSON.parse(d.stdout)).toEqual({ status: 'rolled_back', operationKey: r.operationKey, reason: 'discarded' });
    const [c, sdk] = await Promise.all([
      operatorCli('carl', 'confirm', [r.operationKey, '--tenant', 'acme']),
      aliceMail.confirm({ operationKey: r.operationKey }),
    ]);
    expect(c.code).toBe(1);
    expect(c.stderr).toContain('operation_discarded');
    expect(sdk).toMatchObject({ status: 'rejected', error: { class: 'operation_discarded' } });
    expect(await aliceMail.status({ operationKey: r.operationKey })).toMatchObject({
      state: 'rejected',
      confirmation: { status: 'rolled_back', reason: 'discarded' },
    });
    const { state } = await t.store.load('acme', operationIdOf(r.operationKey));
    expect(state).toMatchObject({ confirmation: { discarded: { by: { kind: 'operator', id: 'carl' } } } });
    expect(await sendsUnder(r.operationKey)).toBe(0);
    await expect
      .poll(
        async () =>
          (await mail.client.probeDiscard({ tenant: 'acme', key: downstreamKeyOf('acme', r.operationKey) })).found,
      )
      .toBe(true);
  });

  it('an operator without the confirm grant is refused forbidden and learns nothing; the draft still waits', async () => {
    const r = await drafted('op-confirm-3', 'Digest, not decided by olga or oscar');
    // olga may compensate, not confirm; oscar may resolve takeovers only. An unknown key gets the
    // very same answer.
    const [nowhere, ...runs] = await Promise.all([
      // An unknown key asked by a granted operator: not_found.
      operatorCli('carl', 'confirm', [UNKNOWN_KEY, '--tenant', 'acme', '--json']),
      operatorCli('olga', 'confirm', [r.operationKey, '--tenant', 'acme', '--json']),
      operatorCli('oscar', 'discard', [r.operationKey, '--tenant', 'acme', '--json']),
      operatorCli('olga', 'confirm', [UNKNOWN_KEY, '--tenant', 'acme', '--json']),
    ]);
    for (const run of runs) {
      expect(run.code).toBe(1);
      expect(JSON.parse(run.stdout)).toEqual({ status: 'rejected', error: { class: 'forbidden' } });
      expect(run.stderr).toContain("may: ['confirm']");
    }
    expect(await sendsUnder(r.operationKey)).toBe(0);
    expect(await aliceMail.status({ operationKey: r.operationKey })).toMatchObject({
      state: 'accepted',
      confirmation: { status: 'awaiting_confirmation' },
    });
    expect(nowhere!.code).toBe(1);
    expect(JSON.parse(nowhere!.stdout)).toMatchObject({ status: 'rejected', error: { class: 'not_found' } });
  });

  it('--help, and bad flags exit 2 naming the flag before anything connects', async () => {
    const [help, ...runs] = await confirmFlagRuns!;
    expect(help!.code).toBe(0);
    for (const s of ['--tenant', '--wait', '--json', 'TOOLTX_OPERATOR', 'forbidden', 'may: ["confirm"]', 'committed'])
      expect(help!.stdout).toContain(s);
    CONFIRM_FLAG_CASES.forEach(([command, args, flag], i) => {
      const r = runs[i]!;
      expect({ command, args, code: r.code, names: r.stderr.includes(flag) }).toEqual({
        command,
        args,
        code: 2,
        names: true,
      });
    });
  });
});
