/**
 * Code stays readable at its width: prettier formats src/ and workers/ at 120 columns but leaves
 * long strings and comments whole, so this holds them to 160 characters. A line with a URL is
 * exempt (a URL is not broken), as are data files (JSON, CSS).
 */
import { describe, it, expect } from 'vitest';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import * as path from 'node:path';

const ROOT = path.resolve(__dirname, '..');
const MAX = 160;

function filesUnder(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const p = path.join(dir, name);
    if (statSync(p).isDirectory()) return filesUnder(p);
    return /\.(ts|svelte|js|mjs)$/.test(name) ? [p] : [];
  });
}

describe('line width', () => {
  it(`no line in src/ or workers/ is over ${MAX} characters, except those with a URL`, () => {
    const long: string[] = [];
    for (const file of ['src', 'workers'].flatMap((d) => filesUnder(path.join(ROOT, d)))) {
      readFileSync(file, 'utf8')
        .split('\n')
        .forEach((line, i) => {
          if (line.length > MAX && !/https?:\/\//.test(line))
            long.push(`${path.relative(ROOT, file)}:${i + 1} (${line.length})`);
        });
    }
    expect(long).toEqual([]);
  });
});
