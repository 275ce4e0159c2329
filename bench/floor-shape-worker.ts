/**
 * The worker process of the shape floor (./floor-shape.ts): tooltx's co-located call shape with
 * none of tooltx's own work. Started by floor-shape.ts with its settings in the environment; says
 * `{ tooltx: 'ready' }` over IPC once both consumers are bound; drains and exits on SIGTERM.
 *
 * Three connections, one per role and as that role's identity (`authorizer`, `executor`, `host`),
 * on the topology's own durables. Per intent delivered on the `authorizer` durable (the tenant's
 * intent stream), on the authorizer's connection:
 * 1. append `accepted` to the operation's subject of the event log, expected last subject
 *    sequence 0 (a known key answers 10071 or `duplicate`: the last event is read and, when it is
 *    `committed`, its answer sent again);
 * 2. append the line `<key> <execId>` to the effects file (O_APPEND, bench/peers-effects.ts);
 * 3. on the executor's connection, append `committed`, expected last subject sequence = the
 *    accepted one's;
 * 4. push the answer (core NATS) to the push subject the intent names, then ack the intent.
 * Per event delivered on the `host` durable (the event log), on the host's connection: a
 * `committed` event writes one record to the audit projection's bucket (memory storage), then the
 * event is acked. Up to {@link CONCURRENCY} intents are handled at once.
 *
 * Environment: SHAPE_NATS_URL, SHAPE_AUTHORIZER_SEED, SHAPE_EXECUTOR_SEED, SHAPE_HOST_SEED (nkey
 * seed files), SHAPE_PREFIX and SHAPE_TENANT (the streams, subjects and bucket follow from them,
 * libs/nats Subjects), SHAPE_EFFECTS_FILE, SHAPE_EVENT_BYTES (each event's payload size, bytes),
 * SHAPE_RECORD_BYTES (the projection record's).
 */
import { connectNats, inboxPrefixOf, isWrongLastSequence, jetStreamOf, Subjects } from '@tooltx/nats';
import { effectsAppender } from './peers-effects.js';

/** Intents handled at once: above the workload's 16 in flight, so never what limits the floor. */
const CONCURRENCY = 64;

interface Intent {
  k: number;
  opId: string;
  key: string;
  reply: string;
}
interface ShapeEvent {
  state: 'accepted' | 'committed';
  opId: string;
  resourceId?: string;
  pad: string;
}

const env = (name: string): string => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set`);
  return v;
};

async function main(): Promise<void> {
  const connect = (service: 'authorizer' | 'executor' | 'host', seed: string) =>
    connectNats({
      servers: env('SHAPE_NATS_URL'),
      name: `${service}@floor-shape`,
      nkeySeedFile: env(seed),
      inboxPrefix: inboxPrefixOf({ kind: 'service', service }),
      reconnectForever: false,
    });
  // One connection per role, each as that role's identity, as `tooltx serve` connects.
  const [authorizerNc, executorNc, hostNc] = await Promise.all([
    connect('authorizer', 'SHAPE_AUTHORIZER_SEED'),
    connect('executor', 'SHAPE_EXECUTOR_SEED'),
    connect('host', 'SHAPE_HOST_SEED'),
  ]);
  const { js, jsm } = await jetStreamOf(authorizerNc);
  const { js: executorJs } = await jetStreamOf(executorNc);
  const { js: hostJs } = await jetStreamOf(hostNc);
  const nc = executorNc;
  const subjects = new Subjects(env('SHAPE_PREFIX'));
  const tenant = env('SHAPE_TENANT');
  const eventsStream = subjects.eventsStream;
  const opSubject = (opId: string) => subjects.op(tenant, opId);
  const recordSubject = (opId: string) => `$KV.${subjects.auditBucket}.${tenant}.${opId}`;
  const eventPad = 'x'.repeat(Math.max(0, Number(env('SHAPE_EVENT_BYTES')) - 120));
  const recordPad = 'r'.repeat(Math.max(0, Number(env('SHAPE_RECORD_BYTES')) - 80));
  const effects = effectsAppender(env('SHAPE_EFFECTS_FILE'));
  const encoder = new TextEncoder();
  const decoder = new TextDecoder();
  const enc = (e: ShapeEvent) => encoder.encode(JSON.stringify(e));
  const answer = (it: Intent, resourceId: string) => nc.publish(it.reply, JSON.stringify({ k: it.k, resourceId }));

  /** A known key: the last event's answer again when it is committed. */
  const known = async (it: Intent) => {
    const m = await jsm.direct.getMessage(eventsStream, { last_by_subj: opSubject(it.opId) });
    const last = m ? (m.json() as ShapeEvent) : undefined;
    if (last?.state === 'committed' && last.resourceId) answer(it, last.resourceId);
  };

  const handleIntent = async (data: Uint8Array) => {
    const it = JSON.parse(decoder.decode(data)) as Intent;
    const subject = opSubject(it.opId);
    let seq: number;
    try {
      const a = await js.publish(subject, enc({ state: 'accepted', opId: it.opId, pad: eventPad }), {
        msgID: `${it.opId}.accepted`,
        expect: { lastSubjectSequence: 0 },
      });
      if (a.duplicate) return known(it);
      seq = a.seq;
    } catch (err) {
      if (isWrongLastSequence(err)) return known(it);
      throw err;
    }
    const resourceId = effects.append(it.key);
    await executorJs.publish(subject, enc({ state: 'committed', opId: it.opId, resourceId, pad: eventPad }), {
      msgID: `${it.opId}.committed`,
      expect: { lastSubjectSequence: seq },
    });
    answer(it, resourceId);
  };

  const intake = await (await js.consumers.get(subjects.intentsStream(tenant), 'authorizer')).consume({
    max_messages: CONCURRENCY,
  });
  const host = await (await hostJs.consumers.get(eventsStream, 'host')).consume({ max_messages: 256 });

  let running = 0;
  const waiters: (() => void)[] = [];
  const intakeLoop = (async () => {
    for await (const m of intake) {
      while (running >= CONCURRENCY) await new Promise<void>((r) => waiters.push(r));
      running++;
      void handleIntent(m.data)
        .then(
          () => m.ack(),
          (err: unknown) => {
            process.stderr.write(`floor-shape-worker: intent failed: ${String(err)}\n`);
            m.nak(1_000);
          },
        )
        .finally(() => {
          running--;
          waiters.shift()?.();
        });
    }
  })();
  const hostLoop = (async () => {
    for await (const m of host) {
      const e = m.json<ShapeEvent>();
      if (e.state !== 'committed') {
        m.ack();
        continue;
      }
      void hostJs
        .publish(recordSubject(e.opId), JSON.stringify({ opId: e.opId, resourceId: e.resourceId, pad: recordPad }))
        .then(
          () => m.ack(),
          () => m.nak(1_000),
        );
    }
  })();

  process.once('SIGTERM', () => {
    void (async () => {
      await intake.close();
      await host.close();
      await Promise.all([intakeLoop, hostLoop]).catch(() => undefined);
      await Promise.all([authorizerNc, executorNc, hostNc].map((c) => c.drain().catch(() => undefined)));
      effects.close();
      process.exit(0);
    })();
  });
  process.send?.({ tooltx: 'ready' });
}

main().catch((err: unknown) => {
  process.stderr.write(`floor-shape-worker: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});
