import { describe, expect, it } from 'vitest';
import { ContractRegistry, prepareCall } from '@tooltx/contracts';
import { encode, Subjects } from '@tooltx/nats';
import { checkIntake, intakeOf, keylessRefusalKey, MAX_INTENT_ITEMS } from '../src/intake.js';
import { sinkWriteV2 } from '../../../test/fixtures/sink-tools-v2.js';
import { contracts, sinkLookup, sinkWrite } from '../../../test/fixtures/sink-tools.js';

const registry = new ContractRegistry(contracts);
const find = (t: string, v: number) => registry.get(t, v);
const who = { tenant: 'acme', actor: 'alice' };
const input = { bucket: 'kb', title: 'T', body: 'B', at: '2026-11-30T06:00:00Z' };
const key = prepareCall(sinkWrite, 'task-1', input).operationKey;
const envelope = { tool: 'sink.write', version: 1, taskId: 'task-1', operationKey: key, input };

describe('intake checks, in order', () => {
  it('proceeds with the server-derived key and digests for a well-formed intent', () => {
    const r = checkIntake(who, envelope, find);
    expect(r.kind).toBe('proceed');
    if (r.kind === 'proceed') expect(r.prepared.operationKey).toBe(key);
  });

  it('FM-06: checks identity first — a forged actorId is forbidden even when the input is also bad', () => {
    const r = checkIntake(who, { ...envelope, actorId: 'mallory', input: { nonsense: true } }, find);
    expect(r).toMatchObject({ kind: 'refuse', error: { class: 'forbidden' }, decisionKey: key });
  });

  it('FM-06: a forged actorId without a key is recorded under the key its request derives to, when the request parses', () => {
    const { operationKey: _omitted, ...raw } = envelope;
    expect(checkIntake(who, { ...raw, actorId: 'mallory' }, find)).toEqual({
      kind: 'refuse', error: { class: 'forbidden', issues: [{ path: ['actorId'], code: 'not_authenticated_actor', message: 'actorId must be the actor this connection authenticated as' }] }, decisionKey: key, tool: 'sink.write', version: 1,
    });
    // A per-attempt id is no key either: the derived one is used.
    expect(checkIntake(who, { ...raw, operationKey: 'call_7f3a9', actorId: 'mallory' }, find)).toMatchObject({ error: { class: 'forbidden' }, decisionKey: key });
    // Nothing to derive from: refused, no key known.
    for (const bad of [{ ...raw, input: { nonsense: true } }, { ...raw, tool: 'nope.tool' }, { ...raw, extra: 1 }, {}]) {
      expect(checkIntake(who, { ...bad, actorId: 'mallory' }, find)).toMatchObject({ kind: 'refuse', error: { class: 'forbidden' }, decisionKey: null });
    }
  });

  it('FM-06: a tenant or actor named inside the input, other than the subject\'s, is forbidden at its path — recorded under the key the rest of the input derives to', () => {
    const { operationKey: _omitted, ...raw } = envelope;
    for (const [field, value] of [['tenantId', 'globex'], ['tenant', 'globex'], ['actor_id', 'mallory']] as const) {
      expect(checkIntake(who, { ...raw, input: { ...input, [field]: value } }, find)).toMatchObject({
        kind: 'refuse', error: { class: 'forbidden', issues: [{ path: ['input', field], code: 'not_authenticated_identity' }] }, decisionKey: key, tool: 'sink.write', version: 1,
      });
    }
    // The subject's own tenant in the input is no forgery, only a field the contract does not have.
    expect(checkIntake(who, { ...envelope, input: { ...input, tenantId: 'acme' } }, find)).toMatchObject({ kind: 'refuse', error: { class: 'invalid_input', issues: [{ path: ['input', 'tenantId'] }] } });
  });

  it('accepts an actorId equal to the subject actor', () => {
    expect(checkIntake(who, { ...envelope, actorId: 'alice' }, find).kind).toBe('proceed');
  });

  it('FM-18: names the field of an unknown contract version and of bad input', () => {
    expect(checkIntake(who, { ...envelope, version: 7 }, find)).toMatchObject({ kind: 'refuse', error: { class: 'invalid_input', issues: [{ path: ['version'] }] } });
    expect(checkIntake(who, { ...envelope, tool: 'nope.tool' }, find)).toMatchObject({ kind: 'refuse', error: { class: 'invalid_input', issues: [{ path: ['tool'] }] } });
    expect(checkIntake(who, { ...envelope, input: { ...input, title: 42 } }, find)).toMatchObject({ error: { class: 'invalid_input', issues: [{ path: ['input', 'title'] }] } });
    expect(checkIntake(who, { ...envelope, extra: 1 }, find)).toMatchObject({ error: { class: 'invalid_input', issues: [{ path: ['extra'] }] } });
  });

  it('FM-25: a write made with a contract whose digest differs from the registry\'s is refused contract_mismatch before its input is read; the same digest, none, or a read goes on', () => {
    const stale = `sha256:${'0'.repeat(64)}`;
    expect(checkIntake(who, { ...envelope, interfaceDigest: stale }, find)).toEqual({
      kind: 'refuse',
      error: { class: 'contract_mismatch', issues: [{ path: ['interfaceDigest'], code: 'contract_mismatch', message: 'the server\'s sink.write@1 has another digest: refresh the contract' }] },
      decisionKey: key,
      tool: 'sink.write',
      version: 1,
    });
    // Even an input the server's contract would refuse: the stale contract is the cause to report.
    expect(checkIntake(who, { ...envelope, interfaceDigest: stale, input: { ...input, title: 42 } }, find)).toMatchObject({ error: { class: 'contract_mismatch' } });
    expect(checkIntake(who, { ...envelope, interfaceDigest: sinkWrite.interfaceDigest }, find).kind).toBe('proceed');
    expect(checkIntake(who, envelope, find).kind).toBe('proceed');
    expect(checkIntake(who, { ...envelope, interfaceDigest: 'md5:abc' }, find)).toMatchObject({ error: { class: 'invalid_input', issues: [{ path: ['interfaceDigest'] }] } });
    // A read has no side effect to protect: it goes on with the server's contract.
    const readInput = { name: 'n' };
    const read = { tool: sinkLookup.name, version: sinkLookup.version, taskId: 'task-1', interfaceDigest: stale, input: readInput };
    expect(checkIntake(who, read, find).kind).toBe('proceed');
  });

  it('FM-24: an old (v1) request is never read as v2 with a default for v2\'s new required field: with v1 retired it is an unknown version, and a v2 request without the field is refused at its path', () => {
    const onlyV2 = new ContractRegistry([sinkWriteV2]);
    const findV2 = (t: string, v: number) => onlyV2.get(t, v);
    const versions = (t: string) => onlyV2.versionsOf(t);
    expect(checkIntake(who, envelope, findV2, versions)).toMatchObject({
      kind: 'refuse',
      error: { class: 'invalid_input', issues: [{ path: ['version'], code: 'unknown_contract', message: 'no contract sink.write@1 (registered: @2)' }] },
    });
    const { operationKey: _k, ...raw } = envelope;
    expect(checkIntake(who, { ...raw, version: 2 }, findV2, versions)).toMatchObject({ kind: 'refuse', error: { class: 'invalid_input', issues: [{ path: ['input', 'approver'] }] } });
    // Both registered: a v1 request stays v1.
    const both = new ContractRegistry([sinkWrite, sinkWriteV2]);
    const r = checkIntake(who, envelope, (t, v) => both.get(t, v));
    expect(r.kind === 'proceed' && r.contract.version).toBe(1);
  });

  it('FM-03: a supplied key that does not match the request is an idempotency_conflict at operationKey', () => {
    const other = prepareCall(sinkWrite, 'task-2', input).operationKey;
    expect(checkIntake(who, { ...envelope, operationKey: other }, find)).toMatchObject({
      kind: 'refuse', decisionKey: other, error: { class: 'idempotency_conflict', issues: [{ path: ['operationKey'] }] },
    });
  });

  it('refuses a per-attempt id (a model tool-call id) as a key, recording it under the derived key', () => {
    expect(checkIntake(who, { ...envelope, operationKey: 'call_7f3a9' }, find)).toMatchObject({
      kind: 'refuse', decisionKey: key, error: { class: 'idempotency_conflict', issues: [{ path: ['operationKey'] }] },
    });
  });
});

describe('intake of an intent built to make intake work (docs/tenancy.md)', () => {
  const subjects = new Subjects('tooltx');
  const wide = (n: number) => Object.fromEntries(Array.from({ length: n }, (_, i) => [`f${i}`, 1]));
  const message = (body: unknown) => ({ subject: subjects.intent('acme', 'alice'), data: encode(body), msgId: 'sub-1', seq: 9 });

  it('given more than MAX_INTENT_ITEMS values, when taken in, then it is refused unread under the key it was sent with', () => {
    const r = intakeOf(subjects, message({ ...envelope, input: { ...input, ...wide(25_000) } }), find);
    expect(r).toEqual({
      kind: 'checked', who, submissionId: 'sub-1',
      check: { kind: 'refuse', decisionKey: key, error: { class: 'invalid_input', issues: [{ path: [], code: 'too_many_values', message: `more than ${MAX_INTENT_ITEMS} values in the intent's maps and lists` }] } },
    });
  });

  it('given the same with no well-formed key, when taken in, then it is refused with no key known (recorded under the submission\'s)', () => {
    const r = intakeOf(subjects, message({ ...envelope, operationKey: 'call_7', input: { ...input, ...wide(25_000) } }), find);
    expect(r).toMatchObject({ kind: 'checked', check: { kind: 'refuse', decisionKey: null, error: { class: 'invalid_input' } } });
  });

  it('given up to MAX_INTENT_ITEMS values, when taken in, then its unknown fields are refused at their paths, bounded', () => {
    const r = intakeOf(subjects, message({ ...envelope, input: { ...input, ...wide(1_000) } }), find);
    expect(r.kind === 'checked' && r.check.kind === 'refuse' && r.check.error.issues!.length).toBeLessThanOrEqual(21);
  });

  it('keyless refusals land on one key per submission of a tenant, which no contract derives', () => {
    expect(keylessRefusalKey('acme', 'sub-1')).toMatch(/^opk_[A-Za-z0-9_-]{43}$/);
    expect(keylessRefusalKey('acme', 'sub-1')).toBe(keylessRefusalKey('acme', 'sub-1'));
    expect(new Set([keylessRefusalKey('acme', 'sub-1'), keylessRefusalKey('acme', 'sub-2'), keylessRefusalKey('globex', 'sub-1')]).size).toBe(3);
  });
});
