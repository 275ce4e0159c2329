/**
 * Turns OpenTelemetry tracing on for a tooltx process when the standard variables ask for it
 * (docs/tracing.md): `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` set, and
 * neither `OTEL_SDK_DISABLED=true` nor `OTEL_TRACES_EXPORTER=none`. Spans then leave over OTLP/HTTP
 * (JSON) in batches (`OTEL_BSP_*`), with W3C Trace Context propagation. Otherwise nothing is loaded:
 * the OpenTelemetry SDK is imported only here, only then, and the code that makes spans runs on the
 * API's no-op (libs/nats trace-context.ts).
 */
import { z } from 'zod';
import { StartupError } from './startup.js';

const tracingEnvSchema = z.object({
  OTEL_EXPORTER_OTLP_ENDPOINT: z.url().optional(),
  OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: z.url().optional(),
  OTEL_SDK_DISABLED: z.string().optional(),
  OTEL_TRACES_EXPORTER: z.string().optional(),
  OTEL_SERVICE_NAME: z.string().min(1).max(200).optional(),
});

/** Whether `env` asks for spans to be exported (see the module doc). */
export function tracingWanted(env: NodeJS.ProcessEnv = process.env): boolean {
  if (env.OTEL_SDK_DISABLED?.toLowerCase() === 'true') return false;
  if (env.OTEL_TRACES_EXPORTER?.split(',').every((x) => x.trim() === 'none')) return false;
  return Boolean(env.OTEL_EXPORTER_OTLP_ENDPOINT || env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT);
}

/** A started tracer provider: `shutdown()` exports what is buffered and stops (idempotent). */
export interface Tracing {
  readonly enabled: boolean;
  shutdown(): Promise<void>;
}

const OFF: Tracing = { enabled: false, shutdown: async () => undefined };

/**
 * Registers the process-wide tracer provider when {@link tracingWanted}; `serviceName` names the
 * process in its spans (`service.name`, unless `OTEL_SERVICE_NAME` says otherwise), `instanceId`
 * its instance (`service.instance.id`). Throws a {@link StartupError} naming the variable when an
 * endpoint is not a URL (a setting to fix, reported at start like any other; its value is not shown:
 * an endpoint may carry credentials).
 */
export async function startTracing(o: {
  serviceName: string;
  instanceId?: string;
  version?: string;
}): Promise<Tracing> {
  if (!tracingWanted()) return OFF;
  const env = tracingEnvSchema.safeParse(process.env);
  if (!env.success) {
    const issue = env.error.issues[0]!;
    throw new StartupError(String(issue.path[0]), undefined, issue.message);
  }
  const [{ NodeTracerProvider, BatchSpanProcessor }, { OTLPTraceExporter }, { resourceFromAttributes }] =
    await Promise.all([
      import('@opentelemetry/sdk-trace-node'),
      import('@opentelemetry/exporter-trace-otlp-http'),
      import('@opentelemetry/resources'),
    ]);
  const provider = new NodeTracerProvider({
    resource: resourceFromAttributes({
      'service.name': env.data.OTEL_SERVICE_NAME ?? o.serviceName,
      'service.namespace': 'tooltx',
      ...(o.instanceId ? { 'service.instance.id': o.instanceId } : {}),
      ...(o.version ? { 'service.version': o.version } : {}),
    }),
    spanProcessors: [new BatchSpanProcessor(new OTLPTraceExporter())],
  });
  // W3C Trace Context propagation and an AsyncLocalStorage context manager, process-wide.
  provider.register();
  let stopping: Promise<void> | undefined;
  return {
    enabled: true,
    shutdown: () => (stopping ??= provider.shutdown().catch(() => undefined)),
  };
}
