export {
  newSubmission,
  publishSubmission,
  type Submission,
} from './submission.js';
export {
  classifyPublishRefusal,
  createTools,
  type CreateToolsOptions,
  type ExecuteOptions,
  type ExecuteRequest,
  type ExecuteResult,
  type Next,
  PublishRefusalCode,
  QUOTA_RETRY_AFTER_MS,
  type ReceiptCheck,
  type Tools,
  ToolsOptionError,
  type UnknownEvidence,
} from './client.js';
export type { CompensateRequest, CompensateResult } from './compensate.js';
export type { ConfirmationRequest, ConfirmResult, DiscardResult } from './confirm.js';
export {
  runTask,
  type StepOutcome,
  type TaskRun,
  type TaskSpec,
  type TaskStep,
} from './runner.js';
// The shapes an agent reads from outcomes and status, by name (they travel inside ExecuteResult).
export type { Receipt, ServerState, StatusAnswer, StatusRequest } from '@tooltx/lifecycle';
