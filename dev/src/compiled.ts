/**
 * The research-KB stack's processes as compiled JavaScript: the four services, the KB storage
 * service and the trusted tools module, bundled by esbuild into one directory and run by plain
 * `node` (stack.ts; `npm start`, `npm run demo`, `npm run bench` and the tests that start a stack).
 *
 * Why (each service ≤ 120 MB peak RSS; docs/performance.md "Memory: compiled services
 * and V8 flags"): under `node --import tsx` every process also carries tsx's loader — on Node 20
 * `module.register` runs the hooks in a second V8 isolate on a worker thread, plus esbuild's
 * transforms and inline source maps — 125–134 MB RSS after start-up, against 79–82 MB for the same
 * code precompiled (KB 106 → 73 MB). No other lever is that large.
 *
 * How: ONE esbuild build with code splitting and every entry point together, so code shared by a
 * service and the tools module (`@tooltx/contracts`, `@tooltx/runtime`, …) lands in one shared
 * chunk: a service that loads `authorizer.js` and then `tools.js` (TOOLTX_TOOLS_MODULE) holds ONE
 * copy of each module, and `instanceof TooltxError` holds across them as under tsx. npm packages
 * stay external, resolved from the repository's node_modules at run time (native addons, pino,
 * undici: the same files tsx would load), which is why the output lives under
 * `node_modules/.cache/tooltx-stack/`. Linked source maps (`--enable-source-maps`, ~1.5 MB per
 * process) keep stack traces pointing at the TypeScript sources, as under tsx.
 *
 * Cache: the output directory is named by a SHA-256 of its inputs — every file under libs/,
 * streams/, services/ and examples/research-kb/ (test directories aside), the root package.json
 * and tsconfig.json, esbuild's version and this recipe — so a changed source gives a new directory
 * and an unchanged tree reuses the old one (hashing ~90 files: a few ms; a build: ~0.5 s). A build
 * is written to a temporary directory and renamed into place, so stacks started at the same time
 * (parallel tests, several benches) never load a half-written build; the loser of a race drops its
 * copy. After a build, directories not used for {@link PRUNE_AFTER_MS} are removed (stack.ts
 * refreshes the one it uses at every launch). The build also checks that every file esbuild read
 * is one the hash covers ({@link StackBuildError} otherwise), so no input can change unnoticed.
 *
 * esbuild is the one tsx itself depends on (resolved through tsx's own package, so nothing beyond
 * the pinned tsx is needed): the TypeScript → JavaScript transform is the same one the tsx path
 * makes, module by module.
 *
 * Trade-off: a build step (automatic, cached) and a second way to run the same sources; the tsx
 * path stays for development (`TOOLTX_STACK_RUNTIME=tsx`: no build, ~45 MB more per process) and
 * for the tests that spawn single services with TypeScript tools fixtures (test/helpers/services.ts).
 */
import { createHash } from 'node:crypto';
import {
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  statSync,
  utimesSync,
  writeFileSync,
} from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');

/** The entry points of a build, by output name (`<name>.js`), relative to the repository root. */
export const STACK_ENTRIES = {
  authorizer: 'services/authorizer/src/main.ts',
  executor: 'services/executor/src/main.ts',
  reconciler: 'services/reconciler/src/main.ts',
  'audit-projector': 'services/audit-projector/src/main.ts',
  /** Every role in one process (`tooltx serve`, the co-located layout). */
  serve: 'bin/serve.ts',
  'kb-server': 'examples/research-kb/kb-server.ts',
  'mail-server': 'examples/research-kb/mail-server.ts',
  /** The web console for operators and auditors (docs/console.md). */
  console: 'services/console/src/main.ts',
  tools: 'examples/research-kb/tools.ts',
} as const;
export type StackEntry = keyof typeof STACK_ENTRIES;

/** The directories whose files are hashed (inputs of the bundle), relative to the repository root. */
const SOURCE_DIRS = ['libs', 'streams', 'services', join('examples', 'research-kb')];
/** Single files that shape the build. */
const SOURCE_FILES = ['package.json', 'tsconfig.json', join('bin', 'serve.ts')];
/** Bump when the build options below or {@link STACK_ENTRIES} change (part of the hash). */
const RECIPE = 'esm-splitting-node20-external-packages-keepnames-linked-maps/3';
/** Builds not used for this long are removed after a build, ms (7 days). */
export const PRUNE_AFTER_MS = 7 * 24 * 3_600_000;

/** A finished build: its directory and the path of each entry's JavaScript. */
export interface StackBuild {
  dir: string;
  /** Whether this call built it (false: reused from the cache). */
  built: boolean;
  /** The JavaScript of a stack entry, or of an extra entry the build was asked for by name. */
  path(entry: StackEntry | (string & {})): string;
}

/** The build failed: esbuild's errors (file:line: text, about our own sources), or an input the hash misses. */
export class StackBuildError extends Error {
  constructor(message: string, opts: { cause?: unknown } = {}) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = 'StackBuildError';
  }
}

/** The part of esbuild's JavaScript API used here and by scripts/pack-sdk.ts (esbuild ~0.28, through tsx). */
export interface EsbuildMessage {
  text: string;
  location: { file: string; line: number; column: number } | null;
}
export interface EsbuildMetafile {
  inputs: Record<string, unknown>;
  outputs: Record<string, { imports: { path: string; external?: boolean }[] }>;
}
export interface Esbuild {
  version: string;
  build(
    options: Record<string, unknown>,
  ): Promise<{ errors: EsbuildMessage[]; warnings: EsbuildMessage[]; metafile: EsbuildMetafile }>;
}
interface EsbuildPluginBuild {
  onResolve(
    options: { filter: RegExp },
    callback: (args: { path: string; kind: string }) => { path: string; external: true } | undefined,
  ): void;
}

/** The esbuild tsx itself depends on: nothing beyond the pinned tsx is needed. */
export function loadEsbuild(): Esbuild {
  const fromHere = createRequire(import.meta.url);
  return createRequire(fromHere.resolve('tsx/package.json'))('esbuild') as Esbuild;
}

/**
 * An esbuild plugin that bundles the workspace's own packages (`@tooltx/*`) and leaves every npm
 * package external, to be loaded from node_modules at run time.
 */
export const externalNpmPackages = {
  name: 'external-packages',
  setup(b: EsbuildPluginBuild) {
    b.onResolve({ filter: /^[^./]/ }, (args) =>
      args.path.startsWith('@tooltx/') || args.kind === 'entry-point' ? undefined : { path: args.path, external: true },
    );
  },
};

/** esbuild's failure as one line: its first five errors, `file:line:column: text` each. */
export function esbuildFailure(err: unknown): string {
  const errors = (err as { errors?: EsbuildMessage[] }).errors ?? [];
  const lines = errors
    .slice(0, 5)
    .map((m) => (m.location ? `${m.location.file}:${m.location.line}:${m.location.column}: ${m.text}` : m.text));
  return `esbuild: ${lines.join('; ') || String(err)}`;
}

/** The repository-relative paths of every hashed input (`extraDirs` walked as well), sorted. */
function sourceFiles(root: string, extraDirs: readonly string[] = []): string[] {
  const out: string[] = [];
  const walk = (dir: string) => {
    for (const e of readdirSync(join(root, dir), { withFileTypes: true })) {
      const rel = join(dir, e.name);
      if (e.isDirectory()) {
        if (e.name === 'node_modules' || e.name === 'test' || e.name.startsWith('.')) continue;
        walk(rel);
      } else if (e.isFile()) out.push(rel);
    }
  };
  for (const d of [...SOURCE_DIRS, ...extraDirs]) walk(d);
  return [...new Set([...out, ...SOURCE_FILES])].sort();
}

/**
 * Returns the build of the current sources, building it when the cache has none (see the file's
 * header). `cacheDir` defaults to `<repo>/node_modules/.cache/tooltx-stack`. Throws
 * {@link StackBuildError} when esbuild reports errors or reads a file outside the hashed inputs, and
 * the file system's error (`EACCES`, `EROFS`, …) when the cache directory cannot be written.
 *
 * `extraEntries` (name → repository-relative `.ts` path) adds entry points to the same build, so
 * that they share its chunks (one `@tooltx/contracts` with the services that load them): the tests'
 * TypeScript tools fixtures. Each extra entry's directory is hashed too, and names its own build.
 */
export async function ensureStackBuild(
  opts: { root?: string; cacheDir?: string; extraEntries?: Readonly<Record<string, string>> } = {},
): Promise<StackBuild> {
  const root = opts.root ?? ROOT;
  const cacheDir = opts.cacheDir ?? join(root, 'node_modules', '.cache', 'tooltx-stack');
  const esbuild = loadEsbuild();
  const extra = opts.extraEntries ?? {};
  const clash = Object.keys(extra).find((name) => name in STACK_ENTRIES || !/^[a-z0-9][a-z0-9-]*$/.test(name));
  if (clash !== undefined)
    throw new StackBuildError(`extra entry name ${JSON.stringify(clash)} is a stack entry's or not of [a-z0-9-]`);
  const files = sourceFiles(root, [...new Set(Object.values(extra).map((f) => dirname(f)))]);
  const h = createHash('sha256').update(`${RECIPE}\0esbuild ${esbuild.version}\0`);
  for (const [name, f] of Object.entries(extra).sort(([a], [b]) => a.localeCompare(b)))
    h.update(`entry ${name}=${f.split(sep).join('/')}\0`);
  for (const f of files)
    h.update(`${f.split(sep).join('/')}\0`)
      .update(readFileSync(join(root, f)))
      .update('\0');
  const dir = join(cacheDir, h.digest('hex').slice(0, 16));
  const result = (built: boolean): StackBuild => ({ dir, built, path: (entry) => join(dir, `${entry}.js`) });
  if (existsSync(join(dir, 'package.json'))) return result(false);

  mkdirSync(cacheDir, { recursive: true });
  const tmp = `${dir}.tmp-${process.pid}-${Date.now()}`;
  try {
    const r = await esbuild
      .build({
        absWorkingDir: root,
        entryPoints: { ...STACK_ENTRIES, ...extra },
        outdir: tmp,
        bundle: true,
        splitting: true,
        format: 'esm',
        platform: 'node',
        target: 'node20',
        sourcemap: 'linked',
        sourcesContent: false,
        // Class and function names as in the sources: logs name an error's class (pino's `type`).
        keepNames: true,
        metafile: true,
        logLevel: 'silent',
        plugins: [externalNpmPackages],
      })
      .catch((err: unknown) => {
        throw new StackBuildError(esbuildFailure(err), { cause: err });
      });
    const hashed = new Set(files.map((f) => f.split(sep).join('/')));
    const unhashed = Object.keys(r.metafile.inputs).filter((f) => !hashed.has(f));
    if (unhashed.length)
      throw new StackBuildError(
        `the bundle reads files its cache key does not cover (add their directory to SOURCE_DIRS in dev/src/compiled.ts): ${unhashed.join(', ')}`,
      );
    // ES modules by their package scope, whatever node_modules/.cache/ holds around them.
    writeFileSync(
      join(tmp, 'package.json'),
      `${JSON.stringify({ type: 'module', private: true, description: 'tooltx stack build (dev/src/compiled.ts)' })}\n`,
    );
    try {
      renameSync(tmp, dir);
    } catch (err) {
      // Another stack built the same sources first: theirs is as good as ours.
      if (!existsSync(join(dir, 'package.json'))) throw err;
      rmSync(tmp, { recursive: true, force: true });
      return result(false);
    }
  } catch (err) {
    rmSync(tmp, { recursive: true, force: true });
    throw err;
  }
  pruneStackBuilds(cacheDir, dir);
  return result(true);
}

/** Marks a build as in use now (stack.ts calls it at every launch, so pruning spares a running stack's build). */
export function touchStackBuild(build: StackBuild): void {
  try {
    const now = new Date();
    utimesSync(build.dir, now, now);
  } catch {
    // read-only cache: nothing prunes it either
  }
}

/** Removes builds (and abandoned temporary directories) not used for {@link PRUNE_AFTER_MS}, except `keep`. */
function pruneStackBuilds(cacheDir: string, keep: string): void {
  for (const name of readdirSync(cacheDir)) {
    const d = join(cacheDir, name);
    if (d === keep) continue;
    try {
      if (Date.now() - statSync(d).mtimeMs > PRUNE_AFTER_MS) rmSync(d, { recursive: true, force: true });
    } catch {
      // gone already, or another process's
    }
  }
}
