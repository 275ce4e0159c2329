/**
 * The research-KB sample's trusted side (loaded by the authorizer, executor and reconciler from
 * `TOOLTX_TOOLS_MODULE`, never by agents):
 * - `web.fetch_page` fetches a page over HTTP and returns `{ url, title, excerpt }`. Origins may be
 *   restricted with `WEB_ALLOWED_ORIGINS` (comma-separated; unset = any http/https origin).
 * - `kb.write_note` and `kb.delete_note` call the KB storage service at `KB_URL` with the
 *   tenant-scoped downstream key and the attempt's absolute deadline.
 *
 * Error convention: a `TooltxError` means the KB definitively did not apply the request; network
 * errors and aborts propagate as they are (outcome unknown).
 */
import { defineImplementation, ErrorClass, TooltxError, type ErrorClass as ErrorClassT } from '@tooltx/contracts';
import { KbClient, KbError } from './kb-client.js';
import { kbDedupFromEnv, researchContracts } from './contracts.js';
import { excerptOf, titleOf } from './excerpt.js';

const { fetchPage, writeNote, deleteNote } = researchContracts({ kbDedup: kbDedupFromEnv() });
// One pool for the process. KB_KEEPALIVE=off closes every connection after its request.
const kbClient = new KbClient(process.env.KB_URL ?? 'http://127.0.0.1:4280', { keepAlive: process.env.KB_KEEPALIVE !== 'off' });
const kb = () => kbClient;
const allowed = (process.env.WEB_ALLOWED_ORIGINS ?? '').split(',').map((s) => s.trim()).filter(Boolean);

/** A KB refusal as a tooltx error class; 5xx and anything else stay "outcome unknown". */
function definite(err: unknown): never {
  if (err instanceof KbError && err.status < 500) {
    const cls: ErrorClassT =
      err.status === 404 ? ErrorClass.NotFound
        : err.status === 409 ? ErrorClass.DependencyUnavailable // deadline passed: not applied
          : err.status === 403 ? ErrorClass.Forbidden
            : err.status === 429 ? ErrorClass.QuotaExceeded
              : ErrorClass.InvalidInput;
    throw new TooltxError(cls, `kb refused: ${err.errorClass}`);
  }
  throw err;
}

export const implementations = [
  defineImplementation({
    contract: fetchPage,
    async execute(input, ctx) {
      const url = new URL(input.url);
      if (allowed.length && !allowed.includes(url.origin)) throw new TooltxError(ErrorClass.Forbidden, 'origin not allowed');
      const res = await fetch(url, { signal: ctx.signal, redirect: 'error' });
      if (res.status === 404 || res.status === 410) throw new TooltxError(ErrorClass.NotFound, 'page not found');
      if (!res.ok) throw new Error(`page answered ${res.status}`);
      const text = await res.text();
      const fallback = decodeURIComponent(url.pathname.split('/').filter(Boolean).pop() ?? url.host);
      return { resourceId: url.toString(), result: { url: url.toString(), title: titleOf(text, fallback), excerpt: excerptOf(text) } };
    },
  }),
  defineImplementation({
    contract: writeNote,
    async execute(input, ctx) {
      try {
        const r = await kb().writeNote({ tenant: ctx.tenant, key: ctx.downstreamKey, deadlineAt: ctx.deadlineAt, note: input, signal: ctx.signal });
        return { resourceId: r.id, result: { noteId: r.id, kb: r.kb } };
      } catch (err) {
        return definite(err);
      }
    },
    async probe(ctx) {
      const r = await kb().probe({ tenant: ctx.tenant, key: ctx.downstreamKey, signal: ctx.signal });
      return r.found ? { found: true, resourceId: r.id } : { found: false };
    },
  }),
  defineImplementation({
    contract: deleteNote,
    async execute(input, ctx) {
      try {
        const r = await kb().deleteNote({ tenant: ctx.tenant, key: ctx.downstreamKey, id: input.noteId, signal: ctx.signal });
        return { resourceId: r.id, result: { noteId: r.id, deleted: r.deleted } };
      } catch (err) {
        return definite(err);
      }
    },
  }),
];
