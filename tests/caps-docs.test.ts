/**
 * The limits in docs/bridge.md's table and in the README's security section are CAPS itself: every
 * key of src/engine/caps.ts with its value, between the `caps` markers, and nothing else. A limit
 * added or changed without its documentation fails here.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { CAPS, type CapName } from '../src/engine/caps';

const MiB = 1024 * 1024;
const root = path.resolve(__dirname, '..');

/** how a limit is written in the docs: bytes in MiB/GiB where whole, seconds and rates with their unit */
function written(key: CapName): string {
  const n: number = CAPS[key];
  const s = n.toLocaleString('en-US');
  if (/PerS$/.test(key)) return `${s} B/s`;
  if (/S$/.test(key)) return `${s} s`;
  if (/Bytes/.test(key) && n % MiB === 0) return n % (1024 * MiB) === 0 ? `${n / 1024 / MiB} GiB` : `${n / MiB} MiB`;
  return s;
}

function between(file: string): string {
  const text = readFileSync(path.join(root, file), 'utf8');
  const m = /<!-- caps -->\n(.*?)<!-- \/caps -->/s.exec(text);
  expect(m, `the caps markers in ${file}`).not.toBeNull();
  return m![1];
}

const expected = () => Object.fromEntries((Object.keys(CAPS) as CapName[]).map((k) => [k, written(k)]));

describe('the table of limits in the docs is CAPS', () => {
  it('docs/bridge.md: one row per limit, with its value', () => {
    const found: Record<string, string> = {};
    for (const m of between('docs/bridge.md').matchAll(/^\| `(\w+)` \| ([^|]+) \|/gm)) found[m[1]] = m[2].trim();
    expect(found).toEqual(expected());
  });

  it("README.md's security section: every limit by name, with its value", () => {
    const found: Record<string, string> = {};
    for (const m of between('README.md').matchAll(/`(\w+)` ([\d,.]+(?: (?:MiB|GiB|s|B\/s))?)(?=,|\n)/g))
      found[m[1]] = m[2];
    expect(found).toEqual(expected());
  });
});
