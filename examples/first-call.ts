// Your first tool call through tooltx. Start the stack (`npm start`), then in another terminal:
//   node --import tsx examples/first-call.ts
// Set NATS_URL / TOOLTX_STATE_DIR only if you gave `npm start` another --port / --state-dir.
import { randomUUID } from 'node:crypto';
import { createTools } from '@tooltx/client';
import { researchContracts } from './research-kb/contracts.js';

const state = process.env.TOOLTX_STATE_DIR || '.state'; // where `npm start` wrote the keys
const tools = await createTools({
  servers: process.env.NATS_URL || 'nats://127.0.0.1:4222',
  tenant: 'acme',
  actor: 'alice',
  nkeyFile: `${state}/auth/nkeys/agent.acme.alice.nk`, // alice's seed: the server knows her by it
  receiptKeys: `${state}/auth/receipt-keys.json`, // only receipts signed by these keys count
  contracts: researchContracts({ kbDedup: true }).all, // the tools' schemas, normalisers, key rules
});

const taskId = `first-call-${randomUUID()}`; // a new task on every run
const source = { sourceUrl: 'https://example.org/tides', fetchedAt: '2026-12-01T06:00:00Z' };
const note = { kb: 'research', title: 'Tides', body: 'High water at 06:12.', ...source };
const call = { tool: 'kb.write_note', taskId, actorId: 'alice', input: note };

const first = await tools.execute(call);
console.log('1. write:', first.status, first.status === 'committed' ? first.receipt : first);

const again = await tools.execute(call); // the identical call: same operation key
const same = 'receipt' in first && 'receipt' in again && again.receipt.signature === first.receipt.signature;
console.log('2. repeat:', again.status, same ? 'with the same receipt' : 'with ANOTHER receipt');

const changed = await tools.execute({ ...call, input: { ...note, fetchedAt: '2026-12-01T07:00:00Z' } });
const why = changed.status === 'rejected' ? changed.error.class : '';
console.log('3. same task, other fetchedAt:', changed.status, why, `next: ${changed.next}`);
await tools.close();
