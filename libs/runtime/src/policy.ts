import {
  toErrorInfo,
  type AuthorizationContext,
  type AuthorizationResult,
  type Implementation,
} from '@tooltx/contracts';
import { policyVerdict, type PolicyVerdict } from '@tooltx/lifecycle';

/** What {@link askPolicy} answers: the lifecycle's verdict, and on an allow what the policy returned. */
export type PolicyAnswer =
  | (Extract<PolicyVerdict, { kind: 'allow' }> & { allowed: AuthorizationResult | undefined })
  | Extract<PolicyVerdict, { kind: 'refuse' }>;

/**
 * Asks `impl`'s policy seam about `input` at `ctx` — `authorize`, then its `invariants` unless
 * `invariants: false` — and reads the answer with `policyVerdict` (docs/lifecycle.md "Order of
 * checks"), recording the policy version, the check's time (`now()`, ms) and the resources it
 * named. A policy that could not decide (its dependency away, an internal failure) is rethrown:
 * the caller's message is retried, never refused for it. The one way the authorizer (at intake
 * and for compensations and confirmations) and the executor (at the execution instant) ask.
 */
export async function askPolicy<I>(
  impl: Pick<Implementation, 'authorize' | 'invariants' | 'policyVersion'>,
  input: I,
  ctx: AuthorizationContext,
  o: { now: () => number; invariants?: boolean },
): Promise<PolicyAnswer> {
  let allowed: AuthorizationResult | undefined;
  let failure: { err: unknown } | undefined;
  try {
    allowed = (await impl.authorize?.(input as never, ctx)) ?? undefined;
    if (o.invariants !== false) await impl.invariants?.(input as never, ctx);
  } catch (err) {
    failure = { err };
  }
  const verdict = policyVerdict(failure && toErrorInfo(failure.err), {
    policyVersion: impl.policyVersion ?? 'none',
    at: o.now(),
    ...(allowed?.resources ? { resources: allowed.resources } : {}),
  });
  if (verdict.kind === 'retry') throw failure!.err;
  return verdict.kind === 'allow' ? { ...verdict, allowed } : verdict;
}
