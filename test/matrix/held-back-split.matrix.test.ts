/**
 * Held-back commits on the split layout (authorizer, executor and reconciler as processes of their
 * own, each under its own identity and permissions): the authorizer reads the held operation's
 * intent back for the confirm permission's check, and the reconciler for the discard step of an
 * operation it rolled back. Real nats-server, real processes, the mail outbox with MAIL_DEDUP=off.
 * A grid of `npm run matrix` (a stack of its own for one scenario: kept out of `npm test`'s time).
 * The co-located layout and the rest of the rules, in `npm test`: test/held-back.e2e.test.ts.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { downstreamKeyOf } from '@tooltx/contracts';
import { createTools, type Tools } from '@tooltx/client';
import { provisioned, type TestNats } from '../helpers/nats.js';
import { startAll } from '../helpers/services.js';
import { RESEARCH_TOOLS } from '../helpers/kb.js';
import { sampleMail, startMail, type TestMail } from '../helpers/mail.js';
import { mailContracts } from '../../examples/research-kb/mail-contracts.js';

const CONFIRM_MS = 2_000;
const contracts = mailContracts({ mailDedup: false, confirmDeadlineMs: CONFIRM_MS });
let t: TestNats;
let mail: TestMail;
let stopAll: () => Promise<(number | null)[]>;
let alice: Tools;

const sendsUnder = async (operationKey: string) => {
  const p = await mail.client.probeSent({ tenant: 'acme', key: downstreamKeyOf('acme', operationKey) });
  return p.found ? p.count : 0;
};
const discardedUnder = async (operationKey: string) =>
  (await mail.client.probeDiscard({ tenant: 'acme', key: downstreamKeyOf('acme', operationKey) })).found;

beforeAll(async () => {
  t = await provisioned();
  mail = await startMail({ MAIL_DEDUP: 'off' });
  const env = {
    ...t.env,
    TOOLTX_TOOLS_MODULE: RESEARCH_TOOLS,
    MAIL_URL: mail.url,
    MAIL_SERVICE_TOKEN_FILE: mail.serviceToken.file,
    MAIL_DEDUP: 'off',
    MAIL_CONFIRM_DEADLINE_MS: String(CONFIRM_MS),
    TOOLTX_RECONCILE_INTERVAL_MS: '300',
  };
  ({ stopAll } = await startAll([
    ['authorizer', env],
    ['executor', env],
    ['reconciler', env],
  ]));
  alice = await createTools({
    servers: t.url,
    tenant: 'acme',
    actor: 'alice',
    nkeyFile: t.agentSeed('acme', 'alice'),
    contracts: contracts.all,
    prefix: t.subjects.prefix,
    receiptKeys: t.auth.receiptKeysFile,
    budgetMs: 15_000,
  });
});

afterAll(async () => {
  await alice?.close();
  const codes = await stopAll?.();
  await mail?.stop();
  await t?.close();
  expect(codes).toEqual([0, 0, 0]);
});

describe('held-back commits, one process per role', () => {
  it('a confirmation runs it once; a discard and the deadline roll it back and discard its draft; nothing else is sent', async () => {
    const draft = (taskId: string) =>
      alice.execute({ tool: 'mail.send_draft', taskId, input: sampleMail({ subject: `Digest ${taskId}` }) });
    const [sent, dropped, expired] = await Promise.all([draft('split-1'), draft('split-2'), draft('split-3')]);
    for (const r of [sent, dropped, expired]) expect(r.status).toBe('awaiting_confirmation');

    const c = await alice.confirm({ operationKey: sent.operationKey! });
    expect(c.status).toBe('committed');
    const d = await alice.discard({ operationKey: dropped.operationKey! });
    expect(d).toMatchObject({ status: 'rolled_back', reason: 'discarded' });
    await expect
      .poll(async () => (await alice.status({ operationKey: expired.operationKey! })).confirmation, {
        timeout: CONFIRM_MS + 6_000,
        interval: 200,
      })
      .toEqual({ status: 'rolled_back', reason: 'expired' });

    expect(await sendsUnder(sent.operationKey!)).toBe(1);
    expect(await sendsUnder(dropped.operationKey!)).toBe(0);
    expect(await sendsUnder(expired.operationKey!)).toBe(0);
    await expect.poll(() => discardedUnder(dropped.operationKey!)).toBe(true);
    await expect.poll(() => discardedUnder(expired.operationKey!)).toBe(true);
  });
});
