/**
 * The pure part of `npm run matrix` (scripts/matrix.ts, test/matrix/report.ts): rows and gates
 * from test outcomes and their figures, the table, and the fault-matrix data against
 * docs/fault-matrix.md. No servers. Row ids are built with `fm()` so that no describe or test name
 * here names a row (the matrix run selects tests by the row ids in their names).
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { FAULT_MATRIX, GATES, rowIdsIn, rowPattern } from './matrix/fault-matrix.js';
import {
  aggregateFigures,
  buildReport,
  computeGates,
  gridName,
  parseMatrixDoc,
  renderGates,
  renderSummary,
  renderTable,
  wrap,
  type FileOutcome,
  type TestOutcome,
} from './matrix/report.js';
import { beyondOne, convergence, figure, rowsWhereRefused, takeoverFigure, type Figure } from './helpers/figures.js';

const fm = (n: number) => `FM-${String(n).padStart(2, '0')}`;
const ROOT = join(import.meta.dirname, '..');

const passed = (names: string[], figures?: Figure[], file = 'test/a.e2e.test.ts'): TestOutcome => ({
  project: 'main',
  file,
  names,
  state: 'passed',
  ...(figures ? { figures } : {}),
});
const failed = (names: string[], error: string, figures?: Figure[]): TestOutcome => ({
  project: 'main',
  file: 'test/a.e2e.test.ts',
  names,
  state: 'failed',
  errors: [error],
  ...(figures ? { figures } : {}),
});
const file = (path: string, rows: string[], errors: string[] = [], grid?: string): FileOutcome => ({
  project: grid ? 'matrix' : 'main',
  file: path,
  rows,
  errors,
  ...(grid ? { grid } : {}),
});

/** Tests that report every gate once, all passing. */
const gateReporters = (): TestOutcome[] => [
  passed(
    [`${fm(27)}: killed`, 'one row'],
    [{ name: 'kb rows for the key', value: 1, duplicates: 0, unknownTotal: 1, unknownConverged: 1 }],
  ),
  passed([`${fm(6)}: forged`, 'nothing written'], [rowsWhereRefused(0)]),
  passed([`${fm(16)}: canaries`, 'zero hits'], [{ name: 'canary hits', value: 0, leakedCanaries: 0 }]),
  passed(
    [`${fm(14)}: unknown past the deadline`, 'record'],
    [{ name: 'takeover record complete', value: true, takeoverTotal: 1, takeoverComplete: 1 }],
  ),
  passed(
    ['tenant-flood: junk for 30 s'],
    [{ name: 'other tenants: p99 ratio', value: 1.5, floodsMeasured: 1, floodsWithin2x: 1 }],
    'test/matrix/tenancy.matrix.test.ts',
  ),
];

describe('the fault-matrix data', () => {
  it('holds rows 01 to 32 in order, each with a situation and what must hold', () => {
    expect(FAULT_MATRIX.map((r) => r.id)).toEqual(Array.from({ length: 32 }, (_, i) => fm(i + 1)));
    for (const r of FAULT_MATRIX) expect(r.situation.length * r.mustHold.length).toBeGreaterThan(0);
  });

  it('agrees with the table in docs/fault-matrix.md, row for row and word for word', () => {
    expect(parseMatrixDoc(readFileSync(join(ROOT, 'docs', 'fault-matrix.md'), 'utf8'))).toEqual(FAULT_MATRIX);
  });

  it('a test belongs to every row its names name, once each; ids outside the matrix or longer are not rows', () => {
    expect(rowIdsIn(`${fm(12)} / ${fm(13)}: timeouts around the commit`)).toEqual([fm(12), fm(13)]);
    expect(rowIdsIn(`${fm(18)}/${fm(10)}: uniform 404s, and ${fm(10)} again`)).toEqual([fm(10), fm(18)]);
    expect(rowIdsIn(`takeover and manual resolution (${fm(14)})`)).toEqual([fm(14)]);
    expect(rowIdsIn(`${fm(3)} groundwork: a field outside target`)).toEqual([fm(3)]);
    expect(rowIdsIn(`${fm(33)} and ${fm(27)}0 and X${fm(1)}`)).toEqual([]);
  });

  it('a row pattern selects the tests of the given rows only, and of every row without any', () => {
    const some = rowPattern([fm(27), fm(13)]);
    expect(
      [`${fm(27)}: killed`, `x ${fm(12)} / ${fm(13)}`, `${fm(2)}: cut`, `${fm(27)}0`].map((n) => some.test(n)),
    ).toEqual([true, true, false, false]);
    expect(rowPattern().test(`a ${fm(5)} b`)).toBe(true);
    expect(rowPattern().test('one key, one execution')).toBe(false);
  });

  it('names a grid after its file', () => {
    expect(gridName('test/matrix/start-cluster.matrix.test.ts')).toBe('start-cluster');
    expect(gridName('test/matrix/clock-skew.matrix.test.ts')).toBe('clock-skew');
  });
});

describe('rows from test outcomes', () => {
  it('a row shows its figures aggregated by name, or its tests\' pass count; rows without a test print "no test" and do not fail the run', () => {
    const tests = [
      ...gateReporters(),
      passed([`${fm(27)}: killed`, 'in flight'], [{ name: 'kb rows for the key', value: 1, duplicates: 0 }]),
      passed([`${fm(4)}: two buckets`, 'two keys']),
      passed([`${fm(4)}: two buckets`, 'two records']),
    ];
    const report = buildReport({
      tests,
      files: [file('test/a.e2e.test.ts', [fm(4), fm(6), fm(14), fm(16), fm(27)])],
      wallMs: 1_000,
    });
    const row = (id: string) => report.rows.find((r) => r.id === id)!;
    expect(row(fm(27))).toMatchObject({
      status: 'pass',
      observed: 'kb rows for the key: 1 ×2',
      tests: { passed: 2, total: 2 },
    });
    expect(row(fm(4))).toMatchObject({ status: 'pass', observed: '2/2 tests' });
    for (const id of [fm(20), fm(21), fm(22)])
      expect(row(id)).toMatchObject({ status: 'no test', observed: 'no test' });
    expect(report.rows).toHaveLength(32);
    expect(report.summary).toMatchObject({
      ok: true,
      rows: { pass: 5, fail: 0, noTest: 27 },
      gates: { pass: 6, fail: 0 },
    });
  });

  it('a failed test fails its rows with its first error; its figures still show', () => {
    const tests = [
      ...gateReporters(),
      failed([`${fm(12)} / ${fm(13)}: held`, 'unknown then committed'], 'expected 2 to be 1', [
        { name: 'kb rows for the key', value: 2, duplicates: 1 },
      ]),
    ];
    const report = buildReport({ tests, files: [], wallMs: 1 });
    for (const id of [fm(12), fm(13)]) {
      expect(report.rows.find((r) => r.id === id)).toMatchObject({
        status: 'fail',
        observed: 'kb rows for the key: 2',
        failures: [{ test: `${fm(12)} / ${fm(13)}: held > unknown then committed`, error: 'expected 2 to be 1' }],
      });
    }
    expect(report.gates.find((g) => g.id === 'duplicates')).toMatchObject({ count: 1, status: 'fail' });
    expect(report.summary.ok).toBe(false);
  });

  it('a file that stopped outside its tests (a failed import or hook) fails every row its source names', () => {
    const report = buildReport({
      tests: gateReporters(),
      files: [file('test/b.e2e.test.ts', [fm(31)], ['Cannot find module'])],
      wallMs: 1,
    });
    expect(report.rows.find((r) => r.id === fm(31))).toMatchObject({
      status: 'fail',
      observed: 'did not run',
      failures: [{ test: 'test/b.e2e.test.ts', error: 'Cannot find module' }],
    });
    expect(report.summary.ok).toBe(false);
  });

  it('a figure naming its row belongs to that row only; numbers that differ show their range', () => {
    const tests = [
      ...gateReporters(),
      passed([`${fm(10)}/${fm(18)}: uniform 404s`], [{ row: fm(18), name: 'distinct answers', value: 1 }]),
      passed([`${fm(28)}: restarted`], [{ name: 'latency', value: 120, unit: 'ms' }]),
      passed([`${fm(28)}: restarted again`], [{ name: 'latency', value: 80, unit: 'ms' }]),
    ];
    const report = buildReport({ tests, files: [], wallMs: 1 });
    expect(report.rows.find((r) => r.id === fm(18))!.observed).toBe('distinct answers: 1');
    expect(report.rows.find((r) => r.id === fm(10))!.observed).toBe('1/1 tests');
    expect(report.rows.find((r) => r.id === fm(28))!.observed).toBe('latency: 80–120 ms over 2');
    expect(
      aggregateFigures([
        { name: 'final state', value: 'committed' },
        { name: 'final state', value: 'unknown' },
      ]),
    ).toBe('final state: committed, unknown');
  });

  it('a grid test whose figure names a row counts for that row too, and its failure fails it', () => {
    const cell = (state: TestOutcome['state']): TestOutcome => ({
      project: 'matrix',
      file: 'test/matrix/clock-skew.matrix.test.ts',
      names: ['clock-skew grid', 'executor +2 s'],
      state,
      figures: [{ row: fm(12), name: 'kb rows / keys', value: '4/4', duplicates: 0 }],
    });
    const files = [file('test/matrix/clock-skew.matrix.test.ts', [], [], 'clock-skew')];
    const report = buildReport({
      tests: [...gateReporters(), passed([`${fm(12)}: held`]), cell('passed')],
      files,
      wallMs: 1,
    });
    expect(report.rows.find((r) => r.id === fm(12))).toMatchObject({
      status: 'pass',
      observed: 'kb rows / keys: 4/4',
      tests: { total: 2 },
    });
    expect(report.grids[0]).toMatchObject({ id: 'clock-skew', observed: 'kb rows / keys: 4/4', status: 'pass' });
    const failing = buildReport({ tests: [...gateReporters(), cell('failed')], files, wallMs: 1 });
    expect(failing.rows.find((r) => r.id === fm(12))!.status).toBe('fail');
  });

  it('a grid is every test of its matrix file: its describe is the situation, its one test what must hold', () => {
    const grid = passed(
      ['npm start -- --cluster 3', 'comes up on three nodes'],
      undefined,
      'test/matrix/start-cluster.matrix.test.ts',
    );
    const report = buildReport({
      tests: [...gateReporters(), grid],
      files: [file(grid.file, [], [], 'start-cluster')],
      wallMs: 1,
    });
    expect(report.grids).toEqual([
      expect.objectContaining({
        id: 'start-cluster',
        kind: 'grid',
        situation: 'npm start -- --cluster 3',
        mustHold: 'comes up on three nodes',
        observed: '1/1 tests',
        status: 'pass',
      }),
    ]);
    const broken = buildReport({
      tests: [...gateReporters(), { ...grid, state: 'failed', errors: ['not up'] }],
      files: [file(grid.file, [], [], 'start-cluster')],
      wallMs: 1,
    });
    expect(broken.grids[0]!.status).toBe('fail');
    expect(broken.summary.ok).toBe(false);
  });

  it('with a selection, only the selected rows and grids are reported, and a gate none of them measures is "not run" without failing', () => {
    const report = buildReport({
      tests: [passed([`${fm(4)}: two buckets`, 'two keys'])],
      files: [file('test/matrix/x.matrix.test.ts', [], [], 'x')],
      selection: { rows: [fm(4)], grids: [] },
      wallMs: 1,
    });
    expect(report.rows.map((r) => r.id)).toEqual([fm(4)]);
    expect(report.grids).toEqual([]);
    expect(report.gates.map((g) => g.status)).toEqual(GATES.map(() => 'not run'));
    expect(report.summary.ok).toBe(true);
  });
});

describe('gates', () => {
  it('sums every reported count: zero gates pass at 0, share gates at 100 %', () => {
    const gates = computeGates(gateReporters(), false);
    expect(gates.map((g) => [g.id, g.status, g.observed])).toEqual([
      ['duplicates', 'pass', '0 (1 report)'],
      ['unknown', 'pass', '1/1 = 100 % (1 report)'],
      ['unauthorised', 'pass', '0 (1 report)'],
      ['canaries', 'pass', '0 (1 report)'],
      ['takeover', 'pass', '1/1 = 100 % (1 report)'],
      ['tenant-p99', 'pass', '1/1 = 100 % (1 report)'],
    ]);
  });

  it('a gate no test reports is "not measured" and fails the run; so does a share gate whose tests saw nothing to count', () => {
    const tests = gateReporters().filter((t) => !t.names[0]!.startsWith(fm(16)));
    tests[0] = passed(tests[0]!.names, [
      { name: 'kb rows for the key', value: 1, duplicates: 0, ...convergence(['accepted', 'running', 'committed']) },
    ]);
    const report = buildReport({ tests, files: [], wallMs: 1 });
    expect(report.gates.find((g) => g.id === 'canaries')).toMatchObject({
      status: 'not measured',
      observed: 'no test reports it',
    });
    expect(report.gates.find((g) => g.id === 'unknown')).toMatchObject({
      status: 'not measured',
      observed: '0/0: none of 1 report saw one',
    });
    expect(report.summary).toMatchObject({ ok: false, gates: { notMeasured: 2 } });
  });

  it('an unknown that never converged, an incomplete takeover record, a leaked canary, an unauthorised row and a flood past 2× each fail their gate', () => {
    const tests = [
      passed(
        [`${fm(12)}: held`],
        [{ name: 'final state', value: 'unknown', duplicates: 0, ...convergence(['accepted', 'running', 'unknown']) }],
      ),
      passed([`${fm(14)}: record`], [takeoverFigure({ operationKey: 'x' })]),
      passed([`${fm(16)}: canaries`], [{ name: 'canary hits', value: 2, leakedCanaries: 2 }]),
      passed([`${fm(9)}: batch`], [rowsWhereRefused(1)]),
      passed(
        ['tenant-flood: junk for 30 s'],
        [{ name: 'other tenants: p99 ratio', value: 2.4, floodsMeasured: 1, floodsWithin2x: 0 }],
        'test/matrix/tenancy.matrix.test.ts',
      ),
    ];
    expect(computeGates(tests, false).map((g) => [g.id, g.status])).toEqual([
      ['duplicates', 'pass'],
      ['unknown', 'fail'],
      ['unauthorised', 'fail'],
      ['canaries', 'fail'],
      ['takeover', 'fail'],
      ['tenant-p99', 'fail'],
    ]);
  });
});

describe('the figures helper', () => {
  it("appends figures to the test's meta and returns the value; a gate count must be a non-negative integer", () => {
    const task = { meta: {} };
    expect(figure(task, { name: 'kb rows for the key', value: 1, duplicates: beyondOne(1) })).toBe(1);
    figure(task, { row: fm(27), name: 'final state', value: 'committed' });
    expect(task.meta).toEqual({
      figures: [
        { name: 'kb rows for the key', value: 1, duplicates: 0 },
        { row: fm(27), name: 'final state', value: 'committed' },
      ],
    });
    expect(() => figure(task, { name: 'rows', value: 1, duplicates: -1 })).toThrow(/count/);
    expect(() => figure(task, { row: 'row 27', name: 'rows', value: 1 })).toThrow(/FM id/);
  });

  it('counts an operation as converged once it went unknown and then committed, was rejected or was handed over', () => {
    expect(convergence(['accepted', 'running', 'committed'])).toEqual({ unknownTotal: 0, unknownConverged: 0 });
    expect(convergence(['accepted', 'running', 'unknown', 'requeued', 'running', 'committed'])).toEqual({
      unknownTotal: 1,
      unknownConverged: 1,
    });
    expect(convergence(['accepted', 'running', 'unknown', 'takeover'])).toEqual({
      unknownTotal: 1,
      unknownConverged: 1,
    });
    expect(convergence(['accepted', 'running', 'unknown', 'requeued'])).toEqual({
      unknownTotal: 1,
      unknownConverged: 0,
    });
  });

  it('a takeover record is complete with its evidence, its run and unknown times, and for a probe mismatch what was probed', () => {
    const record = {
      operationKey: `opk_${'a'.repeat(43)}`,
      tenant: 'acme',
      taskId: 't',
      tool: 'kb.write_note',
      version: 1,
      targetDigest: `sha256:${'b'.repeat(64)}`,
      inputDigest: `sha256:${'c'.repeat(64)}`,
      reason: 'unknown_past_deadline',
      lastEvidence: { kind: 'timeout', at: 3 },
      attempts: { attempt: 1, requeues: 0, probes: 2 },
      times: { acceptedAt: 1, runningAt: 2, unknownSince: 3, openedAt: 4 },
    };
    expect(takeoverFigure(record)).toMatchObject({
      name: 'takeover record complete',
      value: true,
      takeoverTotal: 1,
      takeoverComplete: 1,
      unknownTotal: 1,
      unknownConverged: 1,
    });
    expect(takeoverFigure({ ...record, lastEvidence: undefined })).toMatchObject({
      value: false,
      takeoverTotal: 1,
      takeoverComplete: 0,
      unknownConverged: 1,
    });
    expect(takeoverFigure({ ...record, reason: 'probe_mismatch' })).toMatchObject({ takeoverComplete: 0 });
    expect(takeoverFigure(undefined)).toMatchObject({ takeoverTotal: 1, takeoverComplete: 0, unknownConverged: 0 });
  });
});

describe('rendering', () => {
  it('wraps each cell at its column width and keeps every word', () => {
    const text = "same key with other parameters (fields outside the key's target and intent)";
    const lines = wrap(text, 20);
    expect(Math.max(...lines.map((l) => l.length))).toBeLessThanOrEqual(20);
    expect(lines.join(' ')).toBe(text);
    expect(wrap('a'.repeat(25), 10)).toEqual(['a'.repeat(10), 'a'.repeat(10), 'a'.repeat(5)]);
  });

  it('prints one table line (or more, wrapped) per row, the gates and a summary', () => {
    const report = buildReport({ tests: gateReporters(), files: [], wallMs: 125_000 });
    const table = renderTable(report, 140);
    for (const r of FAULT_MATRIX) expect(table).toContain(r.id);
    expect(Math.max(...table.split('\n').map((l) => l.length))).toBeLessThanOrEqual(140);
    expect(table).toMatch(new RegExp(`${fm(20)}.*no test`));
    expect(renderGates(report)).toMatch(/duplicate side effects\s+│ 0\s+│ 0 \(1 report\)\s+│ pass/);
    expect(renderSummary(report)).toBe(
      'PASS: rows 4 pass, 0 fail, 28 no test · grids 0 pass, 0 fail · gates 6/6 pass · tests 5 passed, 0 failed · 2 min 5 s',
    );
  });
});
