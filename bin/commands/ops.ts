/**
 * `tooltx ops list | show` — an operator's view of operations by state across tenants, through the
 * operations query service (request/reply on `<prefix>.ops.query.<operator>`, served by the
 * audit-projector; the operator must be granted `query` in the identity list). The answers are
 * audit records: who, which contract, every state with its time, the error class, the takeover and
 * compensation links — never an input, body, result or error text. The console reads the same.
 *
 * Environment: NATS_URL, NATS_NKEY_FILE (the operator's seed), TOOLTX_OPERATOR (their id),
 * TOOLTX_PREFIX. Exit codes: 0 done, 1 refused, 2 bad usage or configuration.
 */
import { type Command, Option } from 'commander';
import { ID_PATTERN } from '@tooltx/contracts';
import { MAX_AUDIT_PAGE } from '@tooltx/lifecycle';
import type { OpsQueryAnswer } from '@tooltx/readside';
import { AUDIT_STATES, parseTime } from './audit.js';
import { checkedKey, shown, UsageError, writeRefusal } from './cli-support.js';
import { operatorRequest, withOperator } from './takeover.js';

const SERVICE = {
  name: 'operations query service',
  servedBy: 'every audit-projector instance answers operations queries',
  grant: 'query',
};

/** Sends one query; prints the records as JSON lines (or the one record); exit 1 with its class when refused. */
async function query(req: Record<string, unknown>, all = false): Promise<void> {
  await withOperator(async ({ nc, subjects, operator, who, seedFile }) => {
    let answer = await operatorRequest<OpsQueryAnswer>(
      nc,
      subjects.opsQuery(operator),
      req,
      who,
      seedFile,
      10_000,
      SERVICE,
    );
    let n = 0;
    for (;;) {
      if (!answer.ok) {
        writeRefusal('ops', answer.error);
        return;
      }
      if ('record' in answer) {
        if (!answer.record) {
          process.stderr.write('tooltx ops: no operation with this key in that tenant\n');
          process.exitCode = 1;
          return;
        }
        process.stdout.write(`${JSON.stringify(answer.record, null, 2)}\n`);
        return;
      }
      for (const r of answer.operations) process.stdout.write(`${JSON.stringify(r)}\n`);
      n += answer.operations.length;
      const limit = typeof req.limit === 'number' ? req.limit : undefined;
      // `--all` follows the pages; otherwise one page, and the cursor of the next one is said.
      if (!answer.next || !all || (limit !== undefined && n >= limit)) {
        process.stderr.write(`${n} operation(s)${answer.next ? `; more after --after ${answer.next}` : ''}\n`);
        return;
      }
      answer = await operatorRequest<OpsQueryAnswer>(
        nc,
        subjects.opsQuery(operator),
        { ...req, after: answer.next },
        who,
        seedFile,
        10_000,
        SERVICE,
      );
    }
  });
}

const ENV = `
Environment:
  NATS_URL         server URL(s) (default nats://127.0.0.1:4222)
  NATS_NKEY_FILE   the operator's seed (<out>/nkeys/operator.<id>.nk from \`tooltx auth generate\`)
  NATS_CREDS_FILE  a .creds file instead of the seed
  TOOLTX_OPERATOR  the operator's id (an operator of the identity list granted "query")
  TOOLTX_PREFIX    subject prefix of the deployment (default tooltx)
Exit codes: 0 done, 1 refused (its class on stderr), 2 bad usage or configuration.`;

/** Registers `ops list` and `ops show` under `ops`. */
export function registerOpsQuery(ops: Command): void {
  ops
    .command('list')
    .description(
      'operations by state across tenants, oldest first, one audit record per line (no bodies) — as an operator granted query',
    )
    .option('--tenant <id>', 'only this tenant')
    .addOption(new Option('--state <state>', 'only operations in this state').choices([...AUDIT_STATES]))
    .option('--contract <name@version>', 'only this contract version, e.g. kb.write_note@1')
    .option('--since <time>', 'with a state or decision at or after this time: ISO-8601, or a duration ago (30m, 24h)')
    .option('--until <time>', 'first seen before this time')
    .option('--limit <n>', `at most this many (1-${MAX_AUDIT_PAGE} per page; default 100)`)
    .option('--after <cursor>', 'the page after this cursor (printed on stderr when more follow)')
    .option('--all', 'follow every page')
    .addHelpText('after', ENV)
    .action(
      (o: {
        tenant?: string;
        state?: string;
        contract?: string;
        since?: string;
        until?: string;
        limit?: string;
        after?: string;
        all?: boolean;
      }) => {
        if (o.tenant !== undefined && !ID_PATTERN.test(o.tenant))
          throw new UsageError(`--tenant: expected a tenant id (^[a-z0-9_-]{1,64}$), got ${shown(o.tenant)}`);
        const limit = o.limit === undefined ? undefined : Number(o.limit);
        if (limit !== undefined && !(Number.isInteger(limit) && limit >= 1 && limit <= MAX_AUDIT_PAGE))
          throw new UsageError(`--limit: expected an integer 1-${MAX_AUDIT_PAGE}, got ${shown(o.limit ?? '')}`);
        const now = Date.now();
        const since = o.since === undefined ? undefined : parseTime(o.since, '--since', now);
        const until = o.until === undefined ? undefined : parseTime(o.until, '--until', now);
        if (since !== undefined && until !== undefined && since > until)
          throw new UsageError(`--since ${o.since} is later than --until ${o.until}: nothing can match`);
        return query(
          {
            action: 'list',
            ...(o.tenant ? { tenant: o.tenant } : {}),
            ...(o.state ? { state: o.state } : {}),
            ...(o.contract ? { contract: o.contract } : {}),
            ...(since !== undefined ? { since } : {}),
            ...(until !== undefined ? { until } : {}),
            ...(limit !== undefined ? { limit } : {}),
            ...(o.after ? { after: o.after } : {}),
          },
          o.all === true,
        );
      },
    );
  ops
    .command('show <operationKey>')
    .description("one operation's audit record: its states, decisions, takeover and compensation (no bodies)")
    .requiredOption('--tenant <id>', 'the tenant of the operation')
    .addHelpText('after', ENV)
    .action((operationKey: string, o: { tenant: string }) => {
      if (!ID_PATTERN.test(o.tenant))
        throw new UsageError(`--tenant: expected a tenant id (^[a-z0-9_-]{1,64}$), got ${shown(o.tenant)}`);
      return query({ action: 'show', operationKey: checkedKey(operationKey), tenant: o.tenant });
    });
}
