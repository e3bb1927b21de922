/**
 * What an operation reads back from and writes to the device (runtime/transfers.ts, reported in
 * memory().transfers), on onnxruntime-node's WebGPU provider (SwiftShader here and in CI), each
 * against the bytes its document needs, worked out here from the model's shapes; and its numbers
 * against the node backend's. The nodes the provider left to the CPU come from onnxruntime's
 * profiler: shape arithmetic only, never a compute op.
 */
import { describe, it, expect, afterAll, beforeAll } from 'vitest';
import { loadModelNode } from '../src/node/load';
import { getOperation } from '../src/ops/index';
import { runVariants } from '../src/ops/lib/ablation';
import { createNodeSaeLoaders } from '../src/node/load-sae';
import { makeRandomModel, type RandomModel } from './reference';
import { makeRandomTranscoders, type RandomTranscoderSet } from './helpers/random-transcoders';
import type { LoadedModel } from '../src/engine/api';
import type { TransferCounts } from '../src/engine/runtime/transfers';
import { realpathSync } from 'node:fs';
import path from 'node:path';
import { SHARED } from './helpers/shared';

const F = 4; // bytes of a float32
/** ops the profiler saw off the GPU that work on floats (int64 shape arithmetic there is the provider's design) */
const floatOffDevice = (m: LoadedModel) =>
  Object.keys(m.memory().transfers!.off_device_ops ?? {}).filter((k) => !k.endsWith(':int64'));

/** what `op` on `model` moved, and its document */
async function counted(model: LoadedModel, op: string, input: Record<string, unknown>, ctx = {}) {
  const before = model.memory().transfers!;
  const doc = (await getOperation(op)!.run(model, input as any, ctx)) as any;
  const after = model.memory().transfers!;
  const d = (k: keyof TransferCounts) => (after[k] as number) - (before[k] as number);
  return {
    doc,
    after,
    runs: d('runs'),
    read: d('read_bytes'),
    written: d('written_bytes'),
    deviceFeeds: d('device_feeds'),
    deviceOutputs: d('device_outputs'),
  };
}

function close(a: number[], b: number[], tol = 1e-4): void {
  expect(a.length).toBe(b.length);
  a.forEach((x, i) => expect(Math.abs(x - b[i]), `[${i}] ${x} vs ${b[i]}`).toBeLessThan(tol));
}

describe('transfers on WebGPU (node), against the bytes each document needs', () => {
  let rm: RandomModel;
  let rm2: RandomModel;
  let gpu: LoadedModel;
  let cpu: LoadedModel;
  /** the same model at twice the width: what is written per batch should not depend on d_model */
  let wide: LoadedModel;
  const L = 2,
    D = 64,
    H = 4,
    Dh = 16,
    M = 256,
    V = 300;
  beforeAll(async () => {
    rm = makeRandomModel('gpt2', { seed: 3, dModel: D, nLayers: L, nHeads: H, dMlp: M, vocabSize: V });
    gpu = await loadModelNode(rm.dir, { backend: 'webgpu' });
    cpu = await loadModelNode(rm.dir);
    rm2 = makeRandomModel('gpt2', { seed: 3, dModel: 2 * D, nLayers: L, nHeads: H, dMlp: M, vocabSize: V });
    wide = await loadModelNode(rm2.dir, { backend: 'webgpu' });
  });
  afterAll(async () => {
    await gpu?.dispose();
    await cpu?.dispose();
    await wide?.dispose();
    rm?.cleanup();
    rm2?.cleanup();
  });

  it('trace reads back its position only: the same bytes at any prompt length, O(its document)', async () => {
    // the forward: the logits at the position; per layer hook_z, attn_out, mlp_out, mlp.hook_post; resid_pre 0,
    // the last resid_post, ln_final's scale, pos_embed: all at the one position
    const want = F * (V + L * (H * Dh + 2 * D + M) + 2 * D + 1 + D);
    for (const [i, prompt] of ['the cat', 'the cat sat on the mat and then the dog sat on the cat again'].entries()) {
      const r = await counted(gpu, 'trace', { prompt, top_k: 3 });
      // the first trace also takes Σ_v W_U[:, v] (the centring's mean, kept for the model) on the device: D floats
      const sum = i === 0 ? 1 : 0;
      // the forward, then one token through the forward graph taking the readout's If (readout 'forward'):
      // per layer z·W_O [D], and W_O·e [H·Dh], W_out·e [M] for the target's direction e
      expect(gpu.info.readout).toBe('forward');
      expect(r.runs).toBe(2 + sum);
      expect(r.read).toBe(want + F * L * (D + H * Dh + M) + sum * F * D);
      expect(r.deviceOutputs).toBe(0);
      // the identity interventions of every site are fed from the device: two per site, in each run
      expect(r.deviceFeeds).toBe(2 * (2 + sum) * gpu.hookNames().filter((h) => !h.endsWith('attn_scores')).length);
      const c = (await getOperation('trace')!.run(cpu, { prompt, top_k: 3 }, {})) as any;
      expect(r.doc.predicted_token_id).toBe(c.predicted_token_id);
      close(r.doc.head_attribution.flat(), c.head_attribution.flat());
      close(
        r.doc.decomposition.terms.map((t: any) => t.value),
        c.decomposition.terms.map((t: any) => t.value),
      );
    }
    // that sum against float64 over W_U [D, V] as TransformerLens orients it
    const wu = cpu.param('unembed.W_U');
    const ref = Array.from({ length: D }, (_, d) => {
      let x = 0;
      for (let v = 0; v < V; v++) x += wu.data[d * V + v];
      return x;
    });
    close(Array.from((await gpu.weightProducts({ unembedSum: true })).unembedSum.data), ref, 1e-5);
    // the dots with every token (unembedDots) in the forward graph's If too: one run, S·V floats read back,
    // W_U neither read in JavaScript nor copied; against float64 over W_U
    const S = 2;
    const x = Float64Array.from({ length: S * D }, (_, i) => Math.sin(i * 0.37) + 0.25);
    const before = gpu.memory().transfers!;
    const dots = (await gpu.weightProducts({ unembedDots: { dims: [S, D], data: x } })).unembedDots;
    const after = gpu.memory().transfers!;
    expect(after.runs - before.runs).toBe(1);
    expect(after.read_bytes - before.read_bytes).toBe(F * S * V);
    expect(dots.dims).toEqual([S, V]);
    const dotsRef = Array.from({ length: S * V }, (_, i) => {
      const [s, v] = [Math.floor(i / V), i % V];
      let acc = 0;
      for (let d = 0; d < D; d++) acc += x[s * D + d] * wu.data[d * V + v];
      return acc;
    });
    close(Array.from(dots.data), dotsRef, 1e-5);
    // node's (float64 in JavaScript) equal the same reference
    close(
      Array.from((await cpu.weightProducts({ unembedDots: { dims: [S, D], data: x } })).unembedDots.data),
      dotsRef,
      1e-9,
    );
    expect(gpu.memory().transfers!.off_device_nodes).toBeGreaterThan(0);
    expect(floatOffDevice(gpu)).toEqual([]);
  });

  it('logit_lens reads back its top-k per layer and position, never the streams: reduced in the forward graph', async () => {
    const prompt = 'the cat sat on the mat and then the dog sat on the cat again';
    const k = 3;
    for (const positions of ['all', [0, 4, 9]] as const) {
      const r = await counted(gpu, 'logit_lens', { prompt, top_k: k, positions });
      const T = r.doc.tokens.length;
      const P = positions === 'all' ? T : positions.length;
      // one forward run whose lens If (build-model.ts addForwardLens) reduces the L + 1 streams at P
      // positions with the forward's own ln_final and W_U: per stream and position k logits (float)
      // and ids (int64), the log-normaliser, the final token's logit and rank (floats); per position
      // the final token (int64). Before, the streams came back whole with a logits row, F·((L+1)·T·D + V),
      // then went to a lens session (F·(L+1)·P·D written)
      expect(r.runs).toBe(1);
      expect(r.read).toBe((L + 1) * P * (k * (F + 8) + 3 * F) + 8 * P);
      // written: what any forward writes (its ids, positions, masks; the identity interventions are
      // fed from the device), and the P positions the lens reads
      const before = gpu.memory().transfers!.written_bytes;
      await gpu.run(
        r.doc.tokens.map((t: any) => t.id),
        { logitPositions: [T - 1], pick: { argmax: true } },
      );
      expect(r.written).toBe(gpu.memory().transfers!.written_bytes - before + 8 * P);
      expect(r.read).toBeLessThan(F * (L + 1) * P * D);
      const c = (await getOperation('logit_lens')!.run(cpu, { prompt, top_k: k, positions }, {})) as any;
      expect(r.doc.final_predictions.map((x: any) => x.token_id)).toEqual(
        c.final_predictions.map((x: any) => x.token_id),
      );
      const cells = (doc: any) => doc.layers.flatMap((l: any) => l.positions);
      expect(cells(r.doc).map((x: any) => x.final_token_rank)).toEqual(cells(c).map((x: any) => x.final_token_rank));
      expect(cells(r.doc).flatMap((x: any) => x.top.map((t: any) => t.token_id))).toEqual(
        cells(c).flatMap((x: any) => x.top.map((t: any) => t.token_id)),
      );
      close(
        cells(r.doc).flatMap((x: any) => [x.final_token_prob, ...x.top.flatMap((t: any) => [t.logit, t.prob])]),
        cells(c).flatMap((x: any) => [x.final_token_prob, ...x.top.flatMap((t: any) => [t.logit, t.prob])]),
      );
    }
    expect(floatOffDevice(gpu)).toEqual([]);
  });

  it('activations reads back the statistics of the hooks it summarises, and the values it shows', async () => {
    const prompt = 'the cat sat on the mat';
    const r = await counted(gpu, 'activations', { prompt, top_k: 3 });
    const T = r.doc.tokens.length;
    // per layer resid_pre, resid_mid, resid_post, attn_out, mlp_out, mlp_post and pattern reduced on
    // the GPU: mean, std, min, max (4 floats), the argmax (int64) and a norm per position; the last
    // layer's mlp_post whole (the document's values grid; its statistics from it, here); of the
    // logits the argmax only (int64). Before (main at 36e3e62) every hook came back whole, and a
    // logits row: F·(L·(5·T·D + T·M + H·T·T) + V) = 35,024 bytes here, 7,852 now
    expect(r.read).toBe(F * T * M + 8 + (7 * L - 1) * (4 * F + 8 + T * F));
    expect(r.read).toBe(7_852);
    const c = (await getOperation('activations')!.run(cpu, { prompt, top_k: 3 }, {})) as any;
    close(r.doc.values.grid.flat(), c.values.grid.flat());
    // the statistics reduced on the GPU (float32) against node's (float64 here)
    const sites = (doc: any) => doc.layers.flatMap((l: any) => l.sites);
    for (const k of ['mean', 'std', 'min', 'max'])
      close(
        sites(r.doc).map((x: any) => x[k]),
        sites(c).map((x: any) => x[k]),
      );
    close(
      sites(r.doc).flatMap((x: any) => x.norm_per_position),
      sites(c).flatMap((x: any) => x.norm_per_position),
    );
    expect(sites(r.doc).map((x: any) => x.argmax)).toEqual(sites(c).map((x: any) => x.argmax));
  });

  it('attribution_patching reads back its estimates: the products are summed on the device', async () => {
    const input = {
      prompt: '',
      token_ids: [5, 10, 20, 30, 40, 50],
      corrupted_token_ids: [5, 11, 20, 31, 40, 50],
      validate: 0,
    };
    const r = await counted(gpu, 'attribution_patching', input);
    const T = input.token_ids.length;
    // the clean run's hooks stay on the device (nothing validates, so nothing patches them in); the
    // corrupted forward + backward keeps its hooks and gradients there and a helper sums
    // (clean − corrupted) · grad to an estimate per head (hook_z) and per position (resid_pre,
    // attn_out, mlp_out). Read: two rows of logits (clean, the corrupted prediction), the gradient
    // run's metric (its row reduced to two logits) and the estimates. Before (main at 36e3e62) the
    // hooks came back twice and the gradients once: F·(3·L·(H·Dh + 3·D)·T + 3·V) = 94,464 bytes
    // here, 2,600 now
    expect(r.runs).toBe(5);
    expect(r.read).toBe(F * (2 * V + L * (H + 3 * T)) + row([0, 0]));
    expect(r.read).toBe(2_600);
    // the backward pass too runs on the GPU (its gradient sums were a Sum, which ran on the CPU)
    expect(floatOffDevice(gpu)).toEqual([]);
    const c = (await getOperation('attribution_patching')!.run(cpu, input, {})) as any;
    close(
      r.doc.heads.map((h: any) => h.estimate),
      c.heads.map((h: any) => h.estimate),
    );
    close(
      r.doc.sites.map((h: any) => h.estimate),
      c.sites.map((h: any) => h.estimate),
    );
  });

  it("attribution_patching validates from the clean hooks on the device: only each variant's metric more", async () => {
    const input = {
      prompt: '',
      token_ids: [5, 10, 20, 30, 40, 50],
      corrupted_token_ids: [5, 11, 20, 31, 40, 50],
    };
    const r0 = await counted(gpu, 'attribution_patching', { ...input, validate: 0 });
    const r = await counted(gpu, 'attribution_patching', { ...input, validate: 3 });
    const v = r.doc.validation;
    // the corrupted run and each validated head and site, reduced to two logits. Before (main at
    // 6f3c91d) the clean hooks came back to be patched in, and were written with the validation's batch
    expect(r.read - r0.read).toBe((1 + v.heads.length + v.sites.length) * row([0, 0]));
    const c = (await getOperation('attribution_patching')!.run(cpu, { ...input, validate: 3 }, {})) as any;
    close(
      [...v.heads, ...v.sites].map((x: any) => x.actual),
      [...c.validation.heads, ...c.validation.sites].map((x: any) => x.actual),
    );
  });

  // a logits row reduced on the device (runtime/reduce.ts): the logits at the ids asked for, the
  // log-normaliser, the argmax (int64) and its logit, and KL from a reference where one is given
  const row = (ids: number[], kl = false) => F * ids.length + F + 8 + F + (kl ? F : 0);
  const ids = [5, 10, 20, 30, 40, 50];
  const T = ids.length;

  it('patch reads back the last position of two runs and per variant its metric reduced there', async () => {
    const input = { prompt: '', token_ids: ids, corrupted_token_ids: [5, 11, 20, 31, 40, 50] };
    const r = await counted(gpu, 'patch', input);
    // resid_pre per layer × position, attn_out and mlp_out per layer × position and all positions, heads
    const variants = L * T + 2 * (L * T + L) + L * H;
    expect(r.doc.n_variants).toBe(variants);
    // the clean run's resid_pre, attn_out, mlp_out, hook_z per layer (the patches' sources) stay on the
    // device; of both runs the last position's logits come back. Before (main at f2e4f1c) both runs read
    // every position's logits and each variant its whole row: 84,288 bytes here; then (main at 6f3c91d)
    // the sources came back, 15,840; 3,552 now
    expect(r.read).toBe(F * 2 * V + variants * row([0, 0]));
    expect(r.read).toBe(3_552);
    const c = (await getOperation('patch')!.run(cpu, input, {})) as any;
    for (const k of ['resid_pre', 'attn_out', 'mlp_out', 'head_out'])
      close(
        r.doc[k].flat().map((x: number | null) => x ?? 0),
        c[k].flat().map((x: number | null) => x ?? 0),
      );
    expect(floatOffDevice(gpu)).toEqual([]);
  });

  it('ablate and layer_ablation read back the clean row and per variant its effect reduced there', async () => {
    const input = {
      prompt: '',
      token_ids: ids,
      targets: [
        { layer: 0, head: 1 },
        { layer: 1, head: 2 },
      ],
    };
    const r = await counted(gpu, 'ablate', input);
    // each target, then both: the answer's logit and KL(clean ‖ ablated) per variant. Before: every
    // position's logits of the clean run and each variant's whole row (10,800 bytes here), 1,272 now
    expect(r.read).toBe(F * V + 3 * row([0], true));
    expect(r.read).toBe(1_272);
    const c = (await getOperation('ablate')!.run(cpu, input, {})) as any;
    for (const k of ['logit_delta', 'logprob_delta', 'prob_delta', 'kl', 'new_predicted_prob'])
      close(
        r.doc.entries.map((e: any) => e[k]),
        c.entries.map((e: any) => e[k]),
      );
    expect(r.doc.entries.map((e: any) => e.new_predicted_token_id)).toEqual(
      c.entries.map((e: any) => e.new_predicted_token_id),
    );
    const la = await counted(gpu, 'layer_ablation', { prompt: '', token_ids: ids });
    // attn_out and mlp_out of each layer (before: 7,200 + 2L·V·4 = 12,000 bytes here, 1,296 now)
    expect(la.read).toBe(F * V + 2 * L * row([0], true));
    const lc = (await getOperation('layer_ablation')!.run(cpu, { prompt: '', token_ids: ids }, {})) as any;
    for (const k of ['logprob_delta', 'kl'])
      close(
        la.doc.entries.map((e: any) => e[k]),
        lc.entries.map((e: any) => e[k]),
      );
    expect(floatOffDevice(gpu)).toEqual([]);
  });

  it("a scan's reference row (KL from the clean run) is copied to the device once, not with every batch", async () => {
    const variants = [0, 1, 2, 3].map((h) => [{ hook: 'blocks.0.attn.hook_z', op: 'zero' as const, head: h }]);
    const ref = new Float32Array(V).fill(-Math.log(V));
    const written = async (reduce: { ids: number[]; ref?: Float32Array }) => {
      const before = gpu.memory().transfers!.written_bytes;
      const rows = await runVariants(gpu, ids, variants, { ctx: {}, maxBatch: 1, reduce });
      return { bytes: gpu.memory().transfers!.written_bytes - before, rows };
    };
    const plain = await written({ ids: [0] });
    const withRef = await written({ ids: [0], ref });
    // four batches, the reference [V] written once (before: once per batch, 4·F·V)
    expect(withRef.bytes - plain.bytes).toBe(F * V);
    // the same KL as node's, whose helper reads it from JS memory with every run
    const c = await runVariants(cpu, ids, variants, { ctx: {}, maxBatch: 1, reduce: { ids: [0], ref } });
    close(
      withRef.rows.map((r) => r.kl!),
      c.map((r) => r.kl!),
    );
  });

  it('patch and mean/resample ablation feed their sources from the device: nothing written grows with d_model', async () => {
    // the same model at twice the width: what is written per batch (the tokens, the masks of what each
    // row patches: [B, T, 1] per position, [B, 1, H, 1] per head) does not depend on d_model; the
    // sources are kept on the device (patch) or copied there once per scan (mean, resample).
    // Before (main at 6f3c91d) each batch wrote every patched site's mul and add whole, [B, T, d_model]:
    // 1,182,744 bytes for this patch at d_model 64 (20,024 now)
    const D2 = 2 * D;
    {
      const patch = { prompt: '', token_ids: ids, corrupted_token_ids: [5, 11, 20, 31, 40, 50] };
      const p1 = await counted(gpu, 'patch', patch);
      const p2 = await counted(wide, 'patch', patch);
      expect(p2.written).toBe(p1.written);
      expect(p2.read).toBe(p1.read);
      // path patching: every head's hook_z from the base run, one head's from the source (two device
      // sources on one site, folded in on the device), as node computes it
      const reads: number[] = [];
      for (const scan of [{}, { path_receivers: [{ layer: 1, head: 0 }] }]) {
        const input = { ...patch, scans: ['path'], ...scan };
        const r = await counted(gpu, 'patch', input);
        const g = r.doc;
        reads.push(r.read);
        const c = (await getOperation('patch')!.run(cpu, input as any, {})) as any;
        close(
          g.path.grid.flat().map((x: number | null) => x ?? 0),
          c.path.grid.flat().map((x: number | null) => x ?? 0),
        );
      }
      // the receivers' values stay on the device between the senders' run and theirs: both scans read
      // the two runs' last logits and a metric per sender (before, main at 6f3c91d: 8,736 and 31,872 bytes)
      expect(reads[1]).toBe(reads[0]);
      // two heads' hook_z and a neuron's hook_post: their means copied to the device once, [1, T, ...]
      const targets = [
        { layer: 0, head: 1 },
        { layer: 1, head: 2 },
        { layer: 1, neuron: 3 },
      ];
      const mean = { prompt: '', token_ids: ids, method: 'mean', targets };
      const m1 = await counted(gpu, 'ablate', mean);
      const m2 = await counted(wide, 'ablate', mean);
      expect(m2.written - m1.written).toBe(F * T * 2 * (D2 - D));
      // resample: the other prompt's hooks copied once (a head's hook_z, a resid_pre [1, T, d_model])
      const resample = { ...mean, method: 'resample', targets: [targets[0], { layer: 1, component: 'resid_pre' }] };
      const s1 = await counted(gpu, 'ablate', resample);
      const s2 = await counted(wide, 'ablate', resample);
      expect(s2.written - s1.written).toBe(F * T * 2 * (D2 - D));
      for (const [a, b] of [
        [m1, await getOperation('ablate')!.run(cpu, mean as any, {})],
        [s1, await getOperation('ablate')!.run(cpu, resample as any, {})],
      ] as const)
        for (const k of ['logprob_delta', 'kl'])
          close(
            a.doc.entries.map((e: any) => e[k]),
            (b as any).entries.map((e: any) => e[k]),
          );
      // layer_ablation mean: every layer's attn_out and mlp_out, [1, T, d_model] each, copied once
      const l1 = await counted(gpu, 'layer_ablation', { prompt: '', token_ids: ids, method: 'mean' });
      const l2 = await counted(wide, 'layer_ablation', { prompt: '', token_ids: ids, method: 'mean' });
      expect(l2.written - l1.written).toBe(F * T * 2 * L * (D2 - D));
      expect(floatOffDevice(wide)).toEqual([]);
    }
  });

  it('integrated_gradients reduces its steps on the device: the attributions and the metric come back', async () => {
    const n = 8;
    for (const input of [
      { prompt: '', token_ids: ids, corrupted_token_ids: [5, 11, 20, 31, 40, 50], steps: n },
      { prompt: '', token_ids: ids, steps: n, baseline: 'zero' },
    ]) {
      const r = await counted(gpu, 'integrated_gradients', input);
      const w = await counted(wide, 'integrated_gradients', input);
      const corrupted = r.doc.baseline === 'corrupted';
      // the input's logits at the last position (and the corrupted run's); then one batch of the n + 1
      // steps: per position Σ (x − x') · ∂M/∂x over the steps, and each row's metric logits. Before (main
      // at 6f3c91d) x and x' came back, and every step's gradient [T, d_model] and logits row: 30,096
      // bytes for the corrupted baseline here, 2,640 now
      expect(r.read).toBe(F * ((corrupted ? 2 : 1) * V + T) + (n + 1) * row(corrupted ? [0, 0] : [0]));
      // x, x' and x − x' stay on the device; per step its α, 1 − α and seed [V] are written, not its
      // [T, d_model] input (39,640 bytes written before, 12,120 now: the seeds are 10,800 of them)
      expect(w.written).toBe(r.written);
      expect(w.read).toBe(r.read);
      const c = (await getOperation('integrated_gradients')!.run(cpu, input as any, {})) as any;
      close(
        r.doc.attributions.map((x: any) => x.attribution),
        c.attributions.map((x: any) => x.attribution),
      );
      for (const k of ['sum', 'metric_input', 'metric_baseline', 'error'])
        expect(Math.abs(r.doc.completeness[k] - c.completeness[k])).toBeLessThan(1e-4);
    }
    expect(floatOffDevice(gpu)).toEqual([]);
  });

  it('steer and sweep read back the metrics their documents hold: each row reduced to its targets, controls and KL', async () => {
    const common = { prompt: 'the cat sat', layer: 1, direction: 'random:4', max_new_tokens: 4, stop_at_eos: false };
    const tokens = { targets: ['#5', '#7'], controls: ['#9', '#11', '#13'] };
    const K = 5;
    for (const [op, input, rows] of [
      ['steer', { ...common, ...tokens, alpha: 3 }, 2],
      ['sweep', { ...common, ...tokens, alphas: [-2, 0, 2] }, 3],
    ] as const) {
      const r = await counted(gpu, op, input);
      const c = (await getOperation(op)!.run(cpu, input as any, {})) as any;
      const T = r.doc.tokens.length;
      const runs = op === 'steer' ? r.doc.generation.engine_runs : r.doc.engine_runs - 1;
      // the base run: the last position's logits and the hook's statistics (its norms per position:
      // resid_norm); then the prompt pass of every row: its argmax and the row reduced to the K token
      // ids' logits and KL from the base; then per step each row's argmax. Before (main at 6f3c91d)
      // the base run read every position's logits and the hook [T, d_model], and each row its logits
      expect(r.read).toBe(F * (V + 4 + T) + 8 + rows * row(new Array(K).fill(0), true) + 8 * rows * runs);
      const metrics = ['target_logprob_delta', 'control_logprob_delta', 'normalized_effect', 'kl_from_base'];
      if (op === 'steer') {
        for (const k of metrics) expect(Math.abs(r.doc[k] - c[k]), k).toBeLessThan(1e-4);
        expect(r.doc.steered.generated_token_ids).toEqual(c.steered.generated_token_ids);
      } else for (const k of metrics) close(r.doc.curves[k], c.curves[k]);
      expect(Math.abs(r.doc.resid_norm - c.resid_norm)).toBeLessThan(1e-4);
    }
  });

  it('generate keeps the KV cache on the device: per step the chosen token comes back (greedy)', async () => {
    const input = { prompt: 'the cat', max_new_tokens: 6, temperature: 0 };
    const r = await counted(gpu, 'generate', input);
    const c = (await getOperation('generate')!.run(cpu, input, {})) as any;
    expect(r.doc.generated_token_ids).toEqual(c.generated_token_ids);
    const steps = r.doc.generated_token_ids.length;
    expect(r.runs).toBe(steps);
    // the argmax of each step's logits, taken in the graph: one int64 (the logits were V floats a step)
    expect(r.read).toBe(8 * steps);
    // each layer's keys and values stay on the device, and are fed from there
    expect(r.deviceOutputs).toBe(2 * L * (steps - 1));
    expect(r.deviceFeeds - 2 * L * (steps - 1)).toBe(
      r.runs * 2 * gpu.hookNames().filter((h) => !h.endsWith('attn_scores')).length,
    );
    // what is written per step: the token, its position, a mask row; never the cache
    expect(r.written / r.runs).toBeLessThan(1024);
  });

  it('top-k sampling reads back the k largest logits and their ids per step, sampling as from the row', async () => {
    const input = { prompt: 'the cat', max_new_tokens: 6, temperature: 0.9, top_k: 5, top_p: 0.9, seed: 7 };
    const r = await counted(gpu, 'generate', input);
    const c = (await getOperation('generate')!.run(cpu, input, {})) as any;
    expect(r.doc.generated_token_ids).toEqual(c.generated_token_ids);
    expect(r.runs).toBe(r.doc.generated_token_ids.length);
    expect(r.read).toBe((F + 8) * 5 * r.runs);
  });

  it('sampling over the whole vocabulary (temperature, no top-k) still reads the row', async () => {
    const input = { prompt: 'the cat', max_new_tokens: 4, temperature: 0.9, seed: 7 };
    const r = await counted(gpu, 'generate', input);
    const c = (await getOperation('generate')!.run(cpu, input, {})) as any;
    expect(r.doc.generated_token_ids).toEqual(c.generated_token_ids);
    expect(r.read).toBe(F * V * r.runs);
  });

  it('attribution_graph: counted, agreeing with node, nothing but shape arithmetic off the device', async () => {
    const tc: RandomTranscoderSet = makeRandomTranscoders({
      kind: 'plt',
      nLayers: L,
      dModel: D,
      features: 32,
      skip: true,
    });
    let gpuRows: Float32Array | undefined;
    try {
      const loaders = createNodeSaeLoaders({ cache: false });
      const ctx = { loadTranscoders: loaders.loadTranscoders };
      const input = { prompt: 'the cat sat', transcoder_source: tc.dir, full_adjacency: true, slug: 'transfers' };
      const r = await counted(gpu, 'attribution_graph', input, ctx);
      expect(r.runs).toBeGreaterThan(0);
      expect(r.read).toBeGreaterThan(0);
      const c = (await getOperation('attribution_graph')!.run(cpu, input as any, ctx)) as any;
      expect(r.doc.adjacency.nodes.map((n: any) => n.node_id)).toEqual(c.adjacency.nodes.map((n: any) => n.node_id));
      close(
        r.doc.adjacency.entries.map((e: number[]) => e[2]),
        c.adjacency.entries.map((e: number[]) => e[2]),
        1e-3,
      );
      expect(floatOffDevice(gpu)).toEqual([]);

      // the rows alone, by the engine: the frozen constants and decoder vectors are written once per
      // call on the GPU (each run on node), then per run the seeds; per run B rows of the sources come back
      const ids = r.doc.tokens.map((t: any) => t.id);
      const T = ids.length;
      const id = gpu.transcoderSets()[0].id;
      for (const [m, onDevice] of [
        [gpu, true],
        [cpu, false],
      ] as const) {
        const rep = await m.replacement(ids, id, { batch: 8 });
        const P = Array.from({ length: L }, (_, l) => {
          const n = new Array(T).fill(0);
          rep.features.layer.forEach((x, i) => x === l && n[rep.features.position[i]]++);
          return Math.max(1, ...n);
        });
        const sumP = P.reduce((a, b) => a + b, 0);
        const fixed = L * H * T * T + 2 * L * T + T + T * D + L * T * D + T * sumP * D;
        const targets = [
          ...Array.from({ length: rep.features.layer.length }, (_, index) => ({ kind: 'feature' as const, index })),
          { kind: 'logit' as const, token: 7 },
        ];
        const K = targets.length;
        const runs = Math.ceil(K / 8);
        // the logit target's mean unembedding: on WebGPU Σ_v W_U[:, v] is one run of the forward's readout
        // (its traffic measured here on its own), elsewhere a pass in JavaScript
        const s0 = m.memory().transfers!;
        await m.weightProducts({ unembedSum: true });
        const s1 = m.memory().transfers!;
        const extra = (k: 'runs' | 'written_bytes' | 'read_bytes' | 'device_feeds') =>
          (s1[k] as number) - (s0[k] as number);
        expect(extra('runs')).toBe(onDevice ? 1 : 0);
        expect(extra('read_bytes')).toBe(onDevice ? F * D : 0);
        const before = m.memory().transfers!;
        const rows = await rep.rows(targets);
        const after = m.memory().transfers!;
        expect(after.runs - before.runs).toBe(runs + extra('runs'));
        const seeds = F * K * (D + (L + 1) * T);
        expect(after.written_bytes - before.written_bytes).toBe(
          seeds + F * fixed * (onDevice ? 1 : runs) + extra('written_bytes'),
        );
        expect(after.read_bytes - before.read_bytes).toBe(F * K * (T + L * T + T * sumP) + extra('read_bytes'));
        expect(after.device_feeds - before.device_feeds).toBe((onDevice ? runs * (6 + L) : 0) + extra('device_feeds'));
        if (m === gpu) gpuRows = rows;
        else close(Array.from(rows), Array.from(gpuRows!), 1e-3);
      }
    } finally {
      tc.cleanup();
    }
  });

  it('attribution_graph pruned on the device: the influence and the kept edges come back, not the rows', async () => {
    for (const kind of ['plt', 'clt'] as const) {
      const tc = makeRandomTranscoders({ kind, nLayers: L, dModel: D, features: 32, skip: kind === 'plt' });
      try {
        const loaders = createNodeSaeLoaders({ cache: false });
        const ctx = { loadTranscoders: loaders.loadTranscoders };
        const prompt = 'the cat sat on the mat and';
        const input = { prompt, transcoder_source: tc.dir, slug: 'device', edge_threshold: 0.9 };
        const r = await counted(gpu, 'attribution_graph', input, ctx);
        const c = (await getOperation('attribution_graph')!.run(cpu, input as any, ctx)) as any;
        const g = r.doc.graph,
          h = c.graph;
        // the same nodes and links as node's float64 pruning of the rows read back, weights within float32
        expect(g.nodes.map((n: any) => n.node_id)).toEqual(h.nodes.map((n: any) => n.node_id));
        expect(g.links.map((l: any) => `${l.source}>${l.target}`)).toEqual(
          h.links.map((l: any) => `${l.source}>${l.target}`),
        );
        close(
          g.links.map((l: any) => l.weight),
          h.links.map((l: any) => l.weight),
          1e-3,
        );
        close(
          g.nodes.map((n: any) => n.influence ?? 0),
          h.nodes.map((n: any) => n.influence ?? 0),
          1e-4,
        );
        close([r.doc.scores.replacement, r.doc.scores.completeness], [c.scores.replacement, c.scores.completeness]);
        const rel = (a: number, b: number) => Math.abs(a - b) / Math.max(Math.abs(b), 1e-30);
        expect(rel(r.doc.pruning.node_score_threshold, c.pruning.node_score_threshold)).toBeLessThan(1e-4);
        expect(rel(r.doc.pruning.edge_score_threshold, c.pruning.edge_score_threshold)).toBeLessThan(1e-4);
        // the op reads back less than with the rows read back and pruned in JS (full_adjacency takes that path)
        const host = await counted(gpu, 'attribution_graph', { ...input, full_adjacency: true }, ctx);
        expect(host.doc.graph.links).toEqual(h.links.map((l: any) => ({ ...l, weight: expect.any(Number) })));
        expect(r.read).toBeLessThan(host.read);

        // the engine's part alone: per kept edge an index (int64) and a weight, and per node a few floats
        const ids = r.doc.tokens.map((t: any) => t.id);
        const T = ids.length;
        const rep = await gpu.replacement(ids, gpu.transcoderSets().at(-1)!.id, { batch: 8 });
        const nAct = rep.features.layer.length;
        const logits = r.doc.logit_nodes.map((l: any) => ({ token: l.token, prob: l.prob }));
        await rep.rows(logits.map((l: any) => ({ kind: 'logit', token: l.token }))); // the logit vectors, made once
        const S = nAct + L * T + T;
        const nR = nAct + logits.length;
        const before = gpu.memory().transfers!;
        const d = (await rep.pruneOnDevice!({
          logits,
          nodeMask: (inf) => Uint8Array.from({ length: S }, (_, i) => (i >= nAct + L * T || inf[i] > 0 ? 1 : 0)),
          edgeThreshold: 0.9,
        }))!;
        const after = gpu.memory().transfers!;
        const K = d.edges!.row.length;
        expect(K).toBeGreaterThan(0);
        // the influence [S], each row's error mass [nR], two vanishing terms, the threshold, the count
        expect(after.read_bytes - before.read_bytes).toBe(F * (S + nR + 3) + 8 + 12 * K);
        // the rows had they come back (the readouts of every row: embedding, errors, padded decoder slots)
        const P = Array.from({ length: L }, (_, l) => {
          const n = new Array(T).fill(0);
          rep.features.layer.forEach((x, i) => (kind === 'plt' ? x === l : x <= l) && n[rep.features.position[i]]++);
          return Math.max(1, ...n);
        });
        const rowBytes = F * nR * (T + L * T + T * P.reduce((a, b) => a + b, 0));
        expect(after.read_bytes - before.read_bytes).toBeLessThan(rowBytes / 4);
        expect(Object.keys(rep.stats.off_device_ops!).filter((k) => !k.endsWith(':int64'))).toEqual([]);
        // max_feature_nodes: the partial influence over the rows so far read back per ranking ([S] and its
        // vanishing term), then the same over the 10 features chosen
        let asked = false;
        const b2 = gpu.memory().transfers!;
        const d10 = (await rep.pruneOnDevice!({
          logits,
          maxFeatures: 10,
          next: async (partial) => {
            if (asked) return [];
            asked = true;
            const inf = await partial();
            expect(inf.length).toBe(S);
            return Array.from({ length: nAct }, (_, i) => i)
              .sort((a, b) => inf[b] - inf[a] || a - b)
              .slice(0, 10);
          },
          nodeMask: (inf) => Uint8Array.from(inf, (x, i) => (i >= 10 + L * T || x > 0 ? 1 : 0)),
          edgeThreshold: 0.9,
        }))!;
        const a2 = gpu.memory().transfers!;
        expect(d10.selected.length).toBe(10);
        const S10 = 10 + L * T + T;
        expect(a2.read_bytes - b2.read_bytes).toBe(
          F * (S + 1) + F * (S10 + 10 + logits.length + 3) + 8 + 12 * d10.edges!.row.length,
        );
        // the kept edges' weights against the rows read back
        const rows = await rep.rows([
          ...Array.from({ length: nAct }, (_, index) => ({ kind: 'feature' as const, index })),
          ...logits.map((l: any) => ({ kind: 'logit' as const, token: l.token })),
        ]);
        for (let k = 0; k < K; k++)
          expect(Math.abs(d.edges!.weight[k] - rows[d.edges!.row[k] * S + d.edges!.source[k]])).toBeLessThan(1e-5);
      } finally {
        tc.cleanup();
      }
    }
  });
});

describe('edge_attribution on WebGPU (node): the corrupted outputs stay on the device', () => {
  let gpu: LoadedModel;
  let cpu: LoadedModel;
  beforeAll(async () => {
    const dir = realpathSync(path.join(SHARED, 'models/induction-gpt2'));
    gpu = await loadModelNode(dir, { backend: 'webgpu' });
    cpu = await loadModelNode(dir);
  }, 120_000);
  afterAll(async () => {
    await gpu?.dispose();
    await cpu?.dispose();
  });

  it('eap: one corrupted forward and one gradient run per batch; node outputs neither read back nor written', async () => {
    const input = { generate: { task: 'induction', n: 2, seed: 3, length: 8 }, method: 'eap' };
    const r = await counted(gpu, 'edge_attribution', input);
    const c = await counted(cpu, 'edge_attribution', input);
    const { n_layers: L, n_heads: H, d_model: D, d_vocab: V } = gpu.info;
    const Nf = 1 + L * (H + 1);
    const Nb = L * (3 * H + 1) + 1;
    const B = 2;
    const T = 16; // BOS, the sequence of 8, then its first 7 again
    expect(r.doc.edges.length).toBe(110);
    // the forward and the gradient run: ids, the logit position, positions, the mask, the weights (one
    // row, then B), the default source of the forward [1, Nf, 1, 1], κ (a GPU scalar on WebGPU); the
    // gradient run also the gate and the seed, and on node the corrupted outputs as its source
    const common = 8 * B * T + 8 + 8 * T + F * T * T;
    const outputs = F * B * Nf * T * D;
    for (const [x, dev] of [
      [r, true],
      [c, false],
    ] as const) {
      expect(x.runs).toBe(2);
      expect(x.written).toBe(
        2 * common + F * Nf * Nb + F * B * Nf * Nb + 2 * F * Nf + F * B * V + (dev ? 0 : outputs + 2 * F),
      );
      expect(x.read).toBe(F * (2 * B * V + B * Nf * Nb) + (dev ? 0 : outputs));
    }
    expect(r.deviceOutputs).toBe(1);
    close(
      r.doc.edges.map((e: any) => e.score),
      c.doc.edges.map((e: any) => e.score),
    );
    expect(r.doc.m_clean).toBeCloseTo(c.doc.m_clean, 4);
  });

  it('eap_ig_inputs: each pair fed its difference corrupted − clean, made on the device', async () => {
    const m = 5;
    const input = { generate: { task: 'induction', n: 2, seed: 3, length: 8 }, method: 'eap_ig_inputs', ig_steps: m };
    const r = await counted(gpu, 'edge_attribution', input);
    const c = (await getOperation('edge_attribution')!.run(cpu, input as any, {})) as any;
    const { n_layers: L, n_heads: H, d_vocab: V } = gpu.info;
    const Nf = 1 + L * (H + 1);
    const Nb = L * (3 * H + 1) + 1;
    const B = 2;
    const T = 16;
    const common = (rows: number) => 8 * rows * T + 8 + 8 * T + F * T * T;
    // the corrupted and the clean forward (their outputs kept); the m rows of weights copied to the
    // device once (the same for every pair); per pair the difference (its row index written) and one
    // gradient run of m rows: gate and seed written, the weights and the difference fed from the device.
    // Before (main at 6f3c91d) each pair's run wrote its weights: B · F·m·Nf·Nb
    expect(r.runs).toBe(2 + 2 * B);
    expect(r.deviceOutputs).toBe(2 + B);
    expect(r.written).toBe(
      2 * (common(B) + F * Nf * Nb + F * Nf) + B * 8 + F * m * Nf * Nb + B * (common(m) + F * Nf + F * m * V),
    );
    // the logits of each forward, and per pair ∂M/∂w summed over its m rows on the device (no logits)
    expect(r.read).toBe(2 * F * B * V + B * F * Nf * Nb);
    close(
      r.doc.edges.map((e: any) => e.score),
      c.edges.map((e: any) => e.score),
    );
  });

  it('eap_ig_activations: the rows of weights and gates copied to the device once, fed to every pair', async () => {
    const m = 2;
    const input = {
      generate: { task: 'induction', n: 2, seed: 3, length: 8 },
      method: 'eap_ig_activations',
      ig_steps: m,
    };
    const r = await counted(gpu, 'edge_attribution', input);
    const c = (await getOperation('edge_attribution')!.run(cpu, input as any, {})) as any;
    const { n_layers: L, n_heads: H, d_vocab: V } = gpu.info;
    const Nf = 1 + L * (H + 1);
    const Nb = L * (3 * H + 1) + 1;
    const B = 2;
    const T = 16;
    const common = (rows: number) => 8 * rows * T + 8 + 8 * T + F * T * T;
    // a row per (group: the embedding, each layer's heads, each layer's MLP; step), in runs of at most 64
    const rows = (1 + 2 * L) * m;
    const runs = Array.from({ length: Math.ceil(rows / 64) }, (_, i) => Math.min(64, rows - 64 * i));
    // the forwards as for eap_ig_inputs; weights and gates once; per pair and run the tokens and the seed
    expect(r.written).toBe(
      2 * (common(B) + F * Nf * Nb + F * Nf) +
        B * 8 +
        F * rows * (Nf * Nb + Nf) +
        B * runs.reduce((s, k) => s + common(k) + F * k * V, 0),
    );
    expect(r.read).toBe(2 * F * B * V + B * runs.length * F * Nf * Nb);
    close(
      r.doc.edges.map((e: any) => e.score),
      c.edges.map((e: any) => e.score),
    );
  });
});
