/**
 * One error taxonomy for tooltx, classified by what the caller should do next
 * (FM-15, FM-18).
 *
 * Every error that crosses a boundary (decision subject, event, status answer, SDK result)
 * carries only a {@link ErrorClass}, optional field paths for fixable input, and an optional
 * `retryAfterMs`. Never a database exception, a stack trace, an internal enum or the request body.
 */
export const ErrorClass = {
  /** The input does not satisfy the contract's shape. Fixable: re-plan with the field paths. */
  InvalidInput: 'invalid_input',
  /** The authenticated actor may not do this (also used when the payload claims another identity). */
  Forbidden: 'forbidden',
  /** The target does not exist or is not visible to the caller; uniform with forbidden across tenants. */
  NotFound: 'not_found',
  /** The quota's owner is over quota; `retryAfterMs` says when to come back. */
  QuotaExceeded: 'quota_exceeded',
  /** The same operation key with another input, or a supplied key that does not match its request. */
  IdempotencyConflict: 'idempotency_conflict',
  /**
   * The resource's authorisation version changed between the check and the commit (owner, state,
   * alias, membership or role): nothing was written; a new attempt re-checks (FM-07, FM-08).
   */
  VersionConflict: 'version_conflict',
  /** A dependency did not answer in time or refused transiently; retry with bounded backoff. */
  DependencyUnavailable: 'dependency_unavailable',
  /** The task is frozen behind an unresolved operation; a person must take over. */
  TaskFrozen: 'task_frozen',
  /**
   * A person resolved an operation under takeover as not applied: definitively nothing
   * happened, and the identical input may be submitted again (a new attempt under the same key).
   */
  NotApplied: 'not_applied',
  /** The caller's cached contract differs from the registry's. */
  ContractMismatch: 'contract_mismatch',
  /**
   * The operation cannot be compensated: its contract declares no compensation, it is not in a
   * state the declaration allows (only `committed` by default: never `rejected`, `unknown`,
   * `running` or `rolled_back`), it is itself a compensation (a failed compensation is never
   * compensated in turn), or another compensation of it was already requested (FM-22).
   * Nothing was sent.
   */
  CompensationNotAllowed: 'compensation_not_allowed',
  /**
   * The compensation was asked for after the deadline its contract declares, counted from the
   * commit: the effect stands and a person decides what to do with it (FM-22). Nothing was sent.
   */
  CompensationExpired: 'compensation_expired',
  /**
   * The held-back operation was discarded, by a caller or at its confirmation deadline, before its
   * side effect ran (`rolled_back`): it can no longer be confirmed, and nothing external happened.
   */
  OperationDiscarded: 'operation_discarded',
  /**
   * The contract version was retired (`tooltx contracts retire`, or its deprecation's sunset has
   * passed): a new intent on it is refused and nothing is registered; the issue names the versions
   * to use (docs/contracts.md). Keys registered before still answer their outcome.
   */
  ContractRetired: 'contract_retired',
  /**
   * The contract version was reverted with `--stop-running`: a task running on it takes no further
   * step on it; re-plan on the version the issue names (docs/contracts.md). Nothing was registered.
   */
  ContractWithdrawn: 'contract_withdrawn',
  /** Something on the trusted side failed in a way that carries no caller-fixable meaning. */
  Internal: 'internal',
} as const;
export type ErrorClass = (typeof ErrorClass)[keyof typeof ErrorClass];
export const errorClasses = Object.values(ErrorClass) as [ErrorClass, ...ErrorClass[]];

/** What a caller (agent scheduler) should do next after an error of each class. */
export const NextAction = {
  Replan: 'replan',
  Reauthorise: 'reauthorise',
  WaitOrStop: 'wait_or_stop',
  Backoff: 'backoff',
  Observe: 'observe',
  HandOver: 'hand_over',
  RefreshContract: 'refresh_contract',
  /** A held-back call waits: show its preview to whoever decides, then `tools.confirm` or `tools.discard` it. */
  ConfirmOrDiscard: 'confirm_or_discard',
} as const;
export type NextAction = (typeof NextAction)[keyof typeof NextAction];

export const nextActionFor: Readonly<Record<ErrorClass, NextAction>> = {
  invalid_input: NextAction.Replan,
  forbidden: NextAction.Reauthorise,
  not_found: NextAction.Replan,
  quota_exceeded: NextAction.WaitOrStop,
  idempotency_conflict: NextAction.Replan,
  version_conflict: NextAction.Reauthorise,
  dependency_unavailable: NextAction.Backoff,
  task_frozen: NextAction.HandOver,
  not_applied: NextAction.Backoff,
  contract_mismatch: NextAction.RefreshContract,
  compensation_not_allowed: NextAction.Replan,
  compensation_expired: NextAction.HandOver,
  operation_discarded: NextAction.Replan,
  contract_retired: NextAction.RefreshContract,
  contract_withdrawn: NextAction.Replan,
  internal: NextAction.Backoff,
};

/** A correctable problem at one field: `path` is the field path inside the envelope or input. */
export interface FieldIssue {
  path: (string | number)[];
  code: string;
  message: string;
}

/** The wire shape of an error: what may be shown to a model or written to an event. */
export interface ErrorInfo {
  class: ErrorClass;
  issues?: FieldIssue[];
  retryAfterMs?: number;
}

/**
 * A classified error thrown inside tooltx. `message` is for operators' logs and must not carry
 * secrets or bodies; {@link toErrorInfo} is what leaves the process.
 */
export class TooltxError extends Error {
  readonly class: ErrorClass;
  readonly issues: FieldIssue[] | undefined;
  readonly retryAfterMs: number | undefined;
  constructor(
    cls: ErrorClass,
    message: string,
    opts: { issues?: FieldIssue[]; retryAfterMs?: number; cause?: unknown } = {},
  ) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = 'TooltxError';
    this.class = cls;
    this.issues = opts.issues;
    this.retryAfterMs = opts.retryAfterMs;
  }
  /** True when retrying the same request later may succeed without re-planning. */
  get retryable(): boolean {
    return this.class === ErrorClass.DependencyUnavailable || this.class === ErrorClass.Internal;
  }
  toInfo(): ErrorInfo {
    return toErrorInfo(this);
  }
}

/**
 * How much an error may carry across a boundary: a refusal is recorded (decision subject, event)
 * and answered, so its size must not follow the size of the input that caused it — 100,000
 * unknown fields, or one field name of 900 kB, still make a refusal of a few kB.
 */
export const ERROR_BOUNDS = {
  /** Issues listed; beyond it one `more_issues` issue says how many more there were. */
  issues: 20,
  /** Segments of one path kept; a deeper path ends with a `…` segment. */
  pathSegments: 16,
  /** Characters of one path segment (a field name) kept. */
  segmentChars: 64,
  codeChars: 64,
  messageChars: 300,
} as const;

const clip = (s: string, n: number) => (s.length > n ? `${s.slice(0, n)}…` : s);

/** `issues` within {@link ERROR_BOUNDS}: the first ones, each path, code and message clipped. Pure. */
export function boundIssues(issues: readonly FieldIssue[], total = issues.length): FieldIssue[] {
  const b = ERROR_BOUNDS;
  // Already bounded (its last issue counts the rest): kept as it is, so bounding twice changes nothing.
  const bounded = issues.length === b.issues + 1 && issues.at(-1)?.code === 'more_issues';
  const out = issues.slice(0, bounded ? issues.length : b.issues).map((i) => {
    const path = i.path.slice(0, b.pathSegments).map((p) => (typeof p === 'string' ? clip(p, b.segmentChars) : p));
    if (i.path.length > b.pathSegments) path.push('…');
    return { path, code: clip(String(i.code), b.codeChars), message: clip(String(i.message), b.messageChars) };
  });
  if (total > out.length)
    out.push({ path: [], code: 'more_issues', message: `${total - out.length} more issue(s) not listed` });
  return out;
}

/** Wire form of any error: unknown errors become `internal` and keep nothing of their text. */
export function toErrorInfo(err: unknown): ErrorInfo {
  if (err instanceof TooltxError) {
    const info: ErrorInfo = { class: err.class };
    if (err.issues?.length) info.issues = boundIssues(err.issues);
    if (err.retryAfterMs !== undefined) info.retryAfterMs = err.retryAfterMs;
    return info;
  }
  return { class: ErrorClass.Internal };
}

/** Shorthand for an `invalid_input` error at one field path. */
export function invalidInput(path: (string | number)[], code: string, message: string): TooltxError {
  return new TooltxError(ErrorClass.InvalidInput, `invalid input at ${path.join('.') || '(root)'}`, {
    issues: [{ path, code, message }],
  });
}
