#!/usr/bin/env -S node --import tsx
/**
 * `tooltx` — the operator CLI.
 *
 *   tooltx streams apply   create or update the streams, consumers and result bucket (provisioner)
 *   tooltx streams check   list every setting that breaks a guarantee; exit 1 when any
 *   tooltx auth generate   nats-server config + one nkey seed per user from an identity list
 *   tooltx ops pending     the operations the reconciler is watching (accepted, running, unknown)
 *   tooltx takeover …      list / show / resolve operations handed over to a person (as an operator)
 *   tooltx audit …         show / list / export / counts of audit records, through the audit service (as an auditor)
 *
 * Environment: NATS_URL, NATS_CREDS_FILE, TOOLTX_PREFIX, TOOLTX_*_MAX_AGE_MS,
 * TOOLTX_DUPLICATE_WINDOW_MS, TOOLTX_REPLICAS; `check` also reads TOOLTX_TOOLS_MODULE (optional)
 * for the contracts' key retention.
 */
import { Command } from 'commander';
import { connectNats, decode, jetStreamOf, openBucket, Subjects } from '@tooltx/nats';
import { baseConfigSchema, loadConfig, loadImplementations, ConfigError } from '@tooltx/runtime';
import { topologyEnvSchema, topologyOptionsFrom } from '@tooltx/runtime/service';
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { applyTopology, checkDurables, checkTopology, generateAuth, inboxPrefixOf, topology } from '@tooltx/streams';
import { z } from 'zod';
import { registerTakeover } from './commands/takeover.js';
import { registerAuditCommands } from './commands/audit.js';

/** The reconciler index entries `ops pending` reads (the projection's own schema lives in the service). */
const reconcileEntrySchema = z.union([
  z.object({ terminal: z.literal(true) }).passthrough(),
  z.object({ terminal: z.literal(false), operationKey: z.string(), tenant: z.string(), status: z.string(), attempt: z.number(), tool: z.string(), version: z.number(), updatedAt: z.number(), deadlineAt: z.number().optional() }),
]);

const cliConfig = baseConfigSchema.extend(topologyEnvSchema.shape).extend({ TOOLTX_TOOLS_MODULE: z.string().optional() });

async function withNats<T>(fn: (ctx: Awaited<ReturnType<typeof setup>>) => Promise<T>): Promise<T> {
  const ctx = await setup();
  try {
    return await fn(ctx);
  } finally {
    await ctx.nc.drain();
  }
}

async function setup() {
  const config = loadConfig(cliConfig);
  const nc = await connectNats({
    servers: config.NATS_URL,
    name: 'tooltx-cli',
    credsFile: config.NATS_CREDS_FILE,
    nkeySeedFile: config.NATS_NKEY_FILE,
    inboxPrefix: config.NATS_NKEY_FILE ? inboxPrefixOf({ kind: 'provisioner' }) : undefined,
    reconnectForever: false,
  });
  const { jsm } = await jetStreamOf(nc);
  const subjects = new Subjects(config.TOOLTX_PREFIX);
  return { config, nc, jsm, subjects, topo: topology(subjects, topologyOptionsFrom(config)) };
}

const program = new Command('tooltx').description('tooltx operator CLI: transactional tool calls on NATS JetStream');
const streams = program.command('streams').description('the JetStream streams, consumers and buckets of one prefix');
streams
  .command('apply')
  .description('create or update the streams, durable consumers and the result bucket (the provisioner)')
  .action(() =>
    withNats(async ({ nc, jsm, topo, subjects }) => {
      const report = await applyTopology(nc, jsm, topo);
      process.stdout.write(`${JSON.stringify({ prefix: subjects.prefix, ...report })}\n`);
    }),
  );
streams
  .command('check')
  .description('list every setting that breaks a tooltx guarantee, and every durable consumer the topology does not define (run as the provisioner); exit code 1 when there is any')
  .option('--extra-durable <name...>', 'durables that are expected besides the topology\'s (the identity list\'s executorDurables)', [])
  .action((o: { extraDurable: string[] }) =>
    withNats(async ({ jsm, topo, config }) => {
      const tools = config.TOOLTX_TOOLS_MODULE ? await loadImplementations(config.TOOLTX_TOOLS_MODULE) : null;
      const v = await checkTopology(jsm, topo, {
        longestKeyRetentionMs: tools?.contracts.longestKeyRetentionMs() ?? 0,
        ...(tools ? { longestOperationMs: tools.longestOperationMs() } : {}),
      });
      v.push(...(await checkDurables(jsm, topo, o.extraDurable)));
      process.stdout.write(`${JSON.stringify({ ok: v.length === 0, violations: v })}\n`);
      if (v.length) process.exitCode = 1;
    }),
  );

const ops = program.command('ops').description('operations as the reconciler sees them');
ops
  .command('pending')
  .description('list the non-terminal operations of the reconciler\'s index, one JSON object per line (no bodies)')
  .option('--older-than <duration>', 'only those not updated for this long, e.g. 30s, 5m, 2h', '0s')
  .action((o: { olderThan: string }) =>
    withNats(async ({ nc, subjects }) => {
      const m = /^(\d+)(ms|s|m|h)$/.exec(o.olderThan);
      if (!m) throw new Error(`--older-than: expected a duration like 30s, got ${JSON.stringify(o.olderThan)}`);
      const ms = Number(m[1]) * { ms: 1, s: 1_000, m: 60_000, h: 3_600_000 }[m[2] as 'ms' | 's' | 'm' | 'h'];
      const kv = await openBucket(nc, subjects.reconcileBucket);
      const now = Date.now();
      let n = 0;
      for await (const key of await kv.keys()) {
        const e = await kv.get(key);
        if (!e || e.operation !== 'PUT') continue;
        const v = decode(reconcileEntrySchema, e.value);
        if (v.terminal || now - v.updatedAt < ms) continue;
        n++;
        process.stdout.write(`${JSON.stringify({ operationKey: v.operationKey, tenant: v.tenant, status: v.status, attempt: v.attempt, tool: `${v.tool}@${v.version}`, ageMs: now - v.updatedAt, ...(v.deadlineAt ? { deadlineAt: new Date(v.deadlineAt).toISOString() } : {}) })}\n`);
      }
      process.stderr.write(`${n} pending\n`);
    }),
  );

registerTakeover(program);
registerAuditCommands(program);

const auth = program.command('auth').description('identity the server enforces: users, nkeys, permissions');
auth
  .command('generate')
  .description('write <out>/nats-server.conf and <out>/nkeys/*.nk (mode 0600) from an identity list (JSON)')
  .requiredOption('--identities <file>', 'JSON: { "tenants": [{ "id", "actors": [], "auditors": [] }], "operators": [], "executorDurables": [] }; also writes signing/<service>.pem (kept if present) and receipt-keys.json')
  .requiredOption('--out <dir>', 'output directory')
  .option('--listen <host:port>', 'client listen address', '127.0.0.1:4222')
  .option('--store-dir <dir>', 'JetStream store directory', '.state/jetstream')
  .action((o: { identities: string; out: string; listen: string; storeDir: string }) => {
    const config = loadConfig(cliConfig);
    const subjects = new Subjects(config.TOOLTX_PREFIX);
    const list = JSON.parse(readFileSync(o.identities, 'utf8')) as Parameters<typeof generateAuth>[0];
    const g = generateAuth(list, { subjects, topology: topology(subjects, topologyOptionsFrom(config)), outDir: resolve(o.out), listen: o.listen, storeDir: resolve(o.storeDir) });
    process.stdout.write(`${JSON.stringify({ config: g.configFile, users: g.users.map((u) => ({ role: u.role, seedFile: u.seedFile, inboxPrefix: u.inboxPrefix })) })}\n`);
  });

try {
  await program.parseAsync(process.argv);
} catch (err) {
  const text = err instanceof z.ZodError ? z.prettifyError(err) : err instanceof Error ? `${err.name}: ${err.message}` : String(err);
  process.stderr.write(`tooltx: ${text}\n`);
  process.exit(err instanceof ConfigError ? 2 : 1);
}
