export * from './topology.js';
export * from './provision.js';
export * from './tenancy.js';
