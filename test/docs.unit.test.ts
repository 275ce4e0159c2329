/**
 * The documentation agrees with the code: the configuration tables of docs/operating.md are what
 * `npm run docs:config` writes now (scripts/gen-config-docs.ts: the services' zod schemas and every
 * program's `--help`), every relative link of README.md and docs/*.md reaches a file (and a heading,
 * for a `#fragment`), the fault matrix of docs/concepts.md is test/matrix/fault-matrix.ts row for
 * row, its `next` table is `nextActionFor`, and the README stays short.
 */
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';
import { nextActionFor } from '@tooltx/contracts';
import { FAULT_MATRIX } from './matrix/fault-matrix.js';
import { OPERATING_MD, renderConfigDocs, ROOT, withConfig } from '../scripts/gen-config-docs.js';

const DOCS = join(ROOT, 'docs');
const pages = [
  join(ROOT, 'README.md'),
  ...readdirSync(DOCS)
    .filter((f) => f.endsWith('.md'))
    .map((f) => join(DOCS, f)),
];
const read = (file: string) => readFileSync(file, 'utf8');

/** The page without its fenced code blocks (a link-like text in code is not a link). */
const prose = (md: string) => md.replace(/^```[^\n]*\n[\s\S]*?^```[^\n]*$/gm, '');

/** GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`. */
function slug(heading: string): string {
  return heading
    .trim()
    .toLowerCase()
    .replace(/[^\p{L}\p{N}\s_-]/gu, '')
    .replace(/\s/g, '-');
}

function anchorsOf(md: string): Set<string> {
  const seen = new Map<string, number>();
  const out = new Set<string>();
  for (const m of prose(md).matchAll(/^#{1,6}\s+(.+)$/gm)) {
    const base = slug(m[1]!);
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    out.add(n === 0 ? base : `${base}-${n}`);
  }
  return out;
}

/** The text between `<!-- name:begin -->` and `<!-- name:end -->`. */
function between(md: string, name: string): string {
  const a = md.indexOf(`<!-- ${name}:begin -->`);
  const b = md.indexOf(`<!-- ${name}:end -->`);
  if (a < 0 || b < a) throw new Error(`markers ${name}:begin/end not found`);
  return md.slice(a + `<!-- ${name}:begin -->`.length, b).trim();
}

describe('documentation', () => {
  it('the configuration tables of docs/operating.md are current (npm run docs:config)', async () => {
    const page = read(OPERATING_MD);
    const generated = withConfig(page, await renderConfigDocs());
    // The whole page compared: a stale table shows as its first differing line.
    expect(page, 'docs/operating.md is stale: run `npm run docs:config`').toBe(generated);
  }, 120_000);

  it('every relative link of README.md and docs/*.md reaches a file, and a heading for a #fragment', () => {
    const broken: string[] = [];
    let checked = 0;
    for (const file of pages) {
      for (const m of prose(read(file)).matchAll(/\]\(([^)\s]+)(?:\s+"[^"]*")?\)/g)) {
        const target = m[1]!;
        if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue; // https:, mailto:
        checked++;
        const [path, fragment] = target.split('#') as [string, string | undefined];
        const dest = path === '' ? file : resolve(dirname(file), decodeURIComponent(path));
        const where = `${relative(ROOT, file)}: ${target}`;
        if (!existsSync(dest)) {
          broken.push(`${where} (no such file)`);
          continue;
        }
        if (fragment !== undefined && dest.endsWith('.md') && !anchorsOf(read(dest)).has(fragment))
          broken.push(`${where} (no such heading)`);
      }
    }
    expect(checked).toBeGreaterThan(20);
    expect(broken).toEqual([]);
  });

  it('docs/concepts.md lists every fault-matrix row as test/matrix/fault-matrix.ts has it', () => {
    const lines = between(read(join(DOCS, 'concepts.md')), 'fm').split('\n');
    expect(lines).toEqual(FAULT_MATRIX.map((r) => `- **${r.id}** ${r.situation} → ${r.mustHold}`));
  });

  it('docs/concepts.md gives each error class the next action nextActionFor gives it', () => {
    const rows = between(read(join(DOCS, 'concepts.md')), 'next')
      .split('\n')
      .slice(2);
    const table = Object.fromEntries(
      rows.map((r) => /^\| `([a-z_]+)` \| `([a-z_]+)` \|$/.exec(r)!.slice(1, 3) as [string, string]),
    );
    expect(table).toEqual(nextActionFor);
  });

  it('README.md gets a newcomer going in at most 150 lines, and no page cites planning documents', () => {
    // Lines as `wc -l` counts them.
    expect(read(join(ROOT, 'README.md')).match(/\n/g)?.length ?? 0).toBeLessThanOrEqual(150);
    for (const file of pages) expect(read(file), relative(ROOT, file)).not.toMatch(/DESIGN\.md|NATS-NOTES\.md/);
  });
});
