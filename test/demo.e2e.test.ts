/**
 * The main job in quick mode: `npm run demo -- --quick --json` must meet its gates, under
 * its fault mix (writes cut after the KB's commit, answers held past the SDK's budget,
 * the agent's NATS connection cut once, the executor SIGKILLed once and restarted), with another
 * tenant's forgeries refused by the server and quotas from the tenant list.
 */
import { spawn } from 'node:child_process';
import { serverVersionAtLeast } from '@tooltx/nats';
import { describe, expect, it } from 'vitest';

describe('npm run demo --quick', () => {
  it('reads ~20 real pages under the fault mix, submits every write twice and ends with one KB row per page, every fault resolved by probing, no duplicate side effect, every forgery refused by the server and no unauthorised row; then three notes compensated, one of them refused by the KB and ended in a takeover (the only one of the run), and two digest mails held back: one confirmed and sent once, one discarded and rolled back', {
    timeout: 360_000,
  }, async () => {
    const child = spawn(process.execPath, ['--import', 'tsx', 'examples/research-kb/demo.ts', '--quick', '--json'], {
      env: { ...process.env, NATS_URL: '', LOG_LEVEL: 'info' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    let err = '';
    child.stdout.on('data', (c: Buffer) => (out += c.toString()));
    child.stderr.on('data', (c: Buffer) => (err += c.toString()));
    const code = await new Promise<number | null>((r) => child.once('exit', r));
    const last = out.trim().split('\n').pop() ?? '';
    const s = JSON.parse(last) as Record<string, number | boolean> & {
      faultsByKind: {
        cutAfterCommit: number;
        heldPastBudget: number;
        agentConnectionCut: number;
        executorKilled: number;
      };
      forgedOutcomes: Record<string, string>;
      quotas: Record<string, { limit: number | null; used: number }>;
      gates: Record<string, boolean>;
      natsServer: { version: string; durability: string };
    };
    expect({ code, err: code === 0 ? '' : err }).toEqual({ code: 0, err: '' });
    // The project's own nats-server, 2.10.27 or later, fsyncing before every acknowledgement.
    expect(serverVersionAtLeast(s.natsServer.version, '2.10.27')).toBe(true);
    expect(s.natsServer.durability).toBe('fsync');
    expect(s.pages).toBeGreaterThanOrEqual(18);
    expect(s.writesSubmitted).toBe(2 * (s.pages as number));
    expect(s.writesCommitted).toBe(s.pages);
    expect(s.duplicatesSuppressed).toBe(s.pages);
    expect(s.kbRows).toBe(s.pages);
    expect(s.honestWritesRejected).toBe(0);
    expect(s.duplicateSideEffects).toBe(0);
    // The fault mix: every planned fault was injected, each kind at least once.
    expect(s.faultsInjected).toBe(s.faultsPlanned);
    expect(s.faultsByKind.agentConnectionCut).toBe(1);
    expect(s.faultsByKind.executorKilled).toBe(1);
    expect(s.faultsByKind.cutAfterCommit).toBeGreaterThanOrEqual(1);
    expect(s.faultsByKind.heldPastBudget).toBeGreaterThanOrEqual(1);
    expect(s.executorRestarts).toBeGreaterThanOrEqual(1);
    // Every faulted write was resolved by probing the KB: committed with the row the probe finds,
    // one row; none was handed over to a person. A held write's SDK call gives up first (unknown),
    // the demo observes it until it converges. (A cut write usually goes through a recorded unknown
    // too, unless the executor was killed under it: then the sweep's probe commits it directly.)
    expect(s.faultsResolvedByProbe).toBe(s.faultsByKind.cutAfterCommit + s.faultsByKind.heldPastBudget);
    expect(s.unknownAtFirst).toBeGreaterThanOrEqual(s.faultsByKind.heldPastBudget);
    expect(s.unknownResolved).toBeGreaterThanOrEqual(s.faultsByKind.heldPastBudget);
    expect(s.unknownUnresolved).toBe(0);
    // The one takeover of the run is the planned failed compensation's (FM-20).
    expect(s.takeovers).toBe(1);
    // FM-16: the five canary kinds were planted in this run; none is anywhere it must not be.
    expect(s.canariesPlanted).toBe(5);
    expect(s.leakedSecrets).toBe(0);
    // Every forgery of the other tenant reached the server and the SERVER refused it — the
    // tenant field went out as a raw intent (the SDK would have refused it locally) and came back as
    // the server's invalid_input; the KB holds no row in a knowledge base whose owner is not the
    // tenant the demo submitted it as (from the demo's own record of its writes).
    expect(s.forgedAttempts).toBeGreaterThan(0);
    expect(s.forgedRejected).toBe(s.forgedAttempts);
    expect(s.forgedOutcomes).toEqual({
      forgedActorId: 'forbidden',
      tenantField: 'forbidden',
      guessedKbId: expect.stringMatching(/^(not_found|forbidden)$/),
      foreignIntentSubject: 'permission',
    });
    expect(s.unauthorisedWrites).toBe(0);
    expect(s.kbRowsChecked).toBe(s.kbRows);
    expect(s.crossTenantReadsRevealed).toBe(0);
    // Quotas come from the tenant list and the KB counts them (one note per page for acme).
    expect(s.quotas.acme).toEqual({ limit: 1_000_000, used: expect.any(Number) });
    expect(s.quotas.acme!.used).toBeGreaterThan(0);
    expect(s.quotas.acme!.used).toBeLessThanOrEqual(s.kbRows as number);
    expect(s.quotas.globex!.limit).toBe(100_000);
    // The honest gates, each by name, and then all of them.
    expect(s.gates).toEqual({
      enoughPages: true,
      writesSubmittedIsTwicePages: true,
      oneCommittedNotePerPage: true,
      noHonestRejection: true,
      noUnresolvedUnknown: true,
      onlyPlannedCompensationFailuresTakenOver: true,
      everyFaultInjected: true,
      everyFaultResolvedByProbe: true,
      noDuplicateSideEffect: true,
      everyForgeryRejected: true,
      noUnauthorisedWrite: true,
      quotasFromTenantList: true,
      noLeakedSecret: true,
      compensationsAsPlanned: true,
      heldBackMailsAsPlanned: true,
    });
    // Compensations: all but the one whose delete the KB's hop refused; that one was taken over.
    expect(s.compensated).toBe(2);
    expect(s.compensationFailed).toBe(1);
    // Held-back digest mails: the confirmed one sent once, the discarded one rolled back, nothing sent.
    expect(s.mailsSent).toBe(1);
    expect(s.rolledBack).toBe(1);
    expect(s.ok).toBe(true);
  });
});
