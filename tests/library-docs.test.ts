/**
 * docs/LIBRARY.md's examples, run as written: every ```js block after an `<!-- example: name -->`
 * marker is written to a .mjs file inside the checkout (so `import … from 'loupe'` resolves through
 * package.json's exports, as a user's script does), run with Node, and what it prints is checked.
 * The model path `../shared/` is the shared folder beside the checkout (LOUPE_SHARED when set).
 */
import { describe, it, expect, beforeAll } from 'vitest';
import { execFileSync } from 'node:child_process';
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import * as path from 'node:path';
import { SHARED } from './helpers/shared';

const ROOT = path.resolve(__dirname, '..');
const DOC = readFileSync(path.join(ROOT, 'docs/LIBRARY.md'), 'utf8');
const DIR = path.join(ROOT, '.cache', 'library-examples');

const EXAMPLES = new Map(
  [...DOC.matchAll(/<!-- example: ([\w-]+) -->\n```js\n([\s\S]*?)```/g)].map((m) => [m[1], m[2]]),
);

function run(name: string): string {
  const code = EXAMPLES.get(name);
  if (!code) throw new Error(`docs/LIBRARY.md has no example '${name}'`);
  const file = path.join(DIR, `${name}.mjs`);
  writeFileSync(file, code.replaceAll("'../shared/", `'${SHARED}/`));
  return execFileSync(process.execPath, [file], { cwd: ROOT, encoding: 'utf8', timeout: 120_000 });
}

const numbers = (line: string) => line.split(':').pop()!.trim().split(/\s+/).map(Number);

describe("docs/LIBRARY.md's examples run and print what the text says", () => {
  beforeAll(() => {
    rmSync(DIR, { recursive: true, force: true });
    mkdirSync(DIR, { recursive: true });
  });

  it('has the examples the issue asks for, and the quick start is at most ten lines', () => {
    expect([...EXAMPLES.keys()]).toEqual([
      'quickstart',
      'induction-heads',
      'custom-ablation',
      'path-patching',
      'composition',
    ]);
    expect(EXAMPLES.get('quickstart')!.trim().split('\n').length).toBeLessThanOrEqual(10);
  });

  it('quick start: the next token and a pattern of TL shape', () => {
    const out = run('quickstart');
    expect(out).toMatch(/^next: ".+"$/m);
    expect(out).toContain('pattern 1x4x39x39');
  });

  it('find induction heads: the layer-1 heads, not layer 0', () => {
    const lines = run('induction-heads').trim().split('\n');
    const [l0, l1] = lines.map(numbers);
    expect(Math.max(...l0)).toBeLessThan(0.1);
    expect(Math.min(...l1)).toBeGreaterThan(0.4);
  });

  it('ablate with a custom function: zeroing the induction heads on the second copy raises its loss', () => {
    const m = /loss clean ([\d.]+) ablated ([\d.]+)/.exec(run('custom-ablation'));
    expect(m).not.toBeNull();
    expect(Number(m![2])).toBeGreaterThan(Number(m![1]) + 1);
  });

  it('path-patch the induction circuit: the previous-token heads L0H0 and L0H1 carry it', () => {
    const g = numbers(run('path-patching').trim());
    expect(g).toHaveLength(4);
    expect(Math.min(g[0], g[1])).toBeGreaterThan(Math.max(g[2], g[3]));
  });

  it('composition scores: the strongest K-composition starts at a previous-token head', () => {
    const out = run('composition');
    expect(out).toMatch(/^strongest: L0H[01] -> L1H\d$/m);
    const rows = out.trim().split('\n').slice(0, 4).map(numbers);
    const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
    expect(mean([...rows[0], ...rows[1]])).toBeGreaterThan(mean([...rows[2], ...rows[3]]));
  });
});
