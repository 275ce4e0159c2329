/**
 * The research-KB sample's contracts — the half shared with agents (schemas, normalisers, key rules).
 * The trusted implementations are in ./tools.ts and never loaded by agents.
 *
 * `kb.write_note.downstream.honoursKey` follows the KB's mode (`KB_DEDUP=on|off`): with `off` the
 * KB inserts a row for every request that reaches it, so tooltx alone must prevent duplicates.
 */
import { z } from 'zod';
import { defineContract, normalise } from '@tooltx/contracts';

/**
 * A knowledge-base reference as the agent knows it: a name, an alias or an id, in any case or
 * percent-encoding. The trusted side resolves it to one canonical id (FM-10); the key is derived
 * over the normalised reference.
 */
const kbRef = z.string().min(1).max(200);
/** An http(s) URL without credentials in it (they would end up in the KB and the audit trail). */
const webUrl = z
  .url({ protocol: /^https?$/ })
  .max(2_000)
  .refine((u) => !/^[a-z]+:\/\/[^/]*@/i.test(u), 'URLs with credentials are not allowed');
/** Text that must keep some content after its normaliser ran (whitespace-only is refused). */
const text = (max: number) =>
  z
    .string()
    .min(1)
    .max(max)
    .refine((s) => s.trim().length > 0, 'must not be blank');

const noteSchema = z.strictObject({
  kb: kbRef,
  title: text(300),
  body: text(20_000),
  sourceUrl: webUrl,
  fetchedAt: z.iso.datetime({ offset: true }),
  publishAt: z.iso.datetime({ offset: true }).optional(),
});
const noteNormalisers = {
  kb: normalise.token,
  title: normalise.title,
  body: normalise.markdown,
  sourceUrl: normalise.url,
  fetchedAt: normalise.instant,
  publishAt: normalise.instant,
};

/** Timing of the KB write contracts, ms; tests shorten it. */
export interface KbTiming {
  timeoutMs: number;
  runningBoundMs: number;
  unknownDeadlineMs: number;
}
export const DEFAULT_KB_TIMING: KbTiming = { timeoutMs: 5_000, runningBoundMs: 15_000, unknownDeadlineMs: 5 * 60_000 };

export function researchContracts(opts: { kbDedup: boolean; timing?: KbTiming }) {
  const timing = opts.timing ?? DEFAULT_KB_TIMING;
  const fetchPage = defineContract({
    name: 'web.fetch_page',
    version: 1,
    description: 'Fetch a web page and return its title and an excerpt with its source (never the whole page).',
    effect: 'read',
    input: z.strictObject({ url: webUrl }),
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
    input: noteSchema,
    // FM-19: a write returns its receipt only.
    output: z.object({}),
    normalise: noteNormalisers,
    target: (i) => ({ kb: i.kb }),
    // fetchedAt and publishAt are outside the intent: the same note re-sent with another fetch time
    // is an explicit idempotency_conflict, not a second note.
    intent: (i) => ({ title: i.title, body: i.body, sourceUrl: i.sourceUrl }),
    key: { scope: 'tenant', retentionMs: 7 * 24 * 3600_000 },
    timing,
    downstream: { honoursKey: opts.kbDedup, enforcesDeadline: true },
    // Compensated by a soft delete within 24 h of the commit: the note keeps its row (the write
    // happened) and leaves the knowledge base's reads (docs/compensation.md).
    compensation: {
      tool: 'kb.delete_note@1',
      deadlineMs: 24 * 3600_000,
      permission: 'kb.delete',
      input: (original) => ({ kb: original.input.kb, noteId: original.receipt.resourceId }),
    },
  });

  const deleteNote = defineContract({
    name: 'kb.delete_note',
    version: 1,
    description: 'Delete (soft) a note of a knowledge base of the caller’s tenant.',
    effect: 'delete',
    input: z.strictObject({ kb: kbRef, noteId: z.string().regex(/^note_[A-Za-z0-9-]{1,64}$/) }),
    output: z.object({}),
    normalise: { kb: normalise.token },
    target: (i) => ({ kb: i.kb, noteId: i.noteId }),
    intent: () => ({ action: 'delete' }),
    key: { scope: 'tenant', retentionMs: 7 * 24 * 3600_000 },
    timing,
    // The KB stores each delete under its key (replayed with KB_DEDUP=on) and its probe by key finds
    // it; a delete carries no deadline.
    downstream: { honoursKey: opts.kbDedup, enforcesDeadline: false },
    // No compensation of its own: it is the compensation of kb.write_note, and a failed
    // compensation is handed to a person, never compensated in turn.
  });

  const writeNotes = defineContract({
    name: 'kb.write_notes',
    version: 1,
    description:
      'Write up to 50 research notes at once; every item is authorised, and one refused item refuses the whole batch.',
    effect: 'create',
    input: z.strictObject({ items: z.array(noteSchema).min(1).max(50) }),
    output: z.object({}),
    normalise: { items: normalise.each(normalise.fields<z.infer<typeof noteSchema>>(noteNormalisers)) },
    target: (i) => ({ kbs: [...new Set(i.items.map((n) => n.kb))].sort() }),
    intent: (i) => ({
      items: i.items.map((n) => ({ kb: n.kb, title: n.title, body: n.body, sourceUrl: n.sourceUrl })),
    }),
    key: { scope: 'tenant', retentionMs: 7 * 24 * 3600_000 },
    timing: { timeoutMs: 10_000, runningBoundMs: 30_000, unknownDeadlineMs: 5 * 60_000 },
    downstream: { honoursKey: opts.kbDedup, enforcesDeadline: true },
  });

  return { fetchPage, writeNote, writeNotes, deleteNote, all: [fetchPage, writeNote, writeNotes, deleteNote] };
}

/**
 * KB write timing from `KB_TIMING_MS` = `timeout,runningBound,unknownDeadline` in ms (unset or
 * empty: {@link DEFAULT_KB_TIMING}). Throws `TypeError` naming the variable when it is set to
 * anything but three positive integers.
 */
export function kbTimingFromEnv(env: NodeJS.ProcessEnv = process.env): KbTiming {
  return timingFromEnv('KB_TIMING_MS', env, DEFAULT_KB_TIMING);
}

/** Contract timing from the variable `name` = `timeout,runningBound,unknownDeadline` in ms; unset or empty: `defaults`. */
export function timingFromEnv(name: string, env: NodeJS.ProcessEnv, defaults: KbTiming): KbTiming {
  const raw = env[name];
  if (raw === undefined || raw === '') return defaults;
  const parts = raw.split(',').map((p) => (/^\s*\d+\s*$/.test(p) ? Number(p) : NaN));
  if (parts.length !== 3 || parts.some((n) => !Number.isSafeInteger(n) || n <= 0)) {
    throw new TypeError(`${name}: expected three positive integers "timeoutMs,runningBoundMs,unknownDeadlineMs"`);
  }
  const [timeoutMs, runningBoundMs, unknownDeadlineMs] = parts as [number, number, number];
  return { timeoutMs, runningBoundMs, unknownDeadlineMs };
}

/** The KB's dedup mode from the environment (`KB_DEDUP`: `on` (default) or `off`). Throws `TypeError` naming the variable otherwise. */
export function kbDedupFromEnv(env: NodeJS.ProcessEnv = process.env): boolean {
  const v = env.KB_DEDUP || 'on';
  if (v !== 'on' && v !== 'off')
    throw new TypeError(`KB_DEDUP: expected "on" or "off" (or unset: on), got ${JSON.stringify(v)}`);
  return v === 'on';
}
