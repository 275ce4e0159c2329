export * from './intent.js';
export * from './tools.js';
export * from './runner.js';
