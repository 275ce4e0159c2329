export {
  boundIssues,
  ERROR_BOUNDS,
  ErrorClass,
  errorClasses,
  type ErrorInfo,
  type FieldIssue,
  invalidInput,
  NextAction,
  nextActionFor,
  toErrorInfo,
  TooltxError,
} from './errors.js';
export {
  canonicalJson,
  digestOf,
  EMPTY_RESULT_DIGEST,
  sha256B64u,
  sha256Hex,
} from './digest.js';
export {
  type ActorId,
  ID_PATTERN,
  idSchema,
  isValidId,
  OPERATION_KEY_PATTERN,
  operationIdOf,
  operationKeySchema,
  type TenantId,
} from './ids.js';
export * as normalise from './normalise.js';
export type { Normaliser } from './normalise.js';
export {
  type CommittedOriginal,
  type CompensableStatus,
  compensableStatuses,
  type CompensationDeclaration,
  type ConfirmDeclaration,
  type Contract,
  CONTRACT_ID_PATTERN,
  ContractRegistry,
  ContractSpecError,
  MAX_REASON_CHARS,
  type ContractSpec,
  type ContractTiming,
  defineContract,
  type DownstreamGuarantees,
  EffectClass,
  effectClasses,
  fieldIssues,
  hasSideEffect,
  type KeyPolicy,
  parseStrict,
} from './contract.js';
export {
  deriveCompensationKey,
  deriveOperationKey,
  type KeyMaterial,
  prepareCall,
  type PreparedCall,
} from './keys.js';
export {
  type AuthorizationContext,
  type AuthorizationResult,
  DeadlinePassedError,
  defineImplementation,
  downstreamKeyOf,
  type ExecutionContext,
  type ExecutionResult,
  type Implementation,
  type PrepareContext,
  type PrepareResult,
  type ProbeResult,
  type ReadContext,
} from './implementation.js';
export {
  EFFECT_DEFAULTS,
  type EffectDefaults,
  type FailureMapping,
  type FailureOutcome,
  failureOutcomeOf,
  failureOutcomes,
} from './defaults.js';
export {
  defineTool,
  HttpStatusError,
  mappedFailure,
  type Tool,
  type ToolImplementation,
  type ToolSpec,
} from './tool.js';
export {
  compensatingContractOf,
  compensatingInput,
  compensationOf,
  type CompensationRequest,
  compensationRequestSchema,
  type ConfirmationRequest,
  confirmationRequestSchema,
  parseCompensationRequest,
  parseConfirmationRequest,
  reasonDigestOf,
} from './compensation.js';
