/**
 * The research-KB sample's contracts — the half shared with agents (schemas, normalisers, key rules).
 * The trusted implementations are in ./tools.ts and never loaded by agents.
 *
 * `kb.write_note.downstream.honoursKey` follows the KB's mode (`KB_DEDUP=on|off`): with `off` the
 * KB inserts a row for every request that reaches it, so tooltx alone must prevent duplicates.
 */
import { z } from 'zod';
import { defineContract, normalise } from '@tooltx/contracts';

const kbName = z.string().regex(/^[a-z0-9_-]{1,64}$/, 'a knowledge base name: ^[a-z0-9_-]{1,64}$');

export function researchContracts(opts: { kbDedup: boolean }) {
  const fetchPage = defineContract({
    name: 'web.fetch_page',
    version: 1,
    description: 'Fetch a web page and return its title and an excerpt with its source (never the whole page).',
    effect: 'read',
    input: z.strictObject({ url: z.url({ protocol: /^https?$/ }).max(2_000) }),
    output: z.object({ url: z.string(), title: z.string(), excerpt: z.string() }),
    normalise: { url: normalise.url },
    target: (i) => ({ url: i.url }),
    intent: () => ({}),
    key: { scope: 'tenant', retentionMs: 24 * 3600_000 },
    timing: { timeoutMs: 5_000, runningBoundMs: 15_000, unknownDeadlineMs: 60_000 },
    downstream: { honoursKey: true, enforcesDeadline: false },
  });

  const writeNote = defineContract({
    name: 'kb.write_note',
    version: 1,
    description: 'Write a research note, built from a page excerpt, into a knowledge base of the caller’s tenant.',
    effect: 'create',
    input: z.strictObject({
      kb: kbName,
      title: z.string().min(1).max(300),
      body: z.string().min(1).max(20_000),
      sourceUrl: z.url({ protocol: /^https?$/ }).max(2_000),
      fetchedAt: z.iso.datetime({ offset: true }),
      publishAt: z.iso.datetime({ offset: true }).optional(),
    }),
    output: z.object({ noteId: z.string(), kb: z.string() }),
    normalise: {
      kb: normalise.token,
      title: normalise.title,
      body: normalise.markdown,
      sourceUrl: normalise.url,
      fetchedAt: normalise.instant,
      publishAt: normalise.instant,
    },
    target: (i) => ({ kb: i.kb }),
    // fetchedAt and publishAt are outside the intent: the same note re-sent with another fetch time
    // is an explicit idempotency_conflict, not a second note.
    intent: (i) => ({ title: i.title, body: i.body, sourceUrl: i.sourceUrl }),
    key: { scope: 'tenant', retentionMs: 7 * 24 * 3600_000 },
    timing: { timeoutMs: 5_000, runningBoundMs: 15_000, unknownDeadlineMs: 5 * 60_000 },
    downstream: { honoursKey: opts.kbDedup, enforcesDeadline: true },
  });

  const deleteNote = defineContract({
    name: 'kb.delete_note',
    version: 1,
    description: 'Delete (soft) a note of a knowledge base of the caller’s tenant.',
    effect: 'delete',
    input: z.strictObject({ kb: kbName, noteId: z.string().regex(/^note_[A-Za-z0-9-]{1,64}$/) }),
    output: z.object({ noteId: z.string(), deleted: z.boolean() }),
    normalise: { kb: normalise.token },
    target: (i) => ({ kb: i.kb, noteId: i.noteId }),
    intent: () => ({ action: 'delete' }),
    key: { scope: 'tenant', retentionMs: 7 * 24 * 3600_000 },
    timing: { timeoutMs: 5_000, runningBoundMs: 15_000, unknownDeadlineMs: 5 * 60_000 },
    downstream: { honoursKey: true, enforcesDeadline: false },
  });

  return { fetchPage, writeNote, deleteNote, all: [fetchPage, writeNote, deleteNote] };
}

/** The KB's dedup mode from the environment (`KB_DEDUP`, default `on`). */
export function kbDedupFromEnv(env: NodeJS.ProcessEnv = process.env): boolean {
  return (env.KB_DEDUP ?? 'on') !== 'off';
}
