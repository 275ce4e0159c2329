/**
 * `tooltx confirm <operationKey> --tenant <id> [--wait <s>] [--json]` and `tooltx discard …`: an
 * operator confirms a held-back operation (it then runs, once) or discards it (it ends
 * `rolled_back`, nothing sent) (docs/compensation.md), through the authorizer's operator
 * confirmation service (request/reply on `<prefix>.ops.confirm.<operator>` or
 * `<prefix>.ops.discard.<operator>`). Only an operator granted `confirm` in the identity list may
 * publish there; the server refuses anyone else, who is told `forbidden` and nothing about the
 * operation.
 *
 * Environment: NATS_URL, NATS_NKEY_FILE (the operator's seed), TOOLTX_OPERATOR (their id),
 * TOOLTX_PREFIX. Exit codes: 0 committed (confirm) or rolled_back (discard), 1 refused (or the run
 * the confirmation released was refused), 2 bad usage or configuration, 3 not ended when the wait
 * ended (ask again: confirming twice runs once, discarding twice discards once).
 */
import type { Command } from 'commander';
import { z } from 'zod';
import { errors } from '@nats-io/transport-node';
import { ID_PATTERN } from '@tooltx/contracts';
import { inboxPrefixOf, Subjects } from '@tooltx/nats';
import { baseConfigSchema, loadConfig } from '@tooltx/runtime';
import {
  checkedKey,
  CliRefusal,
  connectCli,
  isNatsError,
  permissionViolationOf,
  shown,
  UsageError,
  type CliIdentity,
} from './cli-support.js';

const operatorConfig = baseConfigSchema.extend({
  TOOLTX_OPERATOR: z
    .string({ error: "required: the operator's id (an operator of the identity list granted confirm)" })
    .regex(ID_PATTERN, 'an operator id of the identity list (^[a-z0-9_-]{1,64}$)'),
});

/** The longest `--wait`, seconds (the service waits at most 60 s). */
const MAX_WAIT_S = 60;

type Action = 'confirm' | 'discard';

interface Answer {
  status: 'committed' | 'confirmed' | 'confirm_requested' | 'rolled_back' | 'discard_requested' | 'rejected';
  operationKey?: string;
  receipt?: { resourceId?: string; committedAt?: number };
  reason?: 'discarded' | 'expired';
  state?: string;
  error?: { class: string; issues?: { path: (string | number)[]; code: string; message: string }[] };
}

/** What each class of refusal means for the operator. */
const MEANING: Record<string, string> = {
  forbidden: "this operator may not confirm or discard (its identity list entry needs may: ['confirm'])",
  not_found: 'no operation with this key in that tenant',
  operation_discarded: 'it was discarded, or not confirmed by its deadline: rolled back, nothing was sent',
  invalid_input: 'the request is invalid',
};

/** What an `invalid_input` code of the confirmation path means. */
const CODE_MEANING: Record<string, string> = {
  already_confirmed: 'it was confirmed already and may have run: never discarded',
  not_held_back: 'its contract holds nothing back: there is nothing to confirm or discard',
  not_awaiting: 'it does not wait for a confirmation (its prepare step refused it: nothing was sent)',
};

function describe(a: Answer): string {
  const cls = a.error?.class ?? 'internal';
  const issues = a.error?.issues ?? [];
  const meaning = issues.map((i) => CODE_MEANING[i.code]).find(Boolean) ?? MEANING[cls] ?? 'refused';
  const detail = issues.map((i) => `${i.path.join('.') || '(request)'}: ${i.message}`).join('; ');
  return `${cls}: ${meaning}${detail ? ` (${detail})` : ''}`;
}

/** Checks the flags before anything connects; {@link UsageError} (exit 2) names the one that is wrong. */
function checkedFlags(o: { tenant: string; wait: string }): { tenant: string; waitMs: number } {
  if (!ID_PATTERN.test(o.tenant))
    throw new UsageError(`--tenant: a tenant id (^[a-z0-9_-]{1,64}$), got ${shown(o.tenant)}`);
  if (!/^\d{1,2}$/.test(o.wait) || Number(o.wait) > MAX_WAIT_S)
    throw new UsageError(`--wait: whole seconds from 0 to ${MAX_WAIT_S}, got ${shown(o.wait)}`);
  return { tenant: o.tenant, waitMs: Number(o.wait) * 1_000 };
}

async function confirmOrDiscard(
  action: Action,
  operationKey: string,
  o: { tenant: string; wait: string; json?: boolean },
): Promise<void> {
  const key = checkedKey(operationKey);
  const flags = checkedFlags(o);
  const config = loadConfig(operatorConfig);
  const operator = config.TOOLTX_OPERATOR;
  const who: CliIdentity = { describe: `operator ${operator}`, seedName: `operator.${operator}.nk` };
  const nc = await connectCli({
    servers: config.NATS_URL,
    name: `tooltx-cli:operator/${operator}`,
    credsFile: config.NATS_CREDS_FILE,
    nkeyFile: config.NATS_NKEY_FILE,
    inboxPrefix: inboxPrefixOf({ kind: 'operator', operator }),
    reconnectForever: false,
    as: who,
  });
  let answer: Answer;
  try {
    const s = new Subjects(config.TOOLTX_PREFIX);
    const subject = action === 'confirm' ? s.opsConfirm(operator) : s.opsDiscard(operator);
    const body = { operationKey: key, tenant: flags.tenant, waitMs: flags.waitMs };
    const timeoutMs = flags.waitMs + 10_000;
    try {
      const reply = await nc.request(subject, JSON.stringify(body), { timeout: timeoutMs });
      answer = JSON.parse(reply.string()) as Answer;
    } catch (err) {
      // The server refuses the subject to an operator without the grant: that is the refusal, and
      // nothing about the operation was asked of anyone.
      if (permissionViolationOf(err)) answer = { status: 'rejected', error: { class: 'forbidden' } };
      else if (isNatsError(err, errors.NoRespondersError))
        throw new CliRefusal(`no operator ${action} service is running (every authorizer instance answers it)`);
      else if (isNatsError(err, errors.TimeoutError))
        throw new CliRefusal(`no answer from the operator ${action} service within ${timeoutMs / 1_000} s`);
      else throw err;
    }
  } finally {
    await nc.drain();
  }
  if (o.json) process.stdout.write(`${JSON.stringify(answer)}\n`);
  const waited = `${flags.waitMs / 1_000} s`;
  switch (answer.status) {
    case 'committed':
      if (!o.json)
        process.stdout.write(
          `confirmed ${answer.operationKey}: it ran once and committed${answer.receipt?.resourceId ? ` (resource ${answer.receipt.resourceId})` : ''}\n`,
        );
      return;
    case 'rolled_back':
      if (!o.json)
        process.stdout.write(
          `rolled_back ${answer.operationKey} (${answer.reason === 'expired' ? 'not confirmed by its deadline' : 'discarded'}): it never ran, nothing was sent\n`,
        );
      return;
    case 'confirmed':
      process.stderr.write(
        `confirmed: ${answer.operationKey} was released and has not ended within ${waited} (${answer.state}); run the same command again to see its outcome (it runs once)\n`,
      );
      process.exitCode = 3;
      return;
    case 'confirm_requested':
    case 'discard_requested':
      process.stderr.write(
        `${answer.status}: ${answer.operationKey} was not seen ${action === 'confirm' ? 'released' : 'rolled back'} within ${waited}; run the same command again to see where it stands\n`,
      );
      process.exitCode = 3;
      return;
    default:
      process.stderr.write(`tooltx ${action}: refused: ${describe(answer)}\n`);
      process.exitCode = 1;
  }
}

const HELP = (action: Action) => `
Environment:
  NATS_URL         server URL(s) (default nats://127.0.0.1:4222)
  NATS_NKEY_FILE   the operator's seed (<out>/nkeys/operator.<id>.nk from \`tooltx auth generate\`)
  NATS_CREDS_FILE  a .creds file instead of the seed
  TOOLTX_OPERATOR  the operator's id: an operator of the identity list with may: ["confirm"]
  TOOLTX_PREFIX    subject prefix of the deployment (default tooltx)
${
  action === 'confirm'
    ? `Answers: committed (it ran once; its receipt), confirmed (released, not ended within --wait),
confirm_requested (not seen released within --wait), or refused with a class (forbidden,
not_found, operation_discarded, invalid_input: already confirmed, not held back, not awaiting).
Exit codes: 0 committed, 1 refused (or its run was refused), 2 bad usage or configuration,
3 confirmed or confirm_requested when the wait ended (ask again: it runs once).`
    : `Answers: rolled_back (nothing was sent), discard_requested (not seen rolled back within
--wait), or refused with a class (forbidden, not_found, invalid_input: already confirmed, not held
back, not awaiting).
Exit codes: 0 rolled_back, 1 refused, 2 bad usage or configuration, 3 discard_requested when the
wait ended.`
}`;

/** Registers `confirm` and `discard` on the CLI. */
export function registerConfirm(program: Command): void {
  for (const action of ['confirm', 'discard'] as const)
    program
      .command(`${action} <operationKey>`)
      .description(
        action === 'confirm'
          ? 'confirm a held-back operation as an operator granted confirm (NATS_NKEY_FILE, TOOLTX_OPERATOR): it then runs, once'
          : 'discard a held-back operation as an operator granted confirm (NATS_NKEY_FILE, TOOLTX_OPERATOR): it ends rolled_back, nothing sent',
      )
      .requiredOption('--tenant <id>', 'the tenant of the operation')
      .option('--wait <seconds>', `how long to wait for the outcome, 0-${MAX_WAIT_S}`, '10')
      .option('--json', 'print the answer as one JSON object')
      .addHelpText('after', HELP(action))
      .action((operationKey: string, o: { tenant: string; wait: string; json?: boolean }) =>
        confirmOrDiscard(action, operationKey, o),
      );
}
