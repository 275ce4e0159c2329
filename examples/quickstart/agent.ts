/**
 * A minimal agent: writes one note through tooltx, then repeats the identical call and shows that
 * the second answer is the same receipt (one operation key, one execution).
 *
 * Usage: `npm run quickstart` while `npm start` runs (or with NATS_URL / TOOLTX_PREFIX set).
 */
import { createTools } from '@tooltx/client';
import { contracts } from './contracts.js';

const tools = await createTools({
  servers: process.env.NATS_URL ?? 'nats://127.0.0.1:4222',
  prefix: process.env.TOOLTX_PREFIX ?? 'tooltx',
  tenant: 'acme',
  actor: 'alice',
  contracts,
});
try {
  const call = { tool: 'notes.write', taskId: 'quickstart-1', actorId: 'alice', input: { notebook: 'research', title: 'Hello, tooltx', body: 'One key, one execution.' } };
  const first = await tools.execute(call, { budgetMs: 15_000 });
  const again = await tools.execute(call, { budgetMs: 15_000 });
  process.stdout.write(`${JSON.stringify({ first, again, sameReceipt: JSON.stringify(first) === JSON.stringify(again) }, null, 2)}\n`);
  if (first.status !== 'committed') process.exitCode = 1;
} finally {
  await tools.close();
}
