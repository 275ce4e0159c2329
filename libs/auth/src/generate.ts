import { chmodSync, existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { createUser, fromSeed, type KeyPair } from '@nats-io/nkeys';
import { generateReceiptKey, receiptKeyOf } from '@tooltx/lifecycle';
import {
  inboxPrefixOf,
  jetstreamConfigBlock,
  SERVICE_NAMES,
  type Durability,
  type Role,
  type Subjects,
} from '@tooltx/nats';
import { DEFAULT_TENANT_LIMITS, resolveLimits, type Topology } from '@tooltx/streams';
import {
  checkIdentityList,
  compensatingOperators,
  debuggingOperators,
  confirmingOperators,
  queryingOperators,
  contractOperators,
  identityListSchema,
  operatorsOf,
  type IdentityList,
} from './identities.js';
import { writeConsoleLogins } from './console-logins.js';
import { permissionsFor } from './permissions.js';
import { writePrivate } from './private-file.js';

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
  /** The console's logins (`console/logins.json`: scrypt hashes); each password is in `console/passwords/<user>.password`. */
  consoleLoginsFile: string;
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
    ...operatorsOf(parsed).map((o) => ({ kind: 'operator' as const, operator: o.id })),
  ];
  const debuggers = debuggingOperators(parsed);
  const compensators = compensatingOperators(parsed);
  const confirmers = confirmingOperators(parsed);
  const queriers = queryingOperators(parsed);
  const contractors = contractOperators(parsed);
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
  for (const f of readdirSync(keyDir))
    if (f.endsWith('.nk') && !listed.has(join(keyDir, f))) rmSync(join(keyDir, f), { force: true });
  const q = (v: string) => JSON.stringify(v);
  const list2 = (xs: string[]) => `[${xs.map(q).join(', ')}]`;
  const permissionsOf = (u: GeneratedUser) =>
    permissionsFor(
      u.role,
      o.subjects,
      o.topology,
      parsed.executorDurables,
      parsed.tenants.map((t) => t.id),
      compensators,
      confirmers,
      queriers,
      debuggers,
      contractors,
    );
  const userBlock = (u: GeneratedUser) => {
    const p = permissionsOf(u);
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
  // An agent reads the current version of a contract name by direct get of its registry key only
  // (docs/contracts.md): a service import of exactly those direct-get subjects.
  const currentContracts = `$JS.API.DIRECT.GET.KV_${o.topology.contracts.bucket}.$KV.${o.topology.contracts.bucket}.current.>`;
  const tooltxAccount = {
    name: 'TOOLTX',
    extra: [
      '      jetstream: enabled',
      `      exports: [${[`${p}.intent.>`, `${p}.status.>`, `${p}.audit.>`, `${p}.takeover.>`, `${p}.ops.compensate.>`, `${p}.ops.confirm.>`, `${p}.ops.discard.>`, `${p}.ops.query.>`, `${p}.ops.debug.>`, `${p}.ops.contracts.>`, currentContracts].map((x) => `{ service: ${q(x)} }`).join(', ')}, { stream: ${q(o.subjects.allPush)} }]`,
    ],
    users: users.filter((u) => u.role.kind === 'service' || u.role.kind === 'provisioner'),
  };
  const imports = (subjects: string[], streams: string[] = []) =>
    `      imports: [${[...subjects.map((x) => `{ service: { account: "TOOLTX", subject: ${q(x)} } }`), ...streams.map((x) => `{ stream: { account: "TOOLTX", subject: ${q(x)} } }`)].join(', ')}]`;
  const tenantAccounts = parsed.tenants
    .map((t) => ({ id: t.id, limits: resolveLimits(parsed.limits, t.limits) }))
    .map((t) => ({
      name: `TENANT_${t.id}`,
      // Pushed answers: a stream import of this tenant's push subjects only; each agent may
      // subscribe to its own (permissionsFor).
      // Admission at the connection (docs/tenancy.md): a message over the tenant's largest intent is
      // refused before nats-server reads it, and the tenant's connections and subscriptions are bounded.
      extra: [
        `      limits: { max_payload: ${t.limits.maxIntentBytes}, max_connections: ${t.limits.connections ?? DEFAULT_TENANT_LIMITS.connections}, max_subscriptions: ${t.limits.subscriptions ?? DEFAULT_TENANT_LIMITS.subscriptions} }`,
        imports(
          [`${p}.intent.${t.id}.>`, `${p}.status.${t.id}.>`, `${p}.audit.${t.id}.>`, currentContracts],
          [o.subjects.pushesOfTenant(t.id)],
        ),
      ],
      users: users.filter((u) => (u.role.kind === 'agent' || u.role.kind === 'auditor') && u.role.tenant === t.id),
    }));
  // One account per operator (FM-32): nats-server checks no permission on a reply subject, and
  // a service's answer goes back through the requester's import into the requester's account. In one
  // shared account, operator A could name operator B's inbox as the reply of its own request and B
  // would receive what only A may read (a debug sample, an operation across tenants). Each operator's
  // account imports only the subjects that operator may publish (permissionsFor).
  const operatorAccounts = users
    .filter((u) => u.role.kind === 'operator')
    .map((u) => ({
      name: `OPERATOR_${(u.role as Extract<Role, { kind: 'operator' }>).operator}`,
      extra: [imports(permissionsOf(u).publish.allow)],
      users: [u],
    }));
  const accounts = [tooltxAccount, ...tenantAccounts, ...operatorAccounts].filter(
    (a) => a === tooltxAccount || a.users.length > 0,
  );
  const accountsBlock = [
    'accounts {',
    ...accounts.map((a) =>
      [`  ${q(a.name)}: {`, ...a.extra, '    users: [', a.users.map(userBlock).join(',\n'), '    ]', '  }'].join('\n'),
    ),
    '}',
  ].join('\n');
  const header = '# Generated by `tooltx auth generate` from the identity list: do not edit by hand.';
  const configFiles: string[] = [];
  if (!o.cluster) {
    const config = [
      header,
      `server_name: ${q(o.serverName ?? 'tooltx')}`,
      `listen: ${q(o.listen)}`,
      jetstreamConfigBlock(o.storeDir, o.durability),
      accountsBlock,
      '',
    ].join('\n');
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
  // Console logins of the people: every operator and auditor (docs/console.md).
  const consoleLoginsFile = writeConsoleLogins(
    o.outDir,
    users.flatMap((u) =>
      u.role.kind === 'operator' || u.role.kind === 'auditor' ? [{ role: u.role, userName: userName(u.role) }] : [],
    ),
  );
  return {
    configFile: configFiles[0]!,
    configFiles,
    receiptKeysFile,
    consoleLoginsFile,
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
