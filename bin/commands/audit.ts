/**
 * `tooltx audit show|list|export|counts` — auditors' access to audit records (issue 9), only ever
 * through the audit service: a request on `<prefix>.audit.<tenant>.<auditor>` as the auditor's own
 * identity (`NATS_NKEY_FILE`). The server lets an auditor publish only there and read nothing else
 * (no intents, inputs, results, events, buckets); the service records every query and export page
 * before it answers.
 *
 * Environment: NATS_URL, NATS_NKEY_FILE (the auditor's seed, `nkeys/auditor.<tenant>.<id>.nk`),
 * NATS_CREDS_FILE, TOOLTX_PREFIX, TOOLTX_TENANT and TOOLTX_AUDITOR (defaults of --tenant, --auditor).
 */
import { Command, Option } from 'commander';
import { z } from 'zod';
import { errors, type NatsConnection } from '@nats-io/transport-node';
import { auditAnswerSchema, auditRequestSchema, MAX_AUDIT_PAGE, type AuditAnswer, type AuditRequest } from '@tooltx/lifecycle';
import { connectNats, decode, encode, Subjects } from '@tooltx/nats';
import { baseConfigSchema, loadConfig } from '@tooltx/runtime';
import { inboxPrefixOf } from '@tooltx/streams';

/** Thrown for an answer that is an error, a refusal by the server, or no answer; the CLI prints it and exits 1. */
export class AuditCliError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'AuditCliError';
  }
}

const idSchema = z.string().regex(/^[a-z0-9_-]{1,64}$/, 'must match ^[a-z0-9_-]{1,64}$');
const DURATION = /^(\d+)(ms|s|m|h|d)$/;
const UNIT = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000 } as const;

/**
 * A point in time from the command line: ISO-8601 with an offset (`2026-11-30T06:00:00Z`), or a
 * duration ago (`30m`, `24h`, `7d`). Returns ms since the epoch; throws {@link AuditCliError}.
 */
export function parseTime(v: string, flag: string, now = Date.now()): number {
  const d = DURATION.exec(v);
  if (d) return now - Number(d[1]) * UNIT[d[2] as keyof typeof UNIT];
  const parsed = z.iso.datetime({ offset: true }).safeParse(v);
  if (parsed.success) return Date.parse(v);
  throw new AuditCliError(`${flag}: expected an ISO-8601 time with an offset or a duration like 30m, 24h, 7d; got ${JSON.stringify(v)}`);
}

interface Who {
  tenant?: string;
  auditor?: string;
}

/** Connects as the auditor, sends one request, returns the parsed answer (never an error answer). */
async function ask(nc: NatsConnection, subject: string, req: AuditRequest): Promise<Exclude<AuditAnswer, { error: unknown }>> {
  auditRequestSchema.parse(req);
  let refused: InstanceType<typeof errors.PermissionViolationError> | null = null;
  void (async () => {
    for await (const s of nc.status()) if (s.type === 'error' && s.error instanceof errors.PermissionViolationError) refused = s.error;
  })();
  let answer: AuditAnswer;
  try {
    const m = await nc.request(subject, encode(req), { timeout: 15_000 });
    answer = decode(auditAnswerSchema, m.data);
  } catch (err) {
    const violation = err instanceof errors.PermissionViolationError ? err : err instanceof Error && err.cause instanceof errors.PermissionViolationError ? err.cause : refused;
    if (violation) throw new AuditCliError(`the server refused ${violation.operation} on ${violation.subject}: this identity is not that auditor`);
    if (err instanceof errors.NoRespondersError || (err instanceof Error && err.cause instanceof errors.NoRespondersError)) throw new AuditCliError('no audit service is running (the audit-projector answers audit queries)');
    if (err instanceof errors.TimeoutError || (err instanceof Error && err.cause instanceof errors.TimeoutError)) throw new AuditCliError('no answer from the audit service within 15 s');
    throw err;
  }
  if ('error' in answer) {
    const where = answer.error.issues?.map((i) => `${i.path.join('.') || '(request)'}: ${i.code}`).join('; ');
    throw new AuditCliError(`the audit service refused the query: ${answer.error.class}${where ? ` (${where})` : ''}`);
  }
  return answer;
}

async function withAuditor<T>(who: Who, fn: (nc: NatsConnection, subject: string) => Promise<T>): Promise<T> {
  const config = loadConfig(baseConfigSchema.extend({ TOOLTX_TENANT: idSchema.optional(), TOOLTX_AUDITOR: idSchema.optional() }));
  const tenant = idSchema.safeParse(who.tenant ?? config.TOOLTX_TENANT);
  const auditor = idSchema.safeParse(who.auditor ?? config.TOOLTX_AUDITOR);
  if (!tenant.success) throw new AuditCliError('--tenant (or TOOLTX_TENANT): the auditor\'s tenant is required, ^[a-z0-9_-]{1,64}$');
  if (!auditor.success) throw new AuditCliError('--auditor (or TOOLTX_AUDITOR): the auditor\'s id is required, ^[a-z0-9_-]{1,64}$');
  const role = { kind: 'auditor' as const, tenant: tenant.data, actor: auditor.data };
  const nc = await connectNats({
    servers: config.NATS_URL,
    name: `tooltx-audit@${tenant.data}.${auditor.data}`,
    credsFile: config.NATS_CREDS_FILE,
    nkeySeedFile: config.NATS_NKEY_FILE,
    // An auditor may subscribe only under its own inbox prefix.
    inboxPrefix: config.NATS_NKEY_FILE || config.NATS_CREDS_FILE ? inboxPrefixOf(role) : undefined,
    reconnectForever: false,
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
    .addOption(new Option('--tenant <id>', 'the auditor\'s tenant (default TOOLTX_TENANT)'))
    .addOption(new Option('--auditor <id>', 'the auditor\'s id (default TOOLTX_AUDITOR)'));
}

/** Registers `audit show|list|export|counts` on the `tooltx` program. */
export function registerAuditCommands(program: Command): void {
  const audit = program
    .command('audit')
    .description('audit records through the audit service, as an auditor (NATS_NKEY_FILE = the auditor\'s seed); every query is recorded before it is answered')
    .addHelpText('after', `
Records hold who, when, which contract, a keyed HMAC of the target, the authorisation decisions,
whether a side effect happened, every state with its time, the error class, a keyed HMAC of the
result digest and who resolved it by hand — never a body, input, result or error text.
Times: ISO-8601 with an offset (2026-11-30T06:00:00Z) or a duration ago (30m, 24h, 7d).
Environment: NATS_URL, NATS_NKEY_FILE, TOOLTX_PREFIX, TOOLTX_TENANT, TOOLTX_AUDITOR.`);

  whoOptions(audit.command('show').argument('<operationKey>', 'the operation key (opk_…)'))
    .description('print the audit record of one operation (exit 1 when this tenant has none)')
    .action((operationKey: string, o: Who) =>
      withAuditor(o, async (nc, subject) => {
        const a = await ask(nc, subject, { kind: 'show', operationKey });
        if (a.kind !== 'show') throw new AuditCliError('unexpected answer');
        if (!a.record) throw new AuditCliError(`no audit record for ${operationKey} in tenant ${o.tenant ?? process.env.TOOLTX_TENANT}`);
        process.stdout.write(`${JSON.stringify(a.record, null, 2)}\n`);
      }),
    );

  whoOptions(audit.command('list'))
    .description('list audit records, one JSON object per line, oldest first')
    .option('--since <time>', 'operations active at or after this time')
    .option('--until <time>', 'operations first seen before this time')
    .option('--state <state>', 'only operations whose current status is this (accepted, running, committed, rejected, unknown, refused, …)')
    .option('--contract <name@version>', 'only this contract version')
    .option('--limit <n>', 'at most this many records', '100')
    .action((o: Who & { since?: string; until?: string; state?: string; contract?: string; limit: string }) =>
      withAuditor(o, async (nc, subject) => {
        const limit = z.coerce.number().int().min(1).safeParse(o.limit);
        if (!limit.success) throw new AuditCliError('--limit: a positive integer');
        const base = { ...(o.since ? { since: parseTime(o.since, '--since') } : {}), ...(o.until ? { until: parseTime(o.until, '--until') } : {}), ...(o.state ? { state: o.state } : {}), ...(o.contract ? { contract: o.contract } : {}) };
        let printed = 0;
        let after: string | undefined;
        do {
          const a = await ask(nc, subject, { kind: 'list', ...base, limit: Math.min(MAX_AUDIT_PAGE, limit.data - printed), ...(after ? { after } : {}) });
          if (a.kind !== 'list') throw new AuditCliError('unexpected answer');
          for (const r of a.records) line(r);
          printed += a.records.length;
          after = a.next;
        } while (after && printed < limit.data);
        process.stderr.write(`${printed} record(s)\n`);
      }),
    );

  whoOptions(audit.command('export'))
    .description('export every audit record of the range as JSON lines on stdout (each page is recorded as part of one export id)')
    .requiredOption('--since <time>', 'operations active at or after this time')
    .option('--until <time>', 'operations first seen before this time')
    .requiredOption('--format <format>', 'jsonl (the only format)')
    .action((o: Who & { since: string; until?: string; format: string }) =>
      withAuditor(o, async (nc, subject) => {
        if (o.format !== 'jsonl') throw new AuditCliError(`--format: only jsonl, got ${JSON.stringify(o.format)}`);
        const range = { since: parseTime(o.since, '--since'), ...(o.until ? { until: parseTime(o.until, '--until') } : {}) };
        let exportId: string | undefined;
        let after: string | undefined;
        let n = 0;
        let pages = 0;
        do {
          const a = await ask(nc, subject, { kind: 'export', format: 'jsonl', ...range, ...(exportId ? { exportId } : {}), ...(after ? { after } : {}) });
          if (a.kind !== 'export') throw new AuditCliError('unexpected answer');
          exportId = a.exportId;
          for (const r of a.records) line(r);
          n += a.records.length;
          pages++;
          after = a.next;
        } while (after);
        process.stderr.write(`exported ${n} record(s) in ${pages} page(s), export id ${exportId}\n`);
      }),
    );

  whoOptions(audit.command('counts'))
    .description('counts per contract version: accepted, committed, rejected by class, refused at intake by class, conflicts, unknowns')
    .option('--since <time>', 'operations active at or after this time')
    .option('--until <time>', 'operations first seen before this time')
    .action((o: Who & { since?: string; until?: string }) =>
      withAuditor(o, async (nc, subject) => {
        const a = await ask(nc, subject, { kind: 'counts', ...(o.since ? { since: parseTime(o.since, '--since') } : {}), ...(o.until ? { until: parseTime(o.until, '--until') } : {}) });
        if (a.kind !== 'counts') throw new AuditCliError('unexpected answer');
        for (const c of a.counts) line(c);
        process.stderr.write(`${a.records} record(s) counted\n`);
      }),
    );
}
