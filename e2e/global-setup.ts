/** Build the page once for the whole run (skip with LOUPE_E2E_NO_BUILD=1 when dist/ is fresh). */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync } from 'node:fs';

export default function globalSetup(): void {
  mkdirSync('artifacts/screenshots', { recursive: true });
  if (process.env.LOUPE_E2E_NO_BUILD === '1' && existsSync('dist/index.html')) return;
  const t0 = Date.now();
  execFileSync(process.execPath, ['node_modules/vite/bin/vite.js', 'build', '--logLevel', 'warn'], { stdio: 'inherit' });
  console.log(`[e2e] built the page in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
}
