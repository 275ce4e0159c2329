/**
 * The audit-projector role ({@link RoleSpec}): what it consumes, what it starts and how it stops. Run as a process
 * of its own by main.ts.
 */
import { z } from 'zod';
import { heldLimit, openBucket, startConsumerLoop } from '@tooltx/nats';
import { envInt, keyedDigest, ProjectionGuard, readKeyFile, RegistryMirror, SecretFileError } from '@tooltx/runtime';
import { defineRole } from '@tooltx/runtime/service';
import { TenantWatch } from '@tooltx/runtime/tenants';
import { AuditService, startAutoRevert, startContractsService, startOpsQueryService } from '@tooltx/readside';
import { Durables } from '@tooltx/streams';
import { auditHandlers, auditRebuilder } from './apply.js';
import type { AuditHmac } from './audit-record.js';

const auditConfigSchema = z.object({
  /**
   * Key file of the audit HMACs (targets, result digests, resource ids); the same for every
   * instance and every rebuild. Read while the environment is parsed: a missing, open or short key
   * is a configuration problem listed with the others (exit 2), before anything connects.
   */
  TOOLTX_AUDIT_HMAC_KEY_FILE: z
    .string({ error: 'required: the key file of the audit HMACs (>= 32 characters, mode 0600)' })
    .min(1)
    .transform((file, ctx) => {
      try {
        return readKeyFile(file);
      } catch (err) {
        if (!(err instanceof SecretFileError)) throw err;
        ctx.addIssue({ code: 'custom', message: err.message });
        return z.NEVER;
      }
    }),
  /**
   * How long an in-flight operation's events wait to be written together with its next ones, ms
   * (default 1000; 0 = every event at once). A record shows an in-flight state up to this late.
   */
  TOOLTX_AUDIT_BATCH_MS: envInt(0, 60_000).default(1_000),
  /**
   * The automatic revert (docs/contracts.md): a contract name whose current version's ratio of
   * calls that went wrong (conflicts, rejections, unknowns) reaches this (0..1) for at least
   * TOOLTX_REVERT_MIN_TENANTS tenants, each with at least TOOLTX_REVERT_MIN_COUNT calls on it in
   * TOOLTX_REVERT_WINDOW_MS, is reverted to its previous version. Unset: off.
   */
  TOOLTX_REVERT_THRESHOLD: z.coerce.number().min(0).max(1).optional(),
  TOOLTX_REVERT_MIN_COUNT: envInt(1, 1_000_000).default(20),
  TOOLTX_REVERT_MIN_TENANTS: envInt(1, 100_000).default(2),
  TOOLTX_REVERT_WINDOW_MS: envInt(1_000, 7 * 24 * 3_600_000).default(600_000),
  TOOLTX_REVERT_CHECK_MS: envInt(100, 3_600_000).default(60_000),
});

export const auditProjectorRole = defineRole({
  name: 'audit-projector',
  summary:
    "projects the event log and the decision stream into one audit record per operation (KV <prefix>_audit, key <tenant>.<opId>) — no bodies — and answers auditors' queries on <prefix>.audit.<tenant>.<auditor>, recording each before answering, and operators' queries of operations across tenants on <prefix>.ops.query.<operator>, and operators' contract registry commands on <prefix>.ops.contracts.<operator>",
  env: auditConfigSchema,
  envHelp: `  TOOLTX_AUDIT_HMAC_KEY_FILE key file (>= 32 characters, mode 0600) of the keyed HMACs in audit records (required)
  TOOLTX_AUDIT_BATCH_MS    how long an in-flight operation's events wait to be written with its next
                           ones as one record write, ms: an integer 0..60000 (default 1000; 0 = at once)
  TOOLTX_REVERT_THRESHOLD  revert a contract name automatically when its current version's ratio of
                           calls that went wrong (conflicts, rejections, unknowns) reaches this, 0..1,
                           for enough tenants (default: off)
  TOOLTX_REVERT_MIN_COUNT  fewest calls of that version by one tenant in the window before its ratio
                           counts (default 20)
  TOOLTX_REVERT_MIN_TENANTS fewest tenants over the ratio before a name is reverted (default 2; 1 for
                           a deployment with one tenant)
  TOOLTX_REVERT_WINDOW_MS  the window of that ratio, ms (default 600000)
  TOOLTX_REVERT_CHECK_MS   how often the ratio is checked, ms (default 60000; each check reads the
                           audit records of the window)`,
  async start({ subjects, log, js, jsm, nc, config, env, topology, colocation }) {
    const key = env.TOOLTX_AUDIT_HMAC_KEY_FILE;
    const hmac: AuditHmac = (purpose, value) => keyedDigest(key, `audit-${purpose}`, value);
    const kv = await openBucket(nc, subjects.auditBucket);
    // The records are on memory storage: gone after a server restart, then rebuilt from the event
    // log and every listed tenant's decision stream (@tooltx/runtime ProjectionGuard). Writes wait
    // until the bucket is whole; queries are answered "retry later" meanwhile (AuditService).
    let tenants: () => string[] = () => [];
    const guard = new ProjectionGuard({
      nc,
      js,
      jsm,
      bucket: topology.projections.audit,
      log,
      sources: () => [
        { stream: subjects.eventsStream, filter: subjects.allOps },
        ...tenants().map((t) => ({ stream: subjects.decisionsStream(t), filter: subjects.decisionsOf(t) })),
      ],
      rebuilder: () => auditRebuilder({ subjects, kv, hmac, log: log.child({ component: 'rebuild' }) }),
    });
    // Waiting operations are bounded so their unacked events (up to 3 each) stay under the durable's
    // max_ack_pending with the loop's own in-flight ones.
    const maxHeld = colocation.eventLog
      ? await colocation.eventLog.heldLimit(jsm, subjects.eventsStream, config.TOOLTX_CONCURRENCY)
      : await heldLimit(jsm, subjects.eventsStream, Durables.auditProjector, config.TOOLTX_CONCURRENCY);
    const handlers = auditHandlers({ subjects, kv, hmac, log, batchMs: env.TOOLTX_AUDIT_BATCH_MS, maxHeld, guard });
    // A process hosting every role reads the log once for all of them (its own durable unused).
    const events =
      colocation.eventLog?.register('audit-projector', handlers.events) ??
      (await startConsumerLoop({
        js,
        stream: subjects.eventsStream,
        durable: Durables.auditProjector,
        concurrency: config.TOOLTX_CONCURRENCY,
        log,
        handle: handlers.events,
      }));
    // Each tenant's decision records, from its own stream (docs/tenancy.md).
    const decisions = new TenantWatch(
      await openBucket(nc, subjects.tenantsBucket),
      log.child({ component: 'tenants' }),
      (tenant) =>
        startConsumerLoop({
          js,
          stream: subjects.decisionsStream(tenant),
          durable: Durables.auditDecisions,
          concurrency: config.TOOLTX_CONCURRENCY,
          log: log.child({ tenant }),
          handle: handlers.decisions,
        }),
    );
    await decisions.start();
    await Promise.race([decisions.ready(), new Promise((r) => setTimeout(r, 10_000).unref())]);
    // The tenants are known now (the watch has loaded the tenants bucket): the first look may rebuild.
    tenants = () => decisions.tenants;
    guard.start();
    const service = new AuditService({
      nc,
      js,
      kv,
      subjects,
      log: log.child({ component: 'audit-query' }),
      instance: config.TOOLTX_INSTANCE_ID,
      rebuilding: () => guard.rebuilding,
    });
    service.start();
    // Operators' queries of operations across tenants (granted `query`): the same records.
    const opsQuery = startOpsQueryService({
      nc,
      kv,
      subjects,
      log: log.child({ component: 'ops-query' }),
      rebuilding: () => guard.rebuilding,
    });
    // Operators' contract registry commands and usage (granted `contracts`, docs/contracts.md), and
    // the automatic revert when a threshold is set: both read these audit records.
    const registryKv = await openBucket(nc, subjects.contractsBucket);
    const registry = new RegistryMirror(registryKv, log.child({ component: 'contract-registry' }));
    await registry.start();
    const contractsDeps = {
      nc,
      registryKv,
      registry,
      auditKv: kv,
      subjects,
      log: log.child({ component: 'contracts' }),
      rebuilding: () => guard.rebuilding,
    };
    const contracts = startContractsService(contractsDeps);
    const stopAutoRevert =
      env.TOOLTX_REVERT_THRESHOLD === undefined
        ? async () => undefined
        : startAutoRevert(
            contractsDeps,
            {
              ratio: env.TOOLTX_REVERT_THRESHOLD,
              minCount: env.TOOLTX_REVERT_MIN_COUNT,
              minTenants: env.TOOLTX_REVERT_MIN_TENANTS,
              windowMs: env.TOOLTX_REVERT_WINDOW_MS,
            },
            env.TOOLTX_REVERT_CHECK_MS,
          );
    return async () => {
      await stopAutoRevert();
      await Promise.all([service.stop(), opsQuery.stop(), contracts.stop()]);
      await registry.stop();
      guard.stop();
      await handlers.flush();
      await Promise.all([events.stop(), decisions.stop()]);
    };
  },
});
