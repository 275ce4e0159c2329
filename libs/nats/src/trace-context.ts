/**
 * W3C Trace Context across tooltx's hops (docs/tracing.md): an agent's call, its intent's NATS
 * headers, the authorizer's span, the accepted event (its `traceparent`), the executor's span and the
 * downstream request. Only `@opentelemetry/api` here: with no OpenTelemetry SDK registered (the
 * default: nothing is exported), every call below is the API's no-op and nothing is added to a
 * message. Spans name the tool and the operation, never an input or a result.
 */
import {
  context,
  propagation,
  type Attributes,
  type Context,
  type Span,
  SpanKind,
  SpanStatusCode,
  trace,
  type TextMapGetter,
  type TextMapSetter,
} from '@opentelemetry/api';
import { headers as natsHeaders, type MsgHdrs } from '@nats-io/nats-core';

export { SpanKind };
export type { Context, Span };

const TRACER = 'tooltx';

const recordSetter: TextMapSetter<Record<string, string>> = { set: (c, k, v) => void (c[k] = v) };
const recordGetter: TextMapGetter<Record<string, string>> = {
  get: (c, k) => c[k],
  keys: (c) => Object.keys(c),
};
const headerGetter: TextMapGetter<MsgHdrs | undefined> = {
  get: (h, k) => h?.get(k) || undefined,
  keys: (h) => (h ? [...h.keys()] : []),
};

/** The W3C propagation fields (`traceparent`, `tracestate`) of `ctx`; empty when tracing is off or nothing is traced. */
export function traceFieldsOf(ctx: Context = context.active()): Record<string, string> {
  const carrier: Record<string, string> = {};
  propagation.inject(ctx, carrier, recordSetter);
  return carrier;
}

/** NATS headers holding `ctx`'s trace context, or undefined when there is none to send. */
export function traceHeadersOf(ctx: Context = context.active()): MsgHdrs | undefined {
  const fields = traceFieldsOf(ctx);
  const keys = Object.keys(fields);
  if (keys.length === 0) return undefined;
  const h = natsHeaders();
  for (const k of keys) h.set(k, fields[k]!);
  return h;
}

/** The context a message's headers carry (its sender's span as parent), on top of the active one. */
export function contextOfHeaders(h: MsgHdrs | undefined): Context {
  if (!h) return context.active();
  return propagation.extract(context.active(), h, headerGetter);
}

/** The context of a stored `traceparent` (an accepted attempt's, docs/tracing.md), or the active one. */
export function contextOfTraceparent(traceparent: string | undefined): Context {
  if (!traceparent) return context.active();
  return propagation.extract(context.active(), { traceparent }, recordGetter);
}

/**
 * The context of W3C fields a caller sent in a message body (an MCP host's `params._meta`
 * `traceparent` / `tracestate`), or the active one when there are none.
 */
export function contextOfFields(fields: {
  traceparent?: string | undefined;
  tracestate?: string | undefined;
}): Context {
  if (!fields.traceparent) return context.active();
  const carrier: Record<string, string> = { traceparent: fields.traceparent };
  if (fields.tracestate) carrier.tracestate = fields.tracestate;
  return propagation.extract(context.active(), carrier, recordGetter);
}

/** Runs `fn` in `ctx` (a caller's trace context): spans made under it are its children. */
export function inContext<T>(ctx: Context, fn: () => T): T {
  return context.with(ctx, fn);
}

/** The `traceparent` of `span`, when it is recorded and valid (tracing on), else undefined. */
export function traceparentOf(span: Span): string | undefined {
  if (!span.isRecording()) return undefined;
  return traceFieldsOf(trace.setSpan(context.active(), span)).traceparent;
}

/**
 * The attributes of a tool call's span: the GenAI semantic conventions' (`gen_ai.operation.name`
 * `execute_tool`, `gen_ai.tool.name`, OpenTelemetry semconv "GenAI spans") and tooltx's own. Never
 * the input, the target or the result.
 */
export function toolSpanAttributes(a: {
  tool: string;
  version?: number;
  effect?: string;
  operationKey?: string;
}): Attributes {
  return {
    'gen_ai.operation.name': 'execute_tool',
    'gen_ai.tool.name': a.tool,
    'gen_ai.tool.type': 'function',
    ...(a.version !== undefined ? { 'tooltx.contract.version': a.version } : {}),
    ...(a.effect ? { 'tooltx.effect': a.effect } : {}),
    ...(a.operationKey ? { 'gen_ai.tool.call.id': a.operationKey, 'tooltx.operation.key': a.operationKey } : {}),
  };
}

/** Starts a span of tooltx's tracer under `parent` (the active context by default). */
export function startSpan(name: string, kind: SpanKind, attributes: Attributes, parent?: Context): Span {
  return trace.getTracer(TRACER).startSpan(name, { kind, attributes }, parent ?? context.active());
}

/**
 * Ends `span` with the operation's state (`tooltx.state`) and, for a refusal, its error class
 * (`error.type`, the span's status `ERROR`); an `unknown` is not an error of the call.
 */
export function endSpan(span: Span, state: string, errorClass?: string): void {
  if (span.isRecording()) {
    span.setAttribute('tooltx.state', state);
    if (errorClass) {
      span.setAttribute('error.type', errorClass);
      if (state === 'rejected') span.setStatus({ code: SpanStatusCode.ERROR });
    }
  }
  span.end();
}

/** Runs `fn` with `span` as the active span (so code under it, and instrumented clients, see it). */
export function withSpan<T>(span: Span, fn: () => T): T {
  return context.with(trace.setSpan(context.active(), span), fn);
}
