import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts', 'libs/*/test/**/*.test.ts', 'services/*/test/**/*.test.ts'],
    globalSetup: ['test/global-setup.ts'],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    pool: 'forks',
    // Integration files spawn service processes; two machine cores.
    maxWorkers: 2,
  },
});
