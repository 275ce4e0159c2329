/**
 * What the console asks, and as whom: every question goes to a tooltx service on NATS over a
 * connection made with the logged-in person's own nkey seed, so the server's permissions decide
 * what a login may see and do (docs/security.md) — an auditor reaches only its tenant's audit
 * service, an operator its takeover service and, granted `query`, the operations query service. The
 * console reads no stream or bucket itself.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { KeyObject } from 'node:crypto';
import { errors, type NatsConnection } from '@nats-io/transport-node';
import type { ConsoleLogin } from '@tooltx/auth';
import { ErrorClass, TooltxError } from '@tooltx/contracts';
import {
  auditAnswerSchema,
  operationRecordSchema,
  takeoverRecordSchema,
  trustedReceiptKeys,
  verifyReceipt,
  type AuditRecord,
  type OperationRecord,
  type Receipt,
  type TakeoverRecord,
} from '@tooltx/lifecycle';
import { connectNats, decode, encode, inboxPrefixOf, permissionViolationOf, type Subjects } from '@tooltx/nats';
import { contractsListAnswerSchema, opsQueryAnswerSchema, type VersionRow } from '@tooltx/readside';
import type { Logger } from '@tooltx/runtime';
import { z } from 'zod';

/** Filters of the operations page, as validated. */
export interface OpsFilter {
  tenant?: string | undefined;
  contract?: string | undefined;
  state?: string | undefined;
  since?: number | undefined;
  until?: number | undefined;
}

/** The takeover service's answers the console reads (JSON). */
const takeoverAnswerSchema = z.union([
  z.object({ ok: z.literal(true), takeovers: z.array(takeoverRecordSchema.extend({ status: z.string() })) }),
  z.object({ ok: z.literal(true), operation: operationRecordSchema }),
  z.object({
    ok: z.literal(false),
    error: z.object({
      class: z.string(),
      issues: z
        .array(z.object({ path: z.array(z.union([z.string(), z.number()])), code: z.string(), message: z.string() }))
        .optional(),
    }),
  }),
]);

/** How long one request to a service may take, ms. */
const REQUEST_MS = 10_000;
/** Most records the operations page shows. */
export const MAX_ROWS = 200;

export type Outcome = 'committed' | 'not_applied' | 'effect_kept' | 'undone_by_hand';

/** A receipt and whether its signature verifies against the deployment's receipt keys. */
export interface CheckedReceipt {
  receipt: Receipt;
  valid: boolean;
}

export class Backend {
  readonly #conns = new Map<string, Promise<NatsConnection>>();
  readonly #trusted: ReadonlyMap<string, KeyObject>;
  #closed = false;

  constructor(
    private readonly o: { natsUrl: string; authDir: string; subjects: Subjects; log: Logger; receiptKeysFile: string },
  ) {
    this.#trusted = trustedReceiptKeys(JSON.parse(readFileSync(o.receiptKeysFile, 'utf8')) as Record<string, string>);
  }

  /** One connection per identity, made at its first use and shared by its sessions. */
  #conn(login: ConsoleLogin): Promise<NatsConnection> {
    const key = login.seed;
    let c = this.#conns.get(key);
    if (!c) {
      const r = login.role;
      const role = r.kind === 'operator' ? r : { kind: 'auditor' as const, tenant: r.tenant, actor: r.actor };
      c = connectNats({
        servers: this.o.natsUrl,
        name: `console:${r.kind === 'operator' ? r.operator : `${r.tenant}/${r.actor}`}`,
        nkeySeedFile: join(this.o.authDir, login.seed),
        inboxPrefix: inboxPrefixOf(role),
      });
      this.#conns.set(key, c);
      // A failed connection is forgotten: the next request tries again.
      c.catch(() => this.#conns.delete(key));
    }
    return c;
  }

  /**
   * One request of `login`'s identity. `grant`: the operator grant the subject needs (docs/security.md
   * "Identity"), named in the refusal when the server does not let this identity publish there.
   */
  async #request(login: ConsoleLogin, subject: string, body: Uint8Array, grant?: string): Promise<Uint8Array> {
    if (this.#closed) throw new TooltxError(ErrorClass.DependencyUnavailable, 'the console is stopping');
    try {
      const nc = await this.#conn(login);
      return (await nc.request(subject, body, { timeout: REQUEST_MS })).data;
    } catch (err) {
      if (permissionViolationOf(err))
        throw new TooltxError(ErrorClass.Forbidden, 'the server does not let this identity ask that', {
          issues: [
            {
              path: [],
              code: 'not_granted',
              message:
                grant && login.role.kind === 'operator'
                  ? `operator ${login.role.operator} is not granted "${grant}": whoever keeps the identity list adds "${grant}" to its "may" list and runs tooltx auth generate again (docs/security.md)`
                  : "this login's identity may not ask that of the server (docs/security.md)",
            },
          ],
        });
      if (
        err instanceof errors.NoRespondersError ||
        (err instanceof Error && err.cause instanceof errors.NoRespondersError)
      )
        throw new TooltxError(ErrorClass.DependencyUnavailable, 'no service answers', { retryAfterMs: 2_000 });
      throw new TooltxError(ErrorClass.DependencyUnavailable, 'the service did not answer', {
        cause: err,
        retryAfterMs: 2_000,
      });
    }
  }

  async #json<S extends z.ZodType>(
    login: ConsoleLogin,
    subject: string,
    req: object,
    schema: S,
    grant?: string,
  ): Promise<z.infer<S>> {
    const bytes = await this.#request(login, subject, new TextEncoder().encode(JSON.stringify(req)), grant);
    return schema.parse(JSON.parse(new TextDecoder().decode(bytes)));
  }

  /** Throws the service's refusal as a typed error. */
  #refused(error: { class: string; issues?: { path: (string | number)[]; code: string; message: string }[] }): never {
    const cls = (Object.values(ErrorClass) as string[]).includes(error.class)
      ? (error.class as ErrorClass)
      : ErrorClass.DependencyUnavailable;
    throw new TooltxError(cls, 'refused by the service', error.issues ? { issues: error.issues } : {});
  }

  /** Operations by filter: an operator through the operations query, an auditor through its audit service. */
  async operations(login: ConsoleLogin, f: OpsFilter): Promise<AuditRecord[]> {
    const range = {
      ...(f.since !== undefined ? { since: f.since } : {}),
      ...(f.until !== undefined ? { until: f.until } : {}),
    };
    const filters = {
      ...(f.state ? { state: f.state } : {}),
      ...(f.contract ? { contract: f.contract } : {}),
      ...range,
      limit: MAX_ROWS,
    };
    if (login.role.kind === 'operator') {
      const a = await this.#json(
        login,
        this.o.subjects.opsQuery(login.role.operator),
        { action: 'list', ...(f.tenant ? { tenant: f.tenant } : {}), ...filters },
        opsQueryAnswerSchema,
        'query',
      );
      if (!a.ok) this.#refused(a.error);
      return 'operations' in a ? a.operations : [];
    }
    // An auditor's own tenant only: another tenant asked for is nothing.
    if (f.tenant && f.tenant !== login.role.tenant) return [];
    const a = await this.#audit(login, { kind: 'list', ...filters });
    return 'records' in a && Array.isArray(a.records) ? a.records : [];
  }

  /** One operation's audit record, or null. */
  async record(login: ConsoleLogin, tenant: string, operationKey: string): Promise<AuditRecord | null> {
    if (login.role.kind === 'operator') {
      const a = await this.#json(
        login,
        this.o.subjects.opsQuery(login.role.operator),
        { action: 'show', operationKey, tenant },
        opsQueryAnswerSchema,
        'query',
      );
      if (!a.ok) this.#refused(a.error);
      return 'record' in a ? a.record : null;
    }
    if (tenant !== login.role.tenant) return null;
    const a = await this.#audit(login, { kind: 'show', operationKey });
    return 'record' in a ? a.record : null;
  }

  async #audit(login: ConsoleLogin, req: object) {
    if (login.role.kind !== 'auditor') throw new TooltxError(ErrorClass.Forbidden, 'auditors only');
    const bytes = await this.#request(login, this.o.subjects.audit(login.role.tenant, login.role.actor), encode(req));
    const a = decode(auditAnswerSchema, bytes);
    if ('error' in a) this.#refused(a.error);
    return a;
  }

  /** The operation's folded state (no bodies) through the takeover service, with its receipt checked; operators only. */
  async operation(
    login: ConsoleLogin,
    tenant: string,
    operationKey: string,
  ): Promise<{ state: OperationRecord; receipt?: CheckedReceipt } | null> {
    if (login.role.kind !== 'operator') return null;
    const a = await this.#json(
      login,
      this.o.subjects.takeover(login.role.operator),
      { action: 'show', operationKey, tenant },
      takeoverAnswerSchema,
    );
    if (!a.ok) {
      if (a.error.class === ErrorClass.NotFound) return null;
      this.#refused(a.error);
    }
    if (!('operation' in a)) return null;
    const state = a.operation;
    return state.receipt
      ? { state, receipt: { receipt: state.receipt, valid: verifyReceipt(state.receipt, this.#trusted) } }
      : { state };
  }

  /** The open takeovers, oldest first; operators only. */
  async takeovers(login: ConsoleLogin): Promise<(TakeoverRecord & { status: string })[]> {
    if (login.role.kind !== 'operator') throw new TooltxError(ErrorClass.Forbidden, 'operators only');
    const a = await this.#json(
      login,
      this.o.subjects.takeover(login.role.operator),
      { action: 'list' },
      takeoverAnswerSchema,
    );
    if (!a.ok) this.#refused(a.error);
    return 'takeovers' in a ? a.takeovers : [];
  }

  /**
   * Every registered contract version with its usage over the last 24 hours, through the contracts
   * service (docs/contracts.md); operators granted `contracts` only (the server refuses others).
   */
  async contracts(login: ConsoleLogin): Promise<VersionRow[]> {
    if (login.role.kind !== 'operator') throw new TooltxError(ErrorClass.Forbidden, 'operators only');
    const a = await this.#json(
      login,
      this.o.subjects.opsContracts(login.role.operator),
      { action: 'list' },
      contractsListAnswerSchema,
      'contracts',
    );
    if (!a.ok) this.#refused(a.error);
    return a.versions;
  }

  /** Records a person's resolution through the takeover service (the same rules as `tooltx takeover resolve`). */
  async resolve(
    login: ConsoleLogin,
    r: { tenant: string; operationKey: string; outcome: Outcome; resourceId?: string | undefined },
  ): Promise<OperationRecord> {
    if (login.role.kind !== 'operator') throw new TooltxError(ErrorClass.Forbidden, 'operators only');
    const outcome =
      r.outcome === 'committed' ? { kind: 'committed', resourceId: r.resourceId ?? '' } : { kind: r.outcome };
    const a = await this.#json(
      login,
      this.o.subjects.takeover(login.role.operator),
      { action: 'resolve', operationKey: r.operationKey, tenant: r.tenant, outcome },
      takeoverAnswerSchema,
    );
    if (!a.ok) this.#refused(a.error);
    if (!('operation' in a)) throw new TooltxError(ErrorClass.DependencyUnavailable, 'unexpected answer');
    this.o.log.info(
      { operator: login.role.operator, tenant: r.tenant, operationKey: r.operationKey, outcome: r.outcome },
      'takeover resolved through the console',
    );
    return a.operation;
  }

  /** Closes every identity's connection (drained). */
  async close(): Promise<void> {
    this.#closed = true;
    const all = [...this.#conns.values()];
    this.#conns.clear();
    await Promise.all(all.map((c) => c.then((nc) => nc.drain()).catch(() => undefined)));
  }
}
