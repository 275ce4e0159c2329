/**
 * The sample deployment's contracts as one list, the half shared with agents (`tooltx mcp`'s
 * TOOLTX_CONTRACTS_MODULE): the research KB's and the mail outbox's, read from the same settings
 * as the trusted module (./tools.ts), so that a host's copy has the server's digests.
 */
import { kbDedupFromEnv, kbTimingFromEnv, researchContracts } from './contracts.js';
import { mailConfirmDeadlineFromEnv, mailContracts, mailDedupFromEnv, mailTimingFromEnv } from './mail-contracts.js';

export const contracts = [
  ...researchContracts({ kbDedup: kbDedupFromEnv(), timing: kbTimingFromEnv() }).all,
  ...mailContracts({
    mailDedup: mailDedupFromEnv(),
    timing: mailTimingFromEnv(),
    confirmDeadlineMs: mailConfirmDeadlineFromEnv(),
  }).all,
];
