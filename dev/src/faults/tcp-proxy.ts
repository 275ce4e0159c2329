import { connect, createServer, type AddressInfo, type Server, type Socket } from 'node:net';

/** Which way bytes flow: `up` = client → target, `down` = target → client. */
export type Direction = 'up' | 'down';

/**
 * One proxied client connection, addressable by accept order (`id`, from 1) or by what the client
 * said first (`head`; for NATS, `name` is the client name of its `CONNECT` line, e.g.
 * `tooltx-sdk:acme/alice`).
 */
export interface TcpConnection {
  /** Accept order, from 1. */
  readonly id: number;
  /** The NATS client name from the client's `CONNECT {…}` line, once it has been sent. */
  readonly name: string | undefined;
  /** The first bytes the client sent (latin1, at most 4 KiB). */
  readonly head: string;
  /** Bytes forwarded so far each way. */
  readonly bytesUp: number;
  readonly bytesDown: number;
  readonly closed: boolean;
  /**
   * Delays every chunk forwarded from now on by `ms` (`direction` default `both`; `down` = only
   * what goes back to the client). Order is kept; 0 removes the delay.
   */
  delay(ms: number, direction?: Direction | 'both'): void;
  /** Destroys both sides now (the client sees the connection drop). */
  cut(): void;
  /** Forwards `bytes` more bytes back to the client, then cuts (0 = now). */
  cutAfterBytesDown(bytes: number): void;
}

/**
 * Which connections a programmed fault applies to: the `nth` accepted (from 1), those whose NATS
 * client name equals / matches `name`, or a predicate (checked when a connection is accepted and
 * again once its client name is known).
 */
export type ConnectionMatch = { nth: number } | { name: string | RegExp } | ((c: TcpConnection) => boolean);

/** A per-connection fault: see the {@link TcpConnection} methods of the same names. */
export type TcpFault =
  | { kind: 'delay'; ms: number; direction?: Direction | 'both' }
  | { kind: 'cut' }
  | { kind: 'cut_after_bytes_down'; bytes: number };

/** A fault the proxy applied to a connection; `at` in ms since the epoch. */
export interface TcpInjectedFault {
  connection: number;
  name: string | undefined;
  kind: TcpFault['kind'];
  at: number;
}

interface Rule {
  match: ConnectionMatch;
  fault: TcpFault;
  left: number;
  resolve: (f: TcpInjectedFault) => void;
  seen: Set<number>;
}

const HEAD_BYTES = 4_096;

class Conn implements TcpConnection {
  readonly id: number;
  name: string | undefined;
  head = '';
  bytesUp = 0;
  bytesDown = 0;
  closed = false;
  readonly #client: Socket;
  readonly #upstream: Socket;
  readonly #delay = { up: 0, down: 0 };
  readonly #queue = { up: [] as { at: number; chunk: Buffer }[], down: [] as { at: number; chunk: Buffer }[] };
  readonly #timer: Record<Direction, NodeJS.Timeout | null> = { up: null, down: null };
  #cutAfterDown: number | null = null;
  #halted = false;
  readonly #onName: (c: Conn) => void;

  constructor(id: number, client: Socket, upstream: Socket, onName: (c: Conn) => void, onClose: (c: Conn) => void) {
    this.id = id;
    this.#client = client;
    this.#upstream = upstream;
    this.#onName = onName;
    const close = () => {
      if (this.closed) return;
      this.closed = true;
      for (const d of ['up', 'down'] as const) if (this.#timer[d]) clearTimeout(this.#timer[d]);
      client.destroy();
      upstream.destroy();
      onClose(this);
    };
    client
      .on('data', (c: Buffer) => this.#arrive('up', c))
      .on('error', close)
      .on('close', close);
    upstream
      .on('data', (c: Buffer) => this.#arrive('down', c))
      .on('error', close)
      .on('close', close);
  }

  delay(ms: number, direction: Direction | 'both' = 'both'): void {
    if (!(Number.isFinite(ms) && ms >= 0)) throw new RangeError(`delay must be a finite number ≥ 0, got ${ms}`);
    if (direction !== 'down') this.#delay.up = ms;
    if (direction !== 'up') this.#delay.down = ms;
  }

  cut(): void {
    this.#client.destroy();
    this.#upstream.destroy();
  }

  cutAfterBytesDown(bytes: number): void {
    if (!(Number.isInteger(bytes) && bytes >= 0)) throw new RangeError(`bytes must be an integer ≥ 0, got ${bytes}`);
    if (bytes === 0) {
      this.cut();
      return;
    }
    this.#cutAfterDown = bytes;
  }

  #arrive(dir: Direction, chunk: Buffer): void {
    if (this.closed || this.#halted) return;
    if (dir === 'up' && this.head.length < HEAD_BYTES) {
      this.head += chunk.subarray(0, HEAD_BYTES - this.head.length).toString('latin1');
      if (this.name === undefined) {
        const m = /(?:^|\r\n)CONNECT (\{.*?\})\r\n/.exec(this.head);
        if (m) {
          try {
            const name = (JSON.parse(m[1]!) as { name?: unknown }).name;
            this.name = typeof name === 'string' ? name : '';
          } catch {
            this.name = '';
          }
          this.#onName(this);
          if (this.closed) return;
        }
      }
    }
    // One ordered queue per direction: a chunk leaves at arrival + the delay in force, never
    // before the chunk ahead of it.
    const q = this.#queue[dir];
    const last = q.at(-1)?.at ?? 0;
    q.push({ at: Math.max(Date.now() + this.#delay[dir], last), chunk });
    this.#pump(dir);
  }

  #pump(dir: Direction): void {
    if (this.#timer[dir]) return;
    const q = this.#queue[dir];
    while (q.length && !this.closed && !this.#halted) {
      const wait = q[0]!.at - Date.now();
      if (wait > 0) {
        this.#timer[dir] = setTimeout(() => {
          this.#timer[dir] = null;
          this.#pump(dir);
        }, wait);
        return;
      }
      this.#send(dir, q.shift()!.chunk);
    }
  }

  #send(dir: Direction, chunk: Buffer): void {
    if (dir === 'up') {
      this.bytesUp += chunk.length;
      this.#upstream.write(chunk);
      return;
    }
    if (this.#cutAfterDown !== null && chunk.length >= this.#cutAfterDown) {
      const part = chunk.subarray(0, this.#cutAfterDown);
      this.bytesDown += part.length;
      this.#cutAfterDown = null;
      this.#halted = true; // nothing more is forwarded either way; both sides go once the part is out
      this.#client.write(part, () => this.cut());
      return;
    }
    if (this.#cutAfterDown !== null) this.#cutAfterDown -= chunk.length;
    this.bytesDown += chunk.length;
    this.#client.write(chunk);
  }
}

/**
 * A real TCP hop between clients (agents) and a target (nats-server), programmable per connection
 * : delay each way or back only, cut now, cut after N more bytes back to the
 * client. A connection is addressed by its accept order or by its NATS client name, either live
 * ({@link TcpFaultProxy.connections}, {@link TcpFaultProxy.waitForConnection}) or ahead of time
 * ({@link TcpFaultProxy.program}). Flow control is not modelled (the test traffic is small).
 */
export class TcpFaultProxy {
  url = '';
  /** Every fault applied through {@link TcpFaultProxy.program}, in order. */
  readonly injected: TcpInjectedFault[] = [];
  readonly #server: Server;
  readonly #live = new Map<number, Conn>();
  #accepted = 0;
  #rules: Rule[] = [];
  #waiters: { match: ConnectionMatch; resolve: (c: TcpConnection) => void }[] = [];
  readonly #scheme: string;

  /**
   * `target`: a port on 127.0.0.1, or a host and port. `opts.scheme` is the scheme of {@link url}
   * (default `nats`).
   */
  constructor(target: number | { host?: string; port: number }, opts: { scheme?: string } = {}) {
    const t =
      typeof target === 'number'
        ? { host: '127.0.0.1', port: target }
        : { host: target.host ?? '127.0.0.1', port: target.port };
    this.#scheme = opts.scheme ?? 'nats';
    this.#server = createServer((client) => {
      const upstream = connect(t.port, t.host);
      const c = new Conn(
        ++this.#accepted,
        client,
        upstream,
        (x) => this.#check(x),
        (x) => this.#live.delete(x.id),
      );
      this.#live.set(c.id, c);
      this.#check(c);
    });
  }

  /** A proxy to the host and port of a `nats://host:port` URL (the first of a comma-separated list). */
  static forUrl(url: string, opts: { scheme?: string } = {}): TcpFaultProxy {
    const u = new URL(url.split(',')[0]!.trim());
    return new TcpFaultProxy({ host: u.hostname, port: Number(u.port || 4222) }, opts);
  }

  async start(): Promise<this> {
    await new Promise<void>((r) => this.#server.listen(0, '127.0.0.1', r));
    this.url = `${this.#scheme}://127.0.0.1:${(this.#server.address() as AddressInfo).port}`;
    return this;
  }

  /** The live connections, in accept order. */
  get connections(): TcpConnection[] {
    return [...this.#live.values()];
  }

  /** Connections accepted so far (the next one is number `accepted + 1`). */
  get accepted(): number {
    return this.#accepted;
  }

  /**
   * Applies `fault` to the live connections that match and to those accepted later, `times`
   * connections in all (default 1; `Infinity` = every match). `applied` resolves with the first
   * application. A name match applies once the client has sent its `CONNECT` line.
   */
  program(
    match: ConnectionMatch,
    fault: TcpFault,
    opts: { times?: number } = {},
  ): { applied: Promise<TcpInjectedFault>; cancel(): void } {
    let resolve!: (f: TcpInjectedFault) => void;
    const applied = new Promise<TcpInjectedFault>((r) => (resolve = r));
    const rule: Rule = { match, fault, left: opts.times ?? 1, resolve, seen: new Set() };
    this.#rules.push(rule);
    for (const c of [...this.#live.values()]) this.#check(c);
    return { applied, cancel: () => void (this.#rules = this.#rules.filter((r) => r !== rule)) };
  }

  /** Resolves with the first connection (live or later) that matches; rejects after `timeoutMs`. */
  waitForConnection(match: ConnectionMatch, timeoutMs = 30_000): Promise<TcpConnection> {
    const now = [...this.#live.values()].find((c) => matches(match, c));
    if (now) return Promise.resolve(now);
    return new Promise((resolve, reject) => {
      const w = {
        match,
        resolve: (c: TcpConnection) => {
          clearTimeout(timer);
          resolve(c);
        },
      };
      const timer = setTimeout(() => {
        this.#waiters = this.#waiters.filter((x) => x !== w);
        reject(new Error(`no matching connection within ${timeoutMs} ms`));
      }, timeoutMs);
      this.#waiters.push(w);
    });
  }

  /** Cuts every live connection; returns how many were cut. */
  cutAll(): number {
    const all = [...this.#live.values()];
    for (const c of all) c.cut();
    return all.length;
  }

  async stop(): Promise<void> {
    this.#rules = [];
    this.cutAll();
    await new Promise<void>((r) => this.#server.close(() => r()));
  }

  #check(c: Conn): void {
    for (const w of [...this.#waiters]) {
      if (matches(w.match, c)) {
        this.#waiters = this.#waiters.filter((x) => x !== w);
        w.resolve(c);
      }
    }
    for (const rule of [...this.#rules]) {
      if (c.closed || rule.seen.has(c.id) || !matches(rule.match, c)) continue;
      rule.seen.add(c.id);
      if (--rule.left <= 0) this.#rules = this.#rules.filter((r) => r !== rule);
      const record: TcpInjectedFault = { connection: c.id, name: c.name, kind: rule.fault.kind, at: Date.now() };
      this.injected.push(record);
      rule.resolve(record);
      const f = rule.fault;
      if (f.kind === 'delay') c.delay(f.ms, f.direction);
      else if (f.kind === 'cut') c.cut();
      else c.cutAfterBytesDown(f.bytes);
    }
  }
}

function matches(m: ConnectionMatch, c: TcpConnection): boolean {
  if (typeof m === 'function') return m(c);
  if ('nth' in m) return c.id === m.nth;
  if (c.name === undefined) return false;
  return typeof m.name === 'string' ? c.name === m.name : m.name.test(c.name);
}
