export * from './intent.js';
