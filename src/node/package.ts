/** The Loupe package this code runs from: its folder (package.json, dist/) and its version. */
import { existsSync, readFileSync } from 'node:fs';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';

/** The Loupe package folder, found by walking up from this file; the cwd when it cannot be found. */
export function packageRoot(): string {
  let dir = path.dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < 8; i++) {
    const pj = path.join(dir, 'package.json');
    if (existsSync(pj)) {
      try {
        if (JSON.parse(readFileSync(pj, 'utf8')).name === 'loupe') return dir;
      } catch {
        /* keep looking */
      }
    }
    dir = path.dirname(dir);
  }
  return process.cwd();
}

/** package.json's version ('0.0.0' when it cannot be read) */
export function packageVersion(root = packageRoot()): string {
  try {
    return String(JSON.parse(readFileSync(path.join(root, 'package.json'), 'utf8')).version);
  } catch {
    return '0.0.0';
  }
}
