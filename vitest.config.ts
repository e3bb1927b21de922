import { defineConfig } from 'vitest/config';

// Two cores here and in CI: run test files two at a time, generous timeouts for model runs.
export default defineConfig({
  test: {
    include: ['tests/**/*.test.ts'],
    testTimeout: 120_000,
    hookTimeout: 120_000,
    pool: 'forks',
    maxWorkers: 2,
    reporters: ['default'],
  },
});
