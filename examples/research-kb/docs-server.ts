/**
 * The "web" of the demo: a local HTTP server publishing real documents no one here wrote — the
 * Markdown files (READMEs and docs) under node_modules, deduplicated by content: the project's own
 * node_modules first (~205 distinct pages), then the Node installation's (`<prefix>/lib/node_modules`:
 * npm's documentation and its dependencies' READMEs, ~170 more) when there is one, so the demo's
 * 200-page gate has a margin beyond a few failed fetches.
 * `GET /index.json` lists `{ root, path, url, bytes }`; `GET /p/<n>/<name>` serves page n as text/markdown.
 */
import { createHash } from 'node:crypto';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { basename, dirname, join, relative, resolve } from 'node:path';

export interface Page {
  /** The node_modules directory the page was found under. */
  root: string;
  /** Path relative to `root`. */
  path: string;
  url: string;
  bytes: number;
}

/** Smallest page, bytes: below it a file is a stub (a one-line README, an empty CHANGELOG), not a document. */
export const MIN_PAGE_BYTES = 200;
/** Largest page, bytes. */
export const MAX_PAGE_BYTES = 200_000;

/**
 * The node_modules directories the demo reads, in order: `<cwd>/node_modules`, then the Node
 * installation's global one (`<dirname(execPath)>/../lib/node_modules`, which holds npm) when it
 * exists and is another directory.
 */
export function nodeModulesRoots(cwd = process.cwd()): string[] {
  const roots = [resolve(cwd, 'node_modules')];
  const global = resolve(dirname(process.execPath), '..', 'lib', 'node_modules');
  try {
    if (statSync(global).isDirectory() && !roots.includes(global)) roots.push(global);
  } catch {
    // no global node_modules (e.g. Debian's packaged npm lives elsewhere)
  }
  return roots;
}

/**
 * Markdown files (`*.md`, `*.markdown`) under each of `roots` in turn (depth-first, sorted, at most
 * 6 levels, skipping `.bin`, `test`, `tests` and our own `@tooltx`), {@link MIN_PAGE_BYTES}–
 * {@link MAX_PAGE_BYTES}, distinct by SHA-256 of content across all roots; at most `limit`.
 */
export function collectMarkdown(
  roots: string | string[],
  limit: number,
): { root: string; file: string; text: string }[] {
  const seen = new Set<string>();
  const out: { root: string; file: string; text: string }[] = [];
  let root = '';
  const walk = (dir: string, depth: number) => {
    if (out.length >= limit || depth > 6) return;
    let entries: string[];
    try {
      entries = readdirSync(dir).sort();
    } catch {
      return;
    }
    for (const name of entries) {
      if (out.length >= limit) return;
      const p = join(dir, name);
      let st: ReturnType<typeof statSync>;
      try {
        st = statSync(p);
      } catch {
        continue;
      }
      if (st.isDirectory()) {
        if (name === '.bin' || name === 'test' || name === 'tests' || name === '@tooltx') continue;
        walk(p, depth + 1);
      } else if (/\.(md|markdown)$/i.test(name) && st.size >= MIN_PAGE_BYTES && st.size <= MAX_PAGE_BYTES) {
        const text = readFileSync(p, 'utf8');
        const h = createHash('sha256').update(text).digest('hex');
        if (seen.has(h)) continue;
        seen.add(h);
        out.push({ root, file: p, text });
      }
    }
  };
  for (root of typeof roots === 'string' ? [roots] : roots) walk(root, 0);
  return out;
}

export class DocsServer {
  readonly pages: Page[] = [];
  #server: Server;
  #texts: string[] = [];
  url = '';
  constructor(
    private readonly roots: string | string[],
    private readonly limit: number,
  ) {
    this.#server = createServer((req, res) => {
      const u = new URL(req.url ?? '/', 'http://x');
      if (u.pathname === '/index.json') {
        res.setHeader('content-type', 'application/json');
        return void res.end(JSON.stringify(this.pages));
      }
      const m = /^\/p\/(\d+)\//.exec(u.pathname);
      const text = m ? this.#texts[Number(m[1])] : undefined;
      if (text === undefined) {
        res.statusCode = 404;
        return void res.end('not found');
      }
      res.setHeader('content-type', 'text/markdown; charset=utf-8');
      res.end(text);
    });
  }

  async start(): Promise<this> {
    await new Promise<void>((r) => this.#server.listen(0, '127.0.0.1', r));
    this.url = `http://127.0.0.1:${(this.#server.address() as AddressInfo).port}`;
    for (const [i, { root, file, text }] of collectMarkdown(this.roots, this.limit).entries()) {
      const rel = relative(root, file);
      this.#texts.push(text);
      this.pages.push({
        root,
        path: rel,
        url: `${this.url}/p/${i}/${encodeURIComponent(basename(rel))}`,
        bytes: Buffer.byteLength(text),
      });
    }
    return this;
  }

  async stop(): Promise<void> {
    this.#server.closeAllConnections();
    await new Promise<void>((r) => this.#server.close(() => r()));
  }
}
