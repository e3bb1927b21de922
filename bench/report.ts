/** The bench's results document and its markdown rendering. */
import type { MemoryResult, SpeedResult } from './child';
import type { ExtResult } from './extension';
import type { BenchShape } from './model-gen';
import type { PageWasmResult } from './page-wasm';

export const TARGETS = {
  /** all-hooks run / plain forward */
  hooksOverPlain: 1.15,
  /** peak RSS / weight bytes */
  peakOverWeights: 1.6,
  /** Loupe onnxruntime-node, all hooks / PyTorch CPU, all hooks (best thread configuration of each) */
  nodeOverTorch: 1.0,
  /** Loupe in the page (WASM, every thread), all hooks / PyTorch CPU, all hooks */
  pageOverTorch: 1.5,
};

export interface TorchRun {
  median_ms: number;
  min_ms: number;
  samples_ms: number[];
}
export type TorchAnchor =
  | {
      python: string;
      torch: string;
      blas: string;
      /** the OpenBLAS the anchor loaded: the kernel it chose (corename) and its build line */
      openblas?: { library: string | null; corename: string | null; config: string | null };
      n_hooks: number;
      /** environment variables removed from the anchor's processes */
      env_unset?: string[];
      /** per configuration key ("<torch threads>x<OpenBLAS threads>"): the thread counts each child reported */
      configs?: Record<string, { torch_threads: number; openblas_threads: number | null; corename?: string | null }>;
      runs: Record<string, Record<string, TorchRun>>;
    }
  | { skipped: string }
  | Failed;

type Failed = { error: string };

export interface BenchResults {
  schema: 'loupe-bench/1';
  date: string;
  quick: boolean;
  machine: {
    cores: number;
    cpu: string;
    total_memory_bytes: number;
    platform: string;
    node: string;
    onnxruntime_node: string;
    onnxruntime_web: string;
    load_average_start: number[];
    load_average_end: number[];
  };
  model: { dir: string; shape: BenchShape; n_params: number; weight_bytes: number; dtype: string };
  method: {
    warmup_runs: number;
    timed_runs: Record<string, number>;
    statistic: string;
    node_threads: number;
    wasm_threads: number;
  };
  speed: Partial<Record<'node' | 'wasm', SpeedResult | Failed>>;
  memory: (MemoryResult | (Failed & { backend: string; graph: string; T: number }))[];
  extensions: Record<string, { title: string } & (ExtResult | { skipped: string } | Failed)>;
  /** bench/torch_anchor.py's numbers */
  torch?: TorchAnchor;
  /** bench/page-wasm.ts: onnxruntime-web WASM in Chromium, all hooks, per thread count */
  page?: PageWasmResult | Failed;
  /** page (every thread) / PyTorch (best thread count) per T, per round of alternating runs, and the median over rounds */
  page_vs_torch?: {
    rounds: Record<string, { page_ms: number; torch_ms: number; ratio: number }>[];
    median: Record<string, number>;
  };
  total_s: number;
  /** the target ratios in one place (filled by summarize()) */
  summary?: Record<string, unknown>;
}

/** target ratios and whether each is met, for the JSON */
export function summarizeTargets(r: BenchResults): Record<string, unknown> {
  const sum: Record<string, unknown> = {};
  for (const b of ['node', 'wasm'] as const) {
    const s = r.speed[b];
    if (!s || isErr(s)) continue;
    for (const [T, x] of Object.entries(s.runs)) {
      const q = x.hooked_all.median_ms / x.plain.median_ms;
      sum[`all_hooks_over_plain.${b}.T${T}`] = {
        value: q,
        cpu: x.hooked_all.cpu_median_ms / x.plain.cpu_median_ms,
        fastest: x.hooked_all.min_ms / x.plain.min_ms,
        target: TARGETS.hooksOverPlain,
        met: q <= TARGETS.hooksOverPlain,
      };
    }
  }
  for (const m of r.memory) {
    if (isErr(m) || m.graph !== 'hooked') continue;
    const q = m.peak_rss / r.model.weight_bytes;
    sum[`peak_rss_over_weights.${m.backend}`] = {
      value: q,
      target: TARGETS.peakOverWeights,
      met: q <= TARGETS.peakOverWeights,
    };
  }
  for (const [T, q] of Object.entries(torchRatios(r))) {
    if (q.node !== undefined)
      sum[`node_all_hooks_over_torch.T${T}`] = {
        value: q.node,
        target: TARGETS.nodeOverTorch,
        met: q.node <= TARGETS.nodeOverTorch,
      };
    if (q.wasm !== undefined) sum[`wasm_all_hooks_over_torch.T${T}`] = { value: q.wasm };
  }
  for (const [T, q] of Object.entries(r.page_vs_torch?.median ?? {}))
    sum[`page_over_torch.T${T}`] = { value: q, target: TARGETS.pageOverTorch, met: q <= TARGETS.pageOverTorch };
  const c = r.extensions.circuit;
  if (c && 'json' in c)
    sum['circuit_per_ablation_over_forward'] = {
      value: c.json.per_ablation_over_forward,
      target: c.json.target,
      met: c.json.meets_target,
    };
  return sum;
}

const isErr = (x: unknown): x is Failed => !!x && typeof x === 'object' && 'error' in x;
const ms = (x: number) => (x >= 100 ? x.toFixed(0) : x.toFixed(1));
const ratio = (x: number) => x.toFixed(2);
const mib = (b: number) => `${(b / 2 ** 20).toFixed(0)} MiB`;
const mark = (ok: boolean) => (ok ? '✅' : '❌ missed');

/** "1x2" → "torch 1 × OpenBLAS 2 threads"; an older anchor's plain thread count as it was */
const threadsLabel = (key: string) => {
  const m = /^(\d+)x(\d+)$/.exec(key);
  return m ? `torch ${m[1]} × OpenBLAS ${m[2]} thr` : `${key} thr`;
};

/** per T: PyTorch's best thread count, and Loupe's all-hooks run (node, wasm) over it */
function torchRatios(
  r: BenchResults,
): Record<string, { torchMs: number; torchThreads: string; node?: number; nodePlain?: number; wasm?: number }> {
  const out: Record<
    string,
    { torchMs: number; torchThreads: string; node?: number; nodePlain?: number; wasm?: number }
  > = {};
  const t = r.torch;
  if (!t || !('runs' in t)) return out;
  for (const [threads, byT] of Object.entries(t.runs)) {
    for (const [T, x] of Object.entries(byT))
      if (!out[T] || x.median_ms < out[T].torchMs) out[T] = { torchMs: x.median_ms, torchThreads: threads };
  }
  for (const [T, o] of Object.entries(out)) {
    for (const b of ['node', 'wasm'] as const) {
      const s = r.speed[b];
      if (s && !isErr(s) && s.runs[T]) o[b] = s.runs[T].hooked_all.median_ms / o.torchMs;
    }
    const n = r.speed.node;
    if (n && !isErr(n) && n.runs[T]) o.nodePlain = n.runs[T].plain.median_ms / o.torchMs;
  }
  return out;
}

function table(head: string[], rows: string[][]): string {
  const line = (cells: string[]) => `| ${cells.join(' | ')} |`;
  return [line(head), line(head.map(() => '---')), ...rows.map(line)].join('\n') + '\n';
}

export function render(r: BenchResults): string {
  const out: string[] = [];
  const m = r.machine;
  out.push(`## Loupe engine bench${r.quick ? ' (--quick run: too few repetitions to judge the targets)' : ''}\n`);
  out.push(
    `GPT-2-small-shaped model, random F32 weights: ${r.model.shape.nLayers} layers, d_model ${r.model.shape.dModel}, ${r.model.shape.nHeads} heads, ` +
      `d_mlp ${r.model.shape.dMlp}, vocab ${r.model.shape.vocab}, n_positions ${r.model.shape.nPositions} — ${(r.model.n_params / 1e6).toFixed(1)}M parameters, ` +
      `${mib(r.model.weight_bytes)} (${r.model.weight_bytes} bytes) of weights.\n`,
  );
  out.push(
    `Machine: ${m.cores} cores (${m.cpu}), ${mib(m.total_memory_bytes)} RAM, ${m.platform}; Node ${m.node}; onnxruntime-node ${m.onnxruntime_node}, onnxruntime-web ${m.onnxruntime_web}. ` +
      `Load average at start ${m.load_average_start.map((x) => x.toFixed(2)).join(' / ')}, at end ${m.load_average_end.map((x) => x.toFixed(2)).join(' / ')} (1/5/15 min; > ${m.cores} means other processes competed for the cores).\n`,
  );

  // ---- speed
  const node = r.speed.node;
  const wasm = r.speed.wasm;
  if (node || wasm) {
    const nodeOk = node && !isErr(node) ? node : undefined;
    const wasmOk = wasm && !isErr(wasm) ? wasm : undefined;
    const nHooks = (nodeOk ?? wasmOk)?.n_hook_outputs ?? 0;
    const nIn = (nodeOk ?? wasmOk)?.n_intervention_inputs ?? 0;
    const runsText = Object.entries(r.method.timed_runs)
      .map(([T, n]) => `${n} at T=${T}`)
      .join(', ');
    out.push(
      `### Forward, batch 1 (median wall-clock ms of the timed runs — ${runsText} — after ${r.method.warmup_runs} warm-up runs)\n`,
    );
    out.push(
      `plain = the \`hooks: false\` graph (logits only); hooked = the engine's graph (${nHooks} hook outputs incl. logits, ${nIn} intervention inputs fed identity scalars) run through \`model.run\`, ` +
        `fetching no hooks (\`hooks: []\`) or every hook (\`hooks: 'all'\`). The three are interleaved run by run (order rotated each round); ` +
        `for onnxruntime-node each timed run comes right after an untimed run of the same configuration, because ORT-node gives each session its own thread pool ` +
        `and switching sessions on shared cores otherwise penalises whichever runs second. ` +
        `Secondary rows: the same ratio from the fastest run of each (contention only ever adds time) and from the median process CPU time.\n`,
    );
    const nodeHead = `onnxruntime-node (${r.method.node_threads} threads)`;
    const wasmHead = `onnxruntime-web WASM in Node (${r.method.wasm_threads} thread)`;
    const rows: string[][] = [];
    const Ts = Object.keys((nodeOk ?? wasmOk)?.runs ?? {});
    for (const T of Ts) {
      const n = nodeOk?.runs[T];
      const w = wasmOk?.runs[T];
      const cell = (x: { median_ms: number } | undefined) => (x ? ms(x.median_ms) : '—');
      const both = (a?: { median_ms: number }, b?: { median_ms: number }) =>
        a && b ? ratio(b.median_ms / a.median_ms) : '—';
      rows.push([`T=${T}`, 'plain forward (fused kernels)', cell(n?.plain), cell(w?.plain), both(n?.plain, w?.plain)]);
      rows.push([
        `T=${T}`,
        'plain forward, + SkipLayerNormalization and MultiHeadAttention (off by default)',
        cell(n?.plain_all),
        cell(w?.plain_all),
        both(n?.plain_all, w?.plain_all),
      ]);
      rows.push([
        `T=${T}`,
        'plain forward, decomposed (fused: false)',
        cell(n?.plain_unfused),
        cell(w?.plain_unfused),
        both(n?.plain_unfused, w?.plain_unfused),
      ]);
      rows.push([
        `T=${T}`,
        'hooked, no hooks fetched',
        cell(n?.hooked_none),
        cell(w?.hooked_none),
        both(n?.hooked_none, w?.hooked_none),
      ]);
      rows.push([
        `T=${T}`,
        `hooked, all ${nHooks} hooks fetched`,
        cell(n?.hooked_all),
        cell(w?.hooked_all),
        both(n?.hooked_all, w?.hooked_all),
      ]);
      rows.push([
        `T=${T}`,
        'observe-only variant (no intervention inputs), all hooks fetched',
        cell(n?.hooked_observe),
        cell(w?.hooked_observe),
        both(n?.hooked_observe, w?.hooked_observe),
      ]);
      const over = (x: typeof n, k: 'plain_all' | 'plain_unfused' | 'hooked_observe', base: 'plain' | 'hooked_all') =>
        x?.[k] ? ratio(x[k]!.median_ms / x[base].median_ms) : '—';
      rows.push([
        `T=${T}`,
        'ratio plain + SkipLayerNormalization, MultiHeadAttention / plain fused',
        over(n, 'plain_all', 'plain'),
        over(w, 'plain_all', 'plain'),
        '',
      ]);
      rows.push([
        `T=${T}`,
        'ratio plain decomposed / plain fused',
        over(n, 'plain_unfused', 'plain'),
        over(w, 'plain_unfused', 'plain'),
        '',
      ]);
      rows.push([
        `T=${T}`,
        'ratio observe-only / hooked, all hooks',
        over(n, 'hooked_observe', 'hooked_all'),
        over(w, 'hooked_observe', 'hooked_all'),
        '',
      ]);
      const rr = (
        x?: { plain: { median_ms: number }; hooked_none: { median_ms: number }; hooked_all: { median_ms: number } },
        k: 'hooked_none' | 'hooked_all' = 'hooked_all',
      ) => {
        if (!x) return '—';
        const q = x[k].median_ms / x.plain.median_ms;
        return k === 'hooked_all' ? `**${ratio(q)}** ${mark(q <= TARGETS.hooksOverPlain)}` : ratio(q);
      };
      rows.push([`T=${T}`, 'ratio no hooks / plain', rr(n, 'hooked_none'), rr(w, 'hooked_none'), '']);
      rows.push([`T=${T}`, `**ratio all hooks / plain** (target ≤ ${TARGETS.hooksOverPlain})`, rr(n), rr(w), '']);
      type Pair = {
        plain: { cpu_median_ms: number; min_ms: number };
        hooked_all: { cpu_median_ms: number; min_ms: number };
      };
      const best = (x?: Pair) => (x ? ratio(x.hooked_all.min_ms / x.plain.min_ms) : '—');
      const cpu = (x?: Pair) => (x ? ratio(x.hooked_all.cpu_median_ms / x.plain.cpu_median_ms) : '—');
      rows.push([`T=${T}`, 'ratio all hooks / plain, fastest runs (secondary)', best(n), best(w), '']);
      rows.push([`T=${T}`, 'ratio all hooks / plain, process CPU time (secondary)', cpu(n), cpu(w), '']);
    }
    out.push(table(['T', 'configuration', nodeHead, wasmHead, 'wasm / node'], rows));
    for (const [name, s] of [
      ['node', node],
      ['wasm', wasm],
    ] as const)
      if (s && isErr(s)) out.push(`\n${name}: FAILED — ${s.error.split('\n')[0]}\n`);
    const diffs = [nodeOk, wasmOk].filter(Boolean).map(
      (s) =>
        `${s!.backend}: ${Object.entries(s!.logits_max_abs_diff)
          .map(([T, d]) => `T=${T} ${d.toExponential(1)}`)
          .join(', ')}`,
    );
    if (diffs.length) out.push(`Check: max |Δ logits| plain vs hooked graph — ${diffs.join('; ')}.\n`);

    out.push(`### Session creation (ms)\n`);
    const srows: string[][] = [];
    for (const s of [nodeOk, wasmOk]) {
      if (!s) continue;
      const head = s.backend === 'node' ? nodeHead : wasmHead;
      srows.push([
        head,
        ms(s.session.runtime_init_ms),
        `${ms(s.session.plain_ms)} (graph build ${ms(s.session.plain_graph_build_ms)}, ${s.session.plain_graph_kb.toFixed(0)} KB)`,
        `${ms(s.session.hooked_load_ms)} (graph build ${ms(s.session.hooked_graph_build_ms)}, ${s.session.hooked_graph_kb.toFixed(0)} KB)`,
      ]);
    }
    out.push(
      table(
        [
          'backend',
          'runtime init (bundled tiny model, first)',
          'plain graph: build + create session',
          'hooked: `loadModelNode` (headers, tokenizer, graph build, session)',
        ],
        srows,
      ),
    );
  }

  // ---- PyTorch anchor
  if (r.torch) {
    out.push(
      `### PyTorch anchor (bench/torch_anchor.py: same shape, every hook kept as run_with_cache does, batch 1)\n`,
    );
    const t = r.torch;
    if ('skipped' in t) out.push(`Skipped: ${t.skipped}\n`);
    else if (isErr(t)) out.push(`FAILED: ${t.error.split('\n')[0]}\n`);
    else {
      out.push(
        `torch ${t.torch} (${t.python}), ${t.n_hooks} hooks kept; BLAS: ${t.blas}` +
          (t.openblas?.corename ? `; OpenBLAS kernel ${t.openblas.corename} (${t.openblas.config})` : '') +
          (t.env_unset?.length ? `; ${t.env_unset.join(', ')} unset in its processes` : '') +
          `. Each thread configuration (torch intra-op × OpenBLAS) in its own process. Loupe columns: the all-hooks and plain runs of the forward table above (same bench run).\n`,
      );
      const q = torchRatios(r);
      const rows: string[][] = [];
      for (const [T, o] of Object.entries(q)) {
        const per = Object.entries(t.runs)
          .map(([th, byT]) => `${threadsLabel(th)}: ${byT[T] ? ms(byT[T].median_ms) : '—'}`)
          .join(', ');
        rows.push([
          `T=${T}`,
          `${per} → best ${ms(o.torchMs)} (${threadsLabel(o.torchThreads)})`,
          o.node !== undefined ? `**${ratio(o.node)}** ${mark(o.node <= TARGETS.nodeOverTorch)}` : '—',
          o.nodePlain !== undefined ? ratio(o.nodePlain) : '—',
          o.wasm !== undefined ? ratio(o.wasm) : '—',
        ]);
      }
      out.push(
        table(
          [
            'T',
            'PyTorch CPU, all hooks (median ms)',
            `Loupe node all hooks / PyTorch (target ≤ ${TARGETS.nodeOverTorch})`,
            'Loupe node plain / PyTorch',
            `Loupe WASM-in-Node (${r.method.wasm_threads} thread) all hooks / PyTorch`,
          ],
          rows,
        ),
      );
    }
  }

  // ---- page
  if (r.page) {
    out.push(
      `### Page: onnxruntime-web WASM in Chromium (bench/page-wasm.ts: hooked graph, every hook fetched, batch 1)\n`,
    );
    const p = r.page;
    if (isErr(p)) out.push(`FAILED: ${p.error.split('\n')[0]}\n`);
    else {
      out.push(
        `navigator.hardwareConcurrency ${p.hardware_concurrency}, cross-origin isolated: ${p.cross_origin_isolated}. The page's worker uses every core under isolation (workers/engine-adapter.ts).\n`,
      );
      const tq = torchRatios(r);
      const all = String(p.hardware_concurrency);
      const rows: string[][] = [];
      for (const T of Object.keys(p.runs['1'] ?? {})) {
        const one = p.runs['1']?.[T]?.median_ms,
          many = p.runs[all]?.[T]?.median_ms;
        const torchMs = tq[T]?.torchMs;
        rows.push([
          `T=${T}`,
          one !== undefined ? ms(one) : '—',
          many !== undefined ? ms(many) : '—',
          one && many ? ratio(one / many) : '—',
          many && torchMs ? `**${ratio(many / torchMs)}** ${mark(many / torchMs <= TARGETS.pageOverTorch)}` : '—',
        ]);
      }
      out.push(
        table(
          [
            'T',
            '1 thread (ms)',
            `${all} threads (ms)`,
            'speed-up',
            `all threads / PyTorch best (target ≤ ${TARGETS.pageOverTorch})`,
          ],
          rows,
        ),
      );
    }
  }
  if (r.page_vs_torch) {
    const v = r.page_vs_torch;
    out.push(
      `### Page WASM (every thread) / PyTorch (best thread count), side by side: ${v.rounds.length} rounds, each PyTorch then the page\n`,
    );
    const rows = Object.entries(v.median).map(([T, q]) => [
      `T=${T}`,
      v.rounds
        .map((x) => (x[T] ? `${ms(x[T].page_ms)} / ${ms(x[T].torch_ms)} = ${ratio(x[T].ratio)}` : '—'))
        .join('; '),
      `**${ratio(q)}** ${mark(q <= TARGETS.pageOverTorch)}`,
    ]);
    out.push(table(['T', 'rounds: page ms / PyTorch ms = ratio', `median (target ≤ ${TARGETS.pageOverTorch})`], rows));
  }

  // ---- memory
  if (r.memory.length) {
    const W = r.model.weight_bytes;
    out.push(`### Peak memory (fresh process per row: load, then one run at T=128)\n`);
    out.push(
      `Weight bytes: ${W} (${mib(W)}). Peak = the process's peak resident set (max of \`resourceUsage().maxRSS\` and VmHWM), including Node itself (the baseline column).\n`,
    );
    const rows: string[][] = [];
    for (const x of r.memory) {
      const head = `${x.backend === 'node' ? 'onnxruntime-node' : 'onnxruntime-web WASM'}, ${x.graph === 'hooked' ? 'hooked graph, all hooks fetched' : 'plain graph (diagnostic)'}`;
      if (isErr(x)) {
        rows.push([head, 'FAILED', x.error.split('\n')[0], '', '', '']);
        continue;
      }
      const q = x.peak_rss / W;
      rows.push([
        head,
        mib(x.baseline.vm_rss ?? x.baseline.max_rss),
        `${mib(x.after_load.vm_rss ?? 0)} (anon ${mib(x.after_load.rss_anon ?? 0)}, file ${mib(x.after_load.rss_file ?? 0)})`,
        mib(x.output_bytes),
        mib(x.peak_rss),
        x.graph === 'hooked' ? `**${ratio(q)}** ${mark(q <= TARGETS.peakOverWeights)}` : ratio(q),
      ]);
    }
    out.push(
      table(
        [
          'configuration',
          'baseline RSS',
          'RSS after load',
          'outputs returned',
          'peak RSS',
          `peak / weight bytes (target ≤ ${TARGETS.peakOverWeights})`,
        ],
        rows,
      ),
    );
  }

  // ---- extensions
  const exts = Object.entries(r.extensions);
  if (exts.length) {
    out.push(`### Operations (onnxruntime-node, ${r.method.node_threads} threads; bench/extensions.ts)\n`);
    const rows: string[][] = [];
    for (const [name, e] of exts) {
      if ('skipped' in e) {
        rows.push([e.title, `skipped: ${e.skipped}`, '', '']);
        continue;
      }
      if (isErr(e)) {
        rows.push([e.title, `FAILED: ${e.error.split('\n')[0]}`, '', '']);
        continue;
      }
      for (const row of e.rows)
        rows.push([`${name}: ${row.metric}`, row.value, row.target ?? '', row.ok === undefined ? '' : mark(row.ok)]);
    }
    out.push(table(['measurement', 'value', 'target', ''], rows));
  }
  out.push(`Total bench time: ${r.total_s} s.\n`);
  return out.join('\n');
}
