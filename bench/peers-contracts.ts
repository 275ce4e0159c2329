/**
 * The peers workload's one tool, the half shared with the agent (the bench's SDK client): appending
 * one line `<key> <execId>` to a local file, the side effect every system of `npm run bench --
 * --workload peers` performs once per key (the same effect as the Restate and DBOS peers'
 * `writeNote`). The trusted half, which the services load, is ./peers-tools.ts.
 *
 * Effect class `create`: each accepted call adds one new record (a line) and nothing else; the
 * defaults give it a 10 s timeout, 7-day key retention, a downstream assumed to promise nothing and
 * a receipt-only result (`{}`). The operation key covers the whole input, the bench's key: the same
 * key again is the same operation (deduplicated, answered with the first receipt).
 */
import { z } from 'zod';
import { defineTool } from '@tooltx/contracts';

export const appendLine = defineTool({
  name: 'peers.append_line',
  description: 'Append one line "<key> <execId>" to the bench\'s effects file; the key names the call.',
  effect: 'create',
  input: z.strictObject({ key: z.string().regex(/^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/) }),
});

export const peersContracts = [appendLine.contract];
