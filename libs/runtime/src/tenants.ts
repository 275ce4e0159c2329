import type { KV } from '@nats-io/kv';
import { KvMirror } from '@tooltx/nats';
import { tenantEntrySchema, type TenantEntry, type TenantLimits } from '@tooltx/streams';
import type { Logger } from './logger.js';

/** What a service runs for one tenant: stopped when the tenant leaves the list or the service stops. */
export interface TenantServing {
  stop(): Promise<void>;
  /** New limits for a tenant already served (the provisioner changed them). */
  update?(limits: TenantLimits): void;
}

/**
 * The tenants a service serves, from the tenants bucket the provisioner writes (docs/tenancy.md):
 * one watch; `serve` runs for each listed tenant (e.g. its intake consumer), is told of new limits,
 * and is stopped when the tenant is taken out. A tenant whose streams are not there yet (listed
 * before `tooltx streams apply` finished) is tried again every few seconds, logged once per try.
 */
export class TenantWatch {
  readonly #mirror: KvMirror<TenantEntry>;
  readonly #log: Logger;
  readonly #serve: (tenant: string, limits: TenantLimits) => Promise<TenantServing>;
  readonly #tenants = new Map<
    string,
    { serving: TenantServing | null; limits: TenantLimits; removed: boolean; started: Promise<void> }
  >();
  #stopped = false;

  constructor(kv: KV, log: Logger, serve: (tenant: string, limits: TenantLimits) => Promise<TenantServing>) {
    this.#log = log;
    this.#serve = serve;
    this.#mirror = new KvMirror(kv, tenantEntrySchema, {
      log,
      what: 'tenant',
      onChange: (tenant, entry) => this.#changed(tenant, entry),
    });
  }

  /** Starts watching; resolves once the listed tenants are known (serving each starts meanwhile). */
  async start(): Promise<void> {
    await this.#mirror.start();
  }

  /** The tenants listed now. */
  get tenants(): string[] {
    return [...this.#tenants.keys()];
  }

  /** Resolves once every tenant known now is served (or given up on: taken out, stopped). */
  async ready(): Promise<void> {
    await Promise.all([...this.#tenants.values()].map((t) => t.started));
  }

  #changed(tenant: string, entry: TenantEntry | null): void {
    if (this.#stopped) return;
    const cur = this.#tenants.get(tenant);
    if (entry && cur && !cur.removed) {
      cur.limits = entry.limits;
      cur.serving?.update?.(entry.limits);
      return;
    }
    if (!entry) {
      if (!cur) return;
      cur.removed = true;
      this.#tenants.delete(tenant);
      void cur.started
        .then(() => cur.serving?.stop())
        .catch((err: unknown) => this.#log.error({ err, tenant }, 'stopping a tenant failed'));
      this.#log.info({ tenant }, 'tenant no longer listed: not served');
      return;
    }
    const t = {
      serving: null as TenantServing | null,
      limits: entry.limits,
      removed: false,
      started: Promise.resolve(),
    };
    this.#tenants.set(tenant, t);
    t.started = (async () => {
      for (let tries = 1; !this.#stopped && !t.removed; tries++) {
        try {
          const serving = await this.#serve(tenant, t.limits);
          if (this.#stopped || t.removed) await serving.stop();
          else t.serving = serving;
          return;
        } catch (err) {
          this.#log.warn(
            { err, tenant, tries },
            'cannot serve this tenant yet (are its streams provisioned?): trying again',
          );
          await new Promise((r) => setTimeout(r, Math.min(10_000, 500 * tries)));
        }
      }
    })();
  }

  /** Stops watching and stops serving every tenant (each `stop()` waits for its in-flight work). */
  async stop(): Promise<void> {
    this.#stopped = true;
    await this.#mirror.stop();
    const all = [...this.#tenants.values()];
    this.#tenants.clear();
    await Promise.all(
      all.map(async (t) => {
        await t.started;
        await t.serving?.stop();
      }),
    );
  }
}
