import { chmodSync, existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { createUser, fromSeed, type KeyPair } from '@nats-io/nkeys';
import { z } from 'zod';
import { ErrorClass, ID_PATTERN, TooltxError, type FieldIssue } from '@tooltx/contracts';
import { generateReceiptKey, receiptKeyOf } from '@tooltx/lifecycle';
import { jetstreamConfigBlock, type Durability, type Subjects } from '@tooltx/nats';
import { partialTenantLimitsSchema, resolveLimits, type TenantSpec } from './tenancy.js';
import { Durables, type Topology } from './topology.js';

/**
 * Identity the server enforces (DESIGN.md "Identity"): one declarative list of tenants,
 * actors, auditors, services and the provisioner becomes a nats-server configuration in which
 * every user is an nkey with publish/subscribe allow-lists. Agents may publish only their own
 * intent subject, request only their own status subject and subscribe only to their own inbox
 * prefix; each service gets only the JetStream API subjects it uses; only the provisioner may
 * create, update, delete or purge streams and durable consumers.
 */

const id = z.string().regex(ID_PATTERN, 'must match ^[a-z0-9_-]{1,64}$ (one subject token, no wildcard)');

export const identityListSchema = z.strictObject({
  tenants: z
    .array(z.strictObject({ id, actors: z.array(id).default([]), auditors: z.array(id).default([]), limits: partialTenantLimitsSchema.optional() }))
    .min(1)
    .refine((ts) => new Set(ts.map((t) => t.id)).size === ts.length, 'tenant ids must be unique'),
  /** Extra durable names the executor may pull from (e.g. a second executor group during a migration). */
  executorDurables: z.array(id).default([]),
  /**
   * Operators: people who resolve takeovers. They reach only the takeover service, which
   * records their id (from the subject the server pinned them to) in the resolution event.
   */
  operators: z.array(id).default([]),
  /** Every tenant's limits unless its own entry says otherwise (docs/tenancy.md); unset ones take the defaults. */
  limits: partialTenantLimitsSchema.optional(),
});
export type IdentityList = z.input<typeof identityListSchema>;

/** The tenants of an identity list with their resolved limits (docs/tenancy.md). */
export function tenantsOf(list: IdentityList): TenantSpec[] {
  const parsed = identityListSchema.parse(list);
  return parsed.tenants.map((t) => ({ id: t.id, limits: resolveLimits(parsed.limits, t.limits) }));
}

export type Role =
  | { kind: 'agent'; tenant: string; actor: string }
  | { kind: 'auditor'; tenant: string; actor: string }
  | { kind: 'service'; service: ServiceName }
  | { kind: 'operator'; operator: string }
  | { kind: 'provisioner' };
export const SERVICE_NAMES = ['authorizer', 'executor', 'reconciler', 'audit-projector'] as const;
export type ServiceName = (typeof SERVICE_NAMES)[number];

/** NATS per-user permissions, in the server's own field names. */
export interface Permissions {
  publish: { allow: string[]; deny?: string[] };
  subscribe: { allow: string[]; deny?: string[] };
  /**
   * nats-server's dynamic reply permission. No role of ours sets it: the server records every
   * message with a reply subject delivered to such a user — every JetStream delivery and watch
   * update included, not only requests — for 2 minutes and, past 4,096 entries, scans them all on
   * each further delivery (nats-server#6058; upstream prunes less often since #6064, 2.9.10 does
   * not): nats-server's CPU per call grew about 3× within two minutes of load (docs/performance.md,
   * "nats-server CPU growing with calls"). Request/reply services may publish only on the
   * server-made response subjects of service imports instead ({@link RESPONSE_SUBJECTS}).
   */
  allow_responses?: boolean;
}

/** The inbox prefix of a user: replies to its requests arrive only under it. */
export function inboxPrefixOf(role: Role): string {
  switch (role.kind) {
    case 'agent':
    case 'auditor':
      return `_INBOX.${role.tenant}.${role.actor}`;
    case 'service':
      return `_INBOX._svc.${role.service}`;
    case 'operator':
      return `_INBOX._op.${role.operator}`;
    case 'provisioner':
      return '_INBOX._provisioner';
  }
}

/**
 * Whether `reply` lies in `role`'s own reply inbox (`<inboxPrefixOf(role)>.…`). A request/reply
 * service answers only there: the reply subject is chosen by the requester, and the service may
 * publish on subjects the requester may not (e.g. operation subjects), so answering anywhere else
 * would let a requester make the service write into another tenant's stream (FM-31, FM-32).
 */
export function isOwnReplyInbox(role: Role, reply: string | undefined): boolean {
  if (reply === undefined || /[\s*>]/.test(reply)) return false;
  // Across a service import the server rewrote the reply to a mapping back into the requester's own
  // account (generateAuth puts agents, auditors and operators in their own accounts).
  return reply.startsWith('_R_.') || reply.startsWith(`${inboxPrefixOf(role)}.`);
}

/**
 * The reply subjects nats-server makes for a request that crossed a service import (`_R_.<id>.<id>`
 * in the exporting account): an answer published there goes back to the requester's account only.
 */
export const RESPONSE_SUBJECTS = '_R_.>';

/** Where an identity of the list is (the field path of its entry) and what it is, for errors. */
interface ListedIdentity {
  role: Role;
  path: (string | number)[];
}

const describeRole = (r: Role): string =>
  r.kind === 'agent' ? `actor ${r.tenant}/${r.actor}`
    : r.kind === 'auditor' ? `auditor ${r.tenant}/${r.actor}`
      : r.kind === 'operator' ? `operator ${r.operator}`
        : r.kind === 'service' ? `service ${r.service}`
          : 'the provisioner';
const describeEntry = (e: ListedIdentity): string => (e.path.length ? `${e.path.join('.')} (${describeRole(e.role)})` : describeRole(e.role));

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
  parsed.operators.forEach((operator, k) => {
    reserved(operator, ['operators', k], 'operator');
    entries.push({ role: { kind: 'operator', operator }, path: ['operators', k] });
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
          { path: ['executorDurables', k], code: 'durable_collision', message: `${d} is a durable of the topology (${stream})` },
          `executorDurables.${k}: extra executor durable ${JSON.stringify(d)} is already a durable of the topology (stream ${stream}); name the executor's extra durable otherwise`,
        );
      }
    });
  }
}

/**
 * Every durable consumer name the deployment knows: the topology's and the extra executor
 * durables of the identity list. Nobody but the provisioner may create, update or delete a
 * consumer of one of these names, on any stream ({@link permissionsFor}).
 */
export function knownDurables(topo: Topology, executorDurables: string[] = []): string[] {
  return [...new Set([...Object.values(Durables), ...topo.consumers.map((c) => c.config.durable_name), ...executorDurables])];
}

/**
 * The permissions of one role under `subjects`' prefix. Pure: a test reads them directly.
 * JetStream API subjects follow the NATS docs ("JetStream wire API reference").
 *
 * Consumers (only the provisioner creates, updates or deletes durable consumers). What
 * nats-server 2.9.10 does with each create subject, observed on the real server
 * (test/identity.e2e.test.ts, FM-32):
 * - `$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>`, the create API of 2.9.0+ and what the nats.js
 *   v3 client sends for every named consumer (ordered consumers `oc_<nuid>_<n>`, KV watchers
 *   `KV_WATCHER_<nuid>`): the server refuses a body whose `durable_name` differs from `<name>`
 *   (10017) or whose `filter_subject` differs from `<filter>` (10131); otherwise it creates
 *   consumer `<name>` — durable when the body carries `durable_name` — or, when `<name>` exists,
 *   UPDATES it (2.9 has no create-only request). So the name token is the only handle on which
 *   consumer a request touches.
 * - `$JS.API.CONSUMER.CREATE.<stream>` (legacy ephemeral): refuses a `durable_name` (10020), but a
 *   body `name` equal to an existing durable updates that durable and even drops its durability.
 *   The name is in the body, out of any permission's reach: nobody but the provisioner gets it.
 * - `$JS.API.CONSUMER.DURABLE.CREATE.<stream>.<durable>` (legacy durable): the provisioner's only.
 * The rule: a service creates consumers only through the first form, on the streams and filters it
 * already reads (a KV watch, the authorizer's status watch), and every service is denied the
 * create (all three forms), update and delete subjects of every {@link knownDurables} name on every
 * stream. A name-prefix rule ("names starting with `authorizer_`") cannot be written: permission
 * wildcards match whole tokens and a consumer name is one token; fixed names would collide between
 * instances of one service. What a service can still do: create, under a fresh name, a consumer
 * whose body carries `durable_name` equal to that name (the subject does not tell a durable from an
 * ephemeral), or an ephemeral with a long `inactive_threshold` — only on a stream and filter it may
 * already read, so it reads nothing new, and it can never create, update, pull from (other than its
 * own) or delete a durable of the deployment. Agents, auditors and operators get no JetStream API
 * subject at all.
 */
export function permissionsFor(
  role: Role,
  s: Subjects,
  topo: Topology,
  executorDurables: string[] = [],
  /** The deployment's tenants: each has its own intake and decision streams (docs/tenancy.md). */
  tenants: string[] = topo.tenants?.map((t) => t.id) ?? [],
): Permissions {
  const api = '$JS.API';
  const inbox = `${inboxPrefixOf(role)}.>`;
  // Where a request/reply service (status, audit, takeover) answers: agents, auditors and operators
  // live in their own accounts and reach these services through service imports, so every request
  // arrives with a reply subject the server made (`_R_.…`) that routes the answer back to the
  // requester's account and nowhere else ({@link generateAuth}). Never `allow_responses` (see
  // Permissions).
  const answers = RESPONSE_SUBJECTS;
  const streams = Object.values(topo.streams).map((st) => st.name);
  const kvStream = (bucket: string) => `KV_${bucket}`;
  const buckets = [topo.results.bucket, topo.projections.reconcile.bucket, topo.projections.audit.bucket, topo.tasks.bucket, topo.tenantsBucket.bucket];
  const intentsStreams = tenants.map((t) => s.intentsStream(t));
  const decisionsStreams = tenants.map((t) => s.decisionsStream(t));
  // What every service's start-up check reads (never writes).
  const check = [
    ...[...streams, ...intentsStreams, ...decisionsStreams].map((n) => `${api}.STREAM.INFO.${n}`),
    ...buckets.map((b) => `${api}.STREAM.INFO.${kvStream(b)}`),
    ...topo.consumers.map((c) => `${api}.CONSUMER.INFO.${c.stream}.${c.config.durable_name}`),
  ];

  const pull = (stream: string, durable: string) => [
    `${api}.CONSUMER.MSG.NEXT.${stream}.${durable}`,
    `${api}.CONSUMER.INFO.${stream}.${durable}`,
    `$JS.ACK.${stream}.${durable}.>`,
  ];
  const directLast = (stream: string) => [`${api}.DIRECT.GET.${stream}.>`];
  // A read by sequence that a lagging replica cannot serve (direct gets may be answered by any
  // replica of an R3 stream) is asked again of the stream's leader (OperationStore, FM-29).
  const directSeq = (stream: string) => [`${api}.DIRECT.GET.${stream}`, `${api}.STREAM.MSG.GET.${stream}`];
  const kvRead = (bucket: string) => [...directLast(kvStream(bucket)), ...directSeq(kvStream(bucket)), `${api}.STREAM.INFO.${kvStream(bucket)}`];
  const kvWrite = (bucket: string) => [`$KV.${bucket}.>`];
  // A KV watch, key listing or history: an ordered push consumer on the bucket's own stream, named
  // in the subject and filtered to the bucket's keys (never the legacy name-in-body create).
  const kvWatch = (bucket: string) => [
    `${api}.CONSUMER.CREATE.${kvStream(bucket)}.*.$KV.${bucket}.>`,
    `${api}.CONSUMER.DELETE.${kvStream(bucket)}.*`, `${api}.CONSUMER.INFO.${kvStream(bucket)}.*`,
    `$JS.FC.${kvStream(bucket)}.>`,
  ];
  // Every service: no create, update or delete of a durable the deployment knows, on any stream.
  const durables = knownDurables(topo, executorDurables);
  const durableGuard = durables.flatMap((d) => [
    `${api}.CONSUMER.CREATE.*.${d}`, `${api}.CONSUMER.CREATE.*.${d}.>`,
    `${api}.CONSUMER.DURABLE.CREATE.*.${d}`, `${api}.CONSUMER.DELETE.*.${d}`,
  ]);
  const tasks = topo.tasks.bucket;
  const events = topo.streams.events.name;
  // The tenants and their limits: the authorizer and the audit-projector serve each listed one.
  const tenantsRead = [...kvRead(topo.tenantsBucket.bucket), ...kvWatch(topo.tenantsBucket.bucket)];

  switch (role.kind) {
    case 'agent':
      return {
        publish: { allow: [s.intent(role.tenant, role.actor), s.status(role.tenant, role.actor)] },
        subscribe: { allow: [inbox, s.pushesOf(role.tenant, role.actor)] },
      };
    case 'auditor':
      // Auditors reach audit records only through the audit service, on their own subject:
      // no stream, bucket or JetStream API subject — not intents, inputs, results, events or the KV.
      return { publish: { allow: [s.audit(role.tenant, role.actor)] }, subscribe: { allow: [inbox] } };
    case 'operator':
      return { publish: { allow: [s.takeover(role.operator)] }, subscribe: { allow: [inbox] } };
    case 'provisioner':
      return { publish: { allow: [`${api}.>`, `$KV.>`, `${s.prefix}.>`] }, subscribe: { allow: [inbox] } };
    case 'service': {
      switch (role.service) {
        case 'authorizer': {
          // The status watch: ordered consumers on the event log and the decision stream, created
          // with their filter in the subject; they may never pull from, create, update or delete a
          // durable of the deployment.
          const ordered = (stream: string, filter: string) => [
            `${api}.CONSUMER.CREATE.${stream}.*.${filter}`,
            `${api}.CONSUMER.MSG.NEXT.${stream}.*`,
            `${api}.CONSUMER.DELETE.${stream}.*`,
            `${api}.CONSUMER.INFO.${stream}.*`,
          ];
          return {
            publish: {
              allow: [
                ...check,
                ...tenantsRead,
                // Each tenant's intents; an intent that registered nothing is deleted once its
                // decision is recorded (docs/tenancy.md).
                ...intentsStreams.flatMap((n) => [...pull(n, Durables.authorizer), `${api}.STREAM.MSG.DELETE.${n}`]),
                ...directLast(events), ...directSeq(events),
                ...decisionsStreams.flatMap((n) => directLast(n)),
                ...kvRead(topo.results.bucket),
                ...ordered(events, s.allOps),
                ...tenants.flatMap((t) => ordered(s.decisionsStream(t), s.decisionsOf(t))),
                ...kvRead(tasks), ...kvWatch(tasks),
                s.allOps, s.allDecisions,
                // Status answers, and "poll now" pushed to a submission's agent.
                answers, s.allPush,
              ],
              deny: [...durableGuard, ...durables.flatMap((d) => [events, ...decisionsStreams].map((n) => `${api}.CONSUMER.MSG.NEXT.${n}.${d}`))],
            },
            subscribe: { allow: [inbox, s.allStatus] },
          };
        }
        case 'executor':
          return {
            publish: {
              allow: [
                ...check,
                ...[Durables.executor, ...executorDurables].flatMap((d) => pull(events, d)),
                ...directLast(events), ...directSeq(events), ...intentsStreams.flatMap((n) => directSeq(n)),
                ...kvRead(topo.results.bucket), ...kvWrite(topo.results.bucket),
                ...kvRead(tasks), ...kvWatch(tasks),
                s.allOps,
                // The answer pushed to the agent of each submission it ends.
                s.allPush,
              ],
              deny: durableGuard,
            },
            subscribe: { allow: [inbox] },
          };
        case 'audit-projector': {
          return {
            publish: {
              allow: [
                ...check,
                ...tenantsRead,
                ...pull(events, Durables.auditProjector), ...decisionsStreams.flatMap((n) => pull(n, Durables.auditDecisions)),
                ...kvRead(topo.projections.audit.bucket), ...kvWrite(topo.projections.audit.bucket),
                // The audit service lists a tenant's records through an ordered push consumer on the
                // bucket's own stream, and records every query and export before it answers.
                ...kvWatch(topo.projections.audit.bucket),
                s.allAuditLog,
                // Query answers.
                answers,
              ],
              deny: durableGuard,
            },
            subscribe: { allow: [inbox, s.allAudit] },
          };
        }
        case 'reconciler': {
          const bucket = role.service === 'reconciler' ? topo.projections.reconcile.bucket : topo.projections.audit.bucket;
          const durable = role.service === 'reconciler' ? Durables.reconciler : Durables.auditProjector;
          // The reconciler also appends recovery events and the results they carry, and lists its
          // own index (an ordered push consumer on its bucket's stream, headers only).
          const recovery =
            role.service === 'reconciler'
              ? [
                  s.allOps,
                  // The max-deliveries advisories of the event log's durables.
                  ...pull(topo.streams.advisories.name, Durables.reconcilerAdvisories),
                  ...kvRead(topo.results.bucket), ...kvWrite(topo.results.bucket),
                  ...kvWatch(bucket),
                  // Frozen tasks: it freezes and thaws them, and lists them for operators.
                  ...kvRead(tasks), ...kvWrite(tasks), ...kvWatch(tasks),
                  // Takeover answers.
                  answers,
                ]
              : [];
          return {
            publish: { allow: [...check, ...pull(events, durable), ...directLast(events), ...directSeq(events), ...kvRead(bucket), ...kvWrite(bucket), ...recovery], deny: durableGuard },
            // The reconciler answers operators' takeover requests (queue group).
            subscribe: { allow: role.service === 'reconciler' ? [inbox, s.allTakeover] : [inbox] },
          };
        }
      }
    }
  }
}

/** One generated user: its role, public nkey, and where its seed file was written. */
export interface GeneratedUser {
  role: Role;
  publicKey: string;
  seedFile: string;
  inboxPrefix: string;
}

/** The services that append `committed` and so sign receipts. */
export const RECEIPT_SIGNERS = ['executor', 'reconciler'] as const;

/** One node of a cluster (docs/cluster.md): its name, client address, route address and store. */
export interface ClusterNode {
  serverName: string;
  /** `host:port` of client connections (`-1` = a free port). */
  listen: string;
  /** `host:port` of routes between the nodes (a fixed port: the others list it). */
  clusterListen: string;
  /** Host the other nodes reach its routes at (default: `clusterListen`'s host). */
  routeHost?: string;
  storeDir: string;
}

/** A cluster of nodes sharing one set of accounts and users (docs/cluster.md). */
export interface ClusterSpec {
  /** The cluster's name (default `tooltx`). */
  name?: string;
  nodes: ClusterNode[];
}

export interface GeneratedAuth {
  /** The configuration of the (first) server. */
  configFile: string;
  /** One configuration per node: `[configFile]` for one server, `nats-server-<serverName>.conf` each for a cluster. */
  configFiles: string[];
  /** `{ "<keyId>": "<SPKI PEM>" }` — the receipt keys clients trust (TOOLTX_RECEIPT_KEYS_FILE). */
  receiptKeysFile: string;
  /** The private receipt key of a signing service (TOOLTX_SIGNING_KEY_FILE, mode 0600). */
  signingKeyFile(service: (typeof RECEIPT_SIGNERS)[number]): string;
  users: GeneratedUser[];
  /** Seed file of a role (throws `Error` when the list has no such user). */
  seedFile(role: Role): string;
}

/**
 * Writes `text` to `file` with mode 0600 whatever the file's mode was (`writeFileSync`'s mode applies
 * only to a file it creates), through a temporary file renamed into place: a crash never leaves it
 * half written.
 */
function writePrivate(file: string, text: string): void {
  const tmp = `${file}.${process.pid}.tmp`;
  writeFileSync(tmp, text, { mode: 0o600 });
  chmodSync(tmp, 0o600);
  renameSync(tmp, file);
}

/** Stable file name of a role's seed. */
function userName(role: Role): string {
  switch (role.kind) {
    case 'agent':
      return `agent.${role.tenant}.${role.actor}`;
    case 'auditor':
      return `auditor.${role.tenant}.${role.actor}`;
    case 'service':
      return `service.${role.service}`;
    case 'operator':
      return `operator.${role.operator}`;
    case 'provisioner':
      return 'provisioner';
  }
}

/** The user key pair in `file` when it holds a user nkey seed (`SU…`), else null (missing or anything else). */
function existingUserSeed(file: string): KeyPair | null {
  if (!existsSync(file)) return null;
  try {
    const seed = readFileSync(file, 'utf8').trim();
    if (!seed.startsWith('SU')) return null;
    return fromSeed(new TextEncoder().encode(seed));
  } catch {
    return null;
  }
}

/**
 * Writes `<outDir>/nats-server.conf` and one nkey seed per user under `<outDir>/nkeys/` (mode 0600);
 * an existing user seed there is kept (delete its file to rotate it), and the seed of a user no
 * longer on the list is removed.
 * The config holds only public keys. Throws `z.ZodError` for a malformed identity list (an actor
 * named `>`, `*` or `b.c` never reaches the config) and `TooltxError` (`invalid_input`) for ids that
 * collide across roles or are reserved ({@link checkIdentityList}); nothing is written then.
 */
export function generateAuth(
  list: IdentityList,
  o: {
    subjects: Subjects;
    topology: Topology;
    outDir: string;
    listen: string;
    storeDir: string;
    serverName?: string;
    /** What an acknowledgement promises (default `fsync`: `sync_interval: always`; docs/durability.md). */
    durability?: Durability;
    /** Write one configuration per node of this cluster instead of one server's (`listen`, `storeDir` and `serverName` unused). */
    cluster?: ClusterSpec;
  },
): GeneratedAuth {
  const parsed = identityListSchema.parse(list);
  checkIdentityList(parsed, o.topology);
  const roles: Role[] = [
    { kind: 'provisioner' },
    ...SERVICE_NAMES.map((service) => ({ kind: 'service' as const, service })),
    ...parsed.tenants.flatMap((t) => [
      ...t.actors.map((actor) => ({ kind: 'agent' as const, tenant: t.id, actor })),
      ...t.auditors.map((actor) => ({ kind: 'auditor' as const, tenant: t.id, actor })),
    ]),
    ...parsed.operators.map((operator) => ({ kind: 'operator' as const, operator })),
  ];
  const keyDir = join(o.outDir, 'nkeys');
  mkdirSync(keyDir, { recursive: true, mode: 0o700 });
  const users: GeneratedUser[] = roles.map((role) => {
    const seedFile = join(keyDir, `${userName(role)}.nk`);
    // A user's seed is kept across generations (like the signing keys): a restarted stack, or a
    // regenerated configuration, must not lock out an agent that is already connected or holds its
    // file. Delete the file to rotate that user's key. A file that is not a user seed is replaced.
    let kp = existingUserSeed(seedFile);
    if (!kp) {
      kp = createUser();
      writeFileSync(seedFile, `${new TextDecoder().decode(kp.getSeed())}\n`, { mode: 0o600 });
    }
    chmodSync(seedFile, 0o600);
    return { role, publicKey: kp.getPublicKey(), seedFile, inboxPrefix: inboxPrefixOf(role) };
  });
  // A user removed from the list loses its seed: re-adding the id later must not revive the old key
  // (whoever still holds that file would be let in again).
  const listed = new Set(users.map((u) => u.seedFile));
  for (const f of readdirSync(keyDir)) if (f.endsWith('.nk') && !listed.has(join(keyDir, f))) rmSync(join(keyDir, f), { force: true });
  const q = (v: string) => JSON.stringify(v);
  const list2 = (xs: string[]) => `[${xs.map(q).join(', ')}]`;
  const userBlock = (u: GeneratedUser) => {
    const p = permissionsFor(u.role, o.subjects, o.topology, parsed.executorDurables, parsed.tenants.map((t) => t.id));
    const pub = `publish: { allow: ${list2(p.publish.allow)}${p.publish.deny?.length ? `, deny: ${list2(p.publish.deny)}` : ''} }`;
    const sub = `subscribe: { allow: ${list2(p.subscribe.allow)} }`;
    const resp = p.allow_responses ? ', allow_responses: true' : '';
    return `      # ${userName(u.role)}\n      { nkey: ${q(u.publicKey)}, permissions: { ${pub}, ${sub}${resp} } }`;
  };
  // Accounts (FM-31, FM-32): JetStream acknowledges a publish on the reply subject the PUBLISHER
  // chose, and nats-server checks no permission on reply subjects, so within one account an agent
  // could make the server write its PubAck into any subject a stream captures — another tenant's
  // operation subject or KV entry. Every tenant's agents and auditors therefore live in their own
  // account, operators in another, and reach tooltx's account only through service imports of their
  // own subjects: a reply subject they name stays in their account.
  const p = o.subjects.prefix;
  const tooltxAccount = {
    name: 'TOOLTX',
    extra: [
      '      jetstream: enabled',
      `      exports: [${[`${p}.intent.>`, `${p}.status.>`, `${p}.audit.>`, `${p}.takeover.>`].map((x) => `{ service: ${q(x)} }`).join(', ')}, { stream: ${q(o.subjects.allPush)} }]`,
    ],
    users: users.filter((u) => u.role.kind === 'service' || u.role.kind === 'provisioner'),
  };
  const imports = (subjects: string[], streams: string[] = []) =>
    `      imports: [${[...subjects.map((x) => `{ service: { account: "TOOLTX", subject: ${q(x)} } }`), ...streams.map((x) => `{ stream: { account: "TOOLTX", subject: ${q(x)} } }`)].join(', ')}]`;
  const tenantAccounts = parsed.tenants.map((t) => ({
    name: `TENANT_${t.id}`,
    // Pushed answers: a stream import of this tenant's push subjects only; each agent may
    // subscribe to its own (permissionsFor).
    extra: [imports([`${p}.intent.${t.id}.>`, `${p}.status.${t.id}.>`, `${p}.audit.${t.id}.>`], [o.subjects.pushesOfTenant(t.id)])],
    users: users.filter((u) => (u.role.kind === 'agent' || u.role.kind === 'auditor') && u.role.tenant === t.id),
  }));
  const operatorAccount = { name: 'OPERATORS', extra: [imports([`${p}.takeover.>`])], users: users.filter((u) => u.role.kind === 'operator') };
  const accounts = [tooltxAccount, ...tenantAccounts, operatorAccount].filter((a) => a === tooltxAccount || a.users.length > 0);
  const accountsBlock = ['accounts {', ...accounts.map((a) => [`  ${q(a.name)}: {`, ...a.extra, '    users: [', a.users.map(userBlock).join(',\n'), '    ]', '  }'].join('\n')), '}'].join('\n');
  const header = '# Generated by `tooltx auth generate` from the identity list: do not edit by hand.';
  const configFiles: string[] = [];
  if (!o.cluster) {
    const config = [header, `server_name: ${q(o.serverName ?? 'tooltx')}`, `listen: ${q(o.listen)}`, jetstreamConfigBlock(o.storeDir, o.durability), accountsBlock, ''].join('\n');
    const configFile = join(o.outDir, 'nats-server.conf');
    writePrivate(configFile, config);
    configFiles.push(configFile);
  } else {
    // Routes authenticate with a password of their own, kept across generations so that a node
    // whose configuration is written again still joins the others (a rolling restart).
    // One that is not 48 hex characters (empty after a crash mid-write, edited by hand) is replaced:
    // an empty password would let any peer join as a route.
    const routeSecretFile = join(o.outDir, 'cluster-route.secret');
    const kept = existsSync(routeSecretFile) ? readFileSync(routeSecretFile, 'utf8').trim() : '';
    const routePassword = /^[0-9a-f]{48}$/.test(kept) ? kept : randomBytes(24).toString('hex');
    writePrivate(routeSecretFile, `${routePassword}\n`);
    const nodes = o.cluster.nodes;
    for (const node of nodes) {
      const routes = nodes
        .filter((n) => n !== node)
        .map((n) => {
          const port = n.clusterListen.slice(n.clusterListen.lastIndexOf(':') + 1);
          const host = n.routeHost ?? n.clusterListen.slice(0, n.clusterListen.lastIndexOf(':'));
          return `nats-route://route:${routePassword}@${host}:${port}`;
        });
      const config = [
        header,
        `server_name: ${q(node.serverName)}`,
        `listen: ${q(node.listen)}`,
        jetstreamConfigBlock(node.storeDir, o.durability),
        'cluster {',
        `  name: ${q(o.cluster.name ?? 'tooltx')}`,
        `  listen: ${q(node.clusterListen)}`,
        `  authorization { user: "route", password: ${q(routePassword)} }`,
        `  routes: ${list2(routes)}`,
        '}',
        accountsBlock,
        '',
      ].join('\n');
      const file = join(o.outDir, `nats-server-${node.serverName}.conf`);
      writePrivate(file, config);
      configFiles.push(file);
    }
  }
  // The receipt signing keys of the services that append `committed` (FM-17): one Ed25519
  // key each, and the public keys clients trust, by key id.
  const signingDir = join(o.outDir, 'signing');
  mkdirSync(signingDir, { recursive: true, mode: 0o700 });
  const trusted: Record<string, string> = {};
  for (const service of RECEIPT_SIGNERS) {
    // Kept across runs: a receipt signed before a restart must still verify after it.
    const file = join(signingDir, `${service}.pem`);
    const kept = existsSync(file) ? receiptKeyOf(readFileSync(file, 'utf8')) : null;
    const k = kept ?? generateReceiptKey();
    if (!kept) {
      writeFileSync(file, k.privatePem, { mode: 0o600 });
      chmodSync(file, 0o600);
    }
    trusted[k.keyId] = k.publicPem;
  }
  const receiptKeysFile = join(o.outDir, 'receipt-keys.json');
  writeFileSync(receiptKeysFile, `${JSON.stringify(trusted, null, 2)}\n`, { mode: 0o644 });
  return {
    configFile: configFiles[0]!,
    configFiles,
    receiptKeysFile,
    signingKeyFile: (service) => join(signingDir, `${service}.pem`),
    users,
    seedFile(role) {
      const name = userName(role);
      const u = users.find((x) => userName(x.role) === name);
      if (!u) throw new Error(`no user ${name} in the identity list`);
      return u.seedFile;
    },
  };
}
