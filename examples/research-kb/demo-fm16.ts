/**
 * The demo's FM-16 part, kept apart from the demo's own flow: plants the five canary kinds
 * in the run, prints the audit view of a few operations through the audit service (as the tenant's
 * auditor), and scans everything the run produced — every log file, every stream but the intent
 * and result stores (raw and decoded), the audit export, every result the agents got back.
 */
import { readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { createTools, type ExecuteRequest, type ExecuteResult, type Tools } from '@tooltx/client';
import type { Contract } from '@tooltx/contracts';
import { connectNats, jetStreamOf, Subjects } from '@tooltx/nats';
import { auditView } from './audit-view.js';
import { CanaryWeb, LeakScanner, newCanaries, plantCanaries, type Canaries, type Leak } from './canaries.js';
import type { Stack } from '@tooltx/dev/stack';

export { CanaryWeb, newCanaries, type Canaries };

export interface Fm16Result {
  /** Canary kinds that verifiably reached their place (5). */
  canariesPlanted: number;
  /** Occurrences of a canary anywhere it must not be (0). */
  leakedSecrets: number;
  leaks: Leak[];
  /** Items scanned: log lines, stream messages, records, results. */
  scanned: number;
  /** The audit view, ready to print. */
  auditText: string;
}

/** Waits until no file in `dir` has grown for `quietMs` (at most `maxMs`): the services' last lines are on disk. */
async function logsSettled(dir: string, quietMs = 1_000, maxMs = 10_000): Promise<void> {
  const size = () => readdirSync(dir).reduce((n, f) => n + statSync(join(dir, f)).size, 0);
  const until = Date.now() + maxMs;
  let last = size();
  while (Date.now() < until) {
    await new Promise((r) => setTimeout(r, quietMs));
    const now = size();
    if (now === last) return;
    last = now;
  }
}

/**
 * Runs the FM-16 part against a running stack. `agent` is the demo's agent (tenant `tenant`);
 * `rivalActor` of `rival` writes the note-body canary into its own knowledge base `kb` (so the
 * demo's own tenant's row count is untouched); `conflictOf` is a committed write of the demo,
 * resubmitted with another `fetchedAt` to show a conflict; `unknownResolved` a key that went
 * through unknown and was resolved, when there is one.
 */
export async function runFm16(o: {
  stack: Stack;
  prefix: string;
  canaries: Canaries;
  web: CanaryWeb;
  agent: Tools;
  contracts: Contract[];
  tenant: string;
  auditor: string;
  rival: string;
  rivalActor: string;
  kb: string;
  taskId: string;
  logsDir: string;
  since: number;
  committed?: string | undefined;
  conflictOf?: ExecuteRequest | undefined;
  unknownResolved?: string | undefined;
}): Promise<Fm16Result> {
  const rivalRole = { kind: 'agent' as const, tenant: o.rival, actor: o.rivalActor };
  const writer = await createTools({
    servers: o.stack.natsUrl,
    tenant: o.rival,
    actor: o.rivalActor,
    nkeyFile: o.stack.seedFile(rivalRole),
    contracts: o.contracts,
    prefix: o.prefix,
    receiptKeys: o.stack.receiptKeysFile,
  });
  const returned: ExecuteResult[] = [];
  let planted: Awaited<ReturnType<typeof plantCanaries>>;
  try {
    planted = await plantCanaries({
      canaries: o.canaries,
      web: o.web,
      kbUrl: o.stack.kbUrl,
      reader: o.agent,
      writer,
      kb: o.kb,
      taskId: `${o.taskId}-canary`,
    });
    returned.push(...planted.returned);
  } finally {
    await writer.close();
  }
  // The same key with another fetch time: an explicit idempotency_conflict, nothing written.
  if (o.conflictOf) {
    const input = o.conflictOf.input as Record<string, unknown>;
    returned.push(
      await o.agent.execute({
        ...o.conflictOf,
        input: { ...input, fetchedAt: new Date(Date.parse(String(input.fetchedAt)) + 60_000).toISOString() },
      }),
    );
  }

  const auditorRole = { kind: 'auditor' as const, tenant: o.tenant, actor: o.auditor };
  // The audit projection runs behind the event log: give it a moment to catch up with the last calls.
  await new Promise((r) => setTimeout(r, 1_500));
  const view = await auditView({
    natsUrl: o.stack.natsUrl,
    prefix: o.prefix,
    seedFile: o.stack.seedFile(auditorRole),
    inboxPrefix: o.stack.inboxPrefix(auditorRole),
    tenant: o.tenant,
    auditor: o.auditor,
    since: o.since,
    picks: [
      { label: 'committed', operationKey: o.committed },
      { label: 'rejected (a page that failed; its error text is not here)', operationKey: planted.keys.flaky },
      {
        label: 'then a conflicting request (same key, another input)',
        operationKey: o.conflictOf ? (returned.at(-1)?.operationKey ?? null) : null,
      },
      { label: 'unknown → resolved', operationKey: o.unknownResolved },
    ],
  });

  const scan = new LeakScanner(o.canaries);
  scan.returned('returned to an agent', returned);
  for (const r of [...view.shown, ...view.exported]) scan.text('audit record', JSON.stringify(r));
  scan.text('audit view', view.text);
  const nc = await connectNats({
    servers: o.stack.natsUrl,
    name: 'demo-fm16-scan',
    nkeySeedFile: o.stack.seedFile({ kind: 'provisioner' }),
    inboxPrefix: o.stack.inboxPrefix({ kind: 'provisioner' }),
    reconnectForever: false,
  });
  try {
    const { js, jsm } = await jetStreamOf(nc);
    await scan.streams(js, jsm, new Subjects(o.prefix));
  } finally {
    await nc.close();
  }
  await logsSettled(o.logsDir);
  scan.logDir(o.logsDir);
  return {
    canariesPlanted: planted.planted,
    leakedSecrets: scan.leaks.length,
    leaks: scan.leaks,
    scanned: scan.scanned,
    auditText: `\n  audit view (as ${o.tenant}/${o.auditor}, through the audit service; ${view.exported.length} records exported)\n${view.text}\n`,
  };
}
