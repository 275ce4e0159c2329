/**
 * Property: whatever an agent publishes on its intent subject — arbitrary bytes, any msgpack value,
 * envelopes that look right with random extra fields, random strings, deep objects, forged
 * identities, prototype keys — intake's pure part answers with a typed refusal (a class of the error
 * taxonomy, bounded in size, field paths when there are issues), a `term` for bytes that can never
 * be read, or an acceptance whose key is the server's own derivation. Never an exception.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { ContractRegistry, ERROR_BOUNDS, errorClasses, OPERATION_KEY_PATTERN, prepareCall } from '@tooltx/contracts';
import { encode, Subjects } from '@tooltx/nats';
import { intakeOf, type IntakeOutcome } from '../src/intake.js';
import { contracts as sinkContracts, sinkWrite } from '../../../test/fixtures/sink-tools.js';
import { researchContracts } from '../../../examples/research-kb/contracts.js';

const SEED = 20_261_130;
const subjects = new Subjects('tooltx');
const registry = new ContractRegistry([...sinkContracts, ...researchContracts({ kbDedup: true }).all]);
const find = (t: string, v: number) => registry.get(t, v);
const versionsOf = (t: string) => registry.versionsOf(t);
const SUBJECT = subjects.intent('acme', 'alice');
const goodInput = { bucket: 'kb', title: 'T', body: 'B', at: '2026-11-30T06:00:00Z' };

/** Largest encoded refusal: the bounded issues plus the envelope of the error. */
const MAX_ERROR_BYTES =
  (ERROR_BOUNDS.issues + 1) *
    (ERROR_BOUNDS.pathSegments * (ERROR_BOUNDS.segmentChars * 4 + 8) +
      ERROR_BOUNDS.codeChars * 4 +
      ERROR_BOUNDS.messageChars * 4 +
      64) +
  256;

/** Keys an attacker would try, mixed with the envelope's own. */
const keyArb = fc.oneof(
  fc.constantFrom(
    '__proto__',
    'constructor',
    'prototype',
    'toString',
    'hasOwnProperty',
    'tool',
    'version',
    'taskId',
    'input',
    'actorId',
    'operationKey',
    'interfaceDigest',
    'tenant',
    'tenantId',
    'actor_id',
  ),
  fc.string({ maxLength: 12 }),
  fc.string({ unit: 'grapheme', maxLength: 8 }),
);
/** Values msgpack can carry, deep and wide, with those keys. */
const valueArb = fc.letrec((tie) => ({
  value: fc.oneof(
    { depthSize: 'small', withCrossShrink: true },
    fc.constant(null),
    fc.boolean(),
    fc.integer(),
    fc.double(),
    fc.bigInt({ min: 0n, max: (1n << 64n) - 1n }).map((b) => Number(b)),
    fc.string({ maxLength: 40 }),
    fc.string({ unit: 'binary', maxLength: 20 }),
    fc.uint8Array({ maxLength: 16 }),
    fc.array(tie('value'), { maxLength: 4 }),
    fc.dictionary(keyArb, tie('value'), { maxKeys: 5 }),
  ),
})).value;
/** An object nested `depth` levels under one key. */
const deepArb = fc.integer({ min: 1, max: 200 }).map((depth) => {
  let v: unknown = 'leaf';
  for (let i = 0; i < depth; i++) v = { a: v };
  return v;
});
/** Mostly `good`, sometimes anything `bad` gives. */
const mostly = <T, U>(good: fc.Arbitrary<T>, bad: fc.Arbitrary<U>) =>
  fc.oneof({ weight: 4, arbitrary: good }, { weight: 1, arbitrary: bad });
/** Envelopes that look right: a real tool, a version, a task, an input of the right or the wrong shape, and random extra fields. */
const envelopeArb = fc
  .record({
    tool: mostly(
      fc.constant('sink.write'),
      fc.oneof(fc.constantFrom('sink.lookup', 'kb.write_note', 'web.fetch_page'), fc.string({ maxLength: 120 })),
    ),
    version: mostly(
      fc.constant(1),
      fc.oneof(fc.constantFrom(2, 0, -1, 1.5, 2 ** 64, Number.MAX_SAFE_INTEGER + 2), fc.integer()),
    ),
    taskId: mostly(
      fc.constantFrom('task-1', 'task-2'),
      fc.oneof(fc.string({ maxLength: 30 }), fc.string({ unit: 'binary', maxLength: 300 }), fc.constant('\ud800')),
    ),
    operationKey: fc.option(
      fc.oneof(
        fc.constant(prepareCall(sinkWrite, 'task-1', goodInput).operationKey),
        fc.string({ maxLength: 60 }),
        fc.constant(`opk_${'A'.repeat(43)}`),
      ),
      { freq: 2 },
    ),
    actorId: fc.option(mostly(fc.constant('alice'), fc.constantFrom('mallory', 'ALICE', '')), { freq: 2 }),
    interfaceDigest: fc.option(mostly(fc.constant(sinkWrite.interfaceDigest), fc.string({ maxLength: 80 })), {
      freq: 2,
    }),
    input: fc.oneof(
      { weight: 4, arbitrary: fc.constant(goodInput) },
      fc.record(Object.fromEntries(Object.entries(goodInput).map(([k, v]) => [k, mostly(fc.constant(v), valueArb)])), {
        requiredKeys: [],
      }),
      fc
        .tuple(fc.constant(goodInput), fc.dictionary(keyArb, valueArb, { maxKeys: 4 }))
        .map(([g, extra]) => ({ ...g, ...extra })),
      valueArb,
      deepArb,
    ),
    extra: mostly(fc.constant(null), fc.dictionary(keyArb, valueArb, { maxKeys: 3 })),
  })
  .map(({ extra, ...env }) => ({
    ...(extra ?? {}),
    ...Object.fromEntries(Object.entries(env).filter(([, v]) => v !== null)),
  }));

function check(
  o: IntakeOutcome,
  who: { tenant: string; actor: string } | null = { tenant: 'acme', actor: 'alice' },
): void {
  if (o.kind === 'term') {
    expect(['not an intent subject', 'undecodable intent']).toContain(o.reason);
    expect(errorClasses).toContain(o.error.class);
    expect(encode(o.error).byteLength).toBeLessThanOrEqual(MAX_ERROR_BYTES);
    return;
  }
  expect(o.who).toEqual(who);
  expect(o.submissionId.length).toBeLessThanOrEqual(128);
  const c = o.check;
  if (c.kind === 'refuse') {
    expect(errorClasses).toContain(c.error.class);
    for (const i of c.error.issues ?? [])
      expect(Array.isArray(i.path) && typeof i.code === 'string' && typeof i.message === 'string').toBe(true);
    expect(c.error.issues?.length ?? 0).toBeLessThanOrEqual(ERROR_BOUNDS.issues + 1);
    expect(encode(c.error).byteLength).toBeLessThanOrEqual(MAX_ERROR_BYTES);
    if (c.decisionKey !== null) expect(c.decisionKey).toMatch(OPERATION_KEY_PATTERN);
    return;
  }
  expect(c.kind).toBe('proceed');
  if (c.kind !== 'proceed') return;
  expect(c.prepared.operationKey).toBe(prepareCall(c.contract, c.envelope.taskId, c.envelope.input).operationKey);
}

const run = (data: Uint8Array, o: { subject?: string; msgId?: string } = {}) =>
  intakeOf(subjects, { subject: o.subject ?? SUBJECT, data, msgId: o.msgId, seq: 7 }, find, versionsOf);

describe('intake property: a typed refusal or an acceptance, never an exception', () => {
  it('arbitrary bytes', () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 256 }), (b) => check(run(b))),
      { seed: SEED, numRuns: 500 },
    );
  });

  it('arbitrary msgpack values and random strings', () => {
    fc.assert(
      fc.property(fc.oneof(valueArb, fc.string({ unit: 'binary', maxLength: 200 })), (v) => check(run(encode(v)))),
      { seed: SEED, numRuns: 400 },
    );
  });

  it('valid-looking envelopes with random fields, forged identities, prototype keys and deep inputs', () => {
    let proceeded = 0;
    fc.assert(
      fc.property(envelopeArb, (env) => {
        const o = run(encode(env));
        check(o);
        if (o.kind === 'checked' && o.check.kind === 'proceed') proceeded++;
      }),
      { seed: SEED, numRuns: 500 },
    );
    // The generator reaches acceptances too, not only refusals.
    expect(proceeded).toBeGreaterThan(20);
  });

  it('any subject and any Nats-Msg-Id', () => {
    fc.assert(
      fc.property(
        fc.string({ maxLength: 80 }),
        fc.option(fc.string({ unit: 'binary', maxLength: 300 })),
        (subject, msgId) => {
          for (const s of [subject, `tooltx.intent.${subject}`, `tooltx.intent.acme.${subject}`]) {
            check(
              run(encode({ tool: 'sink.write', version: 1, taskId: 't', input: goodInput }), {
                subject: s,
                msgId: msgId ?? undefined,
              }),
              subjects.parseActorSubject('intent', s),
            );
          }
        },
      ),
      { seed: SEED, numRuns: 300 },
    );
  });
});
