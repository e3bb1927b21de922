/**
 * The weight-products graph: the matrix products with the stored weights that direct logit
 * attribution needs once the forward has run, on the backend instead of in JavaScript (each one
 * is a pass over a weight matrix; in ORT they run multi-threaded and vectorised, with the weights
 * in the layout they are stored in, never copied or transposed). Inputs with a zero-length axis
 * cost nothing, so one graph serves every combination:
 *
 *   z          float [L, N, H·Dh]  → attn_x    [L, N, D]     z_l · W_O_l        (N = 0 or 1)
 *   post       float [L, P, M]     → mlp_x     [L, P, D]     post_l · W_out_l   (P = 0 or 1)
 *   attn_dirs  float [L, K, D]     → attn_dir  [L, K, H·Dh]  rows of W_O_l · e  (K directions per layer)
 *   mlp_dirs   float [L, K', D]    → mlp_dir   [L, K', M]    rows of W_out_l · e
 *   unembed_ids int64 [I]          → unembed_rows [I, D]    W_U[:, t] for each id
 *   sum_weights float [J, V]       → unembed_sum  [D]       Σ_j Σ_v w_jv W_U[:, v] (J = 1, ones: the vocabulary mean × V)
 *
 * (W_O, W_out, W_U in TransformerLens orientation: [H·Dh, D], [M, D], [D, V].)
 */
import { OnnxGraph } from './onnx-builder';
import type { BuiltGraph } from './build-model';
import type { LinearRef, ModelSpec } from '../spec';
import type { TensorEntry } from '../safetensors-types';
import type { Tensor } from '../tensor';
import type { WeightProducts, WeightProductsInput } from '../api';

export type { WeightProducts, WeightProductsInput } from '../api';
import type { OrtTensorLike } from '../runtime/session';
import { LoupeError } from '../errors';
import type { WeightPrecision } from '../precision';
import { lookupRows, vocabChunks, weightedRowSum } from './vocab';

export function buildReadoutGraph(spec: ModelSpec, tensors: Map<string, TensorEntry>, location: (file: string) => string = (f) => f, precision: WeightPrecision = 'f32', vocabRows?: number): BuiltGraph {
  const g = new OnnxGraph(location, precision);
  const entry = (name: string) => {
    const e = tensors.get(name);
    if (!e) throw new Error(`graph: tensor ${name} not in weight index`);
    return e;
  };
  /** `after`: the input the weight multiplies (orders the widening of stored weights, see OnnxGraph.weight) */
  const W = (name: string, after?: string) => g.weight(entry(name), after);
  const { nLayers: L, dModel: D, nHeads: H, dHead: Dh, dMlp: M } = spec;
  const z = g.input('z', 'float', [L, 'N', H * Dh]);
  const post = g.input('post', 'float', [L, 'P', M]);
  const attnDirs = g.input('attn_dirs', 'float', [L, 'K', D]);
  // its own symbolic length: ORT plans buffer reuse as if inputs sharing a dim_param had equal sizes,
  // and a call with attn_dirs only (mlp_dirs empty) failed with 'Shape mismatch attempting to re-use buffer'
  const mlpDirs = g.input('mlp_dirs', 'float', [L, 'Km', D]);
  const layerOf = (x: string, l: number) => g.o('Gather', [x, g.constI([l], [])], { axis: 0 });
  /** x [N, in] → x · W [N, out] (W the TL-orientation [in, out] map) */
  const forward = (x: string, ref: LinearRef) => g.o('Gemm', [x, W(ref.w, x)], ref.layout === 'out_in' ? { transB: 1 } : {});
  /** d [K, out] → d · Wᵀ [K, in]: the rows of W dotted with each direction */
  const backward = (d: string, ref: LinearRef) => g.o('Gemm', [d, W(ref.w, d)], ref.layout === 'out_in' ? {} : { transB: 1 });
  const stack = (parts: string[], name: string) => {
    g.rename(g.o('Concat', parts.map((p) => g.o('Unsqueeze', [p, g.constI([0])])), { axis: 0 }), name);
    g.output(name);
  };
  stack(spec.layers.map((s, l) => forward(layerOf(z, l), s.attn.o)), 'attn_x');
  stack(spec.layers.map((s, l) => forward(layerOf(post, l), s.mlp.down)), 'mlp_x');
  stack(spec.layers.map((s, l) => backward(layerOf(attnDirs, l), s.attn.o)), 'attn_dir');
  stack(spec.layers.map((s, l) => backward(layerOf(mlpDirs, l), s.mlp.down)), 'mlp_dir');
  // the unembedding is stored [V, D] (the lens graph multiplies by its transpose), in vocabulary
  // chunks (vocab.ts): the sum is a product with a row of ones, so no [V, D] float32 copy is gathered
  const WU = vocabChunks(entry(spec.unembed.w), vocabRows);
  g.rename(lookupRows(g, WU, g.input('unembed_ids', 'int64', ['I'])), 'unembed_rows');
  g.output('unembed_rows');
  g.rename(weightedRowSum(g, WU, g.input('sum_weights', 'float', ['J', spec.dVocab])), 'unembed_sum');
  g.output('unembed_sum');
  return { bytes: g.encode(), inputNames: g.inputNames(), outputNames: g.outputNames(), sites: [], precision, weightBytes: g.weightBytes() };
}

export const READOUT_OUTPUTS = ['attn_x', 'mlp_x', 'attn_dir', 'mlp_dir', 'unembed_rows', 'unembed_sum'];

type MakeTensor = (type: 'float32' | 'int64', data: Float32Array | BigInt64Array, dims: number[]) => OrtTensorLike;

/**
 * The readout graph's feeds for an input (validated: a wrong shape is BAD_INPUT, not an ORT error).
 * `noEmpty`: onnxruntime-web's WebGPU Gemm refuses zero-length inputs, so there an absent input is
 * one row of zeros (a wasted product) and `readoutResult` drops what it gave.
 */
export function readoutFeeds(spec: ModelSpec, input: WeightProductsInput, tensor: MakeTensor, noEmpty = false): Record<string, OrtTensorLike> {
  const { nLayers: L, dModel: D, nHeads: H, dHead: Dh, dMlp: M, dVocab: V } = spec;
  const f = (name: string, t: Tensor | undefined, inner: number) => {
    if (!t) return noEmpty ? tensor('float32', new Float32Array(L * inner), [L, 1, inner]) : tensor('float32', new Float32Array(0), [L, 0, inner]);
    if (t.dims.length !== 3 || t.dims[0] !== L || t.dims[2] !== inner || t.data.length !== L * t.dims[1] * inner) {
      throw new LoupeError('BAD_INPUT', `weightProducts: ${name} must be [${L}, n, ${inner}], got [${t.dims}].`);
    }
    return tensor('float32', t.data, t.dims);
  };
  const given = input.unembedIds ?? [];
  for (const id of given) if (!Number.isInteger(id) || id < 0 || id >= V) throw new LoupeError('BAD_TOKEN_ID', `Token id ${id} is outside the vocabulary (0..${V - 1}).`);
  const ids = given.length === 0 && noEmpty ? [0] : given;
  const sumRows = input.unembedSum ? 1 : noEmpty ? 1 : 0;
  const sumWeights = new Float32Array(sumRows * V).fill(input.unembedSum ? 1 : 0);
  return {
    z: f('z', input.z, H * Dh),
    post: f('post', input.post, M),
    attn_dirs: f('attnDirs', input.attnDirs, D),
    mlp_dirs: f('mlpDirs', input.mlpDirs, D),
    unembed_ids: tensor('int64', BigInt64Array.from(ids.map(BigInt)), [ids.length]),
    sum_weights: tensor('float32', sumWeights, [sumRows, V]),
  };
}

/** the products asked for (with `noEmpty`, what the zero rows gave is dropped: empty, or zeros for unembedSum) */
export function readoutResult(out: Record<string, OrtTensorLike>, input: WeightProductsInput): WeightProducts {
  const t = (name: string, given: boolean): Tensor => {
    const dims = [...out[name].dims];
    if (given) return { dims, data: out[name].data as Float32Array };
    return name === 'unembed_sum' ? { dims, data: new Float32Array(dims[0]) } : { dims: dims.map((d, i) => (i === dims.length - 2 ? 0 : d)), data: new Float32Array(0) };
  };
  return {
    attnX: t('attn_x', !!input.z), mlpX: t('mlp_x', !!input.post), attnDir: t('attn_dir', !!input.attnDirs), mlpDir: t('mlp_dir', !!input.mlpDirs),
    unembedRows: t('unembed_rows', (input.unembedIds ?? []).length > 0), unembedSum: t('unembed_sum', !!input.unembedSum),
  };
}
