import { createServer, connect, type Server, type Socket } from 'node:net';
import type { AddressInfo } from 'node:net';

/**
 * A real TCP hop between agents and nats-server: every client connection is piped to the target;
 * `cutAll()` destroys every live connection at once (the client sees a cut, then reconnects through
 * the proxy). Issue 7's fault harness, agent side.
 */
export class TcpProxy {
  url = '';
  #server: Server;
  #pairs = new Set<[Socket, Socket]>();

  constructor(targetPort: number) {
    this.#server = createServer((client) => {
      const upstream = connect(targetPort, '127.0.0.1');
      const pair: [Socket, Socket] = [client, upstream];
      this.#pairs.add(pair);
      const close = () => {
        client.destroy();
        upstream.destroy();
        this.#pairs.delete(pair);
      };
      client.on('error', close).on('close', close);
      upstream.on('error', close).on('close', close);
      client.pipe(upstream);
      upstream.pipe(client);
    });
  }

  async start(): Promise<this> {
    await new Promise<void>((r) => this.#server.listen(0, '127.0.0.1', r));
    this.url = `nats://127.0.0.1:${(this.#server.address() as AddressInfo).port}`;
    return this;
  }

  /** Cuts every live connection; returns how many were cut. */
  cutAll(): number {
    const n = this.#pairs.size;
    for (const [a, b] of [...this.#pairs]) {
      a.destroy();
      b.destroy();
    }
    this.#pairs.clear();
    return n;
  }

  async stop(): Promise<void> {
    this.cutAll();
    await new Promise<void>((r) => this.#server.close(() => r()));
  }
}
