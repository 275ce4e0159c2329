/**
 * A tiny ledger: accounts per tenant, balances in integer cents, kept in memory. A downstream that
 * honours the key tooltx sends and enforces its deadline (docs/writing-tools.md):
 *
 * - `GET /healthz` → `{ now }` (its clock, ms since the epoch);
 * - `GET /v1/accounts/:account` (`x-tenant`) → `{ account, balanceCents }`, 404 `not_found`;
 * - `POST /v1/transfers` (`x-tenant`, `idempotency-key`, `x-deadline` in ms since the epoch,
 *   optional `x-tooltx-input-digest`; body `{ from, to, amountCents, memo? }`) → 201 `{ id, now }`.
 *   The same key again → 200 with the first transfer (nothing moves twice), or 409 `key_reused`
 *   when it was made with another input digest. Past the deadline by its own clock → 409
 *   `deadline_passed` with `now`; unknown account → 404; `from` = `to` or a bad body → 400;
 *   not enough funds → 402 `insufficient_funds`. The lookup, the checks and the write happen in one
 *   synchronous step: nothing can fall between them;
 * - `GET /v1/transfers/by-key/:key` (`x-tenant`) → `{ found: true, id, inputDigest?, now }` or
 *   `{ found: false, now }`: the read-only probe, with its clock read in the same step;
 * - `GET /v1/transfers` (`x-tenant`) → `{ transfers: [...] }`.
 *
 * It trusts `x-tenant` from whoever reaches it, and listens on loopback only: a ledger of a real
 * deployment authenticates its caller (as the research KB's service token does).
 *
 * Run alone: `npx tsx examples/ledger/ledger-server.ts` — `LEDGER_PORT` (default 4290; 0 = any),
 * `LEDGER_SEED` = `tenant:account=cents[,…]` (default `acme:ops=100000,acme:vendor=0`). Prints one
 * JSON line `{ "msg": "ledger ready", "url" }`.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { pathToFileURL } from 'node:url';

/** One transfer as the ledger stored it. */
export interface Transfer {
  id: string;
  tenant: string;
  key: string;
  from: string;
  to: string;
  amountCents: number;
  memo?: string;
  inputDigest?: string;
  /** The ledger's clock when it was stored, ms since the epoch. */
  at: number;
}

export interface LedgerServer {
  url: string;
  /** The transfers of `tenant`, oldest first. */
  transfers(tenant: string): Transfer[];
  balance(tenant: string, account: string): number | undefined;
  close(): Promise<void>;
}

const ACCOUNT = /^[a-z0-9][a-z0-9_-]{0,63}$/;
const KEY = /^[\x21-\x7e]{1,100}$/;
const DIGEST = /^sha256:[0-9a-f]{64}$/;

/**
 * Starts a ledger on `host:port` (default 127.0.0.1, any free port) with `accounts` (tenant →
 * account → balance in cents). Rejects when the port cannot be bound.
 */
export async function startLedger(
  opts: { port?: number; host?: string; accounts?: Record<string, Record<string, number>> } = {},
): Promise<LedgerServer> {
  const balances = new Map<string, Map<string, number>>();
  for (const [tenant, accounts] of Object.entries(opts.accounts ?? {}))
    balances.set(tenant, new Map(Object.entries(accounts)));
  const byKey = new Map<string, Transfer>();
  const all: Transfer[] = [];
  let last = 0;
  /** The ledger's clock: wall time that never goes back (ms since the epoch). */
  const now = () => (last = Math.max(last, Date.now()));

  const server: Server = createServer((req, res) => {
    void handle(req, res).catch(() => answer(res, 500, { error: 'internal' }));
  });

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', 'http://ledger');
    if (req.method === 'GET' && url.pathname === '/healthz') return answer(res, 200, { now: now() });
    const tenant = header(req, 'x-tenant');
    if (!tenant || !ACCOUNT.test(tenant)) return answer(res, 400, { error: 'invalid_input', field: 'x-tenant' });
    const accounts = balances.get(tenant) ?? new Map<string, number>();
    let m: RegExpExecArray | null;
    if (req.method === 'GET' && (m = /^\/v1\/accounts\/([^/]+)$/.exec(url.pathname))) {
      const account = decodeURIComponent(m[1]!);
      const balanceCents = accounts.get(account);
      return balanceCents === undefined
        ? answer(res, 404, { error: 'not_found' })
        : answer(res, 200, { account, balanceCents });
    }
    if (req.method === 'GET' && (m = /^\/v1\/transfers\/by-key\/([^/]+)$/.exec(url.pathname))) {
      const t = byKey.get(`${tenant}\u0000${decodeURIComponent(m[1]!)}`);
      return answer(
        res,
        200,
        t
          ? { found: true, id: t.id, ...(t.inputDigest ? { inputDigest: t.inputDigest } : {}), now: now() }
          : { found: false, now: now() },
      );
    }
    if (req.method === 'GET' && url.pathname === '/v1/transfers')
      return answer(res, 200, { transfers: all.filter((t) => t.tenant === tenant) });
    if (req.method !== 'POST' || url.pathname !== '/v1/transfers') return answer(res, 404, { error: 'not_found' });

    const body = await readJson(req);
    const key = header(req, 'idempotency-key');
    const deadline = Number(header(req, 'x-deadline'));
    const inputDigest = header(req, 'x-tooltx-input-digest');
    const { from, to, amountCents, memo } = (body ?? {}) as Record<string, unknown>;
    if (
      !key ||
      !KEY.test(key) ||
      !Number.isSafeInteger(deadline) ||
      (inputDigest !== undefined && !DIGEST.test(inputDigest))
    )
      return answer(res, 400, { error: 'invalid_input', field: 'headers' });
    if (
      typeof from !== 'string' ||
      typeof to !== 'string' ||
      from === to ||
      !Number.isSafeInteger(amountCents) ||
      (amountCents as number) <= 0 ||
      (memo !== undefined && typeof memo !== 'string')
    ) {
      return answer(res, 400, { error: 'invalid_input', field: 'body' });
    }
    // One synchronous step from here: the dedup lookup, the deadline, the checks and the write.
    const at = now();
    const seen = byKey.get(`${tenant}\u0000${key}`);
    if (seen) {
      if (inputDigest !== undefined && seen.inputDigest !== undefined && seen.inputDigest !== inputDigest)
        return answer(res, 409, { error: 'key_reused' });
      return answer(res, 200, { id: seen.id, now: at });
    }
    if (at > deadline) return answer(res, 409, { error: 'deadline_passed', now: at });
    const fromBalance = accounts.get(from);
    const toBalance = accounts.get(to);
    if (fromBalance === undefined || toBalance === undefined) return answer(res, 404, { error: 'not_found' });
    if (fromBalance < (amountCents as number)) return answer(res, 402, { error: 'insufficient_funds' });
    accounts.set(from, fromBalance - (amountCents as number));
    accounts.set(to, toBalance + (amountCents as number));
    balances.set(tenant, accounts);
    const t: Transfer = {
      id: `tr_${all.length + 1}`,
      tenant,
      key,
      from,
      to,
      amountCents: amountCents as number,
      ...(memo !== undefined ? { memo } : {}),
      ...(inputDigest ? { inputDigest } : {}),
      at,
    };
    byKey.set(`${tenant}\u0000${key}`, t);
    all.push(t);
    return answer(res, 201, { id: t.id, now: at });
  }

  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.port ?? 0, opts.host ?? '127.0.0.1', () => resolve());
  });
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://${opts.host ?? '127.0.0.1'}:${port}`,
    transfers: (tenant) => all.filter((t) => t.tenant === tenant),
    balance: (tenant, account) => balances.get(tenant)?.get(account),
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

function header(req: IncomingMessage, name: string): string | undefined {
  const v = req.headers[name];
  return typeof v === 'string' ? v : undefined;
}

/** The request's JSON body (at most 64 KiB); null when it is not JSON. */
async function readJson(req: IncomingMessage): Promise<unknown> {
  let text = '';
  for await (const chunk of req) {
    text += String(chunk);
    if (text.length > 65_536) return null;
  }
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return null;
  }
}

function answer(res: ServerResponse, status: number, body: unknown): void {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify(body));
}

/** `tenant:account=cents,…` → tenant → account → cents. Throws `TypeError` naming `LEDGER_SEED` for anything else. */
export function parseSeed(text: string): Record<string, Record<string, number>> {
  const out: Record<string, Record<string, number>> = {};
  for (const part of text
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean)) {
    const m = /^([a-z0-9][a-z0-9_-]{0,63}):([a-z0-9][a-z0-9_-]{0,63})=(\d{1,15})$/.exec(part);
    if (!m) throw new TypeError(`LEDGER_SEED: expected tenant:account=cents[,…], got ${JSON.stringify(part)}`);
    (out[m[1]!] ??= {})[m[2]!] = Number(m[3]);
  }
  return out;
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const port = Number(process.env.LEDGER_PORT || 4290);
  const ledger = await startLedger({
    port,
    accounts: parseSeed(process.env.LEDGER_SEED || 'acme:ops=100000,acme:vendor=0'),
  });
  process.stdout.write(`${JSON.stringify({ msg: 'ledger ready', url: ledger.url })}\n`);
  for (const sig of ['SIGINT', 'SIGTERM'] as const)
    process.once(sig, () => void ledger.close().then(() => process.exit(0)));
}
