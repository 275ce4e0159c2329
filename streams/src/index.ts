export {
  type BucketDef,
  type ConsumerDef,
  Durables,
  MAX_DELIVER,
  type TenantTopology,
  topology,
  type Topology,
  type TopologyOptions,
} from './topology.js';
export {
  allConsumers,
  allStreams,
  type ApplyReport,
  applyTopology,
  assertTopology,
  checkDurables,
  checkTopology,
  createBucket,
  projectionBuckets,
  StreamConfigError,
} from './provision.js';
export {
  DEFAULT_TENANT_LIMITS,
  type PartialTenantLimits,
  partialTenantLimitsSchema,
  resolveLimits,
  type TenantEntry,
  tenantEntrySchema,
  type TenantLimits,
  tenantLimitsSchema,
  type TenantSpec,
} from './tenancy.js';
