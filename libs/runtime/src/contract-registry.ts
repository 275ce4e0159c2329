import type { KV } from '@nats-io/kv';
import { z } from 'zod';
import type { Contract } from '@tooltx/contracts';
import {
  currentAfterRegistration,
  currentEntrySchema,
  currentKeyOf,
  heldKeyOf,
  heldMarkSchema,
  registerVersion,
  versionEntrySchema,
  versionKeyOf,
  withState,
  type CurrentEntry,
  type HeldMark,
  type Published,
  type RegistryView,
  type VersionEntry,
} from '@tooltx/lifecycle';
import { encode, KvMirror } from '@tooltx/nats';
import { casUpdate } from './kv-cas.js';
import type { Logger } from './logger.js';
import type { ImplementationRegistry } from './implementations.js';
import { StartupError } from './startup.js';

/**
 * A service's tools module holds a contract whose interface digest differs from the one the
 * registry holds under the same `name@version` (docs/contracts.md): two deployments disagree on
 * what one version means, so this one must not start (exit 2, one `failed to start` line naming
 * the contract and both digests). Only the interface digest counts, never the full `digest`
 * (function source text, printed differently by tsx and esbuild).
 */
export class ContractDigestConflictError extends StartupError {
  readonly contract: string;
  readonly registered: string;
  readonly ours: string;
  constructor(modulePath: string, contract: string, registered: string, ours: string) {
    super(
      'TOOLTX_TOOLS_MODULE',
      modulePath,
      `contract ${contract} is registered with interface digest ${registered}, this module's is ${ours}: give the changed contract a new version (docs/contracts.md)`,
    );
    this.name = 'ContractDigestConflictError';
    this.contract = contract;
    this.registered = registered;
    this.ours = ours;
  }
}

/** What the registry records of one contract (JSON Schema of input and output, no function). */
export function publishedOf(c: Contract, policyVersion?: string): Published {
  return {
    name: c.name,
    version: c.version,
    interfaceDigest: c.interfaceDigest,
    input: z.toJSONSchema(c.input, { unrepresentable: 'any' }) as Record<string, unknown>,
    output: z.toJSONSchema(c.output, { unrepresentable: 'any' }) as Record<string, unknown>,
    effect: c.effect,
    ...(c.compensation
      ? {
          compensation: {
            tool: c.compensation.tool,
            deadlineMs: c.compensation.deadlineMs,
            permission: c.compensation.permission,
          },
        }
      : {}),
    ...(policyVersion ? { policyVersion } : {}),
  };
}

/**
 * Publishes every contract of `tools` in the registry, at a service's start (docs/contracts.md):
 * each `name@version` with its interface digest, schemas, effect class, compensation and policy
 * version, and first and last seen; a newly registered higher version becomes its name's current
 * one, recorded as a switch by `by`. Safe when several instances start at once (compare-and-set on
 * the revision). Throws {@link ContractDigestConflictError} when another interface digest is
 * registered under one of its `name@version`s.
 */
export async function publishContracts(
  kv: KV,
  tools: ImplementationRegistry,
  opts: { by: string; modulePath: string; log: Logger; now?: () => number },
): Promise<void> {
  const now = opts.now ?? Date.now;
  for (const c of tools.contracts.all()) {
    const published = publishedOf(c, tools.get(c.name, c.version)?.policyVersion);
    let created = false;
    await casUpdate(kv, versionKeyOf(c.name, c.version), versionEntrySchema, (cur) => {
      const d = registerVersion(cur, published, opts.by, now());
      if (d.kind === 'conflict') throw new ContractDigestConflictError(opts.modulePath, c.id, d.registered, d.ours);
      if (d.kind === 'unchanged') return null;
      created = d.created;
      return d.entry;
    });
    const switched = await casUpdate(kv, currentKeyOf(c.name), currentEntrySchema, (cur) =>
      currentAfterRegistration(cur, c.name, c.version, created, opts.by, now()),
    );
    if (created) opts.log.info({ contract: c.id, interfaceDigest: c.interfaceDigest }, 'contract version registered');
    if (switched) opts.log.info({ contract: c.id, by: opts.by }, 'current contract version');
  }
}

/**
 * Keeps this service's held marks of every contract version it holds (docs/contracts.md "Revert"):
 * one `held.<name>.<version>.<instance>` entry each, put now and again every `intervalMs`, each
 * valid for three intervals (a crashed service's marks lapse on their own). The returned stop
 * function ends the renewal and deletes the marks (a clean shutdown: the versions are no longer
 * held here). A failed renewal is logged and retried at the next interval.
 */
export async function startHeldMarks(
  kv: KV,
  tools: ImplementationRegistry,
  opts: { instance: string; intervalMs: number; log: Logger; now?: () => number },
): Promise<() => Promise<void>> {
  const now = opts.now ?? Date.now;
  const contracts = tools.contracts.all();
  const put = async () => {
    const at = now();
    for (const c of contracts) {
      const mark: HeldMark = {
        name: c.name,
        version: c.version,
        instance: opts.instance,
        at,
        until: at + 3 * opts.intervalMs,
      };
      await kv.put(heldKeyOf(c.name, c.version, opts.instance), encode(mark));
    }
  };
  await put();
  let renewing: Promise<void> = Promise.resolve();
  const timer = setInterval(() => {
    renewing = renewing
      .then(put)
      .catch((err: unknown) => opts.log.warn({ err }, 'held marks not renewed; retried at the next interval'));
  }, opts.intervalMs);
  timer.unref();
  return async () => {
    clearInterval(timer);
    await renewing;
    for (const c of contracts)
      await kv.delete(heldKeyOf(c.name, c.version, opts.instance)).catch((err: unknown) => {
        opts.log.warn({ err, contract: c.id }, 'held mark not removed; it lapses on its own');
      });
  };
}

const entrySchema = z.union([versionEntrySchema, currentEntrySchema, heldMarkSchema]);
type Entry = z.infer<typeof entrySchema>;

/**
 * The registry held in memory and kept current by one KV watch ({@link KvMirror}): what the
 * authorizer's intake reads per intent (an in-memory lookup, never a registry read), and what the
 * contracts service reads. Version entries are read with the operators' decisions of their name's
 * current entry ({@link withState}).
 */
export class RegistryMirror implements RegistryView {
  readonly #mirror: KvMirror<Entry>;
  constructor(kv: KV, log: Logger) {
    this.#mirror = new KvMirror<Entry>(kv, entrySchema, { log, what: 'contract registry' });
  }
  start(): Promise<void> {
    return this.#mirror.start();
  }
  stop(): Promise<void> {
    return this.#mirror.stop();
  }
  version(name: string, version: number): VersionEntry | undefined {
    const e = this.#mirror.map.get(versionKeyOf(name, version));
    return e && 'interfaceDigest' in e ? withState(e, this.current(name)) : undefined;
  }
  current(name: string): CurrentEntry | undefined {
    const e = this.#mirror.map.get(currentKeyOf(name));
    return e && 'current' in e ? e : undefined;
  }
  versionsOf(name: string): VersionEntry[] {
    return this.allVersions().filter((v) => v.name === name);
  }
  allVersions(): VersionEntry[] {
    return [...this.#mirror.map.values()]
      .filter((e): e is VersionEntry => 'interfaceDigest' in e)
      .map((v) => withState(v, this.current(v.name)))
      .sort((a, b) => a.name.localeCompare(b.name) || a.version - b.version);
  }
  allCurrent(): CurrentEntry[] {
    return [...this.#mirror.map.values()].filter((e): e is CurrentEntry => 'current' in e);
  }
  /** Whether a running service holds `name@version` at `now` (a held mark not past its `until`). */
  isHeld(name: string, version: number, now: number): boolean {
    for (const e of this.#mirror.map.values())
      if ('until' in e && e.name === name && e.version === version && e.until >= now) return true;
    return false;
  }
}
