export * from './subjects.js';
export * from './codec.js';
export * from './connect.js';
export * from './store.js';
export * from './consumer.js';
export * from './server.js';
export * from './projection.js';
export * from './tasks.js';
