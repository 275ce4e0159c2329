/**
 * Packages by responsibility, imports only pointing down. The layers, lowest first:
 * contracts → lifecycle → the stores and the NATS adapter (nats, store-memory) → the topology
 * (streams) → auth and the runtime → the read side → the roles (services) → the entry points
 * (bin, scripts). The SDK (client) uses contracts, lifecycle and the NATS adapter only. Dev tooling
 * (dev) may use anything, and only tests, bench, scripts and the sample's entry points use it.
 * No service imports another service. Read from the source files themselves, so a new import that
 * points up fails here.
 */
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { describe, expect, it } from 'vitest';
import { ROOT } from './helpers/services.js';

/** What each package's source (its `src/`) may import of the others. */
const MAY_IMPORT: Record<string, string[]> = {
  contracts: [],
  lifecycle: ['contracts'],
  nats: ['contracts', 'lifecycle'],
  'store-memory': ['contracts', 'lifecycle'],
  streams: ['contracts', 'lifecycle', 'nats'],
  auth: ['contracts', 'lifecycle', 'nats', 'streams'],
  runtime: ['contracts', 'lifecycle', 'nats', 'streams'],
  readside: ['contracts', 'lifecycle', 'nats', 'streams', 'runtime'],
  client: ['contracts', 'lifecycle', 'nats'],
};
const LIBS = Object.keys(MAY_IMPORT);
/** The roles: any library below them, never another role, never dev tooling. */
const SERVICES = ['authorizer', 'executor', 'reconciler', 'audit-projector'];
const ROLE_MAY_IMPORT = ['contracts', 'lifecycle', 'nats', 'store-memory', 'streams', 'auth', 'runtime', 'readside'];

function sources(dir: string): string[] {
  const out: string[] = [];
  const walk = (d: string) => {
    for (const e of readdirSync(d)) {
      const p = join(d, e);
      if (statSync(p).isDirectory()) walk(p);
      else if (p.endsWith('.ts')) out.push(p);
    }
  };
  walk(dir);
  return out;
}

/** The `@tooltx/<name>` packages a file imports (static and dynamic), and its relative imports. */
function importsOf(file: string): { packages: string[]; relative: string[] } {
  const text = readFileSync(file, 'utf8');
  const specs = [...text.matchAll(/(?:from|import)\s*\(?\s*'([^']+)'/g)].map((m) => m[1]!);
  return {
    packages: [
      ...new Set(specs.filter((s) => s.startsWith('@tooltx/')).map((s) => s.slice('@tooltx/'.length).split('/')[0]!)),
    ],
    relative: specs.filter((s) => s.startsWith('.')),
  };
}

function srcDir(pkg: string): string {
  return pkg === 'streams' ? join(ROOT, 'streams', 'src') : join(ROOT, 'libs', pkg, 'src');
}

describe('package layers', () => {
  it('every library imports only the layers below it', () => {
    const upward: string[] = [];
    for (const pkg of LIBS) {
      for (const f of sources(srcDir(pkg))) {
        for (const p of importsOf(f).packages)
          if (p !== pkg && !MAY_IMPORT[pkg]!.includes(p)) upward.push(`${relative(ROOT, f)} imports @tooltx/${p}`);
      }
    }
    expect(upward).toEqual([]);
  });

  it('a role imports libraries only: never another role, never dev tooling', () => {
    const wrong: string[] = [];
    for (const s of SERVICES) {
      for (const f of sources(join(ROOT, 'services', s, 'src'))) {
        const { packages, relative: rel } = importsOf(f);
        for (const p of packages)
          if (!ROLE_MAY_IMPORT.includes(p)) wrong.push(`${relative(ROOT, f)} imports @tooltx/${p}`);
        for (const r of rel)
          if (r.startsWith('../')) wrong.push(`${relative(ROOT, f)} imports ${r} (outside its role)`);
      }
    }
    expect(wrong).toEqual([]);
  });

  it('no library and no role reaches into another package by a relative path', () => {
    const wrong: string[] = [];
    for (const pkg of LIBS) {
      for (const f of sources(srcDir(pkg)))
        for (const r of importsOf(f).relative) if (r.startsWith('../')) wrong.push(`${relative(ROOT, f)} imports ${r}`);
    }
    expect(wrong).toEqual([]);
  });

  it("dev tooling is used only by tests, bench, scripts and the sample's entry points", () => {
    const users: string[] = [];
    const product = [...LIBS.map(srcDir), ...SERVICES.map((s) => join(ROOT, 'services', s, 'src')), join(ROOT, 'bin')];
    for (const d of product)
      for (const f of sources(d)) if (importsOf(f).packages.includes('dev')) users.push(relative(ROOT, f));
    expect(users).toEqual([]);
  });

  it('every library has an explicit public entry point: no `export *` of a module', () => {
    const barrels = LIBS.filter((pkg) => /^export \* from /m.test(readFileSync(join(srcDir(pkg), 'index.ts'), 'utf8')));
    expect(barrels).toEqual([]);
  });
});
