/**
 * `tooltx compensate <operationKey> --tenant <id> --reason <text> [--wait <s>] [--json]`: an
 * operator asks for the compensation of a committed operation (docs/compensation.md), through the
 * authorizer's operator compensation service (request/reply on `<prefix>.ops.compensate.<operator>`).
 * Only an operator granted `compensate` in the identity list may publish there; the server refuses
 * anyone else, who is told `forbidden` and nothing about the operation.
 *
 * Environment: NATS_URL, NATS_NKEY_FILE (the operator's seed), TOOLTX_OPERATOR (their id),
 * TOOLTX_PREFIX. Exit codes: 0 compensated, 1 refused or compensation_failed, 2 bad usage or
 * configuration, 3 still compensation_requested when the wait ended (ask again: a repeat is the
 * same compensation).
 */
import type { Command } from 'commander';
import { z } from 'zod';
import { errors } from '@nats-io/transport-node';
import { ID_PATTERN, MAX_REASON_CHARS } from '@tooltx/contracts';
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
    .string({ error: "required: the operator's id (an operator of the identity list granted compensate)" })
    .regex(ID_PATTERN, 'an operator id of the identity list (^[a-z0-9_-]{1,64}$)'),
});

/** The longest `--wait`, seconds (the service waits at most 60 s). */
const MAX_WAIT_S = 60;

interface Answer {
  status: 'compensated' | 'compensation_failed' | 'compensation_requested' | 'rejected';
  operationKey?: string;
  compensationKey?: string | null;
  receipt?: { resourceId?: string; committedAt?: number };
  error?: { class: string; issues?: { path: (string | number)[]; code: string; message: string }[] };
}

/** What each class of refusal means for the operator. */
const MEANING: Record<string, string> = {
  forbidden: "this operator may not compensate (its identity list entry needs may: ['compensate'])",
  not_found: 'no operation with this key in that tenant',
  compensation_not_allowed:
    'its contract declares no compensation, it is not committed, it is itself a compensation, or another compensation was asked for',
  compensation_expired: "past its contract's compensation deadline: the effect is a person's to deal with",
  invalid_input: 'the request is invalid',
};

function describe(a: Answer): string {
  const cls = a.error?.class ?? 'internal';
  const issues = (a.error?.issues ?? []).map((i) => `${i.path.join('.') || '(request)'}: ${i.message}`).join('; ');
  return `${cls}: ${MEANING[cls] ?? 'refused'}${issues ? ` (${issues})` : ''}`;
}

/** Checks the flags before anything connects; {@link UsageError} (exit 2) names the one that is wrong. */
function checkedFlags(o: { tenant: string; reason: string; wait: string }): {
  tenant: string;
  reason: string;
  waitMs: number;
} {
  if (!ID_PATTERN.test(o.tenant))
    throw new UsageError(`--tenant: a tenant id (^[a-z0-9_-]{1,64}$), got ${shown(o.tenant)}`);
  const reason = o.reason.trim();
  if (reason.length === 0 || reason.length > MAX_REASON_CHARS)
    throw new UsageError(
      `--reason: 1 to ${MAX_REASON_CHARS} characters saying why (kept as a digest), got ${reason.length === 0 ? 'none' : `${reason.length}`}`,
    );
  if (!/^\d{1,2}$/.test(o.wait) || Number(o.wait) > MAX_WAIT_S)
    throw new UsageError(`--wait: whole seconds from 0 to ${MAX_WAIT_S}, got ${shown(o.wait)}`);
  return { tenant: o.tenant, reason, waitMs: Number(o.wait) * 1_000 };
}

async function compensate(
  operationKey: string,
  o: { tenant: string; reason: string; wait: string; json?: boolean },
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
    const subject = new Subjects(config.TOOLTX_PREFIX).opsCompensate(operator);
    const body = { operationKey: key, tenant: flags.tenant, reason: flags.reason, waitMs: flags.waitMs };
    const timeoutMs = flags.waitMs + 10_000;
    try {
      const reply = await nc.request(subject, JSON.stringify(body), { timeout: timeoutMs });
      answer = JSON.parse(reply.string()) as Answer;
    } catch (err) {
      // The server refuses the subject to an operator without the grant: that is the refusal, and
      // nothing about the operation was asked of anyone.
      if (permissionViolationOf(err)) answer = { status: 'rejected', error: { class: 'forbidden' } };
      else if (isNatsError(err, errors.NoRespondersError))
        throw new CliRefusal('no operator compensation service is running (every authorizer instance answers it)');
      else if (isNatsError(err, errors.TimeoutError))
        throw new CliRefusal(`no answer from the operator compensation service within ${timeoutMs / 1_000} s`);
      else throw err;
    }
  } finally {
    await nc.drain();
  }
  if (o.json) process.stdout.write(`${JSON.stringify(answer)}\n`);
  switch (answer.status) {
    case 'compensated': {
      if (!o.json)
        process.stdout.write(
          `compensated ${answer.operationKey} by ${answer.compensationKey}${answer.receipt?.resourceId ? ` (resource ${answer.receipt.resourceId})` : ''}; the original's receipt stays valid\n`,
        );
      return;
    }
    case 'compensation_requested':
      process.stderr.write(
        `compensation_requested: ${answer.compensationKey} has not ended within ${flags.waitMs / 1_000} s; run the same command again to see where it stands (it is the same compensation)\n`,
      );
      process.exitCode = 3;
      return;
    case 'compensation_failed':
      process.stderr.write(
        `compensation_failed: ${answer.compensationKey} did not undo the effect of ${answer.operationKey}; the world still holds it and a person has it (tooltx takeover list)${answer.error ? ` [${answer.error.class}]` : ''}\n`,
      );
      process.exitCode = 1;
      return;
    default:
      process.stderr.write(`tooltx compensate: refused: ${describe(answer)}\n`);
      process.exitCode = 1;
  }
}

/** Registers `compensate` on the CLI. */
export function registerCompensate(program: Command): void {
  program
    .command('compensate <operationKey>')
    .description(
      "compensate a committed operation as an operator granted compensate (NATS_NKEY_FILE, TOOLTX_OPERATOR): its contract's compensating tool runs as an operation of its own; never a rollback",
    )
    .requiredOption('--tenant <id>', 'the tenant of the operation')
    .requiredOption('--reason <text>', `why, 1-${MAX_REASON_CHARS} characters (audit keeps its digest only)`)
    .option('--wait <seconds>', `how long to wait for the compensation's outcome, 0-${MAX_WAIT_S}`, '10')
    .option('--json', 'print the answer as one JSON object')
    .addHelpText(
      'after',
      `
Environment:
  NATS_URL         server URL(s) (default nats://127.0.0.1:4222)
  NATS_NKEY_FILE   the operator's seed (<out>/nkeys/operator.<id>.nk from \`tooltx auth generate\`)
  NATS_CREDS_FILE  a .creds file instead of the seed
  TOOLTX_OPERATOR  the operator's id: an operator of the identity list with may: ["compensate"]
  TOOLTX_PREFIX    subject prefix of the deployment (default tooltx)
Answers: compensated (the compensation's receipt), compensation_failed (a person has it),
compensation_requested (not ended within --wait; ask again), or refused with a class
(forbidden, not_found, compensation_not_allowed, compensation_expired, invalid_input).
Exit codes: 0 compensated, 1 refused or compensation_failed, 2 bad usage or configuration,
3 compensation_requested when the wait ended.`,
    )
    .action((operationKey: string, o: { tenant: string; reason: string; wait: string; json?: boolean }) =>
      compensate(operationKey, o),
    );
}
