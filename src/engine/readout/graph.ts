/**
 * The readout graph: DLA's products with W_O and W_out on the backend, in a second onnxruntime
 * session (or, on WebGPU, in the forward graph: addForwardReadout), where choose.ts picks it (each product is a pass over a weight matrix; in ORT they run
 * multi-threaded and vectorised, with the weights in the layout they are stored in, never copied
 * or transposed). Inputs with a zero-length axis cost nothing, so one graph serves every
 * combination:
 *
 *   z          float [L, N, H·Dh]  → attn_x    [L, N, D]     z_l · W_O_l        (N = 0 or 1)
 *   post       float [L, P, M]     → mlp_x     [L, P, D]     post_l · W_out_l   (P = 0 or 1)
 *   attn_dirs  float [L, K, D]     → attn_dir  [L, K, H·Dh]  rows of W_O_l · e  (K directions per layer)
 *   mlp_dirs   float [L, K', D]    → mlp_dir   [L, K', M]    rows of W_out_l · e
 *
 * The unembedding's products are not in this graph: unembed.ts reads them in JavaScript, but in the
 * forward graph (addForwardReadout) the sum of W_U's columns and the dots with every token are taken
 * on the device.
 * (W_O, W_out, W_U in TransformerLens orientation: [H·Dh, D], [M, D], [D, V].)
 */
import { OnnxGraph } from '../graph/onnx-builder';
import type { BuiltGraph } from '../graph/onnx-builder';
import { readoutWidths, type LayerSpec, type LinearRef, type ModelSpec } from '../spec';
import type { TensorEntry } from '../safetensors-types';
import type { Tensor } from '../tensor';
import type { WeightProducts, WeightProductsInput } from '../api';
import type { OrtTensorLike } from '../runtime/ort-session';
import type { WeightPrecision } from '../precision';
import { checkReadoutInput } from './input';
import { unembedRows, vocabChunks } from '../graph/vocab';

export function buildReadoutGraph(
  spec: ModelSpec,
  tensors: Map<string, TensorEntry>,
  location: (file: string) => string = (f) => f,
  precision: WeightPrecision = 'f32',
): BuiltGraph {
  const g = new OnnxGraph(location, precision);
  const inputs = readoutInputs(g, spec, '');
  const out = readoutNodes(g, spec, tensors, inputs);
  for (const name of READOUT_OUTPUTS as ReadoutOutput[]) {
    g.rename(out[name], name);
    g.output(name);
  }
  // no pre-packing: it keeps a packed copy of each float32 weight per Gemm (here two per weight,
  // one per orientation) for products of one or two rows, where it gains nothing (bench/memory.ts)
  return g.built([], { disable_prepacking: '1' });
}

type ReadoutInputs = Record<'z' | 'post' | 'attn_dirs' | 'mlp_dirs', string>;

/** the products' inputs, named `prefix` + z, post, attn_dirs, mlp_dirs */
function readoutInputs(g: OnnxGraph, spec: ModelSpec, prefix: string): ReadoutInputs {
  const { nLayers: L, dModel: D } = spec;
  const { HD, M } = readoutWidths(spec);
  return {
    z: g.input(`${prefix}z`, 'float', [L, 'N', HD]),
    post: g.input(`${prefix}post`, 'float', [L, 'P', M]),
    attn_dirs: g.input(`${prefix}attn_dirs`, 'float', [L, 'K', D]),
    // its own symbolic length: ORT plans buffer reuse as if inputs sharing a dim_param had equal sizes,
    // and a call with attn_dirs only (mlp_dirs empty) failed with 'Shape mismatch attempting to re-use buffer'
    mlp_dirs: g.input(`${prefix}mlp_dirs`, 'float', [L, 'Km', D]),
  };
}

/** The products on g (a graph, or the body of an If whose weights are its outer graph's), by output. */
function readoutNodes(
  g: OnnxGraph,
  spec: ModelSpec,
  tensors: Map<string, TensorEntry>,
  inputs: ReadoutInputs,
): Record<ReadoutOutput, string> {
  const entry = (name: string) => {
    const e = tensors.get(name);
    if (!e) throw new Error(`graph: tensor ${name} not in weight index`);
    return e;
  };
  /** `after`: the input the weight multiplies (orders the widening of stored weights, see OnnxGraph.weight) */
  const W = (name: string, after?: string) => g.weight(entry(name), after);
  const { dModel: D } = spec;
  const { hd, m, HD, M } = readoutWidths(spec);
  const layerOf = (x: string, l: number) => g.o('Gather', [x, g.constI([l], [])], { axis: 0 });
  /** a layer narrower than the stack (Gemma 4): its first n columns in, its n columns zero-padded out */
  const narrow = (x: string, n: number, of: number) =>
    n === of ? x : g.o('Slice', [x, g.constI([0]), g.constI([n]), g.constI([1])]);
  const widen = (x: string, n: number, of: number) => (n === of ? x : g.o('Pad', [x, g.constI([0, 0, 0, of - n])]));
  /** x [N, in] → x · W [N, out] (W the TL-orientation [in, out] map) */
  const forward = (x: string, ref: LinearRef) =>
    g.o('Gemm', [x, W(ref.w, x)], ref.layout === 'out_in' ? { transB: 1 } : {});
  /** d [K, out] → d · Wᵀ [K, in]: the rows of W dotted with each direction */
  const backward = (d: string, ref: LinearRef) =>
    g.o('Gemm', [d, W(ref.w, d)], ref.layout === 'out_in' ? {} : { transB: 1 });
  /** one product per layer, stacked on a new first axis */
  const stack = (perLayer: (s: LayerSpec, l: number) => string) =>
    g.concat(
      spec.layers.map((s, l) => g.o('Unsqueeze', [perLayer(s, l), g.constI([0])])),
      0,
    );
  // a mixture-of-experts layer has no one W_out, a linear-attention layer no W_O: zeros [rows, n]
  const zeros = (x: string, n: number) =>
    g.o('ConstantOfShape', [g.o('Concat', [g.o('Shape', [x], { start: 0, end: 1 }), g.constI([n])], { axis: 0 })], {
      value: { tensor: { dims: [1], floats: [0] } },
    });
  const { z, post, attn_dirs: attnDirs, mlp_dirs: mlpDirs } = inputs;
  return {
    attn_x: stack((s, l) => (s.attn ? forward(narrow(layerOf(z, l), hd[l], HD), s.attn.o) : zeros(layerOf(z, l), D))),
    mlp_x: stack((s, l) =>
      s.mlp ? forward(narrow(layerOf(post, l), m[l], M), s.mlp.down) : zeros(layerOf(post, l), D),
    ),
    attn_dir: stack((s, l) =>
      s.attn ? widen(backward(layerOf(attnDirs, l), s.attn.o), hd[l], HD) : zeros(layerOf(attnDirs, l), HD),
    ),
    mlp_dir: stack((s, l) =>
      s.mlp ? widen(backward(layerOf(mlpDirs, l), s.mlp.down), m[l], M) : zeros(layerOf(mlpDirs, l), M),
    ),
  };
}

/** the inputs the forward graph takes the readout by (addForwardReadout): READOUT_OUTPUTS' inputs under this prefix */
export const FORWARD_READOUT_PREFIX = 'readout.';
/** the forward graph's int64 [] input: 1 runs the readout products, 0 (every forward) skips them */
export const FORWARD_READOUT_FLAG = 'readout';

/**
 * The readout products in the forward graph (WebGPU, choose.ts 'forward'): onnxruntime's
 * WebGPU provider gives each session its own copy of its weights, so the products use the
 * forward's, in the then-branch of an If on FORWARD_READOUT_FLAG (the provider runs If and its
 * branches; a forward's flag is 0 and the else-branch gives empty outputs, so a forward computes
 * no product and widens no weight for them). Outputs READOUT_OUTPUTS.
 */
export function addForwardReadout(
  g: OnnxGraph,
  spec: ModelSpec,
  tensors: Map<string, TensorEntry>,
  vocabRows?: number,
): void {
  const { nLayers: L, dModel: D } = spec;
  const { HD, M } = readoutWidths(spec);
  const inputs = readoutInputs(g, spec, FORWARD_READOUT_PREFIX);
  const flag = g.o('Cast', [g.input(FORWARD_READOUT_FLAG, 'int64', [])], { to: 9 }); // bool
  const then = g.bodyWithWeights('rot_');
  const products = readoutNodes(then, spec, tensors, inputs);
  const other = g.body('roe_');
  const widths: Record<string, number> = { attn_x: D, mlp_x: D, attn_dir: HD, mlp_dir: M };
  for (const name of READOUT_OUTPUTS as ReadoutOutput[]) {
    then.output(then.rename(then.o('Identity', [products[name]]), `rot_${name}`));
    const empty = other.o('ConstantOfShape', [other.constI([L, 0, widths[name]])], {
      value: { tensor: { dims: [1], floats: [0] } },
    });
    other.output(other.rename(other.o('Identity', [empty]), `roe_${name}`));
  }
  const outs = g.op(
    'If',
    [flag],
    { then_branch: { graph: then }, else_branch: { graph: other } },
    READOUT_OUTPUTS.length,
  );
  READOUT_OUTPUTS.forEach((name, i) => {
    g.rename(outs[i], name);
    g.output(name);
  });
  // Σ_v W_U[:, v] (float32 sums on the device, over the table as the forward holds it), in an If of
  // its own: asked for once per model (DLA's centring)
  const table = vocabChunks(tensors.get(spec.unembed.w)!, vocabRows);
  const sumFlag = g.o('Cast', [g.input(FORWARD_READOUT_PREFIX + UNEMBED_SUM, 'int64', [])], { to: 9 });
  const sumThen = g.bodyWithWeights('rus_');
  let sum = '';
  for (const c of table) {
    const part = sumThen.o('ReduceSum', [sumThen.weight(c, sum || undefined), sumThen.constI([0])], { keepdims: 0 });
    sum = sum ? sumThen.o('Add', [sum, part]) : part;
  }
  sumThen.output(sumThen.rename(sumThen.o('Identity', [sum]), `rus_${UNEMBED_SUM}`));
  const sumElse = g.body('rue_');
  const noSum = sumElse.o('ConstantOfShape', [sumElse.constI([0])], { value: { tensor: { dims: [1], floats: [0] } } });
  sumElse.output(sumElse.rename(sumElse.o('Identity', [noSum]), `rue_${UNEMBED_SUM}`));
  const [total] = g.op('If', [sumFlag], { then_branch: { graph: sumThen }, else_branch: { graph: sumElse } }, 1);
  g.rename(total, UNEMBED_SUM);
  g.output(UNEMBED_SUM);
  // x · W_U [S, V] for S vectors x [S, D] (unembedDots: float32 sums on the device), in an If of its own
  const x = g.input(FORWARD_READOUT_PREFIX + UNEMBED_X, 'float', ['unembed_S', D]);
  const dotsFlag = g.o('Cast', [g.input(FORWARD_READOUT_PREFIX + UNEMBED_DOTS, 'int64', [])], { to: 9 });
  const dotsThen = g.bodyWithWeights('rud_');
  const dots = unembedRows(dotsThen, table, undefined, x); // `s d, v d -> s v`
  dotsThen.output(dotsThen.rename(dotsThen.o('Identity', [dots]), `rud_${UNEMBED_DOTS}`));
  const dotsElse = g.body('rde_');
  const noDots = dotsElse.o('ConstantOfShape', [dotsElse.constI([0, spec.dVocab])], {
    value: { tensor: { dims: [1], floats: [0] } },
  });
  dotsElse.output(dotsElse.rename(dotsElse.o('Identity', [noDots]), `rde_${UNEMBED_DOTS}`));
  const [allDots] = g.op('If', [dotsFlag], { then_branch: { graph: dotsThen }, else_branch: { graph: dotsElse } }, 1);
  g.rename(allDots, UNEMBED_DOTS);
  g.output(UNEMBED_DOTS);
}

export const READOUT_OUTPUTS = ['attn_x', 'mlp_x', 'attn_dir', 'mlp_dir'];
/** the forward graph's input `readout.unembed_sum` int64 []: 1 → output [D] Σ_v W_U[:, v], 0 → [0] */
export const UNEMBED_SUM = 'unembed_sum';
/**
 * the forward graph's inputs `readout.unembed_dots` int64 [] and `readout.unembed_x` float [S, D]:
 * 1 → output [S, V] x · W_U (no b_U), 0 → [0, V]
 */
export const UNEMBED_DOTS = 'unembed_dots';
export const UNEMBED_X = 'unembed_x';
/** what a readout run of the forward graph fetches */
export const FORWARD_READOUT_OUTPUTS = [...READOUT_OUTPUTS, UNEMBED_SUM, UNEMBED_DOTS];
type ReadoutOutput = 'attn_x' | 'mlp_x' | 'attn_dir' | 'mlp_dir';

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
  const { nLayers: L, dModel: D } = spec;
  const { HD, M } = readoutWidths(spec);
  checkReadoutInput(spec, input);
  const f = (t: Tensor | undefined, inner: number) =>
    t
      ? tensor('float32', t.data, t.dims)
      : noEmpty
        ? tensor('float32', new Float32Array(L * inner), [L, 1, inner])
        : tensor('float32', new Float32Array(0), [L, 0, inner]);
  return {
    z: f(input.z, HD),
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
  const { nLayers: L, dModel: D } = spec;
  const { HD, M } = readoutWidths(spec);
  const t = (name: string, given: boolean, inner: number): Tensor => {
    if (given && out) return { dims: [...out[name].dims], data: out[name].data as Float32Array };
    return { dims: [L, 0, inner], data: new Float32Array(0) };
  };
  return {
    attnX: t('attn_x', !!input.z, D),
    mlpX: t('mlp_x', !!input.post, D),
    attnDir: t('attn_dir', !!input.attnDirs, HD),
    mlpDir: t('mlp_dir', !!input.mlpDirs, M),
    ...unembed,
  };
}
