/**
 * A minimal agent: writes one note into the `research` knowledge base of tenant `acme` through
 * tooltx, then repeats the identical call and shows that the second answer is the same receipt
 * (one operation key, one execution, one KB row).
 *
 * Usage: `npm run quickstart` while `npm start` runs (or with NATS_URL / TOOLTX_PREFIX / KB_DEDUP set
 * as the services have them). A set-up problem (no server there, a seed or prefix the server does
 * not accept, a missing file) is one line on stderr naming it, exit 2.
 */
import { join } from 'node:path';
import { Command } from 'commander';
import { usageErrorsExitTwo } from '@tooltx/runtime';
import { TooltxError } from '@tooltx/contracts';
import { createTools, ToolsOptionError } from '@tooltx/client';
import { kbDedupFromEnv, researchContracts } from './contracts.js';

usageErrorsExitTwo(new Command('tooltx-quickstart'))
  .description(
    'write one note through a running `npm start` as acme/alice, then repeat the call and compare the receipts',
  )
  .addHelpText(
    'after',
    '\nEnvironment: NATS_URL (default nats://127.0.0.1:4222), TOOLTX_PREFIX, TOOLTX_STATE_DIR (where npm start wrote the seeds and receipt keys), NATS_NKEY_FILE, TOOLTX_RECEIPT_KEYS_FILE, KB_DEDUP',
  )
  .parse(process.argv);

/**
 * A failure before or instead of an answer, as one line (a wrong prefix or port
 * printed a stack trace): tooltx's typed errors say which option and why in their message; anything
 * else by its class and message. Exit 2.
 */
function fail(err: unknown): never {
  const text =
    typeof err === 'string'
      ? err
      : err instanceof TooltxError || err instanceof ToolsOptionError
        ? err.message
        : err instanceof Error
          ? `${err.name}: ${err.message}`
          : String(err);
  process.stderr.write(`tooltx-quickstart: ${text}\n`);
  process.exit(2);
}

/**
 * The variable `name`: unset when set to the empty string (docs/operating.md "Configuration"); spaces alone
 * are refused, never used as a server, prefix or directory.
 */
function setting(name: string): string | undefined {
  const v = process.env[name];
  if (v === undefined || v === '') return undefined;
  if (v.trim() === '') fail(`${name}=${JSON.stringify(v)}: spaces alone are not a value: unset it for the default`);
  return v;
}
const stateDir = setting('TOOLTX_STATE_DIR') ?? '.state';

// In a function: a bad setting read while building the options (KB_DEDUP) is reported the same way.
const tools = await (async () =>
  createTools({
    servers: setting('NATS_URL') ?? 'nats://127.0.0.1:4222',
    prefix: setting('TOOLTX_PREFIX') ?? 'tooltx',
    tenant: 'acme',
    actor: 'alice',
    // Auth is on: `npm start` writes each agent's nkey seed under its state directory.
    nkeyFile: setting('NATS_NKEY_FILE') ?? join(stateDir, 'auth', 'nkeys', 'agent.acme.alice.nk'),
    contracts: researchContracts({ kbDedup: kbDedupFromEnv() }).all,
    // The receipt keys `npm start` generated: a committed answer counts only with a receipt signed by one.
    receiptKeys: setting('TOOLTX_RECEIPT_KEYS_FILE') ?? join(stateDir, 'auth', 'receipt-keys.json'),
  }))().catch(fail);
try {
  const call = {
    tool: 'kb.write_note',
    taskId: 'quickstart-1',
    actorId: 'alice',
    input: {
      kb: 'research',
      title: 'Hello, tooltx',
      body: 'One key, one execution.',
      sourceUrl: 'https://example.org/tooltx',
      fetchedAt: '2026-11-30T06:00:00Z',
    },
  };
  const first = await tools.execute(call, { budgetMs: 20_000 });
  const again = await tools.execute(call, { budgetMs: 20_000 });
  process.stdout.write(
    `${JSON.stringify({ first, again, sameReceipt: JSON.stringify(first) === JSON.stringify(again) }, null, 2)}\n`,
  );
  if (first.status !== 'committed') process.exitCode = 1;
} catch (err) {
  await tools.close().catch(() => undefined);
  fail(err);
}
await tools.close();
