export * from './events.js';
export * from './intent.js';
export * from './decider.js';
export * from './transitions.js';
export * from './status.js';
export * from './recovery.js';
export * from './audit.js';
export * from './signing.js';
