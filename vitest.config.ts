import { defineConfig } from 'vitest/config';

// Two cores here and in CI: run test files two at a time, generous timeouts for model runs.
export default defineConfig({
  test: {
    include: ['tests/**/*.test.ts'],
    // a temporary LOUPE_CACHE_DIR and TMPDIR for the whole run, removed afterwards (tests/helpers/scratch-cache.ts)
    globalSetup: ['tests/helpers/scratch-cache.ts'],
    testTimeout: 120_000,
    hookTimeout: 120_000,
    pool: 'forks',
    maxWorkers: 2,
    reporters: ['default'],
  },
});
