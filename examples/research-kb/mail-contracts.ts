/**
 * The sample's mail contracts — the half shared with agents (schemas, normalisers, key rules). The
 * trusted implementations are in ./mail-tools.ts, loaded with the KB's by ./tools.ts, so one
 * deployment serves `kb.*` and `mail.*`. An agent that sends mail gives `createTools` these beside
 * `researchContracts(…).all`.
 *
 * Every mail contract is a `send`: a mail that left cannot be taken back. What can follow one is a
 * NEW mail — a correction that refers to it — or, for a mail held back as a draft, a discard before
 * it ever left.
 *
 * `downstream.honoursKey` follows the outbox's mode (`MAIL_DEDUP=on|off`, ./mail-server.ts): with
 * `off` the outbox stores a row for every request that reaches it, so tooltx alone must prevent
 * a second send.
 */
import { z } from 'zod';
import { defineContract, normalise } from '@tooltx/contracts';
import { type KbTiming, timingFromEnv } from './contracts.js';

/** Recipients of one list (`to` or `cc`): 1..50 addresses, compared case-insensitively. */
const addresses = z.array(z.email().max(320)).max(50);
const text = (max: number) =>
  z
    .string()
    .min(1)
    .max(max)
    .refine((s) => s.trim().length > 0, 'must not be blank');
const mailFields = {
  to: addresses.min(1),
  cc: addresses.optional(),
  subject: text(300),
  body: text(20_000),
};
const mailSchema = z.strictObject(mailFields);
const mailNormalisers = {
  to: normalise.each(normalise.token),
  cc: normalise.each(normalise.token),
  subject: normalise.title,
  body: normalise.markdown,
};
/** A sent mail's id, as the outbox gives it in a receipt. */
export const SENT_MAIL_ID = /^mail_[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/**
 * Timing of the mail contracts, ms. A send waits longer for its unknown to be resolved than a
 * note does (15 min, as the send effect class's default): a person should not be called while the
 * outbox may still answer.
 */
export const DEFAULT_MAIL_TIMING: KbTiming = {
  timeoutMs: 5_000,
  runningBoundMs: 15_000,
  unknownDeadlineMs: 15 * 60_000,
};

/** How long a drafted `mail.send_draft` waits for its confirmation, ms: unconfirmed by then, it is rolled back. */
export const DEFAULT_MAIL_CONFIRM_DEADLINE_MS = 15 * 60_000;

/** What a confirmer of `mail.send_draft` is shown: the draft's id, recipients, subject, a body excerpt and its size. */
export const draftPreviewSchema = z.object({
  draftId: z.string(),
  to: z.array(z.string()),
  cc: z.array(z.string()),
  subject: z.string(),
  excerpt: z.string(),
  bodyBytes: z.number().int(),
});

export function mailContracts(opts: { mailDedup: boolean; timing?: KbTiming; confirmDeadlineMs?: number }) {
  const timing = opts.timing ?? DEFAULT_MAIL_TIMING;
  const downstream = { honoursKey: opts.mailDedup, enforcesDeadline: true };
  const key = { scope: 'tenant' as const, retentionMs: 7 * 24 * 3600_000 };

  const sendDraft = defineContract({
    name: 'mail.send_draft',
    version: 1,
    description:
      'Draft a mail in the outbox (its preview comes back first, nothing leaves), then send that draft once it is confirmed.',
    effect: 'send',
    input: mailSchema,
    // A send returns its receipt only (the sent mail's id is its resource id).
    output: z.object({}),
    normalise: mailNormalisers,
    // The operation is "this task's mail to these recipients": the same mail again is the same
    // send, another subject or body under the same task an idempotency_conflict.
    target: (i) => ({ to: [...new Set(i.to)].sort() }),
    intent: (i) => ({ cc: [...new Set(i.cc ?? [])].sort(), subject: i.subject, body: i.body }),
    key,
    timing,
    downstream,
    // Held back until confirmed: its prepare step creates the draft under the operation's
    // downstream key and answers the preview (recipients, subject, excerpt, size); confirming, by an
    // actor the policy grants `mail.confirm`, runs `execute`, which sends that draft; a discard, or
    // no confirmation by the deadline, ends it rolled back with nothing sent, and its discard step
    // discards the draft (./mail-tools.ts).
    confirm: {
      permission: 'mail.confirm',
      deadlineMs: opts.confirmDeadlineMs ?? DEFAULT_MAIL_CONFIRM_DEADLINE_MS,
      preview: draftPreviewSchema,
    },
  });

  const send = defineContract({
    name: 'mail.send',
    version: 1,
    description: 'Send a mail from the outbox at once.',
    effect: 'send',
    input: mailSchema,
    output: z.object({}),
    normalise: mailNormalisers,
    target: (i) => ({ to: [...new Set(i.to)].sort() }),
    intent: (i) => ({ cc: [...new Set(i.cc ?? [])].sort(), subject: i.subject, body: i.body }),
    key,
    timing,
    downstream,
    // Compensation, once the contract model can declare it: `mail.send_correction@1`, allowed from
    // `committed` only, its input built from this operation's receipt (the sent mail's id as
    // `corrects`), its normalised input (the same recipients) and the caller's reason. A correction
    // is a new mail; nothing is ever unsent.
  });

  const sendCorrection = defineContract({
    name: 'mail.send_correction',
    version: 1,
    description:
      'Send a correction of a mail sent earlier: a new mail that refers to it (a sent mail is never unsent).',
    effect: 'send',
    input: z.strictObject({ corrects: z.string().regex(SENT_MAIL_ID), ...mailFields }),
    output: z.object({}),
    normalise: mailNormalisers,
    // One correction per corrected mail and task: the same correction again is the same send.
    target: (i) => ({ corrects: i.corrects }),
    intent: (i) => ({
      to: [...new Set(i.to)].sort(),
      cc: [...new Set(i.cc ?? [])].sort(),
      subject: i.subject,
      body: i.body,
    }),
    key,
    timing,
    downstream,
    // No compensation of its own: a correction is itself the compensation of a send, and a failed
    // compensation is handed to a person, never compensated in turn.
  });

  return { sendDraft, send, sendCorrection, all: [sendDraft, send, sendCorrection] };
}

/**
 * Mail timing from `MAIL_TIMING_MS` = `timeout,runningBound,unknownDeadline` in ms (unset or empty:
 * {@link DEFAULT_MAIL_TIMING}). Throws `TypeError` naming the variable otherwise.
 */
export function mailTimingFromEnv(env: NodeJS.ProcessEnv = process.env): KbTiming {
  return timingFromEnv('MAIL_TIMING_MS', env, DEFAULT_MAIL_TIMING);
}

/** The outbox's dedup mode (`MAIL_DEDUP`: `on` (default) or `off`). Throws `TypeError` naming the variable otherwise. */
export function mailDedupFromEnv(env: NodeJS.ProcessEnv = process.env): boolean {
  const v = env.MAIL_DEDUP || 'on';
  if (v !== 'on' && v !== 'off')
    throw new TypeError(`MAIL_DEDUP: expected "on" or "off" (or unset: on), got ${JSON.stringify(v)}`);
  return v === 'on';
}

/**
 * How long a `mail.send_draft` waits for its confirmation, from `MAIL_CONFIRM_DEADLINE_MS` (ms,
 * 1000 to 86400000; unset or empty: {@link DEFAULT_MAIL_CONFIRM_DEADLINE_MS}). Throws `TypeError`
 * naming the variable otherwise.
 */
export function mailConfirmDeadlineFromEnv(env: NodeJS.ProcessEnv = process.env): number {
  const v = env.MAIL_CONFIRM_DEADLINE_MS;
  if (v === undefined || v === '') return DEFAULT_MAIL_CONFIRM_DEADLINE_MS;
  const n = Number(v);
  if (!/^\d{1,9}$/.test(v) || n < 1_000 || n > 86_400_000)
    throw new TypeError(`MAIL_CONFIRM_DEADLINE_MS: expected ms from 1000 to 86400000, got ${JSON.stringify(v)}`);
  return n;
}
