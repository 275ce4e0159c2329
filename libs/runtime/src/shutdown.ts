import type { Logger } from 'pino';

/**
 * Runs `stop` once on the first SIGTERM or SIGINT, then exits 0 (or 1 when `stop` throws or takes
 * longer than `graceMs`, default 15 000 ms). A second signal exits at once with code 130.
 */
export function onShutdown(log: Logger, stop: () => Promise<void>, graceMs = 15_000): void {
  let stopping = false;
  const handler = (signal: NodeJS.Signals) => {
    if (stopping) {
      log.warn({ signal }, 'second signal: exiting now');
      process.exit(130);
    }
    stopping = true;
    log.info({ signal }, 'shutting down: draining');
    const timer = setTimeout(() => {
      log.error({ graceMs }, 'shutdown took too long: exiting');
      process.exit(1);
    }, graceMs);
    timer.unref();
    stop().then(
      () => {
        log.info('stopped cleanly');
        log.flush?.();
        process.exit(0);
      },
      (err: unknown) => {
        log.error({ err }, 'shutdown failed');
        process.exit(1);
      },
    );
  };
  process.on('SIGTERM', handler);
  process.on('SIGINT', handler);
}
