import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import {
  decide,
  generateReceiptKey,
  initialState,
  isAllowedTransition,
  operationEventSchema,
  operationStatuses,
  receiptSigner,
  TRANSITIONS,
  transitionsMarkdown,
  type AcceptCommand,
  type Decision,
  type OperationEvent,
  type Transition,
} from '@tooltx/lifecycle';

const DOC = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..', 'docs', 'lifecycle.md');
const signer = receiptSigner(generateReceiptKey().privatePem);
const D1 = `sha256:${'1'.repeat(64)}`;
const KEY = `opk_${'A'.repeat(43)}`;

/** The rows of the table between the doc's markers, parsed back into data. */
function docRows(): { text: string; rows: Transition[] } {
  const doc = readFileSync(DOC, 'utf8');
  const m = /<!-- transitions:begin -->\n([\s\S]*?)\n<!-- transitions:end -->/.exec(doc);
  if (!m) throw new Error('docs/lifecycle.md has no transitions:begin/end markers');
  const text = m[1]!;
  const rows = text
    .split('\n')
    .slice(2)
    .map((line) => {
      const cells = line
        .slice(2, -2)
        .split(/ (?<!\\)\| /)
        .map((c) => c.replaceAll('\\|', '|'));
      const code = (c: string) => /^`([a-z_]+)`$/.exec(c)?.[1] ?? `(not a code cell: ${c})`;
      return { from: code(cells[0]!), event: code(cells[1]!), to: code(cells[2]!), when: cells[3]! } as Transition;
    });
  return { text, rows };
}

function appended(d: Decision): OperationEvent {
  if (d.kind !== 'append') throw new Error(`expected append, got ${d.kind}`);
  return d.event;
}

const accept = (): AcceptCommand => ({
  type: 'accept',
  eventId: 'evt-00000001',
  at: 1_000,
  operationKey: KEY,
  tenant: 'acme',
  actor: 'alice',
  taskId: 'task-1',
  tool: 'kb.write_note',
  version: 1,
  contractDigest: D1,
  effect: 'create',
  inputDigest: D1,
  targetDigest: D1,
  intentSeq: 1,
  submissionId: 'sub-1',
});

describe('the lifecycle transition table', () => {
  it('docs/lifecycle.md holds exactly the table the data prints, row for row', () => {
    const { text, rows } = docRows();
    expect(rows).toEqual(TRANSITIONS.map((t) => ({ ...t })));
    expect(text).toBe(transitionsMarkdown());
  });

  it('names only real statuses and event types, and no row twice', () => {
    const statuses = new Set<string>(['none', ...operationStatuses]);
    const events = new Set<string>(operationEventSchema.options.map((o) => o.shape.type.value));
    for (const t of TRANSITIONS) {
      expect(statuses.has(t.from), `${t.from}`).toBe(true);
      expect(statuses.has(t.to), `${t.to}`).toBe(true);
      expect(t.to, 'nothing goes back to none').not.toBe('none');
      expect(events.has(t.event), `${t.event}`).toBe(true);
    }
    const ids = TRANSITIONS.map((t) => `${t.from}|${t.event}|${t.to}`);
    expect(new Set(ids).size).toBe(ids.length);
    // committed is final but for its compensation: the one row that leaves it records a request, and
    // no row ever makes a committed operation anything but committed or a compensation status.
    expect(TRANSITIONS.filter((t) => t.from === 'committed').map((t) => `${t.event}|${t.to}`)).toEqual([
      'compensation_requested|compensation_requested',
    ]);
    expect(isAllowedTransition('committed', 'accepted', 'accepted')).toBe(false);
    // The three outcomes, and a held-back commit's rollback, are final: no row leaves them, but for
    // a person's resolution of a failed compensation, which records it and keeps the status (FM-20).
    for (const final of ['compensated', 'compensation_failed', 'rolled_back'])
      expect(
        TRANSITIONS.filter((t) => t.from === final && t.to !== final),
        final,
      ).toEqual([]);
    expect(TRANSITIONS.filter((t) => t.from === 'compensation_failed').map((t) => `${t.event}|${t.to}`)).toEqual([
      'compensation_failure_resolved|compensation_failed',
    ]);
    for (const final of ['compensated', 'rolled_back'])
      expect(
        TRANSITIONS.filter((t) => t.from === final),
        final,
      ).toEqual([]);
    // A compensation status comes only from committed, and goes back only to committed.
    const compensation = new Set(['compensation_requested', 'compensated', 'compensation_failed']);
    for (const t of TRANSITIONS) {
      if (compensation.has(t.to) && !compensation.has(t.from)) expect(t.from, t.event).toBe('committed');
      if (compensation.has(t.from) && !compensation.has(t.to)) expect(t.to, t.event).toBe('committed');
    }
    // rolled_back only from a held-back attempt that waits.
    expect(new Set(TRANSITIONS.filter((t) => t.to === 'rolled_back').map((t) => t.from))).toEqual(
      new Set(['awaiting_confirmation']),
    );
    expect(isAllowedTransition('none', 'accepted', 'accepted')).toBe(true);
  });

  it("is the decider's guard: an append whose row the table lacks is refused (skip not_allowed), nothing appended", () => {
    const a = appended(decide(accept(), initialState(), { signer }));
    const start = {
      type: 'start' as const,
      eventId: 'evt-00000002',
      at: 2_000,
      attempt: 1,
      executor: 'ex-1',
      deadlineAt: 9_000,
    };
    const r = appended(decide(start, a.state, { signer }));
    const commit = {
      type: 'commit' as const,
      eventId: 'evt-00000003',
      at: 3_000,
      attempt: 1,
      resourceId: 'n1',
      resultDigest: D1,
    };
    expect(decide(commit, r.state, { signer })).toMatchObject({ kind: 'append', event: { type: 'committed' } });
    // The same command against a table without running --committed--> committed.
    const narrowed = TRANSITIONS.filter((t) => !(t.from === 'running' && t.event === 'committed'));
    expect(decide(commit, r.state, { signer, transitions: narrowed })).toEqual({
      kind: 'skip',
      reason: 'not_allowed',
      state: r.state,
    });
    // And without none --accepted--> accepted nothing can ever be registered.
    expect(
      decide(accept(), initialState(), { transitions: TRANSITIONS.filter((t) => t.from !== 'none') }),
    ).toMatchObject({ kind: 'skip', reason: 'not_allowed' });
  });
});
