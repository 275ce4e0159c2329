import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { isAbsolute, join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { Command } from 'commander';
import { usageErrorsExitTwo } from './cli.js';
import { z } from 'zod';
import type { JetStreamClient, JetStreamManager } from '@nats-io/jetstream';
import {
  assertSupportedServer,
  connectNats,
  connectProblemOf,
  jetStreamOf,
  JetStreamStore,
  openBucket,
  UnsupportedServerError,
  permissionViolationOf,
  Subjects,
  type NatsConnection,
} from '@tooltx/nats';
import { assertTopology, topology, type Topology, type TopologyOptions } from '@tooltx/streams';
import { loadReceiptSigner, type OperationRecord, type ReceiptSigner } from '@tooltx/lifecycle';
import type { AuthorizationResult } from '@tooltx/contracts';
import { ConfigError, envInt, loadConfig, serviceConfigSchema } from './config.js';
import { createLogger, installProcessHandlers, type Logger } from './logger.js';
import { SecretFileError } from './secrets.js';
import { exitWithParent, onShutdown } from './shutdown.js';
import { startTracing, type Tracing } from './tracing.js';
import {
  announceReady,
  describeConnectError,
  describeError,
  displayUrl,
  failStartup,
  isNatsError,
  startupStep,
  StartupError,
  type StartupReporter,
} from './startup.js';
import { loadImplementations, ToolsModuleError, type ImplementationRegistry } from './implementations.js';
import { publishContracts, startHeldMarks } from './contract-registry.js';
import { EventLogFanout } from './event-log-fanout.js';
import { Durables } from '@tooltx/streams';

const optMs = envInt(1).optional();

/** Stream settings read from the environment by the provisioner and every service (all ms). */
export const topologyEnvSchema = z.object({
  TOOLTX_INTENTS_MAX_AGE_MS: optMs,
  TOOLTX_EVENTS_MAX_AGE_MS: optMs,
  TOOLTX_DECISIONS_MAX_AGE_MS: optMs,
  TOOLTX_RESULTS_MAX_AGE_MS: optMs,
  TOOLTX_PROJECTIONS_MAX_AGE_MS: optMs,
  TOOLTX_AUDITLOG_MAX_AGE_MS: optMs,
  TOOLTX_DUPLICATE_WINDOW_MS: optMs,
  TOOLTX_REPLICAS: envInt(1, 5).optional(),
  /** Deliveries of one message to a durable before the max-deliveries advisory (default 50). */
  TOOLTX_MAX_DELIVER: envInt(1).optional(),
});

export function topologyOptionsFrom(env: z.infer<typeof topologyEnvSchema>): TopologyOptions {
  const o: TopologyOptions = {};
  if (env.TOOLTX_INTENTS_MAX_AGE_MS) o.intentsMaxAgeMs = env.TOOLTX_INTENTS_MAX_AGE_MS;
  if (env.TOOLTX_EVENTS_MAX_AGE_MS) o.eventsMaxAgeMs = env.TOOLTX_EVENTS_MAX_AGE_MS;
  if (env.TOOLTX_DECISIONS_MAX_AGE_MS) o.decisionsMaxAgeMs = env.TOOLTX_DECISIONS_MAX_AGE_MS;
  if (env.TOOLTX_RESULTS_MAX_AGE_MS) o.resultsMaxAgeMs = env.TOOLTX_RESULTS_MAX_AGE_MS;
  if (env.TOOLTX_PROJECTIONS_MAX_AGE_MS) o.projectionsMaxAgeMs = env.TOOLTX_PROJECTIONS_MAX_AGE_MS;
  if (env.TOOLTX_AUDITLOG_MAX_AGE_MS) o.auditLogMaxAgeMs = env.TOOLTX_AUDITLOG_MAX_AGE_MS;
  if (env.TOOLTX_DUPLICATE_WINDOW_MS) o.duplicateWindowMs = env.TOOLTX_DUPLICATE_WINDOW_MS;
  if (env.TOOLTX_REPLICAS) o.replicas = env.TOOLTX_REPLICAS;
  if (env.TOOLTX_MAX_DELIVER) o.maxDeliver = env.TOOLTX_MAX_DELIVER;
  return o;
}

export const fullServiceConfigSchema = serviceConfigSchema.extend(topologyEnvSchema.shape);
export type ServiceConfig = z.infer<typeof fullServiceConfigSchema>;

/** What a service's `start` receives from the composition root. */
export interface ServiceContext {
  config: ServiceConfig;
  log: Logger;
  nc: NatsConnection;
  js: JetStreamClient;
  jsm: JetStreamManager;
  subjects: Subjects;
  topology: Topology;
  store: JetStreamStore;
  tools: ImplementationRegistry;
  /** The receipt signer (TOOLTX_SIGNING_KEY_FILE); set for services whose spec says `signsReceipts`. */
  signer?: ReceiptSigner;
  /** What the roles of this process share (empty when it hosts one role). */
  colocation: Colocation;
}

/**
 * One role of a deployment (authorizer, executor, reconciler, audit-projector): its name, its own
 * settings and how it starts on a connection the runtime made. A role knows nothing of the process
 * it runs in: {@link runService} runs one role as a process of its own, and one process may start
 * several roles' `start` on one connection (each gets the same context and returns its own stop).
 */
export interface RoleSpec<E extends z.ZodRawShape = Record<never, never>> {
  name: string;
  summary: string;
  /** Extra lines for `--help` under "Environment:" (the role's own variables). */
  envHelp?: string;
  /** The role's own settings, parsed from the environment with the common ones (problems listed together, exit 2). */
  env?: z.ZodObject<E>;
  /** Starts the role; resolves to what stops it (stop pulling, finish what is in flight). */
  start: (ctx: ServiceContext & { env: z.infer<z.ZodObject<E>> }) => Promise<() => Promise<void>>;
  /** This role appends `committed`: it needs TOOLTX_SIGNING_KEY_FILE (FM-17). */
  signsReceipts?: boolean;
}

/** Declares a role ({@link RoleSpec}); typed so its `start` sees its own settings. */
export function defineRole<E extends z.ZodRawShape = Record<never, never>>(spec: RoleSpec<E>): RoleSpec<E> {
  return spec;
}

/**
 * What the roles hosted by one process share, beyond the connection each has: a role that can take
 * work in-process registers itself here, and a role started after it finds it. Empty for a process
 * that hosts one role.
 */
export interface Colocation {
  /**
   * The executor, when this process hosts it: the authorizer hands it an operation it accepted and
   * started in one append (docs/operating.md "One process or four") instead of waiting for the
   * event log to deliver the `accepted` event.
   */
  executor?: LocalExecutor;
  /**
   * The one reader of the event log, when this process hosts every role on the `host` identity: the
   * executor, the reconciler and the audit-projector register their handlers of event-log messages
   * here instead of each pulling its own durable (docs/operating.md "One process or four").
   */
  eventLog?: EventLogFanout;
}

/** A started attempt handed to the co-located executor (see {@link Colocation}). */
export interface LocalExecutor {
  /**
   * Reserves a slot for one attempt of `contract` and fixes its start: the executor's id and the
   * absolute deadline (ms since the epoch, on the downstream's clock as far as it is known). Null
   * when every slot is taken or the contract is not loaded here: the operation is then accepted
   * alone and the event log delivers it to an executor.
   */
  begin(tool: string, version: number): LocalStart | null;
}

/** One reserved in-process attempt ({@link LocalExecutor.begin}). */
export interface LocalStart {
  executor: string;
  deadlineAt: number;
  /**
   * Runs the attempt whose `accepted` event (carrying this start) is stored at `seq`, with the
   * input the intent carried (already checked against its digest) and the policy seam's answer at
   * the execution instant. Resolves when the attempt has ended (never rejects).
   */
  run(a: {
    tenant: string;
    opId: string;
    state: OperationRecord;
    seq: number;
    input: Record<string, unknown>;
    allowed: AuthorizationResult | undefined;
  }): Promise<void>;
  /** Gives the slot back: the append did not start this attempt (a replay, a conflict, a failure). */
  cancel(): void;
}

/** What {@link runRoles} needs besides the roles: how the process calls itself. */
export interface HostOptions {
  /** Program name in `--help`, logs and startup errors (`tooltx-<role>` for one role). */
  program: string;
  /** One line for `--help`. */
  summary: string;
  /** The command line (default `process.argv`: node, script, then the arguments). */
  argv?: string[];
  /** Options the caller has already read from `argv`, listed in `--help` and accepted here. */
  options?: { flags: string; description: string; defaultValue?: string }[];
}

/**
 * The composition root every service shares: {@link runRoles} with one role.
 */
export async function runService<E extends z.ZodRawShape = Record<never, never>>(spec: RoleSpec<E>): Promise<void> {
  await runRoles([spec as unknown as RoleSpec], { program: `tooltx-${spec.name}`, summary: spec.summary });
}

/** Settings of a process that hosts several roles: where each role's identity and signing key are. */
const hostConfigSchema = z.object({
  /**
   * The directory `tooltx auth generate` wrote: each role connects as its own service identity
   * (`nkeys/service.<role>.nk`) and signs its receipts with its own key (`signing/<role>.pem`),
   * unless NATS_NKEY_FILE / NATS_CREDS_FILE / TOOLTX_SIGNING_KEY_FILE name one for all.
   */
  TOOLTX_AUTH_DIR: z.string().min(1).optional(),
});

/**
 * Runs one or more roles in this process: `--help` → config (fails fast listing every problem,
 * exit 2) → logger → trusted tools module (loaded once, shared) → one connection per role, each
 * as its own identity → check the streams (refuses to start naming each broken setting, exit 2;
 * never "ensures") → start each role in the order given, each with its own context on its own
 * connection and the shared {@link Colocation} → on SIGTERM or SIGINT: stop the roles in reverse
 * order, drain every connection, exit 0.
 *
 * A failure to start names the setting behind it and its value (startup.ts: one line on stderr,
 * one `failed to start` log line with `setting`, `value`, `problem`): the tools module
 * (`TOOLTX_TOOLS_MODULE`), the nkey or credentials file, the server (`NATS_URL`, shown without
 * user-info), the prefix whose streams do not match (`TOOLTX_PREFIX`), and the roles' own
 * settings (`spec.env`, validated with the common ones so every problem is listed at once).
 *
 * Started by a supervisor with `TOOLTX_EXIT_WITH_PARENT=<its pid>`, the process stops when that
 * supervisor is gone (shutdown.ts `exitWithParent`).
 */
export async function runRoles(specs: RoleSpec[], host: HostOptions): Promise<void> {
  const argv = host.argv ?? process.argv;
  const asksHelp = argv.slice(2).some((a) => a === '--help' || a === '-h');
  const many = specs.length > 1;
  const helpSpec = {
    name: many ? 'host' : specs[0]!.name,
    envHelp: [
      ...(many
        ? [
            `  TOOLTX_AUTH_DIR          directory written by \`tooltx auth generate\`: each role connects as nkeys/service.<role>.nk
                           and signs with signing/<role>.pem (optional)`,
          ]
        : []),
      ...specs.flatMap((s) => (s.envHelp ? [s.envHelp] : [])),
    ].join('\n'),
    signsReceipts: specs.some((s) => s.signsReceipts),
  };
  const cli = usageErrorsExitTwo(new Command(host.program)).description(
    `${host.program.replace(/^tooltx-/, 'tooltx ')}: ${host.summary}`,
  );
  for (const o of host.options ?? []) cli.option(o.flags, o.description, o.defaultValue);
  cli
    .addHelpText(
      'after',
      serviceEnvHelp(helpSpec, asksHelp ? await toolsModuleHelp(process.env.TOOLTX_TOOLS_MODULE) : ''),
    )
    .parse(argv);

  const who: StartupReporter = {
    program: host.program,
    service: many ? 'tooltx' : specs[0]!.name,
    instance: `${many ? 'tooltx' : specs[0]!.name}-${process.pid}`,
  };
  let config: ServiceConfig & z.infer<typeof hostConfigSchema>;
  const own = new Map<RoleSpec, Record<string, unknown>>();
  try {
    let schema: z.ZodObject = fullServiceConfigSchema.extend(hostConfigSchema.shape);
    for (const s of specs) if (s.env) schema = schema.extend(s.env.shape);
    const all = loadConfig(schema) as Record<string, unknown>;
    config = all as typeof config;
    for (const s of specs) own.set(s, Object.fromEntries(Object.keys(s.env?.shape ?? {}).map((k) => [k, all[k]])));
  } catch (err) {
    failStartup(who, err);
  }
  who.instance = config.TOOLTX_INSTANCE_ID;
  const logs = new Map<RoleSpec, Logger>();
  let hostLog: Logger;
  try {
    const make = (service: string) =>
      createLogger({
        service,
        instance: config.TOOLTX_INSTANCE_ID,
        level: config.LOG_LEVEL,
        hmacKeyFile: config.TOOLTX_LOG_HMAC_KEY_FILE,
      });
    hostLog = many ? make('tooltx') : make(specs[0]!.name);
    for (const s of specs) logs.set(s, many ? make(s.name) : hostLog);
  } catch (err) {
    failStartup(
      who,
      err instanceof SecretFileError
        ? new StartupError('TOOLTX_LOG_HMAC_KEY_FILE', err.file, err.problem, { cause: err })
        : err,
    );
  }
  who.log = hostLog;
  exitWithParent(hostLog, config.TOOLTX_EXIT_WITH_PARENT);
  // Spans go out only when the OpenTelemetry variables ask for it (docs/tracing.md).
  let tracing: Tracing;
  try {
    tracing = await startTracing({
      serviceName: many ? 'tooltx-serve' : `tooltx-${specs[0]!.name}`,
      instanceId: config.TOOLTX_INSTANCE_ID,
    });
  } catch (err) {
    failStartup(who, err);
  }
  if (tracing.enabled) hostLog.info('tracing on: spans are exported over OTLP/HTTP');
  const authDir = config.TOOLTX_AUTH_DIR;
  const signers = new Map<RoleSpec, ReceiptSigner>();
  for (const spec of specs.filter((s) => s.signsReceipts)) {
    const [setting, file] = config.TOOLTX_SIGNING_KEY_FILE
      ? ['TOOLTX_SIGNING_KEY_FILE', config.TOOLTX_SIGNING_KEY_FILE]
      : authDir
        ? ['TOOLTX_AUTH_DIR', join(authDir, 'signing', `${spec.name}.pem`)]
        : ['TOOLTX_SIGNING_KEY_FILE', undefined];
    if (!file)
      failStartup(
        who,
        new ConfigError([
          `TOOLTX_SIGNING_KEY_FILE: required: the ${spec.name} role signs the receipts of what it commits`,
        ]),
      );
    try {
      signers.set(spec, loadReceiptSigner(file));
    } catch (err) {
      // loadReceiptSigner's messages are its own, `<file>: <problem>` (never the key).
      const m =
        err instanceof Error && err.message.startsWith(`${file}: `) ? err.message.slice(file.length + 2) : undefined;
      failStartup(who, new StartupError(setting, file, m ?? describeError(err), { cause: err }));
    }
  }
  // A crash is logged like everything else: never Node's default print of a message and stack.
  installProcessHandlers(hostLog);
  const conns: NatsConnection[] = [];
  try {
    const modulePath = config.TOOLTX_TOOLS_MODULE;
    const tools = await startupStep(
      'TOOLTX_TOOLS_MODULE',
      modulePath,
      () => loadImplementations(modulePath),
      (err) => describeModuleError(modulePath, err),
    );
    const subjects = new Subjects(config.TOOLTX_PREFIX);
    const topo = topology(subjects, topologyOptionsFrom(config));
    const colocation: Colocation = {};
    const stops: { spec: RoleSpec; stop: () => Promise<void> }[] = [];
    // Every role here: one connection as the `host` identity, and one reader of the event log.
    const hosted = hostIdentityOf(config, specs, authDir, hostLog);
    if (hosted) colocation.eventLog = new EventLogFanout(Durables.host);
    let checked = false;
    let stopHeldMarks: (() => Promise<void>) | undefined;
    let shared: { nc: NatsConnection; js: JetStreamClient; jsm: JetStreamManager; store: JetStreamStore } | undefined;
    for (const spec of specs) {
      const identity = hosted ?? identityOf(config, spec.name, authDir);
      const name = hosted ? 'host' : spec.name;
      if (!shared || !hosted) {
        for (const [setting, file] of identity.files) await startupStep(setting, file, () => readFile(file));
        const nc = await connectRole(config, name, identity);
        conns.push(nc);
        // 2.10.0 is the oldest server tooltx runs on (docs/nats-server.md): refused before anything is read or written.
        try {
          assertSupportedServer(nc.info?.version);
        } catch (err) {
          if (err instanceof UnsupportedServerError)
            throw new StartupError('NATS_URL', displayUrl(config.NATS_URL), `the server there is ${err.problem}`, {
              cause: err,
            });
          throw err;
        }
        const { js, jsm } = await jetStreamOf(nc);
        if (!checked) {
          await checkTopology(jsm, topo, tools, config, identity, name);
          checked = true;
          // The services that hold contracts publish theirs in the registry, and refuse to start
          // when another interface digest holds one of their name@versions (docs/contracts.md).
          if (specs.some((s) => s.name === 'authorizer' || s.name === 'executor')) {
            const registryKv = await openBucket(nc, subjects.contractsBucket);
            const log = hostLog.child({ component: 'contract-registry' });
            await publishContracts(registryKv, tools, {
              by: `service:${name}@${config.TOOLTX_INSTANCE_ID}`,
              modulePath,
              log,
            });
            // What this process can run, for a revert to know (docs/contracts.md "Revert").
            if (specs.some((s) => s.name === 'executor'))
              stopHeldMarks = await startHeldMarks(registryKv, tools, {
                instance: `${name}@${config.TOOLTX_INSTANCE_ID}`,
                intervalMs: config.TOOLTX_HELD_MARK_MS,
                log,
              });
          }
        }
        shared = { nc, js, jsm, store: new JetStreamStore(js, jsm, subjects) };
      }
      const { nc, js, jsm, store } = shared;
      const signer = signers.get(spec);
      const stop = await spec.start({
        config,
        env: (own.get(spec) ?? {}) as never,
        log: logs.get(spec)!,
        nc,
        js,
        jsm,
        subjects,
        topology: topo,
        store,
        tools,
        colocation,
        ...(signer ? { signer } : {}),
      });
      stops.push({ spec, stop });
    }
    // Every consuming role has registered its handler: the one reader starts before the authorizer
    // (started last) lets work in.
    await colocation.eventLog?.start({
      js: shared!.js,
      stream: subjects.eventsStream,
      concurrency: config.TOOLTX_CONCURRENCY,
      log: hostLog.child({ component: 'event-log' }),
    });
    let closing = false;
    for (const conn of conns)
      void conn.closed().then((err) => {
        if (closing) return;
        hostLog.fatal({ err }, 'connection closed unexpectedly');
        process.exit(1);
      });
    onShutdown(hostLog, async () => {
      // The last started first: the authorizer stops handing work to the executor before it stops.
      for (const { stop } of [...stops].reverse()) await stop();
      await stopHeldMarks?.();
      closing = true;
      await Promise.all(conns.map((c) => c.drain()));
      await tracing.shutdown();
    });
    for (const spec of specs)
      logs.get(spec)!.info({ prefix: subjects.prefix, contracts: tools.contracts.all().map((c) => c.id) }, 'started');
    // A supervisor (npm start) learns it over IPC, whatever LOG_LEVEL hides.
    announceReady();
  } catch (err) {
    await Promise.all(conns.map((c) => c.close().catch(() => undefined)));
    failStartup(who, err);
  }
}

interface RoleIdentity {
  /** The setting a refusal of this identity is reported under, and its value. */
  setting: [string, string | undefined];
  credsFile?: string;
  nkeySeedFile?: string;
  /** The files to read first, so a missing one is named (the client only says ENOENT). */
  files: [string, string][];
}

/** Which identity a role connects as: NATS_CREDS_FILE / NATS_NKEY_FILE for all, else TOOLTX_AUTH_DIR's seed of the role, else none. */
function identityOf(config: ServiceConfig, role: string, authDir: string | undefined): RoleIdentity {
  if (config.NATS_CREDS_FILE)
    return {
      setting: ['NATS_CREDS_FILE', config.NATS_CREDS_FILE],
      credsFile: config.NATS_CREDS_FILE,
      files: [['NATS_CREDS_FILE', config.NATS_CREDS_FILE]],
    };
  if (config.NATS_NKEY_FILE)
    return {
      setting: ['NATS_NKEY_FILE', config.NATS_NKEY_FILE],
      nkeySeedFile: config.NATS_NKEY_FILE,
      files: [['NATS_NKEY_FILE', config.NATS_NKEY_FILE]],
    };
  if (authDir) {
    const f = join(authDir, 'nkeys', `service.${role}.nk`);
    return { setting: ['TOOLTX_AUTH_DIR', f], nkeySeedFile: f, files: [['TOOLTX_AUTH_DIR', f]] };
  }
  return { setting: ['NATS_URL', displayUrl(config.NATS_URL)], files: [] };
}

/**
 * The identity of a process that hosts all four roles: `host` (the union of theirs, with the event
 * log's `host` durable) from TOOLTX_AUTH_DIR, or the one NATS_CREDS_FILE / NATS_NKEY_FILE names for
 * all, or none on a server without auth. Undefined when not every role is here, or when the
 * directory has no `host` seed (written by an older `tooltx auth generate`): each role then
 * connects as itself and reads its own durable, as separate processes do.
 */
function hostIdentityOf(
  config: ServiceConfig,
  specs: RoleSpec[],
  authDir: string | undefined,
  log: Logger,
): RoleIdentity | undefined {
  const names = new Set(specs.map((s) => s.name));
  if (!['authorizer', 'executor', 'reconciler', 'audit-projector'].every((r) => names.has(r))) return undefined;
  if (!config.NATS_CREDS_FILE && !config.NATS_NKEY_FILE && authDir) {
    const seed = join(authDir, 'nkeys', 'service.host.nk');
    if (!existsSync(seed)) {
      log.warn(
        { file: seed },
        'no host identity in TOOLTX_AUTH_DIR (run `tooltx auth generate` again): each role connects on its own and reads its own durable',
      );
      return undefined;
    }
  }
  return identityOf(config, 'host', authDir);
}

async function connectRole(config: ServiceConfig, role: string, identity: RoleIdentity): Promise<NatsConnection> {
  return startupStep(
    'NATS_URL',
    displayUrl(config.NATS_URL),
    async () => {
      try {
        return await connectNats({
          servers: config.NATS_URL,
          name: `${role}@${config.TOOLTX_INSTANCE_ID}`,
          credsFile: identity.credsFile,
          nkeySeedFile: identity.nkeySeedFile,
          // Replies to this role arrive only under its own inbox prefix.
          inboxPrefix: `_INBOX._svc.${role}`,
        });
      } catch (err) {
        const problem = connectProblemOf(err);
        if (problem?.about === 'identity')
          throw new StartupError(identity.setting[0], identity.setting[1], problem.problem, { cause: err });
        if (problem?.about === 'url')
          throw new StartupError('NATS_URL', displayUrl(config.NATS_URL), problem.problem, { cause: err });
        if (err instanceof Error && err.name === 'AuthorizationError')
          throw new StartupError(
            identity.setting[0],
            identity.setting[1],
            `the server at ${displayUrl(config.NATS_URL)} refused this identity (${err.message})`,
            { cause: err },
          );
        throw err;
      }
    },
    describeConnectError,
  );
}

async function checkTopology(
  jsm: JetStreamManager,
  topo: Topology,
  tools: ImplementationRegistry,
  config: ServiceConfig,
  identity: RoleIdentity,
  role: string,
): Promise<void> {
  await startupStep(
    'TOOLTX_PREFIX',
    config.TOOLTX_PREFIX,
    () =>
      assertTopology(jsm, topo, {
        longestKeyRetentionMs: tools.contracts.longestKeyRetentionMs(),
        longestOperationMs: tools.longestOperationMs(),
      }),
    (err) =>
      err instanceof Error && (err.name === 'StreamConfigError' || isNatsError(err))
        ? `the streams are not as this service needs them (\`tooltx streams apply\` provisions them): ${err.message}`
        : describeError(err),
  ).catch((err: unknown) => {
    // Refused by the server's permissions: the seed is another identity's, not the prefix's fault.
    const denied = permissionViolationOf(err);
    if (denied)
      throw new StartupError(
        identity.setting[0],
        identity.setting[1],
        `the server refused ${denied.operation === 'publish' ? 'publishing to' : 'subscribing to'} ${denied.subject}: this identity is not the ${role} service's (<out>/nkeys/service.${role}.nk from \`tooltx auth generate\`)`,
        { cause: err },
      );
    throw err;
  });
}

/** The `--help` text after the options: every variable a service reads. */
function serviceEnvHelp(spec: { name: string; envHelp?: string; signsReceipts?: boolean }, toolsHelp: string): string {
  return `
Environment:
  NATS_URL                 server URLs, comma-separated (default nats://127.0.0.1:4222)
  NATS_CREDS_FILE          credentials file (optional)
  NATS_NKEY_FILE           nkey seed file (optional; written by \`tooltx auth generate\`)
  TOOLTX_PREFIX            subject prefix (default tooltx)
  TOOLTX_TOOLS_MODULE      path of the trusted module exporting \`implementations\` (required)
  TOOLTX_CONCURRENCY       operations handled at once (default 16)
  TOOLTX_HELD_MARK_MS      how often an executor renews its held marks of the contract versions it
                           holds, ms; each lasts three intervals (default 60000; docs/contracts.md)
  TOOLTX_INSTANCE_ID       name of this instance in logs and events (default host-pid)
  LOG_LEVEL                fatal|error|warn|info|debug|trace|silent (default info)
  TOOLTX_LOG_HMAC_KEY_FILE key file for the HMAC of error messages in logs (optional; mode 0600)
${
  spec.signsReceipts
    ? spec.name === 'host'
      ? `  TOOLTX_SIGNING_KEY_FILE  Ed25519 private key (PKCS#8 PEM, mode 0600) that signs the receipts of every
                           role here that commits (required unless TOOLTX_AUTH_DIR gives signing/<role>.pem)
`
      : `  TOOLTX_SIGNING_KEY_FILE  Ed25519 private key (PKCS#8 PEM, mode 0600) that signs this service's receipts
                           (required; \`tooltx auth generate\` writes signing/${spec.name}.pem)
`
    : ''
}  TOOLTX_EXIT_WITH_PARENT  pid of the supervisor that started this process: stop when it is gone
                           (set by \`npm start\`; optional)
  Expected stream settings (as given to \`tooltx streams apply\`; optional; checked at start):
  TOOLTX_INTENTS_MAX_AGE_MS, TOOLTX_EVENTS_MAX_AGE_MS, TOOLTX_DECISIONS_MAX_AGE_MS,
  TOOLTX_RESULTS_MAX_AGE_MS, TOOLTX_PROJECTIONS_MAX_AGE_MS, TOOLTX_AUDITLOG_MAX_AGE_MS,
  TOOLTX_DUPLICATE_WINDOW_MS   retention and duplicate window, ms
  TOOLTX_REPLICAS          stream replicas (1-5)
  TOOLTX_MAX_DELIVER       deliveries of one message to a durable before its max-deliveries advisory
                           (default 50)${spec.envHelp ? `\n${spec.envHelp}` : ''}${toolsHelp}

A failure to start names the setting and its value on stderr and in a "failed to start" log line;
exits 2.`;
}

/**
 * The tools module's own settings for `--help`: the `settingsHelp` string the module exports
 * (settings of that module, not of tooltx), or how to see them when TOOLTX_TOOLS_MODULE is unset
 * or the module does not load.
 */
async function toolsModuleHelp(path: string | undefined): Promise<string> {
  if (!path?.trim()) return "\n\nThe tools module's own settings are listed here when TOOLTX_TOOLS_MODULE names it.";
  try {
    const m = (await import(pathToFileURL(isAbsolute(path) ? path : resolve(process.cwd(), path)).href)) as {
      settingsHelp?: unknown;
    };
    if (typeof m.settingsHelp !== 'string' || !m.settingsHelp.trim())
      return `\n\nThe tools module (${path}) lists no settings of its own.`;
    return `\n\nRead by the tools module (${path}) — settings of that module, not of tooltx:\n${m.settingsHelp.replace(/\n+$/, '')}`;
  } catch (err) {
    return `\n\nThe tools module (${path}) could not be loaded to list its settings: ${describeModuleError(path, err)}`;
  }
}

/** Why the tools module at `path` could not be loaded, in words that quote no file content (used by the services and `tooltx streams check`). */
export function describeModuleError(path: string, err: unknown): string {
  if (err instanceof ToolsModuleError) return err.problem;
  const code = (err as { code?: unknown }).code;
  if (code === 'ERR_MODULE_NOT_FOUND' || code === 'ERR_UNSUPPORTED_DIR_IMPORT' || code === 'ENOENT') {
    const abs = isAbsolute(path) ? path : resolve(process.cwd(), path);
    if (!existsSync(abs)) return `no such file (${String(code)})`;
    // Node's message names the specifier it could not find (code, never data).
    const missing = /Cannot find (?:module|package) '([^']{1,300})'/.exec((err as Error).message)?.[1];
    return missing
      ? `the module imports '${missing}', which cannot be found (${String(code)})`
      : `the module or one of its imports cannot be loaded (${String(code)})`;
  }
  if (err instanceof SyntaxError)
    return 'the module does not compile (SyntaxError); run it with `node --import tsx` to see where';
  return `the module threw while loading: ${describeError(err)}`;
}
