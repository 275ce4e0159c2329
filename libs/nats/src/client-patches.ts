/**
 * Two CPU cuts on nats.js 3.4.0 (`@nats-io/nats-core`, `@nats-io/transport-node`, pinned exactly in
 * package.json), applied by `connectNats` (./connect.ts) to every connection tooltx makes (services,
 * SDK, CLI, bench); measured in docs/performance.md.
 *
 * 1. **One socket write per event-loop turn** (per connection). nats-core's
 *    `ProtocolHandler.sendCommand` (lib/protocol.js) appends each PUB/HPUB/SUB/UNSUB to the
 *    connection's `outbound` DataBuffer and, when that buffer was empty, queues a *microtask* that
 *    calls `flushPending()` → `transport.send()` → `socket.write()`. Every handler publishes from its
 *    own promise chain, so its microtask flush usually runs before the next handler's publish: nearly
 *    one write syscall per message (bench main phase, /proc/PID/io, log writes included: the
 *    authorizer 8.6 writes per call before, 2.4 after; `writeBuffer` was 12–21 % of each service's
 *    sampled time). Here the connection's `sendCommand` is replaced by the same code with the flush
 *    deferred to `setImmediate` (once per turn), so everything a process publishes while handling one
 *    batch of socket reads leaves in one write. Measured (bench, before/after interleaved): CPU per
 *    call −20–30 % in total, nats-server's −30 % (fewer, larger reads), far fewer involuntary context
 *    switches on the 2-core machine. Corking the socket for the turn instead (`socket.cork()`,
 *    `uncork()` in `setImmediate`) measured the same within noise, but keeps a `socket.write` and a
 *    promise per flush and has to follow the socket across reconnects.
 *    Kept as upstream: the order of commands (one FIFO buffer); the inline flush once `pendingLimit`
 *    bytes (32 KiB) are pending; `flush()` (PING appended to the buffer and written synchronously, so
 *    its PONG still covers every earlier publish, which `drain()` relies on); reconnects (the hook
 *    sits on the ProtocolHandler, which survives reconnects: a new socket needs nothing; commands
 *    queued while disconnected are dropped at the reconnect by upstream's `resetOutbound()` either
 *    way). Added: `close()` first writes what is pending (upstream destroys the socket synchronously,
 *    before its microtask flush, and lost the commands of the current turn).
 *
 * 2. **No Error object per answered request** (process-wide). `RequestOne.resolver()` (lib/request.js)
 *    settles the request's promise and then calls `this.cancel()`, which builds
 *    `new RequestError("cancelled")` (a stack trace) only to reject the already settled promise — a
 *    no-op — on every PubAck, direct get and KV read, even with `noAsyncTraces` (3–6 % of CPU).
 *    Here `cancel()` without an error, on a request whose resolver already ran, does the rest of
 *    cancel (stop the timer, leave the mux) without that Error. A cancel before an answer (timeout,
 *    caller) is upstream's, unchanged.
 *
 * Both hooks check the upstream source they replace (`Function.prototype.toString` of the methods)
 * and the class identity of the connection; when it is not what they expect (a nats.js upgrade),
 * they leave nats.js alone and emit a process warning `TOOLTX_NATS_PATCH` naming what differed
 * — the connection works as upstream, only slower. libs/nats/test/client-patches.int.test.ts fails
 * then, so an upgrade cannot drop them silently. A runtime hook rather than `patch-package`: it
 * touches only connections tooltx makes, checks itself at run time (a patch file fails at install,
 * or applies to the wrong code silently if its context still matches), and needs no postinstall
 * step nor edits under node_modules.
 */
import { NatsConnectionImpl, ProtocolHandler, RequestOne } from '@nats-io/nats-core/internal';
import type { NatsConnection } from '@nats-io/transport-node';

/** Which hooks a connection got (see the module doc). */
export interface ClientPatches {
  /** PUB/SUB commands are flushed once per event-loop turn instead of once per microtask. */
  coalescedWrites: boolean;
  /** `RequestOne.cancel()` after an answer builds no Error (process-wide). */
  noCancelErrorAfterAnswer: boolean;
}

const PATCHED = Symbol.for('tooltx.nats.clientPatches');
const TE = new TextEncoder();

function warn(what: string): void {
  process.emitWarning(
    `nats.js internals differ from 3.4.0 (${what}); running without this CPU cut (libs/nats/src/client-patches.ts)`,
    { code: 'TOOLTX_NATS_PATCH' },
  );
}

/** True when `fn`'s source contains every one of `marks` (the upstream code a hook replaces). */
function sourceHas(fn: unknown, marks: string[]): boolean {
  if (typeof fn !== 'function') return false;
  const src = Function.prototype.toString.call(fn);
  return marks.every((m) => src.includes(m));
}

// ---- 2. RequestOne.cancel after an answer -------------------------------------------------------

const ANSWERED = Symbol('tooltx.nats.answered');
type RequestOneInternals = RequestOne & { [ANSWERED]?: true };
let requestPatch: boolean | undefined;

function patchRequestOne(): boolean {
  if (requestPatch !== undefined) return requestPatch;
  const p = RequestOne?.prototype as (RequestOne & { [PATCHED]?: true }) | undefined;
  if (p?.[PATCHED]) return (requestPatch = true);
  const resolver = p?.resolver;
  const cancel = p?.cancel;
  // Upstream 3.4.0: resolver settles `this.deferred`, then `this.cancel()`; cancel stops `this.timer`,
  // `this.mux.cancel(this)`, then rejects `this.deferred` with a new RequestError("cancelled").
  if (
    !p ||
    !sourceHas(resolver, ['this.deferred.resolve(msg)', 'this.deferred.reject(err)', 'this.cancel()']) ||
    !sourceHas(cancel, [
      'this.timer.cancel()',
      'this.mux.cancel(this)',
      'this.deferred.reject(err ? err : new errors_1.RequestError("cancelled"))',
    ])
  ) {
    warn('RequestOne.resolver/cancel');
    return (requestPatch = false);
  }
  p.resolver = function (this: RequestOneInternals, err, msg) {
    this[ANSWERED] = true;
    resolver!.call(this, err, msg);
  };
  p.cancel = function (this: RequestOneInternals, err?: Error) {
    if (err === undefined && this[ANSWERED]) {
      // The promise is settled: upstream's reject would be a no-op; the Error is all it would cost.
      this.timer?.cancel();
      this.mux.cancel(this);
      return;
    }
    cancel!.call(this, err);
  };
  p[PATCHED] = true;
  return (requestPatch = true);
}

// ---- 1. one socket write per turn --------------------------------------------------------------

/** The ProtocolHandler members the write hook uses (`flushPending` is private in the typings). */
interface Protocol {
  outbound: ProtocolHandler['outbound'];
  pendingLimit: number;
  transport: ProtocolHandler['transport'];
  sendCommand(cmd: string | Uint8Array, ...payloads: Uint8Array[]): void;
  close(err?: Error): Promise<void>;
  flushPending(): void;
  [PATCHED]?: true;
}

function upstreamProtocolOk(proto: unknown): proto is Protocol {
  if (!(proto instanceof ProtocolHandler)) return false;
  const p = proto as unknown as Protocol;
  return (
    // Instance methods must be the prototype's own (nobody patched this connection before).
    p.sendCommand === ProtocolHandler.prototype.sendCommand &&
    p.close === ProtocolHandler.prototype.close &&
    sourceHas(p.sendCommand, [
      'this.outbound.length()',
      'this.outbound.fill(buf, ...payloads)',
      'queueMicrotask',
      'this.flushPending()',
      'this.outbound.size() >= this.pendingLimit',
    ]) &&
    sourceHas(p.flushPending, ['this.outbound.drain()', 'this.transport.send(d)']) &&
    typeof p.outbound?.fill === 'function' &&
    typeof p.outbound?.size === 'function' &&
    typeof p.pendingLimit === 'number'
  );
}

function coalesceImmediate(proto: Protocol): void {
  let scheduled = false;
  const flushTurn = () => {
    scheduled = false;
    proto.flushPending();
  };
  proto.sendCommand = function (this: Protocol, cmd: string | Uint8Array, ...payloads: Uint8Array[]) {
    this.outbound.fill(typeof cmd === 'string' ? TE.encode(cmd) : cmd, ...payloads);
    if (this.outbound.size() >= this.pendingLimit) this.flushPending();
    else if (!scheduled) {
      scheduled = true;
      setImmediate(flushTurn);
    }
  };
  const close = proto.close;
  proto.close = function (this: Protocol, err?: Error) {
    this.flushPending();
    return close.call(this, err);
  };
}

/**
 * Applies both hooks to `nc` (idempotent) and returns which are active. Throws nothing: a hook whose
 * upstream code differs is skipped with a `TOOLTX_NATS_PATCH` process warning.
 */
export function applyClientPatches(nc: NatsConnection): ClientPatches {
  const noCancelErrorAfterAnswer = patchRequestOne();
  const proto = nc instanceof NatsConnectionImpl ? (nc.protocol as unknown) : undefined;
  if ((proto as Protocol | undefined)?.[PATCHED]) return { coalescedWrites: true, noCancelErrorAfterAnswer };
  if (!upstreamProtocolOk(proto)) {
    warn(
      nc instanceof NatsConnectionImpl
        ? 'ProtocolHandler.sendCommand/flushPending/close'
        : 'the connection is not a nats-core NatsConnectionImpl',
    );
    return { coalescedWrites: false, noCancelErrorAfterAnswer };
  }
  coalesceImmediate(proto);
  proto[PATCHED] = true;
  return { coalescedWrites: true, noCancelErrorAfterAnswer };
}

/** Which hooks `nc` has (for tests and diagnostics). */
export function clientPatchesOf(nc: NatsConnection): ClientPatches {
  const proto = nc instanceof NatsConnectionImpl ? (nc.protocol as unknown as Protocol) : undefined;
  return {
    coalescedWrites: proto?.[PATCHED] === true,
    noCancelErrorAfterAnswer: (RequestOne?.prototype as { [PATCHED]?: true } | undefined)?.[PATCHED] === true,
  };
}
