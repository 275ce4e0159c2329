import { operatorActorOf } from '@tooltx/contracts';
import { inboxPrefixOf, RESPONSE_SUBJECTS, type Role, type Subjects } from '@tooltx/nats';
import { Durables, type Topology } from '@tooltx/streams';

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

/**
 * Every durable consumer name the deployment knows: the topology's and the extra executor
 * durables of the identity list. Nobody but the provisioner may create, update or delete a
 * consumer of one of these names, on any stream ({@link permissionsFor}).
 */
export function knownDurables(topo: Topology, executorDurables: string[] = []): string[] {
  return [
    ...new Set([...Object.values(Durables), ...topo.consumers.map((c) => c.config.durable_name), ...executorDurables]),
  ];
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
 * already reads (a KV watch, the authorizer's status watch, the reconciler's and audit-projector's
 * reads of the log when they rebuild their projection), and every service is denied the
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
  /** The operators granted `compensate` in the identity list (`tooltx compensate`). */
  compensators: string[] = [],
  /** The operators granted `confirm` in the identity list (`tooltx confirm`, `tooltx discard`). */
  confirmers: string[] = [],
  /** The operators granted `query` in the identity list (`tooltx ops list`, the console). */
  queriers: string[] = [],
  /** The operators granted `debug` in the identity list (`tooltx debug`, docs/debug-samples.md). */
  debuggers: string[] = [],
  /** The operators granted `contracts` in the identity list (`tooltx contracts`). */
  contractors: string[] = [],
): Permissions {
  const api = '$JS.API';
  if (role.kind === 'service' && role.service === 'host')
    return hostPermissions(
      s,
      topo,
      executorDurables,
      tenants,
      compensators,
      confirmers,
      queriers,
      debuggers,
      contractors,
    );
  const inbox = `${inboxPrefixOf(role)}.>`;
  // Where a request/reply service (status, audit, takeover) answers: agents, auditors and operators
  // live in their own accounts and reach these services through service imports, so every request
  // arrives with a reply subject the server made (`_R_.…`) that routes the answer back to the
  // requester's account and nowhere else ({@link generateAuth}). Never `allow_responses` (see
  // Permissions).
  const answers = RESPONSE_SUBJECTS;
  const streams = Object.values(topo.streams).map((st) => st.name);
  const kvStream = (bucket: string) => `KV_${bucket}`;
  const buckets = [
    topo.results.bucket,
    ...(topo.debug ? [topo.debug.sampling.bucket, topo.debug.samples.bucket] : []),
    topo.projections.reconcile.bucket,
    topo.projections.audit.bucket,
    topo.tasks.bucket,
    topo.tenantsBucket.bucket,
    topo.contracts.bucket,
  ];
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
  // replica of an R3 stream) is asked again of the stream's leader (JetStreamStore, FM-29).
  const directSeq = (stream: string) => [`${api}.DIRECT.GET.${stream}`, `${api}.STREAM.MSG.GET.${stream}`];
  const kvRead = (bucket: string) => [
    ...directLast(kvStream(bucket)),
    ...directSeq(kvStream(bucket)),
    `${api}.STREAM.INFO.${kvStream(bucket)}`,
  ];
  const kvWrite = (bucket: string) => [`$KV.${bucket}.>`];
  // A KV watch, key listing or history: an ordered push consumer on the bucket's own stream, named
  // in the subject and filtered to the bucket's keys (never the legacy name-in-body create).
  const kvWatch = (bucket: string) => [
    `${api}.CONSUMER.CREATE.${kvStream(bucket)}.*.$KV.${bucket}.>`,
    `${api}.CONSUMER.DELETE.${kvStream(bucket)}.*`,
    `${api}.CONSUMER.INFO.${kvStream(bucket)}.*`,
    `$JS.FC.${kvStream(bucket)}.>`,
  ];
  // Every service: no create, update or delete of a durable the deployment knows, on any stream.
  const durables = knownDurables(topo, executorDurables);
  const durableGuard = durables.flatMap((d) => [
    `${api}.CONSUMER.CREATE.*.${d}`,
    `${api}.CONSUMER.CREATE.*.${d}.>`,
    `${api}.CONSUMER.DURABLE.CREATE.*.${d}`,
    `${api}.CONSUMER.DELETE.*.${d}`,
  ]);
  const tasks = topo.tasks.bucket;
  const events = topo.streams.events.name;
  // A read of a stream from its start or from now: an ordered consumer, created with its filter in
  // the subject (the first create form above), read by pull, deleted when done. `*` also matches
  // the deployment's durables: who gets this is denied MSG.NEXT on every durable but its own
  // ({@link othersDurables}), and the create, update and delete of all of them (`durableGuard`).
  const ordered = (stream: string, filter: string) => [
    `${api}.CONSUMER.CREATE.${stream}.*.${filter}`,
    `${api}.CONSUMER.MSG.NEXT.${stream}.*`,
    `${api}.CONSUMER.DELETE.${stream}.*`,
    `${api}.CONSUMER.INFO.${stream}.*`,
  ];
  // No pulling from another's durable on `stream` (deny wins over allow in nats-server).
  const othersDurables = (stream: string, own: string[]) =>
    durables.filter((d) => !own.includes(d)).map((d) => `${api}.CONSUMER.MSG.NEXT.${stream}.${d}`);
  // A projection bucket is on memory storage and gone after a server restart: its service may
  // create it again (only create: a stream that exists is never changed by it; nobody but the
  // provisioner updates, purges or deletes one) and rebuild it from the streams it projects.
  const recreate = (bucket: string) => [`${api}.STREAM.CREATE.${kvStream(bucket)}`];
  // The tenants and their limits: the authorizer and the audit-projector serve each listed one.
  // The contract registry (docs/contracts.md): the services holding contracts publish theirs and
  // watch it; the audit-projector's contracts service writes operators' commands.
  const contractsRW = [
    ...kvRead(topo.contracts.bucket),
    ...kvWrite(topo.contracts.bucket),
    ...kvWatch(topo.contracts.bucket),
  ];
  const tenantsRead = [...kvRead(topo.tenantsBucket.bucket), ...kvWatch(topo.tenantsBucket.bucket)];

  switch (role.kind) {
    case 'agent':
      return {
        publish: {
          allow: [
            s.intent(role.tenant, role.actor),
            s.status(role.tenant, role.actor),
            // The current version of each contract name, by direct get of its `current.<name>` key
            // only: no other registry entry, no watch, no stream info (docs/contracts.md).
            `${api}.DIRECT.GET.${kvStream(topo.contracts.bucket)}.$KV.${topo.contracts.bucket}.current.>`,
          ],
        },
        subscribe: { allow: [inbox, s.pushesOf(role.tenant, role.actor)] },
      };
    case 'auditor':
      // Auditors reach audit records only through the audit service, on their own subject:
      // no stream, bucket or JetStream API subject — not intents, inputs, results, events or the KV.
      return { publish: { allow: [s.audit(role.tenant, role.actor)] }, subscribe: { allow: [inbox] } };
    case 'operator':
      // The compensation request subject only for an operator granted `compensate`, the
      // confirmation and discard subjects only for one granted `confirm`: one without the grant is
      // refused by the server and reaches nothing that could tell it about an operation.
      return {
        publish: {
          allow: [
            s.takeover(role.operator),
            ...(compensators.includes(role.operator) ? [s.opsCompensate(role.operator)] : []),
            ...(confirmers.includes(role.operator) ? [s.opsConfirm(role.operator), s.opsDiscard(role.operator)] : []),
            ...(debuggers.includes(role.operator) ? [s.opsDebug(role.operator)] : []),
            ...(queriers.includes(role.operator) ? [s.opsQuery(role.operator)] : []),
            ...(contractors.includes(role.operator) ? [s.opsContracts(role.operator)] : []),
          ],
        },
        subscribe: { allow: [inbox] },
      };
    case 'provisioner':
      return { publish: { allow: [`${api}.>`, `$KV.>`, `${s.prefix}.>`] }, subscribe: { allow: [inbox] } };
    case 'service': {
      switch (role.service) {
        case 'authorizer': {
          // The status watch: ordered consumers on the event log and the decision stream, created
          // with their filter in the subject; they may never pull from, create, update or delete a
          // durable of the deployment.
          return {
            publish: {
              allow: [
                ...check,
                ...tenantsRead,
                // Each tenant's intents; an intent that registered nothing is deleted once its
                // decision is recorded (docs/tenancy.md).
                ...intentsStreams.flatMap((n) => [...pull(n, Durables.authorizer), `${api}.STREAM.MSG.DELETE.${n}`]),
                // A registered operation's input read back from its intent: a confirmation's policy
                // check and a compensation's input (docs/compensation.md).
                ...intentsStreams.flatMap((n) => directSeq(n)),
                ...directLast(events),
                ...directSeq(events),
                // A caller's decision by its submission, behind later ones of the same actor on one
                // key: read by `next_by_subj`, which goes to the stream's own API subject (FM-21).
                ...decisionsStreams.flatMap((n) => [...directLast(n), `${api}.DIRECT.GET.${n}`]),
                ...kvRead(topo.results.bucket),
                ...ordered(events, s.allOps),
                ...tenants.flatMap((t) => ordered(s.decisionsStream(t), s.decisionsOf(t))),
                ...kvRead(tasks),
                ...kvWatch(tasks),
                ...contractsRW,
                s.allOps,
                s.allDecisions,
                // Status answers, and "poll now" pushed to a submission's agent.
                answers,
                s.allPush,
                // An operator's compensation, confirmation or discard request, stored as an intent
                // under `_op-<operator>` in each tenant's intake stream: exactly the granted
                // operators' subjects, so that what arrives under such a token was put there by
                // this service for that operator.
                ...tenants.flatMap((t) =>
                  [...new Set([...compensators, ...confirmers])].map((o) => s.intent(t, operatorActorOf(o))),
                ),
              ],
              deny: [
                ...durableGuard,
                ...durables.flatMap((d) =>
                  [events, ...decisionsStreams].map((n) => `${api}.CONSUMER.MSG.NEXT.${n}.${d}`),
                ),
              ],
            },
            // Status requests, and operators' compensation, confirmation and discard requests
            // (queue groups): only a granted operator may publish the latter.
            subscribe: { allow: [inbox, s.allStatus, s.allOpsCompensate, s.allOpsConfirm, s.allOpsDiscard] },
          };
        }
        case 'executor':
          return {
            publish: {
              allow: [
                ...check,
                ...[Durables.executor, ...executorDurables].flatMap((d) => pull(events, d)),
                ...directLast(events),
                ...directSeq(events),
                ...intentsStreams.flatMap((n) => directSeq(n)),
                ...kvRead(topo.results.bucket),
                ...kvWrite(topo.results.bucket),
                ...kvRead(tasks),
                ...kvWatch(tasks),
                ...contractsRW,
                // A debug window's tenant is checked against the tenants bucket (read only).
                ...kvRead(topo.tenantsBucket.bucket),
                s.allOps,
                // The answer pushed to the agent of each submission it ends.
                s.allPush,
                // Debug sampling (docs/debug-samples.md): the switches, watched in memory and
                // written by its debug service; the samples it keeps, lists and reads back, and
                // purges at a window's end (the purge of that one bucket's stream, nothing else);
                // the record of each switch and read in the audit log, and the answers.
                ...(topo.debug
                  ? [
                      ...kvRead(topo.debug.sampling.bucket),
                      ...kvWrite(topo.debug.sampling.bucket),
                      ...kvWatch(topo.debug.sampling.bucket),
                      ...kvRead(topo.debug.samples.bucket),
                      ...kvWrite(topo.debug.samples.bucket),
                      ...kvWatch(topo.debug.samples.bucket),
                      `${api}.STREAM.PURGE.${kvStream(topo.debug.samples.bucket)}`,
                      s.allDebugAuditLog,
                      answers,
                    ]
                  : []),
              ],
              deny: durableGuard,
            },
            // Operators' debug requests (queue group): only an operator granted `debug` may publish them.
            subscribe: { allow: [inbox, s.allOpsDebug] },
          };
        case 'audit-projector': {
          return {
            publish: {
              allow: [
                ...check,
                ...tenantsRead,
                ...pull(events, Durables.auditProjector),
                ...decisionsStreams.flatMap((n) => pull(n, Durables.auditDecisions)),
                ...kvRead(topo.projections.audit.bucket),
                ...kvWrite(topo.projections.audit.bucket),
                // The audit service lists a tenant's records through an ordered push consumer on the
                // bucket's own stream, and records every query and export before it answers.
                ...kvWatch(topo.projections.audit.bucket),
                // The records lost with a server restart: the bucket again, rebuilt from the event
                // log and every tenant's decision stream.
                ...recreate(topo.projections.audit.bucket),
                ...ordered(events, s.allOps),
                ...tenants.flatMap((t) => ordered(s.decisionsStream(t), s.decisionsOf(t))),
                // The contract registry: operators' commands and the automatic revert (docs/contracts.md).
                ...contractsRW,
                s.allAuditLog,
                // Query answers.
                answers,
              ],
              deny: [
                ...durableGuard,
                ...othersDurables(events, [Durables.auditProjector]),
                ...decisionsStreams.flatMap((n) => othersDurables(n, [Durables.auditDecisions])),
              ],
            },
            // Auditors' queries, operators' queries of operations across tenants and their contract
            // registry requests (queue groups): only an operator granted `query` (`contracts`) may
            // publish the second (the third).
            subscribe: { allow: [inbox, s.allAudit, s.allOpsQuery, s.allOpsContracts] },
          };
        }
        case 'host':
          // Never reached: returned above ({@link hostPermissions}).
          throw new Error('host permissions are the union of the roles');
        case 'reconciler': {
          const bucket =
            role.service === 'reconciler' ? topo.projections.reconcile.bucket : topo.projections.audit.bucket;
          const durable = role.service === 'reconciler' ? Durables.reconciler : Durables.auditProjector;
          // The reconciler also appends recovery events and the results they carry, and lists its
          // own index (an ordered push consumer on its bucket's stream, headers only).
          const recovery =
            role.service === 'reconciler'
              ? [
                  s.allOps,
                  // A rolled-back held-back operation's input, read back from its intent for the
                  // implementation's discard step (docs/compensation.md "Held-back commits").
                  ...intentsStreams.flatMap((n) => directSeq(n)),
                  // The max-deliveries advisories of the event log's durables.
                  ...pull(topo.streams.advisories.name, Durables.reconcilerAdvisories),
                  ...kvRead(topo.results.bucket),
                  ...kvWrite(topo.results.bucket),
                  ...kvWatch(bucket),
                  // Frozen tasks: it freezes and thaws them, and lists them for operators.
                  ...kvRead(tasks),
                  ...kvWrite(tasks),
                  ...kvWatch(tasks),
                  // Takeover answers.
                  answers,
                ]
              : [];
          return {
            publish: {
              allow: [
                ...check,
                ...pull(events, durable),
                ...directLast(events),
                ...directSeq(events),
                ...kvRead(bucket),
                ...kvWrite(bucket),
                // The index lost with a server restart: the bucket again, rebuilt from the event log.
                ...recreate(bucket),
                ...ordered(events, s.allOps),
                ...recovery,
              ],
              deny: [...durableGuard, ...othersDurables(events, [durable])],
            },
            // The reconciler answers operators' takeover requests (queue group).
            subscribe: { allow: role.service === 'reconciler' ? [inbox, s.allTakeover] : [inbox] },
          };
        }
      }
    }
  }
}

/**
 * The `host` identity (a process hosting every role, `tooltx serve`): what any of the four roles may
 * publish or subscribe to, and pulling the event log's `host` durable. Its denials are the roles'
 * denials that no role's allowance lifts (nats-server: deny wins over allow), so the union never
 * loses a guard the roles share — no create, update or delete of a durable, no pull from a durable
 * that none of them reads. It gains nothing a process holding the four roles' seeds lacks.
 */
function hostPermissions(
  s: Subjects,
  topo: Topology,
  executorDurables: string[],
  tenants: string[],
  compensators: string[],
  confirmers: string[],
  queriers: string[],
  debuggers: string[],
  contractors: string[],
): Permissions {
  const parts = (['authorizer', 'executor', 'reconciler', 'audit-projector'] as const).map((service) =>
    permissionsFor(
      { kind: 'service', service },
      s,
      topo,
      executorDurables,
      tenants,
      compensators,
      confirmers,
      queriers,
      debuggers,
      contractors,
    ),
  );
  const events = topo.streams.events.name;
  const own = [
    `$JS.API.CONSUMER.MSG.NEXT.${events}.${Durables.host}`,
    `$JS.API.CONSUMER.INFO.${events}.${Durables.host}`,
    `$JS.ACK.${events}.${Durables.host}.>`,
  ];
  const union = (lists: (string[] | undefined)[]) => [...new Set(lists.flatMap((l) => l ?? []))];
  const pubAllow = union([...parts.map((p) => p.publish.allow), own]);
  const allowed = new Set(pubAllow);
  const pubDeny = union(parts.map((p) => p.publish.deny)).filter((d) => !allowed.has(d));
  return {
    publish: { allow: pubAllow, deny: pubDeny },
    subscribe: {
      allow: union([
        [`${inboxPrefixOf({ kind: 'service', service: 'host' })}.>`],
        ...parts.map((p) => p.subscribe.allow),
      ]),
    },
  };
}
