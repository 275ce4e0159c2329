/**
 * `tooltx contracts list | usage | deprecate | retire | revert` — the contract registry
 * (docs/contracts.md), through the contracts service (request/reply on
 * `<prefix>.ops.contracts.<operator>`, served by the audit-projector; the operator must be granted
 * `contracts` in the identity list). The CLI never writes the registry itself.
 *
 * Environment: NATS_URL, NATS_NKEY_FILE (the operator's seed), TOOLTX_OPERATOR (their id),
 * TOOLTX_PREFIX. Exit codes: 0 done, 1 refused, 2 bad usage or configuration.
 */
import type { Command } from 'commander';
import { z } from 'zod';
import { fieldIssues } from '@tooltx/contracts';
import { type ContractsAnswer, contractsRequestSchema } from '@tooltx/readside';
import { parseTime } from './audit.js';
import { UsageError, writeRefusal } from './cli-support.js';
import { operatorRequest, withOperator } from './takeover.js';

const SERVICE = {
  name: 'contracts service',
  servedBy: 'every audit-projector instance answers contracts requests',
  grant: 'contracts',
};

/** The CLI's names of the request's fields, for a usage error's field path. */
const FLAG_OF: Record<string, string> = {
  name: '<name>',
  contract: '<name@version>',
  sunsetAt: '--sunset',
  since: '--since',
  from: '--from',
};

/** Checks the request as the service will (zod); a bad one is a usage error naming each field. */
function checked(req: Record<string, unknown>): Record<string, unknown> {
  const r = contractsRequestSchema.safeParse(req);
  if (r.success) return req;
  const issues = fieldIssues(r.error).map((i) => {
    const field = String(i.path[0] ?? '');
    return `${FLAG_OF[field] ?? field} (${i.path.join('.')}): ${i.message}`;
  });
  throw new UsageError(issues.join('; '));
}

/** Sends one request; prints the answer as JSON; exit 1 with its class and field paths when refused. */
async function send(req: Record<string, unknown>): Promise<void> {
  const body = checked(req);
  await withOperator(async ({ nc, subjects, operator, who, seedFile }) => {
    const answer = await operatorRequest<ContractsAnswer>(
      nc,
      subjects.opsContracts(operator),
      body,
      who,
      seedFile,
      10_000,
      SERVICE,
    );
    if (!answer.ok) {
      writeRefusal('contracts', answer.error);
      return;
    }
    if ('versions' in answer) for (const v of answer.versions) process.stdout.write(`${JSON.stringify(v)}\n`);
    else process.stdout.write(`${JSON.stringify(answer)}\n`);
    if ('switches' in answer && answer.switches)
      process.stderr.write(
        `switches: ${answer.switches.map((s) => `${s.from ?? '-'}→${s.to} by ${s.by} (${s.reason}, ${new Date(s.at).toISOString()})`).join('; ')}\n`,
      );
  });
}

/** An ISO-8601 date or date-time with an offset (`2027-01-31`, `2027-01-31T12:00:00Z`). */
const sunsetSchema = z.union([z.iso.datetime({ offset: true }), z.iso.date()]);

const ENV = `
Environment:
  NATS_URL         server URL(s) (default nats://127.0.0.1:4222)
  NATS_NKEY_FILE   the operator's seed (<out>/nkeys/operator.<id>.nk from \`tooltx auth generate\`)
  NATS_CREDS_FILE  a .creds file instead of the seed
  TOOLTX_OPERATOR  the operator's id (an operator of the identity list granted "contracts")
  TOOLTX_PREFIX    subject prefix of the deployment (default tooltx)
Exit codes: 0 done, 1 refused (its class on stderr), 2 bad usage or configuration.
See docs/contracts.md.`;

const sinceOf = (v: string | undefined) => (v === undefined ? {} : { since: parseTime(v, '--since') });

/** Registers `tooltx contracts …`. */
export function registerContracts(program: Command): void {
  const contracts = program
    .command('contracts')
    .description(
      'the contract registry: versions, usage, deprecate, retire, revert (as an operator granted contracts; docs/contracts.md)',
    );
  contracts
    .command('list')
    .description(
      'every registered contract version, one JSON object per line: current marker, state, sunset, and usage over the window',
    )
    .option('--since <time>', 'usage from this time: ISO-8601, or a duration ago (30m, 24h); default 24h')
    .addHelpText('after', ENV)
    .action((o: { since?: string }) => send({ action: 'list', ...sinceOf(o.since) }));
  contracts
    .command('usage <name>')
    .description(
      "one name's versions with the tasks and actors still calling each, and the ratio of conflicts, rejections and unknowns",
    )
    .option('--since <time>', 'count from this time: ISO-8601, or a duration ago (30m, 24h); default 24h')
    .addHelpText('after', ENV)
    .action((name: string, o: { since?: string }) => send({ action: 'usage', name, ...sinceOf(o.since) }));
  contracts
    .command('deprecate <contract>')
    .description(
      'announce the end of a version (name@version): from the sunset on, new intents on it are refused contract_retired',
    )
    .requiredOption(
      '--sunset <date>',
      'ISO-8601 date or date-time with offset, e.g. 2027-01-31 or 2027-01-31T12:00:00Z',
    )
    .addHelpText('after', ENV)
    .action((contract: string, o: { sunset: string }) => {
      const d = sunsetSchema.safeParse(o.sunset);
      if (!d.success)
        throw new UsageError(
          `--sunset (sunsetAt): expected an ISO-8601 date or date-time, got ${JSON.stringify(o.sunset.slice(0, 80))}`,
        );
      return send({ action: 'deprecate', contract, sunsetAt: Date.parse(d.data) });
    });
  contracts
    .command('retire <contract>')
    .description(
      'retire a version (name@version) now: new intents on it are refused contract_retired; its keys still answer',
    )
    .addHelpText('after', ENV)
    .action((contract: string) => send({ action: 'retire', contract }));
  contracts
    .command('revert <name>')
    .description(
      'make the previous complete version of a name current again; running tasks keep theirs unless --stop-running',
    )
    .option(
      '--stop-running',
      'also refuse further intents of running tasks on the reverted version (contract_withdrawn)',
    )
    .option(
      '--from <version>',
      'revert only while this version is current (refused current_changed otherwise); needed to revert a version that is current by a revert',
    )
    .option('--unheld', 'revert even to a version no running executor holds (held marks, docs/contracts.md)')
    .addHelpText('after', ENV)
    .action((name: string, o: { stopRunning?: boolean; from?: string; unheld?: boolean }) => {
      if (o.from !== undefined && !/^[1-9][0-9]{0,8}$/.test(o.from))
        throw new UsageError(
          `--from (from): expected a version number such as 3, got ${JSON.stringify(o.from.slice(0, 40))}`,
        );
      return send({
        action: 'revert',
        name,
        ...(o.stopRunning ? { stopRunning: true } : {}),
        ...(o.from !== undefined ? { from: Number(o.from) } : {}),
        ...(o.unheld ? { unheld: true } : {}),
      });
    });
}
