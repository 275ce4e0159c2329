/**
 * `tooltx takeover list | show <key> | resolve <key> --committed <resourceId> | --not-applied |
 * --effect-kept | --undone-by-hand` (FM-14, FM-20): an operator's view of the operations handed
 * over to a person — an unknown outcome, or a compensation that failed — through the takeover
 * service of the reconciler (request/reply on `<prefix>.takeover.<operator>`). The
 * operator's id is the subject token the server pins their nkey to; it is recorded as
 * `resolvedBy` with `manual: true`. Output: JSON, one object per line.
 *
 * Environment: NATS_URL, NATS_NKEY_FILE (the operator's seed), TOOLTX_OPERATOR (their id),
 * TOOLTX_PREFIX. Exit codes: 0 done, 1 refused (what it means and the error's class on stderr; also
 * when the seed is not that operator's), 2 bad usage or configuration (no seed the server accepts).
 */
import type { Command } from 'commander';
import { z } from 'zod';
import { errors, type NatsConnection } from '@nats-io/transport-node';
import { ID_PATTERN } from '@tooltx/contracts';
import { Subjects } from '@tooltx/nats';
import { baseConfigSchema, loadConfig } from '@tooltx/runtime';
import { inboxPrefixOf } from '@tooltx/nats';
import {
  checkedKey,
  CliRefusal,
  connectCli,
  isNatsError,
  notThatIdentity,
  permissionViolationOf,
  UsageError,
  type CliIdentity,
} from './cli-support.js';

export const operatorConfig = baseConfigSchema.extend({
  TOOLTX_OPERATOR: z
    .string({
      error: "required: the operator's id (an operator of the identity list; its seed may publish only under that id)",
    })
    .regex(ID_PATTERN, 'an operator id of the identity list (^[a-z0-9_-]{1,64}$)'),
});

type Answer = {
  ok: boolean;
  error?: { class: string; issues?: { path: (string | number)[]; code: string; message: string }[] };
  takeovers?: unknown[];
  operation?: { status?: string; takeover?: unknown };
};

/**
 * One JSON request/reply with an operators' service (`service` names it in messages: `takeover`,
 * `operations query`); errors say what went wrong in the operator's terms.
 */
export async function operatorRequest<A>(
  nc: NatsConnection,
  subject: string,
  body: Record<string, unknown>,
  who: CliIdentity,
  seedFile: string | undefined,
  timeoutMs: number,
  service: { name: string; servedBy: string; grant?: string } = {
    name: 'takeover service',
    servedBy: 'every reconciler instance answers takeover requests',
  },
): Promise<A> {
  try {
    const reply = await nc.request(subject, JSON.stringify(body), { timeout: timeoutMs });
    return JSON.parse(reply.string()) as A;
  } catch (err) {
    const denied = permissionViolationOf(err);
    if (denied)
      throw new CliRefusal(
        `${notThatIdentity(denied, who, seedFile)}${service.grant ? `, or that operator is not granted ${service.grant} in the identity list` : ''}; TOOLTX_OPERATOR names the operator`,
      );
    if (isNatsError(err, errors.NoRespondersError))
      throw new CliRefusal(`no ${service.name} is running (${service.servedBy})`);
    if (isNatsError(err, errors.TimeoutError))
      throw new CliRefusal(`no answer from the ${service.name} within ${timeoutMs / 1_000} s`);
    throw err;
  }
}

/**
 * Connects as the operator TOOLTX_OPERATOR names (its seed in NATS_NKEY_FILE), runs `fn`, drains.
 * Usage errors (exit 2) for a missing or bad setting or a seed the server does not know.
 */
export async function withOperator<T>(
  fn: (o: {
    nc: NatsConnection;
    subjects: Subjects;
    operator: string;
    who: CliIdentity;
    seedFile?: string;
  }) => Promise<T>,
): Promise<T> {
  const config = loadConfig(operatorConfig);
  const who: CliIdentity = {
    describe: `operator ${config.TOOLTX_OPERATOR}`,
    seedName: `operator.${config.TOOLTX_OPERATOR}.nk`,
  };
  const nc = await connectCli({
    servers: config.NATS_URL,
    name: `tooltx-cli:operator/${config.TOOLTX_OPERATOR}`,
    credsFile: config.NATS_CREDS_FILE,
    nkeyFile: config.NATS_NKEY_FILE,
    inboxPrefix: inboxPrefixOf({ kind: 'operator', operator: config.TOOLTX_OPERATOR }),
    reconnectForever: false,
    as: who,
  });
  try {
    return await fn({
      nc,
      subjects: new Subjects(config.TOOLTX_PREFIX),
      operator: config.TOOLTX_OPERATOR,
      who,
      ...(config.NATS_NKEY_FILE ? { seedFile: config.NATS_NKEY_FILE } : {}),
    });
  } finally {
    await nc.drain();
  }
}

/**
 * What a refusal means, in words: the machine class alone ("idempotency_conflict") does not say
 * that the operation is simply not under takeover. For a refused resolve, the operation is shown
 * again to name the state it is in.
 */
async function explain(answer: Answer, req: Record<string, unknown>, show: () => Promise<Answer>): Promise<string> {
  const cls = answer.error?.class;
  const issues = (answer.error?.issues ?? []).map((i) => `${i.path.join('.') || '(request)'}: ${i.message}`).join('; ');
  switch (cls) {
    case 'idempotency_conflict': {
      if (req.action !== 'resolve') break;
      const now = await show().catch(() => undefined);
      const status = now?.ok ? now.operation?.status : undefined;
      if (status === undefined) return 'the operation is not unknown, or it moved on meanwhile: show it again';
      if (status === 'compensation_failed')
        return 'its failed compensation was resolved with another outcome already (a resolution is recorded once)';
      if (status !== 'unknown')
        return `not under takeover: its state is ${status} (only an unknown operation can be resolved; a resolution that differs from the one recorded is refused)`;
      return 'the operation moved on while it was being resolved: show it again';
    }
    case 'not_found':
      return issues
        ? `no operation with this key is watched: give --tenant (${issues})`
        : 'no operation with this key in that tenant';
    case 'invalid_input':
      if (answer.error?.issues?.some((i) => i.code === 'outcome_mismatch'))
        return `this outcome does not resolve this takeover: ${issues}`;
      return `the request is invalid: ${issues || 'see the issues'}`;
    default:
      break;
  }
  return issues || 'no reason given';
}

/** Sends one request to the takeover service; prints the answer; exit 1 with its class and meaning when refused. */
async function ask(req: Record<string, unknown>, timeoutMs = 10_000): Promise<void> {
  await withOperator(async ({ nc, subjects, operator, who, seedFile }) => {
    const subject = subjects.takeover(operator);
    const send = (body: Record<string, unknown>) =>
      operatorRequest<Answer>(nc, subject, body, who, seedFile, timeoutMs);
    const answer = await send(req);
    if (!answer.ok) {
      const meaning = await explain(answer, req, () =>
        send({ action: 'show', operationKey: req.operationKey, ...(req.tenant ? { tenant: req.tenant } : {}) }),
      );
      // Once: the machine-readable class, what it means here, then the issues' codes (what a script matches on).
      const codes = [...new Set((answer.error?.issues ?? []).map((i) => i.code).filter(Boolean))];
      process.stderr.write(
        `tooltx takeover: refused: ${answer.error?.class ?? 'internal'}: ${meaning}${codes.length ? ` [${codes.join(', ')}]` : ''}\n`,
      );
      process.exitCode = 1;
      return;
    }
    if (answer.takeovers) {
      for (const t of answer.takeovers) process.stdout.write(`${JSON.stringify(t)}\n`);
      process.stderr.write(`${answer.takeovers.length} open takeover(s)\n`);
    } else process.stdout.write(`${JSON.stringify(answer.operation)}\n`);
  });
}

/** Registers `takeover` on the CLI. */
export function registerTakeover(program: Command): void {
  const t = program
    .command('takeover')
    .description(
      'operations handed over to a person (unknown past their deadline, another effect found under their key, or a compensation that failed): list, show, resolve — as an operator (NATS_NKEY_FILE, TOOLTX_OPERATOR)',
    )
    .addHelpText(
      'after',
      `
Environment:
  NATS_URL         server URL(s) (default nats://127.0.0.1:4222)
  NATS_NKEY_FILE   the operator's seed (<out>/nkeys/operator.<id>.nk from \`tooltx auth generate\`)
  NATS_CREDS_FILE  a .creds file instead of the seed
  TOOLTX_OPERATOR  the operator's id (an operator of the identity list), recorded as resolvedBy
  TOOLTX_PREFIX    subject prefix of the deployment (default tooltx)
Resolving:
  an unknown operation       --committed <resourceId> (verified downstream) or --not-applied
  a failed compensation      --effect-kept (the original's effect stays, accepted) or
                             --undone-by-hand (undone outside tooltx); its status stays
                             compensation_failed, its receipt valid; the task thaws
  An outcome that does not fit the operation is refused (invalid_input at outcome.kind); a second,
  different resolution is refused (idempotency_conflict); the same one again answers the state.
Exit codes: 0 done, 1 refused (its meaning on stderr), 2 bad usage or configuration.`,
    );
  t.command('list')
    .description('every open takeover record, oldest first, one JSON object per line')
    .action(() => ask({ action: 'list' }));
  t.command('show <operationKey>')
    .description("the operation's folded state: status, takeover record, evidence, times (no bodies)")
    .option('--tenant <id>', 'the tenant of the operation (needed once it is no longer watched)')
    .action((operationKey: string, o: { tenant?: string }) =>
      ask({ action: 'show', operationKey: checkedKey(operationKey), ...(o.tenant ? { tenant: o.tenant } : {}) }),
    );
  t.command('resolve <operationKey>')
    .description(
      'record what you verified: --committed <resourceId> or --not-applied (an unknown operation), --effect-kept or --undone-by-hand (a failed compensation); unfreezes the task',
    )
    .option('--committed <resourceId>', 'unknown: the effect exists downstream under this resource id')
    .option(
      '--not-applied',
      'unknown: the effect definitively did not happen (the identical input may be submitted again)',
    )
    .option('--effect-kept', "failed compensation: the original's effect stays in the world, and you accept it")
    .option('--undone-by-hand', "failed compensation: you undid the original's effect outside tooltx")
    .option('--tenant <id>', 'the tenant of the operation (needed once it is no longer watched)')
    .action(
      (
        operationKey: string,
        o: { committed?: string; notApplied?: boolean; effectKept?: boolean; undoneByHand?: boolean; tenant?: string },
      ) => {
        const given = [o.committed, o.notApplied, o.effectKept, o.undoneByHand].filter(Boolean).length;
        if (given !== 1)
          throw new UsageError(
            'give exactly one of --committed <resourceId>, --not-applied, --effect-kept or --undone-by-hand',
          );
        const outcome = o.committed
          ? { kind: 'committed', resourceId: o.committed }
          : o.notApplied
            ? { kind: 'not_applied' }
            : o.effectKept
              ? { kind: 'effect_kept' }
              : { kind: 'undone_by_hand' };
        return ask({
          action: 'resolve',
          operationKey: checkedKey(operationKey),
          outcome,
          ...(o.tenant ? { tenant: o.tenant } : {}),
        });
      },
    );
}
