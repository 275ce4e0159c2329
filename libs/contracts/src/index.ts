export * from './errors.js';
export * from './digest.js';
export * from './ids.js';
export * as normalise from './normalise.js';
export type { Normaliser } from './normalise.js';
export * from './contract.js';
export * from './keys.js';
export * from './implementation.js';
