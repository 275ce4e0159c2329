/**
 * tooltx audit-projector — keeps one audit record per operation in KV `<prefix>_audit` under
 * `<tenant>.<opId>` (see `audit-record.ts`), fed by the event log (durable
 * `audit-projector`) and the decision stream (durable `audit-decisions`): who, which contract,
 * a keyed HMAC of the target, the authorisation decisions and policy versions, side effect or
 * not, every state with its time, error class, a keyed HMAC of the result digest, who resolved it
 * by hand — never a body, input, result, token or raw error text. Records are written with
 * compare-and-set and are the same whatever order the messages arrive in, so any number of
 * instances may run and a rebuild from the streams gives the same records.
 *
 * Also serves the auditors' query service (`AuditService` of `@tooltx/readside`):
 * `<prefix>.audit.<tenant>.<auditor>`, queue group `tooltx-audit`; each query is recorded in
 * `<P>_AUDITLOG` before it is answered.
 *
 * Usage: `tsx services/audit-projector/src/main.ts [--help]`. Same environment as the executor,
 * plus TOOLTX_AUDIT_HMAC_KEY_FILE (required). Stops cleanly on SIGTERM/SIGINT: stops taking
 * queries and pulling, finishes in-flight work, drains.
 */
import { runService } from '@tooltx/runtime/service';
import { auditProjectorRole } from './role.js';

await runService(auditProjectorRole);
