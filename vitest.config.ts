import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    globalSetup: ['test/global-setup.ts'],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    pool: 'forks',
    projects: [
      {
        extends: true,
        test: {
          name: 'main',
          include: [
            'test/**/*.test.ts',
            'libs/*/test/**/*.test.ts',
            'services/*/test/**/*.test.ts',
            'dev/test/**/*.test.ts',
          ],
          exclude: ['test/cluster/**', 'test/matrix/**'],
          // Integration files spawn service processes; two machine cores.
          maxWorkers: 2,
        },
      },
      {
        extends: true,
        test: {
          // Three nats-server nodes, the services and 200 writes in flight: alone, after the rest,
          // one file at a time, so a node's kill is the only fault (docs/cluster.md).
          name: 'cluster',
          include: ['test/cluster/**/*.test.ts'],
          maxWorkers: 1,
          sequence: { groupOrder: 1 },
          testTimeout: 240_000,
          hookTimeout: 120_000,
        },
      },
      {
        extends: true,
        test: {
          // Heavier end-to-end scenarios kept out of `npm test` (time budget): `npm run matrix`.
          name: 'matrix',
          include: ['test/matrix/**/*.test.ts'],
          maxWorkers: 1,
          sequence: { groupOrder: 2 },
          testTimeout: 300_000,
          hookTimeout: 120_000,
        },
      },
    ],
  },
});
