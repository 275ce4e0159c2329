/**
 * Held-back commits (docs/compensation.md "Held-back commits") on the co-located layout:
 * `mail.send_draft` declares `confirm`, so its operation is accepted, its prepare step drafts the
 * mail in the real outbox (MAIL_DEDUP=off: every send request that reaches it is a row, so a second
 * send would show) and it waits for `tools.confirm` or `tools.discard`. Real nats-server, real
 * processes, SDK clients.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { downstreamKeyOf } from '@tooltx/contracts';
import { createTools, type Tools } from '@tooltx/client';
import { provisioned, type TestNats } from './helpers/nats.js';
import { startHost, type ServiceProcess } from './helpers/services.js';
import { history } from './helpers/ops.js';
import { RESEARCH_TOOLS } from './helpers/kb.js';
import { sampleMail, startMail, type TestMail } from './helpers/mail.js';
import { mailContracts } from '../examples/research-kb/mail-contracts.js';

/** How long a draft waits for its confirmation here (the contract's `confirm.deadlineMs`), ms. */
const CONFIRM_MS = 3_000;
const contracts = mailContracts({ mailDedup: false, confirmDeadlineMs: CONFIRM_MS });
let t: TestNats;
let mail: TestMail;
let host: ServiceProcess;
let alice: Tools;

const client = (actor: string) =>
  createTools({
    servers: t.url,
    tenant: 'acme',
    actor,
    nkeyFile: t.agentSeed('acme', actor),
    contracts: contracts.all,
    prefix: t.subjects.prefix,
    receiptKeys: t.auth.receiptKeysFile,
    budgetMs: 20_000,
  });

/** Send requests the outbox stored under the operation's key (MAIL_DEDUP=off: each one is a row). */
const sendsUnder = async (operationKey: string) => {
  const p = await mail.client.probeSent({ tenant: 'acme', key: downstreamKeyOf('acme', operationKey) });
  return p.found ? p.count : 0;
};

/** A drafted mail, held back: its key and what execute answered. */
const drafted = async (taskId: string, subject: string) => {
  const r = await alice.execute({ tool: 'mail.send_draft', taskId, input: sampleMail({ subject }) });
  if (r.status !== 'awaiting_confirmation') throw new Error(`not held back: ${JSON.stringify(r)}`);
  return r;
};

beforeAll(async () => {
  t = await provisioned();
  mail = await startMail({ MAIL_DEDUP: 'off' });
  host = await startHost({
    ...t.env,
    TOOLTX_TOOLS_MODULE: RESEARCH_TOOLS,
    MAIL_URL: mail.url,
    MAIL_SERVICE_TOKEN_FILE: mail.serviceToken.file,
    MAIL_DEDUP: 'off',
    MAIL_CONFIRM_DEADLINE_MS: String(CONFIRM_MS),
    TOOLTX_RECONCILE_INTERVAL_MS: '300',
  });
  alice = await client('alice');
});

afterAll(async () => {
  await alice?.close();
  const code = await host?.stop();
  if (code !== 0) console.log(code, host?.stderr);
  await mail?.stop();
  await t?.close();
  expect(code).toBe(0);
});

describe('held-back commits: nothing leaves before a confirmation', () => {
  it('execute answers awaiting_confirmation with the preview; confirmed by two clients at once, then again: one send, one receipt', async () => {
    const input = sampleMail({ subject: 'Digest, confirmed' });
    const r = await drafted('held-1', input.subject);
    expect(r).toMatchObject({
      status: 'awaiting_confirmation',
      next: 'confirm_or_discard',
      preview: { to: input.to, subject: input.subject, bodyBytes: Buffer.byteLength(input.body) },
    });
    expect((r.preview as { draftId: string }).draftId).toEqual(expect.any(String));
    expect(r.deadlineAt).toBeGreaterThan(Date.now());
    expect(await sendsUnder(r.operationKey)).toBe(0);
    // Executing the same call again answers the same hold: nothing runs.
    const again = await alice.execute({ tool: 'mail.send_draft', taskId: 'held-1', input });
    expect(again).toMatchObject({ status: 'awaiting_confirmation', operationKey: r.operationKey });
    const s = await alice.status({ operationKey: r.operationKey });
    expect(s).toMatchObject({ state: 'accepted', confirmation: { status: 'awaiting_confirmation' } });

    const other = await client('alice');
    try {
      const [a, b] = await Promise.all([
        alice.confirm({ operationKey: r.operationKey }),
        other.confirm({ operationKey: r.operationKey }),
      ]);
      expect(a.status).toBe('committed');
      expect(b.status).toBe('committed');
      if (a.status !== 'committed' || b.status !== 'committed') return;
      expect(b.receipt).toEqual(a.receipt);
      expect(alice.verify({ operationKey: r.operationKey, receipt: a.receipt }).valid).toBe(true);
      const third = await alice.confirm({ operationKey: r.operationKey });
      expect(third).toMatchObject({ status: 'committed', receipt: a.receipt });
      expect(await sendsUnder(r.operationKey)).toBe(1);
      // A confirmed operation is never discarded: it may have run.
      const late = await alice.discard({ operationKey: r.operationKey });
      expect(late).toMatchObject({ status: 'rejected', error: { class: 'invalid_input' } });
      expect((await history(t, 'acme', r.operationKey)).map((e) => e.type)).toEqual([
        'accepted',
        'awaiting_confirmation',
        'confirmed',
        'running',
        'committed',
      ]);
    } finally {
      await other.close();
    }
  });

  it('discard, then confirm: rolled_back, the confirmation refused operation_discarded, nothing sent and the draft discarded', async () => {
    const r = await drafted('held-2', 'Digest, discarded');
    // Another actor without mail.confirm may not discard it.
    const bob = await client('bob');
    try {
      expect(await bob.discard({ operationKey: r.operationKey })).toMatchObject({
        status: 'rejected',
        error: { class: 'forbidden' },
      });
      expect(await bob.confirm({ operationKey: r.operationKey })).toMatchObject({
        status: 'rejected',
        error: { class: 'forbidden' },
      });
    } finally {
      await bob.close();
    }
    const d = await alice.discard({ operationKey: r.operationKey });
    expect(d).toEqual({ status: 'rolled_back', operationKey: r.operationKey, reason: 'discarded' });
    expect(await alice.discard({ operationKey: r.operationKey })).toEqual(d);
    const c = await alice.confirm({ operationKey: r.operationKey });
    expect(c).toMatchObject({ status: 'rejected', error: { class: 'operation_discarded' }, next: 'replan' });
    const s = await alice.status({ operationKey: r.operationKey });
    expect(s).toMatchObject({
      state: 'rejected',
      error: { class: 'operation_discarded' },
      confirmation: { status: 'rolled_back', reason: 'discarded' },
    });
    expect(await sendsUnder(r.operationKey)).toBe(0);
    await expect
      .poll(
        async () =>
          (await mail.client.probeDiscard({ tenant: 'acme', key: downstreamKeyOf('acme', r.operationKey) })).found,
      )
      .toBe(true);
    // Executing it again answers the rollback; it never runs.
    const re = await alice.execute({
      tool: 'mail.send_draft',
      taskId: 'held-2',
      input: sampleMail({ subject: 'Digest, discarded' }),
    });
    expect(re).toMatchObject({ status: 'rejected', error: { class: 'operation_discarded' } });
    expect(await sendsUnder(r.operationKey)).toBe(0);
  });

  it('no confirmation by the deadline: rolled_back by the reconciler, nothing sent, a late confirmation refused', async () => {
    const r = await drafted('held-3', 'Digest, never confirmed');
    await expect
      .poll(async () => (await alice.status({ operationKey: r.operationKey })).confirmation, {
        timeout: CONFIRM_MS + 6_000,
        interval: 200,
      })
      .toEqual({ status: 'rolled_back', reason: 'expired' });
    expect((await history(t, 'acme', r.operationKey)).map((e) => e.type)).toEqual([
      'accepted',
      'awaiting_confirmation',
      'confirmation_expired',
    ]);
    const c = await alice.confirm({ operationKey: r.operationKey });
    expect(c).toMatchObject({ status: 'rejected', error: { class: 'operation_discarded' } });
    expect(await sendsUnder(r.operationKey)).toBe(0);
  });

  it('bad requests are refused at their field path before anything is sent', async () => {
    const bad = await alice.confirm({ operationKey: 'not a key' });
    expect(bad).toMatchObject({
      status: 'rejected',
      error: { class: 'invalid_input', issues: [{ path: ['operationKey'] }] },
    });
    const extra = await alice.discard({
      operationKey: 'opk_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA',
      x: 1,
    } as never);
    expect(extra).toMatchObject({ status: 'rejected', error: { class: 'invalid_input' } });
    const nowhere = await alice.confirm({ operationKey: 'opk_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA' });
    expect(nowhere).toMatchObject({ status: 'rejected', error: { class: 'not_found' } });
  });
});
