/**
 * tooltx authorizer — consumes each tenant's intents, checks them in the order docs/lifecycle.md
 * gives and registers operations; also serves the status endpoint (`<prefix>.status.<tenant>.<actor>`,
 * queue group `tooltx-status`).
 *
 * Usage: `tsx services/authorizer/src/main.ts [--help]`. Configuration from the environment:
 * NATS_URL, NATS_CREDS_FILE, TOOLTX_PREFIX, TOOLTX_TOOLS_MODULE (required), TOOLTX_CONCURRENCY
 * (intents handled at once per tenant), LOG_LEVEL, TOOLTX_INSTANCE_ID and the stream settings of
 * `tooltx streams apply`. The tenants and their limits come from the tenants bucket
 * (docs/tenancy.md): one intake consumer per tenant, each paced by the tenant's own rate, so one
 * tenant's backlog never delays another's.
 * Stops cleanly on SIGTERM/SIGINT: stops pulling, finishes in-flight intents, drains.
 */
import { runService } from '@tooltx/runtime/service';
import { authorizerRole } from './role.js';

await runService(authorizerRole);
