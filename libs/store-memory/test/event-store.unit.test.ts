/**
 * The operation store contract against the in-memory store, on a fake clock: the duplicate window
 * passes only when the suite steps the clock past it, so no case depends on how fast it ran.
 */
import { MemoryStore } from '@tooltx/store-memory';
import { eventStoreContract } from '../../../test/contracts/event-store.js';

const WINDOW_MS = 1_000;

eventStoreContract('in memory', () => {
  let clock = 1_700_000_000_000;
  const now = () => clock;
  const store = new MemoryStore({ duplicateWindowMs: WINDOW_MS, now });
  return {
    store,
    deleteEvent: async (seq) => store.deleteEvent(seq),
    countEvents: async (tenant, opId) => store.history(tenant, opId).length,
    addIntent: async (tenant, actor, data, submissionId) => {
      const subject = `tcontract.intent.${tenant}.${actor}`;
      return { seq: store.addIntent(tenant, subject, data, submissionId), subject };
    },
    duplicateWindowMs: WINDOW_MS,
    now,
    passDuplicateWindow: async () => void (clock += WINDOW_MS),
  };
});
