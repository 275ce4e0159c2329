export { MAX_SAMPLE_FIELD_BYTES, type SampleOffer, Sampler, type SamplerDeps } from './sampler.js';
export {
  baseConfigSchema,
  ConfigError,
  envInt,
  loadConfig,
  serviceConfigSchema,
  showValue,
} from './config.js';
export {
  CENSOR,
  createLogger,
  installProcessHandlers,
  type Logger,
  type LoggerSetup,
  safeError,
  scrubber,
  isSensitiveKey,
  scrubString,
  stdoutDestination,
} from './logger.js';
export {
  exitWithParent,
  onShutdown,
} from './shutdown.js';
export {
  ImplementationRegistry,
  loadImplementations,
  ToolsModuleError,
} from './implementations.js';
export {
  ensureKeyFile,
  KEYED_DIGEST_PATTERN,
  keyedDigest,
  MIN_KEY_CHARS,
  readKeyFile,
  SecretFileError,
} from './secrets.js';
export {
  announceReady,
  describeConnectError,
  describeError,
  displayUrl,
  failStartup,
  isNatsError,
  makeDirs,
  type ReadyMessage,
  StartupError,
  StartupFailure,
  type StartupReporter,
  startupStep,
} from './startup.js';
export { usageErrorsExitTwo } from './cli.js';
export { DURATION_AGO, durationMsOf, timeSpecOf } from './time-spec.js';
export {
  freezeTask,
  type FrozenTask,
  frozenTaskSchema,
  FrozenTaskWatch,
  listFrozenTasks,
  taskKeyOf,
  thawTask,
} from './frozen-tasks.js';
export {
  projectEntry,
  ProjectionApplier,
  ProjectionBatcher,
  ProjectionCache,
  ProjectionCorruptError,
  type ProjectionOutcome,
  type ProjectionRule,
} from './projection-writer.js';
export {
  ProjectionGuard,
  type ProjectionGuardOptions,
  type ProjectionRebuilder,
  type RebuildSource,
} from './projection-rebuild.js';
export { compensatingCall, compensationInputOf, intentInputOf, linkCompensation } from './compensation.js';
export { discardPrepared } from './held-back.js';
export { askPolicy, type PolicyAnswer } from './policy.js';
export { startTracing, tracingWanted, type Tracing } from './tracing.js';
export { CAS_ROUNDS, CasContendedError, casUpdate } from './kv-cas.js';
export {
  ContractDigestConflictError,
  publishContracts,
  publishedOf,
  RegistryMirror,
  startHeldMarks,
} from './contract-registry.js';
