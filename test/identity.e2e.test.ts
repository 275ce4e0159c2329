/**
 * Identity the server enforces: generated nkey users with allow-lists, on a real
 * nats-server with auth on. FM-06 (forged identity), FM-31 (squatted ids, guessed keys, cross-tenant
 * status), FM-32 (other users' reply inboxes), plus the id-collision and wildcard cases.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { errors, nanos, type NatsConnection, type PermissionViolationError } from '@nats-io/transport-node';
import { AckPolicy, jetstream, jetstreamManager } from '@nats-io/jetstream';
import { downstreamKeyOf, prepareCall, TooltxError } from '@tooltx/contracts';
import { createTools, newSubmission, publishSubmission, type Tools } from '@tooltx/client';
import { Subjects, encode } from '@tooltx/nats';
import { allStreams, checkDurables, Durables, topology } from '@tooltx/streams';
import {
  checkIdentityList,
  compensatingOperators,
  confirmingOperators,
  generateAuth,
  identityListSchema,
  knownDurables,
  permissionsFor,
  tenantsOf,
  type IdentityList,
} from '@tooltx/auth';
import { inboxPrefixOf, SERVICE_NAMES, type Role } from '@tooltx/nats';
import { provisioned, TEST_IDENTITIES, type TestNats } from './helpers/nats.js';
import { startService, type ServiceProcess } from './helpers/services.js';
import { history, waitForDecision } from './helpers/ops.js';
import { Sink } from './helpers/sink.js';
import { contracts, sinkWrite } from './fixtures/sink-tools.js';
import { beyondOne, figure, rowsWhereRefused } from './helpers/figures.js';

let t: TestNats;
let sink: Sink;
let procs: ServiceProcess[] = [];
let alice: Tools;
let mallory: NatsConnection;

const note = (title: string) => ({ bucket: 'kb-main', title, body: `Body of ${title}.`, at: '2026-11-30T06:00:00Z' });
const agent = (tenant: string, actor: string) => ({ kind: 'agent' as const, tenant, actor });

/** NATS subject matching: `*` is one token, a trailing `>` one or more. */
function subjectMatches(pattern: string, subject: string): boolean {
  const p = pattern.split('.');
  const s = subject.split('.');
  for (let i = 0; i < p.length; i++) {
    if (p[i] === '>') return s.length > i;
    if (i >= s.length || (p[i] !== '*' && p[i] !== s[i])) return false;
  }
  return p.length === s.length;
}

/** Resolves with the permission error the server raises for `fn`, or fails the test. */
async function permissionError(nc: NatsConnection, fn: () => unknown): Promise<PermissionViolationError> {
  const seen = new Promise<PermissionViolationError>((resolve) => {
    void (async () => {
      for await (const s of nc.status()) {
        if (s.type === 'error' && s.error instanceof errors.PermissionViolationError) return resolve(s.error);
      }
    })();
  });
  try {
    await fn();
  } catch (err) {
    if (err instanceof errors.PermissionViolationError) return err;
  }
  return Promise.race([
    seen,
    new Promise<never>((_, reject) => setTimeout(() => reject(new Error('no permission violation')), 3_000)),
  ]);
}

beforeAll(async () => {
  t = await provisioned();
  sink = await new Sink().start();
  const env = { ...t.env, SINK_URL: sink.url };
  procs = await Promise.all([startService('authorizer', env), startService('executor', env)]);
  alice = await createTools({
    servers: t.url,
    tenant: 'acme',
    actor: 'alice',
    nkeyFile: t.agentSeed('acme', 'alice'),
    contracts,
    prefix: t.subjects.prefix,
    receiptKeys: t.auth.receiptKeysFile,
  });
  mallory = await t.connectAs(agent('globex', 'mallory'));
});

afterAll(async () => {
  await alice?.close();
  await mallory?.close();
  expect(await Promise.all(procs.map((p) => p.stop()))).toEqual([0, 0]);
  await sink?.stop();
  await t?.close();
});

describe('FM-06: forged tenant or actor', () => {
  it("refuses publishing on another actor's intent subject at the server", async () => {
    const js = jetstream(mallory);
    const err = await permissionError(mallory, () =>
      js.publish(t.subjects.intent('acme', 'alice'), encode({ tool: 'sink.write' }), { timeout: 1_000 }),
    );
    expect(err.operation).toBe('publish');
    expect(err.subject).toBe(t.subjects.intent('acme', 'alice'));
  });

  it('records a payload naming another actor as forbidden on the decision subject; nothing is written', async ({
    task,
  }) => {
    const r = await alice.execute({ tool: 'sink.write', taskId: 'fm06', actorId: 'bob', input: note('Forged actor') });
    expect(r).toMatchObject({ status: 'rejected', error: { class: 'forbidden' } });
    const key = prepareCall(sinkWrite, 'fm06', note('Forged actor')).operationKey;
    expect((await waitForDecision(t, 'acme', key, 'alice')).error.class).toBe('forbidden');
    expect(await history(t, 'acme', key)).toEqual([]);
    const written = sink.writesFor((b) => b.title === 'Forged actor').length;
    figure(task, rowsWhereRefused(written));
    expect(written).toBe(0);
  });

  it('records a raw intent naming another actor, sent without a key, as forbidden under the key its request derives to; nothing is written', async ({
    task,
  }) => {
    const input = note('Forged raw');
    // No operationKey: the authorizer derives the key from the request itself, as for any intent.
    await publishSubmission(
      jetstream(mallory),
      newSubmission(t.subjects, 'globex', 'mallory', {
        tool: 'sink.write',
        version: 1,
        taskId: 'fm06-raw',
        actorId: 'gina',
        input,
      }),
    );
    const key = prepareCall(sinkWrite, 'fm06-raw', input).operationKey;
    const d = await waitForDecision(t, 'globex', key, 'mallory');
    expect(d).toMatchObject({
      operationKey: key,
      tenant: 'globex',
      actor: 'mallory',
      tool: 'sink.write',
      version: 1,
      error: { class: 'forbidden' },
    });
    expect(await history(t, 'globex', key)).toEqual([]);
    const written = sink.writesFor((b) => b.title === 'Forged raw').length;
    figure(task, rowsWhereRefused(written));
    expect(written).toBe(0);
  });
});

describe("FM-31: another tenant cannot suppress, hijack or read the victim's operation", () => {
  it("a squatted submission id does not suppress the victim's call: it still runs, exactly once", async ({ task }) => {
    const squatted = 'victim-submission-1';
    // The attacker publishes first, on its own subject, under the id the victim will use.
    const ack = await publishSubmission(
      jetstream(mallory),
      newSubmission(
        t.subjects,
        'globex',
        'mallory',
        { tool: 'sink.write', version: 1, taskId: 'x', input: {} },
        squatted,
      ),
    );
    expect(ack.duplicate).toBe(false);
    const victim = await createTools({
      servers: t.url,
      tenant: 'acme',
      actor: 'alice',
      nkeyFile: t.agentSeed('acme', 'alice'),
      contracts,
      prefix: t.subjects.prefix,
      receiptKeys: t.auth.receiptKeysFile,
      submissionIdFactory: () => squatted,
    });
    try {
      const r = await victim.execute({ tool: 'sink.write', taskId: 'fm31-squat', input: note('Squat') });
      const requests = sink.writesFor((b) => b.key === downstreamKeyOf('acme', r.operationKey!)).length;
      figure(task, { name: "sink requests for the victim's call", value: requests, duplicates: beyondOne(requests) });
      expect(r.status).toBe('committed');
      expect(requests).toBe(1);
      if (r.status === 'committed') expect(r.receipt.attempt).toBe(1);
    } finally {
      await victim.close();
    }
  });

  it("sending the victim's derived key from another tenant touches nothing of the victim", async ({ task }) => {
    const input = note('Victim note');
    const victim = await alice.execute({ tool: 'sink.write', taskId: 'fm31-key', input });
    expect(victim.status).toBe('committed');
    const before = await history(t, 'acme', victim.operationKey!);
    const js = jetstream(mallory);
    // (a) the victim's key with the attacker's own input: a conflict in the attacker's own scope.
    await publishSubmission(
      js,
      newSubmission(t.subjects, 'globex', 'mallory', {
        tool: 'sink.write',
        version: 1,
        taskId: 'fm31-key',
        operationKey: victim.operationKey!,
        input: note('Hijack'),
      }),
    );
    expect((await waitForDecision(t, 'globex', victim.operationKey!, 'mallory')).error.class).toBe(
      'idempotency_conflict',
    );
    // (b) the victim's very request: that is the attacker's own operation, in the attacker's tenant.
    await publishSubmission(
      js,
      newSubmission(t.subjects, 'globex', 'mallory', {
        tool: 'sink.write',
        version: 1,
        taskId: 'fm31-key',
        operationKey: victim.operationKey!,
        input,
      }),
    );
    for (
      let i = 0;
      i < 100 && sink.writesFor((b) => b.key === downstreamKeyOf('globex', victim.operationKey!)).length === 0;
      i++
    )
      await new Promise((r) => setTimeout(r, 50));
    expect(await history(t, 'acme', victim.operationKey!)).toEqual(before);
    const underVictimKey = sink.writesFor((b) => b.key === downstreamKeyOf('acme', victim.operationKey!)).length;
    figure(task, {
      name: "sink writes under the victim's key beyond its own",
      value: underVictimKey - 1,
      unauthorisedWrites: beyondOne(underVictimKey),
    });
    expect(underVictimKey).toBe(1);
    expect(sink.writesFor((b) => b.key === downstreamKeyOf('globex', victim.operationKey!))).toHaveLength(1);
    expect(downstreamKeyOf('globex', victim.operationKey!)).not.toBe(downstreamKeyOf('acme', victim.operationKey!));
  });

  it("status for the victim's key from another tenant reveals nothing, and its status subject is refused", async () => {
    const victim = await alice.execute({ tool: 'sink.write', taskId: 'fm31-status', input: note('Status secret') });
    expect(victim.status).toBe('committed');
    const gina = await createTools({
      servers: t.url,
      tenant: 'globex',
      actor: 'gina',
      nkeyFile: t.agentSeed('globex', 'gina'),
      contracts,
      prefix: t.subjects.prefix,
      receiptKeys: t.auth.receiptKeysFile,
    });
    try {
      const a = await gina.status({ operationKey: victim.operationKey! });
      expect(a).toMatchObject({ state: 'not_seen', source: 'none', seq: 0 });
      expect(JSON.stringify(a)).not.toContain(victim.status === 'committed' ? victim.receipt.resourceId : '-');
    } finally {
      await gina.close();
    }
    const err = await permissionError(mallory, () =>
      mallory.request(t.subjects.status('acme', 'alice'), encode({ operationKey: victim.operationKey }), {
        timeout: 1_000,
      }),
    );
    expect(err.subject).toBe(t.subjects.status('acme', 'alice'));
  });
});

describe('FM-32: reply inboxes are private', () => {
  it("refuses a subscription to another user's inbox prefix, or to all inboxes", async () => {
    for (const subject of ['_INBOX.acme.alice.>', '_INBOX.>', '_INBOX._svc.authorizer.>']) {
      const err = await permissionError(mallory, () => mallory.subscribe(subject));
      expect(err.operation).toBe('subscription');
      expect(err.subject).toBe(subject);
    }
  });

  it("refuses a subscription to another actor's pushed answers, in its own tenant or another", async () => {
    const bob = await t.connectAs(agent('acme', 'bob'));
    try {
      for (const [who, subject] of [
        [mallory, t.subjects.pushesOf('acme', 'alice')],
        [mallory, `${t.subjects.prefix}.push.>`],
        [bob, t.subjects.pushesOf('acme', 'alice')],
        [bob, `${t.subjects.prefix}.push.acme.>`],
      ] as const) {
        const err = await permissionError(who, () => who.subscribe(subject));
        expect(err.operation).toBe('subscription');
        expect(err.subject).toBe(subject);
      }
    } finally {
      await bob.close().catch(() => undefined);
    }
  });

  it("an eavesdropper receives nothing of the victim's replies", async () => {
    const eve = await t.connectAs(agent('globex', 'gina'));
    const got: string[] = [];
    const refusals: unknown[] = [];
    const sub = eve.subscribe('_INBOX.>', { callback: (e, m) => void (e ? refusals.push(e) : got.push(m.subject)) });
    await eve.flush().catch(() => undefined);
    const r = await alice.execute({ tool: 'sink.write', taskId: 'fm32-eaves', input: note('Eavesdrop') });
    expect(r.status).toBe('committed');
    expect(got).toEqual([]);
    expect(refusals[0]).toBeInstanceOf(errors.PermissionViolationError);
    sub.unsubscribe();
    await eve.close().catch(() => undefined);
  });

  it('a restricted user cannot create a stream or a consumer that captures inboxes or intents', async () => {
    for (const role of [agent('globex', 'mallory'), { kind: 'service' as const, service: 'executor' as const }]) {
      const nc = await t.connectAs(role);
      try {
        const jsm = await jetstreamManager(nc, { checkAPI: false, timeout: 1_000 });
        const s = await permissionError(nc, () => jsm.streams.add({ name: 'SPY', subjects: ['_INBOX.>'] }));
        expect(s.subject).toBe('$JS.API.STREAM.CREATE.SPY');
        const c = await permissionError(nc, () =>
          jsm.consumers.add(t.subjects.intentsStream('acme'), {
            durable_name: 'spy',
            filter_subject: t.subjects.allIntents,
            ack_policy: 'explicit' as never,
          }),
        );
        expect(c.subject).toMatch(/^\$JS\.API\.CONSUMER\.(CREATE|DURABLE\.CREATE)\./);
      } finally {
        await nc.close();
      }
    }
    await expect(t.jsm.streams.info('SPY')).rejects.toThrow();
  });

  it('no service can update a durable of the deployment or create a new one: a permissions violation, the durable unchanged', async () => {
    const events = t.subjects.eventsStream;
    const before = await t.jsm.consumers.info(events, 'executor');
    // The authorizer creates consumers on the event log (its status watch), the executor none.
    for (const service of ['authorizer', 'executor'] as const) {
      const nc = await t.connectAs({ kind: 'service', service });
      try {
        const jsm = await jetstreamManager(nc, { checkAPI: false, timeout: 1_000 });
        // Update the executor's durable: through the client (the create API with the name in the
        // subject), the legacy durable create, and the legacy ephemeral create naming it in the body
        // (which 2.9.10 would apply to the durable).
        const u = await permissionError(nc, () =>
          jsm.consumers.update(events, 'executor', { max_deliver: 1, ack_wait: nanos(1_000) }),
        );
        expect(u.subject).toBe(`$JS.API.CONSUMER.CREATE.${events}.executor.${t.subjects.allOps}`);
        const body = (config: Record<string, unknown>) =>
          JSON.stringify({
            stream_name: events,
            config: { ...before.config, max_deliver: 1, ack_wait: nanos(1_000), ...config },
          });
        for (const [subject, config] of [
          [`$JS.API.CONSUMER.DURABLE.CREATE.${events}.executor`, {}],
          [`$JS.API.CONSUMER.CREATE.${events}`, { durable_name: undefined, name: 'executor' }],
        ] as const) {
          const e = await permissionError(nc, () => nc.request(subject, body(config), { timeout: 1_000 }));
          expect(e.subject).toBe(subject);
        }
        // A new durable: on the intents stream, and under a durable name the deployment knows but
        // has not created here (an extra executor durable of the identity list).
        for (const [stream, durable, filter] of [
          [t.subjects.intentsStream('acme'), 'rogue', t.subjects.allIntents],
          [events, 'executor-b', t.subjects.allOps],
        ] as const) {
          const c = await permissionError(nc, () =>
            jsm.consumers.add(stream, {
              durable_name: durable,
              filter_subject: filter,
              ack_policy: AckPolicy.Explicit,
            }),
          );
          expect(c.subject).toBe(`$JS.API.CONSUMER.CREATE.${stream}.${durable}.${filter}`);
        }
        // The executor creates no consumer on the event log at all.
        if (service === 'executor') {
          const c = await permissionError(nc, () =>
            jsm.consumers.add(events, {
              durable_name: 'rogue',
              filter_subject: t.subjects.allOps,
              ack_policy: AckPolicy.Explicit,
            }),
          );
          expect(c.subject).toBe(`$JS.API.CONSUMER.CREATE.${events}.rogue.${t.subjects.allOps}`);
        }
        // Nor delete one.
        const d = await permissionError(nc, () => jsm.consumers.delete(events, 'executor'));
        expect(d.subject).toBe(`$JS.API.CONSUMER.DELETE.${events}.executor`);
      } finally {
        await nc.close();
      }
    }
    const after = await t.jsm.consumers.info(events, 'executor');
    expect(after.config).toEqual(before.config);
    expect(after.config).toMatchObject({ durable_name: 'executor', max_deliver: 50, ack_wait: nanos(30_000) });
    await expect(t.jsm.consumers.info(t.subjects.intentsStream('acme'), 'rogue')).rejects.toThrow(/not found/);
    await expect(t.jsm.consumers.info(events, 'rogue')).rejects.toThrow(/not found/);
    await expect(t.jsm.consumers.info(events, 'executor-b')).rejects.toThrow(/not found/);
  });

  it("FM-32: a durable under a new name that the server cannot refuse (the authorizer, on a stream and filter it reads) is reported by the provisioner's check", async () => {
    const events = t.subjects.eventsStream;
    const topo = t.topo;
    expect(await checkDurables(t.jsm, topo, ['executor-b'])).toEqual([]);
    const nc = await t.connectAs({ kind: 'service', service: 'authorizer' });
    try {
      const jsm = await jetstreamManager(nc, { checkAPI: false, timeout: 1_000 });
      // 2.9.10 carries a new durable's name in the body: the generated permissions cannot tell it apart.
      await jsm.consumers.add(events, {
        durable_name: 'sneaky',
        filter_subject: t.subjects.allOps,
        ack_policy: AckPolicy.Explicit,
      });
    } finally {
      await nc.close();
    }
    const v = await checkDurables(t.jsm, topo, ['executor-b']);
    expect(v).toHaveLength(1);
    expect(v[0]).toContain(`consumer ${events}/sneaky is a durable the topology does not define`);
    await t.jsm.consumers.delete(events, 'sneaky');
    expect(await checkDurables(t.jsm, topo, ['executor-b'])).toEqual([]);
  });

  it('the generated permissions give nobody but the provisioner a subject that creates, updates or deletes a known durable, or the legacy name-in-body create', () => {
    const topo = t.topo;
    const durables = knownDurables(topo, ['executor-b']);
    const streams = [
      ...allStreams(topo).map((x) => x.name),
      ...[t.subjects.resultsBucket, t.subjects.reconcileBucket, t.subjects.auditBucket, t.subjects.tasksBucket].map(
        (b) => `KV_${b}`,
      ),
    ];
    const attempts = streams.flatMap((st) => [
      `$JS.API.CONSUMER.CREATE.${st}`,
      ...durables.flatMap((d) => [
        `$JS.API.CONSUMER.CREATE.${st}.${d}`,
        `$JS.API.CONSUMER.CREATE.${st}.${d}.${t.subjects.prefix}.op.acme.x`,
        `$JS.API.CONSUMER.CREATE.${st}.${d}.${t.subjects.prefix}.intent.acme.alice`,
        `$JS.API.CONSUMER.CREATE.${st}.${d}.${t.subjects.prefix}.decision.acme.x`,
        `$JS.API.CONSUMER.CREATE.${st}.${d}.$KV.${st.slice(3)}.acme.x`,
        `$JS.API.CONSUMER.DURABLE.CREATE.${st}.${d}`,
        `$JS.API.CONSUMER.DELETE.${st}.${d}`,
      ]),
      ...['CREATE', 'UPDATE', 'DELETE', 'PURGE'].map((op) => `$JS.API.STREAM.${op}.${st}`),
    ]);
    const roles: Role[] = [
      ...SERVICE_NAMES.map((service) => ({ kind: 'service' as const, service })),
      agent('acme', 'alice'),
      { kind: 'auditor', tenant: 'acme', actor: 'audrey' },
      { kind: 'operator', operator: 'oscar' },
    ];
    // The one exception: a projection's service may create its own bucket again (memory storage,
    // gone after a server restart), nothing else.
    const ownBucket: Partial<Record<string, string[]>> = {
      reconciler: [`$JS.API.STREAM.CREATE.KV_${t.subjects.reconcileBucket}`],
      'audit-projector': [`$JS.API.STREAM.CREATE.KV_${t.subjects.auditBucket}`],
      // The identity of a process hosting every role holds what the two projections' services hold.
      host: [
        `$JS.API.STREAM.CREATE.KV_${t.subjects.reconcileBucket}`,
        `$JS.API.STREAM.CREATE.KV_${t.subjects.auditBucket}`,
      ],
    };
    for (const role of roles) {
      const p = permissionsFor(role, t.subjects, topo, ['executor-b']);
      const allowed = (subject: string) =>
        p.publish.allow.some((a) => subjectMatches(a, subject)) &&
        !(p.publish.deny ?? []).some((d) => subjectMatches(d, subject));
      const expected = (role.kind === 'service' && ownBucket[role.service]) || [];
      expect({ role, allowed: attempts.filter(allowed) }).toEqual({ role, allowed: expected });
    }
    // The matcher itself: the authorizer may create its status watch on the event log.
    const authz = permissionsFor({ kind: 'service', service: 'authorizer' }, t.subjects, topo);
    expect(
      authz.publish.allow.some((a) =>
        subjectMatches(a, `$JS.API.CONSUMER.CREATE.${t.subjects.eventsStream}.oc_x_1.${t.subjects.allOps}`),
      ),
    ).toBe(true);
  });
});

describe('projection rebuilds', () => {
  it("a projection's service may create its own bucket again and read the log from its start through an ordered consumer — no other bucket, no update, purge or delete of one, no pull from another's durable", () => {
    const topo = t.topo;
    const events = t.subjects.eventsStream;
    const decisions = t.subjects.decisionsStream('acme');
    const durables = knownDurables(topo, ['executor-b']);
    const buckets = [
      t.subjects.reconcileBucket,
      t.subjects.auditBucket,
      t.subjects.resultsBucket,
      t.subjects.tasksBucket,
    ];
    const cases = [
      {
        service: 'reconciler' as const,
        bucket: t.subjects.reconcileBucket,
        reads: [[events, t.subjects.allOps, Durables.reconciler]] as const,
      },
      {
        service: 'audit-projector' as const,
        bucket: t.subjects.auditBucket,
        reads: [
          [events, t.subjects.allOps, Durables.auditProjector],
          [decisions, t.subjects.decisionsOf('acme'), Durables.auditDecisions],
        ] as const,
      },
    ];
    for (const c of cases) {
      const p = permissionsFor({ kind: 'service', service: c.service }, t.subjects, topo, ['executor-b']);
      const allowed = (subject: string) =>
        p.publish.allow.some((a) => subjectMatches(a, subject)) &&
        !(p.publish.deny ?? []).some((d) => subjectMatches(d, subject));
      const streamOps = buckets.flatMap((b) =>
        ['CREATE', 'UPDATE', 'DELETE', 'PURGE'].map((op) => `$JS.API.STREAM.${op}.KV_${b}`),
      );
      expect({ service: c.service, allowed: streamOps.filter(allowed) }).toEqual({
        service: c.service,
        allowed: [`$JS.API.STREAM.CREATE.KV_${c.bucket}`],
      });
      for (const [stream, filter, own] of c.reads) {
        for (const sub of [
          `$JS.API.CONSUMER.CREATE.${stream}.oc_x_1.${filter}`,
          `$JS.API.CONSUMER.MSG.NEXT.${stream}.oc_x_1`,
          `$JS.API.CONSUMER.DELETE.${stream}.oc_x_1`,
          `$JS.API.CONSUMER.MSG.NEXT.${stream}.${own}`,
        ])
          expect({ service: c.service, sub, allowed: allowed(sub) }).toEqual({
            service: c.service,
            sub,
            allowed: true,
          });
        // Another filter than the one it reads, and every other durable's messages: refused.
        for (const sub of [
          `$JS.API.CONSUMER.CREATE.${stream}.oc_x_1`,
          `$JS.API.CONSUMER.CREATE.${t.subjects.intentsStream('acme')}.oc_x_1.${t.subjects.intentsOf('acme')}`,
          ...durables.filter((d) => d !== own).map((d) => `$JS.API.CONSUMER.MSG.NEXT.${stream}.${d}`),
        ])
          expect({ service: c.service, sub, allowed: allowed(sub) }).toEqual({
            service: c.service,
            sub,
            allowed: false,
          });
      }
    }
  });
});

describe('keys across generations', () => {
  it("a user's seed is kept when the configuration is generated again (a restarted stack does not lock out a connected agent); a file that is not a user seed is replaced; a user removed from the list loses its seed", () => {
    const s = new Subjects('tkeep');
    const outDir = mkdtempSync(join(tmpdir(), 'tooltx-keep-'));
    try {
      const o = { subjects: s, topology: topology(s), outDir, listen: '127.0.0.1:-1', storeDir: join(outDir, 'js') };
      const list: IdentityList = { tenants: [{ id: 'acme', actors: ['alice', 'bob'] }] };
      const first = generateAuth(list, o);
      const alice = join(outDir, 'nkeys', 'agent.acme.alice.nk');
      const bob = join(outDir, 'nkeys', 'agent.acme.bob.nk');
      const aliceSeed = readFileSync(alice, 'utf8');
      writeFileSync(bob, 'not a seed\n');
      const second = generateAuth(list, o);
      const keyOf = (g: typeof first, file: string) => g.users.find((u) => u.seedFile === file)!.publicKey;
      expect(readFileSync(alice, 'utf8')).toBe(aliceSeed);
      expect(keyOf(second, alice)).toBe(keyOf(first, alice));
      expect(readFileSync(bob, 'utf8')).toMatch(/^SU[A-Z2-7]+\n$/);
      expect(keyOf(second, bob)).not.toBe(keyOf(first, bob));
      expect(statSync(bob).mode & 0o777).toBe(0o600);
      // The configuration names the kept key.
      expect(readFileSync(second.configFile, 'utf8')).toContain(keyOf(first, alice));
      // bob leaves the list: his seed goes; added back, he gets a new key, never the old one.
      generateAuth({ tenants: [{ id: 'acme', actors: ['alice'] }] }, o);
      expect(existsSync(bob)).toBe(false);
      const back = generateAuth(list, o);
      expect(keyOf(back, bob)).not.toBe(keyOf(second, bob));
      expect(keyOf(back, alice)).toBe(keyOf(first, alice));
    } finally {
      rmSync(outDir, { recursive: true, force: true });
    }
  });
});

describe('ids are one subject token', () => {
  it('the generator refuses wildcard, dotted and empty ids', () => {
    const s = new Subjects('tcheck');
    const base = {
      subjects: s,
      topology: topology(s),
      outDir: '/tmp/tooltx-never-written',
      listen: '127.0.0.1:-1',
      storeDir: '/tmp/x',
    };
    for (const actors of [['>'], ['*'], ['b.c'], [''], ['UPPER']]) {
      expect(() => generateAuth({ tenants: [{ id: 'a', actors }] }, base)).toThrow(/\^\[a-z0-9_-\]\{1,64\}\$/);
    }
    expect(() => generateAuth({ tenants: [{ id: 'a.b', actors: ['c'] }] }, base)).toThrow();
  });

  const gen = (list: IdentityList) => {
    const s = new Subjects('tcheck');
    const outDir = `/tmp/tooltx-never-written-${process.pid}`;
    try {
      generateAuth(list, { subjects: s, topology: topology(s), outDir, listen: '127.0.0.1:-1', storeDir: '/tmp/x' });
    } catch (err) {
      expect(existsSync(outDir)).toBe(false);
      return err;
    }
    throw new Error('the generator accepted the list');
  };

  it("the generator refuses ids reserved for tooltx's namespaces: tenant _svc + actor executor is not the executor service, _op + an operator id not that operator", () => {
    expect(inboxPrefixOf({ kind: 'service', service: 'executor' })).toBe('_INBOX._svc.executor');
    for (const [list, path, id] of [
      [{ tenants: [{ id: '_svc', actors: ['executor'] }] }, ['tenants', 0, 'id'], '_svc'],
      [
        {
          tenants: [
            { id: 'acme', actors: ['alice'] },
            { id: '_op', actors: ['oscar'] },
          ],
          operators: ['oscar'],
        },
        ['tenants', 1, 'id'],
        '_op',
      ],
      [{ tenants: [{ id: '_provisioner', actors: ['x'] }] }, ['tenants', 0, 'id'], '_provisioner'],
      [{ tenants: [{ id: 'acme', auditors: ['_audit'] }] }, ['tenants', 0, 'auditors', 0], '_audit'],
      [{ tenants: [{ id: 'acme', actors: ['a'] }], operators: ['_op'] }, ['operators', 0], '_op'],
    ] as [IdentityList, (string | number)[], string][]) {
      const err = gen(list);
      expect(err).toBeInstanceOf(TooltxError);
      expect(err).toMatchObject({ class: 'invalid_input', issues: [{ path, code: 'reserved_id' }] });
      expect((err as Error).message).toContain(`${path.join('.')}: `);
      expect((err as Error).message).toContain(JSON.stringify(id));
    }
  });

  it("the generator refuses two identities that would share a reply inbox: an actor and an auditor with one id in one tenant, an id listed twice; and an extra executor durable naming another service's durable", () => {
    for (const [list, path, other, code] of [
      [
        { tenants: [{ id: 'acme', actors: ['alice'], auditors: ['alice'] }] },
        ['tenants', 0, 'auditors', 0],
        'tenants.0.actors.0 (actor acme/alice)',
        'inbox_collision',
      ],
      [
        { tenants: [{ id: 'acme', actors: ['alice', 'bob', 'alice'] }] },
        ['tenants', 0, 'actors', 2],
        'tenants.0.actors.0 (actor acme/alice)',
        'inbox_collision',
      ],
      [
        { tenants: [{ id: 'acme', actors: ['a'] }], operators: ['oscar', 'oscar'] },
        ['operators', 1],
        'operators.0 (operator oscar)',
        'inbox_collision',
      ],
      [
        { tenants: [{ id: 'acme', actors: ['a'] }], executorDurables: ['reconciler'] },
        ['executorDurables', 0],
        'reconciler',
        'durable_collision',
      ],
    ] as [IdentityList, (string | number)[], string, string][]) {
      const err = gen(list);
      expect(err).toBeInstanceOf(TooltxError);
      expect(err).toMatchObject({ class: 'invalid_input', issues: [{ path, code }] });
      expect((err as Error).message).toContain(path.join('.'));
      expect((err as Error).message).toContain(other);
    }
    // The same id in two tenants, or for an actor and an operator, is two inboxes: accepted.
    expect(() =>
      checkIdentityList({
        tenants: [
          { id: 'acme', actors: ['mallory'] },
          { id: 'globex', actors: ['mallory'], auditors: ['audrey'] },
        ],
        operators: ['mallory'],
      }),
    ).not.toThrow();
  });

  it('the lists in use pass, and every user of the test list has an inbox of its own that contains no other', () => {
    expect(() => checkIdentityList(TEST_IDENTITIES, topology(new Subjects('tcheck')))).not.toThrow();
    const prefixes = t.auth.users.map((u) => u.inboxPrefix);
    expect(new Set(prefixes).size).toBe(prefixes.length);
    for (const a of prefixes) for (const b of prefixes) if (a !== b) expect(b.startsWith(`${a}.`)).toBe(false);
    // The list `npm start` and the demo generate their configuration from.
    const sample = JSON.parse(
      readFileSync(new URL('../examples/research-kb/identities.json', import.meta.url), 'utf8'),
    ) as IdentityList;
    expect(() => checkIdentityList(sample, topology(new Subjects('tooltx')))).not.toThrow();
  });

  it('tenant a + actor b.c can never equal tenant a.b + actor c', () => {
    const s = new Subjects('tcheck');
    expect(() => s.intent('a', 'b.c')).toThrow(TypeError);
    expect(() => s.intent('a.b', 'c')).toThrow(TypeError);
    expect(s.parseActorSubject('intent', 'tcheck.intent.a.b.c')).toBeNull();
    expect(s.parseActorSubject('intent', 'tcheck.intent.a.*')).toBeNull();
  });
});

describe('operator grants: who may ask for a compensation (tooltx compensate)', () => {
  const s = new Subjects('tcheck');
  const list: IdentityList = {
    tenants: [
      { id: 'acme', actors: ['alice'], auditors: ['audrey'] },
      { id: 'globex', actors: ['gina'] },
    ],
    operators: ['oscar', { id: 'olga', may: ['compensate'] }],
  };
  const topo = topology(s, { tenants: tenantsOf(list) });
  const tenants = ['acme', 'globex'];
  const perms = (role: Role) => permissionsFor(role, s, topo, [], tenants, compensatingOperators(list));
  const may = (role: Role, op: 'publish' | 'subscribe', subject: string) => {
    const p = perms(role)[op];
    return p.allow.some((a) => subjectMatches(a, subject)) && !(p.deny ?? []).some((d) => subjectMatches(d, subject));
  };

  it("only a granted operator may publish its compensation requests, and only the authorizer may store them, under that operator's reserved token", () => {
    expect(compensatingOperators(list)).toEqual(['olga']);
    const olga = { kind: 'operator' as const, operator: 'olga' };
    const oscar = { kind: 'operator' as const, operator: 'oscar' };
    expect(may(olga, 'publish', s.opsCompensate('olga'))).toBe(true);
    expect(may(olga, 'publish', s.opsCompensate('oscar'))).toBe(false);
    expect(may(oscar, 'publish', s.opsCompensate('oscar'))).toBe(false);
    expect(may(oscar, 'publish', s.opsCompensate('olga'))).toBe(false);
    // Operators still reach the takeover service, and no intent subject at all.
    expect(may(oscar, 'publish', s.takeover('oscar'))).toBe(true);
    expect(may(olga, 'publish', s.intent('acme', '_op-olga'))).toBe(false);

    const tokens = tenants.map((tenant) => s.intent(tenant, '_op-olga'));
    for (const service of ['authorizer', 'host'] as const) {
      const role = { kind: 'service' as const, service };
      // Exactly the granted operator's token in each tenant: no other operator's, no agent's.
      for (const subject of tokens)
        expect({ service, subject, ok: may(role, 'publish', subject) }).toMatchObject({ ok: true });
      for (const subject of [s.intent('acme', '_op-oscar'), s.intent('acme', 'alice'), s.intent('acme', '_op-x')])
        expect({ service, subject, ok: may(role, 'publish', subject) }).toMatchObject({ ok: false });
      expect(may(role, 'subscribe', s.opsCompensate('olga'))).toBe(true);
    }
    // Nobody else may publish under an operator's token: agents, auditors, operators, other services.
    const others: Role[] = [
      agent('acme', 'alice'),
      agent('globex', 'gina'),
      { kind: 'auditor', tenant: 'acme', actor: 'audrey' },
      olga,
      oscar,
      { kind: 'service', service: 'executor' },
      { kind: 'service', service: 'reconciler' },
      { kind: 'service', service: 'audit-projector' },
    ];
    for (const role of others)
      for (const subject of tokens)
        expect({ role, subject, ok: may(role, 'publish', subject) }).toMatchObject({ ok: false });
    // Without a granted operator the authorizer may store none.
    const none = permissionsFor({ kind: 'service', service: 'authorizer' }, s, topo, [], tenants, []);
    expect(none.publish.allow.filter((a) => a.includes('._op-'))).toEqual([]);
  });

  it('the list: an operator is an id or { id, may }; an unknown grant is refused at its path, a compensating operator whose _op- token would not be one subject token is refused with its path, and the older form keeps working', () => {
    expect(() => checkIdentityList(list, topo)).not.toThrow();
    expect(() => checkIdentityList({ tenants: [{ id: 'acme' }], operators: ['oscar'] })).not.toThrow();
    const bad = identityListSchema.safeParse({
      tenants: [{ id: 'acme' }],
      operators: [{ id: 'olga', may: ['delete'] }],
    });
    expect(bad.success).toBe(false);
    expect(bad.error?.issues.some((i) => i.path.slice(0, 2).join('.') === 'operators.0')).toBe(true);
    const long = 'o'.repeat(61);
    expect(() => checkIdentityList({ tenants: [{ id: 'acme' }], operators: [long] })).not.toThrow();
    let err: unknown;
    try {
      checkIdentityList({ tenants: [{ id: 'acme' }], operators: [{ id: long, may: ['compensate'] }] });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(TooltxError);
    expect(err).toMatchObject({ class: 'invalid_input', issues: [{ path: ['operators', 0, 'id'], code: 'too_long' }] });
    expect(() => checkIdentityList({ tenants: [{ id: 'acme' }], operators: [{ id: '_op', may: [] }] })).toThrow(
      /operators\.0\.id/,
    );
    // The generated configuration: only olga's own account imports her subject, and only she may publish it.
    const outDir = mkdtempSync(join(tmpdir(), 'tooltx-grants-'));
    try {
      const g = generateAuth(list, { subjects: s, topology: topo, outDir, listen: '127.0.0.1:-1', storeDir: '/tmp/x' });
      const conf = readFileSync(g.configFile, 'utf8');
      expect(conf).toContain(`{ service: { account: "TOOLTX", subject: "tcheck.ops.compensate.olga" } }`);
      expect(conf).not.toContain('"tcheck.ops.compensate.>" } }');
      // Her account's import, and her user's permission.
      expect(conf.split('\n').filter((l) => l.includes('"tcheck.ops.compensate.olga"'))).toHaveLength(2);
      expect(conf).not.toContain('"tcheck.ops.compensate.oscar"');
    } finally {
      rmSync(outDir, { recursive: true, force: true });
    }
  });
});

describe('operator grants: who may confirm or discard a held-back operation (tooltx confirm, tooltx discard)', () => {
  const s = new Subjects('tcheck');
  // olga may compensate, carl may confirm (and discard), cleo both, oscar neither.
  const list: IdentityList = {
    tenants: [
      { id: 'acme', actors: ['alice'], auditors: ['audrey'] },
      { id: 'globex', actors: ['gina'] },
    ],
    operators: [
      'oscar',
      { id: 'olga', may: ['compensate'] },
      { id: 'carl', may: ['confirm'] },
      { id: 'cleo', may: ['compensate', 'confirm'] },
    ],
  };
  const topo = topology(s, { tenants: tenantsOf(list) });
  const tenants = ['acme', 'globex'];
  const perms = (role: Role) =>
    permissionsFor(role, s, topo, [], tenants, compensatingOperators(list), confirmingOperators(list));
  const may = (role: Role, op: 'publish' | 'subscribe', subject: string) => {
    const p = perms(role)[op];
    return p.allow.some((a) => subjectMatches(a, subject)) && !(p.deny ?? []).some((d) => subjectMatches(d, subject));
  };
  const operator = (id: string) => ({ kind: 'operator' as const, operator: id });
  const asks = (id: string) => [s.opsConfirm(id), s.opsDiscard(id)];

  it("only an operator granted confirm may publish its confirmations and discards, one grant for both, and only the authorizer may store them under that operator's reserved token", () => {
    expect(confirmingOperators(list)).toEqual(['carl', 'cleo']);
    expect(s.parseOpsConfirmSubject(s.opsConfirm('carl'))).toEqual({ action: 'confirm', operator: 'carl' });
    expect(s.parseOpsConfirmSubject(s.opsDiscard('carl'))).toEqual({ action: 'discard', operator: 'carl' });
    for (const bad of [
      'tcheck.ops.compensate.carl',
      'tcheck.ops.confirm._op',
      'tcheck.ops.confirm.a.b',
      'x.ops.confirm.carl',
    ])
      expect({ bad, parsed: s.parseOpsConfirmSubject(bad) }).toEqual({ bad, parsed: null });
    for (const id of ['carl', 'cleo'])
      for (const subject of asks(id))
        expect({ id, subject, ok: may(operator(id), 'publish', subject) }).toMatchObject({ ok: true });
    // Not another operator's subjects, and not without the grant.
    for (const [id, subject] of [
      ['carl', s.opsConfirm('cleo')],
      ['carl', s.opsDiscard('cleo')],
      ['olga', s.opsConfirm('olga')],
      ['olga', s.opsDiscard('olga')],
      ['oscar', s.opsConfirm('oscar')],
      ['oscar', s.opsDiscard('oscar')],
    ] as const)
      expect({ id, subject, ok: may(operator(id), 'publish', subject) }).toMatchObject({ ok: false });
    // The confirm grant is not the compensate grant, nor the other way round.
    expect(may(operator('carl'), 'publish', s.opsCompensate('carl'))).toBe(false);
    expect(may(operator('cleo'), 'publish', s.opsCompensate('cleo'))).toBe(true);
    expect(may(operator('carl'), 'publish', s.intent('acme', '_op-carl'))).toBe(false);

    for (const service of ['authorizer', 'host'] as const) {
      const role = { kind: 'service' as const, service };
      // Every granted operator's token in each tenant, whichever grant: no other operator's.
      for (const tenant of tenants)
        for (const id of ['olga', 'carl', 'cleo'])
          expect({ service, tenant, id, ok: may(role, 'publish', s.intent(tenant, `_op-${id}`)) }).toMatchObject({
            ok: true,
          });
      expect(may(role, 'publish', s.intent('acme', '_op-oscar'))).toBe(false);
      for (const subject of asks('carl')) expect(may(role, 'subscribe', subject)).toBe(true);
    }
    // Nobody else may publish under the confirming operator's token.
    const others: Role[] = [
      agent('acme', 'alice'),
      { kind: 'auditor', tenant: 'acme', actor: 'audrey' },
      operator('carl'),
      { kind: 'service', service: 'executor' },
      { kind: 'service', service: 'reconciler' },
      { kind: 'service', service: 'audit-projector' },
    ];
    for (const role of others)
      expect({ role, ok: may(role, 'publish', s.intent('acme', '_op-carl')) }).toMatchObject({ ok: false });
  });

  it('the list: confirm is a known grant; a confirming operator whose _op- token would not be one subject token is refused at its path; the generated configuration', () => {
    expect(() => checkIdentityList(list, topo)).not.toThrow();
    const long = 'o'.repeat(61);
    let err: unknown;
    try {
      checkIdentityList({ tenants: [{ id: 'acme' }], operators: [{ id: long, may: ['confirm'] }] });
    } catch (e) {
      err = e;
    }
    expect(err).toMatchObject({ class: 'invalid_input', issues: [{ path: ['operators', 0, 'id'], code: 'too_long' }] });
    expect(
      identityListSchema.safeParse({
        tenants: [{ id: 'acme' }],
        operators: [{ id: 'carl', may: ['confirm', 'confirm'] }],
      }).success,
    ).toBe(false);
    const outDir = mkdtempSync(join(tmpdir(), 'tooltx-grants-'));
    try {
      const g = generateAuth(list, { subjects: s, topology: topo, outDir, listen: '127.0.0.1:-1', storeDir: '/tmp/x' });
      const conf = readFileSync(g.configFile, 'utf8');
      for (const action of ['confirm', 'discard']) {
        expect(conf).toContain(`{ service: { account: "TOOLTX", subject: "tcheck.ops.${action}.carl" } }`);
        expect(conf.split('\n').filter((l) => l.includes(`"tcheck.ops.${action}.carl"`))).toHaveLength(2);
        expect(conf).not.toContain(`"tcheck.ops.${action}.olga"`);
        expect(conf).not.toContain(`"tcheck.ops.${action}.oscar"`);
      }
    } finally {
      rmSync(outDir, { recursive: true, force: true });
    }
  });
});
