/**
 * docs/BENCHMARKS.md, written from bench/results/*.json (the engine bench's latest.json and every
 * other script's tables, bench/results.ts), and the README's one current table from latest.json.
 * `npx tsx bench/benchmarks-doc.ts` rewrites both; the bench scripts run it after each run.
 */
import { existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import * as path from 'node:path';
import { ROOT } from './lib';
import { render, type BenchResults } from './report';
import { mdTable, RESULTS_DIR, type MachineInfo, type TablesResults } from './results';

const DOC = path.join(ROOT, 'docs', 'BENCHMARKS.md');
const README = path.join(ROOT, 'README.md');
/** the runs recorded by hand in the README before the bench wrote docs/BENCHMARKS.md, kept as they were */
const EARLIER = path.join(RESULTS_DIR, 'earlier-runs.md');
const CURRENT_START = '<!-- bench:current (written by bench/benchmarks-doc.ts from bench/results/*.json) -->';
const CURRENT_END = '<!-- /bench:current -->';

type AnyResults = (BenchResults & { file: string }) | (TablesResults & { file: string });

function readResults(): AnyResults[] {
  if (!existsSync(RESULTS_DIR)) return [];
  return readdirSync(RESULTS_DIR)
    .filter((f) => f.endsWith('.json'))
    .map((f) => ({ ...JSON.parse(readFileSync(path.join(RESULTS_DIR, f), 'utf8')), file: f }) as AnyResults)
    .filter((r) => r.schema === 'loupe-bench/1' || r.schema === 'loupe-bench-tables/1')
    .sort((a, b) => b.date.localeCompare(a.date));
}

const gib = (b: number) => `${(b / 2 ** 30).toFixed(1)} GiB`;
const loads = (xs: number[]) => xs.map((x) => x.toFixed(1)).join(' / ');
const when = (iso: string) => `${iso.slice(0, 10)} ${iso.slice(11, 16)} UTC`;

function where(m: MachineInfo): string {
  return (
    `${m.cores} cores (${m.cpu}), ${gib(m.total_memory_bytes)} RAM, ${m.platform}, Node ${m.node}, ` +
    `onnxruntime-node ${m.onnxruntime_node}, onnxruntime-web ${m.onnxruntime_web}`
  );
}

function section(r: AnyResults): string {
  if (r.schema === 'loupe-bench/1') {
    const body = render(r)
      .replace(/^(#{2,5}) /gm, (_, h: string) => `${h}# `)
      .replace(/^### Loupe engine bench/m, '### Engine bench (`npm run bench`)');
    return (
      body.replace(
        /\n/,
        `\n\nMeasured ${when(r.date)} (${r.total_s} s), bench/results/${r.file}. Load average (1 / 5 / 15 min) ` +
          `${loads(r.machine.load_average_start)} at the start, ${loads(r.machine.load_average_end)} at the end.\n`,
      ) + '\n'
    );
  }
  return [
    `### ${r.title}\n`,
    `Measured ${when(r.date)} – ${when(r.finished)} with \`${r.command}\` (bench/results/${r.file}) on ${where(r.machine)}. ` +
      `Load average (1 / 5 / 15 min) ${loads(r.load_average_start)} at the start, ${loads(r.load_average_end)} at the end.\n`,
    ...r.tables.map(mdTable),
    ...r.notes.map((n) => `${n}\n`),
    '',
  ].join('\n');
}

/**
 * the README's one current table: each engine-bench target ratio from the newest run that measured it
 * (latest.json is the full run; a partial run, `--only=…` with `--out=`, updates only what it measured)
 */
function currentTable(runs: (BenchResults & { file: string })[]): string {
  const withSummary = runs.filter((r) => r.summary && !r.quick);
  if (!withSummary.length) return 'No engine bench result yet: run `npm run bench`.\n';
  const names: Record<string, string> = {
    all_hooks_over_plain: 'forward with every hook fetched / plain forward',
    peak_rss_over_weights: 'peak RSS after load and one all-hooks run / weight bytes',
    node_all_hooks_over_torch: 'Loupe (onnxruntime-node), all hooks / PyTorch, all hooks',
    page_over_torch: 'the page (WASM, every thread), all hooks / PyTorch',
    circuit_per_ablation_over_forward: '`circuit`: one single ablation / one forward',
  };
  const rows: string[][] = [];
  const seen = new Set<string>();
  const used = new Map<string, BenchResults & { file: string }>();
  for (const r of withSummary) {
    for (const [k, v] of Object.entries(r.summary!) as [string, { value?: number; target?: number; met?: boolean }][]) {
      if (seen.has(k) || typeof v?.value !== 'number' || v.target === undefined) continue;
      seen.add(k);
      used.set(r.file, r);
      const [base, ...rest] = k.split('.');
      rows.push([
        `${names[base] ?? base}${rest.length ? ` (${rest.join(', ')})` : ''}`,
        v.value.toFixed(2),
        `≤ ${v.target}`,
        v.met ? 'met' : 'missed',
        `${when(r.date).slice(0, 10)}, load ${r.machine.load_average_start[0].toFixed(1)}`,
      ]);
    }
  }
  const m = withSummary[0].machine;
  const torch = [...used.values()].map((r) => r.torch).find((t) => t && 'runs' in t);
  const anchor =
    torch && 'runs' in torch
      ? ` PyTorch: torch ${torch.torch} on OpenBLAS${torch.openblas?.corename ? ` (${torch.openblas.corename} kernel)` : ''}` +
        `, every hook kept, the best of torch × OpenBLAS threads ${Object.keys(torch.runs)
          .map((k) => k.replace('x', '×'))
          .join(', ')}` +
        (torch.env_unset?.length ? `, ${torch.env_unset.join(' and ')} unset` : '') +
        '.'
      : '';
  return (
    `GPT-2-small shape (124M parameters, random F32 weights), batch 1, on ${m.cores} cores (${m.cpu}); ` +
    `each ratio from its run's side-by-side measurements (a load above ${m.cores} means other processes competed for the cores).` +
    `${anchor} Every run, with its method: [docs/BENCHMARKS.md](docs/BENCHMARKS.md).\n\n` +
    mdTable({ head: ['ratio', 'measured', 'target', '', 'run (UTC), load'], rows })
  );
}

/** Write docs/BENCHMARKS.md from bench/results/*.json, and the README's current table from latest.json. */
export function writeBenchmarksDoc(): void {
  const results = readResults();
  const out = [
    '# Benchmarks',
    '',
    'Written by the bench scripts from their results (bench/results/*.json; `npx tsx bench/benchmarks-doc.ts`',
    'rewrites it from those files): do not edit it by hand, run the bench. Each section says when, where and at',
    'what load it was measured. The machine these ran on is shared: a load average above its core count means other',
    'processes competed for the cores, so compare ratios measured side by side in one run, not times across runs.',
    'How each bench measures: bench/README.md.',
    '',
    ...results.map(
      (r) =>
        `- ${when(r.date)}, load ${(r.schema === 'loupe-bench/1' ? r.machine.load_average_start : r.load_average_start)[0].toFixed(1)}: ` +
        `${r.schema === 'loupe-bench/1' ? 'engine bench (`npm run bench`)' : r.title} (bench/results/${r.file})`,
    ),
    ...(existsSync(EARLIER) ? ['- 2026-11-29 – 2026-12-01: earlier runs, recorded by hand (the last section)'] : []),
    '',
    '## Latest runs',
    '',
    ...results.map(section),
  ];
  if (existsSync(EARLIER)) {
    out.push(
      '## Earlier runs (recorded by hand)',
      '',
      'What the README recorded before the bench wrote this file (bench/results/earlier-runs.md, kept as it was): each',
      'block says when and at what load it was measured, and what changed in the code around it. Later runs of the',
      'same bench above supersede them.',
      '',
      readFileSync(EARLIER, 'utf8').replace(/^(#{1,5}) /gm, (_, h: string) => `${h}## `),
    );
  }
  writeFileSync(
    DOC,
    out
      .join('\n')
      .replace(/\n{3,}/g, '\n\n')
      .trimEnd() + '\n',
  );
  if (existsSync(README)) {
    const readme = readFileSync(README, 'utf8');
    const a = readme.indexOf(CURRENT_START);
    const b = readme.indexOf(CURRENT_END);
    if (a >= 0 && b > a) {
      const engine = results.filter((r): r is BenchResults & { file: string } => r.schema === 'loupe-bench/1');
      writeFileSync(README, readme.slice(0, a + CURRENT_START.length) + '\n' + currentTable(engine) + readme.slice(b));
    }
  }
}

if (process.argv[1] && import.meta.filename === path.resolve(process.argv[1])) writeBenchmarksDoc();
