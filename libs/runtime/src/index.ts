export * from './config.js';
export * from './logger.js';
export * from './shutdown.js';
export * from './tools.js';
export * from './secrets.js';
export * from './startup.js';
export * from './cli.js';
