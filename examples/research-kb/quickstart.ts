/**
 * A minimal agent: writes one note into the `research` knowledge base of tenant `acme` through
 * tooltx, then repeats the identical call and shows that the second answer is the same receipt
 * (one operation key, one execution, one KB row).
 *
 * Usage: `npm run quickstart` while `npm start` runs (or with NATS_URL / TOOLTX_PREFIX / KB_DEDUP set
 * as the services have them).
 */
import { join } from 'node:path';
import { Command } from 'commander';
import { createTools } from '@tooltx/client';
import { kbDedupFromEnv, researchContracts } from './contracts.js';

new Command('tooltx-quickstart')
  .description('write one note through a running `npm start` as acme/alice, then repeat the call and compare the receipts')
  .addHelpText('after', '\nEnvironment: NATS_URL (default nats://127.0.0.1:4222), TOOLTX_PREFIX, TOOLTX_STATE_DIR (where npm start wrote the seeds and receipt keys), NATS_NKEY_FILE, TOOLTX_RECEIPT_KEYS_FILE, KB_DEDUP')
  .parse(process.argv);

const tools = await createTools({
  servers: process.env.NATS_URL ?? 'nats://127.0.0.1:4222',
  prefix: process.env.TOOLTX_PREFIX ?? 'tooltx',
  tenant: 'acme',
  actor: 'alice',
  // Auth is on: `npm start` writes each agent's nkey seed under its state directory.
  nkeyFile: process.env.NATS_NKEY_FILE ?? join(process.env.TOOLTX_STATE_DIR ?? '.state', 'auth', 'nkeys', 'agent.acme.alice.nk'),
  contracts: researchContracts({ kbDedup: kbDedupFromEnv() }).all,
  // The receipt keys `npm start` generated: a committed answer counts only with a receipt signed by one.
  receiptKeys: process.env.TOOLTX_RECEIPT_KEYS_FILE ?? join(process.env.TOOLTX_STATE_DIR ?? '.state', 'auth', 'receipt-keys.json'),
});
try {
  const call = {
    tool: 'kb.write_note',
    taskId: 'quickstart-1',
    actorId: 'alice',
    input: { kb: 'research', title: 'Hello, tooltx', body: 'One key, one execution.', sourceUrl: 'https://example.org/tooltx', fetchedAt: '2026-11-30T06:00:00Z' },
  };
  const first = await tools.execute(call, { budgetMs: 15_000 });
  const again = await tools.execute(call, { budgetMs: 15_000 });
  process.stdout.write(`${JSON.stringify({ first, again, sameReceipt: JSON.stringify(first) === JSON.stringify(again) }, null, 2)}\n`);
  if (first.status !== 'committed') process.exitCode = 1;
} finally {
  await tools.close();
}
