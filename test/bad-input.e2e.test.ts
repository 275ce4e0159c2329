/**
 * Bad input at every entry (FM-18), and one tenant's garbage never stops another's calls: malformed msgpack,
 * truncated and oversize payloads, 10,000 levels of nesting, huge strings, invalid UTF-8 in ids
 * (subjects, headers, message ids, fields), `__proto__` / `constructor` keys, integers beyond 2^53
 * and msgpack extension types — sent as raw bytes to the intent subject (the authorizer), the status
 * endpoint, the audit query endpoint, the takeover endpoint and its CLI, `tooltx` itself and the
 * research KB's HTTP API. Each answers a typed refusal (an error class, field paths for fixable
 * input, bounded in size) or, for bytes that can never be read, terminates the message with a record
 * of it; afterwards a call of another tenant still commits and an operation committed before the
 * barrage still answers its receipt. Everything is real: nats-server with auth on, the four
 * services and the KB as processes, raw TCP for the bytes a client library would not send.
 */
import { execFile } from 'node:child_process';
import { randomBytes, randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { jetstream, type JetStreamClient } from '@nats-io/jetstream';
import type { NatsConnection } from '@nats-io/transport-node';
import { ERROR_BOUNDS, errorClasses, operationIdOf } from '@tooltx/contracts';
import { createTools, type Tools } from '@tooltx/client';
import { auditQueryRecordSchema, type Receipt } from '@tooltx/lifecycle';
import { decode, decodeRaw, encode } from '@tooltx/nats';
import { Durables } from '@tooltx/streams';
import { researchContracts } from '../examples/research-kb/contracts.js';
import { kbRowsFor, RESEARCH_TOOLS, startKb, type TestKb } from './helpers/kb.js';
import { provisioned, type TestNats } from './helpers/nats.js';
import { RawNats } from './helpers/raw-nats.js';
import { startService, type ServiceProcess } from './helpers/services.js';
import { readStream } from './helpers/streams.js';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..');
const contracts = researchContracts({ kbDedup: false });
/** Largest encoded error any entry may answer or record: the bounded issues and their envelope. */
const MAX_ERROR_BYTES = 16 * 1024;

let t: TestNats;
let kb: TestKb;
let procs: Record<'authorizer' | 'executor' | 'reconciler' | 'audit-projector', ServiceProcess>;
let alice: Tools;
let gina: Tools;
/** The attacker: an agent of acme with its own nkey, speaking raw NATS. */
let mallory: NatsConnection;
let malloryJs: JetStreamClient;
let audrey: NatsConnection;
let oscar: NatsConnection;
let baseline: { operationKey: string; receipt: Receipt };

const note = (kbRef: string, title: string) => ({
  kb: kbRef,
  title,
  body: `Notes on ${title}.`,
  sourceUrl: 'https://example.org/src',
  fetchedAt: '2026-11-30T06:00:00Z',
});
const newKey = () => `opk_${randomBytes(32).toString('base64url')}`;

// ---- Bytes a client library would not write -------------------------------------------------

const str = (s: string) => Buffer.from([0xa0 + Buffer.byteLength(s), ...Buffer.from(s)]);
/** 10,000 levels of one-key maps around nil. */
const DEEP = Buffer.concat([
  Buffer.alloc(0),
  ...Array.from({ length: 10_000 }, () => Buffer.concat([Buffer.from([0x81]), str('a')])),
  Buffer.from([0xc0]),
]);
/** msgpackr's own extension types: an Error, a Set, a RegExp, and references that make a cycle. */
const EXT = {
  error: Buffer.from([0xc7, 0x00, 0x65, 0x92, ...str('TypeError'), ...str('boom')]),
  set: Buffer.from([0xc7, 0x00, 0x73, 0x92, 1, 2]),
  regexp: Buffer.from([0xc7, 0x00, 0x78, 0x92, ...str('(a+)+$'), ...str('')]),
  cycle: Buffer.from([0xd6, 0x69, 0, 0, 0, 1, 0x81, ...str('a'), 0xd6, 0x70, 0, 0, 0, 1]),
};
/** uint64 0xffff_ffff_ffff_ffff. */
const UINT64_MAX = Buffer.from([0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
/** A msgpack string whose bytes are not UTF-8. */
const BAD_UTF8_STR = Buffer.from([0xa4, 0xff, 0xfe, 0xc0, 0x80]);

/**
 * `value` encoded, with the msgpack of each placeholder string replaced by raw bytes: how a
 * deep value, an extension type, a uint64 or a non-UTF-8 string goes inside an envelope.
 */
function spliced(value: unknown, raw: Record<string, Buffer>): Buffer {
  let out = Buffer.from(encode(value));
  for (const [placeholder, bytes] of Object.entries(raw)) {
    const enc = Buffer.from(encode(placeholder));
    const i = out.indexOf(enc);
    if (i < 0) throw new Error(`placeholder ${placeholder} not in the encoding`);
    out = Buffer.concat([out.subarray(0, i), bytes, out.subarray(i + enc.length)]);
  }
  return out;
}

/** Builds an object with an own `__proto__` field (a literal would set the prototype instead). */
function withOwn<T extends object>(o: T, key: string, value: unknown): T {
  Object.defineProperty(o, key, { value, enumerable: true, writable: true, configurable: true });
  return o;
}

/** The error an answer carries, checked: a class of the taxonomy, issues with paths, bounded in size. */
function typed(error: unknown): {
  class: string;
  issues?: { path: (string | number)[]; code: string; message: string }[];
} {
  const e = error as { class: string; issues?: { path: (string | number)[]; code: string; message: string }[] };
  expect(errorClasses).toContain(e.class);
  for (const i of e.issues ?? [])
    expect(Array.isArray(i.path) && typeof i.code === 'string' && typeof i.message === 'string').toBe(true);
  expect(e.issues?.length ?? 0).toBeLessThanOrEqual(ERROR_BOUNDS.issues + 1);
  expect(encode(e).byteLength).toBeLessThanOrEqual(MAX_ERROR_BYTES);
  return e;
}
const paths = (e: { issues?: { path: (string | number)[] }[] }) => (e.issues ?? []).map((i) => i.path.join('.'));

// ---- The entries, spoken raw ----------------------------------------------------------------

/** Publishes raw bytes on mallory's intent subject; the PubAck's stream sequence. */
async function intent(data: Uint8Array, msgId = randomUUID()): Promise<number> {
  return (await malloryJs.publish(t.subjects.intent('acme', 'mallory'), data, { msgID: msgId, timeout: 10_000 })).seq;
}
/** mallory's status request, raw bytes in, the decoded answer out. */
async function status(data: Uint8Array): Promise<Record<string, unknown>> {
  const m = await mallory.request(t.subjects.status('acme', 'mallory'), data, { timeout: 15_000 });
  expect(m.data.byteLength).toBeLessThanOrEqual(MAX_ERROR_BYTES);
  return decodeRaw(m.data) as Record<string, unknown>;
}
/** What mallory's status endpoint says about `key` once something is recorded under it (long-poll). */
const statusOf = (key: string, submissionIds: string[]) =>
  status(encode({ operationKey: key, waitMs: 10_000, submissionIds }));
async function audit(data: Uint8Array): Promise<Record<string, unknown>> {
  const m = await audrey.request(t.subjects.audit('acme', 'audrey'), data, { timeout: 15_000 });
  expect(m.data.byteLength).toBeLessThanOrEqual(MAX_ERROR_BYTES);
  return decodeRaw(m.data) as Record<string, unknown>;
}
async function takeover(data: Uint8Array | string): Promise<{ ok: boolean; error?: unknown; takeovers?: unknown[] }> {
  const m = await oscar.request(t.subjects.takeover('oscar'), data, { timeout: 15_000 });
  expect(m.data.byteLength).toBeLessThanOrEqual(MAX_ERROR_BYTES);
  return JSON.parse(m.string()) as { ok: boolean; error?: unknown };
}

/** Resolves once the authorizer's durable holds nothing pending or unacknowledged. */
async function intakeDrained(): Promise<{ redelivered: number }> {
  for (let i = 0; i < 400; i++) {
    const c = await t.jsm.consumers.info(t.subjects.intentsStream('acme'), Durables.authorizer);
    if (c.num_pending === 0 && c.num_ack_pending === 0) return { redelivered: c.num_redelivered };
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error('the authorizer did not settle every intent');
}

/** The authorizer's log line of the intent at `seq` that it refused before a key was known. */
const termLine = (seq: number) =>
  procs.authorizer.lines.find((l) => l.msg === 'intent is not msgpack: refused' && l.intentSeq === seq);

interface Run {
  code: number;
  stderr: string;
  stdout: string;
}
/** `tooltx <args>` as a process; `shell` builds the command line for arguments no string array can hold. */
function tooltx(args: string[], env: Record<string, string>, shell?: string): Promise<Run> {
  return new Promise((resolve) => {
    const cmd = shell ? '/bin/sh' : process.execPath;
    const argv = shell ? ['-c', shell] : ['--import', 'tsx', join(ROOT, 'bin', 'tooltx.ts'), ...args];
    execFile(
      cmd,
      argv,
      {
        cwd: ROOT,
        env: {
          PATH: process.env.PATH ?? '',
          NATS_URL: t.url,
          TOOLTX_PREFIX: t.subjects.prefix,
          TOOLTX_BIN: join(ROOT, 'bin', 'tooltx.ts'),
          NODE: process.execPath,
          ...env,
        },
        maxBuffer: 8 * 1024 * 1024,
      },
      (err, stdout, stderr) =>
        resolve({ code: err ? (typeof err.code === 'number' ? err.code : 1) : 0, stdout, stderr }),
    );
  });
}

/** One raw HTTP/1.1 request to the KB; the status line, headers and body as received. */
function rawHttp(bytes: Buffer): Promise<string> {
  return new Promise((resolve, reject) => {
    const s = connect(Number(new URL(kb.url).port), '127.0.0.1');
    let out = Buffer.alloc(0);
    s.on('data', (d: Buffer) => {
      out = Buffer.concat([out, d]);
      // One answer is all we wait for: its headers and the body its content-length announces.
      const text = out.toString('latin1');
      const head = text.indexOf('\r\n\r\n');
      const len = /content-length: (\d+)/i.exec(text)?.[1];
      if (head >= 0 && (len === undefined || out.length >= head + 4 + Number(len))) s.end();
    });
    s.on('close', () => resolve(out.toString('latin1')));
    s.on('error', reject);
    s.write(bytes);
  });
}
const kbFetch = (path: string, init: RequestInit & { headers?: Record<string, string> } = {}) =>
  fetch(`${kb.url}${path}`, {
    ...init,
    headers: { authorization: `Bearer ${kb.serviceToken.token}`, ...init.headers },
  });
const noteHeaders = () => ({
  'x-tenant': 'acme',
  'x-actor': 'alice',
  'idempotency-key': `bad-${randomUUID()}`,
  'x-deadline': String(Date.now() + 60_000),
  'if-match': '1',
  'content-type': 'application/json',
});

beforeAll(async () => {
  t = await provisioned();
  kb = await startKb({
    tenants: [
      { id: 'acme', quota: 10_000 },
      { id: 'globex', quota: 10_000 },
    ],
    knowledgeBases: [
      { tenant: 'acme', name: 'research', members: [{ actor: 'alice', role: 'writer' }] },
      { tenant: 'globex', name: 'research', members: [{ actor: 'gina', role: 'writer' }] },
    ],
  });
  const env = { ...t.env, TOOLTX_TOOLS_MODULE: RESEARCH_TOOLS, KB_URL: kb.url, KB_DEDUP: 'off' };
  const [authorizer, executor, reconciler, auditProjector] = await Promise.all(
    (['authorizer', 'executor', 'reconciler', 'audit-projector'] as const).map((n) => startService(n, env)),
  );
  procs = { authorizer: authorizer!, executor: executor!, reconciler: reconciler!, 'audit-projector': auditProjector! };
  const sdk = (tenant: string, actor: string) =>
    createTools({
      servers: t.url,
      tenant,
      actor,
      nkeyFile: t.agentSeed(tenant, actor),
      contracts: contracts.all,
      prefix: t.subjects.prefix,
      receiptKeys: t.auth.receiptKeysFile,
      budgetMs: 20_000,
    });
  [alice, gina, mallory, audrey, oscar] = (await Promise.all([
    sdk('acme', 'alice'),
    sdk('globex', 'gina'),
    t.connectAs({ kind: 'agent', tenant: 'acme', actor: 'mallory' }),
    t.connectAs({ kind: 'auditor', tenant: 'acme', actor: 'audrey' }),
    t.connectAs({ kind: 'operator', operator: 'oscar' }),
  ])) as [Tools, Tools, NatsConnection, NatsConnection, NatsConnection];
  malloryJs = jetstream(mallory);
  // Committed before the barrage: it must still answer its receipt afterwards.
  const r = await alice.execute({
    tool: 'kb.write_note',
    taskId: 'before-the-barrage',
    input: note('research', 'Committed before the barrage'),
  });
  if (r.status !== 'committed') throw new Error(`baseline did not commit: ${JSON.stringify(r)}`);
  baseline = { operationKey: r.operationKey, receipt: r.receipt };
});

afterAll(async () => {
  await Promise.all([alice?.close(), gina?.close(), mallory?.close(), audrey?.close(), oscar?.close()]);
  const codes = await Promise.all(Object.values(procs ?? {}).map((p) => p.stop()));
  const kbCode = await kb?.stop();
  await t?.close();
  expect(codes).toEqual([0, 0, 0, 0]);
  expect(kbCode).toBe(0);
});

describe('the intent subject (authorizer intake)', () => {
  it('fixable input is refused with its class and field paths, recorded under the supplied key and bounded in size', async () => {
    const base = { tool: 'kb.write_note', version: 1, taskId: 'bad-input' };
    const cases: { name: string; data: (key: string) => Buffer; class: string; path: string; code?: string }[] = [
      {
        name: 'huge string',
        data: (key) =>
          Buffer.from(
            encode({ ...base, operationKey: key, taskId: 'x'.repeat(900_000), input: note('research', 'Huge') }),
          ),
        class: 'invalid_input',
        path: 'taskId',
        code: 'too_big',
      },
      {
        name: 'huge field name',
        data: (key) =>
          Buffer.from(
            encode({ ...base, operationKey: key, input: note('research', 'Name'), ['y'.repeat(500_000)]: 1 }),
          ),
        class: 'invalid_input',
        path: `${'y'.repeat(ERROR_BOUNDS.segmentChars)}…`,
        code: 'unrecognized_key',
      },
      {
        name: '50,000 unknown fields',
        data: (key) =>
          Buffer.from(
            encode({
              ...base,
              operationKey: key,
              input: note('research', 'Wide'),
              ...Object.fromEntries(Array.from({ length: 50_000 }, (_, i) => [`f${i}`, i])),
            }),
          ),
        class: 'invalid_input',
        path: '',
        code: 'too_many_values',
      },
      {
        name: '__proto__ and constructor keys',
        data: (key) =>
          Buffer.from(
            encode(
              withOwn(
                {
                  ...base,
                  operationKey: key,
                  input: note('research', 'Proto'),
                  constructor: { prototype: { polluted: true } },
                },
                '__proto__',
                { actorId: 'alice' },
              ),
            ),
          ),
        class: 'invalid_input',
        path: 'constructor',
        code: 'unrecognized_key',
      },
      {
        name: '__proto__ inside the input',
        data: (key) =>
          Buffer.from(
            encode({
              ...base,
              operationKey: key,
              input: withOwn(note('research', 'Proto'), '__proto__', { tenant: 'globex' }),
            }),
          ),
        class: 'invalid_input',
        path: 'input.__proto_',
        code: 'unrecognized_key',
      },
      {
        name: 'uint64 beyond 2^53',
        data: (key) =>
          spliced(
            { ...base, operationKey: key, version: '@UINT64@', input: note('research', 'Big') },
            { '@UINT64@': UINT64_MAX },
          ),
        class: 'invalid_input',
        path: 'version',
      },
      {
        name: 'invalid UTF-8 in an id',
        data: (key) =>
          spliced(
            { ...base, operationKey: key, actorId: '@UTF8@', input: note('research', 'Utf8') },
            { '@UTF8@': BAD_UTF8_STR },
          ),
        class: 'forbidden',
        path: 'actorId',
      },
      {
        name: 'a forged actor',
        data: (key) =>
          Buffer.from(encode({ ...base, operationKey: key, actorId: 'alice', input: note('research', 'Forged') })),
        class: 'forbidden',
        path: 'actorId',
      },
    ];
    const answers = await Promise.all(
      cases.map(async (c) => {
        const key = newKey();
        const msgId = randomUUID();
        await intent(c.data(key), msgId);
        const a = await statusOf(key, [msgId]);
        return { c, key, a };
      }),
    );
    for (const { c, key, a } of answers) {
      expect(a, c.name).toMatchObject({ operationKey: key, state: 'rejected', source: 'decision' });
      const e = typed(a.error);
      expect(e.class, c.name).toBe(c.class);
      expect(paths(e), c.name).toContain(c.path);
      if (c.code) expect(e.issues!.find((i) => i.path.join('.') === c.path)?.code, c.name).toBe(c.code);
      // What the refusal recorded is as bounded as what it answered.
      const d = await t.store.lastDecision('acme', operationIdOf(key), 'mallory');
      expect(encode(d).byteLength, c.name).toBeLessThanOrEqual(MAX_ERROR_BYTES + 1_024);
    }
    const wide = typed(answers.find((x) => x.c.name === '50,000 unknown fields')!.a.error);
    // Larger than any tool input (docs/tenancy.md): refused unread, in one issue, under the key it was sent with.
    expect(wide.issues).toEqual([
      { path: [], code: 'too_many_values', message: "more than 4096 values in the intent's maps and lists" },
    ]);
    // A __proto__ field is a field: refused at its path (msgpackr reads the key as `__proto_`), never a prototype.
    expect(paths(typed(answers.find((x) => x.c.name === '__proto__ and constructor keys')!.a.error)).sort()).toEqual([
      '__proto_',
      'constructor',
    ]);
  });

  it('bytes that can never be read are terminated, with a record of the refusal: never redelivered, nothing recorded under the key', async () => {
    const key = newKey();
    const envelope = { tool: 'kb.write_note', version: 1, taskId: 'bad-input', operationKey: key, input: '@RAW@' };
    const full = Buffer.from(encode({ ...envelope, input: note('research', 'Cut') }));
    const cases: Record<string, Buffer> = {
      'malformed msgpack': Buffer.from([0xc1, 0x82, 0xa4, 0x74, 0x6f, 0x6f, 0x6c]),
      'truncated payload': full.subarray(0, full.length - 9),
      'bytes after the value': Buffer.concat([full, str('trailer')]),
      '10,000 levels deep': spliced(envelope, { '@RAW@': DEEP }),
      'ext Error': spliced(envelope, { '@RAW@': EXT.error }),
      'ext Set': spliced(envelope, { '@RAW@': EXT.set }),
      'ext RegExp': spliced(envelope, { '@RAW@': EXT.regexp }),
      'ext references (a cycle)': spliced(envelope, { '@RAW@': EXT.cycle }),
      'a map key that is not a string': Buffer.from([0x81, 0x01, 0x02]),
      'empty payload': Buffer.alloc(0),
    };
    const seqs = await Promise.all(
      Object.entries(cases).map(async ([name, data]) => ({ name, seq: await intent(data) })),
    );
    await intakeDrained();
    for (const { name, seq } of seqs) {
      const line = termLine(seq);
      expect(line, name).toMatchObject({ tenant: 'acme', actor: 'mallory', intentSeq: seq, class: 'invalid_input' });
    }
    expect(await status(encode({ operationKey: key }))).toMatchObject({ state: 'not_seen', source: 'none' });
  });

  it('an oversize payload is refused by the server before it is stored; the connection goes on', async () => {
    await expect(intent(new Uint8Array(2 * 1024 * 1024))).rejects.toThrow(/max_payload|MAX_PAYLOAD|payload/i);
    const key = newKey();
    const msgId = randomUUID();
    await intent(
      encode({
        tool: 'kb.write_note',
        version: 1,
        taskId: 'after-oversize',
        operationKey: key,
        input: { nonsense: true },
      }),
      msgId,
    );
    expect(await statusOf(key, [msgId])).toMatchObject({ state: 'rejected', error: { class: 'invalid_input' } });
  });

  it("invalid UTF-8 in a subject is refused by the server; in a Nats-Msg-Id it is replaced by the stream sequence (bounded); the provisioner's stray subject is terminated", async () => {
    const raw = await RawNats.connect(t.url, t.agentSeed('acme', 'mallory'));
    const acks: Buffer[] = [];
    try {
      raw.subscribe('_INBOX.acme.mallory.raw', (m) => acks.push(m.data));
      raw.publish(
        Buffer.concat([Buffer.from(`${t.subjects.intent('acme', 'mallory')}`), Buffer.from([0xff, 0xfe])]),
        Buffer.from(encode({})),
      );
      raw.publish(
        Buffer.concat([Buffer.from(`${t.subjects.prefix}.status.acme.`), Buffer.from([0xc3, 0x28])]),
        Buffer.from(encode({})),
        { reply: '_INBOX.acme.mallory.raw' },
      );
      await raw.ping();
      expect(raw.errors.filter((e) => /permissions violation/i.test(e))).toHaveLength(2);
      // A message id of invalid UTF-8, then one of 20,000 characters.
      const keys = [newKey(), newKey()];
      const ids = [Buffer.from([0xff, 0xfe, 0x80, 0x41]), Buffer.from('i'.repeat(20_000))];
      for (const [i, id] of ids.entries()) {
        const headers = Buffer.concat([Buffer.from('NATS/1.0\r\nNats-Msg-Id: '), id, Buffer.from('\r\n\r\n')]);
        raw.publish(
          Buffer.from(t.subjects.intent('acme', 'mallory')),
          Buffer.from(
            encode({
              tool: 'kb.write_note',
              version: 1,
              taskId: 'raw',
              operationKey: keys[i],
              extra: 1,
              input: note('research', 'Raw'),
            }),
          ),
          { reply: '_INBOX.acme.mallory.raw', headers },
        );
      }
      await raw.ping();
      for (let i = 0; i < 100 && acks.length < 2; i++) await new Promise((r) => setTimeout(r, 50));
      const seqs = acks.map((a) => (JSON.parse(a.toString()) as { seq: number }).seq).sort((a, b) => a - b);
      expect(seqs).toHaveLength(2);
      const answers = await Promise.all(
        keys.map((k) =>
          statusOf(
            k,
            seqs.map((s) => `seq-${s}`),
          ),
        ),
      );
      for (const a of answers) {
        expect(a).toMatchObject({ state: 'rejected', source: 'decision', error: { class: 'invalid_input' } });
        expect(seqs.map((s) => `seq-${s}`)).toContain(a.submissionId);
      }
    } finally {
      raw.close();
    }
    // The provisioner may publish anywhere in the intent stream: a subject of invalid UTF-8 there is
    // no intent subject, terminated once.
    const prov = await RawNats.connect(t.url, t.auth.seedFile({ kind: 'provisioner' }));
    try {
      prov.publish(
        Buffer.concat([Buffer.from(`${t.subjects.prefix}.intent.acme.`), Buffer.from([0xff, 0xfe])]),
        Buffer.from(encode({})),
      );
      await prov.ping();
      expect(prov.errors).toEqual([]);
    } finally {
      prov.close();
    }
    await intakeDrained();
    expect(
      procs.authorizer.lines.some(
        (l) => l.msg === 'message terminated: never redelivered' && l.reason === 'not an intent subject',
      ),
    ).toBe(true);
  });
});

describe('the status endpoint', () => {
  it('answers every bad request with invalid_input and its field paths, bounded', async () => {
    const key = newKey();
    const cases: { name: string; data: Buffer; path: string }[] = [
      { name: 'malformed msgpack', data: Buffer.from([0xc1]), path: '' },
      { name: 'truncated', data: Buffer.from(encode({ operationKey: key, waitMs: 0 })).subarray(0, 20), path: '' },
      {
        name: '10,000 levels deep',
        data: spliced({ operationKey: key, afterSeq: '@RAW@' }, { '@RAW@': DEEP }),
        path: '',
      },
      {
        name: 'ext types',
        data: spliced(
          { operationKey: key, submissionIds: ['@E@', '@S@', '@C@'] },
          { '@E@': EXT.error, '@S@': EXT.set, '@C@': EXT.cycle },
        ),
        path: '',
      },
      { name: 'huge string', data: Buffer.from(encode({ operationKey: 'k'.repeat(900_000) })), path: 'operationKey' },
      {
        name: 'invalid UTF-8 in the key',
        data: spliced({ operationKey: '@UTF8@' }, { '@UTF8@': BAD_UTF8_STR }),
        path: 'operationKey',
      },
      {
        name: '__proto__ and constructor keys',
        data: Buffer.from(
          encode(
            withOwn({ operationKey: key, constructor: { prototype: { polluted: true } } }, '__proto__', {
              waitMs: 30_000,
            }),
          ),
        ),
        path: 'constructor',
      },
      {
        name: 'uint64 beyond 2^53',
        data: spliced({ operationKey: key, afterSeq: '@UINT64@' }, { '@UINT64@': UINT64_MAX }),
        path: 'afterSeq',
      },
      {
        name: '50,000 unknown fields',
        data: Buffer.from(
          encode({ operationKey: key, ...Object.fromEntries(Array.from({ length: 50_000 }, (_, i) => [`f${i}`, i])) }),
        ),
        path: 'f0',
      },
    ];
    const answers = await Promise.all(cases.map(async (c) => ({ c, a: await status(c.data) })));
    for (const { c, a } of answers) {
      const e = typed(a.error);
      expect(e.class, c.name).toBe('invalid_input');
      expect(paths(e), c.name).toContain(c.path);
    }
    expect(paths(typed(answers.find((x) => x.c.name.startsWith('__proto__'))!.a.error))).toEqual(
      expect.arrayContaining(['__proto_', 'constructor']),
    );
    await expect(
      mallory.request(t.subjects.status('acme', 'mallory'), new Uint8Array(2 * 1024 * 1024), { timeout: 5_000 }),
    ).rejects.toThrow();
    // Still serving: a well-formed request gets its answer.
    expect(await status(encode({ operationKey: key }))).toMatchObject({ operationKey: key, state: 'not_seen' });
  });
});

describe('the audit query endpoint', () => {
  it('answers every bad request with invalid_input and its field paths, and records each one before answering', async () => {
    const cases: { name: string; data: Buffer; path: string }[] = [
      { name: 'malformed msgpack', data: Buffer.from([0xc1, 0xc1]), path: '' },
      { name: 'truncated', data: Buffer.from(encode({ kind: 'counts', since: 0 })).subarray(0, 8), path: '' },
      { name: '10,000 levels deep', data: spliced({ kind: 'counts', since: '@RAW@' }, { '@RAW@': DEEP }), path: '' },
      {
        name: 'ext types',
        data: spliced({ kind: 'list', state: '@E@', contract: '@R@' }, { '@E@': EXT.error, '@R@': EXT.regexp }),
        path: '',
      },
      {
        name: 'huge string',
        data: Buffer.from(encode({ kind: 'show', operationKey: 'k'.repeat(900_000) })),
        path: 'operationKey',
      },
      {
        name: 'invalid UTF-8 in the key',
        data: spliced({ kind: 'show', operationKey: '@UTF8@' }, { '@UTF8@': BAD_UTF8_STR }),
        path: 'operationKey',
      },
      {
        name: '__proto__ and constructor keys',
        data: Buffer.from(
          encode(
            withOwn({ kind: 'counts', constructor: { prototype: { polluted: true } } }, '__proto__', {
              kind: 'export',
            }),
          ),
        ),
        path: 'constructor',
      },
      {
        name: 'uint64 beyond 2^53',
        data: spliced({ kind: 'counts', since: '@UINT64@' }, { '@UINT64@': UINT64_MAX }),
        path: 'since',
      },
      {
        name: '50,000 unknown fields',
        data: Buffer.from(
          encode({ kind: 'counts', ...Object.fromEntries(Array.from({ length: 50_000 }, (_, i) => [`f${i}`, i])) }),
        ),
        path: 'f0',
      },
    ];
    const answers = await Promise.all(cases.map(async (c) => ({ c, a: await audit(c.data) })));
    for (const { c, a } of answers) {
      const e = typed(a.error);
      expect(e.class, c.name).toBe('invalid_input');
      expect(paths(e), c.name).toContain(c.path);
    }
    await expect(
      audrey.request(t.subjects.audit('acme', 'audrey'), new Uint8Array(2 * 1024 * 1024), { timeout: 5_000 }),
    ).rejects.toThrow();
    // Every refused query is in the audit log, as its auditor's; and the service still answers.
    const log = (await readStream(t, t.subjects.auditLogStream)).map((m) => decode(auditQueryRecordSchema, m.data));
    expect(
      log.filter((r) => r.kind === 'invalid' && r.auditor === 'audrey' && r.tenant === 'acme').length,
    ).toBeGreaterThanOrEqual(cases.length);
    expect(await audit(encode({ kind: 'show', operationKey: baseline.operationKey }))).toMatchObject({
      kind: 'show',
      record: { operationKey: baseline.operationKey, status: 'committed' },
    });
  });
});

describe('the takeover endpoint and its CLI', () => {
  it("answers every bad request with invalid_input and its field paths, bounded; the operator's next request is answered", async () => {
    const deep = `${'{"a":'.repeat(10_000)}null${'}'.repeat(10_000)}`;
    const cases: { name: string; data: Buffer | string; path: string; code?: string }[] = [
      { name: 'not JSON (msgpack)', data: Buffer.from(encode({ action: 'list' })), path: '', code: 'not_json' },
      { name: 'truncated', data: '{"action":"show","operationKey":"opk_', path: '', code: 'not_json' },
      { name: '10,000 levels deep', data: `{"action":"list","x":${deep}}`, path: 'x' },
      { name: 'deep array', data: `${'['.repeat(10_000)}${']'.repeat(10_000)}`, path: '' },
      {
        name: 'huge string',
        data: JSON.stringify({ action: 'show', operationKey: 'k'.repeat(900_000) }),
        path: 'operationKey',
      },
      {
        name: 'invalid UTF-8',
        data: Buffer.concat([
          Buffer.from('{"action":"show","operationKey":"'),
          Buffer.from([0xff, 0xfe]),
          Buffer.from('"}'),
        ]),
        path: 'operationKey',
      },
      {
        name: '__proto__ and constructor keys',
        data: '{"action":"list","__proto__":{"ok":true},"constructor":{"prototype":{"polluted":true}}}',
        path: 'constructor',
      },
      {
        name: 'a number beyond 2^53',
        data: `{"action":"show","operationKey":"${newKey()}","tenant":18446744073709551615}`,
        path: 'tenant',
      },
      {
        name: '50,000 unknown fields',
        data: JSON.stringify({
          action: 'list',
          ...Object.fromEntries(Array.from({ length: 50_000 }, (_, i) => [`f${i}`, i])),
        }),
        path: 'f0',
      },
    ];
    const answers = await Promise.all(cases.map(async (c) => ({ c, a: await takeover(c.data) })));
    for (const { c, a } of answers) {
      expect(a.ok, c.name).toBe(false);
      const e = typed(a.error);
      expect(e.class, c.name).toBe('invalid_input');
      expect(paths(e), c.name).toContain(c.path);
      if (c.code) expect(e.issues![0]!.code, c.name).toBe(c.code);
    }
    expect(paths(typed(answers.find((x) => x.c.name.startsWith('__proto__'))!.a.error))).toEqual(
      expect.arrayContaining(['__proto__', 'constructor']),
    );
    expect(({} as Record<string, unknown>).polluted).toBeUndefined();
    await expect(
      oscar.request(t.subjects.takeover('oscar'), new Uint8Array(2 * 1024 * 1024), { timeout: 5_000 }),
    ).rejects.toThrow();
    expect(await takeover(JSON.stringify({ action: 'list' }))).toEqual({ ok: true, takeovers: [] });
  });

  it("tooltx refuses bad arguments with a bounded message naming the argument: exit 2 for usage, 1 for the service's refusal", async () => {
    const asOperator = {
      NATS_NKEY_FILE: t.auth.seedFile({ kind: 'operator', operator: 'oscar' }),
      TOOLTX_OPERATOR: 'oscar',
    };
    const asProvisioner = { NATS_NKEY_FILE: t.auth.seedFile({ kind: 'provisioner' }) };
    const asAuditor = {
      NATS_NKEY_FILE: t.auth.seedFile({ kind: 'auditor', tenant: 'acme', actor: 'audrey' }),
      TOOLTX_TENANT: 'acme',
      TOOLTX_AUDITOR: 'audrey',
    };
    const huge = 'k'.repeat(100_000);
    // An identity list for `tooltx auth generate`: prototype keys, 20,000 unknown fields, tenants 10,000 levels deep.
    const dir = mkdtempSync(join(tmpdir(), 'bad-input-'));
    const badList = join(dir, 'identities.json');
    const wide = JSON.stringify(Object.fromEntries(Array.from({ length: 20_000 }, (_, i) => [`k${i}`, i]))).slice(
      1,
      -1,
    );
    writeFileSync(
      badList,
      `{"__proto__":{"operators":["x"]},"constructor":{"prototype":{"p":1}},${wide},"tenants":${'['.repeat(10_000)}${']'.repeat(10_000)}}`,
    );
    const [badKey, badUtf8, badTenant, badDuration, badSince, badOption, badIdentities] = await Promise.all([
      tooltx(['takeover', 'show', huge], asOperator),
      // The argument's bytes are not UTF-8: a shell passes them as they are.
      tooltx([], asOperator, `exec "$NODE" --import tsx "$TOOLTX_BIN" takeover show "$(printf 'opk_\\377\\376')"`),
      tooltx(['takeover', 'show', newKey(), '--tenant', 'T'.repeat(50_000)], asOperator),
      tooltx(['ops', 'pending', '--older-than', huge], asProvisioner),
      tooltx(['audit', 'list', '--since', huge], asAuditor),
      tooltx(['audit', 'counts', `--${huge}`], asAuditor),
      tooltx(['auth', 'generate', '--identities', badList, '--out', join(dir, 'out')], {}),
    ]);
    rmSync(dir, { recursive: true, force: true });
    for (const [name, r, code, names, bound = 2_100] of [
      ['a 100,000-character key', badKey, 2, '<operationKey>'],
      ['a key that is not UTF-8', badUtf8, 2, '<operationKey>'],
      ['a 50,000-character tenant', badTenant, 1, 'tenant'],
      ['a 100,000-character duration', badDuration, 2, '--older-than'],
      ['a 100,000-character time', badSince, 2, '--since'],
      ['a 100,000-character option', badOption, 2, 'unknown option'],
      [
        'an identity list with prototype keys, 20,000 unknown fields, 10,000 levels deep',
        badIdentities,
        2,
        'not an identity list',
        4_100,
      ],
    ] as [string, Run, number, string, number?][]) {
      expect(r.code, `${name}: ${r.stderr.slice(0, 300)}`).toBe(code);
      expect(r.stderr, name).toContain(names);
      expect(r.stderr.length, name).toBeLessThanOrEqual(bound);
      expect(r.stdout, name).toBe('');
    }
    expect(badTenant.stderr).toContain('invalid_input');
  });
});

describe("the KB's HTTP API", () => {
  it('answers every bad request with 400 invalid_input and its field paths, bounded; a request target that is no URL does not end the process', async () => {
    const post = (body: string | Buffer, headers: Record<string, string> = noteHeaders()) =>
      kbFetch('/v1/notes', { method: 'POST', headers, body });
    const good = note('research', 'KB direct');
    const cases: { name: string; res: Promise<Response>; path: string; status?: number }[] = [
      { name: 'malformed JSON', res: post('{"kb": "research", "title": '), path: '' },
      { name: 'msgpack, not JSON', res: post(Buffer.from(encode(good))), path: '' },
      { name: '10,000 levels deep', res: post(`{"kb":${'['.repeat(10_000)}${']'.repeat(10_000)}}`), path: 'kb' },
      { name: 'huge string', res: post(JSON.stringify({ ...good, title: 't'.repeat(900_000) })), path: 'title' },
      { name: 'huge field name', res: post(JSON.stringify({ ...good, ['y'.repeat(500_000)]: 1 })), path: '' },
      {
        name: '50,000 unknown fields',
        res: post(
          JSON.stringify({ ...good, ...Object.fromEntries(Array.from({ length: 50_000 }, (_, i) => [`f${i}`, i])) }),
        ),
        path: '',
      },
      {
        name: '__proto__ and constructor keys',
        res: post(
          `{"kb":"research","title":"t","body":"b","sourceUrl":"https://example.org/","fetchedAt":"2026-11-30T06:00:00Z","__proto__":{"x":1},"constructor":{"prototype":{"polluted":true}}}`,
        ),
        path: '',
      },
      {
        name: 'a deadline beyond 2^53',
        res: post(JSON.stringify(good), { ...noteHeaders(), 'x-deadline': '18446744073709551615' }),
        path: 'headers.x-deadline',
      },
      {
        name: 'a probe key that is not percent-encoding',
        res: kbFetch('/v1/notes/by-key/%FF%FE', { headers: { 'x-tenant': 'acme' } }),
        path: 'key',
      },
    ];
    const tooBig = post(Buffer.alloc(2 * 1024 * 1024, 0x20));
    for (const c of cases) {
      const res = await c.res;
      expect(res.status, c.name).toBe(400);
      const body = await res.text();
      expect(body.length, c.name).toBeLessThanOrEqual(MAX_ERROR_BYTES);
      const e = JSON.parse(body) as {
        error: string;
        issues: { path: (string | number)[]; code: string; message: string }[];
      };
      expect(e.error, c.name).toBe('invalid_input');
      expect(e.issues.length, c.name).toBeLessThanOrEqual(ERROR_BOUNDS.issues + 1);
      if (c.path)
        expect(
          e.issues.map((i) => i.path.join('.')),
          c.name,
        ).toContain(c.path);
    }
    expect(
      await tooBig.then(async (r) => [r.status, ((await r.json()) as { issues: { code: string }[] }).issues[0]!.code]),
    ).toEqual([400, 'too_big']);
    // Bytes a fetch would never send: a header of invalid UTF-8, a target that is no URL, raw bytes in the path.
    const tok = `authorization: Bearer ${kb.serviceToken.token}\r\n`;
    const badHeader = await rawHttp(
      Buffer.concat([
        Buffer.from(`GET /v1/resolve?ref=research HTTP/1.1\r\nhost: kb\r\n${tok}x-tenant: `),
        Buffer.from([0xff, 0xfe]),
        Buffer.from('\r\nx-actor: alice\r\nconnection: close\r\n\r\n'),
      ]),
    );
    expect(badHeader).toMatch(/^HTTP\/1\.1 400/);
    expect(badHeader).toContain('"path":["headers","x-tenant"]');
    const notAUrl = await rawHttp(Buffer.from(`GET http://[ HTTP/1.1\r\nhost: kb\r\n${tok}\r\n`));
    expect(notAUrl).toMatch(/^HTTP\/1\.1 400/);
    expect(notAUrl).toContain('"path":["url"]');
    expect(
      await rawHttp(
        Buffer.concat([
          Buffer.from('GET /v1/notes/by-key/'),
          Buffer.from([0xff, 0x00]),
          Buffer.from(` HTTP/1.1\r\nhost: kb\r\n${tok}\r\n`),
        ]),
      ),
    ).toMatch(/^HTTP\/1\.1 400/);
    // Nothing was written by any of them, and the KB is still up.
    expect((await kb.client.stats('acme')).rows).toBe(1);
    expect((await kbFetch('/healthz')).status).toBe(200);
    expect(kb.proc.child.exitCode).toBeNull();
  });
});

describe('after the barrage', () => {
  it("every service still serves: another tenant's call commits, the earlier operation answers its receipt, no intent was redelivered", async () => {
    const r = await gina.execute({
      tool: 'kb.write_note',
      taskId: 'after-the-barrage',
      input: note('research', 'After the barrage'),
    });
    expect(r).toMatchObject({ status: 'committed' });
    if (r.status === 'committed') expect(await kbRowsFor(kb, 'globex', r.operationKey)).toBe(1);
    // The operation committed before it: the same receipt, signature and all, and still one row.
    const again = await alice.execute({
      tool: 'kb.write_note',
      taskId: 'before-the-barrage',
      input: note('research', 'Committed before the barrage'),
    });
    expect(again).toMatchObject({
      status: 'committed',
      operationKey: baseline.operationKey,
      receipt: baseline.receipt,
    });
    expect(await alice.status({ operationKey: baseline.operationKey })).toMatchObject({
      state: 'committed',
      receipt: baseline.receipt,
    });
    expect(await kbRowsFor(kb, 'acme', baseline.operationKey)).toBe(1);
    // Every bad intent was settled once: acknowledged or terminated, none redelivered.
    expect(await intakeDrained()).toEqual({ redelivered: 0 });
    for (const p of Object.values(procs)) {
      expect(p.child.exitCode, p.name).toBeNull();
      expect(
        p.lines.filter(
          (l) => l.msg === 'handler failed' || l.msg === 'status request failed' || l.msg === 'audit request failed',
        ),
        p.name,
      ).toEqual([]);
    }
  });
});
