/**
 * The audit-projector role ({@link RoleSpec}): what it consumes, what it starts and how it stops. Run as a process
 * of its own by main.ts.
 */
import { z } from 'zod';
import { heldLimit, openBucket, startConsumerLoop } from '@tooltx/nats';
import { envInt, keyedDigest, ProjectionGuard, readKeyFile, SecretFileError } from '@tooltx/runtime';
import { defineRole } from '@tooltx/runtime/service';
import { TenantWatch } from '@tooltx/runtime/tenants';
import { AuditService, startOpsQueryService } from '@tooltx/readside';
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
});

export const auditProjectorRole = defineRole({
  name: 'audit-projector',
  summary:
    "projects the event log and the decision stream into one audit record per operation (KV <prefix>_audit, key <tenant>.<opId>) — no bodies — and answers auditors' queries on <prefix>.audit.<tenant>.<auditor>, recording each before answering, and operators' queries of operations across tenants on <prefix>.ops.query.<operator>",
  env: auditConfigSchema,
  envHelp: `  TOOLTX_AUDIT_HMAC_KEY_FILE key file (>= 32 characters, mode 0600) of the keyed HMACs in audit records (required)
  TOOLTX_AUDIT_BATCH_MS    how long an in-flight operation's events wait to be written with its next
                           ones as one record write, ms: an integer 0..60000 (default 1000; 0 = at once)`,
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
    return async () => {
      await Promise.all([service.stop(), opsQuery.stop()]);
      guard.stop();
      await handlers.flush();
      await Promise.all([events.stop(), decisions.stop()]);
    };
  },
});
