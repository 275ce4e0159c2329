import { describe, expect, it } from 'vitest';
import { ContractRegistry, prepareCall } from '@tooltx/contracts';
import { encode, Subjects } from '@tooltx/nats';
import { intakeOf, keylessRefusalKey, MAX_INTENT_ITEMS } from '../src/intake.js';
import { contracts, sinkWrite } from '../../../test/fixtures/sink-tools.js';

const registry = new ContractRegistry(contracts);
const find = (t: string, v: number) => registry.get(t, v);
const who = { tenant: 'acme', actor: 'alice' };
const input = { bucket: 'kb', title: 'T', body: 'B', at: '2026-11-30T06:00:00Z' };
const key = prepareCall(sinkWrite, 'task-1', input).operationKey;
const envelope = { tool: 'sink.write', version: 1, taskId: 'task-1', operationKey: key, input };

// The checks on decoded values (identity, envelope, contract, input, key) are the lifecycle's:
// libs/lifecycle/test/intake-checks.unit.test.ts. What stays here is the decoding of the bytes.
describe('intake of an intent built to make intake work (docs/tenancy.md)', () => {
  const subjects = new Subjects('tooltx');
  const wide = (n: number) => Object.fromEntries(Array.from({ length: n }, (_, i) => [`f${i}`, 1]));
  const message = (body: unknown) => ({
    subject: subjects.intent('acme', 'alice'),
    data: encode(body),
    msgId: 'sub-1',
    seq: 9,
  });

  it('given more than MAX_INTENT_ITEMS values, when taken in, then it is refused unread under the key it was sent with', () => {
    const r = intakeOf(subjects, message({ ...envelope, input: { ...input, ...wide(25_000) } }), find);
    expect(r).toEqual({
      kind: 'checked',
      who,
      submissionId: 'sub-1',
      check: {
        kind: 'refuse',
        decisionKey: key,
        error: {
          class: 'invalid_input',
          issues: [
            {
              path: [],
              code: 'too_many_values',
              message: `more than ${MAX_INTENT_ITEMS} values in the intent's maps and lists`,
            },
          ],
        },
      },
    });
  });

  it("given the same with no well-formed key, when taken in, then it is refused with no key known (recorded under the submission's)", () => {
    const r = intakeOf(
      subjects,
      message({ ...envelope, operationKey: 'call_7', input: { ...input, ...wide(25_000) } }),
      find,
    );
    expect(r).toMatchObject({
      kind: 'checked',
      check: { kind: 'refuse', decisionKey: null, error: { class: 'invalid_input' } },
    });
  });

  it('given up to MAX_INTENT_ITEMS values, when taken in, then its unknown fields are refused at their paths, bounded', () => {
    const r = intakeOf(subjects, message({ ...envelope, input: { ...input, ...wide(1_000) } }), find);
    expect(r.kind === 'checked' && r.check.kind === 'refuse' && r.check.error.issues!.length).toBeLessThanOrEqual(21);
  });

  it('keyless refusals land on one key per submission of a tenant, which no contract derives', () => {
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
