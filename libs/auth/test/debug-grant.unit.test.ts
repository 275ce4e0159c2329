/**
 * The debug grant (docs/debug-samples.md): exactly one more subject for a granted operator, and
 * the executor's access to the sampling buckets — nobody else's.
 */
import { describe, expect, it } from 'vitest';
import { Subjects } from '@tooltx/nats';
import { topology } from '@tooltx/streams';
import { checkIdentityList, debuggingOperators, permissionsFor, type IdentityList } from '../src/index.js';

const list: IdentityList = {
  tenants: [{ id: 'acme', actors: ['alice'], auditors: ['audrey'] }],
  operators: ['oscar', { id: 'dora', may: ['debug'] }, { id: `d${'x'.repeat(63)}`, may: ['debug'] }],
};
const s = new Subjects('tq');
const topo = topology(s);
const perms = (operator: string) =>
  permissionsFor({ kind: 'operator', operator }, s, topo, [], ['acme'], [], [], [], debuggingOperators(list));
const touchesSampling = (subjects: string[]) =>
  subjects.filter(
    (x) => x.includes('_sampling') || x.includes('_samples') || x.includes('.ops.debug') || x.includes('_debug'),
  );

describe('the debug grant', () => {
  it('given an operator granted debug, then it may publish its own debug subject and nothing else more than an ungranted one', () => {
    expect(debuggingOperators(list)).toEqual(['dora', `d${'x'.repeat(63)}`]);
    const granted = perms('dora').publish.allow;
    const plain = permissionsFor({ kind: 'operator', operator: 'dora' }, s, topo, [], ['acme']).publish.allow;
    expect(granted.filter((x) => !plain.includes(x))).toEqual(['tq.ops.debug.dora']);
    expect(perms('dora').subscribe).toEqual(
      permissionsFor({ kind: 'operator', operator: 'dora' }, s, topo, [], ['acme']).subscribe,
    );
    expect(touchesSampling(perms('oscar').publish.allow)).toEqual([]);
  });

  it('given the roles, then only the executor reaches the sampling buckets, the debug requests and their audit-log subject', () => {
    const executor = permissionsFor({ kind: 'service', service: 'executor' }, s, topo, [], ['acme']);
    expect(executor.subscribe.allow).toContain('tq.ops.debug.*');
    expect(executor.publish.allow).toEqual(
      expect.arrayContaining([
        '$KV.tq_sampling.>',
        '$KV.tq_samples.>',
        '$JS.API.STREAM.PURGE.KV_tq_samples',
        'tq.auditlog._debug.*',
      ]),
    );
    // Its only purge is the samples bucket's stream.
    expect(executor.publish.allow.filter((x) => x.includes('.PURGE.'))).toEqual(['$JS.API.STREAM.PURGE.KV_tq_samples']);
    for (const role of [
      { kind: 'agent', tenant: 'acme', actor: 'alice' },
      { kind: 'auditor', tenant: 'acme', actor: 'audrey' },
      { kind: 'service', service: 'authorizer' },
      { kind: 'service', service: 'reconciler' },
      { kind: 'service', service: 'audit-projector' },
    ] as const) {
      const p = permissionsFor(role, s, topo, [], ['acme'], [], [], [], debuggingOperators(list));
      // Start-up checks read every bucket's info; nothing else of the sampling buckets.
      const reach = touchesSampling([...p.publish.allow, ...p.subscribe.allow]).filter(
        (x) => !x.startsWith('$JS.API.STREAM.INFO.'),
      );
      expect([role.kind, reach]).toEqual([role.kind, []]);
    }
  });

  it('given a debugging operator with a 64-character id, then the list is accepted: a debug request is not an intent under _op-<id>', () => {
    expect(() => checkIdentityList(list)).not.toThrow();
  });
});
