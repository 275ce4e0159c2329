export {
  checkIdentityList,
  compensatingOperators,
  debuggingOperators,
  confirmingOperators,
  identityListSchema,
  OPERATOR_GRANTS,
  operatorsOf,
  queryingOperators,
  contractOperators,
  tenantsOf,
  type IdentityList,
  type Operator,
  type OperatorGrant,
} from './identities.js';
export { knownDurables, permissionsFor, type Permissions } from './permissions.js';
export {
  generateAuth,
  RECEIPT_SIGNERS,
  type ClusterNode,
  type ClusterSpec,
  type GeneratedAuth,
  type GeneratedUser,
} from './generate.js';
export {
  consoleLoginName,
  consoleLoginSchema,
  consoleLoginsSchema,
  verifyConsoleLogin,
  writeConsoleLogins,
  type ConsoleLogin,
  type ConsoleLogins,
  type ConsoleRole,
} from './console-logins.js';
