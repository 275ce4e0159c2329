/**
 * Operator commands on one contract name at once, on a real nats-server's registry bucket
 * (docs/contracts.md): two contracts services (each with its own watched copy of the registry)
 * apply conflicting commands concurrently, round after round, and the invariants hold after each:
 * the current version is never retired, withdrawn or deprecated, a retirement is never undone, and
 * two reverts at once revert once.
 */
import type { KV } from '@nats-io/kv';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  currentAfterRegistration,
  currentEntrySchema,
  currentKeyOf,
  heldKeyOf,
  isRetired,
  versionEntrySchema,
  versionKeyOf,
  withState,
  type CurrentEntry,
  type HeldMark,
  type RegistryCommand,
  type VersionEntry,
} from '@tooltx/lifecycle';
import { decode, encode, openBucket, type NatsConnection } from '@tooltx/nats';
import { casUpdate, createLogger, RegistryMirror } from '@tooltx/runtime';
import { applyRegistryCommand } from '../src/contracts-service.js';
import { provisioned, type TestNats } from '../../../test/helpers/nats.js';

const ROUNDS = 12;
const log = createLogger({ service: 'registry-commands-test', instance: 'test', level: 'silent' });
let t: TestNats;
let nc2: NatsConnection;
let kvA: KV;
let kvB: KV;
let a: RegistryMirror;
let b: RegistryMirror;

/** `name` with @1…@3 registered and held, @3 current after @2 after @1. */
async function seed(name: string): Promise<void> {
  for (const version of [1, 2, 3]) {
    const v: VersionEntry = {
      name,
      version,
      interfaceDigest: `sha256:${String(version).repeat(64)}`,
      input: { type: 'object' },
      output: { type: 'object' },
      effect: 'create',
      firstSeenAt: version,
      lastSeenAt: version,
      registeredBy: 'service:executor@test',
    };
    await kvA.put(versionKeyOf(name, version), encode(v));
    const held: HeldMark = { name, version, instance: 'executor@test', at: 0, until: Date.now() + 600_000 };
    await kvA.put(heldKeyOf(name, version, held.instance), encode(held));
  }
  const cur: CurrentEntry = {
    name,
    current: 3,
    switches: [
      { to: 1, by: 'service:executor@test', at: 1, reason: 'registered' },
      { from: 1, to: 2, by: 'service:executor@test', at: 2, reason: 'registered' },
      { from: 2, to: 3, by: 'service:executor@test', at: 3, reason: 'registered' },
    ],
  };
  await kvA.put(currentKeyOf(name), encode(cur));
  for (const m of [a, b])
    await expect
      .poll(() => m.versionsOf(name).length + (m.current(name) ? 1 : 0) + (m.isHeld(name, 1, Date.now()) ? 1 : 0))
      .toBe(5);
}

/** The name's entries as the bucket holds them now (not a watched copy). */
async function stored(name: string): Promise<{ cur: CurrentEntry; versions: VersionEntry[] }> {
  const e = await kvA.get(currentKeyOf(name));
  const cur = decode(currentEntrySchema, e!.value);
  const versions: VersionEntry[] = [];
  for (const version of [1, 2, 3]) {
    const v = await kvA.get(versionKeyOf(name, version));
    versions.push(withState(decode(versionEntrySchema, v!.value), cur));
  }
  return { cur, versions };
}

const settle = <T>(p: Promise<T>) =>
  p.then(
    (value) => ({ ok: true as const, value }),
    (err: unknown) => ({ ok: false as const, err }),
  );

/** `cmd` on `name` by operator ann through service A, or by operator bo through service B, at `now`. */
const byAnn = (name: string, cmd: RegistryCommand, now: number) =>
  settle(applyRegistryCommand({ registryKv: kvA, registry: a }, name, cmd, 'operator:ann', now));
const byBo = (name: string, cmd: RegistryCommand, now: number) =>
  settle(applyRegistryCommand({ registryKv: kvB, registry: b }, name, cmd, 'operator:bo', now));

beforeAll(async () => {
  t = await provisioned();
  nc2 = await t.connectAs({ kind: 'provisioner' });
  kvA = await openBucket(t.nc, t.subjects.contractsBucket);
  kvB = await openBucket(nc2, t.subjects.contractsBucket);
  a = new RegistryMirror(kvA, log);
  b = new RegistryMirror(kvB, log);
  await Promise.all([a.start(), b.start()]);
});

afterAll(async () => {
  await Promise.all([a?.stop(), b?.stop()]);
  await nc2?.close();
  await t?.close();
});

describe('registry commands on one name at once', () => {
  it('a revert and a retire of the version it would make current: the current version is never retired', async () => {
    for (let i = 0; i < ROUNDS; i++) {
      const name = `race.revert_retire_${i}`;
      await seed(name);
      const now = Date.now();
      const [revert, retire] = await Promise.all([
        byAnn(name, { kind: 'revert', stopRunning: false, from: 3 }, now),
        byBo(name, { kind: 'retire', version: 2 }, now),
      ]);
      const { cur, versions } = await stored(name);
      const current = versions.find((v) => v.version === cur.current)!;
      expect({ round: i, current: cur.current, retired: isRetired(current, Date.now()) }).toMatchObject({
        retired: false,
      });
      // Each command took effect or was refused, never lost: a retire that succeeded left @2 retired.
      if (retire.ok) expect(versions[1]!.retired).toMatchObject({ by: 'operator:bo' });
      expect(revert.ok || retire.ok).toBe(true);
    }
  });

  it('a deprecate and a retire of one version: the retirement is never undone', async () => {
    for (let i = 0; i < ROUNDS; i++) {
      const name = `race.deprecate_retire_${i}`;
      await seed(name);
      const now = Date.now();
      const [deprecate, retire] = await Promise.all([
        byAnn(name, { kind: 'deprecate', version: 1, sunsetAt: now + 86_400_000 }, now),
        byBo(name, { kind: 'retire', version: 1 }, now),
      ]);
      expect(retire.ok).toBe(true);
      const { versions } = await stored(name);
      expect({ round: i, retired: versions[0]!.retired }).toMatchObject({ retired: { by: 'operator:bo' } });
      // A deprecate decided after the retirement is refused: a retirement is final.
      if (!deprecate.ok) expect(deprecate.err).toMatchObject({ issues: [{ path: ['contract'], code: 'retired' }] });
    }
  });

  it("a version retired between its registration's version write and its switch is never made current", async () => {
    const name = 'race.register_retire';
    await seed(name);
    // A service registers @4: its version entry first...
    const v4: VersionEntry = {
      name,
      version: 4,
      interfaceDigest: `sha256:${'4'.repeat(64)}`,
      input: { type: 'object' },
      output: { type: 'object' },
      effect: 'create',
      firstSeenAt: 4,
      lastSeenAt: 4,
      registeredBy: 'service:executor@new',
    };
    await kvA.put(versionKeyOf(name, 4), encode(v4));
    await expect.poll(() => b.version(name, 4) !== undefined).toBe(true);
    // ...an operator retires it (not current yet)...
    await applyRegistryCommand(
      { registryKv: kvB, registry: b },
      name,
      { kind: 'retire', version: 4 },
      'operator:bo',
      Date.now(),
    );
    // ...then the registration's switch, as publishContracts makes it.
    await casUpdate(kvA, currentKeyOf(name), currentEntrySchema, (cur) =>
      currentAfterRegistration(cur, name, 4, true, 'service:executor@new', Date.now()),
    );
    const { cur } = await stored(name);
    expect(cur.current).toBe(3);
    expect(cur.states?.['4']?.retired).toMatchObject({ by: 'operator:bo' });
  });

  it('two reverts of the same current version, named or not: one reverts, the other is refused (current_changed or already_reverted)', async () => {
    for (let i = 0; i < ROUNDS; i++) {
      const name = `race.revert_revert_${i}`;
      await seed(name);
      const now = Date.now();
      const results = await Promise.all(
        [
          { kv: kvA, m: a, by: 'operator:ann' },
          { kv: kvB, m: b, by: 'operator:bo' },
        ].map(({ kv, m, by }) =>
          settle(
            applyRegistryCommand(
              { registryKv: kv, registry: m },
              name,
              // Odd rounds: as the CLI sends it without --from.
              { kind: 'revert', stopRunning: false, ...(i % 2 === 0 ? { from: 3 } : {}) },
              by,
              now,
            ),
          ),
        ),
      );
      expect(results.filter((r) => r.ok)).toHaveLength(1);
      expect(results.find((r) => !r.ok)).toMatchObject({
        err: { issues: [{ path: ['from'], code: i % 2 === 0 ? 'current_changed' : 'already_reverted' }] },
      });
      const { cur } = await stored(name);
      expect(cur.current).toBe(2);
      expect(cur.switches.filter((s) => s.reason === 'revert')).toHaveLength(1);
    }
  });
});
