import { EffectClass, type ContractTiming, type DownstreamGuarantees, type KeyPolicy } from './contract.js';
import { ErrorClass } from './errors.js';

/**
 * What a downstream's failure becomes: an error class (the downstream definitively did NOT apply
 * the request: the run is `rejected` with that class) or `unknown` (the request may have been
 * applied: the error is passed on as it is, and the lifecycle decides — a read or computation is
 * rejected as retryable `dependency_unavailable`, a side effect becomes `unknown` and is probed,
 * FM-12, FM-13, FM-15).
 */
export type FailureOutcome =
  | typeof ErrorClass.InvalidInput
  | typeof ErrorClass.Forbidden
  | typeof ErrorClass.NotFound
  | typeof ErrorClass.QuotaExceeded
  | typeof ErrorClass.VersionConflict
  | typeof ErrorClass.DependencyUnavailable
  | typeof ErrorClass.Internal
  | 'unknown';
export const failureOutcomes = [
  ErrorClass.InvalidInput,
  ErrorClass.Forbidden,
  ErrorClass.NotFound,
  ErrorClass.QuotaExceeded,
  ErrorClass.VersionConflict,
  ErrorClass.DependencyUnavailable,
  ErrorClass.Internal,
  'unknown',
] as const satisfies readonly FailureOutcome[];

/**
 * HTTP status of a downstream's answer → what it means. Keys are a status (`'404'`) or a class of
 * statuses (`'4xx'`, `'5xx'`); the exact status wins, and a status matched by neither is `unknown`.
 */
export type FailureMapping = Readonly<Record<string, FailureOutcome>>;

/** The defaults one effect class gives a tool (`defineTool`): every one can be overridden field by field. */
export interface EffectDefaults {
  timing: ContractTiming;
  key: KeyPolicy;
  downstream: DownstreamGuarantees;
  /** How an HTTP failure of the downstream maps to an error class (the trusted half's `execute`). */
  failures: FailureMapping;
  /**
   * The intent when the tool gives none: `rest` = the normalised input minus the fields the target
   * names (every other field tells one operation from another); `none` = `{}` (the target within
   * the task is the operation: any other difference is an `idempotency_conflict`, FM-03).
   */
  intent: 'rest' | 'none';
  /** Whether the tool must name its target (no default: tooltx cannot guess what an irreversible effect acts upon). */
  targetRequired: boolean;
  /** Whether the tool must name its output (a read exists to return something; a write returns its receipt only, FM-19). */
  outputRequired: boolean;
}

const SECOND = 1_000;
const MINUTE = 60 * SECOND;
const DAY = 24 * 60 * MINUTE;

/**
 * Statuses that, by their HTTP meaning (RFC 9110, RFC 6585), refuse a request before anything is
 * done: definitively not applied, whatever the effect class. A 401 is the downstream refusing this
 * service's own credential — an operator's to fix, so the caller backs off rather than re-plans.
 */
const REFUSED: FailureMapping = {
  '400': ErrorClass.InvalidInput,
  '401': ErrorClass.DependencyUnavailable,
  '403': ErrorClass.Forbidden,
  '404': ErrorClass.NotFound,
  '410': ErrorClass.NotFound,
  '422': ErrorClass.InvalidInput,
  '429': ErrorClass.DependencyUnavailable,
};

/**
 * A read or computation: repeating it is harmless, so a refusal nobody listed is `internal` (the
 * caller backs off) and a server error is `dependency_unavailable` (retryable).
 */
const READ_FAILURES: FailureMapping = {
  ...REFUSED,
  '4xx': ErrorClass.Internal,
  '5xx': ErrorClass.DependencyUnavailable,
};

/**
 * A side effect: a failed precondition (If-Match, FM-07) refused it; any other 4xx — 409 above
 * all, which a downstream that honours the key answers when something else holds our key — and
 * every 5xx may come after the effect was applied, so they stay `unknown` for the probe (FM-13).
 */
const WRITE_FAILURES: FailureMapping = {
  ...REFUSED,
  '412': ErrorClass.VersionConflict,
  '4xx': 'unknown',
  '5xx': 'unknown',
};

/**
 * Per effect class, what `defineTool` fills in (docs/writing-tools.md has the reasons):
 * - timing: a read answers in seconds; a computation may take half a minute; a write gets 10 s, a
 *   charge 15 s (payment processors answer slower). `runningBoundMs` is three attempts' time, so a
 *   `running` operation is looked at only once its executor has certainly given up. An `unknown`
 *   write is probed for 5 min (15 min for send and charge: a person should not be called while
 *   the processor may still settle) before a person takes over (FM-14);
 * - key retention: 1 day for reads, 7 days for writes, 14 days for send and charge (a resumed
 *   task must not pay twice); all within the event log's default max age of 30 days
 *   (`TOOLTX_EVENTS_MAX_AGE_MS`), which a service checks at start (FM-30);
 * - downstream guarantees: a read's repeat has no effect, so it honours any key; a side effect's
 *   downstream is assumed to promise nothing (recovery then never runs a `not_found` attempt again
 *   on its own) until the tool says otherwise;
 * - failures: {@link READ_FAILURES} or {@link WRITE_FAILURES}; a charge adds 402 (payment refused:
 *   the payer is over its funds or limit) as `quota_exceeded`.
 */
export const EFFECT_DEFAULTS: Readonly<Record<EffectClass, EffectDefaults>> = deepFrozen({
  [EffectClass.Read]: {
    timing: { timeoutMs: 5 * SECOND, runningBoundMs: 15 * SECOND, unknownDeadlineMs: MINUTE },
    key: { scope: 'tenant', retentionMs: DAY },
    downstream: { honoursKey: true, enforcesDeadline: false },
    failures: READ_FAILURES,
    intent: 'rest',
    targetRequired: false,
    outputRequired: true,
  },
  [EffectClass.Compute]: {
    timing: { timeoutMs: 30 * SECOND, runningBoundMs: 90 * SECOND, unknownDeadlineMs: MINUTE },
    key: { scope: 'tenant', retentionMs: DAY },
    downstream: { honoursKey: true, enforcesDeadline: false },
    failures: READ_FAILURES,
    intent: 'rest',
    targetRequired: false,
    outputRequired: true,
  },
  [EffectClass.Create]: write({
    timeoutMs: 10 * SECOND,
    unknownDeadlineMs: 5 * MINUTE,
    retentionMs: 7 * DAY,
    intent: 'rest',
  }),
  [EffectClass.Update]: write({
    timeoutMs: 10 * SECOND,
    unknownDeadlineMs: 5 * MINUTE,
    retentionMs: 7 * DAY,
    intent: 'rest',
  }),
  [EffectClass.Delete]: write({
    timeoutMs: 10 * SECOND,
    unknownDeadlineMs: 5 * MINUTE,
    retentionMs: 7 * DAY,
    intent: 'rest',
  }),
  [EffectClass.Send]: write({
    timeoutMs: 10 * SECOND,
    unknownDeadlineMs: 15 * MINUTE,
    retentionMs: 14 * DAY,
    intent: 'none',
  }),
  [EffectClass.Charge]: write({
    timeoutMs: 15 * SECOND,
    unknownDeadlineMs: 15 * MINUTE,
    retentionMs: 14 * DAY,
    intent: 'none',
    failures: { '402': ErrorClass.QuotaExceeded },
  }),
});

/** The defaults of a side-effecting class; its target is required exactly when its intent defaults to none. */
function write(o: {
  timeoutMs: number;
  unknownDeadlineMs: number;
  retentionMs: number;
  intent: 'rest' | 'none';
  failures?: FailureMapping;
}): EffectDefaults {
  return {
    timing: { timeoutMs: o.timeoutMs, runningBoundMs: 3 * o.timeoutMs, unknownDeadlineMs: o.unknownDeadlineMs },
    key: { scope: 'tenant', retentionMs: o.retentionMs },
    downstream: { honoursKey: false, enforcesDeadline: false },
    failures: { ...WRITE_FAILURES, ...o.failures },
    intent: o.intent,
    targetRequired: o.intent === 'none',
    outputRequired: false,
  };
}

/**
 * What an HTTP `status` of the downstream means under `mapping`: the exact status, else its class
 * (`4xx`), else `unknown`. Pure.
 */
export function failureOutcomeOf(mapping: FailureMapping, status: number): FailureOutcome {
  return mapping[String(status)] ?? mapping[`${Math.floor(status / 100)}xx`] ?? 'unknown';
}

/** `value` frozen all the way down: the defaults are shared by every tool, so no tool may change them for another. */
function deepFrozen<T>(value: T): T {
  if (value && typeof value === 'object') {
    for (const v of Object.values(value)) deepFrozen(v);
    Object.freeze(value);
  }
  return value;
}
