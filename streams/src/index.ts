export * from './topology.js';
export * from './provision.js';
export * from './identity.js';
export * from './tenancy.js';
