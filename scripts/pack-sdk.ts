/**
 * `npm run pack:sdk` — the SDK as a package a user installs outside this repository:
 * `npm install ./tooltx-client-<version>.tgz`, then `import { createTools } from '@tooltx/client'`
 * and `import { defineContract, normalise } from '@tooltx/client/contracts'` (docs/sdk.md).
 *
 * The workspace packages the SDK is made of (`@tooltx/client`, `contracts`, `lifecycle`, `nats`) are
 * private and point at TypeScript sources, so nothing of them may be left for a registry to supply:
 * - JavaScript: ONE esbuild build of the two entry points with code splitting, so the contracts
 *   code both use lands in one shared chunk (one `TooltxError` class for `instanceof`, one
 *   `defineContract`). npm packages stay external and become the package's `dependencies`, pinned
 *   to the versions the repository pins (read from the bundle's own imports: a new one the root
 *   package.json does not pin fails the build). No source maps: they would point at files the
 *   user does not have.
 * - Types: tsc emits the declarations of the four libraries, and rollup-plugin-dts bundles them
 *   into `dist/index.d.ts` and `dist/contracts.d.ts` (a shared chunk for the contracts types, so
 *   the classes are one type on both entry points), keeping only what the public entry points
 *   reach: internal modules (and the packages only they import, such as pino's types) stay out.
 *   Measured on this repository (2 cores): tsc's per-file declarations alone are 46 files, 406 kB,
 *   and need pino's types as a dependency; bundled they are 3 files, 69 kB, for ~2.8 s of tsc
 *   (`--noCheck`) and ~1.7 s of rollup. rollup-plugin-dts compiling the .ts sources itself took
 *   over 30 s, dts-bundle-generator over 25 s (and one file per entry point, the contracts types
 *   declared twice).
 *
 * The build happens in a fresh directory under `node_modules/.cache/tooltx-sdk/`, removed when the
 * tarball is written (by default into `dist/`, ignored by git); the path is printed on stdout.
 */
import { execFile } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire, isBuiltin } from 'node:module';
import { dirname, join, relative, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { esbuildFailure, externalNpmPackages, loadEsbuild } from '@tooltx/dev/compiled';

const run = promisify(execFile);
const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');

/** The package's entry points: subpath export → the workspace source it is built from. */
const ENTRIES = {
  index: { subpath: '.', source: 'libs/client/src/index.ts' },
  contracts: { subpath: './contracts', source: 'libs/contracts/src/index.ts' },
} as const;
/** The workspace libraries bundled into the package; the build refuses to read any other source. */
const BUNDLED = ['client', 'contracts', 'lifecycle', 'nats'];

export class SdkPackError extends Error {
  constructor(message: string, opts: { cause?: unknown } = {}) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = 'SdkPackError';
  }
}

export interface SdkPack {
  /** The tarball's absolute path. */
  tarball: string;
  name: string;
  version: string;
  /** Bytes of the tarball, and of its files unpacked. */
  size: number;
  unpackedSize: number;
  /** The paths inside the package (`package.json`, `dist/index.js`, …), sorted. */
  files: string[];
  /** The package's `dependencies` (npm packages the bundle imports, at the repository's pins). */
  dependencies: Record<string, string>;
}

/** `@scope/name/sub` → `@scope/name`, `name/sub` → `name`. */
function packageOf(specifier: string): string {
  const parts = specifier.split('/');
  return (specifier.startsWith('@') ? parts.slice(0, 2) : parts.slice(0, 1)).join('/');
}

function readJson<T>(path: string): T {
  return JSON.parse(readFileSync(path, 'utf8')) as T;
}

/** Bundles the JavaScript into `dist/`; returns the npm packages it imports. */
async function buildJs(dist: string): Promise<Set<string>> {
  const r = await loadEsbuild()
    .build({
      absWorkingDir: ROOT,
      entryPoints: Object.fromEntries(Object.entries(ENTRIES).map(([name, e]) => [name, e.source])),
      outdir: dist,
      entryNames: '[name]',
      chunkNames: 'chunks/[name]-[hash]',
      bundle: true,
      splitting: true,
      format: 'esm',
      platform: 'node',
      target: 'node20',
      // Class names as in the sources: a caller's logs name an error's class.
      keepNames: true,
      sourcemap: false,
      metafile: true,
      logLevel: 'silent',
      plugins: [externalNpmPackages],
    })
    .catch((err: unknown) => {
      throw new SdkPackError(esbuildFailure(err), { cause: err });
    });
  const allowed = BUNDLED.map((l) => `libs/${l}/src/`);
  const strays = Object.keys(r.metafile.inputs).filter((f) => !allowed.some((a) => f.startsWith(a)));
  if (strays.length)
    throw new SdkPackError(
      `the SDK's bundle reads sources outside ${BUNDLED.map((l) => `libs/${l}`).join(', ')}: ${strays.join(', ')}`,
    );
  const packages = new Set<string>();
  for (const out of Object.values(r.metafile.outputs)) {
    for (const i of out.imports) if (i.external && !isBuiltin(i.path)) packages.add(packageOf(i.path));
  }
  return packages;
}

/**
 * Emits the libraries' declarations with tsc into `work/types/<lib>/src/`, then bundles them from
 * the entry points into `dist/`; returns the npm packages the bundled declarations import.
 */
async function buildTypes(work: string, dist: string): Promise<Set<string>> {
  const typesDir = join(work, 'types');
  const tsconfig = join(work, 'tsconfig.json');
  writeFileSync(
    tsconfig,
    `${JSON.stringify(
      {
        extends: join(ROOT, 'tsconfig.json'),
        compilerOptions: {
          noEmit: false,
          declaration: true,
          emitDeclarationOnly: true,
          outDir: typesDir,
          rootDir: join(ROOT, 'libs'),
          typeRoots: [join(ROOT, 'node_modules', '@types')],
          incremental: false,
        },
        // Every bundled library as a root: tsc emits no declarations for a file it reached through
        // node_modules (the workspace's symlinks), however it got there.
        files: BUNDLED.map((l) => join(ROOT, 'libs', l, 'src', 'index.ts')),
        include: [],
      },
      null,
      2,
    )}\n`,
  );
  const tsc = join(dirname(createRequire(import.meta.url).resolve('typescript/package.json')), 'bin', 'tsc');
  // --noCheck: `npm run typecheck` checks these sources; emitting without checking takes ~2.4 s
  // here instead of ~4.3 s.
  await run(process.execPath, [tsc, '-p', tsconfig, '--noCheck'], { cwd: ROOT, maxBuffer: 16 << 20 }).catch(
    (err: { stdout?: string; message: string }) => {
      throw new SdkPackError(`tsc (declarations): ${err.stdout?.trim() || err.message}`, { cause: err });
    },
  );

  const { rollup } = await import('rollup');
  const { dts } = await import('rollup-plugin-dts');
  const bundle = await rollup({
    input: Object.fromEntries(
      Object.entries(ENTRIES).map(([name, e]) => [
        name,
        join(typesDir, relative('libs', e.source).replace(/\.ts$/, '.d.ts')),
      ]),
    ),
    // npm packages (and Node's modules) stay imports; the workspace libraries are bundled. Said
    // here (respectExternal) rather than left to the dts plugin, which takes any file under a
    // node_modules/ directory for a library's, and so this build's own under node_modules/.cache/.
    external: (id) => /^[^./]/.test(id) && !id.startsWith('@tooltx/'),
    plugins: [
      {
        name: 'workspace-declarations',
        resolveId(id: string) {
          const m = /^@tooltx\/([^/]+)(\/.*)?$/.exec(id);
          if (!m) return null;
          if (!BUNDLED.includes(m[1]!) || m[2] !== undefined)
            throw new SdkPackError(`the SDK's declarations import ${id}, which is not a bundled library's entry point`);
          return join(typesDir, m[1]!, 'src', 'index.d.ts');
        },
      },
      dts({ respectExternal: true }),
    ],
    onwarn(w) {
      throw new SdkPackError(`rollup-plugin-dts: ${w.message}`);
    },
  });
  const { output } = await bundle.write({
    dir: dist,
    format: 'es',
    entryFileNames: '[name].d.ts',
    chunkFileNames: (c) => `chunks/${c.name.replace(/\.d$/, '')}-[hash].d.ts`,
  });
  await bundle.close();
  // What the declarations import besides their own files: the external modules.
  const own = new Set(output.map((o) => o.fileName));
  const packages = new Set<string>();
  for (const o of output) {
    if (o.type !== 'chunk') continue;
    for (const id of [...o.imports, ...o.dynamicImports])
      if (!own.has(id) && !isBuiltin(id)) packages.add(packageOf(id));
  }
  return packages;
}

/**
 * Builds the SDK's package and packs it into `destination` (default `<repo>/dist`). Throws
 * {@link SdkPackError} when a build step fails or the bundle needs something the repository does
 * not pin.
 */
export async function packSdk(opts: { destination?: string } = {}): Promise<SdkPack> {
  const destination = resolve(opts.destination ?? join(ROOT, 'dist'));
  const cache = join(ROOT, 'node_modules', '.cache', 'tooltx-sdk');
  mkdirSync(cache, { recursive: true });
  mkdirSync(destination, { recursive: true });
  const work = mkdtempSync(join(cache, 'build-'));
  try {
    const pkgDir = join(work, 'package');
    const dist = join(pkgDir, 'dist');
    const [jsPackages, typePackages] = await Promise.all([buildJs(dist), buildTypes(work, dist)]);

    const root = readJson<{
      engines?: Record<string, string>;
      dependencies: Record<string, string>;
      devDependencies?: Record<string, string>;
    }>(join(ROOT, 'package.json'));
    const client = readJson<{ name: string; version: string }>(join(ROOT, 'libs', 'client', 'package.json'));
    const dependencies: Record<string, string> = {};
    for (const name of [...new Set([...jsPackages, ...typePackages])].sort()) {
      if (name.startsWith('@tooltx/')) throw new SdkPackError(`the SDK's bundle still imports ${name}`);
      const version = root.dependencies[name];
      if (version === undefined || !/^\d+\.\d+\.\d+$/.test(version)) {
        throw new SdkPackError(
          `the SDK imports ${name}, which the root package.json does not pin in "dependencies" (found ${JSON.stringify(version ?? root.devDependencies?.[name] ?? null)})`,
        );
      }
      dependencies[name] = version;
    }
    const manifest = {
      name: client.name,
      version: client.version,
      description:
        'tooltx SDK: transactional tool calls for AI agents on NATS JetStream (createTools, tools.execute / status / verify, runTask) and the contracts they are made against',
      type: 'module',
      engines: root.engines,
      exports: {
        ...Object.fromEntries(
          Object.entries(ENTRIES).map(([name, e]) => [
            e.subpath,
            { types: `./dist/${name}.d.ts`, default: `./dist/${name}.js` },
          ]),
        ),
        './package.json': './package.json',
      },
      main: './dist/index.js',
      types: './dist/index.d.ts',
      files: ['dist'],
      dependencies,
    };
    writeFileSync(join(pkgDir, 'package.json'), `${JSON.stringify(manifest, null, 2)}\n`);
    writeFileSync(join(pkgDir, 'README.md'), readFileSync(join(ROOT, 'docs', 'sdk.md'), 'utf8'));

    const { stdout } = await run('npm', ['pack', '--json', '--ignore-scripts', '--pack-destination', destination], {
      cwd: pkgDir,
      env: npmEnv(),
      maxBuffer: 16 << 20,
    }).catch((err: { stderr?: string; message: string }) => {
      throw new SdkPackError(`npm pack: ${err.stderr?.trim() || err.message}`, { cause: err });
    });
    const [packed] = JSON.parse(stdout) as {
      filename: string;
      size: number;
      unpackedSize: number;
      files: { path: string }[];
    }[];
    if (!packed) throw new SdkPackError(`npm pack printed no package: ${stdout}`);
    return {
      tarball: join(destination, packed.filename),
      name: manifest.name,
      version: manifest.version,
      size: packed.size,
      unpackedSize: packed.unpackedSize,
      files: packed.files.map((f) => f.path).sort(),
      dependencies,
    };
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}

/**
 * The environment for an npm command run in a directory outside the workspace: without the
 * `npm_*` variables of an enclosing `npm run` (they name this repository's package and prefix),
 * keeping where npm's cache and configuration are.
 */
export function npmEnv(): NodeJS.ProcessEnv {
  const keep = new Set(['npm_config_cache', 'npm_config_userconfig', 'npm_config_globalconfig', 'npm_config_registry']);
  return Object.fromEntries(
    Object.entries(process.env).filter(([k]) => !k.toLowerCase().startsWith('npm_') || keep.has(k.toLowerCase())),
  );
}

/** Every file under `dir`, relative to it with `/` separators, sorted. */
export function filesUnder(dir: string): string[] {
  const out: string[] = [];
  const walk = (d: string) => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      const p = join(d, e.name);
      if (e.isDirectory()) walk(p);
      else out.push(relative(dir, p).split(sep).join('/'));
    }
  };
  walk(dir);
  return out.sort();
}

if (process.argv[1] !== undefined && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  packSdk({ ...(process.argv[2] ? { destination: process.argv[2] } : {}) }).then(
    (p) => {
      process.stderr.write(
        `${p.name}@${p.version}: ${p.files.length} files, ${(p.size / 1024).toFixed(1)} kB packed, ${(p.unpackedSize / 1024).toFixed(1)} kB unpacked\n`,
      );
      process.stdout.write(`${p.tarball}\n`);
    },
    (err: unknown) => {
      process.stderr.write(`pack:sdk: ${err instanceof Error ? err.message : String(err)}\n`);
      process.exitCode = 1;
    },
  );
}
