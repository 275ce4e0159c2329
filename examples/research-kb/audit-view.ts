/**
 * The audit view of the demo: a few operations as an auditor sees them through the
 * audit service (never the bucket itself), and an export of the whole run — every query recorded
 * by the service before it answered.
 */
import type { NatsConnection } from '@nats-io/transport-node';
import { auditAnswerSchema, type AuditAnswer, type AuditRecord, type AuditRequest } from '@tooltx/lifecycle';
import { connectNats, decode, encode, Subjects } from '@tooltx/nats';

/** One request to the audit service; throws `Error` with the service's error class when it refuses. */
export async function askAudit(
  nc: NatsConnection,
  subject: string,
  req: AuditRequest,
): Promise<Exclude<AuditAnswer, { error: unknown }>> {
  const m = await nc.request(subject, encode(req), { timeout: 15_000 });
  const a = decode(auditAnswerSchema, m.data);
  if ('error' in a) throw new Error(`audit service refused the query: ${a.error.class}`);
  return a;
}

const time = (ms: number) => new Date(ms).toISOString().slice(11, 23);

/** A record in a few lines: who, which contract, the decisions, every state with its time, the outcome — no content. */
export function formatAuditRecord(label: string, r: AuditRecord): string {
  const auth = r.authorization?.execution ?? r.authorization?.intake;
  const lines = [
    `  ${label}: ${r.operationKey}  ${r.contract ?? '(no contract)'}  actor ${r.actor}  status ${r.status}${r.errorClass ? ` (${r.errorClass})` : ''}  side effect ${r.sideEffect}`,
    `    target ${r.targetHmac?.slice(0, 27) ?? '-'}…  result ${r.resultHmac ? `${r.resultHmac.slice(0, 27)}…` : '-'}  decision ${auth ? `${auth.decision} (${auth.policyVersion})` : '-'}${r.resolvedBy ? `  resolved by ${r.resolvedBy}` : ''}`,
  ];
  if (r.states.length)
    lines.push(
      `    states ${r.states.map((s) => `${s.event}${s.errorClass ? `:${s.errorClass}` : ''} ${time(s.at)}`).join(' → ')}`,
    );
  for (const d of r.decisions)
    lines.push(
      `    refused ${time(d.at)} actor ${d.actor}: ${d.errorClass}${d.policyVersion ? ` (${d.policyVersion})` : ''}`,
    );
  return lines.join('\n');
}

/**
 * Connects as `tenant`'s auditor `auditor`, shows each of `picks` (skipping null keys and keys the
 * tenant has no record of) and exports every record since `since`. Returns the shown records and
 * the export (for the leak scan) and the formatted view.
 */
export async function auditView(o: {
  natsUrl: string;
  prefix: string;
  seedFile: string;
  inboxPrefix: string;
  tenant: string;
  auditor: string;
  picks: { label: string; operationKey: string | null | undefined }[];
  since: number;
}): Promise<{ text: string; shown: AuditRecord[]; exported: AuditRecord[] }> {
  const nc = await connectNats({
    servers: o.natsUrl,
    name: `demo-auditor@${o.tenant}.${o.auditor}`,
    nkeySeedFile: o.seedFile,
    inboxPrefix: o.inboxPrefix,
    reconnectForever: false,
  });
  try {
    const subject = new Subjects(o.prefix).audit(o.tenant, o.auditor);
    const shown: AuditRecord[] = [];
    const text: string[] = [];
    // One operation picked twice (e.g. committed, then a conflicting request on its key) is shown once.
    const picks = new Map<string, string>();
    for (const p of o.picks)
      if (p.operationKey)
        picks.set(p.operationKey, picks.has(p.operationKey) ? `${picks.get(p.operationKey)}; ${p.label}` : p.label);
    for (const [operationKey, label] of picks) {
      const p = { operationKey, label };
      const a = await askAudit(nc, subject, { kind: 'show', operationKey: p.operationKey });
      if (a.kind !== 'show' || !a.record) continue;
      shown.push(a.record);
      text.push(formatAuditRecord(p.label, a.record));
    }
    const exported: AuditRecord[] = [];
    let after: string | undefined;
    let exportId: string | undefined;
    do {
      const a = await askAudit(nc, subject, {
        kind: 'export',
        format: 'jsonl',
        since: o.since,
        ...(exportId ? { exportId } : {}),
        ...(after ? { after } : {}),
      });
      if (a.kind !== 'export') break;
      exportId = a.exportId;
      exported.push(...a.records);
      after = a.next;
    } while (after);
    return { text: text.join('\n'), shown, exported };
  } finally {
    await nc.close();
  }
}
