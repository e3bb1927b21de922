/**
 * Test runs (and the benches, whose models are temporary) never write into the user's cache
 * (~/.cache/loupe): vitest's and Playwright's global setups and the bench entry points set
 * LOUPE_CACHE_DIR to a fresh temporary folder, which every worker and every CLI, companion or
 * bench child process inherits, and remove it afterwards.
 *
 * Test runs also get a scratch TMPDIR: many tests make temporary folders (fake page builds,
 * config dirs, SAE files, symlink farms) with mkdtemp and cannot all remove them when a test fails
 * or a child process is killed; under one run-wide folder, the teardown removes every one of them.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';

function scratch(prefix: string, set: (dir: string) => void): () => void {
  const dir = mkdtempSync(path.join(tmpdir(), prefix));
  set(dir);
  return () => rmSync(dir, { recursive: true, force: true });
}

export function useScratchCacheDir(): () => void {
  return scratch('loupe-test-cache-', (dir) => {
    process.env.LOUPE_CACHE_DIR = dir;
  });
}

/** os.tmpdir() reads TMPDIR on every call, in this process and in every worker and child it starts. */
export function useScratchTmpDir(): () => void {
  const previous = process.env.TMPDIR;
  const remove = scratch('loupe-test-tmp-', (dir) => {
    process.env.TMPDIR = dir;
  });
  return () => {
    if (previous === undefined) delete process.env.TMPDIR;
    else process.env.TMPDIR = previous;
    remove();
  };
}

/** The scratch folders of a test run; returns the teardown that removes both. */
export function useScratchTestDirs(): () => void {
  const tmp = useScratchTmpDir();
  const cache = useScratchCacheDir();
  return () => {
    cache();
    tmp();
  };
}

/** vitest globalSetup entry: returns its teardown. */
export default function setup(): () => void {
  return useScratchTestDirs();
}

/** A test file's own LOUPE_CACHE_DIR (a fresh folder) until the returned function restores the one before and removes it. */
export function ownCacheDir(prefix: string): { dir: string; restore: () => void } {
  const prev = process.env.LOUPE_CACHE_DIR;
  const dir = mkdtempSync(path.join(tmpdir(), prefix));
  process.env.LOUPE_CACHE_DIR = dir;
  return {
    dir,
    restore() {
      if (prev === undefined) delete process.env.LOUPE_CACHE_DIR;
      else process.env.LOUPE_CACHE_DIR = prev;
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
