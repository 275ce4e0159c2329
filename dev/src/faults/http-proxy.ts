import {
  createServer,
  request as httpRequest,
  type IncomingHttpHeaders,
  type IncomingMessage,
  type OutgoingHttpHeaders,
  type Server,
  type ServerResponse,
} from 'node:http';
import type { AddressInfo } from 'node:net';

/**
 * One fault for requests carrying a given key (the executor → KB hop):
 * - `delay`: hold the request `ms` before forwarding it (it still reaches the target, even when the
 *   caller has gone meanwhile — a request already on the wire);
 * - `drop`: cut the caller's connection instead of forwarding (the target never saw the request);
 * - `cut_response`: forward, let the target answer (it committed), then cut the caller's connection
 *   without a byte of the response;
 * - `hold_response`: forward, let the target answer, and give the caller the response only after
 *   `ms` (past the caller's deadline, the caller gives up first).
 */
export type HttpFault =
  | { kind: 'delay'; ms: number }
  | { kind: 'drop' }
  | { kind: 'cut_response' }
  | { kind: 'hold_response'; ms: number }
  /** Answered by the proxy in the target's place (status and JSON body): the request never reaches it. */
  | { kind: 'refuse'; status: number; body: Record<string, unknown> };

/** Where a keyed fault applies. */
export interface InjectOptions {
  /** Requests with this key it applies to, in arrival order (default 1; `Infinity` = every one). */
  times?: number;
  /** Narrows the requests with the key it applies to (default: any method except GET and HEAD — the writes). */
  when?: (req: IncomingMessage) => boolean;
}

/** A fault the proxy applied. `status` = the target's answer (absent when it was never forwarded); times in ms since the epoch. */
export interface InjectedFault {
  key: string;
  kind: HttpFault['kind'];
  method: string;
  path: string;
  /** When the request arrived at the proxy. */
  at: number;
  /** When the target answered (absent for `drop`). */
  answeredAt?: number;
  status?: number;
}

/** A programmed fault: `applied` resolves when it took effect (`drop`: dropped; the others: the target answered). */
export interface Injection {
  readonly applied: Promise<InjectedFault>;
  /** Removes the fault if it has not been applied yet (an applied one is not undone). */
  cancel(): void;
}

interface Rule {
  key: string;
  fault: HttpFault;
  left: number;
  when: (req: IncomingMessage) => boolean;
  resolve: (f: InjectedFault) => void;
}

/** Hop-by-hop headers (RFC 9110 §7.6.1) the proxy never copies across. */
const HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'transfer-encoding',
  'te',
  'trailer',
  'upgrade',
  'content-length',
]);

const isWrite = (req: IncomingMessage) => req.method !== 'GET' && req.method !== 'HEAD';

/**
 * A real HTTP hop between a caller (the executor's tool implementations) and a target (the KB).
 *
 * Keyed faults: {@link HttpFaultProxy.inject} programs a fault for the requests whose `keyHeader`
 * (default `idempotency-key`, which the research KB client sends with every write: the
 * tenant-scoped downstream key, not a secret) has a given value. The proxy closes every
 * connection after one request (`connection: close` both ways), so a cut touches exactly one
 * request; run the caller with keep-alive off too (`KB_KEEPALIVE=off` for the research tools).
 *
 * Predicate faults (the older API, for a request without a key such as the KB's resolver): `hold`,
 * `drop`, `holdResponse`, `cutResponse` are functions of the request; a keyed fault wins over them.
 */
export class HttpFaultProxy {
  url = '';
  /** Every fault applied so far, in order. */
  readonly injected: InjectedFault[] = [];
  /** Ms to hold a request before forwarding it (0 = at once). */
  hold: (req: IncomingMessage) => number = () => 0;
  /** True = cut the connection instead of forwarding (the request never reaches the target). */
  drop: (req: IncomingMessage) => boolean = () => false;
  /** Ms to hold the target's RESPONSE after it answered (the target committed; the caller waits). */
  holdResponse: (req: IncomingMessage) => number = () => 0;
  /** True = forward, let the target answer, then cut the connection before the response (the target committed, the caller saw nothing). */
  cutResponse: (req: IncomingMessage) => boolean = () => false;
  /** Called once the target has answered a request whose response is held or cut. */
  onAnswered: (req: IncomingMessage, status: number) => void = () => undefined;
  /** Called when a request starts waiting before being forwarded. */
  onHeld: (req: IncomingMessage) => void = () => undefined;

  readonly #target: URL;
  readonly #keyHeader: string;
  readonly #server: Server;
  #rules: Rule[] = [];
  readonly #timers = new Set<NodeJS.Timeout>();
  #stopped = false;

  /** `target` like `http://127.0.0.1:4280`; `opts.keyHeader` names the header faults are keyed on (lower case). */
  constructor(target: string, opts: { keyHeader?: string } = {}) {
    this.#target = new URL(target);
    this.#keyHeader = (opts.keyHeader ?? 'idempotency-key').toLowerCase();
    this.#server = createServer((req, res) => this.#handle(req, res));
  }

  /**
   * Programs `fault` for the next request(s) carrying `key` in the key header. Throws `RangeError`
   * for a negative or non-finite `ms`.
   */
  inject(key: string, fault: HttpFault, opts: InjectOptions = {}): Injection {
    if ('ms' in fault && !(Number.isFinite(fault.ms) && fault.ms >= 0))
      throw new RangeError(`fault ms must be a finite number ≥ 0, got ${fault.ms}`);
    let resolve!: (f: InjectedFault) => void;
    const applied = new Promise<InjectedFault>((r) => (resolve = r));
    const rule: Rule = { key, fault, left: opts.times ?? 1, when: opts.when ?? isWrite, resolve };
    this.#rules.push(rule);
    return { applied, cancel: () => void (this.#rules = this.#rules.filter((r) => r !== rule)) };
  }

  /** Removes every keyed fault not applied yet and resets the predicates. */
  clear(): void {
    this.#rules = [];
    this.hold = () => 0;
    this.drop = () => false;
    this.holdResponse = () => 0;
    this.cutResponse = () => false;
    this.onAnswered = () => undefined;
    this.onHeld = () => undefined;
  }

  async start(): Promise<this> {
    await new Promise<void>((r) => this.#server.listen(0, '127.0.0.1', r));
    this.url = `http://127.0.0.1:${(this.#server.address() as AddressInfo).port}`;
    return this;
  }

  /** Cuts every open connection, cancels held requests and responses, closes the listener. */
  async stop(): Promise<void> {
    this.#stopped = true;
    for (const t of this.#timers) clearTimeout(t);
    this.#timers.clear();
    this.#server.closeAllConnections();
    await new Promise<void>((r) => this.#server.close(() => r()));
  }

  #later(ms: number, fn: () => void): void {
    if (this.#stopped) return;
    const t = setTimeout(() => {
      this.#timers.delete(t);
      if (!this.#stopped) fn();
    }, ms);
    this.#timers.add(t);
  }

  /** The keyed rule for this request, consumed (one application), or null. */
  #take(req: IncomingMessage): Rule | null {
    const raw = req.headers[this.#keyHeader];
    const key = Array.isArray(raw) ? raw[0] : raw;
    if (key === undefined) return null;
    const rule = this.#rules.find((r) => r.key === key && r.when(req));
    if (!rule) return null;
    if (--rule.left <= 0) this.#rules = this.#rules.filter((r) => r !== rule);
    return rule;
  }

  #handle(req: IncomingMessage, res: ServerResponse): void {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks);
      const rule = this.#take(req);
      const record: InjectedFault | null = rule
        ? { key: rule.key, kind: rule.fault.kind, method: req.method ?? '', path: req.url ?? '', at: Date.now() }
        : null;
      const applied = () => {
        if (!rule || !record) return;
        this.injected.push(record);
        rule.resolve(record);
      };
      // What to do, from the keyed fault when there is one, else from the predicates.
      const f = rule?.fault;
      const wait = f ? (f.kind === 'delay' ? f.ms : 0) : this.hold(req);
      const drop = f ? f.kind === 'drop' : undefined;
      if (!f && wait > 0) this.onHeld(req);
      if (f?.kind === 'refuse') {
        const answer = Buffer.from(JSON.stringify(f.body));
        res.writeHead(f.status, { 'content-type': 'application/json', 'content-length': answer.length });
        res.end(answer);
        if (record) {
          record.answeredAt = Date.now();
          record.status = f.status;
        }
        return applied();
      }
      this.#later(wait, () => {
        if (drop ?? this.drop(req)) {
          res.destroy();
          return applied();
        }
        this.#forward(
          req,
          body,
          (status, headers, answer) => {
            const cut = f ? f.kind === 'cut_response' : this.cutResponse(req);
            const later = f ? (f.kind === 'hold_response' ? f.ms : 0) : this.holdResponse(req);
            if (record) {
              record.answeredAt = Date.now();
              record.status = status;
              applied();
            } else if (cut || later) this.onAnswered(req, status);
            if (cut) return void res.destroy();
            this.#later(later, () => {
              if (res.destroyed || res.writableEnded) return;
              res.writeHead(status, { ...headers, 'content-length': answer.length, connection: 'close' });
              res.end(answer);
            });
          },
          () => res.destroy(),
        );
      });
    });
  }

  /** Sends the request to the target on a fresh connection (no pooling) and buffers the answer. */
  #forward(
    req: IncomingMessage,
    body: Buffer,
    onAnswer: (status: number, headers: OutgoingHttpHeaders, body: Buffer) => void,
    onError: () => void,
  ): void {
    const headers = endToEnd(req.headers);
    if (body.length > 0 || req.headers['content-length'] !== undefined) headers['content-length'] = body.length;
    const up = httpRequest(
      {
        host: this.#target.hostname,
        port: this.#target.port,
        method: req.method,
        path: req.url,
        headers,
        agent: false,
      },
      (r) => {
        const answer: Buffer[] = [];
        r.on('data', (c: Buffer) => answer.push(c));
        r.on('end', () => onAnswer(r.statusCode ?? 502, endToEnd(r.headers), Buffer.concat(answer)));
        r.on('error', onError);
      },
    );
    up.on('error', onError);
    up.end(body);
  }
}

function endToEnd(h: IncomingHttpHeaders): OutgoingHttpHeaders {
  const out: OutgoingHttpHeaders = {};
  for (const [k, v] of Object.entries(h)) if (v !== undefined && !HOP.has(k)) out[k] = v;
  return out;
}
