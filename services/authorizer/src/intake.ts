import { ErrorClass, OPERATION_KEY_PATTERN, type Contract, type ErrorInfo } from '@tooltx/contracts';
import { checkIntake, type IntakeCheck } from '@tooltx/lifecycle';
import { CodecError, decodeRaw, MsgpackShapeError, type Subjects } from '@tooltx/nats';

/**
 * The intake checks on decoded values live in `@tooltx/lifecycle` (`intake-checks.ts`); they are
 * re-exported here for the authorizer's tests and callers.
 */
export { checkIntake, type IntakeCheck, keylessRefusalKey } from '@tooltx/lifecycle';

/**
 * Values an intent may carry in all its maps and lists (a map entry counts 2), far beyond any tool
 * input: checked on the container headers before anything is read, so an intent built to make
 * intake work (thousands of unknown fields) costs a few microseconds to refuse (docs/tenancy.md).
 */
export const MAX_INTENT_ITEMS = 4_096;

/** A submission id as recorded: the agent's `Nats-Msg-Id`, else the intent's stream sequence. */
const SUBMISSION_ID = /^[\x21-\x7e]{1,128}$/;

/** What intake makes of one message of the intent stream ({@link intakeOf}). */
export type IntakeOutcome =
  | {
      kind: 'term';
      reason: 'not an intent subject' | 'undecodable intent';
      error: ErrorInfo;
      who: { tenant: string; actor: string } | null;
      submissionId: string;
    }
  | { kind: 'checked'; who: { tenant: string; actor: string }; submissionId: string; check: IntakeCheck };

/**
 * What intake makes of one message of the intent stream — its subject, bytes, `Nats-Msg-Id` and
 * stream sequence — before any I/O: `term` when it can never be read (not an intent subject, not
 * msgpack: no key is known, nothing can be recorded under one; the refusal it would be is in
 * `error`), else the {@link checkIntake} outcome for the identity its subject names. The
 * submission id is the `Nats-Msg-Id` when it is 1–128 printable ASCII characters (a UUID from the
 * SDK), else `seq-<stream sequence>`: what a refusal records stays bounded whatever header an agent
 * sends. Pure; never throws.
 */
export function intakeOf(
  subjects: Subjects,
  msg: { subject: string; data: Uint8Array; msgId: string | undefined; seq: number },
  findContract: (tool: string, version: number) => Contract | undefined,
  versionsOf?: (tool: string) => number[],
): IntakeOutcome {
  const submissionId = msg.msgId !== undefined && SUBMISSION_ID.test(msg.msgId) ? msg.msgId : `seq-${msg.seq}`;
  const who = subjects.parseActorSubject('intent', msg.subject);
  if (!who) {
    return {
      kind: 'term',
      reason: 'not an intent subject',
      who: null,
      submissionId,
      error: {
        class: ErrorClass.InvalidInput,
        issues: [{ path: ['subject'], code: 'invalid_subject', message: 'not an intent subject' }],
      },
    };
  }
  let raw: unknown;
  try {
    raw = decodeRaw(msg.data, { maxItems: MAX_INTENT_ITEMS, captureKey: 'operationKey' });
  } catch (err) {
    if (!(err instanceof CodecError)) throw err;
    if (err.cause instanceof MsgpackShapeError && err.cause.tooMany) {
      // Well formed but larger than any tool input: refused unread, under the key it was sent with.
      const supplied =
        err.cause.captured !== undefined && OPERATION_KEY_PATTERN.test(err.cause.captured) ? err.cause.captured : null;
      const error: ErrorInfo = {
        class: ErrorClass.InvalidInput,
        issues: [
          {
            path: [],
            code: 'too_many_values',
            message: `more than ${MAX_INTENT_ITEMS} values in the intent's maps and lists`,
          },
        ],
      };
      return { kind: 'checked', who, submissionId, check: { kind: 'refuse', error, decisionKey: supplied } };
    }
    return {
      kind: 'term',
      reason: 'undecodable intent',
      who,
      submissionId,
      error: {
        class: ErrorClass.InvalidInput,
        issues: [{ path: [], code: 'invalid_encoding', message: err.message.slice(0, 200) }],
      },
    };
  }
  return { kind: 'checked', who, submissionId, check: checkIntake(who, raw, findContract, versionsOf) };
}
