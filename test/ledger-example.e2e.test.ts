/**
 * The ledger example of docs/writing-tools.md on real processes: a provisioned nats-server, the
 * ledger (examples/ledger/ledger-server.ts) behind a real HTTP fault hop (`@tooltx/dev/faults`,
 * keyed by the `idempotency-key` the tools send), and the authorizer, executor and reconciler with
 * `TOOLTX_TOOLS_MODULE=examples/ledger/tools.ts` (run under tsx: not in the tests' compiled build).
 * Every test counts the ledger's own transfers under the operation's downstream key.
 */
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { downstreamKeyOf, prepareCall } from '@tooltx/contracts';
import type { Tools } from '@tooltx/client';
import { HttpFaultProxy } from '@tooltx/dev/faults';
import { provisioned, type TestNats } from './helpers/nats.js';
import { ROOT, runScript, startService, type ServiceProcess } from './helpers/services.js';
import { history } from './helpers/ops.js';
import { ledgerContracts, transfer } from '../examples/ledger/contracts.js';
import { startLedger, type LedgerServer } from '../examples/ledger/ledger-server.js';

const LEDGER_TOOLS = join(ROOT, 'examples', 'ledger', 'tools.ts');
let t: TestNats;
let ledger: LedgerServer;
let proxy: HttpFaultProxy;
let env: Record<string, string>;
let services: ServiceProcess[] = [];
let alice: Tools;

const pay = (taskId: string, amountCents = 12_500) => ({
  tool: 'ledger.transfer',
  taskId,
  input: { from: 'ops', to: 'vendor', amountCents, memo: 'Invoice 17' },
});
const keyOf = (taskId: string) => prepareCall(transfer.contract, taskId, pay(taskId).input).operationKey;
/** The ledger's transfers made under the operation's downstream key. */
const transfersOf = (operationKey: string) =>
  ledger.transfers('acme').filter((x) => x.key === downstreamKeyOf('acme', operationKey));

beforeAll(async () => {
  t = await provisioned();
  ledger = await startLedger({ accounts: { acme: { ops: 1_000_000, vendor: 0 } } });
  proxy = await new HttpFaultProxy(ledger.url).start();
  env = { ...t.env, TOOLTX_TOOLS_MODULE: LEDGER_TOOLS, LEDGER_URL: proxy.url, TOOLTX_RECONCILE_INTERVAL_MS: '300' };
  services = await Promise.all([
    startService('authorizer', env),
    startService('executor', env),
    startService('reconciler', env),
  ]);
  alice = await t.agentTools('acme', 'alice', ledgerContracts, {
    budgetMs: 30_000,
  });
});

afterAll(async () => {
  await alice?.close();
  const codes = await Promise.all(services.map((p) => p.stop()));
  await proxy?.stop();
  await ledger?.close();
  await t?.close();
  expect(codes).toEqual([0, 0, 0]);
});

describe('the ledger example', () => {
  it("a transfer commits with a receipt naming the ledger's transfer; the balance read sees it", async () => {
    const before = await alice.execute<{ balanceCents: number }>({
      tool: 'ledger.balance',
      taskId: 'pay-1-before',
      input: { account: 'OPS' },
    });
    const r = await alice.execute(pay('pay-1'));
    const after = await alice.execute<{ balanceCents: number }>({
      tool: 'ledger.balance',
      taskId: 'pay-1-after',
      input: { account: 'ops' },
    });
    expect(r.status).toBe('committed');
    if (r.status !== 'committed' || before.status !== 'committed' || after.status !== 'committed')
      throw new Error(JSON.stringify({ r, before, after }));
    expect(alice.verify(r)).toEqual({ valid: true });
    expect(r.result).toEqual({});
    const made = transfersOf(r.operationKey);
    expect(made).toHaveLength(1);
    expect(r.receipt.resourceId).toBe(made[0]!.id);
    expect(before.result.balanceCents - after.result.balanceCents).toBe(12_500);
  });

  it('the same call twice is one transfer on the ledger, answered with the same receipt', async () => {
    const first = await alice.execute(pay('pay-2'));
    const again = await alice.execute(pay('pay-2'));
    expect(first.status).toBe('committed');
    expect(again).toEqual(first);
    expect(transfersOf(keyOf('pay-2'))).toHaveLength(1);
  });

  it('another amount under the same task is an idempotency_conflict: nothing moves', async () => {
    expect(await alice.execute(pay('pay-3'))).toMatchObject({ status: 'committed' });
    const count = ledger.transfers('acme').length;
    const ops = ledger.balance('acme', 'ops');
    const changed = await alice.execute(pay('pay-3', 13_000));
    expect(changed).toMatchObject({ status: 'rejected', error: { class: 'idempotency_conflict' }, next: 'replan' });
    expect(ledger.transfers('acme')).toHaveLength(count);
    expect(ledger.balance('acme', 'ops')).toBe(ops);
  });

  it('the ledger applied the transfer and its answer was lost: the reconciler probes by the key and commits it, one transfer', async () => {
    const key = keyOf('pay-4');
    const cut = proxy.inject(downstreamKeyOf('acme', key), { kind: 'cut_response' });
    const r = await alice.execute(pay('pay-4'));
    expect((await cut.applied).status).toBe(201);
    expect(r.status).toBe('committed');
    expect((await history(t, 'acme', key)).map((e) => e.type)).toEqual(['accepted', 'running', 'unknown', 'committed']);
    const made = transfersOf(key);
    expect(made).toHaveLength(1);
    if (r.status === 'committed') expect(r.receipt.resourceId).toBe(made[0]!.id);
  });

  it('the request was lost before the ledger: the probe finds nothing, the ledger honours the key, so the attempt runs again: one transfer', async () => {
    const key = keyOf('pay-5');
    const dropped = proxy.inject(downstreamKeyOf('acme', key), { kind: 'drop' });
    const r = await alice.execute(pay('pay-5'));
    await dropped.applied;
    expect(r.status).toBe('committed');
    const types = (await history(t, 'acme', key)).map((e) => e.type);
    expect(types.slice(0, 4)).toEqual(['accepted', 'running', 'unknown', 'requeued']);
    expect(types.at(-1)).toBe('committed');
    expect(transfersOf(key)).toHaveLength(1);
  });

  it("the example's agent script runs against it: committed, the same receipt twice, a changed amount refused", async () => {
    const agent = runScript(join(ROOT, 'examples', 'ledger', 'agent.ts'), {
      NATS_URL: t.url,
      TOOLTX_PREFIX: t.subjects.prefix,
      NATS_NKEY_FILE: t.agentSeed('acme', 'alice'),
      TOOLTX_RECEIPT_KEYS_FILE: t.auth.receiptKeysFile,
    });
    expect(await agent.exited, agent.stderr).toBe(0);
    const out = agent.lines.find((l) => 'first' in l) as {
      taskId: string;
      before: { result: { balanceCents: number } };
      after: { result: { balanceCents: number } };
      first: { status: string; operationKey: string };
      sameReceipt: boolean;
      changed: unknown;
    };
    expect(out.first.status).toBe('committed');
    expect(out.sameReceipt).toBe(true);
    expect(out.changed).toMatchObject({ status: 'rejected', error: { class: 'idempotency_conflict' } });
    expect(out.before.result.balanceCents - out.after.result.balanceCents).toBe(12_500);
    expect(transfersOf(out.first.operationKey)).toHaveLength(1);
  });
});
