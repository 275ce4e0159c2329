/**
 * The shape floor of the peers workload (`floor-shape`, bench/peers.ts): the least the co-located
 * layout's call shape costs on this server, with none of tooltx's own work (no validation,
 * policy, digests, signatures, audit fields or lifecycle rules). Where `floor-fsync` (./floor.ts)
 * is three appends on one stream from one process, this floor is the same path as a tooltx call
 * (docs/performance.md "Where a call's CPU and durable writes go"):
 * - the client (this process), connected as the tenant's agent like the SDK, publishes the intent to
 *   the tenant's intent stream (configured as tooltx's, `topology()`), msg id = the key, and waits
 *   for the answer pushed on its push subject (core NATS, one subscription per client);
 * - a separate worker process (./floor-shape-worker.ts), one connection per role as that role's
 *   identity, pulls it on the `authorizer` durable, appends `accepted` (expected last subject
 *   sequence 0) to the event log (configured as tooltx's), appends the line, appends `committed`,
 *   answers, acks;
 * - the same worker reads the event log back on the `host` durable and writes one record per
 *   operation to the audit projection's bucket (memory storage), acking each event.
 * Three fsynced writes per call on two streams, each with one reader: what tooltx's co-located call
 * makes, without the durables it provisions for the other layout (executor, reconciler,
 * audit-projector), which stay idle in a co-located run. Same nats-server settings as tooltx
 * (./server.ts, `fsync`). A repeated key finds its intent deduplicated (or `accepted` refused,
 * 10071) and reads the operation's last event (one direct get).
 */
import { spawn } from 'node:child_process';
import { closeSync, openSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { tenantsOf } from '@tooltx/auth';
import { DEFAULT_IDENTITIES } from '@tooltx/dev/stack';
import { connectNats, inboxPrefixOf, jetStreamOf, Subjects, type NatsConnection } from '@tooltx/nats';
import { createBucket, Durables, topology } from '@tooltx/streams';
import { floorOpId } from './floor.js';
import { countEffects, effectsKey } from './peers-effects.js';
import { ready, terminate } from './peers-tooltx.js';
import { startBenchServer, type BenchServer } from './server.js';
import type { BenchSystem, Outcome } from './workload.js';

const HERE = dirname(fileURLToPath(import.meta.url));
const ROOT = resolve(HERE, '..');
const TENANT = 'acme';
const ACTOR = 'researcher';
const CLIENT_CONNECTION = 'floor-shape-client';
/** The client's second connection, as the provisioner: a repeated key's direct get of the last event. */
const READER_CONNECTION = 'floor-shape-reader';
/** Bytes per intent (a tooltx intent's stored mean on this workload). */
const INTENT_BYTES = 340;
/** Bytes per event (a tooltx lifecycle event's mean, bench/run.ts) and per projection record (an audit record's). */
const EVENT_BYTES = 1_420;
const RECORD_BYTES = 946;
/** How long a call waits for the worker's answer, ms. */
const ANSWER_MS = 60_000;

export interface FloorShapeOptions {
  dir: string;
  prefix: string;
  runId: string;
  /** The file the worker appends its lines to. */
  effectsFile: string;
}

export async function startFloorShape(o: FloorShapeOptions): Promise<BenchSystem> {
  const server: BenchServer = await startBenchServer(join(o.dir, 'nats'), o.prefix, { durability: 'fsync' });
  let nc: NatsConnection | undefined;
  let reader: NatsConnection | undefined;
  let worker: ReturnType<typeof spawn> | undefined;
  try {
    const subjects = new Subjects(o.prefix);
    const topo = topology(subjects, { replicas: 1, tenants: tenantsOf(DEFAULT_IDENTITIES) });
    const tenant = topo.tenants?.find((t) => t.id === TENANT);
    const authorizer = tenant?.consumers.find((c) => c.config.durable_name === Durables.authorizer);
    const host = topo.consumers.find((c) => c.config.durable_name === Durables.host);
    if (!tenant || !authorizer || !host) throw new Error('floor-shape: the topology has no acme intents or host');
    reader = await connectNats({
      servers: server.url,
      name: READER_CONNECTION,
      nkeySeedFile: server.seedFile({ kind: 'provisioner' }),
      inboxPrefix: inboxPrefixOf({ kind: 'provisioner' }),
      reconnectForever: false,
    });
    const { jsm } = await jetStreamOf(reader);
    await jsm.streams.add(topo.streams.events);
    await jsm.streams.add(tenant.intents);
    await createBucket(reader, topo.projections.audit);
    await jsm.consumers.add(tenant.intents.name, authorizer.config);
    await jsm.consumers.add(topo.streams.events.name, host.config);

    const logs = join(o.dir, 'floor-shape-worker.log');
    const log = openSync(logs, 'a');
    worker = spawn(process.execPath, ['--import', 'tsx', join(HERE, 'floor-shape-worker.ts')], {
      cwd: ROOT,
      detached: true,
      env: {
        ...process.env,
        SHAPE_NATS_URL: server.url,
        SHAPE_AUTHORIZER_SEED: server.seedFile({ kind: 'service', service: 'authorizer' }),
        SHAPE_EXECUTOR_SEED: server.seedFile({ kind: 'service', service: 'executor' }),
        SHAPE_HOST_SEED: server.seedFile({ kind: 'service', service: 'host' }),
        SHAPE_PREFIX: o.prefix,
        SHAPE_TENANT: TENANT,
        SHAPE_EFFECTS_FILE: o.effectsFile,
        SHAPE_EVENT_BYTES: String(EVENT_BYTES),
        SHAPE_RECORD_BYTES: String(RECORD_BYTES),
      },
      stdio: ['ignore', log, log, 'ipc'],
    });
    closeSync(log);
    await ready(worker, 'floor-shape-worker', logs);

    const agent = { kind: 'agent' as const, tenant: TENANT, actor: ACTOR };
    nc = await connectNats({
      servers: server.url,
      name: CLIENT_CONNECTION,
      nkeySeedFile: server.seedFile(agent),
      inboxPrefix: inboxPrefixOf(agent),
      reconnectForever: false,
    });
    const { js } = await jetStreamOf(nc);
    const conn = nc;
    const readConn = reader;
    const w = worker;
    const pushSubject = subjects.push(TENANT, ACTOR, `shape-${o.runId}`);
    if (!pushSubject) throw new Error('floor-shape: invalid push subject');
    const waiting = new Map<number, ((resourceId: string) => void)[]>();
    const sub = conn.subscribe(pushSubject, {
      callback: (_err, m) => {
        const { k, resourceId } = m.json() as { k: number; resourceId: string };
        for (const r of waiting.get(k) ?? []) r(resourceId);
        waiting.delete(k);
      },
    });
    await conn.flush();
    const opIdOf = (k: number) => floorOpId(o.runId, k);
    const intentPad = 'i'.repeat(INTENT_BYTES - 100);
    const intentSubject = subjects.intent(TENANT, ACTOR);

    const call = async (k: number): Promise<Outcome> => {
      let resolveAnswer: (resourceId: string) => void = () => undefined;
      const answered = new Promise<string>((res) => {
        resolveAnswer = res;
        waiting.set(k, [...(waiting.get(k) ?? []), res]);
      });
      const forget = () => {
        const rest = (waiting.get(k) ?? []).filter((r) => r !== resolveAnswer);
        if (rest.length) waiting.set(k, rest);
        else waiting.delete(k);
      };
      const intent = JSON.stringify({
        opId: opIdOf(k),
        k,
        key: effectsKey(o.runId, k),
        reply: pushSubject,
        pad: intentPad,
      });
      const ack = await js.publish(intentSubject, intent, { msgID: opIdOf(k) });
      if (ack.duplicate) {
        const m = await jsm.direct.getMessage(topo.streams.events.name, {
          last_by_subj: subjects.op(TENANT, opIdOf(k)),
        });
        const last = m ? (m.json() as { state: string; resourceId?: string }) : undefined;
        if (last?.state === 'committed' && last.resourceId) {
          forget();
          return { ok: true, resourceId: last.resourceId };
        }
      }
      let timer: NodeJS.Timeout | undefined;
      const late = new Promise<undefined>((res) => {
        timer = setTimeout(res, ANSWER_MS, undefined);
      });
      const resourceId = await Promise.race([answered, late]);
      clearTimeout(timer);
      if (resourceId === undefined) {
        forget();
        return { ok: false, error: 'no answer' };
      }
      return { ok: true, resourceId };
    };

    return {
      label: 'floor-shape',
      call,
      async status() {
        return false;
      },
      async rows() {
        const c = countEffects(o.effectsFile);
        return { rows: c.rows, duplicateRows: c.duplicateRows };
      },
      processes: [
        { name: 'client', pid: process.pid, connections: [CLIENT_CONNECTION, READER_CONNECTION] },
        { name: 'nats-server', pid: server.pid, connections: [] },
        {
          name: 'worker',
          pid: w.pid!,
          connections: ['authorizer', 'executor', 'host'].map((r) => `${r}@floor-shape`),
        },
      ],
      monitorUrl: server.monitorUrl,
      async stop() {
        sub.unsubscribe();
        await terminate(w);
        await conn.drain().catch(() => undefined);
        await readConn.drain().catch(() => undefined);
        await server.stop();
      },
    };
  } catch (err) {
    if (worker) await terminate(worker);
    await nc?.close().catch(() => undefined);
    await reader?.close().catch(() => undefined);
    await server.stop();
    throw err;
  }
}
