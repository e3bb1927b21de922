/**
 * The readout graph: DLA's products with W_O and W_out on the backend, in a second onnxruntime
 * session, where choose.ts picks it (each product is a pass over a weight matrix; in ORT they run
 * multi-threaded and vectorised, with the weights in the layout they are stored in, never copied
 * or transposed). Inputs with a zero-length axis cost nothing, so one graph serves every
 * combination:
 *
 *   z          float [L, N, H·Dh]  → attn_x    [L, N, D]     z_l · W_O_l        (N = 0 or 1)
 *   post       float [L, P, M]     → mlp_x     [L, P, D]     post_l · W_out_l   (P = 0 or 1)
 *   attn_dirs  float [L, K, D]     → attn_dir  [L, K, H·Dh]  rows of W_O_l · e  (K directions per layer)
 *   mlp_dirs   float [L, K', D]    → mlp_dir   [L, K', M]    rows of W_out_l · e
 *
 * The unembedding's products are never in this graph: unembed.ts reads them in JavaScript.
 * (W_O, W_out, W_U in TransformerLens orientation: [H·Dh, D], [M, D], [D, V].)
 */
import { OnnxGraph } from '../graph/onnx-builder';
import type { BuiltGraph } from '../graph/build-model';
import type { LayerSpec, LinearRef, ModelSpec } from '../spec';
import type { TensorEntry } from '../safetensors-types';
import type { Tensor } from '../tensor';
import type { WeightProducts, WeightProductsInput } from '../api';
import type { OrtTensorLike } from '../runtime/ort-session';
import type { WeightPrecision } from '../precision';
import { checkReadoutInput } from './input';

export function buildReadoutGraph(
  spec: ModelSpec,
  tensors: Map<string, TensorEntry>,
  location: (file: string) => string = (f) => f,
  precision: WeightPrecision = 'f32',
): BuiltGraph {
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
  const forward = (x: string, ref: LinearRef) =>
    g.o('Gemm', [x, W(ref.w, x)], ref.layout === 'out_in' ? { transB: 1 } : {});
  /** d [K, out] → d · Wᵀ [K, in]: the rows of W dotted with each direction */
  const backward = (d: string, ref: LinearRef) =>
    g.o('Gemm', [d, W(ref.w, d)], ref.layout === 'out_in' ? {} : { transB: 1 });
  /** output `name`: one product per layer, stacked on a new first axis */
  const stack = (name: string, perLayer: (s: LayerSpec, l: number) => string) => {
    g.rename(
      g.concat(
        spec.layers.map((s, l) => g.o('Unsqueeze', [perLayer(s, l), g.constI([0])])),
        0,
      ),
      name,
    );
    g.output(name);
  };
  // a mixture-of-experts layer has no one W_out, a linear-attention layer no W_O: zeros [rows, n]
  const zeros = (x: string, n: number) =>
    g.o('ConstantOfShape', [g.o('Concat', [g.o('Shape', [x], { start: 0, end: 1 }), g.constI([n])], { axis: 0 })], {
      value: { tensor: { dims: [1], floats: [0] } },
    });
  stack('attn_x', (s, l) => (s.attn ? forward(layerOf(z, l), s.attn.o) : zeros(layerOf(z, l), D)));
  stack('mlp_x', (s, l) => (s.mlp ? forward(layerOf(post, l), s.mlp.down) : zeros(layerOf(post, l), D)));
  stack('attn_dir', (s, l) =>
    s.attn ? backward(layerOf(attnDirs, l), s.attn.o) : zeros(layerOf(attnDirs, l), H * Dh),
  );
  stack('mlp_dir', (s, l) => (s.mlp ? backward(layerOf(mlpDirs, l), s.mlp.down) : zeros(layerOf(mlpDirs, l), M)));
  // no pre-packing: it keeps a packed copy of each float32 weight per Gemm (here two per weight,
  // one per orientation) for products of one or two rows, where it gains nothing (bench/memory.ts)
  return g.built([], { disable_prepacking: '1' });
}

export const READOUT_OUTPUTS = ['attn_x', 'mlp_x', 'attn_dir', 'mlp_dir'];

export type MakeTensor = (
  type: 'float32' | 'int64',
  data: Float32Array | BigInt64Array,
  dims: number[],
) => OrtTensorLike;

/**
 * The readout graph's feeds for an input (validated: a wrong shape is BAD_INPUT, not an ORT error).
 * `noEmpty`: onnxruntime-web's WebGPU Gemm refuses zero-length inputs, so there an absent input is
 * one row of zeros (a wasted product) and `readoutResult` drops what it gave.
 */
export function readoutFeeds(
  spec: ModelSpec,
  input: WeightProductsInput,
  tensor: MakeTensor,
  noEmpty = false,
): Record<string, OrtTensorLike> {
  const { nLayers: L, dModel: D, nHeads: H, dHead: Dh, dMlp: M } = spec;
  checkReadoutInput(spec, input);
  const f = (t: Tensor | undefined, inner: number) =>
    t
      ? tensor('float32', t.data, t.dims)
      : noEmpty
        ? tensor('float32', new Float32Array(L * inner), [L, 1, inner])
        : tensor('float32', new Float32Array(0), [L, 0, inner]);
  return {
    z: f(input.z, H * Dh),
    post: f(input.post, M),
    attn_dirs: f(input.attnDirs, D),
    mlp_dirs: f(input.mlpDirs, D),
  };
}

/**
 * The products asked for: the readout graph's (`out`: its outputs; absent when none was asked
 * for, so no session ran) and the unembedding's. With `noEmpty`, what the zero rows gave is dropped.
 */
export function readoutResult(
  spec: ModelSpec,
  out: Record<string, OrtTensorLike> | undefined,
  input: WeightProductsInput,
  unembed: Pick<WeightProducts, 'unembedRows' | 'unembedSum' | 'unembedDots'>,
): WeightProducts {
  const { nLayers: L, dModel: D, nHeads: H, dHead: Dh, dMlp: M } = spec;
  const t = (name: string, given: boolean, inner: number): Tensor => {
    if (given && out) return { dims: [...out[name].dims], data: out[name].data as Float32Array };
    return { dims: [L, 0, inner], data: new Float32Array(0) };
  };
  return {
    attnX: t('attn_x', !!input.z, D),
    mlpX: t('mlp_x', !!input.post, D),
    attnDir: t('attn_dir', !!input.attnDirs, H * Dh),
    mlpDir: t('mlp_dir', !!input.mlpDirs, M),
    ...unembed,
  };
}
