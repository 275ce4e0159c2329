import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  connectNats,
  jetStreamOf,
  JetStreamStore,
  Subjects,
  type Durability,
  type NatsConnection,
  openBucket,
} from '@tooltx/nats';
import {
  freeLoopbackPort as freePort,
  spawnNatsCluster,
  spawnNatsServer,
  type NatsClusterHandle,
  type NatsServerHandle,
} from '@tooltx/dev/nats-server';
import { ensureKeyFile } from '@tooltx/runtime';
import { applyTopology, topology, type Topology, type TopologyOptions } from '@tooltx/streams';
import { generateAuth, tenantsOf, type GeneratedAuth, type IdentityList } from '@tooltx/auth';
import { inboxPrefixOf, type Role } from '@tooltx/nats';
import { createTools, type CreateToolsOptions, type Tools } from '@tooltx/client';
import type { Contract } from '@tooltx/contracts';

/** A unique subject prefix per test, so tests never see each other's streams. */
export function uniquePrefix(): string {
  return `t${randomBytes(5).toString('hex')}`;
}

/** The identities every test server knows (every test runs with auth on). */
export const TEST_IDENTITIES: IdentityList = {
  tenants: [
    {
      id: 'acme',
      actors: ['alice', 'bob', 'blocked-bob', 'noread-eve', 'researcher', 'mallory'],
      auditors: ['audrey'],
    },
    { id: 'globex', actors: ['gina', 'mallory'] },
    { id: 'initech', actors: ['ivan', 'irene'] },
  ],
  executorDurables: ['executor-b'],
  operators: ['oscar'],
  // The tests drive one tenant with hundreds of calls at once, as the sample deployment's benchmark
  // does; the tenancy tests use lists of their own with the default pace.
  limits: { intentsPerSecond: 2_000, intentBurst: 4_000 },
};

export interface TestNats {
  /** The provisioner's connection (full JetStream API): what tests read and assert with. */
  nc: NatsConnection;
  subjects: Subjects;
  /** The topology applied, with the tenants' own streams (docs/tenancy.md). */
  topo: Topology;
  /** The tenants of the identity list. */
  tenants: string[];
  store: JetStreamStore;
  js: Awaited<ReturnType<typeof jetStreamOf>>['js'];
  jsm: Awaited<ReturnType<typeof jetStreamOf>>['jsm'];
  /** Every server's client URL, comma-separated. */
  url: string;
  /** The server (a cluster's first node). */
  server: NatsServerHandle;
  /** The nodes, when started with `cluster`. */
  cluster?: NatsClusterHandle;
  /** Each node's monitoring endpoint (`/jsz`, `/varz`), when started with `cluster`. */
  monitorUrls?: string[];
  auth: GeneratedAuth;
  /** Environment for a service process of this prefix; `startService` adds the service's own seed. */
  env: Record<string, string>;
  /** The seed file of an agent. */
  agentSeed(tenant: string, actor: string): string;
  /**
   * An agent's SDK on this server as `tenant`/`actor` with its own seed, the deployment's prefix
   * and receipt keys, holding `contracts`; `options` adds or overrides the rest (budgetMs, …).
   */
  agentTools(
    tenant: string,
    actor: string,
    contracts: readonly Contract[],
    options?: Partial<CreateToolsOptions>,
  ): Promise<Tools>;
  /** Connects as `role` with its seed and inbox prefix. */
  connectAs(role: Role): Promise<NatsConnection>;
  close(): Promise<void>;
}

/**
 * Starts a nats-server of its own with a generated auth configuration for a fresh prefix, connects
 * as the provisioner and applies the topology. Tests never use an unauthenticated server.
 */
export async function provisioned(
  opts: TopologyOptions = {},
  prefix = uniquePrefix(),
  o: {
    apply?: boolean;
    /** The nats-server binary (default: the project's, `natsServerBinary()`); e.g. `projectServerBinary('sid')`. */
    binary?: string;
    /** Start a server older than 2.10 anyway (the refusal tests). */
    allowUnsupported?: boolean;
    /** Three nodes on loopback, every stream and bucket R3 (docs/cluster.md); `server` is the first node. */
    cluster?: 3;
    durability?: Durability;
    /** The identity list (default {@link TEST_IDENTITIES}). */
    identities?: IdentityList;
    /** Extra lines of the server's `jetstream {}` block, e.g. `max_file_store: 64MB` (one server only). */
    jetstreamExtra?: string;
  } = {},
): Promise<TestNats> {
  const dir = mkdtempSync(join(tmpdir(), 'tooltx-test-'));
  const subjects = new Subjects(prefix);
  const identities = o.identities ?? TEST_IDENTITIES;
  const topo = topology(subjects, { ...(o.cluster ? { replicas: 3 } : {}), tenants: tenantsOf(identities), ...opts });
  let auth: GeneratedAuth;
  let server: NatsServerHandle;
  let cluster: NatsClusterHandle | undefined;
  let monitorUrls: string[] = [];
  const spawnOpts = {
    ...(o.binary ? { binary: o.binary } : {}),
    ...(o.allowUnsupported ? { allowUnsupported: true } : {}),
  };
  if (o.cluster) {
    const routePorts = await Promise.all(Array.from({ length: o.cluster }, () => freePort()));
    const nodes = routePorts.map((p, i) => ({
      serverName: `n${i + 1}`,
      listen: '127.0.0.1:-1',
      clusterListen: `127.0.0.1:${p}`,
      storeDir: join(dir, `js-n${i + 1}`),
    }));
    auth = generateAuth(identities, {
      subjects,
      topology: topo,
      outDir: join(dir, 'auth'),
      listen: '',
      storeDir: '',
      cluster: { nodes },
      ...(o.durability ? { durability: o.durability } : {}),
    });
    const monitorPorts = await Promise.all(nodes.map(() => freePort()));
    cluster = await spawnNatsCluster(
      auth.configFiles,
      nodes.map((n) => n.storeDir),
      { ...spawnOpts, extraArgs: monitorPorts.map((p) => ['-m', String(p)]) },
    );
    monitorUrls = monitorPorts.map((p) => `http://127.0.0.1:${p}`);
    server = cluster.nodes[0]!;
  } else {
    auth = generateAuth(identities, {
      subjects,
      topology: topo,
      outDir: join(dir, 'auth'),
      listen: '127.0.0.1:-1',
      storeDir: join(dir, 'js'),
      ...(o.durability ? { durability: o.durability } : {}),
    });
    if (o.jetstreamExtra)
      writeFileSync(
        auth.configFile,
        readFileSync(auth.configFile, 'utf8').replace(/^jetstream \{ /m, `jetstream { ${o.jetstreamExtra}, `),
      );
    server = await spawnNatsServer({ extraArgs: ['-c', auth.configFile], storeDir: join(dir, 'js'), ...spawnOpts });
  }
  const url = cluster ? cluster.url : server.url;
  const connectAs = (role: Role) =>
    connectNats({
      servers: url,
      name: `test-${prefix}-${role.kind}`,
      nkeySeedFile: auth.seedFile(role),
      inboxPrefix: inboxPrefixOf(role),
      reconnectForever: false,
    });
  let nc: Awaited<ReturnType<typeof connectAs>> | undefined;
  try {
    nc = await connectAs({ kind: 'provisioner' });
    if (o.apply !== false) await applyTopology(nc, (await jetStreamOf(nc)).jsm, topo);
  } catch (err) {
    // A set-up that fails half way stops what it started: a cluster left running outlived its test.
    await nc?.close().catch(() => undefined);
    if (cluster) await cluster.stop({ removeStore: true });
    else await server.stop({ removeStore: true });
    rmSync(dir, { recursive: true, force: true });
    throw err;
  }
  const { js, jsm } = await jetStreamOf(nc);
  return {
    nc,
    js,
    jsm,
    subjects,
    topo,
    tenants: topo.tenants!.map((x) => x.id),
    url,
    server,
    ...(cluster ? { cluster, monitorUrls } : {}),
    auth,
    env: {
      NATS_URL: url,
      TOOLTX_PREFIX: prefix,
      TOOLTX_TEST_NKEYS_DIR: join(dir, 'auth', 'nkeys'),
      // Keys of the audit HMACs and of the HMAC of error messages in logs, as `npm start` makes them.
      TOOLTX_AUDIT_HMAC_KEY_FILE: ensureKeyFile(join(dir, 'audit-hmac.key')),
      TOOLTX_LOG_HMAC_KEY_FILE: ensureKeyFile(join(dir, 'log-hmac.key')),
    },
    store: new JetStreamStore(js, jsm, subjects),
    agentSeed: (tenant, actor) => auth.seedFile({ kind: 'agent', tenant, actor }),
    agentTools: (tenant, actor, contracts, options = {}) =>
      createTools({
        servers: url,
        tenant,
        actor,
        nkeyFile: auth.seedFile({ kind: 'agent', tenant, actor }),
        contracts: [...contracts],
        prefix,
        receiptKeys: auth.receiptKeysFile,
        ...options,
      }),
    connectAs,
    async close() {
      await nc.drain().catch(() => undefined);
      if (cluster) await cluster.stop({ removeStore: true });
      else await server.stop({ removeStore: true });
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

export async function resultStore(t: TestNats) {
  return openBucket(t.nc, t.subjects.resultsBucket);
}

/**
 * Rewrites the test server's configuration with `edit` (which must change it) and waits until the
 * server says it reloaded it (SIGHUP): permissions withdrawn or restored while clients stay connected.
 */
export async function reloadConfig(t: TestNats, edit: (conf: string) => string): Promise<void> {
  const conf = readFileSync(t.auth.configFile, 'utf8');
  const next = edit(conf);
  if (next === conf) throw new Error('reloadConfig: the edit changed nothing');
  writeFileSync(t.auth.configFile, next);
  const child = t.server.process!;
  const reloaded = new Promise<void>((resolve) => {
    const on = (chunk: string) => {
      if (!chunk.includes('Reloaded server configuration')) return;
      child.stderr!.off('data', on);
      resolve();
    };
    child.stderr!.on('data', on);
  });
  child.kill('SIGHUP');
  await reloaded;
}
