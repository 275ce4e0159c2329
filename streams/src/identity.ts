import { chmodSync, existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { createUser } from '@nats-io/nkeys';
import { z } from 'zod';
import { ID_PATTERN } from '@tooltx/contracts';
import { generateReceiptKey, receiptKeyOf } from '@tooltx/lifecycle';
import type { Subjects } from '@tooltx/nats';
import { Durables, type Topology } from './topology.js';

/**
 * Identity the server enforces (DESIGN.md "Identity", issue 5): one declarative list of tenants,
 * actors, auditors, services and the provisioner becomes a nats-server configuration in which
 * every user is an nkey with publish/subscribe allow-lists. Agents may publish only their own
 * intent subject, request only their own status subject and subscribe only to their own inbox
 * prefix; each service gets only the JetStream API subjects it uses; only the provisioner may
 * create, update, delete or purge streams and durable consumers.
 */

const id = z.string().regex(ID_PATTERN, 'must match ^[a-z0-9_-]{1,64}$ (one subject token, no wildcard)');

export const identityListSchema = z.strictObject({
  tenants: z
    .array(z.strictObject({ id, actors: z.array(id).default([]), auditors: z.array(id).default([]) }))
    .min(1)
    .refine((ts) => new Set(ts.map((t) => t.id)).size === ts.length, 'tenant ids must be unique'),
  /** Extra durable names the executor may pull from (e.g. a second executor group during a migration). */
  executorDurables: z.array(id).default([]),
  /**
   * Operators: people who resolve takeovers (issue 8). They reach only the takeover service, which
   * records their id (from the subject the server pinned them to) in the resolution event.
   */
  operators: z.array(id).default([]),
});
export type IdentityList = z.input<typeof identityListSchema>;

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
 * The permissions of one role under `subjects`' prefix. Pure: a test reads them directly.
 * JetStream API subjects follow the NATS docs ("JetStream wire API reference"); on 2.9 a consumer
 * create with one filter is `$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>`, so it can be
 * scoped to the filter.
 */
export function permissionsFor(role: Role, s: Subjects, topo: Topology, executorDurables: string[] = []): Permissions {
  const api = '$JS.API';
  const inbox = `${inboxPrefixOf(role)}.>`;
  const streams = Object.values(topo.streams).map((st) => st.name);
  const kvStream = (bucket: string) => `KV_${bucket}`;
  const buckets = [topo.results.bucket, topo.projections.reconcile.bucket, topo.projections.audit.bucket, topo.tasks.bucket];
  // What every service's start-up check reads (never writes).
  const check = [
    ...streams.map((n) => `${api}.STREAM.INFO.${n}`),
    ...buckets.map((b) => `${api}.STREAM.INFO.${kvStream(b)}`),
    ...topo.consumers.map((c) => `${api}.CONSUMER.INFO.${c.stream}.${c.config.durable_name}`),
  ];
  const pull = (stream: string, durable: string) => [
    `${api}.CONSUMER.MSG.NEXT.${stream}.${durable}`,
    `${api}.CONSUMER.INFO.${stream}.${durable}`,
    `$JS.ACK.${stream}.${durable}.>`,
  ];
  const directLast = (stream: string) => [`${api}.DIRECT.GET.${stream}.>`];
  const directSeq = (stream: string) => [`${api}.DIRECT.GET.${stream}`];
  const kvRead = (bucket: string) => [...directLast(kvStream(bucket)), ...directSeq(kvStream(bucket)), `${api}.STREAM.INFO.${kvStream(bucket)}`];
  const kvWrite = (bucket: string) => [`$KV.${bucket}.>`];
  // A KV watch or key listing: an ordered push consumer on the bucket's own stream (never another).
  const kvWatch = (bucket: string) => [
    `${api}.CONSUMER.CREATE.${kvStream(bucket)}`, `${api}.CONSUMER.CREATE.${kvStream(bucket)}.>`,
    `${api}.CONSUMER.DELETE.${kvStream(bucket)}.>`, `${api}.CONSUMER.INFO.${kvStream(bucket)}.>`,
    `$JS.FC.${kvStream(bucket)}.>`,
  ];
  const tasks = topo.tasks.bucket;
  const events = topo.streams.events.name;
  const intents = topo.streams.intents.name;
  const decisions = topo.streams.decisions.name;

  switch (role.kind) {
    case 'agent':
      return {
        publish: { allow: [s.intent(role.tenant, role.actor), s.status(role.tenant, role.actor)] },
        subscribe: { allow: [inbox] },
      };
    case 'auditor':
      // Auditors reach audit records only through the audit service, on their own subject (issue 9):
      // no stream, bucket or JetStream API subject — not intents, inputs, results, events or the KV.
      return { publish: { allow: [s.audit(role.tenant, role.actor)] }, subscribe: { allow: [inbox] } };
    case 'operator':
      return { publish: { allow: [s.takeover(role.operator)] }, subscribe: { allow: [inbox] } };
    case 'provisioner':
      return { publish: { allow: [`${api}.>`, `$KV.>`, `${s.prefix}.>`] }, subscribe: { allow: [inbox] } };
    case 'service': {
      const durableNames = new Set(topo.consumers.map((c) => c.config.durable_name));
      switch (role.service) {
        case 'authorizer': {
          // The status watch: ordered consumers on the event log and the decision stream, created
          // with their filter in the subject; they may never pull from another service's durable.
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
                ...pull(intents, Durables.authorizer),
                ...directLast(events), ...directSeq(events), ...directLast(decisions),
                ...kvRead(topo.results.bucket),
                ...ordered(events, s.allOps), ...ordered(decisions, s.allDecisions),
                ...kvRead(tasks), ...kvWatch(tasks),
                s.allOps, s.allDecisions,
              ],
              deny: [...durableNames].flatMap((d) => [`${api}.CONSUMER.MSG.NEXT.${events}.${d}`, `${api}.CONSUMER.MSG.NEXT.${decisions}.${d}`, `${api}.CONSUMER.DELETE.${events}.${d}`, `${api}.CONSUMER.DELETE.${decisions}.${d}`]),
            },
            subscribe: { allow: [inbox, s.allStatus] },
            allow_responses: true,
          };
        }
        case 'executor':
          return {
            publish: {
              allow: [
                ...check,
                ...[Durables.executor, ...executorDurables].flatMap((d) => pull(events, d)),
                ...directLast(events), ...directSeq(events), ...directSeq(intents),
                ...kvRead(topo.results.bucket), ...kvWrite(topo.results.bucket),
                ...kvRead(tasks), ...kvWatch(tasks),
                s.allOps,
              ],
            },
            subscribe: { allow: [inbox] },
          };
        case 'audit-projector': {
          const bucket = kvStream(topo.projections.audit.bucket);
          return {
            publish: {
              allow: [
                ...check,
                ...pull(events, Durables.auditProjector), ...pull(decisions, Durables.auditDecisions),
                ...kvRead(topo.projections.audit.bucket), ...kvWrite(topo.projections.audit.bucket),
                // The audit service lists a tenant's records through an ordered push consumer on the
                // bucket's own stream, and records every query and export before it answers.
                `${api}.CONSUMER.CREATE.${bucket}`, `${api}.CONSUMER.CREATE.${bucket}.>`, `${api}.CONSUMER.DELETE.${bucket}.>`, `${api}.CONSUMER.INFO.${bucket}.>`, `$JS.FC.${bucket}.>`,
                s.allAuditLog,
              ],
            },
            subscribe: { allow: [inbox, s.allAudit] },
            allow_responses: true,
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
                  // The max-deliveries advisories of the event log's durables (issue 7).
                  ...pull(topo.streams.advisories.name, Durables.reconcilerAdvisories),
                  ...kvRead(topo.results.bucket), ...kvWrite(topo.results.bucket),
                  ...kvWatch(bucket),
                  // Frozen tasks (issue 8): it freezes and thaws them, and lists them for operators.
                  ...kvRead(tasks), ...kvWrite(tasks), ...kvWatch(tasks),
                ]
              : [];
          return {
            publish: { allow: [...check, ...pull(events, durable), ...directLast(events), ...directSeq(events), ...kvRead(bucket), ...kvWrite(bucket), ...recovery] },
            // The reconciler answers operators' takeover requests (queue group).
            subscribe: { allow: role.service === 'reconciler' ? [inbox, s.allTakeover] : [inbox] },
            ...(role.service === 'reconciler' ? { allow_responses: true } : {}),
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

/** The services that append `committed` and so sign receipts (issue 9). */
export const RECEIPT_SIGNERS = ['executor', 'reconciler'] as const;

export interface GeneratedAuth {
  configFile: string;
  /** `{ "<keyId>": "<SPKI PEM>" }` — the receipt keys clients trust (TOOLTX_RECEIPT_KEYS_FILE). */
  receiptKeysFile: string;
  /** The private receipt key of a signing service (TOOLTX_SIGNING_KEY_FILE, mode 0600). */
  signingKeyFile(service: (typeof RECEIPT_SIGNERS)[number]): string;
  users: GeneratedUser[];
  /** Seed file of a role (throws `Error` when the list has no such user). */
  seedFile(role: Role): string;
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

/**
 * Writes `<outDir>/nats-server.conf` and one nkey seed per user under `<outDir>/nkeys/` (mode 0600).
 * The config holds only public keys. Throws `z.ZodError` for a bad identity list (an actor named
 * `>`, `*` or `b.c` never reaches the config).
 */
export function generateAuth(
  list: IdentityList,
  o: { subjects: Subjects; topology: Topology; outDir: string; listen: string; storeDir: string; serverName?: string },
): GeneratedAuth {
  const parsed = identityListSchema.parse(list);
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
    const kp = createUser();
    const seedFile = join(keyDir, `${userName(role)}.nk`);
    writeFileSync(seedFile, `${new TextDecoder().decode(kp.getSeed())}\n`, { mode: 0o600 });
    chmodSync(seedFile, 0o600);
    return { role, publicKey: kp.getPublicKey(), seedFile, inboxPrefix: inboxPrefixOf(role) };
  });
  const q = (v: string) => JSON.stringify(v);
  const list2 = (xs: string[]) => `[${xs.map(q).join(', ')}]`;
  const userBlocks = users.map((u) => {
    const p = permissionsFor(u.role, o.subjects, o.topology, parsed.executorDurables);
    const pub = `publish: { allow: ${list2(p.publish.allow)}${p.publish.deny?.length ? `, deny: ${list2(p.publish.deny)}` : ''} }`;
    const sub = `subscribe: { allow: ${list2(p.subscribe.allow)} }`;
    const resp = p.allow_responses ? ', allow_responses: true' : '';
    return `    # ${userName(u.role)}\n    { nkey: ${q(u.publicKey)}, permissions: { ${pub}, ${sub}${resp} } }`;
  });
  const config = [
    '# Generated by `tooltx auth generate` from the identity list: do not edit by hand.',
    `server_name: ${q(o.serverName ?? 'tooltx')}`,
    `listen: ${q(o.listen)}`,
    `jetstream { store_dir: ${q(o.storeDir)} }`,
    'authorization {',
    '  users: [',
    userBlocks.join(',\n'),
    '  ]',
    '}',
    '',
  ].join('\n');
  const configFile = join(o.outDir, 'nats-server.conf');
  writeFileSync(configFile, config, { mode: 0o600 });
  // The receipt signing keys of the services that append `committed` (issue 9, FM-17): one Ed25519
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
    configFile,
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
