/**
 * The ledger example's trusted side (loaded by the authorizer, executor and reconciler from
 * `TOOLTX_TOOLS_MODULE`, never by agents), talking to the ledger at `LEDGER_URL`
 * (./ledger-server.ts). An error answer of the ledger is thrown as `HttpStatusError` and classified
 * by the effect class's failure mapping (docs/writing-tools.md); a refusal as past the deadline is
 * a `DeadlinePassedError` (docs/clocks.md); a lost connection or an abort stays as it is (unknown).
 */
import { DeadlinePassedError, HttpStatusError } from '@tooltx/contracts';
import { StartupError } from '@tooltx/runtime';
import { balance, transfer } from './contracts.js';

const LEDGER_URL = (() => {
  try {
    return new URL(process.env.LEDGER_URL || 'http://127.0.0.1:4290').href.replace(/\/$/, '');
  } catch (err) {
    throw new StartupError('LEDGER_URL', process.env.LEDGER_URL, 'not a URL', { cause: err });
  }
})();

/** This module's own settings, listed by a service's `--help`. */
export const settingsHelp = `  LEDGER_URL               the ledger (default http://127.0.0.1:4290)`;

/** What a call of the ledger carries: the tenant, and for a write the key, deadline and input digest tooltx gives it. */
interface LedgerCall {
  tenant: string;
  signal: AbortSignal;
  downstreamKey?: string;
  deadlineAt?: number;
  inputDigest?: string;
}

/** One request to the ledger (a write when `body` is given); its JSON answer, or the error of an error answer. */
async function ledger<T>(path: string, ctx: LedgerCall, body?: unknown): Promise<T> {
  const write =
    body === undefined
      ? {}
      : {
          'content-type': 'application/json',
          'idempotency-key': ctx.downstreamKey ?? '',
          'x-deadline': String(Math.floor(ctx.deadlineAt ?? 0)),
          ...(ctx.inputDigest ? { 'x-tooltx-input-digest': ctx.inputDigest } : {}),
        };
  const res = await fetch(`${LEDGER_URL}${path}`, {
    method: body === undefined ? 'GET' : 'POST',
    headers: { 'x-tenant': ctx.tenant, ...write },
    signal: ctx.signal,
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  if (res.ok) return (await res.json()) as T;
  const refusal = (await res.json().catch(() => ({}))) as { error?: string; now?: number };
  if (refusal.error === 'deadline_passed') throw new DeadlinePassedError(refusal.now);
  throw HttpStatusError.of(res);
}

export const implementations = [
  balance.implement({
    execute: async ({ account }, ctx) => ({
      resourceId: `account:${account}`,
      result: await ledger(`/v1/accounts/${account}`, ctx),
    }),
  }),
  transfer.implement({
    async execute(input, ctx) {
      const t = await ledger<{ id: string; now: number }>('/v1/transfers', ctx, input);
      return { resourceId: t.id, result: {}, downstreamAt: t.now };
    },
    // Recovery's read-only lookup by the key (FM-13): with the ledger's clock when nothing is found.
    async probe(ctx) {
      const p = await ledger<{ found: boolean; id: string; inputDigest?: string; now: number }>(
        `/v1/transfers/by-key/${ctx.downstreamKey}`,
        ctx,
      );
      return p.found
        ? { found: true, resourceId: p.id, ...(p.inputDigest ? { inputDigest: p.inputDigest } : {}) }
        : { found: false, downstreamAt: p.now };
    },
  }),
];
