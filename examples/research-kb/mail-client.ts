/**
 * A small typed HTTP client of the sample's mail outbox (./mail-server.ts), for the trusted mail
 * tools (./mail-tools.ts), the demo and tests. undici with one connection pool per client, as the
 * KB's client (./kb-client.ts).
 *
 * Error convention (the KB client's): an answer of 4xx/5xx throws {@link MailError} with the
 * outbox's class; network errors, aborts and a 2xx whose body is not the outbox's propagate
 * unchanged or as {@link MailProtocolError} — callers treat those as "outcome unknown".
 *
 * Service credential: with `serviceToken` (the content of the outbox's `MAIL_SERVICE_TOKEN_FILE`)
 * every request but the health check and the operator endpoints carries `authorization: Bearer`.
 */
import { Agent, type Dispatcher, request } from 'undici';
import { z } from 'zod';
import type { DiscardReceipt, DraftRef, DraftView, MailInput, MailStats, SentMail, SentReceipt } from './mail-store.js';

export type { DiscardReceipt, DraftRef, DraftView, MailInput, MailStats, SentMail, SentReceipt } from './mail-store.js';

/** The classes the outbox answers with (`{ error }` bodies). */
export const MAIL_ERROR_CLASSES = [
  'invalid_input',
  'unauthorized',
  'not_found',
  /** The key holds another request (dedup on): nothing was done (422). */
  'key_reused',
  /** The draft was discarded: it is never sent (409). */
  'draft_discarded',
  /** The draft was sent: it can no longer be discarded (409). */
  'draft_sent',
  'deadline_passed',
  /** An operator-armed fault: refused, nothing stored (422). */
  'refused',
  /** An operator-armed fault: nothing stored (503). */
  'unavailable',
  'internal',
] as const;
export type MailErrorClass = (typeof MAIL_ERROR_CLASSES)[number];

export interface MailIssue {
  path: (string | number)[];
  code: string;
  message: string;
}

/** The outbox answered 4xx/5xx; `errorClass` is its `error`, or `unexpected` when the body carried none of its classes. */
export class MailError extends Error {
  readonly status: number;
  readonly errorClass: MailErrorClass | 'unexpected';
  readonly issues: MailIssue[] | undefined;
  /** The outbox's clock when it answered (`x-mail-now`), ms since the epoch. */
  readonly mailNow: number | undefined;
  constructor(status: number, errorClass: MailErrorClass | 'unexpected', issues?: MailIssue[], mailNow?: number) {
    super(`mail outbox answered ${status} ${errorClass}`);
    this.name = 'MailError';
    this.status = status;
    this.errorClass = errorClass;
    this.issues = issues;
    this.mailNow = mailNow;
  }
}

/** A 2xx answer whose body is not what the outbox sends (outcome unknown for a write). */
export class MailProtocolError extends Error {
  readonly status: number;
  constructor(status: number, what: string) {
    super(`mail outbox answered ${status} with ${what}`);
    this.name = 'MailProtocolError';
    this.status = status;
  }
}

/** Who writes, under which key and deadline, and the caller's input digest (stored, answered by the probe). */
export interface MailWrite {
  tenant: string;
  actor: string;
  key: string;
  /** Absolute deadline, ms since the epoch, on the outbox's clock. */
  deadlineAt: number;
  inputDigest?: string | undefined;
  signal?: AbortSignal | undefined;
}

/** What every write answer adds: `created` false = the key's earlier answer (or a draft's earlier send). */
export interface Written {
  created: boolean;
  /** The outbox's clock when it answered. */
  mailNow?: number;
}

export type MailProbe<T> =
  | ({ found: true; count: number; inputDigest?: string; now: number } & T)
  | { found: false; now?: number };

const digest = z.string().regex(/^sha256:[0-9a-f]{64}$/);
const previewSchema = z.object({
  to: z.array(z.string()),
  cc: z.array(z.string()),
  subject: z.string(),
  excerpt: z.string(),
  bodyBytes: z.number(),
});
const draftSchema = z.object({
  draftId: z.string(),
  state: z.enum(['draft', 'sent', 'discarded']),
  preview: previewSchema,
  createdAt: z.number(),
});
const sentSchema = z.object({
  id: z.string(),
  kind: z.enum(['draft', 'direct', 'correction']),
  draftId: z.string().optional(),
  corrects: z.string().optional(),
  sentAt: z.number(),
});
const discardSchema = z.object({ draftId: z.string(), state: z.literal('discarded'), discardedAt: z.number() });
const probeExtra = { found: z.literal(true), count: z.number(), inputDigest: digest.optional(), now: z.number() };
const notFoundProbe = z.object({ found: z.literal(false), now: z.number().int().nonnegative().optional() });
const sentMailSchema = sentSchema.extend({
  to: z.array(z.string()),
  cc: z.array(z.string()),
  subject: z.string(),
  bodyDigest: z.string(),
  bodyBytes: z.number(),
});
const countsSchema = z.object({
  drafts: z.object({ draft: z.number(), sent: z.number(), discarded: z.number() }),
  sent: z.object({
    rows: z.number(),
    distinctKeys: z.number(),
    duplicateRows: z.number(),
    duplicateDraftSends: z.number(),
    byKind: z.object({ draft: z.number(), direct: z.number(), correction: z.number() }),
  }),
  discards: z.number(),
});

/** `T` without the fields zod leaves `undefined` (the answer omits them). */
function defined<T extends object>(o: T): T {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as T;
}

/** The operations a fault can be armed for, and how it fails (mail-server.ts). */
export type MailFaultOperation = 'drafts.create' | 'drafts.send' | 'drafts.discard' | 'mails.send' | 'mails.correct';
export type MailFaultMode = 'unavailable' | 'refused' | 'lost_answer';

export interface MailAdmin {
  /** Makes the next `count` calls of `operation` fail with `mode` (default `unavailable`); 0 clears. */
  setFault(operation: MailFaultOperation, count: number, mode?: MailFaultMode): Promise<void>;
  faults(): Promise<Record<string, { count: number; mode: MailFaultMode }>>;
}

export class MailClient {
  readonly baseUrl: string;
  readonly #agent: Agent;
  readonly #keepAlive: boolean;
  readonly #auth: Record<string, string>;

  /** `baseUrl` like `http://127.0.0.1:4281`; `serviceToken`: the outbox's service token (absent = none sent). */
  constructor(
    baseUrl: string,
    opts: { keepAlive?: boolean; connections?: number; serviceToken?: string | undefined } = {},
  ) {
    this.baseUrl = baseUrl.replace(/\/+$/, '');
    this.#keepAlive = opts.keepAlive ?? true;
    this.#auth = opts.serviceToken === undefined ? {} : { authorization: `Bearer ${opts.serviceToken}` };
    this.#agent = new Agent({ connections: opts.connections ?? 64 });
  }

  async close(): Promise<void> {
    await this.#agent.close();
  }

  /** `POST /v1/drafts`: stores a draft (nothing leaves) and answers its preview. */
  createDraft(args: MailWrite & { mail: MailInput }): Promise<DraftView & Written> {
    return this.#write('/v1/drafts', args, args.mail, draftSchema);
  }

  /** `POST /v1/drafts/send`: the draft leaves (once); `MailError` `draft_discarded` when it was discarded. */
  sendDraft(args: MailWrite & { draft: DraftRef }): Promise<SentReceipt & Written> {
    return this.#write('/v1/drafts/send', args, args.draft, sentSchema);
  }

  /** `POST /v1/drafts/discard`: the draft is never sent; `MailError` `draft_sent` when it already left. */
  discardDraft(args: MailWrite & { draft: DraftRef }): Promise<DiscardReceipt & Written> {
    return this.#write('/v1/drafts/discard', args, args.draft, discardSchema);
  }

  /** `POST /v1/mails`: sends a mail at once. */
  sendMail(args: MailWrite & { mail: MailInput }): Promise<SentReceipt & Written> {
    return this.#write('/v1/mails', args, args.mail, sentSchema);
  }

  /** `POST /v1/mails/corrections`: a new mail referring to the sent mail `corrects`. */
  sendCorrection(args: MailWrite & { mail: MailInput & { corrects: string } }): Promise<SentReceipt & Written> {
    return this.#write('/v1/mails/corrections', args, args.mail, sentSchema);
  }

  /** `GET /v1/drafts/by-key/:key` — read-only: the draft created under the key. */
  probeDraft(args: { tenant: string; key: string; signal?: AbortSignal }): Promise<MailProbe<DraftView>> {
    return this.#probe('drafts', args, draftSchema.extend(probeExtra));
  }

  /** `GET /v1/sent/by-key/:key` — read-only: the mail sent under the key (`count` rows under it). */
  probeSent(args: { tenant: string; key: string; signal?: AbortSignal }): Promise<MailProbe<SentReceipt>> {
    return this.#probe('sent', args, sentSchema.extend(probeExtra));
  }

  /** `GET /v1/discards/by-key/:key` — read-only: the discard made under the key. */
  probeDiscard(args: { tenant: string; key: string; signal?: AbortSignal }): Promise<MailProbe<DiscardReceipt>> {
    return this.#probe('discards', args, discardSchema.extend(probeExtra));
  }

  /** `GET /v1/sent/:id`: a sent mail of the tenant (no body); `MailError` 404 otherwise. */
  async sentMail(tenant: string, id: string, signal?: AbortSignal): Promise<SentMail> {
    const res = await this.#call('GET', `/v1/sent/${encodeURIComponent(id)}`, {
      headers: { 'x-tenant': tenant },
      signal,
    });
    return defined(this.#parse(res, sentMailSchema, 'an unreadable mail')) as SentMail;
  }

  /** `GET /v1/stats`: raw counts (nothing deduplicated), of one tenant or of all. */
  async stats(tenant?: string, signal?: AbortSignal): Promise<MailStats> {
    const q = tenant === undefined ? '' : `?tenant=${encodeURIComponent(tenant)}`;
    const res = await this.#call('GET', `/v1/stats${q}`, { signal });
    return this.#parse(res, countsSchema, 'unreadable stats');
  }

  /** The outbox's clock: the `x-mail-now` of a `GET /healthz`. */
  async now(signal?: AbortSignal): Promise<number> {
    const res = await request(`${this.baseUrl}/healthz`, { dispatcher: this.#agent, signal, reset: !this.#keepAlive });
    await res.body.dump();
    const h = res.headers['x-mail-now'];
    if (res.statusCode !== 200 || typeof h !== 'string' || !/^\d{1,15}$/.test(h))
      throw new MailProtocolError(res.statusCode, 'no clock reading');
    return Number(h);
  }

  /** The operator endpoints with `token` (the content of `MAIL_ADMIN_TOKEN_FILE`). */
  admin(token: string): MailAdmin {
    const headers = { authorization: `Bearer ${token}` };
    const faults = z.object({ faults: z.record(z.string(), z.object({ count: z.number(), mode: z.string() })) });
    return {
      setFault: async (operation, count, mode) => {
        await this.#call('POST', '/v1/admin/faults', {
          headers,
          body: { operation, count, ...(mode ? { mode } : {}) },
        });
      },
      faults: async () => {
        const res = await this.#call('GET', '/v1/admin/faults', { headers });
        return this.#parse(res, faults, 'unreadable faults').faults as Record<
          string,
          { count: number; mode: MailFaultMode }
        >;
      },
    };
  }

  async #write<T extends z.ZodType>(
    path: string,
    w: MailWrite,
    body: unknown,
    schema: T,
  ): Promise<z.infer<T> & Written> {
    const res = await this.#call('POST', path, {
      headers: {
        'x-tenant': w.tenant,
        'x-actor': w.actor,
        'idempotency-key': w.key,
        'x-deadline': String(Math.floor(w.deadlineAt)),
        ...(w.inputDigest === undefined ? {} : { 'x-tooltx-input-digest': w.inputDigest }),
      },
      body,
      signal: w.signal,
    });
    const value = defined(this.#parse(res, schema, 'an unreadable receipt') as object);
    return {
      ...value,
      created: res.status === 201,
      ...(res.mailNow !== undefined ? { mailNow: res.mailNow } : {}),
    } as z.infer<T> & Written;
  }

  async #probe<T extends z.ZodType>(
    what: 'drafts' | 'sent' | 'discards',
    args: { tenant: string; key: string; signal?: AbortSignal | undefined },
    schema: T,
  ): Promise<({ found: true } & z.infer<T>) | { found: false; now?: number }> {
    const res = await this.#call('GET', `/v1/${what}/by-key/${encodeURIComponent(args.key)}`, {
      headers: { 'x-tenant': args.tenant },
      signal: args.signal,
      notFoundOk: true,
    });
    if (res.status === 404) {
      // Only the outbox's own answer counts as "not found", never a 404 of something in between.
      const nf = notFoundProbe.safeParse(res.body);
      if (nf.success) return defined(nf.data);
      throw new MailError(404, 'unexpected');
    }
    return defined(this.#parse(res, schema, 'an unreadable probe result') as object) as { found: true } & z.infer<T>;
  }

  #parse<T extends z.ZodType>(res: { status: number; body: unknown }, schema: T, what: string): z.infer<T> {
    const r = schema.safeParse(res.body);
    if (!r.success) throw new MailProtocolError(res.status, what);
    return r.data;
  }

  async #call(
    method: string,
    path: string,
    o: { headers?: Record<string, string>; body?: unknown; signal?: AbortSignal | undefined; notFoundOk?: boolean },
  ): Promise<{ status: number; body: unknown; mailNow?: number }> {
    const headers: Record<string, string> = { accept: 'application/json', ...this.#auth, ...o.headers };
    if (o.body !== undefined) headers['content-type'] = 'application/json';
    const r = await request(`${this.baseUrl}${path}`, {
      method: method as Dispatcher.HttpMethod,
      headers,
      body: o.body === undefined ? undefined : JSON.stringify(o.body),
      signal: o.signal,
      dispatcher: this.#agent,
      reset: !this.#keepAlive,
    });
    const text = await r.body.text(); // a cut connection rejects here: propagates (outcome unknown)
    const nowHeader = r.headers['x-mail-now'];
    const mailNow = typeof nowHeader === 'string' && /^\d{1,15}$/.test(nowHeader) ? Number(nowHeader) : undefined;
    let body: unknown;
    try {
      body = text ? (JSON.parse(text) as unknown) : undefined;
    } catch {
      body = undefined;
    }
    const status = r.statusCode;
    if (status >= 400 && !(o.notFoundOk && status === 404)) {
      const b = body as { error?: unknown; issues?: unknown } | undefined;
      const cls = MAIL_ERROR_CLASSES.find((c) => c === b?.error) ?? 'unexpected';
      const issues = Array.isArray(b?.issues) ? (b.issues as MailIssue[]) : undefined;
      throw new MailError(status, cls, issues, mailNow);
    }
    if ((status < 200 || status >= 300) && !(o.notFoundOk && status === 404))
      throw new MailProtocolError(status, 'an unexpected status');
    return { status, body, ...(mailNow !== undefined ? { mailNow } : {}) };
  }
}
