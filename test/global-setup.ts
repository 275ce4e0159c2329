import { natsServerBinary, NatsServerUnavailableError } from '@tooltx/nats';

/**
 * Every test file starts its own nats-server with a generated auth configuration (issue 5), so
 * the run only checks once that the binary is there, failing with the install command if not.
 */
export function setup(): void {
  if (!natsServerBinary()) {
    throw new NatsServerUnavailableError('nats-server not found: run `scripts/ensure-nats-server` (apt-get install nats-server)');
  }
}
