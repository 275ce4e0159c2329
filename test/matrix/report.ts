/**
 * The pure part of `npm run matrix` (scripts/matrix.ts): from the tests' outcomes and the figures
 * they reported, the report — one entry per fault-matrix row and per grid (a file of test/matrix/),
 * the gates, a summary — and its text rendering. No I/O, so it is unit-tested on its own
 * (test/matrix-report.unit.test.ts).
 */
import type { Figure } from '../helpers/figures.js';
import { FAULT_MATRIX, GATE_COUNT_NAMES, GATES, rowIdsIn, type FaultRow } from './fault-matrix.js';

/** One test as the run saw it. */
export interface TestOutcome {
  project: string;
  /** Path relative to the repository. */
  file: string;
  /** The names of its enclosing describes, then its own. */
  names: string[];
  state: 'passed' | 'failed' | 'skipped' | 'pending';
  durationMs?: number;
  /** The first line of each error, for a failed test. */
  errors?: string[];
  figures?: Figure[];
}

/** One test file of the run. */
export interface FileOutcome {
  project: string;
  file: string;
  /** The rows its source names (read before the run), so a file that fails to load still counts against them. */
  rows: string[];
  /** The grid it is, for a file of test/matrix/. */
  grid?: string;
  /** Errors outside any test: the file failed to load, or a hook before or after its tests threw. */
  errors: string[];
}

/** What a run was asked for (`--rows`); absent: the whole matrix. */
export interface Selection {
  rows: string[];
  grids: string[];
}

export interface MatrixInput {
  tests: TestOutcome[];
  files: FileOutcome[];
  selection?: Selection;
  unhandledErrors?: string[];
  wallMs: number;
}

export type EntryStatus = 'pass' | 'fail' | 'no test' | 'skipped';

export interface EntryReport {
  id: string;
  kind: 'row' | 'grid';
  situation: string;
  mustHold: string;
  files: string[];
  tests: { passed: number; failed: number; skipped: number; total: number };
  figures: (Figure & { test: string })[];
  /** The figures, aggregated by name; without any, the tests' pass count. */
  observed: string;
  status: EntryStatus;
  failures: { test: string; error: string }[];
}

export type GateStatus = 'pass' | 'fail' | 'not measured' | 'not run';

export interface GateReport {
  id: string;
  title: string;
  mustHold: string;
  /** Figures (one per reporting test, usually) that carried this gate's count. */
  reportedBy: number;
  count: number;
  of?: number;
  observed: string;
  status: GateStatus;
}

export interface MatrixSummary {
  rows: { pass: number; fail: number; noTest: number; skipped: number };
  grids: { pass: number; fail: number; skipped: number };
  gates: { pass: number; fail: number; notMeasured: number; notRun: number };
  tests: { passed: number; failed: number; skipped: number };
  unhandledErrors: number;
  wallMs: number;
  ok: boolean;
}

export interface MatrixReport {
  rows: EntryReport[];
  grids: EntryReport[];
  gates: GateReport[];
  unhandledErrors: string[];
  summary: MatrixSummary;
}

export const fullName = (t: Pick<TestOutcome, 'names'>): string => t.names.join(' > ');

/** `start-cluster` for `test/matrix/start-cluster.matrix.test.ts`. */
export function gridName(file: string): string {
  const base = file.split('/').at(-1) ?? file;
  return base.replace(/\.matrix\.test\.ts$/, '').replace(/\.test\.ts$/, '');
}

/** A number as the table prints it: integers plain, others to two decimals. */
const num = (n: number): string => (Number.isInteger(n) ? String(n) : n.toFixed(2));

/**
 * The figures of an entry by name, in the order first reported: one value (`name: 1`, `name: 1 ×8`
 * when eight tests saw the same), a range of numbers (`name: 0–2 over 8`), or the distinct values.
 */
export function aggregateFigures(figures: readonly Figure[]): string {
  const byName = new Map<string, Figure[]>();
  for (const f of figures) byName.set(f.name, [...(byName.get(f.name) ?? []), f]);
  const parts: string[] = [];
  for (const [name, fs] of byName) {
    const unit = fs[0]!.unit ? ` ${fs[0]!.unit}` : '';
    const values = fs.map((f) => f.value);
    const distinct = [...new Set(values.map(String))];
    let text: string;
    if (distinct.length === 1)
      text = `${typeof values[0] === 'number' ? num(values[0]) : distinct[0]}${unit}${fs.length > 1 ? ` ×${fs.length}` : ''}`;
    else if (values.every((v) => typeof v === 'number')) {
      const ns = values as number[];
      text = `${num(Math.min(...ns))}–${num(Math.max(...ns))}${unit} over ${fs.length}`;
    } else text = distinct.join(', ');
    parts.push(`${name}: ${text}`);
  }
  return parts.join('; ');
}

function entry(
  id: string,
  kind: 'row' | 'grid',
  situation: string,
  mustHold: string,
  tests: TestOutcome[],
  files: FileOutcome[],
  figureFilter: (f: Figure, t: TestOutcome) => boolean,
): EntryReport {
  const count = (s: TestOutcome['state']) => tests.filter((t) => t.state === s).length;
  const passed = count('passed');
  const failed = count('failed');
  const skipped = count('skipped') + count('pending');
  const figures = tests.flatMap((t) =>
    (t.figures ?? []).filter((f) => figureFilter(f, t)).map((f) => ({ ...f, test: fullName(t) })),
  );
  const failures = [
    ...tests.filter((t) => t.state === 'failed').map((t) => ({ test: fullName(t), error: t.errors?.[0] ?? 'failed' })),
    ...files.flatMap((f) => f.errors.map((error) => ({ test: f.file, error }))),
  ];
  const total = tests.length;
  const fileList = [...new Set([...tests.map((t) => t.file), ...files.map((f) => f.file)])];
  let status: EntryStatus;
  if (failures.length > 0) status = 'fail';
  else if (total === 0) status = 'no test';
  else if (passed === 0) status = 'skipped';
  else status = 'pass';
  const counted = `${passed}/${total} tests${skipped ? ` (${skipped} skipped)` : ''}`;
  const observed =
    figures.length > 0 ? aggregateFigures(figures) : total > 0 ? counted : files.length > 0 ? 'did not run' : 'no test';
  return {
    id,
    kind,
    situation,
    mustHold,
    files: fileList,
    tests: { passed, failed, skipped, total },
    figures,
    observed,
    status,
    failures,
  };
}

/** The rows a test belongs to: the ids its names name. */
const rowsOf = (t: TestOutcome): string[] => rowIdsIn(t.names.join(' '));

/**
 * The entry of a fault-matrix row: every test naming it, from any project, and every test that
 * reported a figure for it (a grid's test names no row, yet may measure one).
 */
export function rowEntry(row: FaultRow, tests: readonly TestOutcome[], files: readonly FileOutcome[]): EntryReport {
  const mine = tests.filter((t) => rowsOf(t).includes(row.id) || (t.figures ?? []).some((f) => f.row === row.id));
  // A file that stopped outside its tests counts against every row its source names.
  const broken = files.filter((f) => f.errors.length > 0 && f.rows.includes(row.id));
  return entry(row.id, 'row', row.situation, row.mustHold, mine, broken, (f) =>
    f.row === undefined ? true : f.row === row.id,
  );
}

/** The entry of a grid: every test of its file. Its situation is its top-level describes; what must hold, its test (or the count). */
export function gridEntry(file: FileOutcome, tests: readonly TestOutcome[]): EntryReport {
  const mine = tests.filter((t) => t.file === file.file);
  const suites = [...new Set(mine.filter((t) => t.names.length > 1).map((t) => t.names[0]!))];
  const situation = suites.length > 0 ? suites.join('; ') : file.file;
  const mustHold =
    mine.length === 1
      ? mine[0]!.names.at(-1)!
      : mine.length === 0
        ? 'every test passes'
        : `each of its ${mine.length} tests passes`;
  return entry(
    file.grid ?? gridName(file.file),
    'grid',
    situation,
    mustHold,
    mine,
    file.errors.length > 0 ? [file] : [],
    () => true,
  );
}

const reports = (n: number) => `${n} report${n === 1 ? '' : 's'}`;

/** Every gate from the gate counts of every figure of the run (a failed test's figures count too). */
export function computeGates(tests: readonly TestOutcome[], filtered: boolean): GateReport[] {
  const figures = tests.flatMap((t) => t.figures ?? []);
  return GATES.map((g) => {
    const reporting = figures.filter((f) => f[g.of ?? g.count] !== undefined);
    const count = reporting.reduce((n, f) => n + (f[g.count] ?? 0), 0);
    const unmeasured: GateStatus = filtered ? 'not run' : 'not measured';
    if (g.kind === 'zero') {
      const status: GateStatus = reporting.length === 0 ? unmeasured : count === 0 ? 'pass' : 'fail';
      const observed = reporting.length === 0 ? 'no test reports it' : `${count} (${reports(reporting.length)})`;
      return { id: g.id, title: g.title, mustHold: g.mustHold, reportedBy: reporting.length, count, observed, status };
    }
    const of = reporting.reduce((n, f) => n + (f[g.of!] ?? 0), 0);
    let status: GateStatus;
    let observed: string;
    if (reporting.length === 0) [status, observed] = [unmeasured, 'no test reports it'];
    else if (of === 0) [status, observed] = [unmeasured, `0/0: none of ${reports(reporting.length)} saw one`];
    else {
      status = count === of ? 'pass' : 'fail';
      observed = `${count}/${of} = ${num(Math.floor((count / of) * 10_000) / 100)} % (${reports(reporting.length)})`;
    }
    return {
      id: g.id,
      title: g.title,
      mustHold: g.mustHold,
      reportedBy: reporting.length,
      count,
      of,
      observed,
      status,
    };
  });
}

export function buildReport(input: MatrixInput): MatrixReport {
  const { tests, files, selection } = input;
  const filtered = selection !== undefined;
  const rows = FAULT_MATRIX.filter((r) => !filtered || selection.rows.includes(r.id)).map((r) =>
    rowEntry(r, tests, files),
  );
  const grids = files
    .filter((f) => f.grid !== undefined && (!filtered || selection.grids.includes(f.grid)))
    .map((f) => gridEntry(f, tests));
  const gates = computeGates(tests, filtered);
  const unhandledErrors = input.unhandledErrors ?? [];
  const rowCount = (s: EntryStatus) => rows.filter((r) => r.status === s).length;
  const gridCount = (s: EntryStatus) => grids.filter((r) => r.status === s).length;
  const gateCount = (s: GateStatus) => gates.filter((g) => g.status === s).length;
  const testCount = (s: TestOutcome['state']) => tests.filter((t) => t.state === s).length;
  // Files broken outside any row or grid (they named no row of the selection) still fail the run.
  const strayFileErrors = files.some((f) => f.errors.length > 0);
  const ok =
    rowCount('fail') === 0 &&
    gridCount('fail') === 0 &&
    gateCount('fail') === 0 &&
    gateCount('not measured') === 0 &&
    unhandledErrors.length === 0 &&
    !strayFileErrors &&
    testCount('failed') === 0 &&
    testCount('passed') > 0;
  return {
    rows,
    grids,
    gates,
    unhandledErrors,
    summary: {
      rows: {
        pass: rowCount('pass'),
        fail: rowCount('fail'),
        noTest: rowCount('no test'),
        skipped: rowCount('skipped'),
      },
      grids: { pass: gridCount('pass'), fail: gridCount('fail'), skipped: gridCount('skipped') },
      gates: {
        pass: gateCount('pass'),
        fail: gateCount('fail'),
        notMeasured: gateCount('not measured'),
        notRun: gateCount('not run'),
      },
      tests: {
        passed: testCount('passed'),
        failed: testCount('failed'),
        skipped: testCount('skipped') + testCount('pending'),
      },
      unhandledErrors: unhandledErrors.length,
      wallMs: input.wallMs,
      ok,
    },
  };
}

/** `text` in lines of at most `width` characters, broken at spaces (a longer word is cut). */
export function wrap(text: string, width: number): string[] {
  const lines: string[] = [];
  let line = '';
  for (let word of text.split(/\s+/).filter(Boolean)) {
    while (word.length > width) {
      if (line) lines.push(line);
      lines.push(word.slice(0, width));
      word = word.slice(width);
      line = '';
    }
    if (!line) line = word;
    else if (line.length + 1 + word.length <= width) line += ` ${word}`;
    else {
      lines.push(line);
      line = word;
    }
  }
  if (line || lines.length === 0) lines.push(line);
  return lines;
}

/** A text table: `rows` of cells, each column wrapped at its width, columns separated by ` │ `. */
export function textTable(header: string[], rows: string[][], widths: number[]): string {
  const rule = widths.map((w) => '─'.repeat(w)).join('─┼─');
  const render = (cells: string[]) => {
    const wrapped = cells.map((c, i) => wrap(c, widths[i]!));
    const height = Math.max(...wrapped.map((w) => w.length));
    return Array.from({ length: height }, (_, l) =>
      wrapped
        .map((w, i) => (w[l] ?? '').padEnd(widths[i]!))
        .join(' │ ')
        .trimEnd(),
    ).join('\n');
  };
  return [render(header), rule, ...rows.map(render)].join('\n');
}

/** The report's table: row, situation, what must hold, the observed figure, the result. */
export function renderTable(report: MatrixReport, width = 160): string {
  const entries = [...report.rows, ...report.grids];
  const idWidth = Math.max(5, ...entries.map((e) => e.id.length));
  const resultWidth = 7;
  // What is left after the id and result columns and the separators, shared 3 : 3 : 4.
  const rest = Math.max(60, width - idWidth - resultWidth - 4 * 3);
  const widths = [
    idWidth,
    Math.floor(rest * 0.3),
    Math.floor(rest * 0.3),
    rest - 2 * Math.floor(rest * 0.3),
    resultWidth,
  ];
  const rows = entries.map((e) => [e.id, e.situation, e.mustHold, e.observed, e.status]);
  const table = textTable(
    ['row', 'situation', 'what must hold', 'observed', 'result'],
    rows.slice(0, report.rows.length),
    widths,
  );
  if (report.grids.length === 0) return table;
  // The grids under their own header: their first column is a file's name, not a row id.
  const grids = textTable(
    ['grid', 'situation', 'what must hold', 'observed', 'result'],
    rows.slice(report.rows.length),
    widths,
  );
  return `${table}\n\n${grids}`;
}

export function renderGates(report: MatrixReport): string {
  const widths = [
    Math.max(...report.gates.map((g) => g.title.length)),
    9,
    Math.max(8, ...report.gates.map((g) => g.observed.length)),
    12,
  ];
  return textTable(
    ['gate', 'must be', 'observed', 'result'],
    report.gates.map((g) => [g.title, g.mustHold, g.observed, g.status]),
    widths,
  );
}

/** `12 min 3 s`, `41 s`, `2.4 s`, `180 ms`. */
export function duration(ms: number): string {
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 10_000) return `${(ms / 1000).toFixed(1)} s`;
  const s = Math.round(ms / 1000);
  return s >= 60 ? `${Math.floor(s / 60)} min ${s % 60} s` : `${s} s`;
}

export function renderSummary(report: MatrixReport): string {
  const s = report.summary;
  const parts = [
    `rows ${s.rows.pass} pass, ${s.rows.fail} fail, ${s.rows.noTest} no test${s.rows.skipped ? `, ${s.rows.skipped} skipped` : ''}`,
    `grids ${s.grids.pass} pass, ${s.grids.fail} fail${s.grids.skipped ? `, ${s.grids.skipped} skipped` : ''}`,
    `gates ${s.gates.pass}/${report.gates.length} pass${s.gates.notRun ? ` (${s.gates.notRun} not run)` : ''}`,
    `tests ${s.tests.passed} passed, ${s.tests.failed} failed${s.tests.skipped ? `, ${s.tests.skipped} skipped` : ''}`,
    ...(s.unhandledErrors ? [`${s.unhandledErrors} unhandled errors`] : []),
    duration(s.wallMs),
  ];
  return `${s.ok ? 'PASS' : 'FAIL'}: ${parts.join(' · ')}`;
}

/** Each failure of a failed row or grid, once: `FM-27  test name: first error line`. */
export function renderFailures(report: MatrixReport): string {
  const seen = new Set<string>();
  const lines: string[] = [];
  for (const e of [...report.rows, ...report.grids]) {
    for (const f of e.failures) {
      const key = `${f.test}\n${f.error}`;
      if (seen.has(key)) continue;
      seen.add(key);
      lines.push(`${e.id}  ${f.test}\n    ${f.error}`);
    }
  }
  for (const err of report.unhandledErrors) lines.push(`unhandled  ${err}`);
  return lines.join('\n');
}

/**
 * The rows of the fault-matrix table in a Markdown document: the table whose header is
 * `| row | situation | what must hold |`, one `| FM-xx | situation | must hold |` line per row.
 */
export function parseMatrixDoc(markdown: string): FaultRow[] {
  const lines = markdown.split('\n');
  const header = lines.findIndex((l) => /^\|\s*row\s*\|\s*situation\s*\|\s*what must hold\s*\|\s*$/.test(l));
  const out: FaultRow[] = [];
  if (header < 0) return out;
  for (const line of lines.slice(header + 2)) {
    if (!line.startsWith('|')) break;
    const m = /^\|\s*(\S+)\s*\|(.*)\|(.*)\|\s*$/.exec(line);
    if (m) out.push({ id: m[1]!, situation: m[2]!.trim(), mustHold: m[3]!.trim() });
  }
  return out;
}

/** Whether `f` carries any gate count (for the progress line). */
export const hasGateCount = (f: Figure): boolean => GATE_COUNT_NAMES.some((k) => f[k] !== undefined);
