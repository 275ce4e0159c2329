/**
 * The fault matrix: the 32 situations tooltx must survive and what must hold in each, as data for
 * `npm run matrix` (scripts/matrix.ts) and its table. docs/fault-matrix.md shows the same table;
 * test/matrix-report.unit.test.ts keeps the two equal. Tests are tied to a row by naming its id
 * (`FM-27`) in their describe or test name.
 */

export interface FaultRow {
  /** `FM-01` … `FM-32`. */
  id: string;
  situation: string;
  mustHold: string;
}

export const FAULT_MATRIX: readonly FaultRow[] = [
  {
    id: 'FM-01',
    situation: 'two workers submit the same key at the same time',
    mustHold: 'one record; both get the same receipt',
  },
  {
    id: 'FM-02',
    situation: 'server commits, connection cut before the reply',
    mustHold: 'status query returns the original resource id; a retry writes nothing',
  },
  {
    id: 'FM-03',
    situation:
      "same key with other parameters (fields outside the key's target and intent), or a supplied key that does not match its request",
    mustHold: 'explicit `idempotency_conflict`; the original is untouched',
  },
  { id: 'FM-04', situation: 'same body, two different knowledge bases', mustHold: 'two keys, two records' },
  { id: 'FM-05', situation: 'whitespace, field order, equivalent time forms differ', mustHold: 'same key' },
  {
    id: 'FM-06',
    situation: 'forged tenant/actor in the payload',
    mustHold: 'rejected on the trusted server side, nothing written',
  },
  {
    id: 'FM-07',
    situation: 'role revoked between acceptance and execution',
    mustHold: 'rejected at execution, no partial artifact',
  },
  {
    id: 'FM-08',
    situation: 'resource transferred/frozen between check and commit',
    mustHold: 'version mismatch stops the commit',
  },
  { id: 'FM-09', situation: 'batch with one foreign item', mustHold: 'whole batch rejected, nothing written' },
  {
    id: 'FM-10',
    situation: 'alias, case, encoding, soft-deleted, guessed foreign id',
    mustHold: 'canonicalised; uniform not-found/forbidden',
  },
  {
    id: 'FM-11',
    situation: 'dependency times out before acceptance',
    mustHold: 'redeliver with the same key; one record',
  },
  { id: 'FM-12', situation: 'times out during the commit', mustHold: 'observe `running` until it resolves' },
  { id: 'FM-13', situation: 'times out after the commit', mustHold: 'continue with the committed receipt' },
  {
    id: 'FM-14',
    situation: 'unknown past the deadline',
    mustHold: 'takeover record complete; dependent writes frozen',
  },
  {
    id: 'FM-15',
    situation: 'bad params / forbidden / quota / dependency down',
    mustHold: 're-plan / re-authorise / stop or wait / bounded backoff',
  },
  { id: 'FM-16', situation: 'logs scanned for planted credentials and bodies', mustHold: 'zero hits' },
  { id: 'FM-17', situation: 'model output forged to claim success', mustHold: 'only a valid server receipt counts' },
  {
    id: 'FM-18',
    situation: 'errors shown to the model',
    mustHold: 'field paths for fixable input; uniform, non-leaking otherwise',
  },
  {
    id: 'FM-19',
    situation: 'tool output entering the model context',
    mustHold: 'only permitted fields; writes return a receipt only',
  },
  {
    id: 'FM-20',
    situation: 'original succeeds, compensation dependency fails',
    mustHold: 'partial state kept honestly, frozen, human takeover',
  },
  { id: 'FM-21', situation: 'the same compensation sent twice', mustHold: 'one withdraw request' },
  { id: 'FM-22', situation: 'compensation too late or in a disallowed state', mustHold: 'rejected' },
  { id: 'FM-23', situation: 'contract v2 registered while a task runs on v1', mustHold: 'task continues on v1' },
  {
    id: 'FM-24',
    situation: 'v2 adds a required authorisation field',
    mustHold: 'old requests never get a permissive default',
  },
  { id: 'FM-25', situation: "host's cached contract digest differs from registry", mustHold: 'writes refused' },
  {
    id: 'FM-26',
    situation: 'replay recorded success/reject/unknown histories',
    mustHold: 'a status query by each key returns its original receipt or outcome',
  },
  { id: 'FM-27', situation: 'executor killed mid-operation', mustHold: 'converges; no duplicate side effect' },
  { id: 'FM-28', situation: 'nats-server restarted mid-run', mustHold: 'nothing lost, no duplicate' },
  { id: 'FM-29', situation: 'one node of a 3-node cluster killed', mustHold: 'keeps working, nothing lost' },
  { id: 'FM-30', situation: 'retransmission after the dedup window', mustHold: 'still one operation' },
  {
    id: 'FM-31',
    situation: "a tenant reuses another tenant's message id or guesses its operation key",
    mustHold: "the victim's call still runs once; no cross-tenant read or write",
  },
  { id: 'FM-32', situation: "a user listens on another user's reply inbox", mustHold: 'refused by the server' },
];

const ROW_IDS = new Set(FAULT_MATRIX.map((r) => r.id));

/** The matrix's row ids a describe/test name (or a source file) names, in order, each once. */
export function rowIdsIn(text: string): string[] {
  const out: string[] = [];
  for (const m of text.matchAll(/\bFM-(\d\d)(?!\d)/g)) if (ROW_IDS.has(m[0]) && !out.includes(m[0])) out.push(m[0]);
  return out.sort();
}

/** A name pattern selecting the tests of `ids` (all rows when none are given). */
export function rowPattern(ids?: readonly string[]): RegExp {
  if (!ids || ids.length === 0) return /\bFM-\d\d(?!\d)/;
  return new RegExp(`\\b(${ids.map((id) => id.replace('-', '\\-')).join('|')})(?!\\d)`);
}

/** The counts a test reports with `figure()` (test/helpers/figures.ts) that feed the gates. */
export interface GateCounts {
  duplicates?: number;
  unknownTotal?: number;
  unknownConverged?: number;
  unauthorisedWrites?: number;
  leakedCanaries?: number;
  takeoverTotal?: number;
  takeoverComplete?: number;
  /** Floods of one tenant measured for the other tenants' p99 (docs/tenancy.md), and how many kept it within 2× of without. */
  floodsMeasured?: number;
  floodsWithin2x?: number;
}

export const GATE_COUNT_NAMES = [
  'duplicates',
  'unknownTotal',
  'unknownConverged',
  'unauthorisedWrites',
  'leakedCanaries',
  'takeoverTotal',
  'takeoverComplete',
  'floodsMeasured',
  'floodsWithin2x',
] as const satisfies readonly (keyof GateCounts)[];

/**
 * The gates of the whole matrix, each computed from the gate counts the tests report with
 * `figure()` (test/helpers/figures.ts): a sum that must be 0, or a share that must be 100 %.
 */
export interface GateDefinition {
  id: string;
  title: string;
  mustHold: string;
  /** `zero`: the sum of `count` must be 0. `all`: `count` must equal `of`, and `of` be above 0. */
  kind: 'zero' | 'all';
  count: keyof GateCounts;
  of?: keyof GateCounts;
}

export const GATES: readonly GateDefinition[] = [
  { id: 'duplicates', title: 'duplicate side effects', mustHold: '0', kind: 'zero', count: 'duplicates' },
  {
    id: 'unknown',
    title: 'unknown converged or handed over',
    mustHold: '100 %',
    kind: 'all',
    count: 'unknownConverged',
    of: 'unknownTotal',
  },
  { id: 'unauthorised', title: 'unauthorised writes', mustHold: '0', kind: 'zero', count: 'unauthorisedWrites' },
  { id: 'canaries', title: 'leaked canaries', mustHold: '0', kind: 'zero', count: 'leakedCanaries' },
  {
    id: 'takeover',
    title: 'takeover records complete',
    mustHold: '100 %',
    kind: 'all',
    count: 'takeoverComplete',
    of: 'takeoverTotal',
  },
  {
    id: 'tenant-p99',
    title: "other tenants' p99 under a flood ≤ 2× without",
    mustHold: '100 %',
    kind: 'all',
    count: 'floodsWithin2x',
    of: 'floodsMeasured',
  },
];
