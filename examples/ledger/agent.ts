/**
 * A small agent of the ledger example, as `acme/alice`: reads the balance of `ops`, pays `vendor`
 * 125.00 under one task, repeats the identical call (the same receipt: one transfer), then asks for
 * another amount under the same task (`idempotency_conflict`: nothing moves), and reads the balance
 * again under a new task. Prints one JSON object; exit 1 when the payment did not commit.
 *
 * Usage: `npx tsx examples/ledger/agent.ts [taskId]` with the services running on
 * `TOOLTX_TOOLS_MODULE=examples/ledger/tools.ts` (docs/writing-tools.md "Run it"). Environment:
 * NATS_URL (default nats://127.0.0.1:4222), TOOLTX_PREFIX (default tooltx), NATS_NKEY_FILE (the
 * agent's seed) and TOOLTX_RECEIPT_KEYS_FILE (both from `tooltx auth generate`).
 */
import { createTools } from '@tooltx/client';
import { ledgerContracts } from './contracts.js';

const taskId = process.argv[2] ?? `invoice-17-${Date.now().toString(36)}`;
const tools = await createTools({
  servers: process.env.NATS_URL || 'nats://127.0.0.1:4222',
  prefix: process.env.TOOLTX_PREFIX || 'tooltx',
  tenant: 'acme',
  actor: 'alice',
  ...(process.env.NATS_NKEY_FILE ? { nkeyFile: process.env.NATS_NKEY_FILE } : {}),
  contracts: ledgerContracts,
});
try {
  const before = await tools.execute({ tool: 'ledger.balance', taskId, input: { account: 'ops' } });
  const pay = {
    tool: 'ledger.transfer',
    taskId,
    input: { from: 'ops', to: 'vendor', amountCents: 12_500, memo: 'Invoice 17' },
  };
  const first = await tools.execute(pay, { budgetMs: 30_000 });
  const again = await tools.execute(pay, { budgetMs: 30_000 });
  const changed = await tools.execute({ ...pay, input: { ...pay.input, amountCents: 13_000 } });
  // A read is keyed by its task too: within one task it answers what it answered first.
  const after = await tools.execute({ tool: 'ledger.balance', taskId: `${taskId}-after`, input: { account: 'ops' } });
  process.stdout.write(
    `${JSON.stringify({ taskId, before, first, sameReceipt: JSON.stringify(first) === JSON.stringify(again), changed, after })}\n`,
  );
  if (first.status !== 'committed') process.exitCode = 1;
} finally {
  await tools.close();
}
