export {
  type DebugAnswer,
  type DebugServiceDeps,
  type SampleSummary,
  startDebugService,
} from './debug-service.js';
export { AnswerPusher } from './answer-pusher.js';
export { type Codec, type Endpoint, jsonCodec, msgpackCodec, type Responder, startResponder } from './responder.js';
export { STATUS_QUEUE, type StatusDeps, StatusService } from './status-service.js';
export {
  AUDIT_QUEUE,
  auditRecordsOf,
  AuditService,
  type AuditServiceDeps,
  inRange,
  PAGE_BYTES,
  pageOf,
  REBUILDING_RETRY_MS,
} from './audit-queries.js';
export {
  type OpsQueryAnswer,
  opsQueryAnswerSchema,
  type OpsQueryRequest,
  opsQueryRequestSchema,
  type OpsQueryServiceDeps,
  startOpsQueryService,
} from './ops-query-service.js';
export {
  startTakeoverService,
  type TakeoverAnswer,
  type TakeoverRequest,
  takeoverRequestSchema,
  type TakeoverServiceDeps,
  type WatchedTakeover,
} from './takeover-service.js';
export {
  applyRegistryCommand,
  type ContractsAnswer,
  type ContractsRequest,
  contractsListAnswerSchema,
  contractsRequestSchema,
  type ContractsServiceDeps,
  DEFAULT_USAGE_WINDOW_MS,
  startAutoRevert,
  startContractsService,
  usageOf,
  type VersionRow,
  type VersionUsage,
} from './contracts-service.js';
