import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';

export interface SinkRequest {
  path: string;
  body: Record<string, unknown>;
  at: number;
  /** The id the sink answered with (when it answered). */
  answeredId?: string;
}

/**
 * A real HTTP downstream that does NOT deduplicate: every request that reaches it is recorded and
 * answered with a fresh id. `delayMs` holds every answer; `hang` never answers (a timeout);
 * `refuseWritesWith` answers writes with an error status.
 */
export class Sink {
  readonly requests: SinkRequest[] = [];
  delayMs = 0;
  hang = false;
  /** When set, writes are answered with this HTTP status (e.g. 403: the sink refused, nothing applied). */
  refuseWritesWith = 0;
  #server: Server;
  #seq = 0;
  url = '';

  constructor() {
    this.#server = createServer((req, res) => {
      let data = '';
      req.setEncoding('utf8');
      req.on('data', (c: string) => (data += c));
      req.on('end', () => {
        const body = JSON.parse(data || '{}') as Record<string, unknown>;
        const record: SinkRequest = { path: req.url ?? '', body, at: Date.now() };
        this.requests.push(record);
        if (this.hang) return;
        const answer = () => {
          res.setHeader('content-type', 'application/json');
          if (req.url === '/lookup') res.end(JSON.stringify({ value: `v-${String(body.name)}` }));
          else if (this.refuseWritesWith) {
            res.statusCode = this.refuseWritesWith;
            res.end('{}');
          } else {
            record.answeredId = `note-${++this.#seq}`;
            res.end(JSON.stringify({ id: record.answeredId }));
          }
        };
        if (this.delayMs) setTimeout(answer, this.delayMs);
        else answer();
      });
    });
  }

  async start(): Promise<this> {
    await new Promise<void>((r) => this.#server.listen(0, '127.0.0.1', r));
    this.url = `http://127.0.0.1:${(this.#server.address() as AddressInfo).port}`;
    return this;
  }

  writesFor(predicate: (b: Record<string, unknown>) => boolean = () => true): SinkRequest[] {
    return this.requests.filter((r) => r.path === '/write' && predicate(r.body));
  }

  async stop(): Promise<void> {
    this.#server.closeAllConnections();
    await new Promise<void>((r) => this.#server.close(() => r()));
  }
}
