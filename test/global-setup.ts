import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { natsServerBinary, NatsServerUnavailableError } from '@tooltx/dev/nats-server';

/**
 * Every test file starts its own nats-server with a generated auth configuration, so
 * the run only checks once that the binary is there, failing with the install command if not.
 */
export function setup(): () => void {
  if (!natsServerBinary()) {
    throw new NatsServerUnavailableError(
      "nats-server 2.10 or later not found: run `scripts/ensure-nats-server --test-servers` (it fetches Debian 13's into .nats-server/; an older one on PATH is never used)",
    );
  }
  // One directory for the run's secrets the workers write (KB service tokens: helpers/kb-service-token.ts),
  // removed when the run ends: a worker's own exit hooks do not run when the pool ends it.
  const dir = mkdtempSync(join(tmpdir(), 'tooltx-test-run-'));
  process.env.TOOLTX_TEST_RUN_DIR = dir;
  return () => rmSync(dir, { recursive: true, force: true });
}
