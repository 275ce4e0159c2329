/**
 * FM-16: unique canaries planted where secrets and content live — a credential (the KB's
 * operator token), a cookie, a note body, a page's text and a downstream's error message — and a
 * scanner that looks for them in everything tooltx produced. Used by the demo and the FM-16 test.
 *
 * Where the canaries may legitimately be: the KB (the system of record holds its operator token's
 * digest, note titles and digests of bodies), the intent stream (agents' inputs), the result store
 * (business results: a fetched page's excerpt) and what the agent asked for (a committed result).
 * Everywhere else — every log line, the event log, the decision and advisory streams, the audit
 * bucket and the audit log, every audit record and export, every error returned to an agent — a
 * canary is a leak.
 */
import { randomBytes } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import type { JetStreamClient, JetStreamManager } from '@nats-io/jetstream';
import type { ExecuteResult, Tools } from '@tooltx/client';
import { decodeRaw, type Subjects } from '@tooltx/nats';
import { KbClient } from './kb-client.js';

export const CANARY_KINDS = ['token', 'cookie', 'noteBody', 'pageText', 'errorMessage'] as const;
export type CanaryKind = (typeof CANARY_KINDS)[number];
export type Canaries = Record<CanaryKind, string>;

/** Fresh canaries: `CANARY-<kind>-<16 hex>`, unique per run (and long enough to be a KB operator token). */
export function newCanaries(): Canaries {
  return Object.fromEntries(CANARY_KINDS.map((k) => [k, `CANARY-${k}-${randomBytes(8).toString('hex')}`])) as Canaries;
}

/**
 * A small web the agent reads: `/field-notes` is a page whose prose carries the page-text canary and
 * which sets a session cookie carrying the cookie canary; `/flaky` answers `503` with the error
 * canary in its reason phrase (and body) — the downstream's own error message.
 */
export class CanaryWeb {
  url = '';
  /** Requests served per path. */
  readonly served = new Map<string, number>();
  readonly #server: Server;

  constructor(private readonly canaries: Canaries) {
    this.#server = createServer((req, res) => {
      const path = new URL(req.url ?? '/', 'http://x').pathname;
      this.served.set(path, (this.served.get(path) ?? 0) + 1);
      res.setHeader('set-cookie', `session=${this.canaries.cookie}; HttpOnly; Path=/`);
      if (path === '/field-notes') {
        res.setHeader('content-type', 'text/markdown; charset=utf-8');
        return void res.end(
          `# Field notes\n\nThese notes were taken on a site visit; the reference phrase for this visit is ${this.canaries.pageText} and nothing else here matters.\n\nA second paragraph keeps the page longer than the excerpt.\n`,
        );
      }
      if (path === '/flaky') {
        res.writeHead(503, `Upstream failure ${this.canaries.errorMessage}`, { 'content-type': 'text/plain' });
        return void res.end(`upstream failure: ${this.canaries.errorMessage}`);
      }
      res.statusCode = 404;
      res.end('not found');
    });
  }

  get pageUrl(): string {
    return `${this.url}/field-notes`;
  }
  get flakyUrl(): string {
    return `${this.url}/flaky`;
  }

  async start(): Promise<this> {
    await new Promise<void>((r) => this.#server.listen(0, '127.0.0.1', r));
    this.url = `http://127.0.0.1:${(this.#server.address() as AddressInfo).port}`;
    return this;
  }

  async stop(): Promise<void> {
    this.#server.closeAllConnections();
    await new Promise<void>((r) => this.#server.close(() => r()));
  }
}

/** What {@link plantCanaries} did: how many kinds reached their place, and every outcome an agent got. */
export interface PlantedCanaries {
  /** Kinds that verifiably reached the place they were planted in (5 when all did). */
  planted: number;
  reached: Record<CanaryKind, boolean>;
  /** Every result the agents got back while planting (scanned for leaks, except a committed result's business fields). */
  returned: ExecuteResult[];
  keys: { page: string | null; flaky: string | null; note: string | null };
}

/**
 * Plants the five canaries through the normal paths: the operator token on a KB admin call, the
 * cookie from the page (and on a request to the KB), the page text through `web.fetch_page`, the
 * error message through a fetch of the flaky page (retryable, ends `rejected`), the note body
 * through `kb.write_note` by `writer` into `kb`. `token` must be the KB's operator token.
 */
export async function plantCanaries(o: {
  canaries: Canaries;
  web: CanaryWeb;
  kbUrl: string;
  reader: Tools;
  writer: Tools;
  kb: string;
  taskId: string;
}): Promise<PlantedCanaries> {
  const { canaries } = o;
  const returned: ExecuteResult[] = [];
  const kb = new KbClient(o.kbUrl);
  let tokenUsed = false;
  try {
    tokenUsed = (await kb.admin(canaries.token).list()).length >= 0;
  } finally {
    await kb.close();
  }
  const cookieSent =
    (await fetch(`${o.kbUrl}/healthz`, { headers: { cookie: `session=${canaries.cookie}` } })).status === 200;

  const page = await o.reader.execute<{ excerpt: string }>({
    tool: 'web.fetch_page',
    taskId: o.taskId,
    input: { url: o.web.pageUrl },
  });
  returned.push(page);
  const flaky = await o.reader.execute(
    { tool: 'web.fetch_page', taskId: o.taskId, input: { url: o.web.flakyUrl } },
    { budgetMs: 15_000 },
  );
  returned.push(flaky);
  const note = await o.writer.execute({
    tool: 'kb.write_note',
    taskId: o.taskId,
    input: {
      kb: o.kb,
      title: 'Canary note',
      body: `Private observation: ${canaries.noteBody}.`,
      sourceUrl: 'https://example.org/canary',
      fetchedAt: new Date().toISOString(),
    },
  });
  returned.push(note);

  const reached: Record<CanaryKind, boolean> = {
    token: tokenUsed,
    cookie: cookieSent && (o.web.served.get('/field-notes') ?? 0) > 0,
    noteBody: note.status === 'committed',
    pageText: page.status === 'committed' && page.result.excerpt.includes(canaries.pageText),
    errorMessage: (o.web.served.get('/flaky') ?? 0) > 0 && flaky.status !== 'committed',
  };
  return {
    planted: Object.values(reached).filter(Boolean).length,
    reached,
    returned,
    keys: { page: page.operationKey, flaky: flaky.operationKey, note: note.operationKey },
  };
}

/** One place a canary (or another secret given to the scanner) was found. */
export interface Leak {
  kind: CanaryKind | `secret:${string}`;
  source: string;
}

/**
 * Looks for every canary in text and bytes: as they are, base64-encoded, and — for bytes — in the
 * msgpack-decoded value too (a string split across msgpack's structure would still show there).
 */
export class LeakScanner {
  readonly leaks: Leak[] = [];
  /** Items (lines, messages, records, results) looked at. */
  scanned = 0;
  readonly #needles: [Leak['kind'], string[]][];

  /** `secrets`: more values that must never appear (key material: nkey seeds, signing keys, HMAC keys), by name. */
  constructor(canaries: Canaries, secrets: Record<string, string> = {}) {
    this.#needles = [
      ...CANARY_KINDS.map((k): [Leak['kind'], string[]] => [
        k,
        [canaries[k], Buffer.from(canaries[k]).toString('base64').slice(0, 20)],
      ]),
      ...Object.entries(secrets)
        .filter(([, v]) => v.length >= 16)
        .map(([name, v]): [Leak['kind'], string[]] => [`secret:${name}`, [v]]),
    ];
  }

  text(source: string, text: string): void {
    this.scanned++;
    for (const [kind, needles] of this.#needles)
      if (needles.some((n) => text.includes(n))) this.leaks.push({ kind, source });
  }

  bytes(source: string, data: Uint8Array): void {
    this.text(source, Buffer.from(data).toString('utf8'));
    this.text(source, Buffer.from(data).toString('latin1'));
    let decoded: unknown;
    try {
      decoded = decodeRaw(data);
    } catch {
      return;
    }
    this.text(`${source} (decoded)`, JSON.stringify(decoded) ?? '');
  }

  /**
   * Every result an agent got back: the whole of a refusal or an unknown (error, evidence), and of
   * a committed one everything but its business result (which is what the agent asked for).
   */
  returned(source: string, results: ExecuteResult[]): void {
    for (const r of results)
      this.text(source, JSON.stringify(r.status === 'committed' ? { ...r, result: undefined } : r));
  }

  /** Every line of every `*.log` file in `dir`. */
  logDir(dir: string): void {
    for (const f of readdirSync(dir)
      .filter((x) => x.endsWith('.log'))
      .sort()) {
      for (const line of readFileSync(join(dir, f), 'utf8').split('\n')) if (line) this.text(`log ${f}`, line);
    }
  }

  /**
   * Every message of every stream of the deployment except the two that legitimately hold
   * business data (the intent stream with the inputs, the result store): the event log, decisions,
   * advisories, the audit log and every KV projection (audit, reconciler index, frozen tasks, …),
   * raw and decoded, headers included. `js`/`jsm` must be a full-access (provisioner) connection.
   */
  async streams(js: JetStreamClient, jsm: JetStreamManager, subjects: Subjects): Promise<string[]> {
    const P = subjects.prefix.toUpperCase();
    // Each tenant's intake stream and the result store hold inputs and results by design.
    const legit = (name: string) => name.startsWith(`${P}_INTENTS_`) || name === `KV_${subjects.resultsBucket}`;
    const names: string[] = [];
    for await (const name of jsm.streams.names())
      if ((name.startsWith(`${P}_`) || name.startsWith(`KV_${subjects.prefix}_`)) && !legit(name)) names.push(name);
    for (const name of names.sort()) {
      const info = await jsm.streams.info(name);
      if (info.state.messages === 0) continue;
      const c = await js.consumers.get(name);
      const it = await c.consume();
      for await (const m of it) {
        this.bytes(`stream ${name} #${m.seq}`, m.data);
        if (m.headers)
          this.text(
            `stream ${name} #${m.seq} headers`,
            [...m.headers.keys()].map((k) => `${k}: ${m.headers!.values(k).join(',')}`).join('\n'),
          );
        if (m.seq >= info.state.last_seq) break;
      }
      it.stop();
    }
    return names;
  }
}
