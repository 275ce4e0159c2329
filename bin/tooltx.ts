#!/usr/bin/env -S node --import tsx
/**
 * `tooltx` — the operator CLI.
 *
 *   tooltx serve          run the roles (default all) in this process: tooltx serve --help
 *   tooltx console        serve the web console for operators and auditors: tooltx console --help
 *   tooltx streams apply   create or update the streams, consumers and result bucket (provisioner)
 *   tooltx streams check   list every setting that breaks a guarantee; exit 1 when any
 *   tooltx auth generate   nats-server config + one nkey seed per user from an identity list
 *   tooltx ops list|show   operations by state across tenants, through the operations query service
 *                          (as an operator granted query)
 *   tooltx ops pending     the operations the reconciler is watching (accepted, running, unknown,
 *                          held back, or a failed compensation a person has not resolved yet)
 *   tooltx contracts …     the contract registry: list / usage / deprecate / retire / revert (as an operator granted contracts)
 *   tooltx takeover …      list / show / resolve operations handed over to a person (as an operator)
 *   tooltx compensate …    compensate a committed operation (as an operator granted compensate)
 *   tooltx confirm …       confirm a held-back operation: it runs once (as an operator granted confirm)
 *   tooltx discard …       discard a held-back operation: rolled back, nothing sent (as an operator granted confirm)
 *   tooltx audit …         show / list / export / counts of audit records, through the audit service (as an auditor)
 *   tooltx mcp             serve the deployment's contracts as MCP tools, as one agent (stdio or Streamable HTTP)
 *   tooltx debug …         debug samples of a contract, scrubbed and expiring (as an operator granted debug)
 *
 * Environment: NATS_URL, NATS_NKEY_FILE (the provisioner's seed for streams and ops), NATS_CREDS_FILE,
 * TOOLTX_PREFIX, TOOLTX_*_MAX_AGE_MS, TOOLTX_DUPLICATE_WINDOW_MS, TOOLTX_REPLICAS, TOOLTX_MAX_DELIVER;
 * `check` also reads TOOLTX_TOOLS_MODULE (optional) for the contracts' key retention. Exit codes:
 * 0 done, 1 failed or refused, 2 bad usage or configuration (a flag, a variable, a file).
 */
import { Command, Option } from 'commander';
import { ErrorClass, TooltxError } from '@tooltx/contracts';
import { assertSupportedServer, decode, jetStreamOf, openBucket, Subjects, UnsupportedServerError } from '@tooltx/nats';
import { baseConfigSchema, loadConfig, loadImplementations, ConfigError, usageErrorsExitTwo } from '@tooltx/runtime';
import { describeModuleError, topologyEnvSchema, topologyOptionsFrom } from '@tooltx/runtime/service';
import { existsSync, readFileSync, statSync } from 'node:fs';
import { resolve } from 'node:path';
import {
  applyTopology,
  checkDurables,
  checkTopology,
  tenantEntrySchema,
  topology,
  type TenantSpec,
} from '@tooltx/streams';
import { generateAuth, identityListSchema, OPERATOR_GRANTS, tenantsOf, type IdentityList } from '@tooltx/auth';
import { inboxPrefixOf } from '@tooltx/nats';
import type { NatsConnection } from '@tooltx/nats';
import { z } from 'zod';
import { registerCompensate } from './commands/compensate.js';
import { registerContracts } from './commands/contracts.js';
import { registerOpsQuery } from './commands/ops.js';
import { registerDebug } from './commands/debug.js';
import { registerConfirm } from './commands/confirm.js';
import { registerMcp } from './commands/mcp.js';
import { registerTakeover } from './commands/takeover.js';
import { serve } from './serve.js';
import { registerConsole } from './commands/console.js';
import { registerAuditCommands } from './commands/audit.js';
import {
  CliRefusal,
  connectCli,
  notThatIdentity,
  permissionViolationOf,
  shown,
  UsageError,
  type CliIdentity,
} from './commands/cli-support.js';

/** The reconciler index entries `ops pending` reads (the projection's own schema lives in the service). */
const reconcileEntrySchema = z.union([
  z.object({ terminal: z.literal(true) }).passthrough(),
  z.object({
    terminal: z.literal(false),
    operationKey: z.string(),
    tenant: z.string(),
    status: z.string(),
    attempt: z.number(),
    tool: z.string(),
    version: z.number(),
    updatedAt: z.number(),
    deadlineAt: z.number().optional(),
  }),
]);

const cliConfig = baseConfigSchema
  .extend(topologyEnvSchema.shape)
  .extend({ TOOLTX_TOOLS_MODULE: z.string().optional() });

const PROVISIONER: CliIdentity = { describe: 'the provisioner', seedName: 'provisioner.nk' };

/** What `streams` and `ops` read from the environment (printed by their --help). */
const PROVISIONER_ENV = `
Environment:
  NATS_URL          server URL(s), comma-separated (default nats://127.0.0.1:4222)
  NATS_NKEY_FILE    the provisioner's seed (<out>/nkeys/provisioner.nk from \`tooltx auth generate\`)
  NATS_CREDS_FILE   a .creds file instead of the seed
  TOOLTX_PREFIX     subject prefix of the deployment (default tooltx)`;
const TOPOLOGY_ENV = `
  TOOLTX_INTENTS_MAX_AGE_MS, TOOLTX_EVENTS_MAX_AGE_MS, TOOLTX_DECISIONS_MAX_AGE_MS, TOOLTX_RESULTS_MAX_AGE_MS,
  TOOLTX_PROJECTIONS_MAX_AGE_MS, TOOLTX_AUDITLOG_MAX_AGE_MS
                    retention of each stream and bucket, ms
  TOOLTX_DUPLICATE_WINDOW_MS  dedup window of the intent stream and the event log, ms
  TOOLTX_REPLICAS   stream replicas (1-5)
  TOOLTX_MAX_DELIVER  deliveries of one message to a durable before the max-deliveries advisory`;

async function withNats<T>(fn: (ctx: Awaited<ReturnType<typeof setup>>) => Promise<T>): Promise<T> {
  const ctx = await setup();
  try {
    return await fn(ctx);
  } catch (err) {
    const denied = permissionViolationOf(err);
    if (denied) throw new CliRefusal(notThatIdentity(denied, PROVISIONER, ctx.config.NATS_NKEY_FILE), { cause: err });
    throw err;
  } finally {
    await ctx.nc.drain();
  }
}

async function setup() {
  const config = loadConfig(cliConfig);
  const nc = await connectCli({
    servers: config.NATS_URL,
    name: 'tooltx-cli',
    credsFile: config.NATS_CREDS_FILE,
    nkeyFile: config.NATS_NKEY_FILE,
    inboxPrefix: config.NATS_NKEY_FILE ? inboxPrefixOf({ kind: 'provisioner' }) : undefined,
    reconnectForever: false,
    as: PROVISIONER,
  });
  // 2.10 is the oldest server tooltx runs on (docs/nats-server.md): no stream is applied or checked on an older one.
  try {
    assertSupportedServer(nc.info?.version);
  } catch (err) {
    await nc.close();
    if (err instanceof UnsupportedServerError)
      throw new CliRefusal(`NATS_URL: the server there is ${err.problem}`, { cause: err });
    throw err;
  }
  const { jsm } = await jetStreamOf(nc);
  const subjects = new Subjects(config.TOOLTX_PREFIX);
  return { config, nc, jsm, subjects, topo: topology(subjects, topologyOptionsFrom(config)) };
}

const program = usageErrorsExitTwo(new Command('tooltx'))
  .description('tooltx operator CLI: transactional tool calls on NATS JetStream')
  .addHelpText(
    'after',
    `
Environment (each command's --help lists what it reads):
  NATS_URL          server URL(s) (default nats://127.0.0.1:4222)
  NATS_NKEY_FILE    the seed of the identity the command acts as: the provisioner (streams, ops),
                    an operator (takeover, compensate, confirm, discard), an auditor (audit), an agent (mcp); \`tooltx auth generate\` writes them
  NATS_CREDS_FILE   a .creds file instead of the seed
  TOOLTX_PREFIX     subject prefix of the deployment (default tooltx)
  TOOLTX_OPERATOR   takeover, compensate, confirm, discard: the operator's id
  TOOLTX_TENANT, TOOLTX_AUDITOR  audit: defaults of --tenant and --auditor
  TOOLTX_ACTOR, TOOLTX_CONTRACTS_MODULE, TOOLTX_MCP_*  mcp: the actor it acts as (of TOOLTX_TENANT), the contracts it serves, its transport
  TOOLTX_TOOLS_MODULE  streams check: the trusted module, for the contracts' key retention (optional)
  TOOLTX_*_MAX_AGE_MS, TOOLTX_DUPLICATE_WINDOW_MS, TOOLTX_REPLICAS, TOOLTX_MAX_DELIVER  the topology
Exit codes: 0 done, 1 failed or refused, 2 bad usage or configuration.`,
  );
program
  .command('serve')
  .description(
    'run the roles of a deployment (default all: authorizer, executor, reconciler, audit-projector) in this process',
  )
  .helpOption(false)
  .allowUnknownOption()
  .allowExcessArguments()
  .action(async () => {
    // `tooltx serve` owns its arguments (--roles, --help): the host reads them as its own command line.
    const at = process.argv.indexOf('serve');
    await serve([process.argv[0]!, 'tooltx serve', ...process.argv.slice(at + 1)]);
  });
registerConsole(program);
const streams = program
  .command('streams')
  .description('the JetStream streams, consumers and buckets of one prefix')
  .addHelpText('after', PROVISIONER_ENV + TOPOLOGY_ENV);
streams
  .command('apply')
  .description(
    "create or update the streams, durable consumers and buckets (the provisioner), with each tenant's own intake and decision streams",
  )
  .option(
    '--identities <file>',
    'the identity list (JSON, as given to `auth generate`): its tenants and their limits (docs/tenancy.md) become the tenants served; without it, the tenants already provisioned are applied again',
  )
  .addHelpText('after', PROVISIONER_ENV + TOPOLOGY_ENV)
  .action((o: { identities?: string }) => {
    const list = o.identities === undefined ? undefined : readIdentityList(o.identities);
    return withNats(async ({ nc, jsm, subjects, config }) => {
      const tenants = list ? tenantsOf(list) : await provisionedTenants(nc, subjects);
      if (tenants.length === 0)
        process.stderr.write(
          "no tenant: give --identities <file> to provision each tenant's streams (agents cannot submit until then)\n",
        );
      const report = await applyTopology(nc, jsm, topology(subjects, { ...topologyOptionsFrom(config), tenants }));
      process.stdout.write(
        `${JSON.stringify({ prefix: subjects.prefix, tenants: tenants.map((t) => t.id), ...report })}\n`,
      );
    });
  });
streams
  .command('check')
  .description(
    'list every setting that breaks a tooltx guarantee, and every durable consumer the topology does not define (run as the provisioner); exit code 1 when there is any',
  )
  .option(
    '--extra-durable <name...>',
    "durables that are expected besides the topology's (the identity list's executorDurables)",
    [],
  )
  .addHelpText(
    'after',
    `${PROVISIONER_ENV}${TOPOLOGY_ENV}
  TOOLTX_TOOLS_MODULE  the trusted module (optional): the contracts' key retention and longest operation`,
  )
  .action((o: { extraDurable: string[] }) =>
    withNats(async ({ nc, jsm, config, subjects }) => {
      const topo = topology(subjects, {
        ...topologyOptionsFrom(config),
        tenants: await provisionedTenants(nc, subjects),
      });
      const modulePath = config.TOOLTX_TOOLS_MODULE;
      let tools: Awaited<ReturnType<typeof loadImplementations>> | null = null;
      if (modulePath) {
        try {
          tools = await loadImplementations(modulePath);
        } catch (err) {
          throw new UsageError(`TOOLTX_TOOLS_MODULE=${modulePath}: ${describeModuleError(modulePath, err)}`);
        }
      }
      const v = await checkTopology(jsm, topo, {
        longestKeyRetentionMs: tools?.contracts.longestKeyRetentionMs() ?? 0,
        ...(tools ? { longestOperationMs: tools.longestOperationMs() } : {}),
      });
      v.push(...(await checkDurables(jsm, topo, o.extraDurable)));
      process.stdout.write(`${JSON.stringify({ ok: v.length === 0, violations: v })}\n`);
      if (v.length) process.exitCode = 1;
    }),
  );

const ops = program
  .command('ops')
  .description(
    'operations: by state across tenants (list, show: as an operator granted query), or as the reconciler sees them (pending: as the provisioner)',
  );
registerOpsQuery(ops);
registerContracts(program);
ops
  .command('pending')
  .description("list the non-terminal operations of the reconciler's index, one JSON object per line (no bodies)")
  .option('--older-than <duration>', 'only those not updated for this long, e.g. 30s, 5m, 2h', '0s')
  .addHelpText('after', PROVISIONER_ENV)
  .action((o: { olderThan: string }) =>
    withNats(async ({ nc, subjects }) => {
      const m = /^(\d+)(ms|s|m|h)$/.exec(o.olderThan);
      if (!m) throw new UsageError(`--older-than: expected a duration like 30s, got ${shown(o.olderThan)}`);
      const ms = Number(m[1]) * { ms: 1, s: 1_000, m: 60_000, h: 3_600_000 }[m[2] as 'ms' | 's' | 'm' | 'h'];
      const kv = await openBucket(nc, subjects.reconcileBucket);
      const now = Date.now();
      let n = 0;
      for await (const key of await kv.keys()) {
        const e = await kv.get(key);
        if (e?.operation !== 'PUT') continue;
        const v = decode(reconcileEntrySchema, e.value);
        if (v.terminal || now - v.updatedAt < ms) continue;
        n++;
        process.stdout.write(
          `${JSON.stringify({ operationKey: v.operationKey, tenant: v.tenant, status: v.status, attempt: v.attempt, tool: `${v.tool}@${v.version}`, ageMs: now - v.updatedAt, ...(v.deadlineAt ? { deadlineAt: new Date(v.deadlineAt).toISOString() } : {}) })}\n`,
        );
      }
      process.stderr.write(`${n} pending\n`);
    }),
  );

registerTakeover(program);
registerCompensate(program);
registerConfirm(program);
registerAuditCommands(program);
registerMcp(program);
registerDebug(program);

const auth = program.command('auth').description('identity the server enforces: users, nkeys, permissions');
auth
  .command('generate')
  .description('write <out>/nats-server.conf and <out>/nkeys/*.nk (mode 0600) from an identity list (JSON)')
  .requiredOption(
    '--identities <file>',
    `JSON: { "tenants": [{ "id", "actors": [], "auditors": [], "limits": {} }], "operators": ["<id>" or { "id", "may": [grants] }], "executorDurables": [], "limits": {} } (grants: ${OPERATOR_GRANTS.map((g) => `"${g}"`).join(', ')}: docs/security.md; limits: docs/tenancy.md); also writes signing/<service>.pem (kept if present) and receipt-keys.json`,
  )
  .requiredOption('--out <dir>', 'output directory')
  .option('--listen <host:port>', 'client listen address', '127.0.0.1:4222')
  .option(
    '--store-dir <dir>',
    "JetStream store directory (with --cluster-node: each node's is <dir>/<name>)",
    '.state/jetstream',
  )
  .addOption(
    new Option(
      '--durability <fsync|os>',
      'fsync: the server fsyncs before every acknowledgement (sync_interval: always); os: it leaves that to the OS and can lose acknowledged writes on a power failure (docs/durability.md)',
    )
      .choices(['fsync', 'os'])
      .default('fsync'),
  )
  .option(
    '--cluster-node <name,listen,route>',
    'one node of a cluster (repeat per node, 3 for R3): its server name, the host:port it listens on for clients, and the host:port the other nodes reach its routes at; writes <out>/nats-server-<name>.conf per node instead of <out>/nats-server.conf (docs/cluster.md)',
    (v: string, acc: string[]) => [...acc, v],
    [] as string[],
  )
  .addHelpText(
    'after',
    `
Environment: TOOLTX_PREFIX (subject prefix, default tooltx) and the topology variables
(TOOLTX_*_MAX_AGE_MS, TOOLTX_DUPLICATE_WINDOW_MS, TOOLTX_REPLICAS, TOOLTX_MAX_DELIVER).`,
  )
  .action(
    (o: {
      identities: string;
      out: string;
      listen: string;
      storeDir: string;
      durability: 'fsync' | 'os';
      clusterNode: string[];
    }) => {
      const config = loadConfig(cliConfig);
      // The seeds go where --out says: never into the current directory by an empty or blank value.
      for (const [flag, dir] of [
        ['--out', o.out],
        ['--store-dir', o.storeDir],
      ] as const) {
        if (dir.trim() === '')
          throw new UsageError(
            `${flag} ${shown(dir)}: ${dir === '' ? 'empty' : 'spaces alone are not a value'}: name a directory`,
          );
        if (existsSync(dir) && !statSync(dir).isDirectory())
          throw new UsageError(`${flag} ${dir}: exists and is not a directory`);
      }
      const subjects = new Subjects(config.TOOLTX_PREFIX);
      const listen = /^(.+):(-?\d+)$/.exec(o.listen);
      const port = listen ? Number(listen[2]) : NaN;
      if (!listen || !((port >= 1 && port <= 65_535) || port === -1)) {
        throw new UsageError(
          `--listen: expected <host>:<port> with a port 1-65535 (or -1: any free port), got ${shown(o.listen)}`,
        );
      }
      const nodes = o.clusterNode.map((spec) => clusterNodeOf(spec, resolve(o.storeDir)));
      if (nodes.length > 0 && nodes.length !== 3 && nodes.length !== 5) {
        throw new UsageError(
          `--cluster-node: ${nodes.length} nodes; a cluster here has 3 (R3) or 5, so that it keeps a majority when one node (two of five) is gone`,
        );
      }
      const twice = (key: (n: (typeof nodes)[number]) => string) =>
        nodes.find((n, i) => nodes.findIndex((m) => key(m) === key(n)) !== i);
      const sameName = twice((n) => n.serverName);
      if (sameName) throw new UsageError(`--cluster-node: two nodes named ${sameName.serverName}`);
      const sameRoute = twice((n) => `${n.routeHost}:${n.clusterListen.slice(n.clusterListen.lastIndexOf(':') + 1)}`);
      if (sameRoute)
        throw new UsageError(
          `--cluster-node: two nodes with the route address ${sameRoute.routeHost}:${sameRoute.clusterListen.slice(sameRoute.clusterListen.lastIndexOf(':') + 1)}`,
        );
      const list = readIdentityList(o.identities);
      let g: ReturnType<typeof generateAuth>;
      try {
        g = generateAuth(list, {
          subjects,
          topology: topology(subjects, topologyOptionsFrom(config)),
          outDir: resolve(o.out),
          listen: o.listen,
          storeDir: resolve(o.storeDir),
          durability: o.durability,
          ...(nodes.length ? { cluster: { nodes } } : {}),
        });
      } catch (err) {
        // The list's own rules (checkIdentityList: reserved ids, shared inboxes, durables) are bad
        // input in the file the user named, like a schema error: exit 2.
        if (err instanceof TooltxError && err.class === ErrorClass.InvalidInput)
          throw new UsageError(`--identities: ${o.identities}: ${err.message}`);
        throw err;
      }
      process.stdout.write(
        `${JSON.stringify({ config: g.configFile, ...(nodes.length ? { configs: g.configFiles } : {}), users: g.users.map((u) => ({ role: u.role, seedFile: u.seedFile, inboxPrefix: u.inboxPrefix })) })}\n`,
      );
    },
  );

/** The identity list in `file`, or a usage error (exit 2) saying what is wrong with it. */
function readIdentityList(file: string): IdentityList {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    throw new UsageError(`--identities: cannot read ${file} (${(err as NodeJS.ErrnoException).code ?? String(err)})`);
  }
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch {
    // Not the parser's message: it quotes the file's first characters, and a seed file given by
    // mistake would be printed.
    throw new UsageError(`--identities: ${file} is not JSON`);
  }
  const parsed = identityListSchema.safeParse(raw);
  if (!parsed.success)
    throw new UsageError(`--identities: ${file} is not an identity list:\n${z.prettifyError(parsed.error)}`);
  return raw as IdentityList;
}

/** The tenants in the deployment's tenants bucket (what the last `streams apply --identities` listed); none when it does not exist. */
async function provisionedTenants(nc: NatsConnection, subjects: Subjects): Promise<TenantSpec[]> {
  let kv: Awaited<ReturnType<typeof openBucket>>;
  try {
    kv = await openBucket(nc, subjects.tenantsBucket);
  } catch {
    return [];
  }
  const out: TenantSpec[] = [];
  for await (const key of await kv.keys()) {
    const e = await kv.get(key);
    if (e?.operation === 'PUT' && e.length > 0) out.push({ id: key, ...decode(tenantEntrySchema, e.value) });
  }
  return out.sort((a, b) => a.id.localeCompare(b.id));
}

/**
 * `name,host:port,routeHost:routePort` of `--cluster-node` as a node (routes listen on the client
 * address's host, on the route port); a usage error naming the part that is wrong otherwise.
 */
function clusterNodeOf(spec: string, storeDir: string) {
  const bad = (problem: string): never => {
    throw new UsageError(
      `--cluster-node ${shown(spec)}: ${problem} (expected <name>,<host>:<port>,<route host>:<route port>, e.g. n1,0.0.0.0:4222,nats-1:6222)`,
    );
  };
  const parts = spec.split(',');
  if (parts.length !== 3) bad(`${parts.length} comma-separated parts, not 3`);
  const [name, listen, route] = parts as [string, string, string];
  if (!/^[a-z0-9][a-z0-9_-]{0,31}$/i.test(name))
    bad(`the name ${shown(name)} is not 1-32 letters, digits, '_' or '-' (starting with a letter or digit)`);
  const hostPort = (what: string, v: string) => {
    const m = /^([^\s:[\]]+):(\d{1,5})$/.exec(v);
    if (!m)
      return bad(
        `the ${what} ${shown(v)} is not <host>:<port> (a host name or IPv4 address; IPv6 is not supported here)`,
      );
    const port = Number(m[2]);
    if (port < 1 || port > 65_535) bad(`the ${what} port ${port} is not 1-65535`);
    return { host: m[1]!, port };
  };
  const l = hostPort('client address', listen);
  const r = hostPort('route address', route);
  return {
    serverName: name,
    listen: `${l.host}:${l.port}`,
    clusterListen: `${l.host}:${r.port}`,
    routeHost: r.host,
    storeDir: resolve(storeDir, name),
  };
}

try {
  await program.parseAsync(process.argv);
} catch (err) {
  const text =
    err instanceof z.ZodError
      ? z.prettifyError(err)
      : err instanceof ConfigError
        ? err.problems.length === 1
          ? `invalid configuration: ${err.problems[0]}`
          : err.message
        : err instanceof UsageError || err instanceof CliRefusal
          ? err.message
          : err instanceof Error
            ? `${err.name}: ${err.message}`
            : String(err);
  // Bounded whatever a message quotes: the arguments and files it names are the user's input.
  process.stderr.write(`tooltx: ${text.length > 4_000 ? `${text.slice(0, 4_000)}…` : text}\n`);
  process.exit(err instanceof ConfigError || err instanceof UsageError ? 2 : 1);
}
