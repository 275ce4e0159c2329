export * from './topology.js';
export * from './provision.js';
