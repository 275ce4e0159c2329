/**
 * The contract registry's rules (docs/contracts.md) as given/when/then: registration and the
 * interface-digest conflict, the current version, deprecate / retire / revert, admission of a new
 * intent, and the automatic revert threshold.
 */
import { describe, expect, it } from 'vitest';
import {
  badRatioOf,
  contractAdmission,
  currentAfterRegistration,
  decideRegistryCommand,
  registerVersion,
  shouldAutoRevert,
  type CurrentEntry,
  type Published,
  type RegistryView,
  type VersionEntry,
} from '@tooltx/lifecycle';

const D1 = `sha256:${'1'.repeat(64)}`;
const D2 = `sha256:${'2'.repeat(64)}`;
const published = (version: number, interfaceDigest = D1): Published => ({
  name: 'sink.write',
  version,
  interfaceDigest,
  input: { type: 'object' },
  output: { type: 'object' },
  effect: 'create',
});
const entry = (version: number, extra: Partial<VersionEntry> = {}): VersionEntry => ({
  ...published(version),
  firstSeenAt: 0,
  lastSeenAt: 0,
  registeredBy: 'service:authorizer@a',
  ...extra,
});
const by = 'operator:ops1';
const current = (cur: number, from?: number, reason: 'registered' | 'revert' = 'registered'): CurrentEntry => ({
  name: 'sink.write',
  current: cur,
  switches: [
    ...(from !== undefined ? [{ to: from, by: 'service:a@x', at: 0, reason: 'registered' as const }] : []),
    { ...(from !== undefined ? { from } : {}), to: cur, by: 'service:a@x', at: 1, reason },
  ],
});
const viewOf = (versions: VersionEntry[], cur: CurrentEntry): RegistryView => ({
  version: (_n, v) => versions.find((x) => x.version === v),
  current: () => cur,
  versionsOf: () => versions,
});

describe('registration', () => {
  it('given nothing under name@version, when a service publishes it, then it is put with first and last seen', () => {
    expect(registerVersion(null, published(1), 'service:authorizer@a', 5)).toMatchObject({
      kind: 'put',
      created: true,
      entry: { version: 1, interfaceDigest: D1, firstSeenAt: 5, lastSeenAt: 5, registeredBy: 'service:authorizer@a' },
    });
  });

  it('given the same interface digest registered, when published again within a minute, then nothing is written; after it, last seen moves', () => {
    expect(registerVersion(entry(1), published(1), 'service:b', 30_000)).toEqual({ kind: 'unchanged' });
    expect(registerVersion(entry(1), published(1), 'service:b', 90_000)).toMatchObject({
      kind: 'put',
      created: false,
      entry: { firstSeenAt: 0, lastSeenAt: 90_000, registeredBy: 'service:authorizer@a' },
    });
  });

  it('given another interface digest registered under name@version, when published, then it is a conflict naming both digests', () => {
    expect(registerVersion(entry(1), published(1, D2), 'service:b', 5)).toEqual({
      kind: 'conflict',
      registered: D1,
      ours: D2,
    });
  });

  it('given no current entry, when a version is registered, then it is current, recorded as a switch by the service', () => {
    expect(currentAfterRegistration(null, 'sink.write', 1, true, 'service:a', 7)).toEqual({
      name: 'sink.write',
      current: 1,
      switches: [{ to: 1, by: 'service:a', at: 7, reason: 'registered' }],
    });
  });

  it('given @1 current, when @2 is newly registered, then @2 is current; when @2 is only seen again after a revert, then nothing changes', () => {
    expect(currentAfterRegistration(current(1), 'sink.write', 2, true, 'service:a', 9)).toMatchObject({
      current: 2,
      switches: [{ to: 1 }, { from: 1, to: 2, by: 'service:a', reason: 'registered' }],
    });
    expect(currentAfterRegistration(current(1, 2, 'revert'), 'sink.write', 2, false, 'service:a', 9)).toBeNull();
    expect(currentAfterRegistration(current(2, 1), 'sink.write', 1, true, 'service:a', 9)).toBeNull();
  });
});

describe('operator commands', () => {
  const versions = [entry(1), entry(2)];

  it('given @2 current after @1, when reverted, then @1 is current again, recorded with who did it, and @2 is not withdrawn', () => {
    expect(
      decideRegistryCommand('sink.write', versions, current(2, 1), { kind: 'revert', stopRunning: false }, by, 50),
    ).toEqual({
      kind: 'write',
      current: expect.objectContaining({
        current: 1,
        switches: expect.arrayContaining([{ from: 2, to: 1, by, at: 50, reason: 'revert' }]),
      }),
      changed: [],
    });
  });

  it('given @2 current, when reverted with stop-running, then @2 is withdrawn too', () => {
    const r = decideRegistryCommand(
      'sink.write',
      versions,
      current(2, 1),
      { kind: 'revert', stopRunning: true },
      by,
      50,
    );
    expect(r).toMatchObject({
      kind: 'write',
      current: { current: 1, states: { '2': { withdrawn: { by, at: 50 } } } },
      changed: [{ version: 2, withdrawn: { by, at: 50 } }],
    });
  });

  it('given the only earlier version retired, when reverted, then it is refused at name', () => {
    const r = decideRegistryCommand(
      'sink.write',
      [entry(1, { retired: { by, at: 1 } }), entry(2)],
      current(2, 1),
      { kind: 'revert', stopRunning: false },
      by,
      50,
    );
    expect(r).toMatchObject({
      kind: 'refuse',
      error: { class: 'invalid_input', issues: [{ path: ['name'], code: 'no_previous_version' }] },
    });
  });

  it('given the earlier version withdrawn or deprecated, when reverted, then it is refused at name: a revert never makes current a version that refuses new tasks', () => {
    for (const earlier of [
      entry(1, { withdrawn: { by, at: 1 } }),
      entry(1, { deprecated: { sunsetAt: 99, by, at: 1 } }),
    ]) {
      expect(
        decideRegistryCommand(
          'sink.write',
          [earlier, entry(2)],
          current(2, 1),
          { kind: 'revert', stopRunning: false },
          by,
          50,
        ),
      ).toMatchObject({ kind: 'refuse', error: { issues: [{ path: ['name'], code: 'no_previous_version' }] } });
    }
  });

  it('given @1 already deprecated, when deprecated again with a past sunset, then it is refused at sunsetAt (retire ends a version now)', () => {
    expect(
      decideRegistryCommand(
        'sink.write',
        [entry(1, { deprecated: { sunsetAt: 99, by, at: 1 } }), entry(2)],
        current(2, 1),
        { kind: 'deprecate', version: 1, sunsetAt: 10 },
        by,
        50,
      ),
    ).toMatchObject({ kind: 'refuse', error: { issues: [{ path: ['sunsetAt'], code: 'in_the_past' }] } });
  });

  it('given @1 not current, when deprecated with a future sunset, then the sunset is recorded; a past one is refused at sunsetAt', () => {
    expect(
      decideRegistryCommand(
        'sink.write',
        versions,
        current(2, 1),
        { kind: 'deprecate', version: 1, sunsetAt: 99 },
        by,
        50,
      ),
    ).toMatchObject({
      kind: 'write',
      current: { current: 2, states: { '1': { deprecated: { sunsetAt: 99, by, at: 50 } } } },
      changed: [{ version: 1, deprecated: { sunsetAt: 99, by, at: 50 } }],
    });
    expect(
      decideRegistryCommand(
        'sink.write',
        versions,
        current(2, 1),
        { kind: 'deprecate', version: 1, sunsetAt: 10 },
        by,
        50,
      ),
    ).toMatchObject({
      kind: 'refuse',
      error: { issues: [{ path: ['sunsetAt'] }] },
    });
  });

  it('given @2 current, when it is retired or deprecated, then it is refused at contract; an unknown version or name too', () => {
    for (const cmd of [
      { kind: 'retire' as const, version: 2 },
      { kind: 'deprecate' as const, version: 2, sunsetAt: 99 },
    ])
      expect(decideRegistryCommand('sink.write', versions, current(2, 1), cmd, by, 50)).toMatchObject({
        kind: 'refuse',
        error: { issues: [{ path: ['contract'], code: 'current_version' }] },
      });
    expect(
      decideRegistryCommand('sink.write', versions, current(2, 1), { kind: 'retire', version: 7 }, by, 50),
    ).toMatchObject({
      error: { issues: [{ path: ['contract'], code: 'unknown_contract' }] },
    });
    expect(decideRegistryCommand('nope', [], null, { kind: 'retire', version: 1 }, by, 50)).toMatchObject({
      error: { issues: [{ path: ['contract'], code: 'unknown_contract' }] },
    });
    expect(decideRegistryCommand('nope', [], null, { kind: 'revert', stopRunning: false }, by, 50)).toMatchObject({
      error: { issues: [{ path: ['name'], code: 'unknown_contract' }] },
    });
  });
});

describe('operator commands on one name, one entry', () => {
  const versions = [entry(1), entry(2), entry(3)];
  const retired = { retired: { by, at: 5 } };

  it('given @2 retired by a command (kept on the current entry), when reverted, then @2 is never made current', () => {
    const cur = { ...current(3, 2), states: { '2': retired } };
    expect(
      decideRegistryCommand('sink.write', versions, cur, { kind: 'revert', stopRunning: false }, by, 50),
    ).toMatchObject({ kind: 'write', current: { current: 1 } });
  });

  it('given @1 retired, when deprecated (a command decided on an older read), then it is refused at contract: a retirement is final', () => {
    const cur = { ...current(3, 2), states: { '1': retired } };
    expect(
      decideRegistryCommand('sink.write', versions, cur, { kind: 'deprecate', version: 1, sunsetAt: 99 }, by, 50),
    ).toMatchObject({ kind: 'refuse', error: { issues: [{ path: ['contract'], code: 'retired' }] } });
  });

  it('given a retirement kept on an older version entry, when the current entry has no state for it, then it still counts', () => {
    const r = decideRegistryCommand(
      'sink.write',
      [entry(1), entry(2, retired), entry(3)],
      current(3, 2),
      { kind: 'revert', stopRunning: false },
      by,
      50,
    );
    expect(r).toMatchObject({ kind: 'write', current: { current: 1 } });
  });

  it('given retire then deprecate of other versions, when both apply in turn, then the entry holds both decisions', () => {
    const a = decideRegistryCommand('sink.write', versions, current(3, 2), { kind: 'retire', version: 1 }, by, 50);
    if (a.kind !== 'write') throw new Error('expected a write');
    const b = decideRegistryCommand(
      'sink.write',
      versions,
      a.current,
      { kind: 'deprecate', version: 2, sunsetAt: 99 },
      by,
      51,
    );
    expect(b).toMatchObject({
      kind: 'write',
      current: { current: 3, states: { '1': { retired: { by, at: 50 } }, '2': { deprecated: { sunsetAt: 99 } } } },
    });
  });

  it('given @3 reverted to @2 by one operator, when a second revert that saw @3 current is decided, then it is refused current_changed at from: two reverts at once revert once', () => {
    const first = decideRegistryCommand(
      'sink.write',
      versions,
      current(3, 2),
      { kind: 'revert', stopRunning: false, from: 3 },
      by,
      50,
    );
    if (first.kind !== 'write') throw new Error('expected a write');
    expect(first.current.current).toBe(2);
    expect(
      decideRegistryCommand(
        'sink.write',
        versions,
        first.current,
        { kind: 'revert', stopRunning: false, from: 3 },
        'operator:ops2',
        51,
      ),
    ).toMatchObject({ kind: 'refuse', error: { issues: [{ path: ['from'], code: 'current_changed' }] } });
  });

  it('given @2 current by a revert, when reverted without naming it, then it is refused already_reverted at from; named with from, it is reverted', () => {
    const reverted = current(2, 3, 'revert');
    const three = [entry(1), entry(2), entry(3)];
    expect(
      decideRegistryCommand('sink.write', three, reverted, { kind: 'revert', stopRunning: false }, by, 50),
    ).toMatchObject({ kind: 'refuse', error: { issues: [{ path: ['from'], code: 'already_reverted' }] } });
    expect(
      decideRegistryCommand('sink.write', three, reverted, { kind: 'revert', stopRunning: false, from: 2 }, by, 50),
    ).toMatchObject({ kind: 'write', current: { current: 3 } });
  });

  it('given @1 retired, when retired again, then its first retirement stays recorded', () => {
    const cur = { ...current(3, 2), states: { '1': retired } };
    const r = decideRegistryCommand('sink.write', versions, cur, { kind: 'retire', version: 1 }, 'operator:ops2', 60);
    expect(r).toMatchObject({ kind: 'write', current: { states: { '1': retired } }, changed: [retired] });
  });

  it('given @4 retired while its version entry was written, when its registration switches, then it is not made current', () => {
    const cur = { ...current(3, 2), states: { '4': retired } };
    expect(currentAfterRegistration(cur, 'sink.write', 4, true, 'service:executor@x', 70)).toBeNull();
    expect(currentAfterRegistration(current(3, 2), 'sink.write', 4, true, 'service:executor@x', 70)).toMatchObject({
      current: 4,
    });
  });

  it('given the previous version held by no running service, when reverted, then it is refused version_not_held at name; with unheld it reverts', () => {
    const held = (v: number) => v !== 2;
    expect(
      decideRegistryCommand(
        'sink.write',
        versions,
        current(3, 2),
        { kind: 'revert', stopRunning: false },
        by,
        50,
        held,
      ),
    ).toMatchObject({ kind: 'refuse', error: { issues: [{ path: ['name'], code: 'version_not_held' }] } });
    expect(
      decideRegistryCommand(
        'sink.write',
        versions,
        current(3, 2),
        { kind: 'revert', stopRunning: false, unheld: true },
        by,
        50,
        held,
      ),
    ).toMatchObject({ kind: 'write', current: { current: 2 } });
  });
});

describe('admission of a new intent', () => {
  it('given @1 deprecated with a sunset, when an intent comes before it, then it is admitted; at or after it, refused contract_retired naming the current version', () => {
    const view = viewOf([entry(1, { deprecated: { sunsetAt: 100, by, at: 0 } }), entry(2)], current(2, 1));
    expect(contractAdmission(view, 'sink.write', 1, 99)).toEqual({ kind: 'admit' });
    expect(contractAdmission(view, 'sink.write', 1, 100)).toEqual({
      kind: 'refuse',
      error: {
        class: 'contract_retired',
        issues: [{ path: ['version'], code: 'contract_retired', message: 'sink.write@1 is retired; use sink.write@2' }],
      },
    });
  });

  it('given @2 withdrawn by a revert with stop-running, when an intent on @2 comes, then it is refused contract_withdrawn naming @1', () => {
    const view = viewOf([entry(1), entry(2, { withdrawn: { by, at: 0 } })], current(1, 2, 'revert'));
    expect(contractAdmission(view, 'sink.write', 2, 5)).toMatchObject({
      kind: 'refuse',
      error: { class: 'contract_withdrawn', issues: [{ message: 'sink.write@2 is withdrawn; use sink.write@1' }] },
    });
    expect(contractAdmission(view, 'sink.write', 1, 5)).toEqual({ kind: 'admit' });
  });

  it('given a version the registry does not hold, then it is admitted (the contract check decides)', () => {
    expect(contractAdmission(viewOf([], current(1)), 'sink.write', 3, 5)).toEqual({ kind: 'admit' });
  });
});

describe('automatic revert threshold', () => {
  const t = { ratio: 0.5, minCount: 4, minTenants: 2, windowMs: 60_000 };
  const h = (operations: number, failed: number, conflicts = 0) => ({
    operations,
    conflicts,
    rejected: failed,
    unknown: 0,
    failed,
  });
  const tenants = (...hs: ReturnType<typeof h>[]) => new Map(hs.map((x, i) => [`t${i}`, x]));

  it('given the current version registered after another, when two tenants each had half or more of at least minCount calls go wrong, then it reverts', () => {
    expect(shouldAutoRevert(current(2, 1), tenants(h(4, 2, 1), h(2, 0, 2)), t)).toBe(true);
  });
  it('given one tenant far over the ratio and another fine, then it does not: one tenant never reverts a name for every tenant', () => {
    expect(shouldAutoRevert(current(2, 1), tenants(h(100, 100, 50), h(10, 0)), t)).toBe(false);
    expect(shouldAutoRevert(current(2, 1), tenants(h(100, 100, 50), h(10, 0)), { ...t, minTenants: 1 })).toBe(true);
  });
  it('given too few calls, a lower ratio, a version current by a revert, or no previous one, then it does not', () => {
    expect(shouldAutoRevert(current(2, 1), tenants(h(3, 3), h(3, 3)), t)).toBe(false);
    expect(shouldAutoRevert(current(2, 1), tenants(h(10, 3), h(10, 4)), t)).toBe(false);
    expect(shouldAutoRevert(current(1, 2, 'revert'), tenants(h(4, 4), h(4, 4)), t)).toBe(false);
    expect(shouldAutoRevert(current(1), tenants(h(4, 4), h(4, 4)), t)).toBe(false);
  });
  it('the bad ratio counts calls, never above 1: conflicts are calls that registered nothing, a failed operation counts once', () => {
    expect(badRatioOf({ operations: 1, conflicts: 9, rejected: 1, unknown: 1, failed: 1 })).toBe(1);
    expect(badRatioOf({ operations: 4, conflicts: 0, rejected: 1, unknown: 1, failed: 1 })).toBe(0.25);
    expect(badRatioOf({ operations: 0, conflicts: 0, rejected: 0, unknown: 0, failed: 0 })).toBe(0);
  });
});
