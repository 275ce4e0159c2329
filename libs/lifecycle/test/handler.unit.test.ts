/**
 * The one command handler over the in-memory store: load → decide → append under the sequence it
 * decided on; a lost race is decided again on the newer state (or, without retry, reported as
 * moved on); a command that does not apply appends nothing.
 */
import { describe, expect, it } from 'vitest';
import {
  ConcurrencyError,
  generateReceiptKey,
  handleCommand,
  receiptSigner,
  type AcceptCommand,
  type EventStore,
  type OperationCommand,
} from '@tooltx/lifecycle';
import { MemoryStore } from '@tooltx/store-memory';

const D1 = `sha256:${'1'.repeat(64)}`;
const D2 = `sha256:${'2'.repeat(64)}`;
const KEY = `opk_${'A'.repeat(43)}`;
const signer = receiptSigner(generateReceiptKey().privatePem);
let n = 0;
const id = () => `evt-${String(++n).padStart(8, '0')}`;
const accept = (over: Partial<AcceptCommand> = {}): AcceptCommand => ({
  type: 'accept',
  eventId: id(),
  at: 1_000,
  operationKey: KEY,
  tenant: 'acme',
  actor: 'alice',
  taskId: 't',
  tool: 'kb.write_note',
  version: 1,
  contractDigest: D1,
  effect: 'create',
  inputDigest: D1,
  targetDigest: D2,
  intentSeq: 10,
  submissionId: 's',
  ...over,
});
const start = (executor: string): OperationCommand => ({
  type: 'start',
  eventId: id(),
  at: 2_000,
  attempt: 1,
  executor,
  deadlineAt: 5_000,
});

describe('the command handler', () => {
  it('given a new key, when accepted on a guessed empty state, then the event is stored and read back', async () => {
    const store = new MemoryStore();
    const h = await handleCommand(store, 'acme', 'op1', () => accept(), {
      known: { state: { status: 'none' }, seq: 0 },
    });
    expect(h.kind).toBe('appended');
    if (h.kind !== 'appended') return;
    expect(await store.load('acme', 'op1')).toEqual({ state: h.event.state, seq: h.seq });
  });

  it('given a known key, when the guess of an empty state loses, then the handler reads it and replays or reports the conflict', async () => {
    const store = new MemoryStore();
    await handleCommand(store, 'acme', 'op2', () => accept());
    const replay = await handleCommand(store, 'acme', 'op2', () => accept({ intentSeq: 11 }), {
      known: { state: { status: 'none' }, seq: 0 },
    });
    expect(replay).toMatchObject({ kind: 'decided', decision: { kind: 'replay' } });
    const conflict = await handleCommand(store, 'acme', 'op2', () => accept({ inputDigest: D2, intentSeq: 12 }), {
      known: { state: { status: 'none' }, seq: 0 },
    });
    expect(conflict).toMatchObject({ kind: 'decided', decision: { kind: 'conflict' } });
    expect(store.history('acme', 'op2')).toHaveLength(1);
  });

  it('given two executors starting one operation at once, then exactly one runs it; the other is told it no longer applies', async () => {
    const store = new MemoryStore();
    await handleCommand(store, 'acme', 'op3', () => accept());
    const loaded = await store.load('acme', 'op3');
    const [a, b] = await Promise.all(
      ['x', 'y'].map((e) => handleCommand(store, 'acme', 'op3', () => start(e), { known: loaded, retry: false })),
    );
    expect([a!.kind, b!.kind].sort()).toEqual(['appended', 'moved_on']);
    // Decided again on the newer state instead, the loser is skipped: the operation is running already.
    const again = await handleCommand(store, 'acme', 'op3', () => start('z'), { known: loaded });
    expect(again).toMatchObject({ kind: 'decided', decision: { kind: 'skip', reason: 'not_accepted' } });
    expect(store.history('acme', 'op3').map((e) => e.type)).toEqual(['accepted', 'running']);
  });

  it('given a stale guess on which the command appends nothing, then it is decided again on a read before it is answered', async () => {
    const store = new MemoryStore();
    const a = await handleCommand(store, 'acme', 'op7', () => accept());
    if (a.kind !== 'appended') throw new Error('not registered');
    // A guess that the operation already runs (stale: it is accepted): on it, `start` would be skipped.
    const guessedRunning = { state: { ...a.event.state, status: 'running' as const }, seq: a.seq };
    const h = await handleCommand(store, 'acme', 'op7', () => start('x'), { known: guessedRunning, retry: false });
    expect(h.kind).toBe('appended');
    expect(store.history('acme', 'op7').map((e) => e.type)).toEqual(['accepted', 'running']);
  });

  it('given a precondition that no longer holds, then nothing is appended', async () => {
    const store = new MemoryStore();
    await handleCommand(store, 'acme', 'op4', () => accept());
    const h = await handleCommand(store, 'acme', 'op4', () => start('x'), { applies: (s) => s.status === 'running' });
    expect(h).toEqual({ kind: 'moved_on' });
    expect(store.history('acme', 'op4')).toHaveLength(1);
  });

  it('builds a fresh command for each state it decides on, and signs a commit with its signer', async () => {
    const store = new MemoryStore();
    await handleCommand(store, 'acme', 'op5', () => accept());
    await handleCommand(store, 'acme', 'op5', () => start('x'));
    const made: string[] = [];
    const stale = await store.load('acme', 'op5');
    await handleCommand(store, 'acme', 'op5', () => ({
      type: 'mark_unknown',
      eventId: id(),
      at: 3_000,
      attempt: 1,
      evidence: { kind: 'timeout', at: 3_000 },
    }));
    const h = await handleCommand(
      store,
      'acme',
      'op5',
      () => {
        const c: OperationCommand = {
          type: 'commit',
          eventId: id(),
          at: 4_000,
          attempt: 1,
          resourceId: 'note-1',
          resultDigest: D2,
        };
        made.push(c.eventId);
        return c;
      },
      { known: stale, signer },
    );
    expect(made).toHaveLength(2);
    expect(h.kind).toBe('appended');
    if (h.kind === 'appended' && h.event.type === 'committed')
      expect(h.event.receipt).toMatchObject({ prevEventCount: 3 });
  });

  it('given a store where every round loses, then ConcurrencyError after the last round', async () => {
    const base = new MemoryStore();
    await handleCommand(base, 'acme', 'op6', () => accept());
    const losing: EventStore = {
      load: (t, o) => base.load(t, o),
      append: async (t, o) => {
        throw new ConcurrencyError(`${t}.${o}`, 0);
      },
    };
    await expect(handleCommand(losing, 'acme', 'op6', () => start('x'))).rejects.toBeInstanceOf(ConcurrencyError);
  });
});
