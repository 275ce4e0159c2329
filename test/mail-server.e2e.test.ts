/**
 * The sample's mail outbox as a real process (examples/research-kb/mail-server.ts) on a free
 * loopback port with a temp SQLite file, driven through its HTTP API, its typed client and the mail
 * tool implementations (examples/research-kb/mail-tools.ts). No mocks. Counts are read from the
 * outbox's own stats and probes, which deduplicate nothing.
 */
import { existsSync, readFileSync, rmSync } from 'node:fs';
import { dirname } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { digestOf, downstreamKeyOf, type ExecutionContext, type Implementation, TooltxError } from '@tooltx/contracts';
import { MailError } from '../examples/research-kb/mail-client.js';
import { sampleMail, spawnMailProcess, startMail, type TestMail } from './helpers/mail.js';

const AS = { tenant: 'acme', actor: 'alice' };
let k = 0;
const key = () => `tx_mail-${process.pid}-${++k}`;
const soon = () => Date.now() + 30_000;
const w = (over: { key?: string; tenant?: string; deadlineAt?: number; inputDigest?: string } = {}) => ({
  ...AS,
  key: key(),
  deadlineAt: soon(),
  ...over,
});

/** A raw request with the service token, for status codes and exact bodies. */
async function raw(
  m: TestMail,
  path: string,
  init: { method?: string; headers?: Record<string, string>; body?: string } = {},
) {
  const res = await fetch(`${m.url}${path}`, {
    ...init,
    headers: { authorization: `Bearer ${m.serviceToken.token}`, ...init.headers },
  });
  const text = await res.text();
  return { status: res.status, json: text ? (JSON.parse(text) as Record<string, unknown>) : undefined, text };
}

const refusal = (p: Promise<unknown>) =>
  p.then(
    () => expect.unreachable('expected a refusal'),
    (e: unknown) => e,
  );

describe('mail outbox with MAIL_DEDUP=on', () => {
  let m: TestMail;
  beforeAll(async () => {
    m = await startMail({ MAIL_DEDUP: 'on' });
  });
  afterAll(async () => {
    expect(await m.stop()).toBe(0);
  });

  it('a draft is stored with its preview and nothing leaves; its key answers the same draft, another mail under it is key_reused', async () => {
    const k1 = key();
    const d = digestOf({ draft: k1 });
    const body = `${'Long line. '.repeat(40)}\n\nünïcode`;
    const first = await m.client.createDraft({ ...w({ key: k1, inputDigest: d }), mail: sampleMail({ body }) });
    expect(first).toMatchObject({
      created: true,
      state: 'draft',
      preview: {
        to: ['ops@example.org'],
        cc: [],
        subject: 'Weekly research digest',
        bodyBytes: Buffer.byteLength(body),
      },
    });
    expect(first.draftId).toMatch(/^draft_[0-9a-f-]{36}$/);
    expect([...first.preview.excerpt]).toHaveLength(200);
    expect(first.preview.excerpt.endsWith('…')).toBe(true);
    expect(first.preview.excerpt).not.toMatch(/\s{2}/);

    const again = await m.client.createDraft({ ...w({ key: k1, inputDigest: d }), mail: sampleMail({ body }) });
    expect(again).toEqual({ ...first, created: false, mailNow: expect.any(Number) });
    for (const other of [
      m.client.createDraft({ ...w({ key: k1, inputDigest: d }), mail: sampleMail({ body: 'another body' }) }),
      m.client.createDraft({ ...w({ key: k1, inputDigest: digestOf({ other: 1 }) }), mail: sampleMail({ body }) }),
    ])
      expect(await refusal(other)).toMatchObject({ name: 'MailError', status: 422, errorClass: 'key_reused' });

    expect(await m.client.probeDraft({ tenant: 'acme', key: k1 })).toEqual({
      found: true,
      draftId: first.draftId,
      state: 'draft',
      preview: first.preview,
      createdAt: first.createdAt,
      count: 1,
      inputDigest: d,
      now: expect.any(Number),
    });
    // Keys are per tenant: another tenant's probe of the key finds nothing.
    expect(await m.client.probeDraft({ tenant: 'globex', key: k1 })).toEqual({ found: false, now: expect.any(Number) });
    expect((await m.client.stats('acme')).sent.rows).toBe(0);
  });

  it('a draft leaves once: the same key again, another key and twenty requests at once answer one sent mail', async () => {
    const dk = key();
    const draft = await m.client.createDraft({ ...w({ key: dk }), mail: sampleMail() });
    const before = await m.client.stats('acme');
    const sent = await m.client.sendDraft({ ...w({ key: dk }), draft: { draftKey: dk } });
    expect(sent).toMatchObject({ created: true, kind: 'draft', draftId: draft.draftId });
    expect(sent.id).toMatch(/^mail_[0-9a-f-]{36}$/);
    const replay = await m.client.sendDraft({ ...w({ key: dk }), draft: { draftKey: dk } });
    expect(replay).toEqual({ ...sent, created: false, mailNow: expect.any(Number) });
    const all = await Promise.all(
      Array.from({ length: 20 }, () => m.client.sendDraft({ ...w(), draft: { draftId: draft.draftId } })),
    );
    expect(new Set(all.map((s) => s.id))).toEqual(new Set([sent.id]));
    expect(all.every((s) => !s.created)).toBe(true);

    const after = await m.client.stats('acme');
    expect(after.sent.rows - before.sent.rows).toBe(1);
    expect(after.sent.duplicateDraftSends).toBe(0);
    expect(await m.client.probeSent({ tenant: 'acme', key: dk })).toMatchObject({
      found: true,
      id: sent.id,
      kind: 'draft',
      draftId: draft.draftId,
      count: 1,
    });
    expect(await m.client.probeDraft({ tenant: 'acme', key: dk })).toMatchObject({ found: true, state: 'sent' });
    // Sent is final: a discard now is refused and changes nothing.
    expect(await refusal(m.client.discardDraft({ ...w(), draft: { draftKey: dk } }))).toMatchObject({
      status: 409,
      errorClass: 'draft_sent',
    });
    expect(await m.client.probeDraft({ tenant: 'acme', key: dk })).toMatchObject({ state: 'sent' });
  });

  it('a discarded draft is never sent: draft_discarded, nothing stored; the discard is idempotent and probe-able', async () => {
    const dk = key();
    const draft = await m.client.createDraft({ ...w({ key: dk }), mail: sampleMail() });
    const discarded = await m.client.discardDraft({ ...w({ key: dk }), draft: { draftKey: dk } });
    expect(discarded).toMatchObject({ created: true, draftId: draft.draftId, state: 'discarded' });
    expect(await m.client.discardDraft({ ...w({ key: dk }), draft: { draftKey: dk } })).toEqual({
      ...discarded,
      created: false,
      mailNow: expect.any(Number),
    });
    // Another key discards the same draft again: the same answer (the first discard's time).
    expect(await m.client.discardDraft({ ...w(), draft: { draftId: draft.draftId } })).toMatchObject({
      draftId: draft.draftId,
      discardedAt: discarded.discardedAt,
    });
    expect(await m.client.probeDiscard({ tenant: 'acme', key: dk })).toMatchObject({
      found: true,
      draftId: draft.draftId,
      count: 1,
    });
    const before = await m.client.stats();
    for (const ref of [{ draftKey: dk }, { draftId: draft.draftId }]) {
      const err = await refusal(m.client.sendDraft({ ...w({ key: dk }), draft: ref }));
      expect(err).toBeInstanceOf(MailError);
      expect(err).toMatchObject({ status: 409, errorClass: 'draft_discarded' });
    }
    expect(await m.client.probeSent({ tenant: 'acme', key: dk })).toMatchObject({ found: false });
    expect(await m.client.stats()).toEqual(before);
    // Another tenant's draft (by id or by key) is not found, exactly like a missing one.
    const foreign = await raw(m, '/v1/drafts/send', {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        'x-tenant': 'globex',
        'x-actor': 'gina',
        'idempotency-key': key(),
        'x-deadline': String(soon()),
      },
      body: JSON.stringify({ draftId: draft.draftId }),
    });
    expect(foreign).toMatchObject({ status: 404, text: '{"error":"not_found"}' });
  });

  it('a correction is a new mail that refers to the sent one, which stays as it was', async () => {
    const mk = key();
    const original = await m.client.sendMail({ ...w({ key: mk }), mail: sampleMail({ cc: ['lead@example.org'] }) });
    expect(original).toMatchObject({ created: true, kind: 'direct' });
    const before = await m.client.sentMail('acme', original.id);
    const ck = key();
    const correction = await m.client.sendCorrection({
      ...w({ key: ck }),
      mail: {
        ...sampleMail({ subject: 'Correction: weekly research digest', body: 'The second link was wrong.' }),
        corrects: original.id,
      },
    });
    expect(correction).toMatchObject({ created: true, kind: 'correction', corrects: original.id });
    expect(correction.id).not.toBe(original.id);
    expect(await m.client.sentMail('acme', original.id)).toEqual(before);
    expect(await m.client.sentMail('acme', correction.id)).toMatchObject({
      kind: 'correction',
      corrects: original.id,
      to: ['ops@example.org'],
      subject: 'Correction: weekly research digest',
      bodyDigest: expect.stringMatching(/^sha256:[0-9a-f]{64}$/),
    });
    expect(await m.client.probeSent({ tenant: 'acme', key: ck })).toMatchObject({
      found: true,
      id: correction.id,
      count: 1,
    });
    expect(await m.client.probeSent({ tenant: 'acme', key: mk })).toMatchObject({ found: true, id: original.id });
    // A correction of a mail that is not the tenant's: not found, nothing sent.
    for (const tenant of ['globex', 'acme']) {
      const corrects = tenant === 'globex' ? original.id : 'mail_00000000-0000-0000-0000-000000000000';
      expect(
        await refusal(m.client.sendCorrection({ ...w({ tenant }), mail: { ...sampleMail(), corrects } })),
      ).toMatchObject({ status: 404, errorClass: 'not_found' });
    }
    expect((await m.client.stats('acme')).sent.byKind.correction).toBe(1);
  });

  it('refuses a write past its deadline (nothing stored) but replays a stored key before that check', async () => {
    const k1 = key();
    const late = await refusal(
      m.client.sendMail({ ...w({ key: k1, deadlineAt: Date.now() - 1 }), mail: sampleMail() }),
    );
    expect(late).toMatchObject({ status: 409, errorClass: 'deadline_passed', mailNow: expect.any(Number) });
    const probe = await m.client.probeSent({ tenant: 'acme', key: k1 });
    expect(probe).toEqual({ found: false, now: expect.any(Number) });
    const sent = await m.client.sendMail({ ...w({ key: k1 }), mail: sampleMail() });
    const replay = await m.client.sendMail({ ...w({ key: k1, deadlineAt: Date.now() - 60_000 }), mail: sampleMail() });
    expect(replay).toMatchObject({ id: sent.id, created: false });
  });

  it('bad input is 400 invalid_input with the field paths, typed by the client, and nothing is stored', async () => {
    const before = await m.client.stats();
    const r = await raw(m, '/v1/drafts', {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-tenant': 'ACME', 'idempotency-key': 'x'.repeat(101) },
      body: JSON.stringify({ to: ['not-an-address'], cc: 'ops@example.org', subject: '', body: 'b', bcc: [] }),
    });
    expect(r.status).toBe(400);
    expect(r.json!.error).toBe('invalid_input');
    const paths = (r.json!.issues as { path: unknown[] }[]).map((i) => i.path.join('.')).sort();
    expect(paths).toEqual(
      [
        '',
        'cc',
        'headers.idempotency-key',
        'headers.x-actor',
        'headers.x-deadline',
        'headers.x-tenant',
        'subject',
        'to.0',
      ].sort(),
    );
    expect(r.text).not.toContain('not-an-address');

    const err = await refusal(
      m.client.sendCorrection({ ...w(), mail: { ...sampleMail({ to: [] }), corrects: 'mail_nope' } }),
    );
    expect(err).toBeInstanceOf(MailError);
    expect(err).toMatchObject({ status: 400, errorClass: 'invalid_input' });
    expect((err as MailError).issues!.map((i) => i.path.join('.')).sort()).toEqual(['corrects', 'to']);
    const neither = await refusal(m.client.sendDraft({ ...w(), draft: {} as never }));
    expect(neither).toMatchObject({ status: 400, errorClass: 'invalid_input' });
    const badKey = await refusal(m.client.probeSent({ tenant: 'acme', key: 'with space' }));
    expect(badKey).toMatchObject({ status: 400, issues: [{ path: ['key'] }] });
    expect(await m.client.stats()).toEqual(before);
  });

  it('the fault switch: operator only; the next N calls of one operation fail as armed, every other operation runs', async () => {
    // Not with the service token, nor without one.
    for (const authorization of [`Bearer ${m.serviceToken.token}`, undefined]) {
      const res = await fetch(`${m.url}/v1/admin/faults`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...(authorization ? { authorization } : {}) },
        body: JSON.stringify({ operation: 'mails.send', count: 5 }),
      });
      expect(res.status).toBe(401);
    }
    expect(await m.admin.faults()).toEqual({});

    await m.admin.setFault('mails.correct', 2, 'unavailable');
    expect(await m.admin.faults()).toEqual({ 'mails.correct': { count: 2, mode: 'unavailable' } });
    const original = await m.client.sendMail({ ...w(), mail: sampleMail() });
    const ck = key();
    const correct = () =>
      m.client.sendCorrection({ ...w({ key: ck }), mail: { ...sampleMail(), corrects: original.id } });
    // Invalid input is refused before the switch: it does not use up a fault.
    await refusal(m.client.sendCorrection({ ...w(), mail: { ...sampleMail({ subject: '' }), corrects: original.id } }));
    for (let i = 0; i < 2; i++)
      expect(await refusal(correct())).toMatchObject({ status: 503, errorClass: 'unavailable' });
    expect(await m.client.probeSent({ tenant: 'acme', key: ck })).toMatchObject({ found: false });
    expect(await m.admin.faults()).toEqual({});
    expect(await correct()).toMatchObject({ created: true, kind: 'correction' });

    await m.admin.setFault('mails.send', 1, 'refused');
    const rk = key();
    expect(await refusal(m.client.sendMail({ ...w({ key: rk }), mail: sampleMail() }))).toMatchObject({
      status: 422,
      errorClass: 'refused',
    });
    expect(await m.client.probeSent({ tenant: 'acme', key: rk })).toMatchObject({ found: false });

    // lost_answer: stored, then answered 500 — the probe finds the mail, and the replay answers it.
    await m.admin.setFault('mails.send', 1, 'lost_answer');
    const lk = key();
    expect(await refusal(m.client.sendMail({ ...w({ key: lk }), mail: sampleMail() }))).toMatchObject({
      status: 500,
      errorClass: 'internal',
    });
    const found = await m.client.probeSent({ tenant: 'acme', key: lk });
    expect(found).toMatchObject({ found: true, count: 1 });
    expect(await m.client.sendMail({ ...w({ key: lk }), mail: sampleMail() })).toMatchObject({
      created: false,
      id: (found as { id: string }).id,
    });

    // count 0 clears an armed fault.
    await m.admin.setFault('drafts.create', 3);
    await m.admin.setFault('drafts.create', 0);
    expect(await m.admin.faults()).toEqual({});
    const bad = await raw(m, '/v1/admin/faults', {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${m.adminToken}` },
      body: JSON.stringify({ operation: 'mails.unsend', count: -1 }),
    });
    expect(bad).toMatchObject({ status: 400, json: { error: 'invalid_input' } });
    expect((bad.json!.issues as { path: unknown[] }[]).map((i) => i.path.join('.')).sort()).toEqual([
      'count',
      'operation',
    ]);
  });

  it('without the service token every mail endpoint is 401 and nothing is stored', async () => {
    const before = await m.client.stats();
    const res = await fetch(`${m.url}/v1/mails`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        'x-tenant': 'acme',
        'x-actor': 'alice',
        'idempotency-key': key(),
        'x-deadline': String(soon()),
      },
      body: JSON.stringify(sampleMail()),
    });
    expect(res.status).toBe(401);
    expect(await res.json()).toEqual({ error: 'unauthorized' });
    expect((await fetch(`${m.url}/v1/stats`)).status).toBe(401);
    expect(await m.client.stats()).toEqual(before);
    expect(m.proc.lines.find((l) => l.msg === 'store opened')).toMatchObject({
      serviceAuth: true,
      adminApi: true,
      journalMode: 'wal',
      synchronous: 2,
    });
    // No log line carries a token, an address, a subject or a body.
    const logged = JSON.stringify(m.proc.lines) + m.proc.stderr;
    for (const secret of [m.serviceToken.token, 'ops@example.org', 'Weekly research digest', 'Paxos made simple'])
      expect(logged).not.toContain(secret);
  });

  it('the mail tools: prepare previews and sends nothing, execute sends the prepared draft once, each step is probe-able by key', async () => {
    process.env.MAIL_URL = m.url;
    process.env.MAIL_SERVICE_TOKEN_FILE = m.serviceToken.file;
    process.env.MAIL_DEDUP = 'on';
    const tools = await import('../examples/research-kb/mail-tools.js');
    const impl = (name: string) => tools.mailImplementations.find((i) => i.contract.name === name) as Implementation;
    const ctxOf = (operationKey: string, input: unknown): ExecutionContext => ({
      ...AS,
      operationKey,
      downstreamKey: downstreamKeyOf('acme', operationKey),
      attempt: 1,
      inputDigest: digestOf(input),
      deadlineAt: soon(),
      signal: AbortSignal.timeout(5_000),
    });
    const input = sampleMail();
    const ctx = ctxOf(`op-${key()}`, input);
    const sendDraft = impl('mail.send_draft');
    const before = await m.client.stats('acme');

    const prepared = await tools.sendDraftSteps.prepare(input, ctx);
    expect(prepared.preview).toMatchObject({
      to: input.to,
      subject: input.subject,
      bodyBytes: Buffer.byteLength(input.body),
    });
    expect(await tools.sendDraftSteps.probePrepared(ctx)).toEqual({
      found: true,
      resourceId: prepared.draftId,
      inputDigest: ctx.inputDigest,
    });
    expect(await sendDraft.probe!(ctx)).toEqual({ found: false, downstreamAt: expect.any(Number) });
    expect((await m.client.stats('acme')).sent.rows).toBe(before.sent.rows);

    const sent = await sendDraft.execute(input, ctx);
    expect(sent.resourceId).toMatch(/^mail_/);
    expect(await sendDraft.execute(input, ctx)).toMatchObject({ resourceId: sent.resourceId });
    expect(await sendDraft.probe!(ctx)).toEqual({
      found: true,
      resourceId: sent.resourceId,
      inputDigest: ctx.inputDigest,
    });
    expect((await m.client.stats('acme')).sent.rows).toBe(before.sent.rows + 1);
    expect(await tools.sendDraftSteps.discard(ctx)).toEqual({ outcome: 'already_sent' });

    // Held back, then discarded: execute is refused (not_found: the draft is gone), nothing leaves.
    const held = ctxOf(`op-${key()}`, input);
    await tools.sendDraftSteps.prepare(input, held);
    expect(await tools.sendDraftSteps.discard(held)).toMatchObject({ outcome: 'discarded' });
    expect(await tools.sendDraftSteps.probeDiscarded(held)).toMatchObject({ found: true });
    const refused = await refusal(sendDraft.execute(input, held));
    expect(refused).toBeInstanceOf(TooltxError);
    expect(refused).toMatchObject({ class: 'not_found' });
    expect(await tools.sendDraftSteps.discard(ctxOf(`op-${key()}`, input))).toEqual({ outcome: 'none' });

    // execute with no prepare step before it prepares the draft itself, then sends it.
    const direct = ctxOf(`op-${key()}`, input);
    const alone = await sendDraft.execute(input, direct);
    expect(await m.client.probeDraft({ tenant: 'acme', key: direct.downstreamKey })).toMatchObject({
      state: 'sent',
      count: 1,
    });

    // mail.send, then its correction: two mails, the second referring to the first.
    const send = impl('mail.send');
    const sctx = ctxOf(`op-${key()}`, input);
    const first = await send.execute(input, sctx);
    const cinput = { ...sampleMail({ body: 'Corrected.' }), corrects: first.resourceId };
    const cctx = ctxOf(`op-${key()}`, cinput);
    const fix = await impl('mail.send_correction').execute(cinput, cctx);
    expect(fix.resourceId).not.toBe(first.resourceId);
    expect(await impl('mail.send_correction').probe!(cctx)).toMatchObject({ found: true, resourceId: fix.resourceId });
    expect(await m.client.sentMail('acme', fix.resourceId)).toMatchObject({ corrects: first.resourceId });

    // An armed fault: refused → a definite TooltxError (nothing sent); unavailable → as it is (unknown).
    await m.admin.setFault('mails.send', 1, 'refused');
    expect(await refusal(send.execute(input, ctxOf(`op-${key()}`, input)))).toMatchObject({
      class: 'dependency_unavailable',
    });
    await m.admin.setFault('mails.send', 1, 'unavailable');
    const unknown = await refusal(send.execute(input, ctxOf(`op-${key()}`, input)));
    expect(unknown).not.toBeInstanceOf(TooltxError);
    expect(unknown).toMatchObject({ status: 503 });
    expect(alone.resourceId).toMatch(/^mail_/);
  });
});

describe('mail outbox with MAIL_DEDUP=off', () => {
  it('deduplicates nothing: a repeated key and a second send of one draft are rows the counts show; discarded still refuses', async () => {
    const m = await startMail({ MAIL_DEDUP: 'off' });
    try {
      const k1 = key();
      const a = await m.client.sendMail({ ...w({ key: k1 }), mail: sampleMail() });
      const b = await m.client.sendMail({ ...w({ key: k1 }), mail: sampleMail({ body: 'even another body' }) });
      expect(a.created && b.created).toBe(true);
      expect(b.id).not.toBe(a.id);
      expect(await m.client.probeSent({ tenant: 'acme', key: k1 })).toMatchObject({ found: true, id: a.id, count: 2 });

      const dk = key();
      await m.client.createDraft({ ...w({ key: dk }), mail: sampleMail() });
      await m.client.sendDraft({ ...w({ key: dk }), draft: { draftKey: dk } });
      await m.client.sendDraft({ ...w({ key: dk }), draft: { draftKey: dk } });
      const stats = await m.client.stats('acme');
      expect(stats.sent).toMatchObject({ rows: 4, distinctKeys: 2, duplicateRows: 2, duplicateDraftSends: 1 });

      const xk = key();
      await m.client.createDraft({ ...w({ key: xk }), mail: sampleMail() });
      await m.client.discardDraft({ ...w({ key: xk }), draft: { draftKey: xk } });
      expect(await refusal(m.client.sendDraft({ ...w({ key: xk }), draft: { draftKey: xk } }))).toMatchObject({
        errorClass: 'draft_discarded',
      });
      expect((await m.client.stats('acme')).sent.rows).toBe(4);
    } finally {
      expect(await m.stop()).toBe(0);
    }
  });
});

describe('mail-server process', () => {
  it('prints --help and exits 0; a bad configuration exits 2 naming every problem', async () => {
    const help = spawnMailProcess({}, ['--help']);
    const bad = spawnMailProcess({ MAIL_PORT: 'eighty', MAIL_DEDUP: 'maybe', LOG_LEVEL: 'loud' });
    expect(await help.exited).toBe(0);
    const out = JSON.stringify(help.lines);
    for (const name of [
      'MAIL_PORT',
      'MAIL_HOST',
      'MAIL_DB',
      'MAIL_DEDUP',
      'MAIL_ADMIN_TOKEN_FILE',
      'MAIL_SERVICE_TOKEN_FILE',
    ])
      expect(out).toContain(name);
    expect(await bad.exited).toBe(2);
    for (const name of ['MAIL_PORT', 'MAIL_DEDUP', 'LOG_LEVEL']) expect(bad.stderr).toContain(name);
    expect(bad.stderr).not.toMatch(/\n\s+at /);
  });

  it('on SIGTERM drains, closes the database and exits 0; what it sent survives a restart', async () => {
    const m = await startMail({ MAIL_DEDUP: 'on' });
    const k1 = key();
    const sent = await m.client.sendMail({ ...w({ key: k1 }), mail: sampleMail() });
    await m.client.close();
    expect(await m.proc.stop()).toBe(0);
    expect(m.proc.lines.some((l) => l.msg === 'stopped cleanly')).toBe(true);
    expect(existsSync(`${m.db}-wal`) ? readFileSync(`${m.db}-wal`).length : 0).toBe(0);
    const again = await startMail({ MAIL_DEDUP: 'on', MAIL_DB: m.db, MAIL_SERVICE_TOKEN_FILE: m.serviceToken.file });
    try {
      expect(await again.client.probeSent({ tenant: 'acme', key: k1 })).toMatchObject({ found: true, id: sent.id });
    } finally {
      expect(await again.stop()).toBe(0);
      rmSync(dirname(m.db), { recursive: true, force: true });
    }
  });
});
