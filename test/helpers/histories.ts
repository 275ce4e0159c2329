import { operationIdOf, type EffectClass, type ErrorInfo } from '@tooltx/contracts';
import { decide, type OperationCommand, type OperationEvent, type OperationState } from '@tooltx/lifecycle';
import { TEST_SIGNER } from './signing.js';

/**
 * Sample operation histories built with the real decider (no hand-written events): one per kind,
 * covering every state the projections distinguish. Deterministic: ids and times come from the
 * operation's index. Used by the projection unit tests and the projection e2e test.
 */

/** Text planted in a rejection's issue message: no projection may ever carry it. */
export const PLANTED_ERROR_TEXT = 'PLANTED-secret-note-body-8f3a';

export type HistoryKind = 'committed' | 'retried_unknown' | 'read_failed' | 'accepted' | 'running' | 'refused';
export const historyKinds: HistoryKind[] = [
  'committed',
  'retried_unknown',
  'read_failed',
  'accepted',
  'running',
  'refused',
];

export interface SampleOperation {
  kind: HistoryKind;
  tenant: string;
  operationKey: string;
  opId: string;
  effect: EffectClass;
  events: OperationEvent[];
}

const D = (c: string) => `sha256:${c.repeat(64)}`;
const EFFECT: Record<HistoryKind, EffectClass> = {
  committed: 'create',
  retried_unknown: 'send',
  read_failed: 'read',
  accepted: 'update',
  running: 'charge',
  refused: 'delete',
};

/** One history of `kind` for operation number `i` of `tenant`. */
export function sampleOperation(kind: HistoryKind, i: number, tenant = 'acme'): SampleOperation {
  const operationKey = `opk_${kind.replace(/_/g, '-').padEnd(20, 'x')}${String(i).padStart(23, '0')}`;
  const effect = EFFECT[kind];
  const t0 = 1_750_000_000_000 + i * 10_000;
  let step = 0;
  let state: OperationState = { status: 'none' };
  const events: OperationEvent[] = [];
  const eventId = () => `evt-${tenant}-${i}-${step}`.padEnd(12, '0');
  const next = (make: (at: number) => OperationCommand) => {
    step++;
    const d = decide(make(t0 + step * 100), state, { signer: TEST_SIGNER });
    if (d.kind !== 'append') throw new Error(`sample ${kind}: expected append, got ${d.kind}`);
    events.push(d.event);
    state = d.event.state;
  };
  const attempt = () => (state.status === 'none' ? 1 : state.attempt);
  const accept = (intentSeq: number) =>
    next((at) => ({
      type: 'accept',
      eventId: eventId(),
      at,
      operationKey,
      tenant,
      actor: intentSeq > 1 ? 'bob' : 'alice',
      taskId: `task-${i}`,
      tool: 'kb.write_note',
      version: 2,
      contractDigest: D('c'),
      effect,
      inputDigest: D('1'),
      targetDigest: D('7'),
      intentSeq,
      submissionId: `sub-${i}-${intentSeq}`,
    }));
  const start = () =>
    next((at) => ({
      type: 'start',
      eventId: eventId(),
      at,
      attempt: attempt(),
      executor: 'ex-1',
      deadlineAt: at + 5_000,
    }));
  const reject = (error: ErrorInfo) =>
    next((at) => ({ type: 'reject', eventId: eventId(), at, attempt: attempt(), error }));

  accept(1);
  switch (kind) {
    case 'committed':
      start();
      next((at) => ({
        type: 'commit',
        eventId: eventId(),
        at,
        attempt: attempt(),
        resourceId: `note-${i}`,
        resultDigest: D('e'),
      }));
      break;
    case 'retried_unknown':
      reject({ class: 'quota_exceeded', retryAfterMs: 60_000 });
      accept(2);
      start();
      next((at) => ({
        type: 'mark_unknown',
        eventId: eventId(),
        at,
        attempt: attempt(),
        evidence: { kind: 'timeout', at, elapsedMs: 5_000 },
      }));
      break;
    case 'read_failed':
      start();
      reject({ class: 'dependency_unavailable' });
      break;
    case 'accepted':
      break;
    case 'running':
      start();
      break;
    case 'refused':
      reject({ class: 'invalid_input', issues: [{ path: ['body'], code: 'too_big', message: PLANTED_ERROR_TEXT }] });
      break;
  }
  return { kind, tenant, operationKey, opId: operationIdOf(operationKey), effect, events };
}

/** `perKind` operations of every kind for `tenant`, numbered from `from`. */
export function sampleOperations(perKind = 1, tenant = 'acme', from = 0): SampleOperation[] {
  const out: SampleOperation[] = [];
  let i = from;
  for (let n = 0; n < perKind; n++) for (const kind of historyKinds) out.push(sampleOperation(kind, i++, tenant));
  return out;
}

/** A deterministic shuffle (mulberry32), so a failing order can be replayed from its seed. */
export function shuffled<T>(items: readonly T[], seed: number): T[] {
  let a = seed >>> 0;
  const rand = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const out = [...items];
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(rand() * (i + 1));
    [out[i], out[j]] = [out[j]!, out[i]!];
  }
  return out;
}

/** A log entry as a projection sees it: the event, its operation's key, and its stream sequence. */
export interface LogEntry {
  key: string;
  event: OperationEvent;
  seq: number;
}

/**
 * Interleaves the histories round-robin into one log (step 1 of every operation, then step 2, …),
 * numbering stream sequences from `firstSeq`, so one operation's events are spread over the log.
 */
export function interleave(ops: SampleOperation[], firstSeq = 1): LogEntry[] {
  const out: LogEntry[] = [];
  let seq = firstSeq;
  const longest = Math.max(...ops.map((o) => o.events.length));
  for (let step = 0; step < longest; step++) {
    for (const o of ops) {
      const e = o.events[step];
      if (e) out.push({ key: `${o.tenant}.${o.opId}`, event: e, seq: seq++ });
    }
  }
  return out;
}

/** Folds log entries, in the order given, through a projection rule into `key → value`. */
export function fold<T>(
  entries: readonly LogEntry[],
  rule: (current: T | null, event: OperationEvent, seq: number) => T | null,
): Map<string, T> {
  const out = new Map<string, T>();
  for (const { key, event, seq } of entries) {
    const next = rule(out.get(key) ?? null, event, seq);
    if (next !== null) out.set(key, next);
  }
  return out;
}
