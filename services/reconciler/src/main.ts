/**
 * tooltx reconciler — placeholder process until its issue lands (issue 3 adds its projection).
 * Starts with the shared composition root (config, stream check) and stops cleanly on SIGTERM.
 */
import { runService } from '@tooltx/runtime/service';

await runService({
  name: 'reconciler',
  summary: 'not yet consuming: starts, checks the streams and stops cleanly',
  async start() {
    return async () => undefined;
  },
});
