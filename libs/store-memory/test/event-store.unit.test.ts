import { MemoryStore } from '@tooltx/store-memory';
import { eventStoreContract } from '../../../test/contracts/event-store.js';

eventStoreContract('in memory', () => {
  const store = new MemoryStore({ duplicateWindowMs: 200 });
  return {
    store,
    deleteEvent: async (seq) => store.deleteEvent(seq),
    countEvents: async (tenant, opId) => store.history(tenant, opId).length,
    duplicateWindowMs: 200,
  };
});
