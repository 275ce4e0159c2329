import { execFile } from 'node:child_process';
import { operationIdOf } from '@tooltx/contracts';
import type { AliasRecord, DecisionRecord, OperationState, RejectionRecord } from '@tooltx/lifecycle';
import type { TestNats } from './nats.js';

/** Polls the operation's last event until `done(state)` holds; throws with the last state on timeout. */
export async function waitForOperation(
  t: TestNats,
  tenant: string,
  operationKey: string,
  done: (s: OperationState) => boolean,
  timeoutMs = 20_000,
): Promise<OperationState> {
  const opId = operationIdOf(operationKey);
  const deadline = Date.now() + timeoutMs;
  let last: OperationState = { status: 'none' };
  while (Date.now() < deadline) {
    last = (await t.store.load(tenant, opId)).state;
    if (done(last)) return last;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`operation ${operationKey} did not reach the expected state; last: ${JSON.stringify(last)}`);
}

/** Polls `actor`'s decision subject of the key until its last record is a refusal; returns it. */
export async function waitForDecision(
  t: TestNats,
  tenant: string,
  operationKey: string,
  actor: string,
  timeoutMs = 20_000,
): Promise<RejectionRecord> {
  return (await waitForRecord(t, tenant, operationKey, actor, 'rejected', timeoutMs)) as RejectionRecord;
}

/** Polls `actor`'s decision subject of the key until its last record says it is an alias of another (FM-10). */
export async function waitForAlias(
  t: TestNats,
  tenant: string,
  operationKey: string,
  actor: string,
  timeoutMs = 20_000,
): Promise<AliasRecord> {
  return (await waitForRecord(t, tenant, operationKey, actor, 'aliased', timeoutMs)) as AliasRecord;
}

async function waitForRecord(
  t: TestNats,
  tenant: string,
  operationKey: string,
  actor: string,
  outcome: DecisionRecord['outcome'],
  timeoutMs: number,
): Promise<DecisionRecord> {
  const opId = operationIdOf(operationKey);
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    const d = await t.store.lastDecision(tenant, opId, actor);
    if (d?.outcome === outcome) return d;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`no ${outcome} decision for ${operationKey}`);
}

/** Every event on an operation's subject, in order (ordered read of the event log). */
export async function history(t: TestNats, tenant: string, operationKey: string) {
  const { operationEventSchema } = await import('@tooltx/lifecycle');
  const { decode } = await import('@tooltx/nats');
  const subject = t.subjects.op(tenant, operationIdOf(operationKey));
  const c = await t.js.consumers.get(t.subjects.eventsStream, { filter_subjects: subject });
  const out = [];
  const info = await t.jsm.streams.info(t.subjects.eventsStream, { subjects_filter: subject });
  const total = info.state.subjects?.[subject] ?? 0;
  if (total === 0) return [];
  const it = await c.fetch({ max_messages: total, expires: 2_000 });
  for await (const m of it) {
    out.push(decode(operationEventSchema, m.data));
    if (out.length >= total) break;
  }
  return out;
}

/** `tooltx takeover …` as operator `oscar` of `t`; resolves with the stdout lines parsed, rejects with stderr. */
export function takeoverCli(t: TestNats, ...args: string[]): Promise<Record<string, unknown>[]> {
  return new Promise((resolve, reject) =>
    execFile(
      process.execPath,
      ['--import', 'tsx', 'bin/tooltx.ts', 'takeover', ...args],
      {
        env: {
          PATH: process.env.PATH ?? '',
          NATS_URL: t.url,
          TOOLTX_PREFIX: t.subjects.prefix,
          NATS_NKEY_FILE: t.auth.seedFile({ kind: 'operator', operator: 'oscar' }),
          TOOLTX_OPERATOR: 'oscar',
        },
      },
      (err, out, stderr) =>
        err
          ? reject(new Error(`${err.message}: ${stderr}`))
          : resolve(
              out
                .split('\n')
                .filter(Boolean)
                .map((l) => JSON.parse(l) as Record<string, unknown>),
            ),
    ),
  );
}
