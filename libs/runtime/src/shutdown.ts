import type { Logger } from 'pino';

/**
 * Runs `stop` once on the first SIGTERM or SIGINT, then exits 0 (or 1 when `stop` throws or takes
 * longer than `graceMs`, default 15 000 ms). A second signal exits at once with code 130.
 */
export function onShutdown(log: Logger, stop: () => Promise<void>, graceMs = 15_000): void {
  let stopping = false;
  // Logging must never keep a process from stopping: with its parent gone, stdout may be a broken
  // pipe and a write can throw (an orphaned KB ignored SIGTERM that way).
  const say = (write: () => void) => {
    try {
      write();
    } catch {
      // nowhere to write
    }
  };
  const handler = (signal: NodeJS.Signals) => {
    if (stopping) {
      say(() => log.warn({ signal }, 'second signal: exiting now'));
      process.exit(130);
    }
    stopping = true;
    const timer = setTimeout(() => {
      say(() => log.error({ graceMs }, 'shutdown took too long: exiting'));
      process.exit(1);
    }, graceMs);
    timer.unref();
    say(() => log.info({ signal }, 'shutting down: draining'));
    Promise.resolve()
      .then(stop)
      .then(
        () => {
          say(() => {
            log.info('stopped cleanly');
            log.flush?.();
          });
          process.exit(0);
        },
        (err: unknown) => {
          say(() => log.error({ err }, 'shutdown failed'));
          process.exit(1);
        },
      );
  };
  process.on('SIGTERM', handler);
  process.on('SIGINT', handler);
}

/**
 * For a process a supervisor started (`npm start`, the demo): stops it when the supervisor is gone.
 * `parentPid` is the supervisor's pid (`TOOLTX_EXIT_WITH_PARENT`; undefined = no watch). Every
 * `intervalMs` (default 500) the process compares its parent with it; once they differ (the
 * supervisor died, even by SIGKILL, and the process was re-parented — also when that happened
 * before this process looked), it sends itself SIGTERM: the {@link onShutdown} handler drains
 * within its grace, and before that handler is installed SIGTERM's default ends the process. A
 * backstop exits 1 after `hardMs` (default 20 000) whatever the handler does — without a log write,
 * since stdout may be a pipe nobody reads any more.
 */
export function exitWithParent(log: Logger, parentPid: number | undefined, intervalMs = 500, hardMs = 20_000): void {
  if (parentPid === undefined) return;
  const check = () => {
    if (process.ppid === parentPid) return;
    clearInterval(timer);
    setTimeout(() => process.exit(1), hardMs).unref();
    try {
      log.warn({ parentPid, ppid: process.ppid }, 'the supervisor is gone: stopping');
    } catch {
      // nowhere to write
    }
    process.kill(process.pid, 'SIGTERM');
  };
  const timer = setInterval(check, intervalMs);
  timer.unref();
  check();
}
