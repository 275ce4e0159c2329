/**
 * `tooltx takeover list | show <key> | resolve <key> --committed <resourceId> | --not-applied`
 * (issue 8, FM-14): an operator's view of the operations handed over to a person, through the
 * takeover service of the reconciler (request/reply on `<prefix>.takeover.<operator>`). The
 * operator's id is the subject token the server pins their nkey to; it is recorded as
 * `resolvedBy` with `manual: true`. Output: JSON, one object per line.
 *
 * Environment: NATS_URL, NATS_NKEY_FILE (the operator's seed), TOOLTX_OPERATOR (their id),
 * TOOLTX_PREFIX. Exit codes: 0 done, 1 refused (the error's class on stderr), 2 bad configuration.
 */
import type { Command } from 'commander';
import { z } from 'zod';
import { ID_PATTERN } from '@tooltx/contracts';
import { connectNats, Subjects } from '@tooltx/nats';
import { baseConfigSchema, loadConfig } from '@tooltx/runtime';
import { inboxPrefixOf } from '@tooltx/streams';

const operatorConfig = baseConfigSchema.extend({
  TOOLTX_OPERATOR: z.string().regex(ID_PATTERN, 'an operator id of the identity list (^[a-z0-9_-]{1,64}$)'),
});

/** Sends one request to the takeover service; prints the answer; exit 1 with its class when refused. */
async function ask(request: Record<string, unknown>, timeoutMs = 10_000): Promise<void> {
  const config = loadConfig(operatorConfig);
  const nc = await connectNats({
    servers: config.NATS_URL,
    name: `tooltx-cli:operator/${config.TOOLTX_OPERATOR}`,
    credsFile: config.NATS_CREDS_FILE,
    nkeySeedFile: config.NATS_NKEY_FILE,
    inboxPrefix: inboxPrefixOf({ kind: 'operator', operator: config.TOOLTX_OPERATOR }),
    reconnectForever: false,
  });
  try {
    const subjects = new Subjects(config.TOOLTX_PREFIX);
    const reply = await nc.request(subjects.takeover(config.TOOLTX_OPERATOR), JSON.stringify(request), { timeout: timeoutMs });
    const answer = JSON.parse(reply.string()) as { ok: boolean; error?: { class: string; issues?: unknown[] }; takeovers?: unknown[]; operation?: unknown };
    if (!answer.ok) {
      process.stderr.write(`tooltx takeover: refused: ${JSON.stringify(answer.error)}\n`);
      process.exitCode = 1;
      return;
    }
    if (answer.takeovers) {
      for (const t of answer.takeovers) process.stdout.write(`${JSON.stringify(t)}\n`);
      process.stderr.write(`${answer.takeovers.length} open takeover(s)\n`);
    } else process.stdout.write(`${JSON.stringify(answer.operation)}\n`);
  } finally {
    await nc.drain();
  }
}

/** Registers `takeover` on the CLI. */
export function registerTakeover(program: Command): void {
  const t = program
    .command('takeover')
    .description('operations handed over to a person (unknown past their deadline, or another effect found under their key): list, show, resolve — as an operator (NATS_NKEY_FILE, TOOLTX_OPERATOR)');
  t.command('list')
    .description('every open takeover record, oldest first, one JSON object per line')
    .action(() => ask({ action: 'list' }));
  t.command('show <operationKey>')
    .description('the operation\'s folded state: status, takeover record, evidence, times (no bodies)')
    .option('--tenant <id>', 'the tenant of the operation (needed once it is no longer watched)')
    .action((operationKey: string, o: { tenant?: string }) => ask({ action: 'show', operationKey, ...(o.tenant ? { tenant: o.tenant } : {}) }));
  t.command('resolve <operationKey>')
    .description('record what you verified downstream: --committed <resourceId> or --not-applied; unfreezes the task')
    .option('--committed <resourceId>', 'the effect exists downstream under this resource id')
    .option('--not-applied', 'the effect definitively did not happen (the identical input may be submitted again)')
    .option('--tenant <id>', 'the tenant of the operation (needed once it is no longer watched)')
    .action((operationKey: string, o: { committed?: string; notApplied?: boolean; tenant?: string }) => {
      if (Boolean(o.committed) === Boolean(o.notApplied)) throw new Error('give exactly one of --committed <resourceId> or --not-applied');
      const outcome = o.committed ? { kind: 'committed', resourceId: o.committed } : { kind: 'not_applied' };
      return ask({ action: 'resolve', operationKey, outcome, ...(o.tenant ? { tenant: o.tenant } : {}) });
    });
}
