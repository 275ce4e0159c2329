import { z } from 'zod';
import { CONTRACT_ID_PATTERN, ID_PATTERN, OPERATION_KEY_PATTERN, type FieldIssue } from '@tooltx/contracts';

/**
 * Debug samples (docs/debug-samples.md): an operator granted `debug` switches on sampling of one
 * contract version (optionally one tenant) for a bounded window; while it is on, the executor keeps
 * the input and result of sampled operations, scrubbed by the logger's rules, apart from the event
 * log and the audit trail, until the window ends. These are the rules: which windows may be opened,
 * which operation is sampled, which sample may still be read. Pure.
 */

/** Longest sampling window, ms (4 h): a window beyond it is refused at `forMs`. */
export const MAX_SAMPLING_WINDOW_MS = 4 * 3_600_000;
/** Shortest sampling window by default, ms (1 min); a deployment may lower it (`TOOLTX_DEBUG_MIN_WINDOW_MS`). */
export const DEFAULT_MIN_SAMPLING_WINDOW_MS = 60_000;
/** Most samples one window keeps (`max`), and the default. */
export const MAX_SAMPLES_PER_WINDOW = 1_000;
export const DEFAULT_SAMPLES_PER_WINDOW = 100;
/** Windows open at once, across contracts: each is kept in every executor's memory and listed whole. */
export const MAX_OPEN_WINDOWS = 50;

const epochMs = z.number().int().nonnegative();
const tenantId = z.string().regex(ID_PATTERN, 'must be a tenant id (^[a-z0-9_-]{1,64}$)');
const contractId = z.string().max(120).regex(CONTRACT_ID_PATTERN, 'must be name@version, e.g. kb.write_note@1');
const operationKey = z.string().regex(OPERATION_KEY_PATTERN, 'must be an operation key (opk_ + 43 base64url)');

/**
 * One sampling switch (KV `<p>_sampling`, key: the contract's token, msgpack): sampling of
 * `contract` (of `tenant` only, when set) is on from `startedAt` until `until` (ms since the epoch),
 * for at most `max` samples (`taken` so far, counted under compare-and-set) and a share `rate` of
 * the calls.
 */
export const samplingSwitchSchema = z.object({
  schema: z.literal(1),
  windowId: z.uuid(),
  contract: contractId,
  tenant: tenantId.optional(),
  rate: z.number().gt(0).lte(1),
  max: z.number().int().min(1).max(MAX_SAMPLES_PER_WINDOW),
  taken: z.number().int().nonnegative(),
  startedAt: epochMs,
  until: epochMs,
  startedBy: z.string().regex(ID_PATTERN),
});
export type SamplingSwitch = z.infer<typeof samplingSwitchSchema>;

/**
 * One sample (KV `<p>_samples`, key `<contract token>.<tenant>.<opId>`, msgpack): the operation's
 * input and result as the logger would have written them ({@link SamplingSwitch} docs), its
 * outcome, and `expiresAt` (the window's end: no read answers it after).
 */
export const sampleSchema = z.object({
  schema: z.literal(1),
  windowId: z.uuid(),
  contract: contractId,
  tenant: tenantId,
  operationKey,
  /** `committed`, `rejected` or `unknown`: how the sampled attempt ended. */
  outcome: z.string().max(40),
  errorClass: z.string().max(64).optional(),
  input: z.unknown(),
  result: z.unknown().optional(),
  at: epochMs,
  expiresAt: epochMs,
});
export type Sample = z.infer<typeof sampleSchema>;

/** What an operator asks the debug service (`<prefix>.ops.debug.<operator>`, JSON). */
export const debugRequestSchema = z.discriminatedUnion('action', [
  z.strictObject({
    action: z.literal('start'),
    contract: contractId,
    /** How long sampling stays on, ms. */
    forMs: z.number().int().positive(),
    tenant: tenantId.optional(),
    /** Share of the contract's calls sampled, (0, 1]; default 1. */
    rate: z.number().gt(0).lte(1).optional(),
    /** Most samples kept in this window; default {@link DEFAULT_SAMPLES_PER_WINDOW}. */
    max: z.number().int().min(1).max(MAX_SAMPLES_PER_WINDOW).optional(),
  }),
  z.strictObject({ action: z.literal('stop'), contract: contractId }),
  z.strictObject({ action: z.literal('list'), contract: contractId.optional(), tenant: tenantId.optional() }),
  z.strictObject({ action: z.literal('show'), contract: contractId, tenant: tenantId, operationKey }),
]);
export type DebugRequest = z.infer<typeof debugRequestSchema>;

/**
 * A window that may be opened, or why not: a contract the deployment holds (refused at `contract`,
 * `not_found`: a typo would otherwise replace, and purge, nothing but itself), `forMs` within
 * [`minWindowMs`, {@link MAX_SAMPLING_WINDOW_MS}] (at `forMs`, `too_small` / `too_big`), and at most
 * {@link MAX_OPEN_WINDOWS} open at once counting this one unless it replaces an open window of the
 * same contract (at `contract`, `too_many_windows`), and a `tenant`, when named, that is a tenant of
 * the identity list (at `tenant`, `unknown_tenant`: a window names one tenant or, without it, every
 * tenant). The switch starts now with nothing taken.
 */
export function decideSamplingStart(
  req: Extract<DebugRequest, { action: 'start' }>,
  ctx: {
    now: number;
    operator: string;
    windowId: string;
    minWindowMs: number;
    /** Whether the deployment holds the contract `name@version`. */
    holds: (contract: string) => boolean;
    /** The contracts with a window open now. */
    open: readonly string[];
    /** Whether `req.tenant` is a tenant of the identity list (true when the request names none). */
    tenantListed: boolean;
  },
): { kind: 'start'; sw: SamplingSwitch } | { kind: 'refuse'; issues: FieldIssue[] } {
  if (!ctx.holds(req.contract))
    return {
      kind: 'refuse',
      issues: [{ path: ['contract'], code: 'not_found', message: 'no contract of this name@version is deployed' }],
    };
  if (req.tenant !== undefined && !ctx.tenantListed)
    return {
      kind: 'refuse',
      issues: [{ path: ['tenant'], code: 'unknown_tenant', message: 'no tenant of this id is in the identity list' }],
    };
  if (!ctx.open.includes(req.contract) && ctx.open.length >= MAX_OPEN_WINDOWS)
    return {
      kind: 'refuse',
      issues: [
        {
          path: ['contract'],
          code: 'too_many_windows',
          message: `at most ${MAX_OPEN_WINDOWS} sampling windows are open at once: stop one first`,
        },
      ],
    };
  if (req.forMs > MAX_SAMPLING_WINDOW_MS)
    return {
      kind: 'refuse',
      issues: [
        {
          path: ['forMs'],
          code: 'too_big',
          message: `a sampling window is at most ${MAX_SAMPLING_WINDOW_MS / 3_600_000} h (${MAX_SAMPLING_WINDOW_MS} ms)`,
        },
      ],
    };
  if (req.forMs < ctx.minWindowMs)
    return {
      kind: 'refuse',
      issues: [{ path: ['forMs'], code: 'too_small', message: `a sampling window is at least ${ctx.minWindowMs} ms` }],
    };
  return {
    kind: 'start',
    sw: {
      schema: 1,
      windowId: ctx.windowId,
      contract: req.contract,
      ...(req.tenant ? { tenant: req.tenant } : {}),
      rate: req.rate ?? 1,
      max: req.max ?? DEFAULT_SAMPLES_PER_WINDOW,
      taken: 0,
      startedAt: ctx.now,
      until: ctx.now + req.forMs,
      startedBy: ctx.operator,
    },
  };
}

/** True while `sw` is on at `now` (`startedAt <= now < until`). */
export function samplingOn(sw: SamplingSwitch, now: number): boolean {
  return sw.startedAt <= now && now < sw.until;
}

/**
 * Whether one ended attempt of the switch's contract is sampled: the switch is on, the operation is
 * of the switch's tenant (when it names one: another tenant's operation is never sampled), fewer
 * than `max` samples are taken, and `draw` (uniform in [0, 1)) falls under `rate`.
 */
export function decideSample(
  sw: SamplingSwitch | undefined,
  op: { tenant: string },
  now: number,
  draw: number,
): 'sample' | 'skip' {
  if (!sw || !samplingOn(sw, now)) return 'skip';
  if (sw.tenant !== undefined && sw.tenant !== op.tenant) return 'skip';
  if (sw.taken >= sw.max) return 'skip';
  return draw < sw.rate ? 'sample' : 'skip';
}

/** Whether a stored sample may still be answered at `now`: never at or after its `expiresAt`. */
export function sampleReadable(s: Pick<Sample, 'expiresAt'>, now: number): boolean {
  return now < s.expiresAt;
}

/**
 * What the debug service records in the audit log (stream `<P>_AUDITLOG`, subject
 * `<prefix>.auditlog._debug.<operator>`) before it answers: who, when, what, which contract, tenant
 * and samples (their operation keys) — never a sample's content.
 */
export const sampleAccessRecordSchema = z.object({
  schema: z.literal(1),
  queryId: z.uuid(),
  at: epochMs,
  operator: z.string().regex(ID_PATTERN),
  kind: z.enum(['sampling_start', 'sampling_stop', 'samples_list', 'samples_show', 'invalid']),
  contract: z.string().max(120).optional(),
  tenant: z.string().optional(),
  /** The samples the answer carries (their tenants and operation keys); sampling_start: the window. */
  samples: z.array(z.object({ tenant: z.string(), operationKey: z.string() })).max(MAX_SAMPLES_PER_WINDOW),
  windowId: z.string().optional(),
  until: epochMs.optional(),
  count: z.number().int().nonnegative(),
  instance: z.string(),
});
export type SampleAccessRecord = z.infer<typeof sampleAccessRecordSchema>;

/**
 * The one-token form of `name@version` in KV keys and subjects (`kb.write_note@1` → `kb-write_note=1`):
 * contract names have neither `-` nor `=`, so no two contracts share a token.
 */
export function contractTokenOf(contract: string): string {
  return contract.replace(/\./g, '-').replace('@', '=');
}
