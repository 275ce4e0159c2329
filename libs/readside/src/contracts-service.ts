import type { KV } from '@nats-io/kv';
import type { NatsConnection } from '@nats-io/transport-node';
import { z } from 'zod';
import { CONTRACT_ID_PATTERN, ErrorClass, TooltxError, type ErrorInfo } from '@tooltx/contracts';
import {
  badRatioOf,
  currentEntrySchema,
  currentKeyOf,
  decideRegistryCommand,
  isRetired,
  parseContractId,
  shouldAutoRevert,
  tenantsOverThreshold,
  type AuditRecord,
  type CurrentEntry,
  type RegistryCommand,
  type RegistryOutcome,
  type RevertThreshold,
  type VersionEntry,
  type VersionHealth,
} from '@tooltx/lifecycle';
import type { Subjects } from '@tooltx/nats';
import { CasContendedError, casUpdate, type Logger, type RegistryMirror } from '@tooltx/runtime';
import { auditRecordsOf, inRange, REBUILDING_RETRY_MS } from './audit-queries.js';
import { operatorEndpoint, startResponder, type Responder } from './responder.js';

const epochMs = z.number().int().nonnegative();
/** The last millisecond of year 9999: a later date has no ISO-8601 form for the pages to show. */
const MAX_DATE_MS = 253_402_300_799_999;
const contractName = z
  .string()
  .regex(/^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$/, 'must be a contract name such as kb.write_note')
  .max(100);
const contractId = z.string().regex(CONTRACT_ID_PATTERN, 'must be name@version, e.g. kb.write_note@1');

/**
 * What an operator asks the contracts service (`<prefix>.ops.contracts.<operator>`, JSON;
 * docs/contracts.md). The operator is the subject's last token, never a field.
 */
export const contractsRequestSchema = z.discriminatedUnion('action', [
  z.strictObject({ action: z.literal('list'), since: epochMs.optional() }),
  z.strictObject({ action: z.literal('usage'), name: contractName, since: epochMs.optional() }),
  z.strictObject({ action: z.literal('deprecate'), contract: contractId, sunsetAt: epochMs.max(MAX_DATE_MS) }),
  z.strictObject({ action: z.literal('retire'), contract: contractId }),
  z.strictObject({
    action: z.literal('revert'),
    name: contractName,
    stopRunning: z.boolean().optional(),
    /** The version the operator reverts; needed to revert a version that is itself current by a revert. */
    from: z.number().int().min(1).max(999_999_999).optional(),
    unheld: z.boolean().optional(),
  }),
]);
export type ContractsRequest = z.infer<typeof contractsRequestSchema>;

/** Usage of one version over a window, from the audit records (docs/contracts.md "Usage"). */
export interface VersionUsage extends VersionHealth {
  /** Distinct tasks (tenant + task id) with an operation on it. */
  tasks: number;
  /** Distinct actors (tenant + actor) that called it, refused calls included. */
  actors: number;
  /** (conflicts + rejected + unknown) / operations, 0 when none. */
  ratio: number;
}

/** One version as `list` and `usage` show it: its registry entry (no schemas), its state and usage. */
export interface VersionRow {
  contract: string;
  name: string;
  version: number;
  interfaceDigest: string;
  effect: string;
  policyVersion?: string;
  firstSeenAt: number;
  lastSeenAt: number;
  current: boolean;
  /** Whether a running executor holds it now (a held mark): a revert makes current only such a version. */
  held: boolean;
  /** `active`, `deprecated` (sunset ahead), `retired` (retired or past its sunset), `withdrawn`. */
  state: 'active' | 'deprecated' | 'retired' | 'withdrawn';
  sunsetAt?: number;
  usage: VersionUsage;
}

/** A `list` or `usage` answer as a reader checks it (the console): the rows, or the refusal. */
export const contractsListAnswerSchema = z.union([
  z.object({
    ok: z.literal(true),
    since: epochMs,
    versions: z.array(
      z.object({
        contract: z.string(),
        name: z.string(),
        version: z.number().int(),
        interfaceDigest: z.string(),
        effect: z.string(),
        policyVersion: z.string().optional(),
        firstSeenAt: epochMs,
        lastSeenAt: epochMs,
        current: z.boolean(),
        held: z.boolean(),
        state: z.enum(['active', 'deprecated', 'retired', 'withdrawn']),
        sunsetAt: epochMs.optional(),
        usage: z.object({
          operations: z.number().int(),
          conflicts: z.number().int(),
          failed: z.number().int(),
          rejected: z.number().int(),
          unknown: z.number().int(),
          tasks: z.number().int(),
          actors: z.number().int(),
          ratio: z.number(),
        }),
      }),
    ),
  }),
  z.object({
    ok: z.literal(false),
    error: z.object({
      class: z.string(),
      issues: z
        .array(z.object({ path: z.array(z.union([z.string(), z.number()])), code: z.string(), message: z.string() }))
        .optional(),
      retryAfterMs: z.number().int().optional(),
    }),
  }),
]);

export type ContractsAnswer =
  | { ok: true; since: number; versions: VersionRow[]; switches?: CurrentEntry['switches'] }
  | { ok: true; current: CurrentEntry | null; changed: VersionEntry[] }
  | { ok: false; error: ErrorInfo };

/** How far back `list` and `usage` look when no `since` is given: 24 hours, ms. */
export const DEFAULT_USAGE_WINDOW_MS = 24 * 60 * 60 * 1000;

/**
 * Per-version usage of the audit records in `records` (already in the window), and the same health
 * per tenant (`byTenant`: contract → tenant → health, what the automatic revert weighs). Pure.
 */
export function usageOf(records: Iterable<AuditRecord>): Map<string, VersionUsage> & {
  byTenant: Map<string, Map<string, VersionHealth>>;
} {
  const acc = new Map<string, VersionHealth & { taskSet: Set<string>; actorSet: Set<string> }>();
  const byTenant = new Map<string, Map<string, VersionHealth>>();
  const get = (contract: string) => {
    let a = acc.get(contract);
    if (!a) {
      a = { ...noHealth(), taskSet: new Set<string>(), actorSet: new Set<string>() };
      acc.set(contract, a);
    }
    return a;
  };
  const tenantOf = (contract: string, tenant: string) => {
    let m = byTenant.get(contract);
    if (!m) byTenant.set(contract, (m = new Map()));
    let h = m.get(tenant);
    if (!h) m.set(tenant, (h = noHealth()));
    return h;
  };
  for (const r of records) {
    if (!r.contract) continue;
    const a = get(r.contract);
    const ta = tenantOf(r.contract, r.tenant);
    a.operations++;
    ta.operations++;
    if (r.taskId) a.taskSet.add(`${r.tenant}\0${r.taskId}`);
    a.actorSet.add(`${r.tenant}\0${r.actor}`);
    for (const d of r.decisions) {
      const contract = d.contract ?? r.contract;
      const c = get(contract);
      c.actorSet.add(`${r.tenant}\0${d.actor}`);
      if (d.conflict) {
        c.conflicts++;
        tenantOf(contract, r.tenant).conflicts++;
      }
    }
    const rejected = r.status === 'rejected' || r.status === 'refused';
    const unknown = r.states.some((s) => s.status === 'unknown');
    for (const h of [a, ta]) {
      if (rejected) h.rejected++;
      if (unknown) h.unknown++;
      if (rejected || unknown) h.failed++;
    }
  }
  const out = new Map<string, VersionUsage>();
  for (const [k, { taskSet, actorSet, ...h }] of acc)
    out.set(k, { ...h, tasks: taskSet.size, actors: actorSet.size, ratio: badRatioOf(h) });
  return Object.assign(out, { byTenant });
}

const noHealth = (): VersionHealth => ({ operations: 0, conflicts: 0, rejected: 0, unknown: 0, failed: 0 });
const noUsage: VersionUsage = { ...noHealth(), tasks: 0, actors: 0, ratio: 0 };

function rowOf(
  v: VersionEntry,
  cur: CurrentEntry | undefined,
  usage: VersionUsage | undefined,
  held: boolean,
  now: number,
): VersionRow {
  const state = v.withdrawn
    ? 'withdrawn'
    : isRetired(v, now)
      ? 'retired'
      : v.deprecated
        ? 'deprecated'
        : ('active' as const);
  return {
    contract: `${v.name}@${v.version}`,
    name: v.name,
    version: v.version,
    interfaceDigest: v.interfaceDigest,
    effect: v.effect,
    ...(v.policyVersion ? { policyVersion: v.policyVersion } : {}),
    firstSeenAt: v.firstSeenAt,
    lastSeenAt: v.lastSeenAt,
    current: cur?.current === v.version,
    held,
    state,
    ...(v.deprecated ? { sunsetAt: v.deprecated.sunsetAt } : {}),
    usage: usage ?? noUsage,
  };
}

export interface ContractsServiceDeps {
  nc: NatsConnection;
  /** The contract registry bucket (written with compare-and-set) and its watched copy. */
  registryKv: KV;
  registry: RegistryMirror;
  /** The audit bucket: every tenant's records (usage). */
  auditKv: KV;
  subjects: Subjects;
  log: Logger;
  /** True while the audit records are rebuilt from the log: usage is answered "retry later". */
  rebuilding?: () => boolean;
  now?: () => number;
}

/**
 * Applies an operator's (or a threshold rule's) command to a contract name in the registry: decided
 * on the name's current entry as read, and written there under compare-and-set on that revision;
 * when another command or a registration wrote it first, read and decided again (bounded rounds).
 * Every command on a name changes that one entry, so commands on a name are serialised
 * (docs/contracts.md). `check`, when given, is asked again on the entry read (a rule that no longer
 * holds writes nothing: null). Throws `TooltxError(invalid_input)` with the field path of a command
 * that cannot apply, and `TooltxError(dependency_unavailable)` with `retryAfterMs` when the entry
 * kept changing under it.
 */
export async function applyRegistryCommand(
  d: Pick<ContractsServiceDeps, 'registryKv' | 'registry'>,
  name: string,
  cmd: RegistryCommand,
  by: string,
  now: number,
  check?: (cur: CurrentEntry) => boolean,
): Promise<{ current: CurrentEntry; changed: VersionEntry[] } | null> {
  let outcome: Extract<RegistryOutcome, { kind: 'write' }> | null = null;
  try {
    await casUpdate(d.registryKv, currentKeyOf(name), currentEntrySchema, (cur) => {
      outcome = null;
      if (cur && check && !check(cur)) return null;
      const o = decideRegistryCommand(name, d.registry.versionsOf(name), cur, cmd, by, now, (v) =>
        d.registry.isHeld(name, v, now),
      );
      if (o.kind === 'refuse')
        throw new TooltxError(o.error.class, 'registry command refused', { issues: o.error.issues ?? [] });
      outcome = o;
      return o.current;
    });
  } catch (err) {
    if (!(err instanceof CasContendedError)) throw err;
    throw new TooltxError(ErrorClass.DependencyUnavailable, `the registry entry of ${name} kept changing`, {
      retryAfterMs: 1_000,
      cause: err,
    });
  }
  const done = outcome as Extract<RegistryOutcome, { kind: 'write' }> | null;
  return done ? { current: done.current, changed: done.changed } : null;
}

/**
 * The contracts service: an operator granted `contracts` lists the registry's versions with their
 * usage, reads one name's usage (tasks and actors per version, and the ratio of conflicts,
 * rejections and unknowns, from the audit records), deprecates, retires and reverts
 * (docs/contracts.md). Request/reply on `<prefix>.ops.contracts.<operator>` (queue group
 * `tooltx-contracts`), served by the audit-projector, which owns the records; only a granted
 * operator may publish there, and answers go only into its own inbox. Every change is recorded
 * with `operator:<id>`. Refusals: `invalid_input` (field paths), `dependency_unavailable`.
 */
export function startContractsService(d: ContractsServiceDeps): Responder {
  const now = d.now ?? Date.now;
  const usageSince = async (since: number) => {
    if (d.rebuilding?.())
      throw new TooltxError(ErrorClass.DependencyUnavailable, 'audit records being rebuilt', {
        retryAfterMs: REBUILDING_RETRY_MS,
      });
    const records = (await auditRecordsOf(d.auditKv, '>', d.log)).filter((r) => inRange(r, { since }));
    return usageOf(records);
  };
  const handle = async (req: ContractsRequest, operator: string): Promise<ContractsAnswer> => {
    const t = now();
    const by = `operator:${operator}`;
    switch (req.action) {
      case 'list':
      case 'usage': {
        const since = req.since ?? t - DEFAULT_USAGE_WINDOW_MS;
        const usage = await usageSince(since);
        const versions = req.action === 'usage' ? d.registry.versionsOf(req.name) : d.registry.allVersions();
        if (req.action === 'usage' && versions.length === 0)
          throw new TooltxError(ErrorClass.InvalidInput, 'unknown contract', {
            issues: [
              { path: ['name'], code: 'unknown_contract', message: `no contract named ${req.name} is registered` },
            ],
          });
        const rows = versions.map((v) =>
          rowOf(
            v,
            d.registry.current(v.name),
            usage.get(`${v.name}@${v.version}`),
            d.registry.isHeld(v.name, v.version, t),
            t,
          ),
        );
        d.log.info({ operator, action: req.action, count: rows.length }, 'contracts query answered');
        return {
          ok: true,
          since,
          versions: rows,
          ...(req.action === 'usage' ? { switches: d.registry.current(req.name)?.switches ?? [] } : {}),
        };
      }
      case 'deprecate':
      case 'retire': {
        const id = parseContractId(req.contract)!;
        const cmd: RegistryCommand =
          req.action === 'retire'
            ? { kind: 'retire', version: id.version }
            : { kind: 'deprecate', version: id.version, sunsetAt: req.sunsetAt };
        const r = await applyRegistryCommand(d, id.name, cmd, by, t);
        d.log.info({ operator, action: req.action, contract: req.contract }, 'contract registry changed');
        return { ok: true, ...(r ?? { current: null, changed: [] }) };
      }
      case 'revert': {
        const r = await applyRegistryCommand(
          d,
          req.name,
          {
            kind: 'revert',
            stopRunning: req.stopRunning === true,
            unheld: req.unheld === true,
            ...(req.from === undefined ? {} : { from: req.from }),
          },
          by,
          t,
        );
        d.log.info(
          {
            operator,
            action: 'revert',
            name: req.name,
            current: r?.current?.current,
            stopRunning: req.stopRunning === true,
            unheld: req.unheld === true,
          },
          'contract reverted',
        );
        return { ok: true, ...(r ?? { current: null, changed: [] }) };
      }
    }
  };

  return startResponder(
    d.nc,
    d.log,
    operatorEndpoint({
      name: 'contracts',
      subject: d.subjects.allOpsContracts,
      queue: 'tooltx-contracts',
      parse: (subject) => d.subjects.parseOpsContractsSubject(subject),
      what: 'a contracts request',
      schema: contractsRequestSchema,
      handle,
    }),
  );
}

/**
 * The automatic revert (docs/contracts.md "Automatic revert"): every `checkMs`, each name's current
 * version's health over the threshold's window, from the audit records; a name over the threshold
 * is reverted to its previous version, recorded as `auto:threshold`. Several instances may run it:
 * the revert is decided again under compare-and-set, and a version current by a revert is never
 * reverted by the rule. Returns a stop function.
 */
export function startAutoRevert(
  d: Pick<ContractsServiceDeps, 'registryKv' | 'registry' | 'auditKv' | 'log' | 'rebuilding' | 'now'>,
  threshold: RevertThreshold,
  checkMs: number,
): () => Promise<void> {
  const now = d.now ?? Date.now;
  let running: Promise<void> = Promise.resolve();
  const tick = async () => {
    if (d.rebuilding?.()) return;
    const t = now();
    const names = d.registry.allCurrent();
    if (!names.length) return;
    const records = (await auditRecordsOf(d.auditKv, '>', d.log)).filter((r) =>
      inRange(r, { since: t - threshold.windowMs }),
    );
    const usage = usageOf(records);
    for (const cur of names) {
      const byTenant = usage.byTenant.get(`${cur.name}@${cur.current}`);
      const health = usage.get(`${cur.name}@${cur.current}`);
      if (!shouldAutoRevert(cur, byTenant, threshold)) continue;
      const r = await applyRegistryCommand(
        d,
        cur.name,
        { kind: 'revert', stopRunning: false, from: cur.current },
        'auto:threshold',
        t,
        (fresh) => fresh.current === cur.current && shouldAutoRevert(fresh, byTenant, threshold),
      ).catch((err: unknown) => {
        d.log.warn({ err, name: cur.name }, 'automatic revert not applied');
        return null;
      });
      if (r?.current)
        d.log.warn(
          {
            name: cur.name,
            from: cur.current,
            to: r.current.current,
            ...health,
            ratio: health && badRatioOf(health),
            tenantsOver: byTenant ? tenantsOverThreshold(byTenant, threshold) : [],
          },
          'contract reverted automatically: over the revert threshold',
        );
    }
  };
  const timer = setInterval(() => {
    running = running.then(tick).catch((err: unknown) => d.log.warn({ err }, 'revert threshold check failed'));
  }, checkMs);
  timer.unref();
  return async () => {
    clearInterval(timer);
    await running;
  };
}
