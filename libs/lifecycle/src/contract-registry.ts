import { z } from 'zod';
import { CONTRACT_ID_PATTERN, ErrorClass, type ErrorInfo } from '@tooltx/contracts';

/**
 * The contract registry's rules (docs/contracts.md): what a service publishes for each contract it
 * holds, which version of a name is current, deprecation, retirement and revert, and whether a new
 * intent on a version is admitted. The entries live in the KV bucket `<prefix>_contracts` (file
 * storage: they hold decisions that exist nowhere else); every rule here is pure.
 *
 * Keys: `version.<name>.<version>` → {@link VersionEntry} (what services published);
 * `current.<name>` → {@link CurrentEntry} (the current version and what operators decided on each
 * version of the name); `held.<name>.<version>.<instance>` → {@link HeldMark} (a running service
 * holds that version).
 *
 * Every operator command on a name (deprecate, retire, revert) changes only that name's current
 * entry, under compare-and-set on its revision: two commands on one name at once are serialised by
 * the bucket, the second one decided again on what the first wrote. A retirement is never undone by
 * a concurrent deprecate, and a revert never makes current a version retired at the same moment.
 */

const epochMs = z.number().int().nonnegative();
const name = z
  .string()
  .regex(/^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$/)
  .max(100);
/** Who or what made a change: `operator:<id>`, `service:<role>@<instance>` or `auto:<rule>`. */
export const changedBySchema = z.string().regex(/^(operator|service|auto):[\x21-\x7e]{1,160}$/);
export type ChangedBy = z.infer<typeof changedBySchema>;

/** Most switches a name's entry keeps (the newest). */
export const MAX_SWITCHES = 20;

/** One contract version as the services that hold it published it. */
export const versionEntrySchema = z.object({
  name,
  version: z.number().int().min(1),
  /** The contract's `interfaceDigest` (never the full `digest`: that one holds function source text). */
  interfaceDigest: z.string().regex(/^sha256:[0-9a-f]{64}$/),
  /** JSON Schema of the input and of the output. */
  input: z.record(z.string(), z.unknown()),
  output: z.record(z.string(), z.unknown()),
  effect: z.string().max(20),
  compensation: z.object({ tool: z.string(), deadlineMs: z.number(), permission: z.string() }).optional(),
  policyVersion: z.string().max(100).optional(),
  firstSeenAt: epochMs,
  lastSeenAt: epochMs,
  /** Who published it first. */
  registeredBy: changedBySchema,
  /** Announced end: new intents on it are refused `contract_retired` from `sunsetAt` on. */
  deprecated: z.object({ sunsetAt: epochMs, by: changedBySchema, at: epochMs }).optional(),
  /** Retired at once (`tooltx contracts retire`). */
  retired: z.object({ by: changedBySchema, at: epochMs }).optional(),
  /** Reverted with `--stop-running`: running tasks take no further step on it (`contract_withdrawn`). */
  withdrawn: z.object({ by: changedBySchema, at: epochMs }).optional(),
});
export type VersionEntry = z.infer<typeof versionEntrySchema>;

/**
 * What operators decided on one version (kept on its name's current entry, keyed by version): a
 * sunset, a retirement, a withdrawal. Older registries kept these on the version entry; both are
 * read, the current entry's winning.
 */
export const versionStateSchema = z.object({
  deprecated: z.object({ sunsetAt: epochMs, by: changedBySchema, at: epochMs }).optional(),
  retired: z.object({ by: changedBySchema, at: epochMs }).optional(),
  withdrawn: z.object({ by: changedBySchema, at: epochMs }).optional(),
});
export type VersionState = z.infer<typeof versionStateSchema>;

/** One change of a name's current version. */
export const switchSchema = z.object({
  from: z.number().int().min(1).optional(),
  to: z.number().int().min(1),
  by: changedBySchema,
  at: epochMs,
  /** `registered` (a newer version appeared), `revert` (by an operator or a threshold rule). */
  reason: z.enum(['registered', 'revert']),
});
export type Switch = z.infer<typeof switchSchema>;

/** A contract name's current version and how it came to be (newest switches last). */
export const currentEntrySchema = z.object({
  name,
  current: z.number().int().min(1),
  switches: z.array(switchSchema).max(MAX_SWITCHES),
  /** Operators' decisions per version (`"2"` → its state). */
  states: z.record(z.string().regex(/^[1-9][0-9]{0,8}$/), versionStateSchema).optional(),
});
export type CurrentEntry = z.infer<typeof currentEntrySchema>;

/** The registry key of a version entry. */
export const versionKeyOf = (contractName: string, version: number) => `version.${contractName}.${version}`;
/** The registry key of a name's current entry. */
export const currentKeyOf = (contractName: string) => `current.${contractName}`;
/** `{ name, version }` of a `name@version` string, or null. Pure. */
export function parseContractId(id: string): { name: string; version: number } | null {
  if (!CONTRACT_ID_PATTERN.test(id)) return null;
  const at = id.lastIndexOf('@');
  return { name: id.slice(0, at), version: Number(id.slice(at + 1)) };
}

/**
 * A running executor holds `name@version` until `until` (epoch ms): renewed every interval, removed
 * at a clean shutdown, ignored once past (a crashed service's mark). A revert makes current only a
 * version some service holds, unless the operator says otherwise (docs/contracts.md "Revert").
 */
export const heldMarkSchema = z.object({
  name,
  version: z.number().int().min(1),
  instance: z.string().min(1).max(100),
  at: epochMs,
  until: epochMs,
});
export type HeldMark = z.infer<typeof heldMarkSchema>;

/**
 * The registry key of a held mark: the instance id with every character a KV key may not hold
 * (anything but letters, digits, `-` and `_`) as `_`.
 */
export const heldKeyOf = (contractName: string, version: number, instance: string) =>
  `held.${contractName}.${version}.${instance.replace(/[^A-Za-z0-9_-]/g, '_')}`;

/** A version entry as operators' decisions left it: `cur`'s state of that version over the entry's own. Pure. */
export function withState(v: VersionEntry, cur: CurrentEntry | null | undefined): VersionEntry {
  const st = cur?.states?.[String(v.version)];
  return st ? { ...v, ...stripUndefined(st) } : v;
}

function withVersionState(cur: CurrentEntry, version: number, st: VersionState): CurrentEntry {
  const key = String(version);
  return { ...cur, states: { ...cur.states, [key]: { ...cur.states?.[key], ...st } } };
}

/** What a service publishes for one contract it holds. */
export type Published = Pick<
  VersionEntry,
  'name' | 'version' | 'interfaceDigest' | 'input' | 'output' | 'effect' | 'compensation' | 'policyVersion'
>;

/**
 * The registration rule for one version a starting service holds (`existing`: the entry under its
 * `name@version`, or null): a new entry; the same interface digest refreshes `lastSeenAt` (at most
 * once a minute, so that a fleet's restarts do not rewrite it each time); another interface digest
 * is a conflict — the service must not start (FM-25: a host and the server agree on the interface
 * digest only). Pure.
 */
export function registerVersion(
  existing: VersionEntry | null,
  published: Published,
  by: string,
  now: number,
):
  | { kind: 'put'; entry: VersionEntry; created: boolean }
  | { kind: 'unchanged' }
  | { kind: 'conflict'; registered: string; ours: string } {
  if (!existing)
    return {
      kind: 'put',
      created: true,
      entry: { ...stripUndefined(published), firstSeenAt: now, lastSeenAt: now, registeredBy: by },
    };
  if (existing.interfaceDigest !== published.interfaceDigest)
    return { kind: 'conflict', registered: existing.interfaceDigest, ours: published.interfaceDigest };
  if (now - existing.lastSeenAt < 60_000) return { kind: 'unchanged' };
  return { kind: 'put', created: false, entry: { ...existing, lastSeenAt: now } };
}

/**
 * The current-version rule when `version` was just registered (`created`: it did not exist
 * before): a name with no current entry gets it; a NEWLY registered version higher than the current
 * one becomes current, recorded as a switch by `by`, unless an operator already decided on it
 * (retired, deprecated, withdrawn). A version seen again (a service restarting with it) never
 * takes the current place back: after a revert, the reverted version stays reverted until an
 * operator says otherwise. Null: nothing changes. Pure.
 */
export function currentAfterRegistration(
  cur: CurrentEntry | null,
  contractName: string,
  version: number,
  created: boolean,
  by: string,
  now: number,
): CurrentEntry | null {
  if (!cur)
    return { name: contractName, current: version, switches: [{ to: version, by, at: now, reason: 'registered' }] };
  if (!created || version <= cur.current) return null;
  // Retired, deprecated or withdrawn between its version entry's write and this one (an operator's
  // command on the name can land in between): never made current.
  if (cur.states?.[String(version)] !== undefined) return null;
  return withSwitch(cur, { from: cur.current, to: version, by, at: now, reason: 'registered' });
}

function currentSwitch(cur: CurrentEntry): Switch | undefined {
  return [...cur.switches].reverse().find((x) => x.to === cur.current);
}

function describeSwitch(cur: CurrentEntry): string {
  const s = currentSwitch(cur);
  return s
    ? `${s.reason === 'revert' ? 'reverted' : 'registered'} by ${s.by} at ${new Date(s.at).toISOString()}`
    : 'no switch recorded';
}

function withSwitch(cur: CurrentEntry, s: Switch): CurrentEntry {
  return { ...cur, current: s.to, switches: [...cur.switches, s].slice(-MAX_SWITCHES) };
}

/** True when new intents on `v` are refused: retired, or its deprecation's sunset has passed. Pure. */
export function isRetired(v: VersionEntry, now: number): boolean {
  return v.retired !== undefined || (v.deprecated !== undefined && now >= v.deprecated.sunsetAt);
}

/** An operator's command on the registry (`tooltx contracts …`), refused with a field path when it cannot apply. */
export type RegistryCommand =
  | { kind: 'deprecate'; version: number; sunsetAt: number }
  | { kind: 'retire'; version: number }
  /**
   * `from`: the version the requester saw current; when another is current by now (another
   * operator's revert came first), nothing is reverted. `unheld`: revert even to a version no
   * running service holds (a deliberate operator choice).
   */
  | { kind: 'revert'; stopRunning: boolean; from?: number; unheld?: boolean };

/**
 * What a {@link RegistryCommand} writes: the name's current entry (compare-and-set on the revision
 * it was decided on), and the versions it changed as they read after it.
 */
export type RegistryOutcome =
  | { kind: 'write'; current: CurrentEntry; changed: VersionEntry[] }
  | { kind: 'refuse'; error: ErrorInfo };

const refuse = (path: string, code: string, message: string): RegistryOutcome => ({
  kind: 'refuse',
  error: { class: ErrorClass.InvalidInput, issues: [{ path: [path], code, message }] },
});

/**
 * The rule of one command on a name's entries (`versions`: every registered version of the name;
 * `cur`: its current entry, read under compare-and-set; `held`: whether a running service holds a
 * version, {@link HeldMark}):
 * - deprecate `@V`: sets its sunset (again: a new date replaces the old one); not the current
 *   version — revert or register another first; not a retired one (retirement is final);
 * - retire `@V`: retired now; not the current version;
 * - revert: the previous current version (the `from` of the switch to the current one, else the
 *   highest lower one) becomes current again, as one unit (description, schemas, authorisation and
 *   audit parser are that version's); one that is retired, withdrawn or deprecated cannot (it would
 *   refuse every new task, at once or at its sunset); nor one no running service holds, unless
 *   `unheld` (its intents would find no executor); `stopRunning` withdraws the reverted version
 *   (running tasks are refused `contract_withdrawn` on it).
 * - a revert that names the version it reverts (`from`) is refused `current_changed` when another
 *   is current by now; one that names none is refused `already_reverted` when the current version
 *   is itself current by a revert: two operators (or an operator and the threshold) reverting at
 *   once revert once, never back and forth; undoing a revert takes `from`;
 * - retiring a retired version changes nothing (its first retirement stays recorded).
 * Refusals carry the field path: `name` (`unknown_contract`, `no_previous_version`,
 * `version_not_held`), `from` (`current_changed`, `already_reverted`), `contract` (`unknown_contract`, `current_version`, `retired`), `sunsetAt`
 * (`in_the_past`). Pure.
 */
export function decideRegistryCommand(
  contractName: string,
  registered: readonly VersionEntry[],
  cur: CurrentEntry | null,
  cmd: RegistryCommand,
  by: string,
  now: number,
  held: (version: number) => boolean = () => true,
): RegistryOutcome {
  if (!registered.length || !cur)
    return refuse(
      cmd.kind === 'revert' ? 'name' : 'contract',
      'unknown_contract',
      `no contract named ${contractName} is registered`,
    );
  const versions = registered.map((v) => withState(v, cur));
  if (cmd.kind === 'revert') {
    const from = cur.current;
    if (cmd.from !== undefined && cmd.from !== from)
      return refuse(
        'from',
        'current_changed',
        `${contractName}@${from} is current now, not @${cmd.from}: nothing reverted (${describeSwitch(cur)})`,
      );
    if (cmd.from === undefined && currentSwitch(cur)?.reason === 'revert')
      return refuse(
        'from',
        'already_reverted',
        `${contractName}@${from} is current by a revert (${describeSwitch(cur)}): to revert it too, name it with --from ${from}`,
      );
    const last = [...cur.switches].reverse().find((s) => s.to === from);
    const candidates = versions.filter(
      (v) => v.version !== from && !isRetired(v, now) && v.withdrawn === undefined && v.deprecated === undefined,
    );
    const previous =
      (last?.from !== undefined ? candidates.find((v) => v.version === last.from) : undefined) ??
      candidates.filter((v) => v.version < from).sort((a, b) => b.version - a.version)[0];
    if (!previous)
      return refuse(
        'name',
        'no_previous_version',
        `${contractName}@${from} has no earlier version that is not retired, withdrawn or deprecated`,
      );
    if (!cmd.unheld && !held(previous.version))
      return refuse(
        'name',
        'version_not_held',
        `no running executor holds ${contractName}@${previous.version}: start one that does, or revert with --unheld`,
      );
    let next = withSwitch(cur, { from, to: previous.version, by, at: now, reason: 'revert' });
    const reverted = versions.find((v) => v.version === from);
    if (cmd.stopRunning && reverted) next = withVersionState(next, from, { withdrawn: { by, at: now } });
    return {
      kind: 'write',
      current: next,
      changed: cmd.stopRunning && reverted ? [withState(reverted, next)] : [],
    };
  }
  const v = versions.find((x) => x.version === cmd.version);
  if (!v) return refuse('contract', 'unknown_contract', `${contractName}@${cmd.version} is not registered`);
  if (cmd.kind === 'retire' && v.retired) return { kind: 'write', current: cur, changed: [v] };
  if (cmd.version === cur.current)
    return refuse('contract', 'current_version', `${contractName}@${cmd.version} is the current version: revert first`);
  const state: VersionState =
    cmd.kind === 'retire' ? { retired: { by, at: now } } : { deprecated: { sunsetAt: cmd.sunsetAt, by, at: now } };
  if (cmd.kind === 'deprecate') {
    if (cmd.sunsetAt <= now)
      return refuse('sunsetAt', 'in_the_past', 'the sunset must be in the future (`retire` ends a version now)');
    if (v.retired)
      return refuse('contract', 'retired', `${contractName}@${cmd.version} is retired: a retirement is final`);
  }
  const next = withVersionState(cur, cmd.version, state);
  return { kind: 'write', current: next, changed: [withState(v, next)] };
}

/** The registry as the authorizer holds it in memory (a watched copy): entries by key. */
export interface RegistryView {
  version(contractName: string, version: number): VersionEntry | undefined;
  current(contractName: string): CurrentEntry | undefined;
  versionsOf(contractName: string): VersionEntry[];
}

/**
 * Whether a NEW intent on `name@version` is admitted (docs/contracts.md): refused
 * `contract_withdrawn` (next: replan) when the version was reverted with `--stop-running`, refused
 * `contract_retired` (next: refresh_contract) when it is retired or past its sunset; each refusal
 * names the versions to use (the current one first). A version the registry does not hold is
 * admitted (the intake's own contract check decides). Only for a key not registered yet: a
 * registered key still answers its outcome. Pure; an in-memory lookup only.
 */
export function contractAdmission(
  view: RegistryView,
  contractName: string,
  version: number,
  now: number,
): { kind: 'admit' } | { kind: 'refuse'; error: ErrorInfo } {
  const v = view.version(contractName, version);
  if (!v) return { kind: 'admit' };
  const withdrawn = v.withdrawn !== undefined;
  if (!withdrawn && !isRetired(v, now)) return { kind: 'admit' };
  const cur = view.current(contractName)?.current;
  const usable = view
    .versionsOf(contractName)
    .filter((x) => x.version !== version && !isRetired(x, now) && !x.withdrawn)
    .map((x) => x.version)
    .sort((a, b) => (a === cur ? -1 : b === cur ? 1 : b - a));
  const use = usable.map((n) => `${contractName}@${n}`).join(', ') || 'none registered';
  return {
    kind: 'refuse',
    error: {
      class: withdrawn ? ErrorClass.ContractWithdrawn : ErrorClass.ContractRetired,
      issues: [
        {
          path: ['version'],
          code: withdrawn ? 'contract_withdrawn' : 'contract_retired',
          message: `${contractName}@${version} is ${withdrawn ? 'withdrawn' : 'retired'}; use ${use}`,
        },
      ],
    },
  };
}

/** A threshold rule for automatic reverts (docs/contracts.md "Automatic revert"). */
export interface RevertThreshold {
  /** Ratio of calls that went wrong over calls, 0..1 ({@link badRatioOf}). */
  ratio: number;
  /** Fewest calls of the version by one tenant in the window before that tenant's ratio counts. */
  minCount: number;
  /** Fewest tenants over the ratio before a name is reverted: one tenant's traffic alone never reverts a name every tenant uses. */
  minTenants: number;
  /** The window, ms. */
  windowMs: number;
}

/** Per-version counts from the audit records of a window. */
export interface VersionHealth {
  /** Operations registered on the version. */
  operations: number;
  /** Requests refused `idempotency_conflict` on the version: calls that registered no operation. */
  conflicts: number;
  rejected: number;
  unknown: number;
  /** Operations rejected or ever unknown, each counted once. */
  failed: number;
}

/**
 * The bad ratio of a version: calls that went wrong over calls, where the calls are its operations
 * and its conflicting requests, and the wrong ones its failed operations and those conflicts. 0..1;
 * 0 when none. Pure.
 */
export function badRatioOf(h: VersionHealth): number {
  const calls = h.operations + h.conflicts;
  return calls === 0 ? 0 : (h.failed + h.conflicts) / calls;
}

/**
 * Whether the threshold reverts a name now (`byTenant`: its current version's health per tenant
 * over the window): at least `minTenants` tenants each made at least `minCount` calls on it with a
 * bad ratio at or above `ratio`, it became current by a registration (a revert is never undone by
 * a rule), and a previous version exists. Pure.
 */
export function shouldAutoRevert(
  cur: CurrentEntry,
  byTenant: ReadonlyMap<string, VersionHealth> | undefined,
  t: RevertThreshold,
): boolean {
  if (!byTenant) return false;
  const last = cur.switches.at(-1);
  if (!last || last.to !== cur.current || last.reason !== 'registered' || last.from === undefined) return false;
  return tenantsOverThreshold(byTenant, t).length >= t.minTenants;
}

/** The tenants that made at least `minCount` calls with a bad ratio at or above `ratio`. Pure. */
export function tenantsOverThreshold(
  byTenant: ReadonlyMap<string, VersionHealth>,
  t: Pick<RevertThreshold, 'minCount' | 'ratio'>,
): string[] {
  return [...byTenant]
    .filter(([, h]) => h.operations + h.conflicts >= t.minCount && badRatioOf(h) >= t.ratio)
    .map(([tenant]) => tenant);
}

function stripUndefined<T extends object>(o: T): T {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as T;
}
