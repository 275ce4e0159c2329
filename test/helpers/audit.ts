import type { OperationEvent } from '@tooltx/lifecycle';
import { keyedDigest, readKeyFile } from '@tooltx/runtime';
import {
  applyEventToAudit,
  type AuditHmac,
  type AuditRecord,
} from '../../services/audit-projector/src/audit-record.js';

/** The audit HMAC under the key file a test's services use (`TOOLTX_AUDIT_HMAC_KEY_FILE` of `provisioned()`). */
export function auditHmacFrom(keyFile: string): AuditHmac {
  const key = readKeyFile(keyFile);
  return (purpose, value) => keyedDigest(key, `audit-${purpose}`, value);
}

/** The audit projection rule of events, in the `(current, event, seq)` form `fold` takes. */
export function auditRule(
  h: AuditHmac,
): (current: AuditRecord | null, event: OperationEvent, seq: number) => AuditRecord | null {
  return (current, event, seq) => applyEventToAudit(current, event, seq, h);
}
