import { z } from 'zod';
import { ErrorClass, fieldIssues, NextAction, TooltxError, type ErrorInfo } from '@tooltx/contracts';
import type { Receipt, TakeoverRecord } from '@tooltx/lifecycle';
import type { ExecuteResult, Next, ReceiptCheck, Tools, UnknownEvidence } from './client.js';
import type { CompensateResult } from './compensate.js';

/**
 * A small task runner (FM-14, FM-15, FM-17): the steps of one task, each a tool call,
 * with dependencies. It never treats "no error received" as done:
 * - a step counts as done only when `committed` with a receipt the SDK verifies (trusted key id,
 *   this tenant, this operation key, the result's digest) — a forged or unverifiable "success"
 *   stops the task like an unknown (FM-17);
 * - at an `unknown` write it starts nothing more, freezes the steps that depend on it, and returns
 *   the evidence (the takeover record when the server has one) for a person (FM-14);
 * - a `rejected` step blocks the steps that depend on it; the others go on; its next action (FM-15)
 *   is in the outcome. With `compensateOnReject`, the committed steps are then compensated, the
 *   last committed first, and the first compensation that does not end `compensated` is handed
 *   over (docs/compensation.md).
 * Steps whose dependencies are done run concurrently, at most `concurrency` at once.
 */

/** One step: a tool call of the task. `input` may be computed from the results of its dependencies. */
export interface TaskStep {
  id: string;
  tool: string;
  version?: number;
  /** Ids of the steps that must be done (committed, verified) before this one runs. */
  dependsOn?: string[];
  /** The tool input (give this or `inputFrom`). */
  input?: unknown;
  /** Computes the input from the results and receipts of the steps it depends on. */
  inputFrom?: (done: Readonly<Record<string, { result: unknown; receipt: Receipt }>>) => unknown;
  /** This step's budget, ms (default: the SDK's). */
  budgetMs?: number;
  /**
   * Whether the task's compensation undoes this step (default true). `false` for a step with
   * nothing to undo (a read, a computation); a write whose contract declares no compensation stops
   * the task's compensation there, for a person.
   */
  compensate?: boolean;
}

export interface TaskSpec {
  taskId: string;
  steps: TaskStep[];
  /** Steps run at once (default 4). */
  concurrency?: number;
  /**
   * When a step is rejected, compensate the committed steps, the last committed first
   * (docs/compensation.md), with this reason; stop and hand over at the first compensation that
   * does not end `compensated`. Without it, a rejection leaves the task `incomplete`.
   */
  compensateOnReject?: { reason: string };
}

/** What happened to one step. */
export type StepOutcome =
  | { status: 'committed'; operationKey: string; result: unknown; receipt: Receipt }
  | { status: 'rejected'; operationKey: string | null; error: ErrorInfo; next: Next }
  | { status: 'unknown'; operationKey: string; evidence: UnknownEvidence; next: Next }
  /**
   * Held back (its contract declares `confirm`): waiting for `tools.confirm` or `tools.discard`;
   * the steps that depend on it are not started (`blocked`). Run the task again once it is confirmed.
   */
  | { status: 'awaiting_confirmation'; operationKey: string; preview?: unknown; deadlineAt?: number; next: Next }
  /** The SDK or the caller said committed, but the receipt does not verify: never done (FM-17). */
  | {
      status: 'unverified';
      operationKey: string;
      reason: Exclude<ReceiptCheck, { valid: true }>['reason'];
      next: typeof NextAction.HandOver;
    }
  /** Not run: a step it depends on is unknown or unverified — frozen until a person resolves it. */
  | { status: 'frozen'; blockedBy: string }
  /** Not run: a step it depends on was rejected. */
  | { status: 'blocked'; blockedBy: string }
  /** Not run: the task stopped (at an unknown or unverified step) before it was started. */
  | { status: 'not_started' };

export interface TaskRun {
  taskId: string;
  /**
   * `done`: every step committed; `handed_over`: stopped at an unknown or unverified step, or at a
   * compensation that failed; `incomplete`: some step was rejected; `compensated`: some step was
   * rejected and every committed step was compensated (`compensateOnReject`).
   */
  status: 'done' | 'handed_over' | 'incomplete' | 'compensated';
  steps: Record<string, StepOutcome>;
  /** The compensations run (`compensateOnReject`), in the order they ran: the last committed step first. */
  compensations?: { step: string; outcome: CompensateResult }[];
  /** The evidence for the person who takes over (when `handed_over`). */
  handover?: {
    step: string;
    operationKey: string;
    reason: 'unknown' | 'unverified' | 'compensation_failed';
    evidence?: UnknownEvidence;
    takeover?: TakeoverRecord;
  };
}

const taskSpecSchema = z.object({
  taskId: z.string().min(1).max(256),
  concurrency: z.number().int().min(1).max(64).optional(),
  compensateOnReject: z.object({ reason: z.string().trim().min(1).max(500) }).optional(),
  steps: z
    .array(
      z
        .object({
          id: z.string().min(1).max(100),
          tool: z.string().min(1),
          version: z.number().int().min(1).optional(),
          dependsOn: z.array(z.string()).optional(),
          input: z.unknown().optional(),
          inputFrom: z.custom<(d: unknown) => unknown>((v) => typeof v === 'function', 'must be a function').optional(),
          budgetMs: z.number().int().min(100).optional(),
          compensate: z.boolean().optional(),
        })
        .refine((s) => (s.input === undefined) !== (s.inputFrom === undefined), {
          message: 'give exactly one of input or inputFrom',
          path: ['input'],
        }),
    )
    .min(1)
    .max(1_000),
});

/**
 * Runs `spec` through `tools`. Throws `TooltxError(invalid_input)` with the field path for a bad
 * spec (duplicate ids, unknown dependencies, a cycle); never throws for a step's outcome.
 */
export async function runTask(
  tools: Pick<Tools, 'execute' | 'verify'> & Partial<Pick<Tools, 'compensate'>>,
  spec: TaskSpec,
): Promise<TaskRun> {
  const parsed = taskSpecSchema.safeParse(spec);
  if (!parsed.success)
    throw new TooltxError(ErrorClass.InvalidInput, 'invalid task', { issues: fieldIssues(parsed.error) });
  const steps = new Map<string, TaskStep>();
  spec.steps.forEach((s, i) => {
    if (steps.has(s.id))
      throw new TooltxError(ErrorClass.InvalidInput, 'duplicate step id', {
        issues: [{ path: ['steps', i, 'id'], code: 'duplicate', message: `step id ${s.id} is used twice` }],
      });
    steps.set(s.id, s);
  });
  spec.steps.forEach((s, i) => {
    (s.dependsOn ?? []).forEach((d, j) => {
      if (!steps.has(d))
        throw new TooltxError(ErrorClass.InvalidInput, 'unknown dependency', {
          issues: [{ path: ['steps', i, 'dependsOn', j], code: 'unknown_step', message: `no step ${d}` }],
        });
    });
  });
  assertAcyclic(spec.steps);

  const out: Record<string, StepOutcome> = {};
  const done: Record<string, { result: unknown; receipt: Receipt }> = {};
  let handover: TaskRun['handover'];
  const running = new Map<string, Promise<void>>();
  const limit = spec.concurrency ?? 4;
  const committedOrder: string[] = [];

  const blockedBy = (s: TaskStep): { kind: 'frozen' | 'blocked'; by: string } | null => {
    for (const d of s.dependsOn ?? []) {
      const o = out[d];
      if (!o) continue;
      if (o.status === 'unknown' || o.status === 'unverified' || o.status === 'frozen')
        return { kind: 'frozen', by: o.status === 'frozen' ? o.blockedBy : d };
      if (
        o.status === 'rejected' ||
        o.status === 'blocked' ||
        o.status === 'not_started' ||
        o.status === 'awaiting_confirmation'
      )
        return { kind: 'blocked', by: o.status === 'blocked' ? o.blockedBy : d };
    }
    return null;
  };

  const runStep = async (s: TaskStep) => {
    const input = s.inputFrom ? s.inputFrom(done) : s.input;
    const r: ExecuteResult = await tools.execute(
      { tool: s.tool, ...(s.version ? { version: s.version } : {}), taskId: spec.taskId, input },
      s.budgetMs ? { budgetMs: s.budgetMs } : undefined,
    );
    if (r.status === 'committed') {
      // Whatever said "committed", only a verified receipt makes it done.
      const check = tools.verify({ operationKey: r.operationKey, receipt: r.receipt, result: r.result });
      if (!check.valid) {
        out[s.id] = {
          status: 'unverified',
          operationKey: r.operationKey,
          reason: check.reason,
          next: NextAction.HandOver,
        };
        handover ??= { step: s.id, operationKey: r.operationKey, reason: 'unverified' };
        return;
      }
      out[s.id] = { status: 'committed', operationKey: r.operationKey, result: r.result, receipt: r.receipt };
      done[s.id] = { result: r.result, receipt: r.receipt };
      committedOrder.push(s.id);
    } else if (r.status === 'rejected') {
      out[s.id] = { status: 'rejected', operationKey: r.operationKey, error: r.error, next: r.next };
    } else if (r.status === 'awaiting_confirmation') {
      out[s.id] = r;
    } else {
      out[s.id] = { status: 'unknown', operationKey: r.operationKey, evidence: r.evidence, next: r.next };
      handover ??= {
        step: s.id,
        operationKey: r.operationKey,
        reason: 'unknown',
        evidence: r.evidence,
        ...(r.evidence.takeover ? { takeover: r.evidence.takeover } : {}),
      };
    }
  };

  for (;;) {
    // Settle what can no longer run, then start what is ready (unless the task is handed over).
    let progressed = true;
    while (progressed) {
      progressed = false;
      for (const s of spec.steps) {
        if (out[s.id] || running.has(s.id)) continue;
        const b = blockedBy(s);
        if (b) {
          out[s.id] =
            b.kind === 'frozen' ? { status: 'frozen', blockedBy: b.by } : { status: 'blocked', blockedBy: b.by };
          progressed = true;
        }
      }
    }
    if (!handover) {
      for (const s of spec.steps) {
        if (running.size >= limit) break;
        if (out[s.id] || running.has(s.id)) continue;
        if (!(s.dependsOn ?? []).every((d) => out[d]?.status === 'committed')) continue;
        running.set(
          s.id,
          runStep(s).finally(() => running.delete(s.id)),
        );
      }
    }
    if (running.size === 0) break;
    await Promise.race(running.values());
  }
  for (const s of spec.steps) out[s.id] ??= { status: 'not_started' };
  const rejected = Object.values(out).some((o) => o.status === 'rejected');
  const compensations: { step: string; outcome: CompensateResult }[] = [];
  if (!handover && rejected && spec.compensateOnReject && tools.compensate) {
    // The last committed first; the first one that does not end compensated goes to a person.
    for (const id of [...committedOrder].reverse()) {
      if (steps.get(id)?.compensate === false) continue;
      const o = out[id] as Extract<StepOutcome, { status: 'committed' }>;
      const outcome = await tools.compensate({ operationKey: o.operationKey, reason: spec.compensateOnReject.reason });
      compensations.push({ step: id, outcome });
      if (outcome.status !== 'compensated') {
        handover = {
          step: id,
          operationKey: o.operationKey,
          reason: 'compensation_failed',
          ...(outcome.status === 'compensation_failed' && outcome.takeover ? { takeover: outcome.takeover } : {}),
        };
        break;
      }
    }
  }
  const status = handover
    ? 'handed_over'
    : Object.values(out).every((o) => o.status === 'committed')
      ? 'done'
      : compensations.length > 0
        ? 'compensated'
        : 'incomplete';
  return {
    taskId: spec.taskId,
    status,
    steps: out,
    ...(compensations.length ? { compensations } : {}),
    ...(handover ? { handover } : {}),
  };
}

function assertAcyclic(steps: TaskStep[]): void {
  const state = new Map<string, 'visiting' | 'done'>();
  const byId = new Map(steps.map((s) => [s.id, s]));
  const visit = (id: string, path: string[]) => {
    if (state.get(id) === 'done') return;
    if (state.get(id) === 'visiting')
      throw new TooltxError(ErrorClass.InvalidInput, 'dependency cycle', {
        issues: [
          { path: ['steps'], code: 'cycle', message: `steps depend on each other: ${[...path, id].join(' → ')}` },
        ],
      });
    state.set(id, 'visiting');
    for (const d of byId.get(id)?.dependsOn ?? []) visit(d, [...path, id]);
    state.set(id, 'done');
  };
  for (const s of steps) visit(s.id, []);
}
