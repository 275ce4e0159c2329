/**
 * tooltx executor — runs accepted operations exactly once per attempt.
 *
 * Usage: `tsx services/executor/src/main.ts [--help]`. Same environment as the authorizer.
 * Stops cleanly on SIGTERM/SIGINT: stops pulling, lets in-flight attempts finish (bounded by their
 * contract's timeoutMs), drains.
 */
import { runService } from '@tooltx/runtime/service';
import { executorRole } from './role.js';

await runService(executorRole);
