/**
 * The ledger example's tools — the half shared with agents (schemas, normalisers, key rules), written
 * with `defineTool` (docs/writing-tools.md). The trusted half is in ./tools.ts, loaded only by the
 * services. An agent gives `createTools` the contracts: `ledgerContracts`.
 */
import { z } from 'zod';
import { defineTool, normalise } from '@tooltx/contracts';

/** An account name of the caller's tenant, compared case-insensitively. */
const account = z.string().regex(/^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$/);

export const balance = defineTool({
  name: 'ledger.balance',
  description: 'Read the balance of an account of the caller’s tenant, in cents.',
  effect: 'read',
  input: z.strictObject({ account }),
  output: z.object({ account: z.string(), balanceCents: z.number().int() }),
  normalise: { account: normalise.token },
});

export const transfer = defineTool({
  name: 'ledger.transfer',
  description: 'Move an amount, in cents, from one account of the caller’s tenant to another.',
  effect: 'charge',
  input: z.strictObject({
    from: account,
    to: account,
    amountCents: z.number().int().positive().max(100_000_000),
    memo: z.string().max(200).optional(),
  }),
  normalise: { from: normalise.token, to: normalise.token, memo: normalise.title },
  // The operation is "this task's transfer from `from` to `to`": the same call again is the same
  // transfer, and another amount under the same task is an idempotency_conflict (a charge's intent).
  target: (i) => ({ from: i.from, to: i.to }),
  // The ledger deduplicates by the key it is sent and refuses a request past its deadline.
  downstream: { honoursKey: true, enforcesDeadline: true },
});

export const ledgerContracts = [balance.contract, transfer.contract];
