import { z } from 'zod';

const KiB = 1024;
const MiB = 1024 * KiB;

/**
 * What one tenant may use of a deployment (docs/tenancy.md). Each bound belongs to that tenant
 * alone: a tenant over one is refused `quota_exceeded` on its own calls and nobody else notices.
 *
 * - `intentBytes`, `intentMessages`: the tenant's intake stream (`<P>_INTENTS_<tenant>`), as
 *   `max_bytes` / `max_msgs` (-1: none) with discard new: a publish past them is refused (JetStream
 *   10077) and nothing stored is ever dropped. They count every intent stored within the stream's
 *   max age, accepted ones included. nats-server reserves `max_bytes` of its store for the stream
 *   when it is created, so the sum over tenants must fit `max_file_store`.
 * - `maxIntentBytes`: the largest intent the stream takes (`max_msg_size`, JetStream 10054).
 * - `decisionBytes`: the tenant's refusal and alias records (`<P>_DECISIONS_<tenant>`, `max_bytes`
 *   with discard old: past it, the tenant's own oldest records go, never another tenant's).
 * - `intentsPerSecond`, `intentBurst`: how fast one authorizer instance takes the tenant's intents
 *   (a token bucket); the rest waits in the tenant's own stream.
 * - `connections`: connections the tenant's account holds at once, agents and auditors together
 *   (the account's `max_connections`; one more is refused at connect). The account's `max_payload`
 *   is `maxIntentBytes`: a larger message is refused on the connection before any of it is read
 *   (nats.js refuses it before sending; a raw client is disconnected), never reaching a stream.
 * - `subscriptions`: subscriptions the tenant's account holds at once, all its connections together
 *   (the account's `max_subscriptions`): without it one tenant could subscribe until nats-server's
 *   memory ran out for every tenant. An SDK holds about three.
 *   Both optional in the tenants bucket: the services do not read them (nats-server enforces them).
 */
export const tenantLimitsSchema = z.strictObject({
  intentBytes: z
    .number()
    .int()
    .min(64 * KiB)
    .max(2 ** 50),
  intentMessages: z
    .number()
    .int()
    .max(2 ** 50)
    .refine((n) => n === -1 || n >= 16, 'at least 16, or -1 for no count bound'),
  maxIntentBytes: z
    .number()
    .int()
    .min(1 * KiB)
    .max(64 * MiB),
  decisionBytes: z
    .number()
    .int()
    .min(64 * KiB)
    .max(2 ** 50),
  intentsPerSecond: z.number().positive().max(1_000_000),
  intentBurst: z.number().int().min(1).max(1_000_000),
  connections: z.number().int().min(1).max(1_000_000).optional(),
  subscriptions: z.number().int().min(8).max(10_000_000).optional(),
});
export type TenantLimits = z.infer<typeof tenantLimitsSchema>;

/**
 * The defaults of every tenant (docs/tenancy.md "The limits and their defaults"). The intake bound
 * counts every intent the tenant stored within the intents' max age (7 days by default), the
 * accepted ones included (their inputs are read from it): 1 GiB, no count bound, is a week of about
 * 6,000 1 KB calls an hour. 1 MiB per intent (nats-server's default `max_payload`), 16 MiB of refusal
 * records (about 30,000), 20 intents/s with bursts of 20 per authorizer instance: one tenant at its
 * pace takes about a tenth of what a 2-core deployment completes (at 100/s one tenant saturated it
 * and the others waited seconds), and a burst small enough that the calls it lets through at once do
 * not queue another tenant's behind them in the shared event log; 256 connections (an SDK holds one) with 1,024 subscriptions among them (an SDK holds about three).
 */
export const DEFAULT_TENANT_LIMITS: TenantLimits = {
  intentBytes: 1024 * MiB,
  intentMessages: -1,
  maxIntentBytes: 1 * MiB,
  decisionBytes: 16 * MiB,
  intentsPerSecond: 20,
  intentBurst: 20,
  connections: 256,
  subscriptions: 1024,
};

/** Limits as written in an identity list: any subset; the rest comes from the list's `limits`, then the defaults. */
export const partialTenantLimitsSchema = tenantLimitsSchema.partial();
export type PartialTenantLimits = z.infer<typeof partialTenantLimitsSchema>;

/** One tenant of a deployment with its resolved limits: what the provisioner creates streams for. */
export interface TenantSpec {
  id: string;
  limits: TenantLimits;
}

/** The limits of a tenant: its own, over the list's, over {@link DEFAULT_TENANT_LIMITS}. */
export function resolveLimits(
  listDefaults: PartialTenantLimits | undefined,
  own: PartialTenantLimits | undefined,
): TenantLimits {
  return tenantLimitsSchema.parse({ ...DEFAULT_TENANT_LIMITS, ...listDefaults, ...own });
}

/** What the tenants bucket holds per tenant (`<p>_tenants`, key = tenant id): written by the provisioner, watched by the services. */
export const tenantEntrySchema = z.strictObject({ limits: tenantLimitsSchema });
export type TenantEntry = z.infer<typeof tenantEntrySchema>;
