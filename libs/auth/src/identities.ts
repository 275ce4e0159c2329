import { z } from 'zod';
import { ErrorClass, ID_PATTERN, MAX_OPERATOR_ACTOR_ID, TooltxError, type FieldIssue } from '@tooltx/contracts';
import { inboxPrefixOf, SERVICE_NAMES, type Role } from '@tooltx/nats';
import { partialTenantLimitsSchema, resolveLimits, type TenantSpec, type Topology } from '@tooltx/streams';

/**
 * Identity the server enforces (FM-06, FM-32): one declarative list of tenants,
 * actors, auditors, services and the provisioner becomes a nats-server configuration in which
 * every user is an nkey with publish/subscribe allow-lists. Agents may publish only their own
 * intent subject, request only their own status subject and subscribe only to their own inbox
 * prefix; each service gets only the JetStream API subjects it uses; only the provisioner may
 * create, update, delete or purge streams and durable consumers.
 */

const id = z.string().regex(ID_PATTERN, 'must match ^[a-z0-9_-]{1,64}$ (one subject token, no wildcard)');

/**
 * What an operator may do beyond takeovers: `compensate` (`tooltx compensate`), `confirm` (`tooltx
 * confirm` and `tooltx discard`: one grant for both, since either is the decision a held-back
 * operation waits for, as one permission of its contract covers both for an agent), `query` (`tooltx
 * ops list | show` and the console's operations pages: every tenant's audit records, no bodies),
 * `contracts` (`tooltx contracts list | usage | deprecate | retire | revert`: the contract registry,
 * docs/contracts.md).
 */
export const OPERATOR_GRANTS = ['compensate', 'confirm', 'query', 'debug', 'contracts'] as const;
export type OperatorGrant = (typeof OPERATOR_GRANTS)[number];

/** An operator of the list: a bare id (takeovers only), or an id with the grants it holds. */
const operatorEntrySchema = z.union([
  id,
  z.strictObject({
    id,
    may: z
      .array(z.enum(OPERATOR_GRANTS))
      .max(OPERATOR_GRANTS.length)
      .refine((g) => new Set(g).size === g.length, 'each grant once')
      .default([]),
  }),
]);

/** One operator with its grants, whatever form its entry had. */
export interface Operator {
  id: string;
  may: ReadonlySet<OperatorGrant>;
}

/** The operators of a list with their grants (a bare id holds none). */
export function operatorsOf(list: IdentityList): Operator[] {
  return identityListSchema
    .parse(list)
    .operators.map((o) => (typeof o === 'string' ? { id: o, may: new Set() } : { id: o.id, may: new Set(o.may) }));
}

/** The ids of the operators who may compensate (`may: ['compensate']`). */
export function compensatingOperators(list: IdentityList): string[] {
  return operatorsOf(list)
    .filter((o) => o.may.has('compensate'))
    .map((o) => o.id);
}

/** The ids of the operators who may query operations across tenants (`may: ['query']`). */
export function queryingOperators(list: IdentityList): string[] {
  return operatorsOf(list)
    .filter((o) => o.may.has('query'))
    .map((o) => o.id);
}

/** The ids of the operators who may read and change the contract registry (`may: ['contracts']`). */
export function contractOperators(list: IdentityList): string[] {
  return operatorsOf(list)
    .filter((o) => o.may.has('contracts'))
    .map((o) => o.id);
}

/** The ids of the operators who may confirm or discard held-back operations (`may: ['confirm']`). */
export function confirmingOperators(list: IdentityList): string[] {
  return operatorsOf(list)
    .filter((o) => o.may.has('confirm'))
    .map((o) => o.id);
}

/**
 * The ids of the operators granted `debug` (`may: ['debug']`): `tooltx debug` switches debug
 * sampling of a contract on and reads its scrubbed samples, every switch and read audited
 * (docs/debug-samples.md).
 */
export function debuggingOperators(list: IdentityList): string[] {
  return operatorsOf(list)
    .filter((o) => o.may.has('debug'))
    .map((o) => o.id);
}

export const identityListSchema = z.strictObject({
  tenants: z
    .array(
      z.strictObject({
        id,
        actors: z.array(id).default([]),
        auditors: z.array(id).default([]),
        limits: partialTenantLimitsSchema.optional(),
      }),
    )
    .min(1)
    .refine((ts) => new Set(ts.map((t) => t.id)).size === ts.length, 'tenant ids must be unique'),
  /** Extra durable names the executor may pull from (e.g. a second executor group during a migration). */
  executorDurables: z.array(id).default([]),
  /**
   * Operators: people who resolve takeovers. They reach the takeover service, which records their
   * id (from the subject the server pinned them to) in the resolution event. An entry is an id, or
   * `{ id, may: ['compensate', 'confirm'] }` for one who may also compensate operations with `tooltx
   * compensate`, or confirm and discard held-back ones with `tooltx confirm` / `tooltx discard`
   * (docs/compensation.md); a bare id may do neither.
   */
  operators: z.array(operatorEntrySchema).default([]),
  /** Every tenant's limits unless its own entry says otherwise (docs/tenancy.md); unset ones take the defaults. */
  limits: partialTenantLimitsSchema.optional(),
});
export type IdentityList = z.input<typeof identityListSchema>;

/** The tenants of an identity list with their resolved limits (docs/tenancy.md). */
export function tenantsOf(list: IdentityList): TenantSpec[] {
  const parsed = identityListSchema.parse(list);
  return parsed.tenants.map((t) => ({ id: t.id, limits: resolveLimits(parsed.limits, t.limits) }));
}

/** Where an identity of the list is (the field path of its entry) and what it is, for errors. */
interface ListedIdentity {
  role: Role;
  path: (string | number)[];
}

const describeRole = (r: Role): string =>
  r.kind === 'agent'
    ? `actor ${r.tenant}/${r.actor}`
    : r.kind === 'auditor'
      ? `auditor ${r.tenant}/${r.actor}`
      : r.kind === 'operator'
        ? `operator ${r.operator}`
        : r.kind === 'service'
          ? `service ${r.service}`
          : 'the provisioner';
const describeEntry = (e: ListedIdentity): string =>
  e.path.length ? `${e.path.join('.')} (${describeRole(e.role)})` : describeRole(e.role);

/**
 * Refuses an identity list in which two identities would share a reply inbox, or one user's inbox
 * would lie inside another's (FM-32: a user subscribes to `<its inbox prefix>.>`, so either would
 * let one read the other's replies), and extra executor durables that name another service's
 * durable. Rules (the id-collision cases):
 * - ids starting with `_` are reserved for tooltx's own inbox namespaces (`_INBOX._svc.<service>`,
 *   `_INBOX._op.<operator>`, `_INBOX._provisioner`): a tenant `_svc` with an actor `executor` would
 *   otherwise receive the executor service's replies. Code `reserved_id`, for tenant, actor,
 *   auditor and operator ids.
 * - no two identities have equal inbox prefixes, and none is a token prefix of another (an actor
 *   and an auditor of one tenant with the same id, an id listed twice). Code `inbox_collision`.
 * - `executorDurables` never names a durable of the topology (the executor would pull another
 *   service's messages). Code `durable_collision`.
 * Throws `TooltxError` (`invalid_input`) whose message names the offending entry by its field path
 * and what it collides with; `issues` carries that path. The inbox rule holds for any list that
 * passes these checks, by construction of {@link inboxPrefixOf}: agents and auditors take 3 tokens
 * under a tenant that never starts with `_`; services, operators and the provisioner live under
 * `_svc`, `_op`, `_provisioner`.
 */
export function checkIdentityList(list: IdentityList, topo?: Topology): void {
  const parsed = identityListSchema.parse(list);
  const refuse = (issue: FieldIssue, detail: string): never => {
    throw new TooltxError(ErrorClass.InvalidInput, `identity list: ${detail}`, { issues: [issue] });
  };
  const reserved = (id: string, path: (string | number)[], what: string) => {
    if (id.startsWith('_')) {
      refuse(
        { path, code: 'reserved_id', message: 'ids starting with _ are reserved for tooltx (_svc, _op, _provisioner)' },
        `${path.join('.')}: ${what} ${JSON.stringify(id)} starts with "_": ids starting with _ are reserved for tooltx's own inbox namespaces (_svc, _op, _provisioner)`,
      );
    }
  };
  const entries: ListedIdentity[] = [
    { role: { kind: 'provisioner' }, path: [] },
    ...SERVICE_NAMES.map((service) => ({ role: { kind: 'service' as const, service }, path: [] })),
  ];
  parsed.tenants.forEach((t, i) => {
    reserved(t.id, ['tenants', i, 'id'], 'tenant');
    t.actors.forEach((actor, j) => {
      reserved(actor, ['tenants', i, 'actors', j], 'actor');
      entries.push({ role: { kind: 'agent', tenant: t.id, actor }, path: ['tenants', i, 'actors', j] });
    });
    t.auditors.forEach((actor, j) => {
      reserved(actor, ['tenants', i, 'auditors', j], 'auditor');
      entries.push({ role: { kind: 'auditor', tenant: t.id, actor }, path: ['tenants', i, 'auditors', j] });
    });
  });
  operatorsOf(parsed).forEach(({ id: operator, may }, k) => {
    const path = typeof parsed.operators[k] === 'string' ? ['operators', k] : ['operators', k, 'id'];
    reserved(operator, path, 'operator');
    // A compensating or confirming operator's requests enter a tenant's intake stream under
    // `_op-<id>`, one subject token of at most 64 characters; a query, a debug request or a
    // contracts request is not an intent.
    const intents = [...may].filter((g) => g !== 'query' && g !== 'debug' && g !== 'contracts');
    if (intents.length > 0 && operator.length > MAX_OPERATOR_ACTOR_ID) {
      const what = intents.join(' and ');
      refuse(
        {
          path,
          code: 'too_long',
          message: `an operator who may ${what} has an id of at most ${MAX_OPERATOR_ACTOR_ID} characters`,
        },
        `${path.join('.')}: operator ${JSON.stringify(operator)} may ${what}, so its id is at most ${MAX_OPERATOR_ACTOR_ID} characters (its requests are recorded under the actor _op-<id>, one subject token of 64)`,
      );
    }
    entries.push({ role: { kind: 'operator', operator }, path });
  });
  // Equal prefixes, then a prefix that lies inside another (its token ancestors).
  const byPrefix = new Map<string, ListedIdentity>();
  for (const e of entries) {
    const prefix = inboxPrefixOf(e.role);
    const other = byPrefix.get(prefix);
    if (other) {
      refuse(
        { path: e.path, code: 'inbox_collision', message: `same reply inbox as ${describeEntry(other)}` },
        `${describeEntry(e)} would have the reply inbox ${prefix} of ${describeEntry(other)}: two identities may not share an inbox (FM-32); give one another id`,
      );
    }
    byPrefix.set(prefix, e);
  }
  for (const [prefix, e] of byPrefix) {
    const tokens = prefix.split('.');
    for (let n = 2; n < tokens.length; n++) {
      const outer = byPrefix.get(tokens.slice(0, n).join('.'));
      if (outer) {
        refuse(
          { path: e.path, code: 'inbox_collision', message: `reply inbox inside that of ${describeEntry(outer)}` },
          `${describeEntry(e)} would have the reply inbox ${prefix}, inside ${describeEntry(outer)}'s: it could read these replies (FM-32); give one another id`,
        );
      }
    }
  }
  if (topo) {
    const owners = new Map(topo.consumers.map((c) => [c.config.durable_name, c.stream]));
    parsed.executorDurables.forEach((d, k) => {
      const stream = owners.get(d);
      if (stream) {
        refuse(
          {
            path: ['executorDurables', k],
            code: 'durable_collision',
            message: `${d} is a durable of the topology (${stream})`,
          },
          `executorDurables.${k}: extra executor durable ${JSON.stringify(d)} is already a durable of the topology (stream ${stream}); name the executor's extra durable otherwise`,
        );
      }
    });
  }
}
