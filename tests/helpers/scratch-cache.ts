/**
 * Test runs (and the benches, whose models are temporary) never write into the user's cache
 * (~/.cache/loupe): vitest's and Playwright's global setups and the bench entry points set
 * LOUPE_CACHE_DIR to a fresh temporary folder, which every worker and every CLI, companion or
 * bench child process inherits, and remove it afterwards.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';

export function useScratchCacheDir(): () => void {
  const dir = mkdtempSync(path.join(tmpdir(), 'loupe-test-cache-'));
  process.env.LOUPE_CACHE_DIR = dir;
  return () => rmSync(dir, { recursive: true, force: true });
}

/** vitest globalSetup entry: returns its teardown. */
export default function setup(): () => void {
  return useScratchCacheDir();
}
