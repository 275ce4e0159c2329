/**
 * `tooltx audit show|list|export|counts` — auditors' access to audit records, only ever
 * through the audit service: a request on `<prefix>.audit.<tenant>.<auditor>` as the auditor's own
 * identity (`NATS_NKEY_FILE`). The server lets an auditor publish only there and read nothing else
 * (no intents, inputs, results, events, buckets); the service records every query and export page
 * before it answers.
 *
 * Environment: NATS_URL, NATS_NKEY_FILE (the auditor's seed, `nkeys/auditor.<tenant>.<id>.nk`),
 * NATS_CREDS_FILE, TOOLTX_PREFIX, TOOLTX_TENANT and TOOLTX_AUDITOR (defaults of --tenant, --auditor).
 */
import { type Command, Option } from 'commander';
import { z } from 'zod';
import { errors, type NatsConnection } from '@nats-io/transport-node';
import {
  auditAnswerSchema,
  auditRequestSchema,
  MAX_AUDIT_PAGE,
  operationStatuses,
  type AuditAnswer,
  type AuditRequest,
} from '@tooltx/lifecycle';
import { decode, encode, Subjects } from '@tooltx/nats';
import { baseConfigSchema, DURATION_AGO, envInt, loadConfig, timeSpecOf } from '@tooltx/runtime';
import { inboxPrefixOf } from '@tooltx/nats';
import { checkedKey, connectCli, permissionViolationOf, shown, UsageError } from './cli-support.js';

/** Thrown for an answer that is an error, a refusal by the server, or no answer; the CLI prints it and exits 1. */
export class AuditCliError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'AuditCliError';
  }
}

const idSchema = z.string().regex(/^[a-z0-9_-]{1,64}$/, 'must match ^[a-z0-9_-]{1,64}$');
/**
 * A point in time from the command line: ISO-8601 with an offset (`2026-11-30T06:00:00Z`), or a
 * duration ago (`30m`, `24h`, `7d`). Returns ms since the epoch; throws {@link UsageError} naming
 * the flag (also for a duration reaching before 1970-01-01).
 */
export function parseTime(v: string, flag: string, now = Date.now()): number {
  const at = timeSpecOf(v, now);
  if (at !== null) return at;
  if (DURATION_AGO.test(v))
    throw new UsageError(
      `${flag}: ${v} ago is before 1970-01-01T00:00:00Z; give a shorter duration or an ISO-8601 time`,
    );
  throw new UsageError(
    `${flag}: expected an ISO-8601 time with an offset (from 1970 on) or a duration like 30m, 24h, 7d; got ${shown(v)}`,
  );
}

/** `--since`/`--until` as a range; throws {@link UsageError} when since is later than until. */
function parseRange(o: { since?: string | undefined; until?: string | undefined }): { since?: number; until?: number } {
  const now = Date.now();
  const since = o.since !== undefined ? parseTime(o.since, '--since', now) : undefined;
  const until = o.until !== undefined ? parseTime(o.until, '--until', now) : undefined;
  if (since !== undefined && until !== undefined && since > until) {
    throw new UsageError(
      `--since ${o.since} (${new Date(since).toISOString()}) is later than --until ${o.until} (${new Date(until).toISOString()}): nothing can match (a duration means that long ago: --since 48h --until 24h is the 24 hours that ended a day ago)`,
    );
  }
  return { ...(since !== undefined ? { since } : {}), ...(until !== undefined ? { until } : {}) };
}

/** The statuses an audit record can have: an operation's, or `refused` (only ever refused at intake). */
export const AUDIT_STATES = [...operationStatuses, 'refused'] as const;
/** `name@version` of a contract (names as defineContract allows them). */
const CONTRACT_REF = /^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*@[1-9]\d{0,8}$/;

interface Who {
  tenant?: string;
  auditor?: string;
}

/** Connects as the auditor, sends one request, returns the parsed answer (never an error answer). */
async function ask(
  nc: NatsConnection,
  subject: string,
  req: AuditRequest,
): Promise<Exclude<AuditAnswer, { error: unknown }>> {
  auditRequestSchema.parse(req);
  let refused: InstanceType<typeof errors.PermissionViolationError> | null = null;
  void (async () => {
    for await (const s of nc.status())
      if (s.type === 'error' && s.error instanceof errors.PermissionViolationError) refused = s.error;
  })();
  let answer: AuditAnswer;
  try {
    const m = await nc.request(subject, encode(req), { timeout: 15_000 });
    answer = decode(auditAnswerSchema, m.data);
  } catch (err) {
    const violation = permissionViolationOf(err) ?? refused;
    if (violation)
      throw new AuditCliError(
        `the server refused ${violation.operation} on ${violation.subject}: this identity is not that auditor`,
      );
    if (
      err instanceof errors.NoRespondersError ||
      (err instanceof Error && err.cause instanceof errors.NoRespondersError)
    )
      throw new AuditCliError('no audit service is running (the audit-projector answers audit queries)');
    if (err instanceof errors.TimeoutError || (err instanceof Error && err.cause instanceof errors.TimeoutError))
      throw new AuditCliError('no answer from the audit service within 15 s');
    throw err;
  }
  if ('error' in answer) {
    const where = answer.error.issues?.map((i) => `${i.path.join('.') || '(request)'}: ${i.code}`).join('; ');
    throw new AuditCliError(`the audit service refused the query: ${answer.error.class}${where ? ` (${where})` : ''}`);
  }
  return answer;
}

async function withAuditor<T>(who: Who, fn: (nc: NatsConnection, subject: string) => Promise<T>): Promise<T> {
  const config = loadConfig(
    baseConfigSchema.extend({ TOOLTX_TENANT: idSchema.optional(), TOOLTX_AUDITOR: idSchema.optional() }),
  );
  const tenant = idSchema.safeParse(who.tenant ?? config.TOOLTX_TENANT);
  const auditor = idSchema.safeParse(who.auditor ?? config.TOOLTX_AUDITOR);
  if (!tenant.success)
    throw new UsageError("--tenant (or TOOLTX_TENANT): the auditor's tenant is required, ^[a-z0-9_-]{1,64}$");
  if (!auditor.success)
    throw new UsageError("--auditor (or TOOLTX_AUDITOR): the auditor's id is required, ^[a-z0-9_-]{1,64}$");
  const role = { kind: 'auditor' as const, tenant: tenant.data, actor: auditor.data };
  const nc = await connectCli({
    servers: config.NATS_URL,
    name: `tooltx-audit@${tenant.data}.${auditor.data}`,
    credsFile: config.NATS_CREDS_FILE,
    nkeyFile: config.NATS_NKEY_FILE,
    // An auditor may subscribe only under its own inbox prefix.
    inboxPrefix: config.NATS_NKEY_FILE || config.NATS_CREDS_FILE ? inboxPrefixOf(role) : undefined,
    reconnectForever: false,
    as: {
      describe: `auditor ${auditor.data} of tenant ${tenant.data}`,
      seedName: `auditor.${tenant.data}.${auditor.data}.nk`,
    },
  });
  try {
    return await fn(nc, new Subjects(config.TOOLTX_PREFIX).audit(tenant.data, auditor.data));
  } finally {
    await nc.close();
  }
}

const line = (v: unknown) => process.stdout.write(`${JSON.stringify(v)}\n`);

function whoOptions(c: Command): Command {
  return c
    .addOption(new Option('--tenant <id>', "the auditor's tenant (default TOOLTX_TENANT)"))
    .addOption(new Option('--auditor <id>', "the auditor's id (default TOOLTX_AUDITOR)"));
}

/** Registers `audit show|list|export|counts` on the `tooltx` program. */
export function registerAuditCommands(program: Command): void {
  const audit = program
    .command('audit')
    .description(
      "audit records through the audit service, as an auditor (NATS_NKEY_FILE = the auditor's seed); every query is recorded before it is answered",
    )
    .addHelpText(
      'after',
      `
Records hold who, when, which contract, a keyed HMAC of the target, the authorisation decisions,
whether a side effect happened, every state with its time, the error class, a keyed HMAC of the
result digest and who resolved it by hand — never a body, input, result or error text.
Times: ISO-8601 with an offset (2026-11-30T06:00:00Z) or a duration ago (30m, 24h, 7d); --since
must not be later than --until. A bad flag exits 2, a refusal or failure 1.
Environment: NATS_URL, NATS_NKEY_FILE (the auditor's seed, <out>/nkeys/auditor.<tenant>.<id>.nk),
NATS_CREDS_FILE, TOOLTX_PREFIX, TOOLTX_TENANT, TOOLTX_AUDITOR.`,
    );

  whoOptions(audit.command('show').argument('<operationKey>', 'the operation key (opk_…)'))
    .description('print the audit record of one operation (exit 1 when this tenant has none)')
    .action((given: string, o: Who) => {
      const operationKey = checkedKey(given);
      return withAuditor(o, async (nc, subject) => {
        const a = await ask(nc, subject, { kind: 'show', operationKey });
        if (a.kind !== 'show') throw new AuditCliError('unexpected answer');
        if (!a.record)
          throw new AuditCliError(
            `no audit record for ${operationKey} in tenant ${o.tenant ?? process.env.TOOLTX_TENANT}`,
          );
        process.stdout.write(`${JSON.stringify(a.record, null, 2)}\n`);
      });
    });

  whoOptions(audit.command('list'))
    .description('list audit records, one JSON object per line, oldest first')
    .option('--since <time>', 'operations active at or after this time')
    .option('--until <time>', 'operations first seen before this time')
    .option('--state <state>', `only operations whose current status is this: ${AUDIT_STATES.join(', ')}`)
    .option('--contract <name@version>', 'only this contract version, e.g. kb.write_note@1')
    .option('--limit <n>', 'at most this many records', '100')
    .action((o: Who & { since?: string; until?: string; state?: string; contract?: string; limit: string }) => {
      // Flags first: a bad one is the user's to fix (exit 2), before anything is connected.
      // Decimal digits only (envInt): 0x10 and 1e3 are not counts.
      const limit = envInt(1).safeParse(o.limit);
      if (!limit.success) throw new UsageError(`--limit: a positive integer, got ${shown(String(o.limit))}`);
      if (o.state !== undefined && !(AUDIT_STATES as readonly string[]).includes(o.state))
        throw new UsageError(`--state: one of ${AUDIT_STATES.join(', ')}; got ${shown(o.state)}`);
      if (o.contract !== undefined && !CONTRACT_REF.test(o.contract))
        throw new UsageError(`--contract: name@version, e.g. kb.write_note@1; got ${shown(o.contract)}`);
      const base = {
        ...parseRange(o),
        ...(o.state ? { state: o.state } : {}),
        ...(o.contract ? { contract: o.contract } : {}),
      };
      return withAuditor(o, async (nc, subject) => {
        let printed = 0;
        let after: string | undefined;
        do {
          const a = await ask(nc, subject, {
            kind: 'list',
            ...base,
            limit: Math.min(MAX_AUDIT_PAGE, limit.data - printed),
            ...(after ? { after } : {}),
          });
          if (a.kind !== 'list') throw new AuditCliError('unexpected answer');
          for (const r of a.records) line(r);
          printed += a.records.length;
          after = a.next;
        } while (after && printed < limit.data);
        process.stderr.write(`${printed} record(s)\n`);
      });
    });

  whoOptions(audit.command('export'))
    .description(
      'export every audit record of the range as JSON lines on stdout (each page is recorded as part of one export id)',
    )
    .requiredOption('--since <time>', 'operations active at or after this time')
    .option('--until <time>', 'operations first seen before this time')
    .requiredOption('--format <format>', 'jsonl (the only format)')
    .action((o: Who & { since: string; until?: string; format: string }) => {
      if (o.format !== 'jsonl') throw new UsageError(`--format: only jsonl, got ${shown(String(o.format))}`);
      const range = parseRange(o);
      return withAuditor(o, async (nc, subject) => {
        let exportId: string | undefined;
        let after: string | undefined;
        let n = 0;
        let pages = 0;
        do {
          const a = await ask(nc, subject, {
            kind: 'export',
            format: 'jsonl',
            ...range,
            ...(exportId ? { exportId } : {}),
            ...(after ? { after } : {}),
          });
          if (a.kind !== 'export') throw new AuditCliError('unexpected answer');
          exportId = a.exportId;
          for (const r of a.records) line(r);
          n += a.records.length;
          pages++;
          after = a.next;
        } while (after);
        process.stderr.write(`exported ${n} record(s) in ${pages} page(s), export id ${exportId}\n`);
      });
    });

  whoOptions(audit.command('counts'))
    .description(
      'counts per contract version: accepted, committed, rejected by class, refused at intake by class, conflicts, unknowns',
    )
    .option('--since <time>', 'operations active at or after this time')
    .option('--until <time>', 'operations first seen before this time')
    .action((o: Who & { since?: string; until?: string }) => {
      const range = parseRange(o);
      return withAuditor(o, async (nc, subject) => {
        const a = await ask(nc, subject, { kind: 'counts', ...range });
        if (a.kind !== 'counts') throw new AuditCliError('unexpected answer');
        for (const c of a.counts) line(c);
        process.stderr.write(`${a.records} record(s) counted\n`);
      });
    });
}
