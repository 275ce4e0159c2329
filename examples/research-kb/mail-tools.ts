/**
 * The trusted side of the sample's mail contracts (./mail-contracts.ts), talking to the mail outbox
 * at `MAIL_URL` (./mail-server.ts). Loaded through ./tools.ts, so one tools module — one deployment
 * — serves the KB's tools and these; never loaded by agents.
 *
 * - `mail.send_draft`: its prepare step ({@link sendDraftSteps}.prepare) creates the draft under the
 *   operation's downstream key and answers the preview, nothing leaves; `execute` sends the draft
 *   prepared under that key (once: the outbox sends a draft once), refused when it was discarded;
 *   the discard step discards it. Each step is probe-able by the key.
 * - `mail.send`: sends a mail at once. `mail.send_correction`: sends a new mail that refers to a
 *   sent one (its receipt's id).
 * Every write carries the downstream key, the attempt's absolute deadline and the operation's input
 * digest; every probe is the outbox's read-only lookup by key, with its clock.
 *
 * Every request carries the service token of `MAIL_SERVICE_TOKEN_FILE` (the outbox's own; mode 0600,
 * ≥ 32 characters, checked at start); unset, none is sent.
 *
 * Error convention (./tools.ts): a `TooltxError` means the outbox definitively did not apply the
 * request; network errors, 5xx, aborts and `key_reused` propagate as they are (outcome unknown: the
 * reconciler's probe decides).
 */
import {
  DeadlinePassedError,
  defineImplementation,
  ErrorClass,
  type ExecutionContext,
  type ProbeResult,
  TooltxError,
} from '@tooltx/contracts';
import { readKeyFile, SecretFileError, StartupError } from '@tooltx/runtime';
import { MailClient, MailError, type MailProbe } from './mail-client.js';
import { mailConfirmDeadlineFromEnv, mailContracts, mailDedupFromEnv, mailTimingFromEnv } from './mail-contracts.js';
import type { DraftPreview } from './mail-store.js';

/** A setting of this module the service cannot start with: named with its value. */
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

const contracts = mailContracts({
  mailDedup: setting('MAIL_DEDUP', () => mailDedupFromEnv()),
  timing: setting('MAIL_TIMING_MS', () => mailTimingFromEnv()),
  confirmDeadlineMs: setting('MAIL_CONFIRM_DEADLINE_MS', () => mailConfirmDeadlineFromEnv()),
});

/**
 * Who may confirm or discard a held-back `mail.send_draft` besides the actor who drafted it:
 * `MAIL_CONFIRMERS`, comma-separated actor ids of the same tenant (unset: the drafter only).
 */
const confirmers = new Set(
  (process.env.MAIL_CONFIRMERS ?? '')
    .split(',')
    .map((a) => a.trim())
    .filter(Boolean),
);

let serviceToken: string | undefined;
if (process.env.MAIL_SERVICE_TOKEN_FILE !== undefined) {
  try {
    serviceToken = readKeyFile(process.env.MAIL_SERVICE_TOKEN_FILE).toString('utf8');
  } catch (err) {
    throw err instanceof SecretFileError
      ? new StartupError('MAIL_SERVICE_TOKEN_FILE', err.file, err.problem, { cause: err })
      : err;
  }
}
const mail = new MailClient(
  setting('MAIL_URL', () => new URL(process.env.MAIL_URL ?? 'http://127.0.0.1:4281').href.replace(/\/$/, '')),
  { serviceToken },
);

/** This module's settings, listed by a service's `--help` with the KB tools' (./tools.ts). */
export const mailSettingsHelp = `  MAIL_URL                 the mail outbox (default http://127.0.0.1:4281)
  MAIL_DEDUP               on|off: whether the outbox deduplicates by key (default on)
  MAIL_TIMING_MS           timeout,runningBound,unknownDeadline of the mail sends, ms
  MAIL_CONFIRM_DEADLINE_MS how long a mail.send_draft waits for its confirmation, ms (default 900000)
  MAIL_CONFIRMERS          actors who may confirm or discard another actor's draft (mail.confirm), comma-separated
  MAIL_SERVICE_TOKEN_FILE  the outbox's service token file (mode 0600; the outbox's own MAIL_SERVICE_TOKEN_FILE),
                           sent on every outbox request (unset = none sent)`;

/**
 * An outbox refusal as a tooltx error (definitively not applied), or the error as it is (outcome
 * unknown). `key_reused`: something else is stored under our key, so this call's outcome is not
 * ours to decide — the probe finds the other effect and recovery hands it to a person.
 */
function definite(err: unknown): never {
  if (err instanceof MailError && err.errorClass === 'deadline_passed')
    throw new DeadlinePassedError(err.mailNow, 'mail outbox refused: deadline_passed');
  if (err instanceof MailError && err.status < 500) {
    const byClass: Partial<Record<string, ErrorClass>> = {
      invalid_input: ErrorClass.InvalidInput,
      // The corrected mail, or the draft to send, is not the tenant's (or does not exist).
      not_found: ErrorClass.NotFound,
      // The draft was discarded: it can never be sent, and nothing was.
      draft_discarded: ErrorClass.NotFound,
      // An operator-armed fault: refused before anything was stored; a later attempt may pass.
      refused: ErrorClass.DependencyUnavailable,
      // The outbox refused this service's credential before reading the request.
      unauthorized: ErrorClass.DependencyUnavailable,
    };
    const cls = byClass[err.errorClass];
    if (cls) throw new TooltxError(cls, `mail outbox refused: ${err.errorClass}`);
  }
  throw err;
}

/** The outbox's probe of sends by key, as recovery reads it: the sent mail's id and the input digest it was sent with. */
async function probeSent(ctx: { tenant: string; downstreamKey: string; signal: AbortSignal }): Promise<ProbeResult> {
  return asProbeResult(
    await mail.probeSent({ tenant: ctx.tenant, key: ctx.downstreamKey, signal: ctx.signal }),
    (r) => r.id,
  );
}

function asProbeResult<T>(r: MailProbe<T>, idOf: (found: T) => string): ProbeResult {
  // The outbox's clock at the lookup: recovery runs the attempt again only once it is past the deadline.
  if (!r.found) return r.now === undefined ? { found: false } : { found: false, downstreamAt: r.now };
  return {
    found: true,
    resourceId: idOf(r),
    ...(r.inputDigest === undefined ? {} : { inputDigest: r.inputDigest }),
  };
}

/** What a write of this module sends besides its body: who, under which key and deadline, and the input digest. */
const writeOf = (ctx: ExecutionContext) => ({
  tenant: ctx.tenant,
  actor: ctx.actor,
  key: ctx.downstreamKey,
  deadlineAt: ctx.deadlineAt,
  inputDigest: ctx.inputDigest,
  signal: ctx.signal,
});

/** The outbox's clock, for the executor's first deadline on it (docs/clocks.md). */
const mailClock = (signal: AbortSignal): Promise<number> => mail.now(signal);

/**
 * The steps of `mail.send_draft` besides `execute`, for the contract model's held-back commit:
 * each keyed by the operation's downstream key, like `execute`.
 */
export const sendDraftSteps = {
  /**
   * Creates the draft (nothing leaves) and answers what a confirmer is shown: the draft's id and
   * its preview (recipients, subject, a body excerpt and the body's size in bytes). A repeat under
   * the key answers the same draft.
   */
  async prepare(
    input: { to: string[]; cc?: string[] | undefined; subject: string; body: string },
    ctx: ExecutionContext,
  ): Promise<{ draftId: string; preview: DraftPreview }> {
    try {
      const d = await mail.createDraft({ ...writeOf(ctx), mail: input });
      return { draftId: d.draftId, preview: d.preview };
    } catch (err) {
      return definite(err);
    }
  },
  /** Read-only: the draft prepared under the key (`resourceId` = its id). */
  async probePrepared(ctx: { tenant: string; downstreamKey: string; signal: AbortSignal }): Promise<ProbeResult> {
    const r = await mail.probeDraft({ tenant: ctx.tenant, key: ctx.downstreamKey, signal: ctx.signal });
    return asProbeResult(r, (d) => d.draftId);
  },
  /**
   * Discards the draft prepared under the key, so it can never be sent: `discarded` (also when it
   * was discarded before), `none` when nothing was prepared under the key (nothing to hold back),
   * or `already_sent` when the draft left before the discard — then nothing can be undone.
   */
  async discard(
    ctx: ExecutionContext,
  ): Promise<{ outcome: 'discarded'; draftId: string } | { outcome: 'none' } | { outcome: 'already_sent' }> {
    try {
      const d = await mail.discardDraft({ ...writeOf(ctx), draft: { draftKey: ctx.downstreamKey } });
      return { outcome: 'discarded', draftId: d.draftId };
    } catch (err) {
      if (err instanceof MailError && err.errorClass === 'not_found') return { outcome: 'none' };
      if (err instanceof MailError && err.errorClass === 'draft_sent') return { outcome: 'already_sent' };
      return definite(err);
    }
  },
  /** Read-only: the discard made under the key (`resourceId` = the discarded draft's id). */
  async probeDiscarded(ctx: { tenant: string; downstreamKey: string; signal: AbortSignal }): Promise<ProbeResult> {
    const r = await mail.probeDiscard({ tenant: ctx.tenant, key: ctx.downstreamKey, signal: ctx.signal });
    return asProbeResult(r, (d) => d.draftId);
  },
};

export const mailImplementations = [
  defineImplementation({
    contract: contracts.sendDraft,
    policyVersion: 'mail-confirm-1',
    // The sample's grant of `mail.confirm`: the actor who drafted the mail, or one of
    // MAIL_CONFIRMERS. An operator asking through `tooltx confirm` / `tooltx discard` holds the
    // identity list's `confirm` grant instead, which the server checked before anything reached us.
    async authorize(_input, ctx) {
      const c = ctx.confirms;
      if (
        c &&
        c.permission === 'mail.confirm' &&
        c.requestedBy?.kind !== 'operator' &&
        ctx.actor !== c.owner &&
        !confirmers.has(ctx.actor)
      )
        throw new TooltxError(ErrorClass.Forbidden, 'not allowed to confirm or discard this draft (mail.confirm)');
    },
    async prepare(input, ctx) {
      // Looked up read-only first: a prepare step run again (its answer lost) answers the draft it
      // made, and an outbox without dedup never holds a second draft of one operation.
      const found = await mail.probeDraft({ tenant: ctx.tenant, key: ctx.downstreamKey, signal: ctx.signal });
      const d = found.found ? found : await sendDraftSteps.prepare(input, ctx as ExecutionContext);
      return { preview: { draftId: d.draftId, ...d.preview } };
    },
    async discard(_input, ctx) {
      await sendDraftSteps.discard(ctx as ExecutionContext);
    },
    async execute(input, ctx) {
      try {
        // Sends the draft prepared under this operation's key. A deployment that runs no prepare
        // step (or lost its answer) prepares it here first — looked up read-only before, so an
        // outbox without dedup never holds a second draft of one operation.
        const prepared = await mail.probeDraft({ tenant: ctx.tenant, key: ctx.downstreamKey, signal: ctx.signal });
        if (!prepared.found) await mail.createDraft({ ...writeOf(ctx), mail: input });
        const r = await mail.sendDraft({ ...writeOf(ctx), draft: { draftKey: ctx.downstreamKey } });
        return { resourceId: r.id, result: {}, ...(r.mailNow !== undefined ? { downstreamAt: r.mailNow } : {}) };
      } catch (err) {
        return definite(err);
      }
    },
    probe: probeSent,
    clock: mailClock,
  }),
  defineImplementation({
    contract: contracts.send,
    async execute(input, ctx) {
      try {
        const r = await mail.sendMail({ ...writeOf(ctx), mail: input });
        return { resourceId: r.id, result: {}, ...(r.mailNow !== undefined ? { downstreamAt: r.mailNow } : {}) };
      } catch (err) {
        return definite(err);
      }
    },
    probe: probeSent,
    clock: mailClock,
  }),
  defineImplementation({
    contract: contracts.sendCorrection,
    async execute(input, ctx) {
      try {
        const r = await mail.sendCorrection({ ...writeOf(ctx), mail: input });
        return { resourceId: r.id, result: {}, ...(r.mailNow !== undefined ? { downstreamAt: r.mailNow } : {}) };
      } catch (err) {
        return definite(err);
      }
    },
    probe: probeSent,
    clock: mailClock,
  }),
];
