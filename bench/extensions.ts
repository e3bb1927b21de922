/**
 * ============================== BENCH EXTENSION POINT ==============================
 * Measurements of operations (src/ops/) on the bench's GPT-2-small-shaped model. Each entry of
 * `extensions` runs in its own fresh child process (onnxruntime-node, the bench's thread count)
 * after the engine measurements, and its rows are printed in the "Operations" table and stored
 * under `extensions.<name>` in bench/results/latest.json.
 *
 * To add one: write a `BenchExtension` (name, title, run) below and append it to `extensions`.
 * `run` gets the model folder and a loader; it returns table rows (metric, value, optional target
 * and pass/fail) plus any JSON worth keeping. Import the operation dynamically inside `run` and
 * throw `new SkipExtension(reason)` when it is not there, so the bench still runs without it.
 * ===================================================================================
 */
import type { LoadedModel } from '../src/engine/api';
import { SkipExtension, type BenchExtension, type ExtContext, type ExtResult, type ExtRow } from './extension';
import { cpuNow, median, now, ALL_FUSED, timeInterleaved } from './lib';
import { randomIds } from './model-gen';
import { gradientCosts } from './gradients';

export { SkipExtension, type BenchExtension, type ExtContext, type ExtResult, type ExtRow } from './extension';

const fmt = (x: number, d = 1) => x.toFixed(d);

// ------------------------------------------------------------------ circuit over every head

const CIRCUIT_T = 16;
const CIRCUIT_TARGET = 0.3;

/**
 * `circuit` with every head a candidate (top_k_heads = n_layers × n_heads, no neurons) on a
 * 16-token prompt of random ids. Cost of one single ablation = the wall time of the op's
 * 'single ablations' phase (from its progress events) / the number of singles, compared with one
 * unbatched forward of the same prompt on the same (hooked) graph, fetching no hooks.
 * One cold run of the op first (ORT sizes its arena for the batch), then CIRCUIT_ROUNDS rounds of
 * {5 forwards, one circuit}: each round gives a ratio from times taken side by side (the machine
 * may be shared); the reported ratio is the median over rounds.
 */
const CIRCUIT_ROUNDS = 3;

const circuitExtension = (
  name: string,
  title: string,
  load: (ctx: ExtContext) => Promise<LoadedModel>,
): BenchExtension => ({
  name,
  title,
  async run(ctx) {
    let ops: typeof import('../src/ops/index');
    try {
      ops = await import('../src/ops/index');
    } catch (e) {
      throw new SkipExtension(`src/ops/index.ts could not be imported: ${(e as Error).message}`);
    }
    const op = ops.getOperation('circuit');
    if (!op) throw new SkipExtension('no circuit operation is registered in src/ops/index.ts');
    const maxBatch = (await import('../src/engine/caps')).CAPS.maxBatch;
    const model = await load(ctx);
    const { n_layers: L, n_heads: H, d_vocab: V } = model.info;
    const ids = randomIds(CIRCUIT_T, V, 4242);
    const forward = () => model.run(ids, { hooks: [] });

    const once = async () => {
      const stages: Record<string, { start: number; end: number; cpuStart: number; cpuEnd: number; total: number }> =
        {};
      const t0 = now();
      const doc = await op.run(
        model,
        { token_ids: ids, top_k_heads: L * H, top_k_neurons: 0 },
        {
          onProgress: (p) => {
            const t = now();
            const c = cpuNow();
            const s = (stages[p.stage] ??= { start: t, end: t, cpuStart: c, cpuEnd: c, total: p.total });
            s.end = t;
            s.cpuEnd = c;
            s.total = p.total;
          },
        },
      );
      const totalMs = now() - t0;
      const single = stages['single ablations'];
      if (!single)
        throw new Error(`circuit reported no 'single ablations' stage (stages: ${Object.keys(stages).join(', ')})`);
      return {
        doc: doc as { n_engine_runs: number; n_variants: number },
        totalMs,
        singleMs: single.end - single.start,
        singleCpuMs: single.cpuEnd - single.cpuStart,
        nSingles: single.total,
        stages,
      };
    };
    for (let i = 0; i < 3; i++) await forward();
    const cold = await once();
    ctx.log(`cold run: ${fmt(cold.totalMs)} ms in all, single phase ${fmt(cold.singleMs)} ms`);
    const rounds: {
      forward_ms: number;
      single_phase_ms: number;
      per_ablation_ms: number;
      ratio: number;
      forward_cpu_ms: number;
      single_phase_cpu_ms: number;
      ratio_cpu: number;
      op_total_ms: number;
      stage_ms: Record<string, number>;
    }[] = [];
    const fwdSamples: number[] = [];
    for (let r = 0; r < CIRCUIT_ROUNDS; r++) {
      const f = (await timeInterleaved([{ name: 'fwd', fn: forward }], 0, 5)).fwd;
      fwdSamples.push(...f.samples_ms);
      const c = await once();
      const per = c.singleMs / c.nSingles;
      rounds.push({
        forward_ms: f.median_ms,
        single_phase_ms: c.singleMs,
        per_ablation_ms: per,
        ratio: per / f.median_ms,
        forward_cpu_ms: f.cpu_median_ms,
        single_phase_cpu_ms: c.singleCpuMs,
        ratio_cpu: c.singleCpuMs / c.nSingles / f.cpu_median_ms,
        op_total_ms: c.totalMs,
        stage_ms: Object.fromEntries(Object.entries(c.stages).map(([k, v]) => [k, Math.round(v.end - v.start)])),
      });
      ctx.log(
        `round ${r + 1}: forward ${fmt(f.median_ms)} ms, single phase ${fmt(c.singleMs)} ms / ${c.nSingles} = ${fmt(per, 2)} ms → ${fmt(per / f.median_ms, 3)} of a forward`,
      );
    }
    const nSingles = cold.nSingles;
    const ratio = median(rounds.map((r) => r.ratio));
    const ratioCpu = median(rounds.map((r) => r.ratio_cpu));
    const ratioBest = Math.min(...rounds.map((r) => r.single_phase_ms)) / nSingles / Math.min(...fwdSamples);
    const fwdMed = median(fwdSamples);
    const singleMed = median(rounds.map((r) => r.single_phase_ms));
    await model.dispose();
    return {
      rows: [
        {
          metric: `one unbatched forward, T=${CIRCUIT_T} (hooked graph, no hooks fetched)`,
          value: `${fmt(fwdMed)} ms`,
        },
        {
          metric: `single-ablation phase, ${nSingles} heads in ${Math.ceil(nSingles / maxBatch)} batched runs of ≤ ${maxBatch}`,
          value: `${fmt(singleMed)} ms (${fmt(singleMed / nSingles, 1)} ms per ablation)`,
        },
        {
          metric: 'whole operation (median of rounds; cold run)',
          value: `${fmt(median(rounds.map((r) => r.op_total_ms)))} ms; ${fmt(cold.totalMs)} ms`,
        },
        {
          metric: `**per-ablation cost / one forward** (median of ${CIRCUIT_ROUNDS} rounds)`,
          value: `**${fmt(ratio, 3)}** (rounds: ${rounds.map((r) => fmt(r.ratio, 3)).join(', ')})`,
          target: `≤ ${CIRCUIT_TARGET}`,
          ok: ratio <= CIRCUIT_TARGET,
        },
        {
          metric: 'per-ablation cost / one forward, fastest single phase and fastest forward (secondary)',
          value: fmt(ratioBest, 3),
        },
        { metric: 'per-ablation cost / one forward, process CPU time (secondary)', value: fmt(ratioCpu, 3) },
      ],
      json: {
        T: CIRCUIT_T,
        n_singles: nSingles,
        n_variants: cold.doc.n_variants,
        n_engine_runs: cold.doc.n_engine_runs,
        forward_median_ms: fwdMed,
        single_phase_median_ms: singleMed,
        per_ablation_over_forward: ratio,
        per_ablation_over_forward_cpu: ratioCpu,
        per_ablation_over_forward_fastest: ratioBest,
        rounds,
        cold: {
          op_total_ms: cold.totalMs,
          single_phase_ms: cold.singleMs,
          stage_ms: Object.fromEntries(Object.entries(cold.stages).map(([k, v]) => [k, Math.round(v.end - v.start)])),
        },
        target: CIRCUIT_TARGET,
        meets_target: ratio <= CIRCUIT_TARGET,
      },
    };
  },
});

export const circuitAllHeads = circuitExtension(
  'circuit',
  'circuit over all heads (per-ablation cost / one unbatched forward)',
  (ctx) => ctx.loadModel(),
);

/**
 * The same with the model's graphs built with SkipLayerNormalization and MultiHeadAttention too
 * (ALL_FUSED, off by default): the ablations' lean variant then uses both. The forward (the hooked
 * graph) is the same graph in both: every hook there is a site.
 */
export const circuitAllFused = circuitExtension(
  'circuit_all_fused',
  'circuit over all heads, lean variant with SkipLayerNormalization / MultiHeadAttention',
  async (ctx) => {
    const { loadModelFilesNode } = await import('../src/node/load-files-node');
    const { nodeFactory } = await import('../src/node/load');
    const { createModel, modelPartsFrom } = await import('../src/engine/model');
    const files = await loadModelFilesNode(ctx.modelDir);
    return createModel(
      { ...modelPartsFrom(files, { bundled: false, id: ctx.modelDir }), fused: ALL_FUSED },
      await nodeFactory('node', ctx.threads),
    );
  },
);

// ------------------------------------------------------------------ generation with / without KV cache

const GEN_PROMPT = 16;
const GEN_NEW = 32;

/**
 * Greedy generation of 32 new tokens from a 16-token prompt of random ids, with the KV cache
 * (one prompt pass, then one run per token) and without it (the whole sequence re-run each step),
 * through the shared loop in src/ops/lib/generation.ts. Tokens/s = new tokens / wall time
 * (prompt pass included). A short warm-up each way, then the median of 3, interleaved.
 */
export const generationKv: BenchExtension = {
  name: 'generation',
  title: 'generation: KV-cached vs re-run tokens/s',
  async run(ctx) {
    let gen: typeof import('../src/ops/lib/generation');
    try {
      gen = await import('../src/ops/lib/generation');
    } catch (e) {
      throw new SkipExtension(`src/ops/lib/generation.ts could not be imported: ${(e as Error).message}`);
    }
    if (typeof gen.generateTokens !== 'function')
      throw new SkipExtension('src/ops/lib/generation.ts has no generateTokens');
    const model = await ctx.loadModel();
    const ids = randomIds(GEN_PROMPT, model.info.d_vocab, 777);
    const outs: Record<string, number[]> = {};
    const go = (useCache: boolean) => async () => {
      const r = await gen.generateTokens(model, ids, { maxNewTokens: GEN_NEW, useCache, stopAtEos: false });
      outs[String(useCache)] = r.ids;
    };
    // warm-up: a short generation each way (ORT plans memory per input shape; the re-run path sees many)
    await gen.generateTokens(model, ids, { maxNewTokens: 4, useCache: true, stopAtEos: false });
    await gen.generateTokens(model, ids, { maxNewTokens: 4, useCache: false, stopAtEos: false });
    const t = await timeInterleaved(
      [
        { name: 'cached', fn: go(true) },
        { name: 'rerun', fn: go(false) },
      ],
      0,
      3,
    );
    const tps = (x: { median_ms: number }) => GEN_NEW / (x.median_ms / 1000);
    const same = JSON.stringify(outs.true) === JSON.stringify(outs.false);
    const speedup = tps(t.cached) / tps(t.rerun);
    ctx.log(
      `cached ${fmt(tps(t.cached))} tok/s, re-run ${fmt(tps(t.rerun))} tok/s (×${fmt(speedup, 2)}), same tokens: ${same}`,
    );
    await model.dispose();
    return {
      rows: [
        {
          metric: `KV-cached generation, ${GEN_NEW} tokens from a ${GEN_PROMPT}-token prompt`,
          value: `${fmt(tps(t.cached))} tok/s (${fmt(t.cached.median_ms)} ms)`,
        },
        {
          metric: 're-run generation (whole sequence every step)',
          value: `${fmt(tps(t.rerun))} tok/s (${fmt(t.rerun.median_ms)} ms)`,
        },
        {
          metric: 'speed-up of the KV cache (wall; by process CPU time)',
          value: `×${fmt(speedup, 2)}; ×${fmt(t.rerun.cpu_median_ms / t.cached.cpu_median_ms, 2)}`,
        },
        { metric: 'cached and re-run token ids identical', value: same ? 'yes' : 'NO', target: 'yes', ok: same },
      ],
      json: {
        prompt_tokens: GEN_PROMPT,
        new_tokens: GEN_NEW,
        cached: t.cached,
        rerun: t.rerun,
        cached_tokens_per_s: tps(t.cached),
        rerun_tokens_per_s: tps(t.rerun),
        speedup,
        identical_ids: same,
      },
    };
  },
};

// ------------------------------------------------------------------ every operation against its forwards

const OPS_ROUNDS = 3;

const QWEN_ROUNDS = 3;

/**
 * Absolute times of the single-forward operations at the qwen2.5-0.5b shape (random F16 weights in
 * the Hugging Face layout, bench/scale.ts; 24 layers, d_model 896, vocab 151936, tied), on
 * onnxruntime-node (the bench's threads, weights as `auto` picks) and WASM in Node (1 thread), on a
 * ≈16-token prompt: the forward (hooks: none, logits at the last position) and each operation,
 * medians of QWEN_ROUNDS interleaved rounds after one warm-up run of each. The model is generated
 * under $TMPDIR/loupe-scale (reused when there) and deleted afterwards.
 */
async function qwenOps(ctx: ExtContext, rows: ExtRow[]): Promise<Record<string, unknown>> {
  const { existsSync, rmSync } = await import('node:fs');
  const { tmpdir } = await import('node:os');
  const path = await import('node:path');
  const { SHAPES, generate } = await import('./scale');
  const { benchPrompt, OP_CASES } = await import('./ops-cost');
  const { loadModelNode } = await import('../src/node/load');
  const ops = await import('../src/ops/index');
  const shape = SHAPES.find((s) => s.name === 'qwen2.5-0.5b')!;
  const dir = path.join(tmpdir(), 'loupe-scale', shape.name);
  const made = !existsSync(path.join(dir, 'model.safetensors'));
  if (made) generate(shape, dir);
  const json: Record<string, unknown> = { shape };
  try {
    for (const backend of ['node', 'wasm'] as const) {
      const model = await loadModelNode(dir, { backend, threads: backend === 'node' ? ctx.threads : 1 });
      const prompt = benchPrompt(model, 16);
      const ids = model.tokenize(prompt);
      const T = ids.length;
      const cases = [
        {
          label: 'forward (hooks: none, last-position logits)',
          fn: () => model.run(ids, { hooks: [], logitPositions: [T - 1] }),
        },
        ...OP_CASES.filter((c) => c.target !== undefined).map((c) => ({
          label: c.label,
          fn: () => ops.getOperation(c.op)!.run(model, c.input(prompt), {}),
        })),
      ];
      const rounds = backend === 'node' ? QWEN_ROUNDS : 2;
      const t = await timeInterleaved(
        cases.map((c) => ({ name: c.label, fn: c.fn })),
        1,
        rounds,
      );
      const fwd = t[cases[0].label].median_ms;
      for (const c of cases) {
        const ms = t[c.label].median_ms;
        rows.push({
          metric: `qwen2.5-0.5b shape, ${backend} (${model.info.weights} weights): ${c.label}, T=${T}`,
          value: `${fmt(ms, 0)} ms${c === cases[0] ? '' : ` (${fmt(ms / fwd, 2)} forwards)`}`,
        });
      }
      ctx.log(`[qwen ${backend}] ${cases.map((c) => `${c.label} ${fmt(t[c.label].median_ms, 0)} ms`).join(', ')}`);
      json[backend] = { T, weights: model.info.weights, rounds, times: t };
      await model.dispose();
    }
  } finally {
    if (made) rmSync(dir, { recursive: true, force: true });
  }
  return json;
}

/**
 * Each operation's time / the time of the forward passes it needs (bench/ops-cost.ts), on
 * onnxruntime-node and on WASM in Node (1 thread), at T≈16 (every case) and T≈128 (the
 * single-forward operations); then the absolute times at the qwen2.5-0.5b shape (qwenOps).
 */
export const opsCost: BenchExtension = {
  name: 'ops',
  title: 'operations: time / time of the forward passes they need',
  timeoutMs: 2_400_000,
  async run(ctx) {
    const { measureOps, benchPrompt, OP_CASES } = await import('./ops-cost');
    const { loadModelNode } = await import('../src/node/load');
    const rows: ExtRow[] = [];
    const json: Record<string, unknown> = {};
    for (const backend of ['node', 'wasm'] as const) {
      const model =
        backend === 'node' ? await ctx.loadModel() : await loadModelNode(ctx.modelDir, { backend: 'wasm', threads: 1 });
      const all = [];
      for (const n of [16, 128]) {
        const cases = n === 16 ? OP_CASES : OP_CASES.filter((c) => c.target !== undefined && !c.shortOnly);
        const r = await measureOps(model, benchPrompt(model, n), cases, OPS_ROUNDS, (m) =>
          ctx.log(`[${backend}] ${m}`),
        );
        all.push(...r);
        for (const x of r) {
          rows.push({
            metric: `${backend}: ${x.label}, T=${x.T} (${x.why})`,
            value: `**${fmt(x.ratio, 2)}** (${fmt(x.op_ms)} ms vs ${x.forwards} × ${fmt(x.forward_ms)} ms; fastest runs ${fmt(x.ratio_fastest, 2)}; CPU time ${fmt(x.ratio_cpu, 2)}; cold ${fmt(x.cold_ms, 0)} ms)`,
            ...(x.target !== undefined ? { target: `≤ ${x.target}`, ok: x.ratio <= x.target } : {}),
          });
        }
      }
      json[backend] = all;
      await model.dispose();
    }
    json.qwen = await qwenOps(ctx, rows);
    return {
      rows,
      json: { rounds: OPS_ROUNDS, forward: 'model.run(ids, { hooks: [], logitPositions: [T-1] })', ...json },
    };
  },
};

// ------------------------------------------------------------------ cached load vs bytes in memory

const LOAD_ROUNDS = 3;

/**
 * Issue 14 item 5: a load from the cache (a loopback Hub stand-in already downloaded into a
 * DirCache) against creating the model from bytes already in memory (MemorySource: the files
 * read beforehand; only createModel is timed). WASM in Node, the runtime the page uses. The
 * cached load must make zero requests. One cold download first, then LOAD_ROUNDS rounds of
 * {cached, in memory}; medians.
 */
export const cachedLoad: BenchExtension = {
  name: 'cached_load',
  title: 'loads: cached load / model from bytes in memory (WASM)',
  async run(ctx) {
    const { mkdtempSync, readFileSync, readdirSync, rmSync, statSync } = await import('node:fs');
    const { tmpdir } = await import('node:os');
    const path = await import('node:path');
    const { startHubServer } = await import('../tests/helpers/hub-server');
    const { loadModelNode, nodeFactory } = await import('../src/node/load');
    const { DirCache } = await import('../src/node/dir-cache');
    const { MemorySource } = await import('../src/engine/source/memory-source');
    const { loadModelFiles } = await import('../src/engine/source/files');
    const { createModel } = await import('../src/engine/model');
    const { readTensorF32 } = await import('../src/engine/safetensors');
    const hub = await startHubServer();
    const cacheDir = mkdtempSync(path.join(tmpdir(), 'loupe-bench-cache-'));
    try {
      hub.addRepo('bench/model', ctx.modelDir);
      const cache = new DirCache(cacheDir);
      const load = () => loadModelNode('bench/model', { endpoint: hub.url, cache, backend: 'wasm', threads: 1 });
      let t = now();
      await (await load()).dispose();
      const coldMs = now() - t;
      const factory = await nodeFactory('wasm', 1);
      const names = readdirSync(ctx.modelDir).filter((f) => statSync(path.join(ctx.modelDir, f)).isFile());
      const cached: number[] = [],
        memory: number[] = [],
        requests: number[] = [];
      for (let r = 0; r < LOAD_ROUNDS; r++) {
        hub.resetCounters();
        t = now();
        const m = await load();
        cached.push(now() - t);
        requests.push(hub.log.length);
        await m.dispose();
        const files = Object.fromEntries(
          names.map((f) => [f, new Uint8Array(readFileSync(path.join(ctx.modelDir, f)))]),
        );
        const mf = await loadModelFiles(new MemorySource(files, 'bench'));
        t = now();
        const mm = await createModel(
          {
            config: mf.config as Record<string, any>,
            tokenizerJson: mf.tokenizerJson,
            tokenizerConfig: mf.tokenizerConfig,
            weights: mf.weights,
            readTensor: (n) => readTensorF32(mf.weights, n),
            id: 'bench',
            revision: '',
            source: 'url',
          },
          factory,
        );
        memory.push(now() - t);
        await mm.dispose();
      }
      const c = median(cached),
        mem = median(memory),
        ratio = c / mem;
      return {
        rows: [
          { metric: 'cold load from the loopback Hub (download + session)', value: `${fmt(coldMs, 0)} ms` },
          {
            metric: 'cached load (DirCache), requests made',
            value: `${Math.max(...requests)}`,
            target: '0',
            ok: Math.max(...requests) === 0,
          },
          {
            metric: 'cached load / model from bytes in memory',
            value: `**${fmt(ratio, 2)}** (${fmt(c, 0)} ms vs ${fmt(mem, 0)} ms)`,
            target: '≤ 1.5',
            ok: ratio <= 1.5,
          },
        ],
        json: { rounds: LOAD_ROUNDS, cold_ms: coldMs, cached_ms: cached, memory_ms: memory, requests, ratio },
      };
    } finally {
      await hub.close();
      rmSync(cacheDir, { recursive: true, force: true });
    }
  },
};

/**
 * Issue 11 item 3: what `--weights q8` costs in numbers (src/ops/lib/precision-cost.ts), never
 * silent: max |Δ| of every logit and of trace's DLA (per-head attributions and decomposition
 * terms) against the stored precision, on the real models in ../shared, the bench's GPT-2-small
 * shape and random F16 models of other families (N(0, 0.02) weights), onnxruntime-node. Also the
 * bytes the session holds the weights in at each precision.
 */
export const q8Cost: BenchExtension = {
  name: 'q8_cost',
  title: 'q8 weights: max |Δ| vs stored precision (logits, trace DLA)',
  timeoutMs: 600_000,
  async run(ctx) {
    const path = await import('node:path');
    const { existsSync } = await import('node:fs');
    const { loadModelNode } = await import('../src/node/load');
    const { precisionCost } = await import('../src/ops/lib/precision-cost');
    // the shared folder beside the checkout, as tests/helpers/shared.ts finds it (LOUPE_SHARED overrides)
    const SHARED = process.env.LOUPE_SHARED ?? path.resolve(import.meta.dirname, '../../shared');
    const { ALL_FAMILY_CASES, makeCaseModel } = await import('../tests/reference');
    const prompt = 'Once upon a time there was a little cat who';
    const rows: ExtRow[] = [];
    const json: Record<string, unknown> = {};
    const measure = async (label: string, dir: string) => {
      const [stored, q8] = [
        await loadModelNode(dir, { weights: 'stored', threads: ctx.threads }),
        await loadModelNode(dir, { weights: 'q8', threads: ctx.threads }),
      ];
      try {
        const c = await precisionCost(stored, q8, prompt);
        json[label] = {
          ...c,
          stored_bytes: stored.info.weight_bytes,
          q8_bytes: q8.info.weight_bytes,
          dtype: stored.info.dtype,
        };
        rows.push({
          metric: `${label} (${stored.info.dtype}, ${c.tokens} tokens)`,
          value: `logits ${c.max_abs_logit_diff.toExponential(2)} of max ${fmt(c.max_abs_logit, 2)}; DLA ${c.max_abs_dla_diff.toExponential(2)} of max ${fmt(c.max_abs_dla, 2)}; ${c.same_prediction ? 'same' : 'other'} top-1; weights ${fmt(stored.info.weight_bytes / 1e6, 3)} → ${fmt(q8.info.weight_bytes / 1e6, 3)} MB`,
        });
      } finally {
        await stored.dispose();
        await q8.dispose();
      }
    };
    for (const name of ['induction-gpt2', 'stories260K']) {
      const dir = path.join(SHARED, 'models', name);
      if (existsSync(dir)) await measure(name, dir);
    }
    await measure('random gpt2-small shape', ctx.modelDir);
    for (const name of ['llama3-rope-untied-bias', 'gemma2-softcap-window', 'neox-parallel-rot25']) {
      const rm = makeCaseModel(
        ALL_FAMILY_CASES.find((c) => c.name === name)!,
        { dtype: 'F16' },
      );
      try {
        await measure(`random ${name}`, rm.dir);
      } finally {
        rm.cleanup();
      }
    }
    return { rows, json };
  },
};

/** The list the bench runs, in order. Append new measurements here. */
export const extensions: BenchExtension[] = [
  opsCost,
  circuitAllHeads,
  circuitAllFused,
  generationKv,
  cachedLoad,
  gradientCosts,
  q8Cost,
];
