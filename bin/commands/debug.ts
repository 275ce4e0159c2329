/**
 * `tooltx debug sample start | stop` and `tooltx debug samples list | show` — debug samples of one
 * contract version (docs/debug-samples.md): an operator granted `debug` in the identity list
 * switches sampling on for a bounded window (at most 4 h), and reads the samples the executor kept:
 * inputs and results scrubbed by the logger's rules, gone at the window's end. Every request goes to
 * the executor's debug service (`<prefix>.ops.debug.<operator>`), which records it in the audit log
 * before it answers.
 *
 * Environment: NATS_URL, NATS_NKEY_FILE (the operator's seed), TOOLTX_OPERATOR (their id),
 * TOOLTX_PREFIX. Exit codes: 0 done, 1 refused, 2 bad usage or configuration.
 */
import type { Command } from 'commander';
import { CONTRACT_ID_PATTERN, ID_PATTERN } from '@tooltx/contracts';
import { MAX_SAMPLES_PER_WINDOW, MAX_SAMPLING_WINDOW_MS } from '@tooltx/lifecycle';
import type { DebugAnswer } from '@tooltx/readside';
import { durationMsOf } from '@tooltx/runtime';
import { checkedKey, shown, UsageError, writeRefusal } from './cli-support.js';
import { operatorRequest, withOperator } from './takeover.js';

const SERVICE = {
  name: 'debug service',
  servedBy: 'every executor instance answers debug requests',
  grant: 'debug',
};

const ENV = `
Environment:
  NATS_URL         server URL(s) (default nats://127.0.0.1:4222)
  NATS_NKEY_FILE   the operator's seed (<out>/nkeys/operator.<id>.nk from \`tooltx auth generate\`)
  NATS_CREDS_FILE  a .creds file instead of the seed
  TOOLTX_OPERATOR  the operator's id (an operator of the identity list granted "debug")
  TOOLTX_PREFIX    subject prefix of the deployment (default tooltx)
Every request is recorded in the audit log (who, when, which samples; never their content).
Exit codes: 0 done, 1 refused (its class on stderr), 2 bad usage or configuration.`;

const contractOf = (v: string, what = '<contract>'): string => {
  if (!CONTRACT_ID_PATTERN.test(v))
    throw new UsageError(`${what}: expected name@version, e.g. kb.write_note@1, got ${shown(v)}`);
  return v;
};
const tenantOf = (v: string): string => {
  if (!ID_PATTERN.test(v)) throw new UsageError(`--tenant: expected a tenant id (^[a-z0-9_-]{1,64}$), got ${shown(v)}`);
  return v;
};

/** Sends one request; prints its answer as JSON; exit 1 with the class and field issues when refused. */
async function ask(req: Record<string, unknown>): Promise<void> {
  await withOperator(async ({ nc, subjects, operator, who, seedFile }) => {
    const answer = await operatorRequest<DebugAnswer>(
      nc,
      subjects.opsDebug(operator),
      req,
      who,
      seedFile,
      10_000,
      SERVICE,
    );
    if (!answer.ok) {
      writeRefusal('debug', answer.error);
      return;
    }
    if ('sample' in answer && !answer.sample) {
      process.stderr.write('tooltx debug: no readable sample of this operation (none kept, or its window ended)\n');
      process.exitCode = 1;
      return;
    }
    process.stdout.write(`${JSON.stringify(answer, null, 2)}\n`);
  });
}

/** Registers `debug sample start | stop` and `debug samples list | show`. */
export function registerDebug(program: Command): void {
  const debug = program
    .command('debug')
    .description(
      'debug samples of a contract: scrubbed inputs and results, kept for a bounded window (as an operator granted debug)',
    );
  const sample = debug.command('sample').description('switch debug sampling of one contract version on or off');
  sample
    .command('start <contract>')
    .description(
      `sample <name@version>'s calls for a bounded window (at most ${MAX_SAMPLING_WINDOW_MS / 3_600_000} h); a new start replaces an open window and its samples`,
    )
    .requiredOption(
      '--for <duration>',
      "how long, e.g. 30m, 2h (at most 4h; the shortest is the deployment's, 1m by default)",
    )
    .option('--tenant <id>', "only this tenant's calls")
    .option('--rate <share>', 'share of the calls sampled, in (0, 1] (default 1)')
    .option('--max <n>', `most samples kept, 1-${MAX_SAMPLES_PER_WINDOW} (default 100)`)
    .addHelpText('after', ENV)
    .action((contract: string, o: { for: string; tenant?: string; rate?: string; max?: string }) => {
      const forMs = durationMsOf(o.for);
      if (forMs === null || forMs <= 0)
        throw new UsageError(`--for: expected a duration like 30m or 2h, got ${shown(o.for)}`);
      if (forMs > MAX_SAMPLING_WINDOW_MS)
        throw new UsageError(`--for: a sampling window is at most 4h, got ${shown(o.for)}`);
      const rate = o.rate === undefined ? undefined : Number(o.rate);
      if (rate !== undefined && !(rate > 0 && rate <= 1))
        throw new UsageError(`--rate: expected a share in (0, 1], e.g. 0.1, got ${shown(o.rate ?? '')}`);
      // Decimal digits only: Number() would also read 0x10 and 1e2.
      const max = o.max === undefined ? undefined : /^\d{1,4}$/.test(o.max) ? Number(o.max) : Number.NaN;
      if (max !== undefined && !(Number.isInteger(max) && max >= 1 && max <= MAX_SAMPLES_PER_WINDOW))
        throw new UsageError(`--max: expected an integer 1-${MAX_SAMPLES_PER_WINDOW}, got ${shown(o.max ?? '')}`);
      return ask({
        action: 'start',
        contract: contractOf(contract),
        forMs,
        ...(o.tenant !== undefined ? { tenant: tenantOf(o.tenant) } : {}),
        ...(rate !== undefined ? { rate } : {}),
        ...(max !== undefined ? { max } : {}),
      });
    });
  sample
    .command('stop <contract>')
    .description('switch sampling of <name@version> off now; its samples are purged')
    .addHelpText('after', ENV)
    .action((contract: string) => ask({ action: 'stop', contract: contractOf(contract) }));
  const samples = debug.command('samples').description('read debug samples (every read is audited)');
  samples
    .command('list')
    .description(
      'the open sampling windows and the readable samples (tenant, operation key, outcome, times; no content)',
    )
    .option('--contract <name@version>', 'only this contract version')
    .option('--tenant <id>', 'only this tenant')
    .addHelpText('after', ENV)
    .action((o: { contract?: string; tenant?: string }) =>
      ask({
        action: 'list',
        ...(o.contract !== undefined ? { contract: contractOf(o.contract, '--contract') } : {}),
        ...(o.tenant !== undefined ? { tenant: tenantOf(o.tenant) } : {}),
      }),
    );
  samples
    .command('show <contract> <operationKey>')
    .description('one sample: its scrubbed input and result')
    .requiredOption('--tenant <id>', 'the tenant of the operation')
    .addHelpText('after', ENV)
    .action((contract: string, operationKey: string, o: { tenant: string }) =>
      ask({
        action: 'show',
        contract: contractOf(contract),
        tenant: tenantOf(o.tenant),
        operationKey: checkedKey(operationKey),
      }),
    );
}
