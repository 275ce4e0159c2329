export { Subjects } from './subjects.js';
export {
  CodecError,
  decode,
  decodeMsg,
  keepOwnAppendsForDelivery,
  rememberOwnAppend,
  decodeRaw,
  encode,
} from './codec.js';
export { checkMsgpack, MAX_MSGPACK_DEPTH, MsgpackShapeError } from './msgpack-guard.js';
export {
  connectNats,
  type ConnectOptions,
  connectProblemOf,
  displayUrl,
  jetStreamOf,
  type NatsConnection,
  openBucket,
  type PermissionViolation,
  permissionViolationOf,
} from './connect.js';
export {
  EVENT_TYPE_HEADER,
  EVENT_STATUS_HEADER,
  eventStatusOf,
  eventTypeOf,
  IN_FLIGHT_DUPLICATE_CODE,
  isInFlightDuplicate,
  isNoRespondersPublish,
  isTransient,
  isWrongLastSequence,
  JetStreamStore,
  newEventId,
} from './jetstream-store.js';
export {
  type ConsumerLoop,
  type ConsumerLoopOptions,
  type Deferred,
  heldLimit,
  type Settlement,
  startConsumerLoop,
} from './consumer.js';
export {
  assertSupportedServer,
  DURABILITIES,
  type Durability,
  INSTALL_HINT,
  jetstreamConfigBlock,
  MIN_SERVER_VERSION,
  parseServerVersion,
  serverVersionAtLeast,
  UnsupportedServerError,
} from './server-version.js';
export { opEventOf } from './op-event.js';
export { KvMirror } from './kv-mirror.js';
export { applyClientPatches, clientPatchesOf, type ClientPatches } from './client-patches.js';
export {
  committedResult,
  resultEntrySchema,
} from './results.js';
export {
  inboxPrefixOf,
  isOwnReplyInbox,
  RESPONSE_SUBJECTS,
  type Role,
  SERVICE_NAMES,
  type ServiceName,
} from './inboxes.js';
export {
  contextOfFields,
  contextOfHeaders,
  inContext,
  contextOfTraceparent,
  endSpan,
  SpanKind,
  startSpan,
  toolSpanAttributes,
  traceFieldsOf,
  traceHeadersOf,
  traceparentOf,
  withSpan,
  type Context as TraceContext,
  type Span,
} from './trace-context.js';
