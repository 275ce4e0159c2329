/**
 * The intake checks on a decoded intent (`checkIntake`), in their order, as given/when/then: given
 * the envelope an agent sent on its own subject and the contracts registered, when intake checks
 * it, then it proceeds with the server-derived key, or is refused with its error class, field
 * paths and the key the refusal is recorded under. The decoding of the bytes (msgpack, its bounds)
 * is the authorizer's and is tested there.
 */
import { describe, expect, it } from 'vitest';
import { ContractRegistry, prepareCall } from '@tooltx/contracts';
import { checkIntake, keylessRefusalKey } from '@tooltx/lifecycle';
import { sinkWriteV2 } from '../../../test/fixtures/sink-tools-v2.js';
import { contracts, sinkLookup, sinkWrite } from '../../../test/fixtures/sink-tools.js';

const registry = new ContractRegistry(contracts);
const find = (t: string, v: number) => registry.get(t, v);
const who = { tenant: 'acme', actor: 'alice' };
const input = { bucket: 'kb', title: 'T', body: 'B', at: '2026-11-30T06:00:00Z' };
const key = prepareCall(sinkWrite, 'task-1', input).operationKey;
const envelope = { tool: 'sink.write', version: 1, taskId: 'task-1', operationKey: key, input };
const { operationKey: _omitted, ...keyless } = envelope;

describe('intake checks: a well-formed intent proceeds', () => {
  it('given a well-formed intent with the derived key, then it proceeds with the server-derived key, the contract and the envelope', () => {
    const r = checkIntake(who, envelope, find);
    expect(r).toMatchObject({
      kind: 'proceed',
      envelope,
      contract: { name: 'sink.write', version: 1 },
      prepared: { operationKey: key },
    });
  });

  it("given an actorId equal to the subject's actor, then it proceeds", () => {
    expect(checkIntake(who, { ...envelope, actorId: 'alice' }, find).kind).toBe('proceed');
  });

  it('given no key, then it proceeds with the derived one', () => {
    expect(checkIntake(who, keyless, find)).toMatchObject({ kind: 'proceed', prepared: { operationKey: key } });
  });
});

describe('intake checks: identity first (FM-06)', () => {
  it('given a forged actorId and a bad input, then forbidden — identity is checked before anything else — under the supplied key', () => {
    expect(checkIntake(who, { ...envelope, actorId: 'mallory', input: { nonsense: true } }, find)).toMatchObject({
      kind: 'refuse',
      error: { class: 'forbidden' },
      decisionKey: key,
    });
  });

  it('given a forged actorId and no key, then forbidden at actorId, recorded under the key the request derives to when it parses', () => {
    expect(checkIntake(who, { ...keyless, actorId: 'mallory' }, find)).toEqual({
      kind: 'refuse',
      error: {
        class: 'forbidden',
        issues: [
          {
            path: ['actorId'],
            code: 'not_authenticated_actor',
            message: 'actorId must be the actor this connection authenticated as',
          },
        ],
      },
      decisionKey: key,
      tool: 'sink.write',
      version: 1,
    });
    // A per-attempt id is no key either: the derived one is used.
    expect(checkIntake(who, { ...keyless, operationKey: 'call_7f3a9', actorId: 'mallory' }, find)).toMatchObject({
      error: { class: 'forbidden' },
      decisionKey: key,
    });
  });

  it('given a forged actorId and nothing to derive a key from, then forbidden with no key known', () => {
    for (const bad of [
      { ...keyless, input: { nonsense: true } },
      { ...keyless, tool: 'nope.tool' },
      { ...keyless, extra: 1 },
      {},
    ]) {
      expect(checkIntake(who, { ...bad, actorId: 'mallory' }, find)).toMatchObject({
        kind: 'refuse',
        error: { class: 'forbidden' },
        decisionKey: null,
      });
    }
  });

  it('given another tenant or actor named inside the input, then forbidden at its path, recorded under the key the rest of the input derives to', () => {
    for (const [field, value] of [
      ['tenantId', 'globex'],
      ['tenant', 'globex'],
      ['actor_id', 'mallory'],
    ] as const) {
      expect(checkIntake(who, { ...keyless, input: { ...input, [field]: value } }, find)).toMatchObject({
        kind: 'refuse',
        error: { class: 'forbidden', issues: [{ path: ['input', field], code: 'not_authenticated_identity' }] },
        decisionKey: key,
        tool: 'sink.write',
        version: 1,
      });
    }
  });

  it("given the subject's own tenant inside the input, then no forgery: an unknown field, invalid_input at its path", () => {
    expect(checkIntake(who, { ...envelope, input: { ...input, tenantId: 'acme' } }, find)).toMatchObject({
      kind: 'refuse',
      error: { class: 'invalid_input', issues: [{ path: ['input', 'tenantId'] }] },
    });
  });
});

describe('intake checks: envelope, contract and input (FM-18, FM-24, FM-25)', () => {
  it('FM-18: given an unknown version, an unknown tool, a bad input field or an unknown envelope field, then invalid_input at that path', () => {
    expect(checkIntake(who, { ...envelope, version: 7 }, find)).toMatchObject({
      kind: 'refuse',
      error: { class: 'invalid_input', issues: [{ path: ['version'] }] },
    });
    expect(checkIntake(who, { ...envelope, tool: 'nope.tool' }, find)).toMatchObject({
      kind: 'refuse',
      error: { class: 'invalid_input', issues: [{ path: ['tool'] }] },
    });
    expect(checkIntake(who, { ...envelope, input: { ...input, title: 42 } }, find)).toMatchObject({
      error: { class: 'invalid_input', issues: [{ path: ['input', 'title'] }] },
    });
    expect(checkIntake(who, { ...envelope, extra: 1 }, find)).toMatchObject({
      error: { class: 'invalid_input', issues: [{ path: ['extra'] }] },
    });
  });

  it('FM-25: given a write with another contract digest, then contract_mismatch under the supplied key, before its input is read', () => {
    const stale = `sha256:${'0'.repeat(64)}`;
    expect(checkIntake(who, { ...envelope, interfaceDigest: stale }, find)).toEqual({
      kind: 'refuse',
      error: {
        class: 'contract_mismatch',
        issues: [
          {
            path: ['interfaceDigest'],
            code: 'contract_mismatch',
            message: expect.stringMatching(
              /^the server's sink\.write@1 has another digest: refresh the contract \(server sha256:\S+, caller \S+\)$/,
            ),
          },
        ],
      },
      decisionKey: key,
      tool: 'sink.write',
      version: 1,
    });
    expect(
      checkIntake(who, { ...envelope, interfaceDigest: stale, input: { ...input, title: 42 } }, find),
    ).toMatchObject({ error: { class: 'contract_mismatch' } });
  });

  it('FM-25: given the same digest, none, or a read with another digest, then it goes on; a malformed digest is invalid_input at its path', () => {
    const stale = `sha256:${'0'.repeat(64)}`;
    expect(checkIntake(who, { ...envelope, interfaceDigest: sinkWrite.interfaceDigest }, find).kind).toBe('proceed');
    expect(checkIntake(who, envelope, find).kind).toBe('proceed');
    expect(
      checkIntake(
        who,
        {
          tool: sinkLookup.name,
          version: sinkLookup.version,
          taskId: 'task-1',
          interfaceDigest: stale,
          input: { name: 'n' },
        },
        find,
      ).kind,
    ).toBe('proceed');
    expect(checkIntake(who, { ...envelope, interfaceDigest: 'md5:abc' }, find)).toMatchObject({
      error: { class: 'invalid_input', issues: [{ path: ['interfaceDigest'] }] },
    });
  });

  it('FM-24: given v1 retired and v2 registered, then a v1 request is an unknown version naming the registered ones, and a v2 request without its new field is refused at its path', () => {
    const onlyV2 = new ContractRegistry([sinkWriteV2]);
    const findV2 = (t: string, v: number) => onlyV2.get(t, v);
    const versions = (t: string) => onlyV2.versionsOf(t);
    expect(checkIntake(who, envelope, findV2, versions)).toMatchObject({
      kind: 'refuse',
      error: {
        class: 'invalid_input',
        issues: [{ path: ['version'], code: 'unknown_contract', message: 'no contract sink.write@1 (registered: @2)' }],
      },
    });
    expect(checkIntake(who, { ...keyless, version: 2 }, findV2, versions)).toMatchObject({
      kind: 'refuse',
      error: { class: 'invalid_input', issues: [{ path: ['input', 'approver'] }] },
    });
  });

  it('FM-24: given v1 and v2 both registered, then a v1 request stays v1', () => {
    const both = new ContractRegistry([sinkWrite, sinkWriteV2]);
    const r = checkIntake(who, envelope, (t, v) => both.get(t, v));
    expect(r.kind === 'proceed' && r.contract.version).toBe(1);
  });
});

describe('intake checks: the supplied key (FM-03)', () => {
  it('given a supplied key of another request, then idempotency_conflict at operationKey, recorded under the supplied key', () => {
    const other = prepareCall(sinkWrite, 'task-2', input).operationKey;
    expect(checkIntake(who, { ...envelope, operationKey: other }, find)).toMatchObject({
      kind: 'refuse',
      decisionKey: other,
      error: { class: 'idempotency_conflict', issues: [{ path: ['operationKey'] }] },
    });
  });

  it('given a per-attempt id (a model tool-call id) as the key, then idempotency_conflict recorded under the derived key', () => {
    expect(checkIntake(who, { ...envelope, operationKey: 'call_7f3a9' }, find)).toMatchObject({
      kind: 'refuse',
      decisionKey: key,
      error: { class: 'idempotency_conflict', issues: [{ path: ['operationKey'] }] },
    });
  });
});

describe('the key of a refusal with no key known', () => {
  it('given a tenant and a submission id, then one well-formed key per submission of a tenant, the same on a repeat', () => {
    expect(keylessRefusalKey('acme', 'sub-1')).toMatch(/^opk_[A-Za-z0-9_-]{43}$/);
    expect(keylessRefusalKey('acme', 'sub-1')).toBe(keylessRefusalKey('acme', 'sub-1'));
    expect(
      new Set([
        keylessRefusalKey('acme', 'sub-1'),
        keylessRefusalKey('acme', 'sub-2'),
        keylessRefusalKey('globex', 'sub-1'),
      ]).size,
    ).toBe(3);
  });
});

describe('intake checks: a confirmation or a discard of a held-back operation', () => {
  it('given { confirms } or { discards } with a well-formed key, then it names the operation', () => {
    expect(checkIntake(who, { confirms: { operationKey: key } }, find)).toEqual({ kind: 'confirm', operationKey: key });
    expect(checkIntake(who, { actorId: 'alice', discards: { operationKey: key } }, find)).toEqual({
      kind: 'discard',
      operationKey: key,
    });
  });

  it('given a bad key, an unknown field or both requests at once, then invalid_input at its path, recorded under no key (the submission’s)', () => {
    expect(checkIntake(who, { confirms: { operationKey: 'nope' } }, find)).toMatchObject({
      kind: 'refuse',
      error: { class: 'invalid_input', issues: [{ path: ['confirms', 'operationKey'] }] },
      decisionKey: null,
    });
    expect(checkIntake(who, { discards: { operationKey: key, why: 'x' } }, find)).toMatchObject({
      kind: 'refuse',
      error: { class: 'invalid_input', issues: [{ path: ['discards', 'why'] }] },
    });
    expect(checkIntake(who, { confirms: { operationKey: key }, discards: { operationKey: key } }, find)).toMatchObject({
      kind: 'refuse',
      error: { class: 'invalid_input', issues: [{ path: ['discards'] }] },
    });
  });

  it('given a forged actorId, then forbidden before anything else', () => {
    expect(checkIntake(who, { actorId: 'mallory', confirms: { operationKey: key } }, find)).toMatchObject({
      kind: 'refuse',
      error: { class: 'forbidden' },
      decisionKey: null,
    });
  });
});
