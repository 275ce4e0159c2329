/**
 * Compensation as its own operation (docs/compensation.md) on the co-located layout: a committed
 * `kb.write_note` compensated by `kb.delete_note` (a soft delete in the real KB, KB_DEDUP=off: every
 * delete request that reaches it is stored, so a second one would show). Real nats-server, real
 * processes, SDK clients.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { downstreamKeyOf, deriveCompensationKey, operationIdOf, prepareCall, reasonDigestOf } from '@tooltx/contracts';
import { randomUUID } from 'node:crypto';
import { auditRecordSchema, countsOf, handleCommand, type AuditRecord, type OperationCommand } from '@tooltx/lifecycle';
import { decode, openBucket } from '@tooltx/nats';
import { runTask, type Tools } from '@tooltx/client';
import { provisioned, type TestNats } from './helpers/nats.js';
import { startHost, type ServiceProcess } from './helpers/services.js';
import { history, takeoverCli } from './helpers/ops.js';
import { RESEARCH_TOOLS, startKb, type TestKb } from './helpers/kb.js';
import { DelayProxy } from './helpers/delay-proxy.js';
import { isNotesPost, note, RECOVERY_TIMING } from './helpers/kb-faults.js';
import { researchContracts } from '../examples/research-kb/contracts.js';

const TIMING = RECOVERY_TIMING;
const contracts = researchContracts({ kbDedup: false, timing: TIMING });
let t: TestNats;
let kb: TestKb;
let proxy: DelayProxy;
let host: ServiceProcess;
let alice: Tools;

const client = () =>
  t.agentTools('acme', 'alice', contracts.all, {
    budgetMs: 30_000,
  });

/** Delete requests the KB stored under the compensation's key (KB_DEDUP=off: each one is a row). */
const deletesUnder = async (compensationKey: string) => {
  const p = await kb.client.probeDelete({ tenant: 'acme', key: downstreamKeyOf('acme', compensationKey) });
  return p.found ? p.count : 0;
};

/** The audit record of `key` once it shows `until` (records of in-flight operations are batched). */
const auditOf = async (key: string, until: (r: AuditRecord) => boolean): Promise<AuditRecord | undefined> => {
  const kv = await openBucket(t.nc, t.subjects.auditBucket);
  const deadline = Date.now() + 10_000;
  let r: AuditRecord | undefined;
  while (Date.now() < deadline) {
    const e = await kv.get(t.subjects.projectionKey('acme', operationIdOf(key)));
    r = e?.operation === 'PUT' ? decode(auditRecordSchema, e.value) : undefined;
    if (r && until(r)) return r;
    await new Promise((res) => setTimeout(res, 200));
  }
  return r;
};

/** A committed note write: its key and receipt. */
const written = async (taskId: string, title: string) => {
  const r = await alice.execute({ tool: 'kb.write_note', taskId, input: note(title) });
  if (r.status !== 'committed') throw new Error(`the write did not commit: ${JSON.stringify(r)}`);
  return r;
};

beforeAll(async () => {
  t = await provisioned();
  kb = await startKb(
    {
      tenants: [{ id: 'acme', quota: 10_000 }],
      knowledgeBases: [{ tenant: 'acme', name: 'research', aliases: ['Research-Notes'], defaultRole: 'writer' }],
    },
    { KB_DEDUP: 'off' },
  );
  proxy = await new DelayProxy(kb.url).start();
  host = await startHost({
    ...t.env,
    TOOLTX_TOOLS_MODULE: RESEARCH_TOOLS,
    KB_URL: proxy.url,
    KB_KEEPALIVE: 'off',
    KB_DEDUP: 'off',
    KB_TIMING_MS: `${TIMING.timeoutMs},${TIMING.runningBoundMs},${TIMING.unknownDeadlineMs}`,
    TOOLTX_RECONCILE_INTERVAL_MS: '300',
  });
  alice = await client();
});

afterAll(async () => {
  await alice?.close();
  const code = await host?.stop();
  if (code !== 0) console.log(code, host?.stderr);
  await proxy?.stop();
  await kb?.stop();
  await t?.close();
  expect(code).toBe(0);
});

describe('compensation: a new operation that undoes what can be undone', () => {
  it('FM-21: the same compensation sent by three clients of one actor at once, then again after it completed: one delete reaches the KB, every caller gets the same receipt at once, and the original keeps its own', async () => {
    const w = await written('comp-21', 'Compensated once');
    const [bob, carol] = await Promise.all([client(), client()]);
    try {
      // A budget well under the SDK's default: a caller left without its answer would end
      // `compensation_requested` instead of `compensated`.
      const budget = { budgetMs: 8_000 };
      const [a, b, c] = await Promise.all([
        alice.compensate({ operationKey: w.operationKey, reason: 'wrong source' }, budget),
        bob.compensate({ operationKey: w.operationKey, reason: 'duplicate of another note' }, budget),
        carol.compensate({ operationKey: w.operationKey, reason: 'stale note' }, budget),
      ]);
      expect([a.status, b.status, c.status]).toEqual(['compensated', 'compensated', 'compensated']);
      if (a.status !== 'compensated' || b.status !== 'compensated' || c.status !== 'compensated') return;
      expect(b.receipt).toEqual(a.receipt);
      expect(c.receipt).toEqual(a.receipt);
      // One request registered it; the others found it registered and were answered with it.
      expect([a, b, c].map((r) => r.replayed).sort()).toEqual([false, true, true]);
      // The key is the original's and the compensating contract's, never the requester's or the reason's.
      expect(a.compensationKey).toBe(deriveCompensationKey(w.operationKey, { tool: 'kb.delete_note', version: 1 }));
      expect(a.receipt.operationKey).toBe(a.compensationKey);
      expect(await deletesUnder(a.compensationKey)).toBe(1);
      const again = await alice.compensate({ operationKey: w.operationKey, reason: 'asked again' });
      expect(again).toMatchObject({
        status: 'compensated',
        compensationKey: a.compensationKey,
        receipt: a.receipt,
        replayed: true,
      });
      expect(await deletesUnder(a.compensationKey)).toBe(1);
      // Each requester is authorised on its own, the replay too: allowed, answered with the
      // compensation and on record with its reason's digest.
      expect(await t.store.lastDecision('acme', operationIdOf(a.compensationKey), 'alice')).toMatchObject({
        outcome: 'replayed',
        requestedBy: { kind: 'actor', id: 'alice' },
      });
      // The original: committed, its receipt still valid, compensated by that operation.
      const s = await alice.status({ operationKey: w.operationKey });
      expect(s).toMatchObject({
        state: 'committed',
        receipt: w.receipt,
        compensation: { status: 'compensated', operationKey: a.compensationKey },
      });
      expect(alice.verify({ operationKey: w.operationKey, receipt: s.receipt! }).valid).toBe(true);
      // Its events: the write's, then the compensation's two on its own subject (expected sequence).
      expect((await history(t, 'acme', w.operationKey)).map((e) => e.type).slice(-3)).toEqual([
        'committed',
        'compensation_requested',
        'compensated',
      ]);
      // The audit records link both operations, with no body of either and no reason in clear.
      const ra = await auditOf(w.operationKey, (r) => r.status === 'compensated');
      expect(ra).toMatchObject({
        status: 'compensated',
        compensation: { operationKey: a.compensationKey, requestedBy: { kind: 'actor', id: 'alice' } },
      });
      expect(ra?.compensation?.reasonHmac).toMatch(/^hmac-sha256:[0-9a-f]{64}$/);
      const rc = await auditOf(a.compensationKey, (r) => r.status === 'committed');
      expect(rc).toMatchObject({ status: 'committed', compensates: w.operationKey, contract: 'kb.delete_note@1' });
      for (const r of [ra, rc]) {
        const text = JSON.stringify(r);
        for (const secret of ['wrong source', 'duplicate of another note', 'Compensated once'])
          expect(text).not.toContain(secret);
      }
      // Resubmitting the original returns its receipt and runs nothing again.
      const re = await alice.execute({ tool: 'kb.write_note', taskId: 'comp-21', input: note('Compensated once') });
      expect(re).toMatchObject({ status: 'committed', receipt: w.receipt });
    } finally {
      await Promise.all([bob.close(), carol.close()]);
    }
  });

  it("FM-20: the compensation's downstream refuses it: the original stays committed with its receipt and is compensation_failed, its task is frozen, the takeover record is complete, nothing is compensated in turn, and a person's resolution thaws the task", async () => {
    const sibling = await written('comp-20', 'Another step of the task');
    const w = await written('comp-20', 'The delete will be refused');
    const compensationKey = deriveCompensationKey(w.operationKey, { tool: 'kb.delete_note', version: 1 });
    // The KB's answer to a delete in a frozen knowledge base, given by the HTTP hop: nothing reaches the KB.
    const refused = proxy.inject(downstreamKeyOf('acme', compensationKey), {
      kind: 'refuse',
      status: 409,
      body: { error: 'frozen' },
    });
    const c = await alice.compensate({ operationKey: w.operationKey, reason: 'retracted source' });
    expect(c).toMatchObject({
      status: 'compensation_failed',
      compensationKey,
      error: { class: 'forbidden' },
      next: 'hand_over',
    });
    expect((await refused.applied).status).toBe(409);
    // The partial state, kept honestly: the write happened, its receipt stands, a person has it.
    const s = await alice.status({ operationKey: w.operationKey });
    expect(s).toMatchObject({
      state: 'committed',
      receipt: w.receipt,
      compensation: { status: 'compensation_failed', operationKey: compensationKey, error: { class: 'forbidden' } },
    });
    expect(await kb.client.probe({ tenant: 'acme', key: downstreamKeyOf('acme', w.operationKey) })).toMatchObject({
      found: true,
      count: 1,
    });
    expect(await deletesUnder(compensationKey)).toBe(0);
    // The task's later steps are frozen.
    const later = await alice.execute({ tool: 'kb.write_note', taskId: 'comp-20', input: note('A later step') });
    expect(later).toMatchObject({ status: 'rejected', error: { class: 'task_frozen' } });
    // A compensation is a side effect too: none of another step of the frozen task starts (FM-14).
    const ofSibling = await alice.compensate({ operationKey: sibling.operationKey, reason: 'undo the other step' });
    expect(ofSibling).toMatchObject({ status: 'rejected', error: { class: 'task_frozen' } });
    // Asked again: the same failed compensation, never a second one; and a compensation is never compensated.
    const again = await alice.compensate({ operationKey: w.operationKey, reason: 'try once more' });
    expect(again).toMatchObject({ status: 'compensation_failed', compensationKey });
    const ofIt = await alice.compensate({ operationKey: compensationKey, reason: 'undo the failed undo' });
    expect(ofIt).toMatchObject({ status: 'rejected', error: { class: 'compensation_not_allowed' } });
    expect(await deletesUnder(compensationKey)).toBe(0);

    // The takeover record, written with the failure: the original's receipt reference (no body) and
    // the compensation's key, outcome and error — in the status answer, the SDK's answer, the
    // takeover service's list and the audit record's takeover count.
    const record = {
      operationKey: w.operationKey,
      taskId: 'comp-20',
      reason: 'compensation_failed',
      receipt: {
        operationKey: w.operationKey,
        resourceId: w.receipt.resourceId,
        committedAt: w.receipt.committedAt,
        resultDigest: w.receipt.resultDigest,
        signature: w.receipt.signature,
      },
      compensation: {
        operationKey: compensationKey,
        tool: 'kb.delete_note',
        kind: 'rejected',
        error: { class: 'forbidden' },
      },
    };
    expect(c).toMatchObject({ takeover: record });
    expect(s.takeover).toMatchObject(record);
    // The takeover service, as operator oscar (the CLI is run once below, for the resolution).
    const oscar = await t.connectAs({ kind: 'operator', operator: 'oscar' });
    const takeover = async (req: Record<string, unknown>) =>
      JSON.parse(
        (await oscar.request(t.subjects.takeover('oscar'), JSON.stringify(req), { timeout: 10_000 })).string(),
      ) as {
        ok: boolean;
        takeovers?: Record<string, unknown>[];
        operation?: Record<string, unknown>;
        error?: unknown;
      };
    const listed = async () =>
      (await takeover({ action: 'list' })).takeovers?.find((x) => x.operationKey === w.operationKey);
    try {
      let open = await listed();
      for (let i = 0; !open && i < 40; i++) {
        await new Promise((res) => setTimeout(res, 100));
        open = await listed();
      }
      expect(open).toMatchObject({ ...record, status: 'compensation_failed' });
      expect(JSON.stringify(open)).not.toContain('The delete will be refused');
      // An unknown outcome's resolution does not fit a failed compensation: refused at its field.
      expect(
        await takeover({ action: 'resolve', operationKey: w.operationKey, outcome: { kind: 'not_applied' } }),
      ).toMatchObject({
        ok: false,
        error: { class: 'invalid_input', issues: [{ path: ['outcome', 'kind'], code: 'outcome_mismatch' }] },
      });
      // A person keeps the effect: the status stays compensation_failed with the original's
      // receipt, the resolution is recorded, and the task thaws. The audit record counts the
      // takeover (it keeps it after the resolution, so it is read meanwhile).
      const [audited, [resolved]] = await Promise.all([
        auditOf(w.operationKey, (r) => r.takeover !== undefined),
        takeoverCli(t, 'resolve', w.operationKey, '--effect-kept'),
      ]);
      expect(audited?.takeover).toEqual({ reason: 'compensation_failed' });
      expect(countsOf([audited!])[0]).toMatchObject({ contract: 'kb.write_note@1', takeovers: 1 });
      expect(resolved).toMatchObject({
        status: 'compensation_failed',
        receipt: w.receipt,
        resolution: { by: 'oscar', outcome: 'effect_kept' },
        takeover: record,
      });
      expect((await history(t, 'acme', w.operationKey)).at(-1)).toMatchObject({
        type: 'compensation_failure_resolved',
        outcome: 'effect_kept',
        manual: true,
        resolvedBy: 'oscar',
      });
      const [second, after] = await Promise.all([
        takeover({
          action: 'resolve',
          operationKey: w.operationKey,
          tenant: 'acme',
          outcome: { kind: 'undone_by_hand' },
        }),
        alice.execute({ tool: 'kb.write_note', taskId: 'comp-20', input: note('A later step') }),
      ]);
      expect(second).toMatchObject({ ok: false, error: { class: 'idempotency_conflict' } });
      expect(after.status).toBe('committed');
      // Read at once: its status, the list without it, and the same compensation asked again (still
      // never compensated in turn, nor again).
      const [now, listedAfter, compensatedAgain] = await Promise.all([
        alice.status({ operationKey: w.operationKey }),
        listed(),
        alice.compensate({ operationKey: w.operationKey, reason: 'once more' }),
      ]);
      expect(now).toMatchObject({
        state: 'committed',
        receipt: w.receipt,
        compensation: { status: 'compensation_failed', resolution: { by: 'oscar', outcome: 'effect_kept' } },
      });
      expect(alice.verify({ operationKey: w.operationKey, receipt: now.receipt! }).valid).toBe(true);
      expect(listedAfter).toBeUndefined();
      expect(compensatedAgain).toMatchObject({ status: 'compensation_failed', compensationKey });
    } finally {
      await oscar.close();
    }
    expect(await deletesUnder(compensationKey)).toBe(0);
  });

  it("unknown during compensation takes any write's path: its answer lost, the reconciler probes the KB by the compensation's key, finds the delete and commits it; the original ends compensated, one delete", async () => {
    const w = await written('comp-unknown', 'The delete answer is lost');
    const compensationKey = deriveCompensationKey(w.operationKey, { tool: 'kb.delete_note', version: 1 });
    // The delete reaches the KB and is stored; its answer never comes back within the deadline.
    const held = proxy.inject(downstreamKeyOf('acme', compensationKey), { kind: 'hold_response', ms: 60_000 });
    const c = await alice.compensate({ operationKey: w.operationKey, reason: 'lost answer' }, { budgetMs: 20_000 });
    expect(c).toMatchObject({ status: 'compensated', compensationKey });
    expect((await held.applied).status).toBe(200);
    expect(await deletesUnder(compensationKey)).toBe(1);
    const types = (await history(t, 'acme', compensationKey)).map((e) => e.type);
    expect(types).toContain('unknown');
    expect(types.at(-1)).toBe('committed');
  });

  it("FM-10: a note written through an alias of its knowledge base is compensated, by the alias's key or the canonical one, also when the compensation runs from the event log: one compensation, one delete", async () => {
    const input = { ...note('Written through an alias'), kb: 'Research-Notes' };
    const w = await alice.execute({ tool: 'kb.write_note', taskId: 'comp-alias', input });
    if (w.status !== 'committed') throw new Error(`the write did not commit: ${JSON.stringify(w)}`);
    // Registered under the canonical input's key; the submission's own key is an alias of it.
    const aliasKey = prepareCall(contracts.writeNote, 'comp-alias', input).operationKey;
    expect(aliasKey).not.toBe(w.operationKey);
    const compensationKey = deriveCompensationKey(w.operationKey, { tool: 'kb.delete_note', version: 1 });
    // Every in-process slot of the host taken by writes held at the KB's door, so the compensation
    // is accepted alone and its executor takes it from the event log, re-checking its references
    // at the execution instant.
    let held = 0;
    proxy.hold = (req) => {
      if (!isNotesPost(req)) return 0;
      held++;
      // Under the writes' attempt timeout (RECOVERY_TIMING), so each still commits.
      return 1_300;
    };
    const busy = Array.from({ length: 16 }, (_, i) =>
      alice.execute({ tool: 'kb.write_note', taskId: 'comp-alias-busy', input: note(`Busy ${i}`) }),
    );
    try {
      for (let i = 0; held < 16 && i < 250; i++) await new Promise((res) => setTimeout(res, 20));
      const [byAlias, byCanonical] = await Promise.all([
        alice.compensate({ operationKey: aliasKey, reason: 'written to the wrong place' }),
        alice.compensate({ operationKey: w.operationKey, reason: 'written to the wrong place' }),
      ]);
      expect(byCanonical).toMatchObject({ status: 'compensated', operationKey: w.operationKey, compensationKey });
      expect(byAlias).toMatchObject({ status: 'compensated', operationKey: w.operationKey, compensationKey });
      if (byCanonical.status === 'compensated') expect(byAlias).toMatchObject({ receipt: byCanonical.receipt });
    } finally {
      proxy.hold = () => 0;
      await Promise.all(busy);
    }
    expect(await deletesUnder(compensationKey)).toBe(1);
    // Accepted alone, then started by the executor from the event log.
    expect((await history(t, 'acme', compensationKey)).map((e) => e.type).slice(0, 2)).toEqual(['accepted', 'running']);
    expect(await alice.status({ operationKey: w.operationKey })).toMatchObject({
      state: 'committed',
      receipt: w.receipt,
      compensation: { status: 'compensated', operationKey: compensationKey },
    });
  });

  it('a compensation left half-done converges: its request recorded without its accept (the authorizer died between the two appends), even after an earlier attempt refused before it ran, is completed by a repeat; an outcome never linked is linked by the sweep', async () => {
    /** Appends a command through the store, as a process would have before it died. */
    const append = async (key: string, cmd: OperationCommand) => {
      const h = await handleCommand(t.store, 'acme', operationIdOf(key), () => cmd);
      if (h.kind !== 'appended') throw new Error(`not appended: ${JSON.stringify(h)}`);
      return h.seq;
    };
    /** Until the host has taken every event up to `seq` from the log (its reconciler's link included). */
    const taken = async (seq: number) => {
      for (let i = 0; i < 100; i++) {
        const c = await t.jsm.consumers.info(t.subjects.eventsStream, 'host');
        if (c.ack_floor.stream_seq >= seq) return;
        await new Promise((res) => setTimeout(res, 100));
      }
      throw new Error(`the host has not taken the log up to ${seq}`);
    };
    /** The original's record of the request of the compensation's `attempt`, as the authorizer appends it. */
    const requestOf = (key: string, attempt: number): OperationCommand => ({
      type: 'request_compensation',
      eventId: randomUUID(),
      at: Date.now(),
      compensation: { operationKey: key, tool: 'kb.delete_note', version: 1, attempt },
      requestedBy: { kind: 'actor', id: 'alice' },
      reasonDigest: reasonDigestOf('the first request'),
    });
    const compensationKey = (w: { operationKey: string }) =>
      deriveCompensationKey(w.operationKey, { tool: 'kb.delete_note', version: 1 });
    /**
     * The compensation's attempt 1, registered and refused before it ran, nothing sent: refused
     * `forbidden` here, or `internal` by the host's executor should it take it first (no intent of
     * a compensation is stored under its sequence). Returns the sequence of its last event.
     */
    const refusedAttempt = async (w: Awaited<ReturnType<typeof written>>, taskId: string, contractDigest: string) => {
      const input = { kb: 'research', noteId: w.receipt.resourceId };
      const call = prepareCall(contracts.deleteNote, taskId, input);
      await append(compensationKey(w), {
        type: 'accept',
        eventId: randomUUID(),
        at: Date.now(),
        operationKey: compensationKey(w),
        tenant: 'acme',
        actor: 'alice',
        taskId,
        tool: 'kb.delete_note',
        version: 1,
        contractDigest,
        effect: 'delete',
        inputDigest: call.inputDigest,
        targetDigest: call.targetDigest,
        intentSeq: 1,
        submissionId: randomUUID(),
        compensates: { operationKey: w.operationKey, tool: 'kb.write_note', version: 1 },
      });
      const h = await handleCommand(t.store, 'acme', operationIdOf(compensationKey(w)), () => ({
        type: 'reject',
        eventId: randomUUID(),
        at: Date.now(),
        attempt: 1,
        error: { class: 'forbidden' },
      }));
      const { state, seq } = await t.store.load('acme', operationIdOf(compensationKey(w)));
      if (state.status !== 'rejected' || state.running) throw new Error(`not refused before it ran: ${h.kind}`);
      return seq;
    };

    // 1. Only the original's request is there: the same compensation asked again registers it.
    const w1 = await written('comp-half-1', 'Requested, never registered');
    await append(w1.operationKey, requestOf(compensationKey(w1), 1));
    const first = await alice.compensate({ operationKey: w1.operationKey, reason: 'asked again' });
    expect(first).toMatchObject({ status: 'compensated', compensationKey: compensationKey(w1), replayed: false });
    expect(await deletesUnder(compensationKey(w1))).toBe(1);

    // 2. Attempt 1 refused before it ran and the original committed again; the request of attempt 2
    // recorded, its accept never appended. A repeat registers attempt 2 instead of answering attempt
    // 1's refusal, which is not this request's outcome.
    const w2 = await written('comp-half-2', 'Refused once, requested again');
    // The compensating contract as the host loaded it.
    const { state: loaded } = await t.store.load('acme', operationIdOf(compensationKey(w1)));
    if (loaded.status === 'none') throw new Error('the first compensation was not registered');
    await taken(await refusedAttempt(w2, 'comp-half-2', loaded.contractDigest));
    const k2 = compensationKey(w2);
    // The request of attempt 1, recorded once the host's link saw its compensation's events (as a
    // link that read the compensation before the request would have missed it): only the sweep
    // links its refusal.
    await append(w2.operationKey, requestOf(k2, 1));
    let s2 = await alice.status({ operationKey: w2.operationKey });
    for (let i = 0; s2.compensation?.status !== 'refused' && i < 100; i++) {
      await new Promise((res) => setTimeout(res, 100));
      s2 = await alice.status({ operationKey: w2.operationKey });
    }
    // Linked by the sweep: the compensation's events came before the request, so only it could.
    expect(s2.compensation).toMatchObject({ status: 'refused' });
    await append(w2.operationKey, requestOf(k2, 2));
    const second = await alice.compensate({ operationKey: w2.operationKey, reason: 'asked again' });
    expect(second).toMatchObject({ status: 'compensated', compensationKey: k2, replayed: false });
    expect(await deletesUnder(k2)).toBe(1);
    expect((await history(t, 'acme', k2)).map((e) => [e.type, e.attempt])).toEqual([
      ['accepted', 1],
      ['rejected', 1],
      ['accepted', 2],
      ['committed', 2],
    ]);
    expect((await history(t, 'acme', w2.operationKey)).map((e) => e.type).slice(-4)).toEqual([
      'compensation_requested',
      'compensation_refused',
      'compensation_requested',
      'compensated',
    ]);
  });

  it('the runner compensates a task whose later step is rejected: its committed steps, the last committed first, one delete each', async () => {
    const run = await runTask(alice, {
      taskId: 'comp-task',
      compensateOnReject: { reason: 'the summary step was refused' },
      steps: [
        { id: 'first', tool: 'kb.write_note', input: note('Task note one') },
        { id: 'second', tool: 'kb.write_note', dependsOn: ['first'], input: note('Task note two') },
        // No such knowledge base: refused at intake, nothing written.
        { id: 'third', tool: 'kb.write_note', dependsOn: ['second'], input: { ...note('Nowhere'), kb: 'nope' } },
      ],
    });
    expect(run.steps.third?.status).toBe('rejected');
    expect(run.status).toBe('compensated');
    expect(run.compensations?.map((c) => [c.step, c.outcome.status])).toEqual([
      ['second', 'compensated'],
      ['first', 'compensated'],
    ]);
    for (const c of run.compensations ?? [])
      if (c.outcome.status === 'compensated') expect(await deletesUnder(c.outcome.compensationKey)).toBe(1);
  });

  it('FM-22: a compensation from a state that does not allow it, of an unknown key, of a contract that declares none, or of a compensation, is rejected with its class and sends nothing', async () => {
    // unknown: the write's answer never comes back within its deadline.
    const held = note('Outcome unknown');
    proxy.hold = (req) => (isNotesPost(req) ? 60_000 : 0);
    try {
      const r = await alice.execute(
        { tool: 'kb.write_note', taskId: 'comp-22', input: held },
        { budgetMs: TIMING.timeoutMs + 2_000 },
      );
      expect(r.status).not.toBe('committed');
      // Asked while its outcome is still not known (unknown, or running again after a requeue).
      const fromUnknown = await alice.compensate({ operationKey: r.operationKey!, reason: 'not sure it landed' });
      expect(fromUnknown).toMatchObject({ status: 'rejected', error: { class: 'compensation_not_allowed' } });
      if (fromUnknown.status === 'rejected' && fromUnknown.compensationKey)
        expect(await deletesUnder(fromUnknown.compensationKey)).toBe(0);
    } finally {
      proxy.hold = () => 0;
    }

    const nowhere = await alice.compensate({
      operationKey: 'opk_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA',
      reason: 'no such call',
    });
    expect(nowhere).toMatchObject({ status: 'rejected', error: { class: 'not_found' } });

    // A compensation is never compensated in turn (its contract declares none).
    const w = await written('comp-22b', 'Compensated, then asked again of its compensation');
    const c = await alice.compensate({ operationKey: w.operationKey, reason: 'wrong knowledge base' });
    expect(c.status).toBe('compensated');
    const ofCompensation = await alice.compensate({ operationKey: c.compensationKey!, reason: 'undo the undo' });
    expect(ofCompensation).toMatchObject({ status: 'rejected', error: { class: 'compensation_not_allowed' } });

    // Bad input is refused at its field path before anything is sent.
    const bad = await alice.compensate({ operationKey: w.operationKey, reason: '' });
    expect(bad).toMatchObject({
      status: 'rejected',
      error: { class: 'invalid_input', issues: [{ path: ['reason'] }] },
    });
    const long = await alice.compensate({ operationKey: w.operationKey, reason: 'x'.repeat(501) });
    expect(long).toMatchObject({ status: 'rejected', error: { class: 'invalid_input' } });
  });
});
