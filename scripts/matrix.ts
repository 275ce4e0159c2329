/**
 * `npm run matrix`: the fault matrix as one command (docs/fault-matrix.md). Runs, through vitest's
 * Node API and one vitest run, every test of the `main` and `cluster` projects whose describe or
 * test name names a row (`FM-xx`), and every test of the `matrix` project (test/matrix/*.test.ts,
 * the heavy grids) — all against real processes, with the projects' own settings (workers,
 * timeouts, order). A reporter prints progress as files and tests finish and collects each test's
 * result and the figures it reported (test/helpers/figures.ts); test/matrix/report.ts turns them
 * into the table, the gates and the exit code.
 */
import { readFileSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Command, InvalidArgumentError, Option } from 'commander';
import { createVitest, type Reporter, type TestCase, type TestModule, type TestSpecification } from 'vitest/node';
import { FAULT_MATRIX, rowIdsIn, rowPattern } from '../test/matrix/fault-matrix.js';
import {
  aggregateFigures,
  buildReport,
  duration,
  fullName,
  gridName,
  renderFailures,
  renderGates,
  renderSummary,
  renderTable,
  type FileOutcome,
  type Selection,
  type TestOutcome,
} from '../test/matrix/report.js';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..');
/** The projects whose FM-named tests are rows of the matrix; every test of MATRIX_PROJECT is a grid. */
const ROW_PROJECTS = ['main', 'cluster'] as const;
const MATRIX_PROJECT = 'matrix';

function columns(v: string): number {
  const n = Number(v);
  if (!Number.isInteger(n) || n < 80) throw new InvalidArgumentError('a whole number of columns, 80 or more');
  return n;
}

const program = new Command('npm run matrix --')
  .description(
    'Run every fault-matrix row that has a test (FM-01…FM-32: the FM-named tests of the main and cluster projects) and every grid of test/matrix/, against real processes; print a table of the rows with what each test measured, and the gates.',
  )
  .option(
    '--json',
    'print one JSON document (rows, grids, gates, summary) as the last line of stdout; progress goes to stderr',
  )
  .option(
    '--rows <ids>',
    'only these rows and grids, comma-separated (FM-27,FM-13,start-cluster); gates no selected test measures print "not run"',
  )
  .option('--list', 'list the rows and grids with the test files that name them, and exit without running anything')
  .addOption(
    new Option('--width <columns>', 'width of the table')
      .argParser(columns)
      .default(
        process.stdout.columns && process.stdout.columns > 80 ? process.stdout.columns : 160,
        "the terminal's, or 160",
      ),
  )
  .addHelpText(
    'after',
    `
Output: progress while it runs (each file as it starts and ends with its rows, each test with the
figures it reported, files and tests done), then one table line per row (row, situation, what must
hold, the observed figure, pass/fail/no test) and per grid, then the gates: duplicate side effects 0,
unknown converged or handed over 100 %, unauthorised writes 0, leaked canaries 0, takeover records
complete. A gate no test reports fails the run. A row with no test prints "no test" and does not.

With --json, the document is stdout's last line; \`npm run -s matrix -- --json\` (npm's -s) keeps npm's
own banner off stdout, so stdout is the document alone.

Exit code: 0 when every row and grid that ran passed and every gate passed; 1 otherwise; 2 for a
usage error (an unknown row, nothing to run).`,
  );
// A usage error exits 2, as the help says (commander's own is 1, the code of a failed run).
program.exitOverride((err) => process.exit(err.exitCode === 0 ? 0 : 2));
program.parse();
const opts = program.opts<{ json?: boolean; rows?: string; list?: boolean; width: number }>();

const out = opts.json ? process.stderr : process.stdout;
const say = (line = '') => void out.write(`${line}\n`);
const usage = (message: string): never => {
  process.stderr.write(`matrix: ${message} (see --help)\n`);
  process.exit(2);
};

/** A candidate test file: its project, its source's rows, its grid name (matrix files). */
interface Candidate {
  project: string;
  moduleId: string;
  file: string;
  rows: string[];
  grid?: string;
}
/** A file the run will run, and the name pattern of the tests it runs of it (undefined: all). */
interface Planned {
  c: Candidate;
  pattern: RegExp | undefined;
}

/** Collects every test's outcome and figures, and prints progress. */
class MatrixReporter implements Reporter {
  readonly tests: TestOutcome[] = [];
  readonly files: FileOutcome[] = [];
  private filesDone = 0;
  private testsDone = 0;
  private testsFailed = 0;
  private testsPlanned = 0;
  private collected = 0;
  private readonly rowsLeft = new Map<string, number>();
  private planned: Planned[] = [];
  private byModule = new Map<string, Planned>();
  private selection: Selection | undefined;

  /** What the run will do, once the files are chosen (before it starts). */
  plan(planned: Planned[], selection: Selection | undefined): void {
    this.planned = planned;
    this.byModule = new Map(planned.map((p) => [p.c.moduleId, p]));
    this.selection = selection;
    for (const { c } of planned) for (const r of this.rowsOf(c)) this.rowsLeft.set(r, (this.rowsLeft.get(r) ?? 0) + 1);
  }

  /** The rows of the selection a candidate file names. */
  private rowsOf(c: Candidate): string[] {
    return c.rows.filter((r) => !this.selection || this.selection.rows.includes(r));
  }

  /** Whether `t` is one of the tests the run asked for (the others of a file are skipped by its name pattern). */
  private wanted(t: TestCase): boolean {
    const p = this.byModule.get(t.module.moduleId)?.pattern;
    return !p || p.test(namesOf(t).join(' '));
  }

  onTestRunStart(): void {
    const count = (project: string) => this.planned.filter((p) => p.c.project === project).length;
    const rows = [...this.rowsLeft.keys()].sort();
    say(
      `fault matrix: ${this.planned.length} files (main ${count('main')}, cluster ${count('cluster')}, matrix ${count(MATRIX_PROJECT)}); rows named by a test file: ${rows.length}${this.selection ? ` of the ${this.selection.rows.length} selected` : ` of ${FAULT_MATRIX.length}`}`,
    );
  }

  onTestModuleCollected(m: TestModule): void {
    const p = this.byModule.get(m.moduleId);
    const n = [...m.children.allTests()].filter((t) => t.options.mode !== 'skip' && this.wanted(t)).length;
    this.testsPlanned += n;
    this.collected++;
    const what = p?.c.grid ? `grid ${p.c.grid}` : (p ? this.rowsOf(p.c) : []).join(' ');
    say(`▶ ${relative(ROOT, m.moduleId)} [${m.project.name}] ${what} — ${n} test${n === 1 ? '' : 's'}`);
  }

  onTestCaseResult(t: TestCase): void {
    if (!this.wanted(t)) return;
    const r = t.result();
    this.testsDone++;
    if (r.state === 'failed') this.testsFailed++;
    const mark = r.state === 'passed' ? '✓' : r.state === 'failed' ? '✗' : '-';
    const figures = aggregateFigures(t.meta().figures ?? []);
    const ms = t.diagnostic()?.duration;
    const total = this.collected === this.planned.length ? String(this.testsPlanned) : `${this.testsPlanned}+`;
    say(
      `  ${mark} [${this.testsDone}/${total}] ${fullName({ names: namesOf(t) })}${ms !== undefined ? ` (${duration(ms)})` : ''}${figures ? ` · ${figures}` : ''}`,
    );
    if (r.state === 'failed') for (const e of r.errors.slice(0, 1)) say(`      ${firstLine(e.message ?? String(e))}`);
    if (r.state === 'skipped' && r.note) say(`      skipped: ${r.note}`);
  }

  onTestModuleEnd(m: TestModule): void {
    const p = this.byModule.get(m.moduleId);
    const file = relative(ROOT, m.moduleId);
    const errors = [...m.errors(), ...[...m.children.allSuites()].flatMap((s) => s.errors())].map((e) =>
      firstLine(e.message ?? String(e)),
    );
    const mine: TestOutcome[] = [];
    for (const t of m.children.allTests()) {
      if (!this.wanted(t)) continue;
      const r = t.result();
      mine.push({
        project: m.project.name,
        file,
        names: namesOf(t),
        state: r.state,
        ...(t.diagnostic() ? { durationMs: Math.round(t.diagnostic()!.duration) } : {}),
        ...(r.state === 'failed' ? { errors: r.errors.map((e) => firstLine(e.message ?? String(e))) } : {}),
        ...(t.meta().figures ? { figures: t.meta().figures } : {}),
      });
    }
    this.tests.push(...mine);
    this.files.push({
      project: m.project.name,
      file,
      rows: p ? this.rowsOf(p.c) : [],
      ...(p?.c.grid ? { grid: p.c.grid } : {}),
      errors,
    });
    this.filesDone++;
    const finished: string[] = [];
    for (const r of p ? this.rowsOf(p.c) : []) {
      const left = (this.rowsLeft.get(r) ?? 1) - 1;
      this.rowsLeft.set(r, left);
      if (left === 0) finished.push(r);
    }
    const rowsDone = [...this.rowsLeft.values()].filter((n) => n === 0).length;
    const passed = mine.filter((t) => t.state === 'passed').length;
    const failed = mine.filter((t) => t.state === 'failed').length;
    say(
      `■ [files ${this.filesDone}/${this.planned.length}] ${file}: ${passed} passed, ${failed} failed (${duration(m.diagnostic().duration)})` +
        `${errors.length ? ` · ${errors.length} error${errors.length > 1 ? 's' : ''} outside its tests: ${errors[0]}` : ''}` +
        ` · rows done ${rowsDone}/${this.rowsLeft.size}${finished.length ? ` (${finished.join(' ')})` : ''} · tests failed so far ${this.testsFailed} · ${duration(Date.now() - startedAt)}`,
    );
  }
}

const startedAt = Date.now();
const reporter = new MatrixReporter();
// The only reporter: vitest's own would print every test again, on stdout.
const vitest = await createVitest(
  'test',
  { root: ROOT, watch: false, reporters: [reporter] },
  {},
  { stdout: out, stderr: process.stderr },
);

const candidates: Candidate[] = [];
for (const name of [...ROW_PROJECTS, MATRIX_PROJECT]) {
  const project = vitest.getProjectByName(name);
  const { testFiles } = await project.globTestFiles();
  for (const moduleId of testFiles.sort()) {
    const file = relative(ROOT, moduleId);
    const rows = rowIdsIn(readFileSync(moduleId, 'utf8'));
    if (name === MATRIX_PROJECT) candidates.push({ project: name, moduleId, file, rows, grid: gridName(file) });
    else if (rows.length > 0) candidates.push({ project: name, moduleId, file, rows });
  }
}

let selection: Selection | undefined;
if (opts.rows !== undefined) {
  const asked = opts.rows
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
  const grids = candidates.flatMap((c) => (c.grid ? [c.grid] : []));
  const unknown = asked.filter((a) => !FAULT_MATRIX.some((r) => r.id === a) && !grids.includes(a));
  if (asked.length === 0 || unknown.length > 0)
    usage(
      `--rows: not a row or grid: ${unknown.join(', ') || '(none given)'}; rows are FM-01…FM-32, grids ${grids.join(', ') || '(none)'}`,
    );
  selection = { rows: asked.filter((a) => a.startsWith('FM-')), grids: asked.filter((a) => !a.startsWith('FM-')) };
}

/** The test name pattern for a candidate (undefined: every test of the file), or null when it is not run. */
function patternFor(c: Candidate): RegExp | undefined | null {
  if (!selection) return c.grid ? undefined : rowPattern();
  if (c.grid && selection.grids.includes(c.grid)) return undefined;
  const wanted = c.rows.filter((r) => selection!.rows.includes(r));
  return wanted.length > 0 ? rowPattern(wanted) : null;
}

if (opts.list) {
  for (const row of FAULT_MATRIX) {
    const files = candidates.filter((c) => c.rows.includes(row.id)).map((c) => c.file);
    say(`${row.id}  ${files.length > 0 ? files.join(', ') : 'no test file names it'}`);
  }
  for (const c of candidates.filter((x) => x.grid)) say(`${c.grid}  ${c.file}`);
  await vitest.close();
  process.exit(0);
}

const planned: Planned[] = candidates.flatMap((c) => {
  const pattern = patternFor(c);
  return pattern === null ? [] : [{ c, pattern }];
});
if (planned.length === 0) usage('nothing to run');
const specs: TestSpecification[] = planned.map(({ c, pattern }) =>
  vitest
    .getProjectByName(c.project)
    .createSpecification(c.moduleId, pattern ? { testNamePattern: pattern } : undefined),
);

function namesOf(t: TestCase): string[] {
  const names = [t.name];
  for (let p = t.parent; p.type === 'suite'; p = p.parent) names.unshift(p.name);
  return names;
}

function firstLine(s: string): string {
  return (s.split('\n').find((l) => l.trim() !== '') ?? s).trim().slice(0, 300);
}

reporter.plan(planned, selection);
const result = await vitest.runTestSpecifications(specs, true);
const unhandled = result.unhandledErrors.map((e) => firstLine((e as { message?: string }).message ?? String(e)));
await vitest.close();

const report = buildReport({
  tests: reporter.tests,
  files: reporter.files,
  ...(selection ? { selection } : {}),
  unhandledErrors: unhandled,
  wallMs: Date.now() - startedAt,
});
say();
say(renderTable(report, opts.width));
say();
say(renderGates(report));
const failures = renderFailures(report);
if (failures) {
  say();
  say('failures:');
  say(failures);
}
say();
say(renderSummary(report));
if (opts.json) process.stdout.write(`${JSON.stringify(report)}\n`);
process.exit(report.summary.ok ? 0 : 1);
