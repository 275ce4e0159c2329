import { createServer, request as httpRequest, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';

/**
 * A real HTTP hop between the executor and the KB that can hold a request before forwarding it —
 * the window in which a test changes the KB's authorisation state after the executor's re-check
 * (FM-07, FM-08). `hold(req)` returns ms to wait (0 = forward at once); `onHeld` fires when a
 * request starts waiting.
 */
export class DelayProxy {
  url = '';
  #server: Server;
  hold: (req: IncomingMessage) => number = () => 0;
  /** True = cut the connection instead of forwarding (the request never reaches the target). */
  drop: (req: IncomingMessage) => boolean = () => false;
  /** Ms to hold the target's RESPONSE after it answered (the target committed; the caller waits). */
  holdResponse: (req: IncomingMessage) => number = () => 0;
  /** True = forward, let the target answer, then cut the connection before the response (the target committed, the caller saw nothing). */
  cutResponse: (req: IncomingMessage) => boolean = () => false;
  /** Called once the target has answered a request whose response is held or cut. */
  onAnswered: (req: IncomingMessage, status: number) => void = () => undefined;
  onHeld: (req: IncomingMessage) => void = () => undefined;

  constructor(target: string) {
    const t = new URL(target);
    this.#server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        const wait = this.hold(req);
        if (wait > 0) this.onHeld(req);
        setTimeout(() => {
          if (this.drop(req)) return void res.destroy();
          const up = httpRequest({ host: t.hostname, port: t.port, method: req.method, path: req.url, headers: req.headers }, (r) => {
            const cut = this.cutResponse(req);
            const later = this.holdResponse(req);
            const body: Buffer[] = [];
            r.on('data', (c: Buffer) => body.push(c));
            r.on('end', () => {
              if (cut || later) this.onAnswered(req, r.statusCode ?? 0);
              if (cut) return void res.destroy();
              setTimeout(() => {
                res.writeHead(r.statusCode ?? 502, r.headers);
                res.end(Buffer.concat(body));
              }, later);
            });
          });
          up.on('error', () => res.destroy());
          up.end(Buffer.concat(chunks));
        }, wait);
      });
    });
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
