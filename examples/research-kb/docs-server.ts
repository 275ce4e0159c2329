/**
 * The "web" of the demo: a local HTTP server publishing real documents no one here wrote — the
 * Markdown files (READMEs and docs) under node_modules, deduplicated by content.
 * `GET /index.json` lists `{ path, url, bytes }`; `GET /p/<n>/<name>` serves page n as text/markdown.
 */
import { createHash } from 'node:crypto';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join, relative, basename } from 'node:path';

export interface Page {
  path: string;
  url: string;
  bytes: number;
}

/** Markdown files under `root` (depth-first, sorted), 200 B–200 kB, distinct by SHA-256 of content. */
export function collectMarkdown(root: string, limit: number): { file: string; text: string }[] {
  const seen = new Set<string>();
  const out: { file: string; text: string }[] = [];
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
      let st;
      try {
        st = statSync(p);
      } catch {
        continue;
      }
      if (st.isDirectory()) {
        if (name === '.bin' || name === 'test' || name === 'tests' || name === '@tooltx') continue;
        walk(p, depth + 1);
      } else if (/\.md$/i.test(name) && st.size >= 200 && st.size <= 200_000) {
        const text = readFileSync(p, 'utf8');
        const h = createHash('sha256').update(text).digest('hex');
        if (seen.has(h)) continue;
        seen.add(h);
        out.push({ file: p, text });
      }
    }
  };
  walk(root, 0);
  return out;
}

export class DocsServer {
  readonly pages: Page[] = [];
  #server: Server;
  #texts: string[] = [];
  url = '';
  constructor(private readonly root: string, private readonly limit: number) {
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
    for (const [i, { file, text }] of collectMarkdown(this.root, this.limit).entries()) {
      const rel = relative(this.root, file);
      this.#texts.push(text);
      this.pages.push({ path: rel, url: `${this.url}/p/${i}/${encodeURIComponent(basename(rel))}`, bytes: Buffer.byteLength(text) });
    }
    return this;
  }

  async stop(): Promise<void> {
    this.#server.closeAllConnections();
    await new Promise<void>((r) => this.#server.close(() => r()));
  }
}
