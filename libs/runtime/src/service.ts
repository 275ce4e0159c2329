import { Command } from 'commander';
import { z } from 'zod';
import type { JetStreamClient, JetStreamManager } from '@nats-io/jetstream';
import { connectNats, jetStreamOf, OperationStore, Subjects, type NatsConnection } from '@tooltx/nats';
import { assertTopology, topology, type Topology, type TopologyOptions } from '@tooltx/streams';
import { loadReceiptSigner, type ReceiptSigner } from '@tooltx/lifecycle';
import { ConfigError, loadConfig, serviceConfigSchema } from './config.js';
import { createLogger, installProcessHandlers, type Logger } from './logger.js';
import { SecretFileError } from './secrets.js';
import { onShutdown } from './shutdown.js';
import { loadImplementations, type ImplementationRegistry } from './tools.js';

const optMs = z.coerce.number().int().positive().optional();

/** Stream settings read from the environment by the provisioner and every service (all ms). */
export const topologyEnvSchema = z.object({
  TOOLTX_INTENTS_MAX_AGE_MS: optMs,
  TOOLTX_EVENTS_MAX_AGE_MS: optMs,
  TOOLTX_DECISIONS_MAX_AGE_MS: optMs,
  TOOLTX_RESULTS_MAX_AGE_MS: optMs,
  TOOLTX_PROJECTIONS_MAX_AGE_MS: optMs,
  TOOLTX_AUDITLOG_MAX_AGE_MS: optMs,
  TOOLTX_DUPLICATE_WINDOW_MS: optMs,
  TOOLTX_REPLICAS: z.coerce.number().int().min(1).max(5).optional(),
  /** Deliveries of one message to a durable before the max-deliveries advisory (default 50). */
  TOOLTX_MAX_DELIVER: z.coerce.number().int().min(1).optional(),
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
  store: OperationStore;
  tools: ImplementationRegistry;
  /** The receipt signer (TOOLTX_SIGNING_KEY_FILE); set for services whose spec says `signsReceipts`. */
  signer?: ReceiptSigner;
}

/**
 * The composition root every service shares (shared/STYLE.md item 7): `--help` → config (fails fast
 * listing every problem, exit 2) → logger → trusted tools module → connect → check the streams
 * (refuses to start naming each broken setting, exit 2; never "ensures") → start → on SIGTERM or
 * SIGINT: stop, drain the connection, exit 0.
 */
export async function runService(spec: {
  name: string;
  summary: string;
  /** Extra lines for `--help` under "Environment:" (the service's own variables). */
  envHelp?: string;
  start: (ctx: ServiceContext) => Promise<() => Promise<void>>;
  /** This service appends `committed`: it needs TOOLTX_SIGNING_KEY_FILE (issue 9, FM-17). */
  signsReceipts?: boolean;
}): Promise<void> {
  new Command(`tooltx-${spec.name}`)
    .description(`tooltx ${spec.name}: ${spec.summary}`)
    .addHelpText(
      'after',
      `
Environment:
  NATS_URL                 server URLs, comma-separated (default nats://127.0.0.1:4222)
  NATS_CREDS_FILE          credentials file (optional)
  NATS_NKEY_FILE           nkey seed file (optional; written by \`tooltx auth generate\`)
  TOOLTX_PREFIX            subject prefix (default tooltx)
  TOOLTX_TOOLS_MODULE      path of the trusted module exporting \`implementations\` (required)
  TOOLTX_CONCURRENCY       operations handled at once (default 16)
  TOOLTX_INSTANCE_ID       name of this instance in logs and events (default host-pid)
  LOG_LEVEL                fatal|error|warn|info|debug|trace|silent (default info)
  TOOLTX_LOG_HMAC_KEY_FILE key file for the HMAC of error messages in logs (optional; mode 0600)
${spec.signsReceipts ? `  TOOLTX_SIGNING_KEY_FILE  Ed25519 private key (PKCS#8 PEM, mode 0600) that signs this service's receipts
                           (required; \`tooltx auth generate\` writes signing/${spec.name}.pem)
` : ''}  TOOLTX_*_MAX_AGE_MS, TOOLTX_DUPLICATE_WINDOW_MS, TOOLTX_REPLICAS  expected stream settings${spec.envHelp ? `\n${spec.envHelp}` : ''}`,
    )
    .parse(process.argv);

  let config: ServiceConfig;
  try {
    config = loadConfig(fullServiceConfigSchema);
  } catch (err) {
    if (err instanceof ConfigError) {
      process.stderr.write(`tooltx-${spec.name}: ${err.message}\n`);
      process.exit(2);
    }
    throw err;
  }
  let log: Logger;
  try {
    log = createLogger({ service: spec.name, instance: config.TOOLTX_INSTANCE_ID, level: config.LOG_LEVEL, hmacKeyFile: config.TOOLTX_LOG_HMAC_KEY_FILE });
  } catch (err) {
    if (!(err instanceof SecretFileError)) throw err;
    process.stderr.write(`tooltx-${spec.name}: invalid configuration:\n  - TOOLTX_LOG_HMAC_KEY_FILE: ${err.message}\n`);
    process.exit(2);
  }
  let signer: ReceiptSigner | undefined;
  if (spec.signsReceipts) {
    try {
      if (!config.TOOLTX_SIGNING_KEY_FILE) throw new Error('required: this service signs the receipts of what it commits');
      signer = loadReceiptSigner(config.TOOLTX_SIGNING_KEY_FILE);
    } catch (err) {
      process.stderr.write(`tooltx-${spec.name}: invalid configuration:\n  - TOOLTX_SIGNING_KEY_FILE: ${err instanceof SecretFileError || err instanceof Error ? err.message : String(err)}\n`);
      process.exit(2);
    }
  }
  // A crash is logged like everything else: never Node's default print of a message and stack.
  installProcessHandlers(log);
  let nc: NatsConnection | undefined;
  try {
    const tools = await loadImplementations(config.TOOLTX_TOOLS_MODULE);
    nc = await connectNats({
      servers: config.NATS_URL,
      name: `${spec.name}@${config.TOOLTX_INSTANCE_ID}`,
      credsFile: config.NATS_CREDS_FILE,
      nkeySeedFile: config.NATS_NKEY_FILE,
      // Replies to this service arrive only under its own inbox prefix (issue 5).
      inboxPrefix: `_INBOX._svc.${spec.name}`,
    });
    const { js, jsm } = await jetStreamOf(nc);
    const subjects = new Subjects(config.TOOLTX_PREFIX);
    const topo = topology(subjects, topologyOptionsFrom(config));
    await assertTopology(jsm, topo, {
      longestKeyRetentionMs: tools.contracts.longestKeyRetentionMs(),
      longestOperationMs: tools.longestOperationMs(),
    });
    const store = new OperationStore(js, jsm, subjects);
    const stop = await spec.start({ config, log, nc, js, jsm, subjects, topology: topo, store, tools, ...(signer ? { signer } : {}) });
    const conn = nc;
    let closing = false;
    void conn.closed().then((err) => {
      if (closing) return;
      log.fatal({ err }, 'connection closed unexpectedly');
      process.exit(1);
    });
    onShutdown(log, async () => {
      await stop();
      closing = true;
      await conn.drain();
    });
    log.info({ prefix: subjects.prefix, contracts: tools.contracts.all().map((c) => c.id) }, 'started');
  } catch (err) {
    log.fatal({ err }, 'failed to start');
    await nc?.close().catch(() => undefined);
    process.exit(2);
  }
}
