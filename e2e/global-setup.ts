/**
 * Build the page once for the whole run (skip with LOUPE_E2E_NO_BUILD=1 when dist/ is fresh), and
 * give the run a temporary LOUPE_CACHE_DIR and TMPDIR (removed by the returned teardown) so CLI
 * processes the specs start never write into the user's cache, and no temporary folder outlives the run.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync } from 'node:fs';
import { useScratchTestDirs } from '../tests/helpers/scratch-cache';

export default function globalSetup(): () => void {
  const teardown = useScratchTestDirs();
  mkdirSync('artifacts/screenshots', { recursive: true });
  if (process.env.LOUPE_E2E_NO_BUILD === '1' && existsSync('dist/index.html')) return teardown;
  const t0 = Date.now();
  execFileSync(process.execPath, ['node_modules/vite/bin/vite.js', 'build', '--logLevel', 'warn'], {
    stdio: 'inherit',
  });
  console.log(`[e2e] built the page in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  return teardown;
}
