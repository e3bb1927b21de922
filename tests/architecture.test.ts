/**
 * The import structure of src/, workers/ and bench/, with tests/ and e2e/ (a stand-in for
 * farm-studio's dependency view): no import circle between files, no arrow that runs back up the
 * layers (nothing in src/ or workers/ imports the bench or the tests), and no import through a
 * computed specifier that no reader (or bundler) can follow. Type-only imports count too: a
 * type arrow running up is the same confusion of layers.
 */
import { describe, it, expect } from 'vitest';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import * as path from 'node:path';

const ROOT = path.resolve(__dirname, '..');

/** who may import whom: a folder of src/ (or workers/) → the folders it may import from */
const ALLOWED: Record<string, string[]> = {
  engine: [],
  schema: ['engine'],
  node: ['engine'],
  share: ['engine'],
  // the page's service worker (its own script, dist/sw.js)
  sw: ['engine'],
  ops: ['engine', 'schema'],
  bridge: ['engine', 'schema', 'node', 'ops', 'share'],
  // `loupe serve`: the page's engine (workers/engine-api.ts) over the Node host
  serve: ['engine', 'schema', 'node', 'ops', 'share', 'bridge', 'workers'],
  cli: ['engine', 'schema', 'node', 'ops', 'share', 'bridge', 'serve'],
  workers: ['engine', 'schema', 'ops', 'share', 'bridge'],
  ui: ['engine', 'schema', 'ops', 'share', 'bridge', 'workers', 'sw'],
  // the package's library entry (docs/LIBRARY.md): Node's loading beside the platform-free model
  library: ['engine', 'schema', 'ops', 'node'],
  // the bench measures every layer (and runs the tests' Hub stand-in); nothing imports the bench
  bench: [
    'engine',
    'schema',
    'node',
    'ops',
    'share',
    'bridge',
    'cli',
    'workers',
    'ui',
    'sw',
    'serve',
    'library',
    '(tests)',
  ],
  '(tests)': [
    'engine',
    'schema',
    'node',
    'ops',
    'share',
    'bridge',
    'cli',
    'workers',
    'ui',
    'bench',
    'sw',
    'serve',
    'library',
  ],
};

function filesUnder(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const p = path.join(dir, name);
    if (statSync(p).isDirectory()) return filesUnder(p);
    return /\.(ts|svelte)$/.test(name) && !name.endsWith('.d.ts') ? [p] : [];
  });
}

const FILES = ['src', 'workers', 'bench', 'tests', 'e2e'].flatMap((d) => filesUnder(path.join(ROOT, d)));

/** the folder a file belongs to: src/<folder>/…, workers, bench or (tests) */
function layerOf(file: string): string {
  const rel = path.relative(ROOT, file).split(path.sep);
  if (rel[0] === 'workers' || rel[0] === 'bench') return rel[0];
  if (rel[0] === 'tests' || rel[0] === 'e2e') return '(tests)';
  return rel.length > 2 ? rel[1] : '(src)';
}

/** a relative specifier → the file it names (.ts, .svelte, /index.ts) */
function resolve(from: string, spec: string): string | undefined {
  const base = path.resolve(path.dirname(from), spec);
  for (const c of [base, `${base}.ts`, path.join(base, 'index.ts')]) {
    try {
      if (statSync(c).isFile()) return c;
    } catch {
      /* next */
    }
  }
  return undefined;
}

interface Imports {
  targets: string[];
  computed: string[];
}

/**
 * the files `import.meta.glob` patterns name: a `*` in the file name only, as the page uses it,
 * and `!pattern` taking files out
 */
function globbed(from: string, patterns: string[]): string[] {
  const match = (pattern: string) => {
    const dir = path.resolve(path.dirname(from), path.dirname(pattern));
    const re = new RegExp(
      `^${path
        .basename(pattern)
        .split('*')
        .map((p) => p.replace(/[.+?^${}()|[\]\\]/g, '\\$&'))
        .join('[^/]*')}$`,
    );
    return readdirSync(dir)
      .filter((n) => re.test(n))
      .map((n) => path.join(dir, n));
  };
  const out = new Set(patterns.filter((p) => !p.startsWith('!')).flatMap(match));
  for (const p of patterns.filter((p) => p.startsWith('!'))) for (const f of match(p.slice(1))) out.delete(f);
  return [...out];
}

/** a file's text without its comments, so that an example in a comment is not code */
function codeOf(file: string): string {
  return readFileSync(file, 'utf8')
    .replace(/\/\*[\s\S]*?\*\//g, '')
    .replace(/(^|[^:'"`])\/\/.*$/gm, '$1');
}

function importsOf(file: string): Imports {
  const text = codeOf(file);
  const targets: string[] = [];
  const computed: string[] = [];
  for (const m of text.matchAll(/\b(?:import|export)\s+(?:type\s+)?(?:[\w*{}\s,$]+?\s+from\s+)?['"]([^'"]+)['"]/g))
    targets.push(m[1]);
  for (const m of text.matchAll(/\bimport\(\s*([^)]*?)\s*\)/g)) {
    const lit = /^['"]([^'"]+)['"]$/.exec(m[1]);
    if (lit) targets.push(lit[1]);
    else computed.push(m[1]);
  }
  // a bundler-followed pattern: every file it matches is an import (lazy ones count: a circle
  // through a lazy import is still a circle). Read from the raw text, on lines that are not a
  // comment's: a pattern like './*View.svelte' would open a comment for the stripper above.
  const globs = [
    ...readFileSync(file, 'utf8').matchAll(/^[^*/\n]*\bimport\.meta\.glob\b[^(\n]*\(([^)\n]*)\)/gm),
  ].flatMap((m) =>
    globbed(
      file,
      [...m[1].matchAll(/['"]([^'"]+)['"]/g)].map((s) => s[1]),
    ),
  );
  const local = (xs: string[]) =>
    xs
      .filter((t) => t.startsWith('.'))
      .map((t) => resolve(file, t))
      .filter((t): t is string => !!t && t.startsWith(ROOT));
  return { targets: [...local(targets), ...globs], computed };
}

const rel = (f: string) => path.relative(ROOT, f);

const GRAPH = new Map(FILES.map((f) => [f, importsOf(f)]));

describe('import structure', () => {
  it('parses a real graph (the parser is not silently empty)', () => {
    const edges = [...GRAPH.values()].reduce((n, i) => n + i.targets.length, 0);
    expect(FILES.length).toBeGreaterThan(100);
    expect(edges).toBeGreaterThan(300);
    expect(GRAPH.get(path.join(ROOT, 'src/ops/index.ts'))!.targets.map(rel)).toContain('src/ops/trace.ts');
    // the bench is read too: its extension list imports the gradient extension
    expect(GRAPH.get(path.join(ROOT, 'bench/extensions.ts'))!.targets.map(rel)).toContain('bench/gradients.ts');
    // the page's views are reached through import.meta.glob
    expect(GRAPH.get(path.join(ROOT, 'src/ui/views/registry.ts'))!.targets.map(rel)).toContain(
      'src/ui/views/TraceView.svelte',
    );
  });

  it('no arrow runs back up the layers (engine imports no surface, ops no bridge/cli/ui, …)', () => {
    const bad: string[] = [];
    for (const [file, { targets }] of GRAPH) {
      const from = layerOf(file);
      for (const t of targets) {
        const to = layerOf(t);
        if (to === from || to === '(src)') continue;
        if (!(ALLOWED[from] ?? []).includes(to)) bad.push(`${rel(file)} → ${rel(t)}`);
      }
    }
    expect(bad).toEqual([]);
  });

  it('no import circle between files', () => {
    // Tarjan's strongly connected components; any component of two or more files is a circle
    let index = 0;
    const idx = new Map<string, number>();
    const low = new Map<string, number>();
    const stack: string[] = [];
    const on = new Set<string>();
    const circles: string[][] = [];
    const visit = (v: string) => {
      idx.set(v, index);
      low.set(v, index);
      index++;
      stack.push(v);
      on.add(v);
      for (const w of GRAPH.get(v)?.targets ?? []) {
        if (!idx.has(w)) {
          visit(w);
          low.set(v, Math.min(low.get(v)!, low.get(w)!));
        } else if (on.has(w)) low.set(v, Math.min(low.get(v)!, idx.get(w)!));
      }
      if (low.get(v) === idx.get(v)) {
        const comp: string[] = [];
        let w: string;
        do {
          w = stack.pop()!;
          on.delete(w);
          comp.push(rel(w));
        } while (w !== v);
        if (comp.length > 1 || (GRAPH.get(v)?.targets ?? []).includes(v)) circles.push(comp.sort());
      }
    };
    for (const f of FILES) if (!idx.has(f)) visit(f);
    expect(circles).toEqual([]);
  });

  it('no operation imports another operation, and ops/lib imports none (shared machinery lives in ops/lib)', () => {
    const OPS = path.join(ROOT, 'src', 'ops');
    const isOperation = (f: string) =>
      path.dirname(f) === OPS && !['index.ts', 'types.ts', 'schemas.ts'].includes(path.basename(f));
    const LIB = path.join(OPS, 'lib') + path.sep;
    const bad: string[] = [];
    for (const [file, { targets }] of GRAPH) {
      if (!isOperation(file) && !file.startsWith(LIB)) continue;
      for (const t of targets) if (isOperation(t) && t !== file) bad.push(`${rel(file)} → ${rel(t)}`);
    }
    expect(bad).toEqual([]);
  });

  it('nothing above the engine reads model.spec (operations and surfaces code against ModelInfo)', () => {
    const bad = FILES.filter(
      (f) => !['engine', 'bench', '(tests)'].includes(layerOf(f)) && /\bmodel\??\.spec\b/.test(codeOf(f)),
    ).map(rel);
    expect(bad).toEqual([]);
  });

  it('no import through a computed specifier', () => {
    // the tests may compute a specifier (a fixture by name); what ships and the bench may not
    const bad = [...GRAPH]
      .filter(([f]) => layerOf(f) !== '(tests)')
      .flatMap(([f, { computed }]) => computed.map((c) => `${rel(f)}: import(${c})`));
    expect(bad).toEqual([]);
  });
});

describe("the page's state by concern", () => {
  it('each store in src/ui/state is at most 250 lines (a bigger one holds more than one concern)', () => {
    const dir = path.join(ROOT, 'src', 'ui', 'state');
    const stores = readdirSync(dir).filter((f) => f.endsWith('.svelte.ts'));
    expect(stores).toContain('app.svelte.ts');
    const big = stores
      .map((f) => [f, readFileSync(path.join(dir, f), 'utf8').split('\n').length - 1] as const)
      .filter(([, n]) => n > 250)
      .map(([f, n]) => `${f}: ${n} lines`);
    expect(big).toEqual([]);
  });
});
