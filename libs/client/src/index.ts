export * from './intent.js';
export * from './tools.js';
