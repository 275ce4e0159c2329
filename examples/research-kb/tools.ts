/**
 * The research-KB sample's trusted side (loaded by the authorizer, executor and reconciler from
 * `TOOLTX_TOOLS_MODULE`, never by agents).
 *
 * - `web.fetch_page` fetches a page and returns `{ url, title, excerpt }` (never the whole page).
 *   A host that is, or resolves to, any loopback, private, link-local, unspecified, multicast or
 *   other non-public address is refused (`invalid_input` at `input.url`, code `private_address`)
 *   unless its origin is listed in `WEB_ALLOWED_ORIGINS` (comma-separated) — a fetch tool must not
 *   be a way into the trusted network. The connection goes only to an address that passed the check
 *   (./public-address.ts: resolved again and checked at connect time). Redirects are not followed.
 * - `kb.write_note`, `kb.write_notes` (batch) and `kb.delete_note` talk to the KB storage service at
 *   `KB_URL`. The policy seam resolves every knowledge-base reference through the KB's one resolver
 *   (FM-10) and checks the actor's role and the state; the executor re-runs it at the execution
 *   instant and sends the authorisation version it saw as `if-match`, so a role revoked or a KB
 *   transferred or frozen after the check stops the commit inside the KB's transaction (FM-07, FM-08).
 *   Every KB request carries the service token of `KB_SERVICE_TOKEN_FILE` (the file the KB has as
 *   its own `KB_SERVICE_TOKEN_FILE`; mode 0600, >= 32 characters, checked at start): only this
 *   trusted side may set the identity headers the KB's checks rest on. Unset, none is sent (a KB
 *   without one trusts any caller: development only).
 *
 * - `mail.send_draft`, `mail.send` and `mail.send_correction` talk to the mail outbox at `MAIL_URL`
 *   (./mail-tools.ts): one deployment serves the KB's tools and the mail tools.
 *
 * Error convention: a `TooltxError` means the KB definitively did not apply the request; network
 * errors, 5xx and aborts propagate as they are (outcome unknown).
 */
import { fetch } from 'undici';
import { LRUCache } from 'lru-cache';
import {
  DeadlinePassedError,
  defineImplementation,
  ErrorClass,
  invalidInput,
  TooltxError,
  type AuthorizationContext,
  type AuthorizationResult,
  type ProbeResult,
  type ReadContext,
} from '@tooltx/contracts';
import { KbClient, KbError, type KbResolution } from './kb-client.js';
import { kbDedupFromEnv, kbTimingFromEnv, researchContracts } from './contracts.js';
import { excerptOf, titleOf } from './excerpt.js';
import { mailImplementations, mailSettingsHelp } from './mail-tools.js';
import { readKeyFile, SecretFileError, StartupError } from '@tooltx/runtime';
import {
  checkLiteralHost,
  isPrivateAddressRefusal,
  PrivateAddressError,
  publicOnlyDispatcher,
} from './public-address.js';

/** A setting of this module the service cannot start with: named with its value (libs/runtime startup errors). */
function setting<T>(name: string, read: () => T): T {
  try {
    return read();
  } catch (err) {
    throw new StartupError(
      name,
      process.env[name],
      err instanceof TypeError ? err.message.replace(/^[A-Z_]+: /, '') : 'invalid',
      { cause: err },
    );
  }
}
const { fetchPage, writeNote, writeNotes, deleteNote } = researchContracts({
  kbDedup: setting('KB_DEDUP', () => kbDedupFromEnv()),
  timing: setting('KB_TIMING_MS', () => kbTimingFromEnv()),
});
// One pool for the process. KB_KEEPALIVE=off closes every connection after its request.
const keepAlive = setting('KB_KEEPALIVE', () => {
  const v = process.env.KB_KEEPALIVE ?? 'on';
  if (v !== 'on' && v !== 'off') throw new TypeError('KB_KEEPALIVE: expected "on" or "off"');
  return v === 'on';
});
// The KB's service credential (kb-server.ts): read and checked like every key file (libs/runtime secrets.ts).
const serviceTokenFile = process.env.KB_SERVICE_TOKEN_FILE;
let serviceToken: string | undefined;
if (serviceTokenFile !== undefined) {
  try {
    serviceToken = readKeyFile(serviceTokenFile).toString('utf8');
  } catch (err) {
    throw err instanceof SecretFileError
      ? new StartupError('KB_SERVICE_TOKEN_FILE', err.file, err.problem, { cause: err })
      : err;
  }
}
const kb = new KbClient(
  setting('KB_URL', () => new URL(process.env.KB_URL ?? 'http://127.0.0.1:4280').href.replace(/\/$/, '')),
  { keepAlive, serviceToken },
);
/**
 * How long (ms) a reader's role seen by the status endpoint's read policy may be reused for the same
 * tenant, actor and knowledge base: `KB_READ_POLICY_CACHE_MS`, an integer 0–60000, default 1000;
 * 0 asks the KB on every read. Only a role that allowed the read is kept, so a grant takes effect at
 * once and a revocation within this bound. Writes never use it: intake and the execution instant
 * always ask the KB (FM-07, FM-08).
 */
const readPolicyCacheMs = setting('KB_READ_POLICY_CACHE_MS', () => {
  const v = process.env.KB_READ_POLICY_CACHE_MS;
  if (v === undefined || v === '') return 1_000;
  if (!/^\d{1,5}$/.test(v) || Number(v) > 60_000)
    throw new TypeError('KB_READ_POLICY_CACHE_MS: expected an integer number of ms from 0 to 60000');
  return Number(v);
});
/** tenant, actor, KB id → a role that allowed a read, kept {@link readPolicyCacheMs}; bounded so memory stays flat. */
const readers =
  readPolicyCacheMs > 0
    ? new LRUCache<string, true>({ max: 10_000, ttl: readPolicyCacheMs, ttlAutopurge: false })
    : null;
const allowedOrigins = new Set(
  (process.env.WEB_ALLOWED_ORIGINS ?? '')
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean),
);

/** Policy version of the KB tools' authorisation rules (recorded with every decision). */
export const KB_POLICY_VERSION = 'kb-policy@1';
/** `publishAt` may be at most this far in the past (clock tolerance) … */
export const PUBLISH_TOLERANCE_MS = 5 * 60_000;
/** … and at most this far ahead. */
export const PUBLISH_HORIZON_MS = 365 * 24 * 3600_000;

/**
 * A page that answered with an error status (read effect: retryable, never shown to the agent). Its
 * message quotes the page's reason phrase — the downstream's own words, which may carry anything —
 * so it is logged only as its class, code and an HMAC of the message (libs/runtime logger, FM-16).
 */
export class PageError extends Error {
  readonly status: number;
  readonly code: string;
  constructor(status: number, reason: string) {
    super(`page answered ${status} ${reason}`);
    this.name = 'PageError';
    this.status = status;
    this.code = `http_${status}`;
  }
}

/**
 * A KB answer as a tooltx error class, by the KB's own class; 5xx and the unknown stay "outcome
 * unknown". `key_reused` too: something else is stored under our key, so this call's outcome is not
 * ours to decide — the reconciler's probe finds the foreign effect and hands it to a person.
 */
function definite(err: unknown): never {
  // Refused as late by the KB's clock: not applied, and the executor learns that clock (docs/clocks.md).
  if (err instanceof KbError && err.errorClass === 'deadline_passed')
    throw new DeadlinePassedError(err.kbNow, 'kb refused: deadline_passed');
  if (err instanceof KbError && err.status < 500 && err.errorClass !== 'key_reused') {
    const byClass: Record<string, ErrorClass> = {
      not_found: ErrorClass.NotFound,
      forbidden: ErrorClass.Forbidden,
      frozen: ErrorClass.Forbidden,
      version_conflict: ErrorClass.VersionConflict,
      quota_exceeded: ErrorClass.QuotaExceeded,
      invalid_input: ErrorClass.InvalidInput,
      conflict: ErrorClass.InvalidInput,
      // The KB refused this service's credential before reading the request: not applied; an
      // operator fixes KB_SERVICE_TOKEN_FILE (a proxy's 401 without the KB's body stays unknown).
      unauthorized: ErrorClass.DependencyUnavailable,
    };
    const cls = byClass[err.errorClass];
    if (cls)
      throw new TooltxError(
        cls,
        `kb refused: ${err.errorClass}`,
        err.retryAfterMs !== undefined ? { retryAfterMs: err.retryAfterMs } : {},
      );
  }
  throw err;
}

/**
 * The one resolver, seen from the policy seam: any reference → the canonical id, its authorisation
 * version, and whether this actor may write. Foreign, deleted and missing are one uniform
 * `not_found` (FM-10); a KB that cannot be reached is `dependency_unavailable` (retried, never a refusal).
 */
async function resolveWritable(
  ref: string,
  ctx: AuthorizationContext,
  path: (string | number)[],
): Promise<KbResolution> {
  let r: KbResolution;
  try {
    r = await kb.resolve({ tenant: ctx.tenant, actor: ctx.actor, ref, signal: AbortSignal.timeout(5_000) });
  } catch (err) {
    if (err instanceof KbError && err.errorClass === 'not_found') {
      throw new TooltxError(ErrorClass.NotFound, 'knowledge base not found', {
        issues: [{ path, code: 'not_found', message: 'no such knowledge base' }],
      });
    }
    throw new TooltxError(ErrorClass.DependencyUnavailable, 'kb resolver unavailable', { cause: err });
  }
  if (r.state !== 'active' || (r.role !== 'writer' && r.role !== 'admin'))
    throw new TooltxError(ErrorClass.Forbidden, 'not allowed to write here');
  return r;
}

function checkPublishAt(publishAt: string | undefined, now: number, path: (string | number)[]): void {
  if (publishAt === undefined) return;
  const t = Date.parse(publishAt);
  if (t < now - PUBLISH_TOLERANCE_MS || t > now + PUBLISH_HORIZON_MS) {
    throw new TooltxError(ErrorClass.InvalidInput, 'publishAt outside the allowed window', {
      issues: [{ path, code: 'out_of_window', message: 'publishAt must lie between now − 5 min and now + 365 days' }],
    });
  }
}

function versionOf(
  ctxAuth: { resources?: { id: string; version: number }[] } | undefined,
  index = 0,
): { id: string; version: number } {
  const r = ctxAuth?.resources?.[index];
  // The executor always passes what its re-check allowed; without it nothing is sent.
  if (!r) throw new TooltxError(ErrorClass.Internal, 'no authorisation to write under');
  return r;
}

/** The KB's clock, for the executor's first deadline on it (docs/clocks.md). */
const kbClock = (signal: AbortSignal): Promise<number> => kb.now(signal);

/**
 * The KB's read-only probe by downstream key (recovery, FM-02, FM-13, FM-27), with the input digest
 * the KB recorded with the effect when it has one: recovery commits only when it is ours, and opens
 * a takeover when another effect holds our key. A note written without a digest (before
 * the KB kept one) answers none, and recovery commits it as before.
 */
async function probeByKey(ctx: { tenant: string; downstreamKey: string; signal: AbortSignal }): Promise<ProbeResult> {
  const r = await kb.probe({ tenant: ctx.tenant, key: ctx.downstreamKey, signal: ctx.signal });
  // The KB's clock at the lookup: recovery runs the attempt again only once it is past the deadline.
  if (!r.found) return r.now === undefined ? { found: false } : { found: false, downstreamAt: r.now };
  return r.inputDigest === undefined
    ? { found: true, resourceId: r.id }
    : { found: true, resourceId: r.id, inputDigest: r.inputDigest };
}

/**
 * The policy seam of a single-knowledge-base write: the canonical id and version it checked, and
 * the input with the reference replaced by the knowledge base's name, so every alias, case and
 * encoding of one knowledge base keys one operation (FM-10).
 */
async function authorizeOneKb<I extends { kb: string }>(
  input: I,
  ctx: AuthorizationContext,
): Promise<AuthorizationResult> {
  const r = await resolveWritable(input.kb, ctx, ['input', 'kb']);
  // Only when the reference was not the name already (saves the authorizer re-keying every call).
  return {
    resources: [{ id: r.kbId, version: r.authVersion }],
    ...(r.name !== input.kb ? { input: { ...input, kb: r.name } } : {}),
  };
}

/**
 * The status endpoint's read policy for KB operations: the reader must hold a role (reader, writer
 * or admin) on every knowledge base the operation touched, resolved through the one resolver — or
 * seen allowed by it within `KB_READ_POLICY_CACHE_MS` (that resolve was a third of a status
 * answer's time). Anyone else gets the uniform answer of a never-registered key.
 */
async function mayReadKbOperation(ctx: ReadContext): Promise<void> {
  for (const r of ctx.resources ?? []) {
    const cacheKey = JSON.stringify([ctx.tenant, ctx.actor, r.id]);
    if (readers?.get(cacheKey)) continue;
    const seen = await kb
      .resolve({ tenant: ctx.tenant, actor: ctx.actor, ref: r.id, signal: AbortSignal.timeout(5_000) })
      .catch(() => null);
    if (!seen?.role) throw new TooltxError(ErrorClass.Forbidden, 'no role on this knowledge base');
    readers?.set(cacheKey, true);
  }
}

/**
 * This module's own settings, as the services' `--help` lists them when TOOLTX_TOOLS_MODULE names
 * this module (settings of the sample, not of tooltx).
 */
export const settingsHelp = `  KB_URL                   the KB storage service (default http://127.0.0.1:4280)
  KB_DEDUP                 on|off: whether the KB deduplicates by key (default on)
  KB_TIMING_MS             timeout,runningBound,unknownDeadline of the KB writes, ms
  KB_KEEPALIVE             off = a new connection per KB request (default: kept alive)
  KB_SERVICE_TOKEN_FILE    the KB's service token file (mode 0600; the KB's own KB_SERVICE_TOKEN_FILE),
                           sent on every KB request (unset = none sent)
  KB_READ_POLICY_CACHE_MS  how long an allowed read of a tenant/actor/knowledge base is remembered, ms (0-60000,
                           default 1000; 0 = ask the KB every time)
  WEB_ALLOWED_ORIGINS      origins on loopback/private hosts web.fetch_page may fetch, comma-separated
${mailSettingsHelp}`;

/** The held-back steps of `mail.send_draft` (prepare, discard and their probes), for the contract model. */
export { sendDraftSteps } from './mail-tools.js';

export const implementations = [
  defineImplementation({
    contract: fetchPage,
    async execute(input, ctx) {
      const url = new URL(input.url);
      // The URL names a place this tool never goes (not the caller's rights): re-plan with another
      // URL. The message never echoes the input (errors.ts): the path says which field.
      const refused = () =>
        invalidInput(
          ['input', 'url'],
          'private_address',
          'the host is or resolves to a loopback, private, link-local or otherwise non-public address; web.fetch_page fetches public pages only (an operator may allow an origin with WEB_ALLOWED_ORIGINS)',
        );
      const allowed = allowedOrigins.has(url.origin);
      if (!allowed) {
        // A literal or local name is refused here; a name is resolved once, by the dispatcher's
        // lookup, which connects only to addresses that pass (public-address.ts: no DNS rebinding).
        try {
          checkLiteralHost(url.hostname);
        } catch (err) {
          if (err instanceof PrivateAddressError) throw refused();
          throw err;
        }
      }
      // Redirects are not followed (`redirect: 'error'` fails the fetch): a Location header is never
      // a way around the check. The dispatcher's connect-time check would apply to one as well.
      const res = await fetch(url, {
        signal: ctx.signal,
        redirect: 'error',
        ...(allowed ? {} : { dispatcher: publicOnlyDispatcher }),
      }).catch((err: unknown) => {
        throw isPrivateAddressRefusal(err) ? refused() : err;
      });
      if (res.status === 404 || res.status === 410) throw new TooltxError(ErrorClass.NotFound, 'page not found');
      if (!res.ok) {
        await res.body?.cancel();
        throw new PageError(res.status, res.statusText);
      }
      const text = await res.text();
      const fallback = decodeURIComponent(url.pathname.split('/').filter(Boolean).pop() ?? url.host);
      return {
        resourceId: url.toString(),
        result: { url: url.toString(), title: titleOf(text, fallback), excerpt: excerptOf(text) },
      };
    },
  }),
  defineImplementation({
    contract: writeNote,
    policyVersion: KB_POLICY_VERSION,
    authorizeRead: mayReadKbOperation,
    authorize: authorizeOneKb,
    invariants(input, ctx) {
      checkPublishAt(input.publishAt, ctx.now, ['input', 'publishAt']);
    },
    async execute(input, ctx) {
      const { id: kbId, version } = versionOf(ctx.authorization);
      try {
        // The operation's input digest goes with the write: the probe tells our effect from another.
        const r = await kb.writeNote({
          tenant: ctx.tenant,
          actor: ctx.actor,
          key: ctx.downstreamKey,
          deadlineAt: ctx.deadlineAt,
          ifMatch: version,
          inputDigest: ctx.inputDigest,
          traceparent: ctx.traceparent,
          note: { ...input, kb: kbId },
          signal: ctx.signal,
        });
        // FM-19: a write returns its receipt only (the resource id is in the receipt).
        return { resourceId: r.id, result: {}, ...(r.kbNow !== undefined ? { downstreamAt: r.kbNow } : {}) };
      } catch (err) {
        return definite(err);
      }
    },
    probe: probeByKey,
    clock: kbClock,
  }),
  defineImplementation({
    contract: writeNotes,
    policyVersion: KB_POLICY_VERSION,
    authorizeRead: mayReadKbOperation,
    // FM-09: every item is authorised on its own; one foreign or forbidden item refuses the batch.
    async authorize(input, ctx) {
      const seen = new Map<string, number>();
      const items = [];
      for (const [i, item] of input.items.entries()) {
        const r = await resolveWritable(item.kb, ctx, ['input', 'items', i, 'kb']);
        seen.set(r.kbId, r.authVersion);
        items.push({ ...item, kb: r.name });
      }
      const renamed = items.some((item, i) => item.kb !== input.items[i]!.kb);
      return {
        resources: [...seen].map(([id, version]) => ({ id, version })),
        ...(renamed ? { input: { ...input, items } } : {}),
      };
    },
    invariants(input, ctx) {
      input.items.forEach((item, i) => {
        checkPublishAt(item.publishAt, ctx.now, ['input', 'items', i, 'publishAt']);
      });
    },
    async execute(input, ctx) {
      const versions = Object.fromEntries((ctx.authorization?.resources ?? []).map((r) => [r.id, r.version]));
      try {
        // Each item is sent with the canonical id its reference resolved to at the re-check.
        const ids = await Promise.all(
          input.items.map((item) =>
            kb.resolve({ tenant: ctx.tenant, actor: ctx.actor, ref: item.kb, signal: ctx.signal }).then((r) => r.kbId),
          ),
        );
        const r = await kb.writeBatch({
          tenant: ctx.tenant,
          actor: ctx.actor,
          key: ctx.downstreamKey,
          deadlineAt: ctx.deadlineAt,
          ifMatch: versions,
          inputDigest: ctx.inputDigest,
          traceparent: ctx.traceparent,
          items: input.items.map((item, i) => ({ ...item, kb: ids[i]! })),
          signal: ctx.signal,
        });
        return { resourceId: r.items.map((x) => x.id).join(','), result: {} };
      } catch (err) {
        return definite(err);
      }
    },
    probe: probeByKey,
    clock: kbClock,
  }),
  defineImplementation({
    contract: deleteNote,
    policyVersion: KB_POLICY_VERSION,
    authorizeRead: mayReadKbOperation,
    authorize: authorizeOneKb,
    async execute(input, ctx) {
      const { version } = versionOf(ctx.authorization);
      try {
        // The operation's input digest goes with the delete: its probe tells our delete from another.
        const r = await kb.deleteNote({
          tenant: ctx.tenant,
          actor: ctx.actor,
          key: ctx.downstreamKey,
          id: input.noteId,
          ifMatch: version,
          inputDigest: ctx.inputDigest,
          traceparent: ctx.traceparent,
          signal: ctx.signal,
        });
        return { resourceId: r.id, result: {} };
      } catch (err) {
        return definite(err);
      }
    },
    // The KB's read-only lookup of deletes by key: the note the delete under our key removed.
    async probe(ctx) {
      const r = await kb.probeDelete({ tenant: ctx.tenant, key: ctx.downstreamKey, signal: ctx.signal });
      if (!r.found) return { found: false };
      return r.inputDigest === undefined
        ? { found: true, resourceId: r.id }
        : { found: true, resourceId: r.id, inputDigest: r.inputDigest };
    },
  }),
  ...mailImplementations,
];
