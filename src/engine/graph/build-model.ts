/**
 * The transformer as an ONNX graph, written out by hand so that every TransformerLens hook is a
 * graph output and every hook site takes an intervention x' = x * mul + add (see hooks.ts).
 *
 * It reads top to bottom like nanoGPT's model file: the small pieces first (soft-cap, activation,
 * norm), then the builder's hook sites and SAE splice, linear layers, rotary, attention, MLP, one
 * block, and last the whole model: embed → blocks (ln1 → attention → [post-norm] → resid_mid →
 * ln2 → MLP → [post-norm] → resid_post) → ln_final → unembed → [soft-cap].
 *
 * Weights stay in their stored layout (the graph points at the file's bytes); the einops-style
 * comments at each matmul say which layout that is, e.g. `b t i, o i -> b t o` for a torch Linear.
 *
 * Graph inputs (fed by runtime/feeds.ts):
 *   input_ids     int64 [B, T]
 *   position_ids  int64 [T]          learned positional embeddings only
 *   rope_cos/sin  float [T, rd]      rotary models (tables computed on the CPU, any scaling)
 *   rope_cos_local/sin_local float [T, rd]  the local layers' own rotary (Gemma 3), when the model has one
 *   attn_mask     float [T, Tk]      0 / -inf causal mask (key positions = past + current)
 *   attn_mask_local float [T, Tk]    sliding-window layers, when the model has any
 *   past.{l}.key/value float [B, Hkv, P, Dh]   KV cache (P may be 0); a linear-attention layer's
 *                   state instead: key = conv state [B, K−1, C], value = recurrent state [B, Hv, Dk, Dv]
 *   logit_positions int64 [P']       positions whose logits are computed (all, or e.g. just the last)
 *   {hook}::mul / {hook}::add        per hook site, broadcastable to the hook's shape
 * Outputs: logits [B, P', V], every hook by its TL name, present.{l}.key/value [B, Hkv, Tk, Dh].
 */
import { OnnxGraph, type BuiltGraph } from './onnx-builder';

export type { BuiltGraph };
import { allHookNames, hookInfo, mulInput, addInput } from './hooks';
import { addModelBackward } from './backward-model';
import { deltaRuleScan } from './delta-rule';
import type {
  ModelSpec,
  LinearRef,
  NormSpec,
  Activation,
  LayerSpec,
  AttentionSpec,
  LinearAttnSpec,
  MoeSpec,
  ExpertSpec,
  PerLayerSpec,
} from '../spec';
import { headsOf } from '../spec';
import type { TensorEntry } from '../safetensors-types';
import type { SaeGraphSpec } from '../sae';
import type { WeightPrecision } from '../precision';
import { lookupRows, unembedRows, vocabChunks } from './vocab';

export interface GraphPlan {
  /** expose hooks as outputs and hook sites as inputs (false = the plain logits-only graph) */
  hooks: boolean;
  /** also compute per-head hook_result [B,T,H,D] (costly; a separate variant) */
  withResult: boolean;
  /** splice a sparse autoencoder in at its hook (see sae.ts) */
  sae?: SaeGraphSpec;
  /**
   * a lean variant: only these hooks take interventions and only these are outputs. Batched scans
   * (ablations, patching) need a handful of sites and no hook values; every other hook's edit and
   * output buffer is then left out.
   */
  lean?: { sites: string[]; outputs: string[] };
  /** append the backward pass (backward.ts): input `logits::grad` seeds ∂M/∂logits, outputs `grad:{hook}` */
  grad?: { hooks: string[] };
  /** how weights are held (precision.ts); default f32 */
  weights?: WeightPrecision;
  /** rows per chunk of the vocabulary tables (vocab.ts; precision.ts chooseVocabSplit); absent: whole */
  vocabRows?: number;
  /**
   * use onnxruntime's fused kernels where no hook needs an intermediate (default true; never with
   * grad, whose backward pass differentiates the decomposed ops): FastGelu / Gelu for the MLP
   * activation in every variant; LayerNormalization / SimplifiedLayerNormalization for a norm
   * whose hook_scale is not a hook of the variant (the plain graph, lean variants, the lens).
   * An object keeps those and also turns on the FusedKernels it sets true, where the variant
   * allows them: they are off by default because on onnxruntime's CPU kernels (node and WASM)
   * they are no faster there, often slower, than what they replace (`npm run bench` compares them).
   */
  fused?: boolean | Partial<FusedKernels>;
  /**
   * a tied embedding's unembedding reads the table through an initializer of its own (the same
   * bytes of the weight file), for float32 tables on a provider that pre-packs a Gemm's constant
   * weight and then lets go of the initializer (SessionFactory.unembedApart: onnxruntime-node
   * maps it and unmaps it once packed). Shared, the lookup's Gather kept the whole table mapped
   * and resident beside its packed copy.
   */
  unembedApart?: boolean;
  /** more inputs and outputs on the finished graph (the DLA readout in the forward: readout/graph.ts addForwardReadout) */
  extra?: (g: OnnxGraph) => void;
}

/** onnxruntime contrib kernels a graph may use beyond the activation and norm kernels (GraphPlan.fused; off unless set) */
export interface FusedKernels {
  /**
   * SkipLayerNormalization / SkipSimplifiedLayerNormalization: a residual add and the norm after
   * it in one kernel, where the norm's hook_scale is no hook of the variant and no hook on the sum
   * (resid_mid, resid_post, resid_pre) is an intervention site; the sum comes out of the kernel
   * (its input_skip_bias_sum output), so those hooks can still be outputs
   */
  skipNorm: boolean;
  /**
   * MultiHeadAttention: scores, softmax and the weighted sum of values in one kernel, where
   * neither hook_attn_scores nor hook_pattern is a hook of the variant and the layer has no
   * attention soft-cap (the kernel has none: Gemma 2 stays decomposed). q, k, v and z stay hooks.
   */
  attention: boolean;
}

// ------------------------------------------------------------------ small pieces

/** Gemma 2's soft-cap: cap · tanh(x / cap), on attention scores and on the final logits. */
function softcap(g: OnnxGraph, x: string, cap: number): string {
  const k = g.constF([cap], []);
  return g.o('Mul', [g.o('Tanh', [g.o('Div', [x, k])]), k]);
}

function activation(g: OnnxGraph, x: string, a: Activation, fused = false): string {
  const c = (v: number) => g.constF([v], []);
  // onnxruntime's one-pass kernels for the same formulas (the decomposed tanh form is ~8 passes over [B, T, d_mlp])
  if (fused && a === 'gelu') return g.msOp('Gelu', [x])[0];
  if (fused && a !== 'relu' && a !== 'silu') return g.msOp('FastGelu', [x])[0];
  switch (a) {
    case 'relu':
      return g.o('Relu', [x]);
    case 'silu':
      return g.o('Mul', [x, g.o('Sigmoid', [x])]);
    case 'gelu': // exact (erf) GELU
      return g.o('Mul', [g.o('Mul', [x, c(0.5)]), g.o('Add', [c(1), g.o('Erf', [g.o('Div', [x, c(Math.SQRT2)])])])]);
    default: {
      // gelu_new / gelu_pytorch_tanh / gelu_fast: the tanh approximation
      const x3 = g.o('Mul', [g.o('Mul', [x, x]), x]);
      const inner = g.o('Mul', [g.o('Add', [x, g.o('Mul', [x3, c(0.044715)])]), c(Math.sqrt(2 / Math.PI))]);
      return g.o('Mul', [g.o('Mul', [x, c(0.5)]), g.o('Add', [c(1), g.o('Tanh', [inner])])]);
    }
  }
}

/**
 * LayerNorm / RMSNorm, decomposed so that hook_scale is a real intermediate (and intervenable):
 * y = ((x − mean x) / scale) ⊙ w + b with scale = sqrt(var + eps) (RMSNorm: x / sqrt(mean x² + eps) ⊙ w).
 */
function normalize(
  g: OnnxGraph,
  W: (name: string) => string,
  x: string,
  n: NormSpec,
  onScale?: (scale: string) => string,
  fused = false,
): string {
  const c = (v: number) => g.constF([v], []);
  if (fused && !onScale) {
    // no hook reads the scale: onnxruntime's fused norm, one kernel instead of ~8 passes over [B, T, D]
    const w = n.weightOffset ? g.o('Add', [W(n.w), c(1)]) : W(n.w);
    // (onnxruntime registers SimplifiedLayerNormalization, its RMSNorm kernel, in the ONNX domain)
    if (n.kind === 'rmsnorm')
      return g.o('SimplifiedLayerNormalization', [x, w], { axis: -1, epsilon: { float: n.eps } });
    return g.o('LayerNormalization', [x, w, ...(n.b ? [W(n.b)] : [])], { axis: -1, epsilon: { float: n.eps } });
  }
  let xc = x;
  let sq: string;
  if (n.kind === 'layernorm') {
    xc = g.o('Sub', [x, g.o('ReduceMean', [x], { axes: [-1], keepdims: 1 })]);
    sq = g.o('ReduceMean', [g.o('Mul', [xc, xc])], { axes: [-1], keepdims: 1 });
  } else {
    sq = g.o('ReduceMean', [g.o('Mul', [x, x])], { axes: [-1], keepdims: 1 });
  }
  let scale = g.o('Sqrt', [g.o('Add', [sq, c(n.eps)])]);
  if (onScale) scale = onScale(scale);
  const w = n.weightOffset ? g.o('Add', [W(n.w), c(1)]) : W(n.w); // Gemma stores w − 1
  let y = g.o('Mul', [g.o('Div', [xc, scale]), w]);
  if (n.b) y = g.o('Add', [y, W(n.b)]);
  return y;
}

/** `b t i → b t o` through a stored weight: torch Linear [o, i] (`b t i, o i -> b t o`) or GPT-2 Conv1D [i, o] (`b t i, i o -> b t o`). */
function linearOf(
  g: OnnxGraph,
  entry: (name: string) => TensorEntry,
  btN: (n: number) => string,
  x: string,
  ref: LinearRef,
  inDim: number,
  outDim: number,
): string {
  const x2 = g.o('Reshape', [x, g.constI([-1, inDim])]);
  const y2 = g.linear(x2, entry(ref.w), ref.layout, ref.b ? entry(ref.b) : undefined);
  return g.o('Reshape', [y2, btN(outDim)]);
}

// ------------------------------------------------------------------ what generation reads of the logits

/** the hooked graph's int64 [] inputs: 1 computes PICK_ARGMAX; k > 0 computes PICK_TOP_* (0, every other run: neither) */
export const PICK_ARGMAX_FLAG = 'pick.argmax';
export const PICK_K = 'pick.k';
/** int64 [B, P']: the id of each position's largest logit (ONNX ArgMax: the first on ties) */
export const PICK_ARGMAX = 'pick.argmax_ids';
/** [B, P', k] float and int64: the k largest logits, largest first (ties: lower id first), and their ids */
export const PICK_TOP_LOGITS = 'pick.top_logits';
export const PICK_TOP_IDS = 'pick.top_ids';

/**
 * What a decoding step reads of the logits, reduced in the graph so that a few bytes leave the
 * device rather than a vocabulary row: the argmax (greedy) and the top k (top-k sampling), each in
 * the then-branch of an If on its own input, so that a run asking for neither computes neither (an
 * ArgMax over [B, T, V] every forward cost several percent of one on onnxruntime-node's CPU at
 * T = 128, measured beside a graph without it) and onnxruntime-web's JSEP, which has no TopK kernel, copies the
 * logits to the CPU for it only on the runs that take it. The else-branches give empty outputs.
 */
function addLogitPicks(g: OnnxGraph): void {
  // The branches hold no constant of their own (onnxruntime's optimizer folds one into a subgraph
  // initializer that its saved optimized model repeats: "pke_values initializer name is not unique",
  // and optimized-cache.ts cannot load it) and read no outer value but logits, the inputs and
  // initializers (an outer node's output is one the optimizer tries to rename and warns it cannot).
  const pick = (
    flag: string,
    prefix: string,
    made: (b: OnnxGraph) => string[],
    empty: (b: OnnxGraph) => string[],
    names: string[],
  ) => {
    const ints = (n: string) => (n === PICK_ARGMAX || n === PICK_TOP_IDS ? 'int64' : 'float');
    const then = g.body(`${prefix}t_`);
    made(then).forEach((v, i) => then.output(then.rename(then.o('Identity', [v]), `${prefix}t_${i}`), ints(names[i])));
    const other = g.body(`${prefix}e_`);
    empty(other).forEach((v, i) =>
      other.output(other.rename(other.o('Identity', [v]), `${prefix}e_${i}`), ints(names[i])),
    );
    const got = g.op('If', [flag], { then_branch: { graph: then }, else_branch: { graph: other } }, names.length);
    names.forEach((n, i) => {
      g.rename(got[i], n);
      g.output(n, ints(n));
    });
  };
  const zero = g.constI([0], []);
  const [z1, last, one] = [g.constI([0]), g.constI([-1]), g.constI([1])];
  const none = (b: OnnxGraph) => b.o('Slice', ['logits', z1, z1, last]); // [B, P', 0]
  pick(
    g.o('Greater', [g.input(PICK_ARGMAX_FLAG, 'int64', []), zero]),
    'pka',
    (b) => [b.o('ArgMax', ['logits'], { axis: -1, keepdims: 0 })],
    // [B, 0] int64: the first logit of each position, none of them kept
    (b) => [b.o('Cast', [b.o('Slice', [b.o('Gather', ['logits', zero], { axis: -1 }), z1, z1, last])], { to: 7 })],
    [PICK_ARGMAX],
  );
  const k = g.input(PICK_K, 'int64', []);
  pick(
    g.o('Greater', [k, zero]),
    'pkt',
    (b) => b.op('TopK', ['logits', b.o('Reshape', [k, one])], { axis: -1, sorted: 1 }, 2),
    (b) => {
      const v = none(b);
      return [v, b.o('Cast', [v], { to: 7 })];
    },
    [PICK_TOP_LOGITS, PICK_TOP_IDS],
  );
}

// ------------------------------------------------------------------ the model

export class ModelGraph {
  readonly g: OnnxGraph;
  /** hook sites that take mul/add inputs, in graph order */
  readonly sites: string[] = [];
  /** tensors that already carry a hook's name */
  private readonly named = new Set<string>();
  protected readonly hookSet: Set<string>;
  private readonly lean?: { sites: Set<string>; outputs: Set<string> };
  protected readonly D: number;
  protected readonly H: number;
  protected readonly Hkv: number;
  protected readonly Dh: number;
  /** [B, T] of input_ids, set first in build() */
  protected bt = '';
  private readonly shapeCache = new Map<number, string>();
  /** rotary tables [T, 1, rd] (rotary models), and the local layers' own (Gemma 3) */
  protected cos = '';
  protected sin = '';
  protected cosLocal = '';
  protected sinLocal = '';
  /** a fused projection's full output per (input, weight), so its row blocks (q | k | v, gate | up) share one matmul */
  private readonly fusedOut = new Map<string, string>();
  /** additive masks [T, Tk]: causal, and causal within the window for sliding-window layers */
  protected mask = '';
  protected maskLocal = '';

  constructor(
    protected readonly spec: ModelSpec,
    protected readonly tensors: Map<string, TensorEntry>,
    protected readonly plan: GraphPlan,
    location: (file: string) => string,
  ) {
    this.g = new OnnxGraph(location, plan.weights ?? 'f32');
    ({ dModel: this.D, nHeads: this.H, nKvHeads: this.Hkv, dHead: this.Dh } = spec);
    this.lean = plan.lean ? { sites: new Set(plan.lean.sites), outputs: new Set(plan.lean.outputs) } : undefined;
    this.hookSet = new Set(
      !plan.hooks ? [] : this.lean ? [...this.lean.sites, ...this.lean.outputs] : allHookNames(spec, plan.withResult),
    );
    if (plan.sae) this.hookSet.add(`${plan.sae.info.hook}.hook_sae_acts_post`);
  }

  // ---- helpers

  /** a weight as float32; `after`: the activation it multiplies (orders the widening of stored weights, see OnnxGraph.weight) */
  protected W = (name: string, after?: string): string => this.g.weight(this.entry(name), after);

  private readonly entryOf = (name: string): TensorEntry => this.entry(name);

  protected entry(name: string): TensorEntry {
    const e = this.tensors.get(name);
    if (!e) throw new Error(`graph: tensor ${name} not in weight index`);
    return e;
  }

  protected c(v: number): string {
    return this.g.constF([v], []);
  }

  /** the shape [B, T, n] (built once per n) */
  protected btN = (n: number): string => {
    if (!this.shapeCache.has(n)) this.shapeCache.set(n, this.g.o('Concat', [this.bt, this.g.constI([n])], { axis: 0 }));
    return this.shapeCache.get(n)!;
  };

  protected linear(x: string, ref: LinearRef, inDim: number, outDim: number): string {
    if (!ref.rows) return linearOf(this.g, this.entryOf, this.btN, x, ref, inDim, outDim);
    // rows of a fused [out, in] matrix: the whole product once, then its slice `b t (rows) -> b t count`
    const key = `${x}|${ref.w}`;
    let full = this.fusedOut.get(key);
    if (!full) {
      full = linearOf(
        this.g,
        this.entryOf,
        this.btN,
        x,
        { w: ref.w, b: ref.b, layout: ref.layout },
        inDim,
        this.entry(ref.w).shape[0],
      );
      this.fusedOut.set(key, full);
    }
    const { start, count } = ref.rows;
    return this.g.o('Slice', [full, this.g.constI([start]), this.g.constI([start + count]), this.g.constI([2])]);
  }

  /** x [N, D] → logits [N, V] through W_U (lm_head or the tied embedding) in vocabulary chunks */
  protected unembed(x: string): string {
    const { spec, plan } = this;
    return unembedRows(
      this.g,
      vocabChunks(this.unembedTable(), plan.vocabRows),
      spec.unembed.b ? this.entry(spec.unembed.b) : undefined,
      x,
    );
  }

  /** W_U; a tied float32 table under a name of its own where the plan asks (GraphPlan.unembedApart) */
  protected unembedTable(): TensorEntry {
    const e = this.entry(this.spec.unembed.w);
    const apart = this.plan.unembedApart && this.spec.unembed.w === this.spec.embed.w;
    return apart && e.dtype === 'F32' && (this.plan.weights ?? 'f32') === 'f32'
      ? { ...e, name: `${e.name}#unembed` }
      : e;
  }

  /** fused kernels allowed (see GraphPlan.fused) */
  protected get fused(): boolean {
    return (this.plan.fused ?? true) !== false && !this.plan.grad;
  }

  /** one of FusedKernels asked for */
  private fusedKernel(k: keyof FusedKernels): boolean {
    const f = this.plan.fused;
    return this.fused && typeof f === 'object' && f[k] === true;
  }

  /** a hook whose value the graph passes on unchanged: not a hook of the variant, or an output only (no site, no SAE splice) */
  private passive(name: string): boolean {
    return !this.hookSet.has(name) || (!this.isSite(name) && this.plan.sae?.info.hook !== name);
  }

  private isSite(name: string): boolean {
    return this.hookSet.has(name) && hookInfo(name).site && (!this.lean || this.lean.sites.has(name));
  }

  /**
   * The residual sum a + b (b absent: a itself), its hooks in order, and then norm n of it. With
   * skipNorm allowed, none of the hooks a site and no hook on the norm's scale, that is one
   * SkipLayerNormalization (its 4th output is the sum, which the hooks output); otherwise an Add,
   * the hooks, and the norm.
   */
  private addNorm(
    a: string,
    b: string | undefined,
    hooks: string[],
    n: NormSpec | undefined,
    scaleHook: string,
  ): { sum: string; normed: string } {
    const { g } = this;
    if (
      n !== undefined &&
      b !== undefined &&
      this.fusedKernel('skipNorm') &&
      !this.hookSet.has(scaleHook) &&
      hooks.every((h) => this.passive(h))
    ) {
      const w = n.weightOffset ? g.o('Add', [this.W(n.w), this.c(1)]) : this.W(n.w); // Gemma stores w − 1
      const args = n.kind === 'rmsnorm' ? [a, b, w] : [a, b, w, ...(n.b ? [this.W(n.b)] : [])];
      // outputs: normed, mean, inv_std_var (left out), input_skip_bias_sum
      let [normed, , , sum] = g.msOp(
        n.kind === 'rmsnorm' ? 'SkipSimplifiedLayerNormalization' : 'SkipLayerNormalization',
        args,
        { epsilon: { float: n.eps } },
        4,
        [1, 2],
      );
      for (const h of hooks) sum = this.hook(sum, h);
      return { sum, normed };
    }
    let sum = b === undefined ? a : g.o('Add', [a, b]);
    for (const h of hooks) sum = this.hook(sum, h);
    return { sum, normed: n ? this.norm(sum, n, scaleHook) : sum };
  }

  /** n(x), its scale hooked as scaleHook; no norm (a block without pre-norms): x itself */
  protected norm(x: string, n: NormSpec | undefined, scaleHook?: string): string {
    if (!n) return x;
    const hooked = scaleHook !== undefined && this.hookSet.has(scaleHook);
    return normalize(this.g, this.W, x, n, hooked ? (v) => this.hook(v, scaleHook) : undefined, this.fused);
  }

  // ---- hook sites

  /** Output a hook and apply its intervention; returns the (possibly edited) value to use downstream. */
  private hook(x: string, name: string): string {
    const { g, lean, plan } = this;
    if (!this.hookSet.has(name)) return x;
    let y = x;
    if (this.isSite(name)) {
      this.sites.push(name);
      y = g.o('Add', [g.o('Mul', [x, g.input(mulInput(name), 'float')]), g.input(addInput(name), 'float')]);
    }
    if (lean && !lean.outputs.has(name)) return y;
    // two hooks on one tensor with no site between them (a lean resid_post → next resid_pre): the
    // second is a copy, since renaming the tensor again would take the first hook's name away
    if (this.named.has(y)) g.identity(y, name);
    else g.rename(y, name);
    this.named.add(name);
    g.output(name);
    return plan.sae && plan.sae.info.hook === name ? this.saeSplice(name, plan.sae) : name;
  }

  /** The SAE at its hook: features as a site, reconstruction error kept, so x' = x unless features are edited. */
  private saeSplice(x: string, s: SaeGraphSpec): string {
    const { g, btN } = this;
    const { d_in: dIn, d_sae: S } = s.info;
    const x3 = g.o('Reshape', [x, btN(dIn)]); // z-SAEs read hook_z flattened over heads
    const xin = s.info.apply_b_dec_to_input ? g.o('Sub', [x3, g.weight(s.b_dec)]) : x3;
    // W_enc [d_in, d_sae]: `n i, i s -> n s`
    const pre = g.o('Reshape', [
      g.o('Gemm', [g.o('Reshape', [xin, g.constI([-1, dIn])]), g.weight(s.W_enc), g.weight(s.b_enc)]),
      btN(S),
    ]);
    let acts = g.o('Relu', [pre]);
    if (s.info.activation === 'jumprelu')
      acts = g.o('Mul', [acts, g.o('Cast', [g.o('Greater', [pre, g.weight(s.threshold!)])], { to: 1 })]);
    if (s.info.activation === 'topk') {
      const k = s.info.k!;
      const [vals] = g.op('TopK', [pre, g.constI([k])], { axis: -1 }, 2);
      const kth = g.o('Slice', [vals, g.constI([k - 1]), g.constI([k]), g.constI([-1])]);
      acts = g.o('Mul', [acts, g.o('Cast', [g.o('GreaterOrEqual', [pre, kth])], { to: 1 })]);
    }
    const edited = this.hook(acts, `${s.info.hook}.hook_sae_acts_post`);
    // W_dec [d_sae, d_in]: `n s, s i -> n i`
    const decode = (a: string) =>
      g.o('Reshape', [
        g.o('Gemm', [g.o('Reshape', [a, g.constI([-1, S])]), g.weight(s.W_dec), g.weight(s.b_dec)]),
        btN(dIn),
      ]);
    const recons = decode(acts);
    const error = g.o('Sub', [x3, recons]);
    g.identity(recons, `${s.info.hook}.hook_sae_recons`);
    g.output(`${s.info.hook}.hook_sae_recons`);
    g.rename(error, `${s.info.hook}.hook_sae_error`);
    g.output(`${s.info.hook}.hook_sae_error`);
    // x + (decode(acts') − decode(acts)) rather than decode(acts') + error: exactly x when no feature is edited
    return g.o('Reshape', [g.o('Add', [x3, g.o('Sub', [decode(edited), recons])]), g.o('Shape', [x])]);
  }

  // ---- attention

  /** rotary, HF rotate_half convention over the first rd dims of each head: x·cos + rotate_half(x)·sin */
  protected rope(x: string, local = false, Dh = this.Dh): string {
    const { g, spec } = this;
    const r = local ? spec.rotaryLocal : spec.rotary;
    if (!r) return x;
    const rd = r.dim;
    const [cos, sin] = local ? [this.cosLocal, this.sinLocal] : [this.cos, this.sin];
    const sl = (t: string, a: number, b: number) => g.o('Slice', [t, g.constI([a]), g.constI([b]), g.constI([3])]);
    const xr = rd === Dh ? x : sl(x, 0, rd);
    const x1 = sl(xr, 0, rd / 2);
    const x2 = sl(xr, rd / 2, rd);
    const rot = g.o('Concat', [g.o('Neg', [x2]), x1], { axis: 3 });
    const out = g.o('Add', [g.o('Mul', [xr, cos]), g.o('Mul', [rot, sin])]);
    return rd === Dh ? out : g.o('Concat', [out, sl(x, rd, Dh)], { axis: 3 });
  }

  /** a fused projection [B, T, 3·H·Dh] → q, k, v [B, T, H, Dh], split along the `three` axis of `layout` */
  private splitHeads(qkv: string, layout: number[], axis: number): string[] {
    const { g } = this;
    const r = g.o('Reshape', [qkv, g.constI(layout)]);
    const parts = g.op('Split', [r, g.constI([1, 1, 1])], { axis }, 3);
    return parts.map((p) => g.o('Squeeze', [p, g.constI([axis])]));
  }

  private attention(l: number, layer: LayerSpec, a: AttentionSpec, xn: string): string {
    const { g, D, H } = this;
    const { Hkv, Dh } = headsOf(this.spec, l);
    const b = `blocks.${l}.attn`;
    let q: string, k: string, v: string;
    let gate: string | undefined;
    if (a.kvFrom !== undefined && a.qkv.kind === 'separate') {
      // Gemma 4's KV sharing: only the query here; keys and values are layer kvFrom's (below)
      q = this.norm(g.o('Reshape', [this.linear(xn, a.qkv.q, D, H * Dh), g.constI([0, 0, H, Dh])]), a.qNorm);
      q = this.hook(this.rope(q, a.localRotary, Dh), `${b}.hook_q`);
      k = v = '';
    } else if (a.qkv.kind === 'separate' && a.outputGate) {
      // Qwen3.5: q_proj rows `(h two dh)`, each head's query then its output gate
      const qg = g.o('Reshape', [this.linear(xn, a.qkv.q, D, 2 * H * Dh), g.constI([0, 0, H, 2 * Dh])]);
      [q, gate] = g.op('Split', [qg, g.constI([Dh, Dh])], { axis: 3 }, 2);
      gate = this.hook(gate, `${b}.hook_gate`);
      k = g.o('Reshape', [this.linear(xn, a.qkv.k, D, Hkv * Dh), g.constI([0, 0, Hkv, Dh])]);
      v = g.o('Reshape', [this.linear(xn, a.qkv.v, D, Hkv * Dh), g.constI([0, 0, Hkv, Dh])]);
    } else if (a.qkv.kind === 'separate') {
      // OLMo 2 normalises the whole projection, before the split into heads
      const full = a.qkNormWidth === 'full';
      const heads = (t: string, n: number) => g.o('Reshape', [t, g.constI([0, 0, n, Dh])]); // `b t (h dh) -> b t h dh`
      q = heads(
        full ? this.norm(this.linear(xn, a.qkv.q, D, H * Dh), a.qNorm) : this.linear(xn, a.qkv.q, D, H * Dh),
        H,
      );
      const kProj = this.linear(xn, a.qkv.k, D, Hkv * Dh);
      k = heads(full ? this.norm(kProj, a.kNorm) : kProj, Hkv);
      // Gemma 4's attention_k_eq_v (v's ref is k's object): v is the key projection (before k_norm and rotary)
      v = a.qkv.v === a.qkv.k ? heads(kProj, Hkv) : heads(this.linear(xn, a.qkv.v, D, Hkv * Dh), Hkv);
    } else if (a.qkv.kind === 'gpt2_fused') {
      // c_attn Conv1D [D, 3D], columns `(three h dh)`
      [q, k, v] = this.splitHeads(this.linear(xn, a.qkv.qkv, D, 3 * D), [0, 0, 3, H, Dh], 2);
    } else {
      // NeoX query_key_value Linear [3D, D], rows `(h three dh)`
      [q, k, v] = this.splitHeads(this.linear(xn, a.qkv.qkv, D, 3 * D), [0, 0, H, 3, Dh], 3);
    }
    let kAll: string, vAll: string;
    if (a.kvFrom !== undefined) {
      const from = this.kv.get(a.kvFrom);
      if (!from)
        throw new Error(`graph: layer ${l} shares the keys and values of layer ${a.kvFrom}, not built before it`);
      [kAll, vAll] = from;
    } else {
      if (a.qkNormWidth !== 'full') {
        q = this.norm(q, a.qNorm);
        k = this.norm(k, a.kNorm);
      }
      // Gemma 4's v_norm: RMS over each head's Dh, no weight
      if (a.vNorm) v = g.o('Div', [v, g.o('Sqrt', [g.o('Add', [this.meanSquare(v), this.c(a.vNorm.eps)])])]);
      q = this.hook(this.rope(q, a.localRotary, Dh), `${b}.hook_q`);
      k = this.hook(this.rope(k, a.localRotary, Dh), `${b}.hook_k`);
      v = this.hook(v, `${b}.hook_v`);

      // KV cache: keys/values of earlier positions come in, all keys/values go out (`b t hkv dh -> b hkv t dh`)
      kAll = g.o(
        'Concat',
        [g.input(`past.${l}.key`, 'float', ['B', Hkv, 'P', Dh]), g.o('Transpose', [k], { perm: [0, 2, 1, 3] })],
        { axis: 2 },
      );
      vAll = g.o(
        'Concat',
        [g.input(`past.${l}.value`, 'float', ['B', Hkv, 'P', Dh]), g.o('Transpose', [v], { perm: [0, 2, 1, 3] })],
        { axis: 2 },
      );
      kAll = g.rename(kAll, `present.${l}.key`);
      g.output(kAll);
      vAll = g.rename(vAll, `present.${l}.value`);
      g.output(vAll);
      this.kv.set(l, [kAll, vAll]);
    }

    // grouped-query attention: each kv head serves H/Hkv query heads, `b hkv tk dh -> b (hkv rep) tk dh`
    // (heads 2k, 2k+1 share kv head k for rep 2)
    const rep = H / Hkv;
    const repeat = (t: string) =>
      rep === 1
        ? t
        : g.o('Reshape', [
            g.o('Expand', [g.o('Unsqueeze', [t, g.constI([2])]), g.constI([1, 1, rep, 1, 1])]),
            g.constI([0, H, -1, Dh]),
          ]);
    const kH = repeat(kAll);
    const vH = repeat(vAll);
    const mask = a.slidingWindow !== null ? this.maskLocal : this.mask;

    let z: string;
    if (
      this.fusedKernel('attention') &&
      a.softcap === null &&
      !a.sinks &&
      !this.hookSet.has(`${b}.hook_attn_scores`) &&
      !this.hookSet.has(`${b}.hook_pattern`)
    ) {
      // no hook reads scores or pattern: MultiHeadAttention, query `b t (h dh)`, keys and values
      // `b h tk dh` (the KV cache and GQA stay outside it: present.* are computed above, and the
      // kernel's own past inputs take H heads, not Hkv), the mask as its additive attention_bias
      const zFlat = g.msOp(
        'MultiHeadAttention',
        [g.o('Reshape', [q, g.constI([0, 0, H * Dh])]), kH, vH, '', '', this.attnBias(mask)],
        { num_heads: H, scale: { float: a.scale } },
      )[0];
      z = g.o('Reshape', [zFlat, g.constI([0, 0, H, Dh])]);
    } else {
      z = this.attend(b, q, kH, vH, mask, a.scale, a.softcap, a.sinks?.w);
    }
    // the gated attention's z is the gated value, so that attn_out = Σ_h z_h · W_O[h] still holds
    if (gate) z = g.o('Mul', [z, g.o('Sigmoid', [gate])]);
    z = this.hook(z, `${b}.hook_z`);
    if (this.plan.withResult && this.plan.hooks) {
      // W_O per head [H, Dh, D]: out_in `d (h dh) -> h dh d`, in_out `(h dh) d -> h dh d`; result_h = z_h · W_O[h]
      const wo =
        a.o.layout === 'out_in'
          ? g.o('Transpose', [g.o('Reshape', [this.W(a.o.w, z), g.constI([D, H, Dh])])], { perm: [1, 2, 0] })
          : g.o('Reshape', [this.W(a.o.w, z), g.constI([H, Dh, D])]);
      const zh = g.o('Transpose', [z], { perm: [0, 2, 1, 3] });
      this.hook(g.o('Transpose', [g.o('MatMul', [zh, wo])], { perm: [0, 2, 1, 3] }), `${b}.hook_result`);
    }
    let out = this.linear(g.o('Reshape', [z, g.constI([0, 0, H * Dh])]), a.o, H * Dh, D);
    if (layer.postAttnNorm) out = this.norm(out, layer.postAttnNorm, `blocks.${l}.ln1_post.hook_scale`);
    return this.hook(out, `blocks.${l}.hook_attn_out`);
  }

  /**
   * decomposed attention with its hooks: q [B, T, H, Dh], keys and values [B, H, Tk, Dh] → z [B, T, H, Dh];
   * `sinks` (GPT-OSS, [H]): one more softmax column per row, its logit the head's sink, dropped after
   */
  protected attend(
    b: string,
    q: string,
    kH: string,
    vH: string,
    mask: string,
    scale: number,
    cap: number | null,
    sinks?: string,
  ): string {
    const { g } = this;
    // scores `b h t dh, b h tk dh -> b h t tk`
    let scores = g.o('Mul', [
      g.o('MatMul', [g.o('Transpose', [q], { perm: [0, 2, 1, 3] }), g.o('Transpose', [kH], { perm: [0, 1, 3, 2] })]),
      this.c(scale),
    ]);
    if (cap !== null) scores = softcap(g, scores, cap);
    scores = this.hook(g.o('Add', [scores, mask]), `${b}.hook_attn_scores`);
    let probs: string;
    if (sinks) {
      // `h -> b h t 1`, concatenated after the key columns, softmax, the sink column sliced off
      const rows = g.o('Concat', [g.o('Shape', [scores], { start: 0, end: 3 }), g.constI([1])], { axis: 0 });
      const sink = g.o('Expand', [g.o('Reshape', [this.W(sinks, scores), g.constI([1, this.H, 1, 1])]), rows]);
      const all = g.o('Softmax', [g.o('Concat', [scores, sink], { axis: 3 })], { axis: -1 });
      probs = g.o('Slice', [all, g.constI([0]), g.constI([-1]), g.constI([3])]);
    } else probs = g.o('Softmax', [scores], { axis: -1 });
    const pattern = this.hook(probs, `${b}.hook_pattern`);
    const zT = g.o('MatMul', [pattern, vH]); // `b h t tk, b h tk dh -> b h t dh`
    return g.o('Transpose', [zT], { perm: [0, 2, 1, 3] });
  }

  /**
   * A mask [T, Tk] as MultiHeadAttention's attention_bias [B, H, T, Tk], built once per mask.
   * Expanded to every batch row and head (onnxruntime's CPU kernel would broadcast a [1, 1, T, Tk]
   * bias, but the WebGPU kernel takes only the full shape).
   */
  private attnBias(mask: string): string {
    let bias = this.biasCache.get(mask);
    if (!bias) {
      const { g } = this;
      const shape = g.o(
        'Concat',
        [g.o('Slice', [this.bt, g.constI([0]), g.constI([1])]), g.constI([this.H]), g.o('Shape', [mask])],
        { axis: 0 },
      );
      bias = g.o('Expand', [g.o('Unsqueeze', [mask, g.constI([0, 1])]), shape]);
      this.biasCache.set(mask, bias);
    }
    return bias;
  }
  private readonly biasCache = new Map<string, string>();
  /** each layer's keys and values with the cache's (present.*), for the layers that share them (Gemma 4) */
  private readonly kv = new Map<number, [string, string]>();

  /** mean of x² over the last axis, kept: [..., 1] */
  private meanSquare(x: string): string {
    return this.g.o('ReduceMean', [this.g.o('Mul', [x, x])], { axes: [-1], keepdims: 1 });
  }

  // ---- linear attention (Qwen3.5's gated delta-net)

  /**
   * The gated delta rule (spec.ts LinearAttnSpec) as transformers' torch_recurrent_gated_delta_rule
   * computes it, one position at a time: a Scan over T (delta-rule.ts, with its backward) whose body updates
   * the state S [B, Hv, Dk, Dv] (S ← e^g S; S ← S + k (β (v − Sᵀk))ᵀ; o = Sᵀq) from the state the input carries (zeros for a
   * fresh run: exactly HF's zero-padded conv and empty state). T sequential steps of O(Hv·Dk·Dv)
   * each. (The chunked form's closed-form inverse of its triangular system, a product of powers,
   * was tried: without decay its powers overflow float32's precision past a few dozen positions.)
   */
  private linearAttention(l: number, layer: LayerSpec, s: LinearAttnSpec, xn: string): string {
    const { g, D } = this;
    const b = `blocks.${l}.linear_attn`;
    const { nKHeads: Hk, nVHeads: Hv, dK: Dk, dV: Dv, convKernel: K } = s;
    const C = 2 * Hk * Dk + Hv * Dv;
    const BIG = 2 ** 31 - 1;
    const sl = (t: string, a: number, e: number, axis: number) =>
      g.o('Slice', [t, g.constI([a]), g.constI([e]), g.constI([axis])]);

    // causal depthwise conv1d over time, kernel K, from the conv state (the last K − 1 inputs): `b t c`
    const mixed = this.linear(xn, s.qkv, D, C);
    const xcat = g.o('Concat', [g.input(`past.${l}.key`, 'float', ['B', K - 1, C]), mixed], { axis: 1 });
    g.output(g.rename(sl(xcat, -(K - 1), BIG, 1), `present.${l}.key`));
    const wT = g.o('Transpose', [g.o('Reshape', [this.W(s.conv, xcat), g.constI([C, K])])]); // [K, C]
    let conv = '';
    for (let j = 0; j < K; j++) {
      // tap j reads input t − (K − 1) + j: rows [j, j + T) of the padded sequence
      const term = g.o('Mul', [sl(xcat, j, j === K - 1 ? BIG : j - (K - 1), 1), sl(wT, j, j + 1, 0)]);
      conv = j === 0 ? term : g.o('Add', [conv, term]);
    }
    conv = activation(g, conv, 'silu');
    // q, k L2-normalised per head (FLA's l2norm: x / sqrt(Σx² + 1e-6)); v as it is
    const l2 = (t: string) =>
      g.o('Div', [
        t,
        g.o('Sqrt', [g.o('Add', [g.o('ReduceSumSquare', [t], { axes: [-1], keepdims: 1 }), this.c(1e-6)])]),
      ]);
    const heads = (t: string, n: number, d: number) => g.o('Reshape', [t, g.constI([0, 0, n, d])]);
    const q = this.hook(l2(heads(sl(conv, 0, Hk * Dk, 2), Hk, Dk)), `${b}.hook_q`);
    const k = this.hook(l2(heads(sl(conv, Hk * Dk, 2 * Hk * Dk, 2), Hk, Dk)), `${b}.hook_k`);
    const v = this.hook(heads(sl(conv, 2 * Hk * Dk, C, 2), Hv, Dv), `${b}.hook_v`);
    const beta = this.hook(g.o('Sigmoid', [this.linear(xn, s.b, D, Hv)]), `${b}.hook_beta`); // [B, T, Hv]
    // g = −exp(A_log) · softplus(a + dt_bias): the log of each step's decay, ≤ 0
    const decay = this.hook(
      g.o('Mul', [
        g.o('Neg', [g.o('Exp', [this.W(s.aLog)])]),
        g.o('Softplus', [g.o('Add', [this.linear(xn, s.a, D, Hv), this.W(s.dtBias)])]),
      ]),
      `${b}.hook_decay`,
    );

    // key heads serve Hv / Hk consecutive value heads (`b t hk dk -> b t (hk rep) dk`)
    const rep = Hv / Hk;
    const toV = (t: string) =>
      rep === 1
        ? t
        : g.o('Reshape', [
            g.o('Expand', [g.o('Unsqueeze', [t, g.constI([3])]), g.constI([1, 1, 1, rep, 1])]),
            g.constI([0, 0, Hv, Dk]),
          ]);
    const qs = g.o('Mul', [toV(q), this.c(1 / Math.sqrt(Dk))]);
    const [sT, coreOut] = deltaRuleScan(g, `la${l}_`, { Hv, Dk, Dv }, [
      g.input(`past.${l}.value`, 'float', ['B', Hv, Dk, Dv]),
      qs,
      toV(k),
      v,
      beta,
      decay,
    ]);
    g.output(g.rename(sT, `present.${l}.value`));
    const core = this.hook(coreOut, `${b}.hook_core`); // [B, T, Hv, Dv]

    // RMSNorm over each head's Dv (weight w), times silu of the output gate
    const gate = this.hook(heads(this.linear(xn, s.z, D, Hv * Dv), Hv, Dv), `${b}.hook_gate`);
    const normed = normalize(g, this.W, core, s.norm, undefined, this.fused);
    const z = this.hook(g.o('Mul', [normed, activation(g, gate, 'silu')]), `${b}.hook_z`);
    const out = this.linear(g.o('Reshape', [z, g.constI([0, 0, Hv * Dv])]), s.out, Hv * Dv, D);
    return this.hook(out, `blocks.${l}.hook_attn_out`);
  }

  // ---- MLP

  /** the MLP's output (hook_mlp_out) from its input xn; `mid`, hook_resid_mid, is what Gemma 4's experts read */
  protected mlp(l: number, layer: LayerSpec, xn: string, mid = xn): string {
    const { g } = this;
    const b = `blocks.${l}`;
    const m = layer.moe;
    let out: string;
    if (m?.beside) {
      // Gemma 4: the dense MLP and the experts side by side, each through its own post-norm
      const s = m.beside;
      const dense = this.norm(this.denseMlp(l, layer, xn), s.denseNorm, `${b}.ln2_post_dense.hook_scale`);
      const xr = g.o('Mul', [this.norm(mid, s.routerNorm), this.c(s.routerScale)]);
      const xe = this.norm(mid, s.preNorm, `${b}.ln2_experts.hook_scale`);
      const experts = this.norm(this.moe(`${b}.mlp`, m, xe, xr), s.postNorm, `${b}.ln2_post_experts.hook_scale`);
      out = g.o('Add', [dense, experts]);
    } else out = m ? this.moe(`${b}.mlp`, m, xn) : this.denseMlp(l, layer, xn);
    if (layer.postMlpNorm) out = this.norm(out, layer.postMlpNorm, `${b}.ln2_post.hook_scale`);
    return this.hook(out, `${b}.hook_mlp_out`);
  }

  /** the dense MLP's output of xn, before any post-norm */
  private denseMlp(l: number, layer: LayerSpec, xn: string): string {
    const { g, D } = this;
    const b = `blocks.${l}.mlp`;
    const m = layer.mlp;
    if (!m) throw new Error(`graph: layer ${l} has no MLP`);
    const M = m.width ?? this.spec.dMlp;
    let post: string;
    if (m.kind === 'gated') {
      const pre = this.hook(this.linear(xn, m.gate!, D, M), `${b}.hook_pre`);
      const lin = this.hook(this.linear(xn, m.up, D, M), `${b}.hook_pre_linear`);
      post = this.hook(g.o('Mul', [activation(g, pre, m.act, this.fused), lin]), `${b}.hook_post`);
    } else {
      const pre = this.hook(this.linear(xn, m.up, D, M), `${b}.hook_pre`);
      post = this.hook(activation(g, pre, m.act, this.fused), `${b}.hook_post`);
    }
    return this.linear(post, m.down, M, D);
  }

  /**
   * A mixture-of-experts MLP of xn (its router reading xr) as one graph with data-dependent routing (no rebuild per prompt):
   * router logits [B,T,E] → softmax → the top k per token → a dense weight per expert [B,T,E] (the
   * chosen experts' probabilities, renormalised when normTopK; zero elsewhere) → every expert run
   * on every token, its output times its weight, summed. Exact, and simple for the backward pass
   * (the top-k choice is a 0/1 mask, so gradients flow through the chosen probabilities), at the
   * cost of E/k times the expert compute of a gathered MoE (Mixtral 4×, Qwen3-30B-A3B 16×).
   */
  private moe(b: string, m: MoeSpec, xn: string, xr = xn): string {
    const { g } = this;
    const w = this.routing(m, xr, b);
    let out = '';
    const add = (y: string) => (out = out ? g.o('Add', [out, y]) : y);
    m.experts.forEach((ex, e) => {
      const we = g.o('Slice', [w, g.constI([e]), g.constI([e + 1]), g.constI([-1])]); // [B,T,1]
      add(this.hook(g.o('Mul', [this.expertMlp(m, ex, m.dExpert, xn), we]), `${b}.experts.${e}.hook_out`));
    });
    if (m.shared) add(this.hook(this.sharedExpert(m, xn), `${b}.shared_expert.hook_out`));
    return out;
  }

  /**
   * The dense routing weights [..., E] of the router's input xn [..., D]: softmax of the router
   * logits, the top k kept (renormalised when normTopK), zero elsewhere; with the MoE's hooks
   * under `b` (the edge variant gives none: it runs the router on each expert's own copy).
   */
  protected routing(m: MoeSpec, xn: string, b?: string): string {
    const { g, D } = this;
    const E = m.experts.length;
    const hk = (x: string, name: string) => (b ? this.hook(x, `${b}.${name}`) : x);
    const logits = hk(this.linear(xn, m.router, D, E), 'hook_router_logits');
    const probs = g.o('Softmax', [logits], { axis: -1 });
    const [, idx] = g.op('TopK', [probs, g.constI([m.topK])], { axis: -1, largest: 1, sorted: 1 }, 2);
    // chosen [..., E]: Σ_k onehot(idx_k), `... k 1 == e -> ... k e -> ... e`
    const range = g.constI(Array.from({ length: E }, (_, e) => e));
    const onehot = g.o('Cast', [g.o('Equal', [g.o('Unsqueeze', [idx, g.constI([-1])]), range])], { to: 1 });
    let w = g.o('Mul', [probs, g.o('ReduceSum', [onehot, g.constI([-2])], { keepdims: 0 })]);
    if (m.normTopK) w = g.o('Div', [w, g.o('ReduceSum', [w, g.constI([-1])], { keepdims: 1 })]);
    if (m.beside) w = g.o('Mul', [w, this.W(m.beside.expertScale)]); // Gemma 4's per_expert_scale [E]
    w = hk(w, 'hook_router_weights');
    // TransformerLens's [B,T,k] pair, read from the (possibly edited) dense weights
    if (b && this.hookSet.has(`${b}.hook_expert_weights`))
      this.hook(g.o('GatherElements', [w, idx], { axis: -1 }), `${b}.hook_expert_weights`);
    if (b && this.hookSet.has(`${b}.hook_expert_indices`))
      this.hook(g.o('Cast', [idx], { to: 1 }), `${b}.hook_expert_indices`);
    return w;
  }

  /** one expert's gated MLP of x [..., D] (not weighted): down(act(x·gate) ⊙ x·up), or GPT-OSS's clamped form */
  protected expertMlp(m: MoeSpec, ex: ExpertSpec, M: number, x: string): string {
    const { g, D } = this;
    const gate = this.linear(x, ex.gate, D, M);
    const up = this.linear(x, ex.up, D, M);
    let h: string;
    if (!m.glu) h = g.o('Mul', [activation(g, gate, m.act, this.fused), up]);
    else {
      // GPT-OSS: (clamp(up, ±limit) + 1) ⊙ g·σ(alpha·g), g = min(gate, limit)
      const { alpha, limit } = m.glu;
      const gc = g.o('Clip', [gate, '', this.c(limit)]);
      const uc = g.o('Clip', [up, this.c(-limit), this.c(limit)]);
      h = g.o('Mul', [
        g.o('Add', [uc, this.c(1)]),
        g.o('Mul', [gc, g.o('Sigmoid', [g.o('Mul', [gc, this.c(alpha)])])]),
      ]);
    }
    return this.linear(h, ex.down, M, D);
  }

  /** Qwen2-MoE's shared expert of x, times its sigmoid gate */
  protected sharedExpert(m: MoeSpec, x: string): string {
    const { g, D } = this;
    const s = m.shared!;
    const sg = g.o('Sigmoid', [this.linear(x, s.gate, D, 1)]); // [..., 1]
    return g.o('Mul', [this.expertMlp(m, s.mlp, s.dMlp, x), sg]);
  }

  // ---- one block

  /**
   * Block l from its residual stream `resid` (hook_resid_pre, already hooked) and ln1 of it;
   * returns the two addends of hook_resid_post, which the caller adds together with the norm
   * that reads the sum (the next block's ln1 or ln_final: see addNorm).
   */
  private block(l: number, resid: string, xn: string): [string, string | undefined] {
    const { g } = this;
    const layer = this.spec.layers[l];
    const attnOut = layer.linearAttn
      ? this.linearAttention(l, layer, layer.linearAttn, xn)
      : this.attention(l, layer, layer.attn!, xn);
    if (layer.parallel) {
      const mlpOut = this.mlp(l, layer, this.norm(resid, layer.ln2, `blocks.${l}.ln2.hook_scale`));
      return [g.o('Add', [resid, attnOut]), mlpOut];
    }
    const { sum: mid, normed } = this.addNorm(
      resid,
      attnOut,
      [`blocks.${l}.hook_resid_mid`],
      layer.ln2,
      `blocks.${l}.ln2.hook_scale`,
    );
    const mlpOut = this.mlp(l, layer, normed, mid);
    if (!layer.perLayer && !layer.scalar) return [mid, mlpOut];
    // Gemma 4: the per-layer input's block after the MLP, then the whole stream times layer_scalar
    let x = g.o('Add', [mid, mlpOut]);
    if (layer.perLayer) x = g.o('Add', [x, this.perLayer(l, layer.perLayer, x)]);
    if (layer.scalar) x = g.o('Mul', [x, this.W(layer.scalar)]);
    return [x, undefined];
  }

  /**
   * Gemma 4's per-layer input block: norm(W_proj (act(W_gate x) ⊙ p_l)), p_l this layer's slice of
   * the per-layer inputs (embed), x the stream after the MLP
   */
  private perLayer(l: number, s: PerLayerSpec, x: string): string {
    const { g, D } = this;
    const P = this.spec.perLayerInput!.width;
    const b = `blocks.${l}`;
    const input = this.hook(
      // `b t l p -> b t p` at l (Slice and Squeeze: the backward pass has both)
      g.o('Squeeze', [
        g.o('Slice', [this.perLayerInputs, g.constI([l]), g.constI([l + 1]), g.constI([2])]),
        g.constI([2]),
      ]),
      `${b}.hook_per_layer_input`,
    );
    const pre = this.hook(this.linear(x, s.gate, D, P), `${b}.per_layer.hook_pre`);
    const post = this.hook(g.o('Mul', [activation(g, pre, s.act, this.fused), input]), `${b}.per_layer.hook_post`);
    const out = this.norm(this.linear(post, s.proj, P, D), s.norm, `${b}.ln_per_layer.hook_scale`);
    return this.hook(out, `${b}.hook_per_layer_out`);
  }

  /** Gemma 4's per-layer inputs [B, T, L, P] (ModelSpec.perLayerInput), set by embed() */
  private perLayerInputs = '';

  // ---- the whole model

  /**
   * The graph inputs (token ids, rotary tables, masks) and the embeddings: hook_embed, and
   * hook_pos_embed for learned positions (undefined otherwise), the first residual stream's addends.
   */
  protected embed(): [string, string | undefined] {
    const { g, spec } = this;
    const ids = g.input('input_ids', 'int64', ['B', 'T']);
    this.bt = g.o('Shape', [ids]);
    if (spec.rotary) {
      const rd = spec.rotary.dim;
      this.cos = g.o('Unsqueeze', [g.input('rope_cos', 'float', ['T', rd]), g.constI([1])]); // `t rd -> t 1 rd`
      this.sin = g.o('Unsqueeze', [g.input('rope_sin', 'float', ['T', rd]), g.constI([1])]);
    }
    if (spec.rotaryLocal) {
      const rd = spec.rotaryLocal.dim;
      this.cosLocal = g.o('Unsqueeze', [g.input('rope_cos_local', 'float', ['T', rd]), g.constI([1])]);
      this.sinLocal = g.o('Unsqueeze', [g.input('rope_sin_local', 'float', ['T', rd]), g.constI([1])]);
    }
    this.mask = g.input('attn_mask', 'float', ['T', 'Tk']);
    if (spec.layers.some((l) => l.attn && l.attn.slidingWindow !== null))
      this.maskLocal = g.input('attn_mask_local', 'float', ['T', 'Tk']);

    // embeddings: W_E [V, D] gathered by token, W_pos [n_ctx, D] by position
    let x = lookupRows(g, vocabChunks(this.entry(spec.embed.w), this.plan.vocabRows), ids);
    if (spec.embed.scale !== 1) x = g.o('Mul', [x, this.c(spec.embed.scale)]);
    x = this.hook(x, 'hook_embed');
    const pl = spec.perLayerInput;
    if (pl) {
      // Gemma 4's per-layer inputs from the token (its own table, rows of L·P) and the embedding:
      // (RMSNorm_P(W_proj x · projScale) + E_pl[token] · embedScale) · inputScale, `b t (l p) -> b t l p`
      const { nLayers: L, dModel: D } = spec;
      const entry = this.entry(pl.embed);
      const rows = this.plan.vocabRows && Math.max(1, Math.floor((this.plan.vocabRows * D) / (L * pl.width)));
      const split = (t: string) => g.o('Reshape', [t, g.constI([0, 0, L, pl.width])]);
      const tok = g.o('Mul', [split(lookupRows(g, vocabChunks(entry, rows), ids)), this.c(pl.embedScale)]);
      const proj = g.o('Mul', [split(this.linear(x, pl.projection, D, L * pl.width)), this.c(pl.projScale)]);
      this.perLayerInputs = g.o('Mul', [g.o('Add', [this.norm(proj, pl.norm), tok]), this.c(pl.inputScale)]);
    }
    let posB: string | undefined;
    if (spec.posEmbed) {
      const pos = g.gatherRows(this.entry(spec.posEmbed.w), g.input('position_ids', 'int64', ['T'])); // [T, D]
      posB = this.hook(g.o('Expand', [pos, g.o('Shape', [x])]), 'hook_pos_embed');
    }
    return [x, posB];
  }

  /** The logits [B, P', V] of ln_final's output xf [B, T, D], at the positions asked for (input logit_positions). */
  protected logits(xf: string): void {
    const { g, spec, D } = this;
    // unembed, only at the positions asked for (the unembedding is the largest matmul per token):
    // W_U [V, D] (lm_head or the tied embedding), `b p d, v d -> b p v`
    const xp = g.o('Gather', [xf, g.input('logit_positions', 'int64', ['P'])], { axis: 1 }); // [B, P, D]
    const xu = g.o('Reshape', [xp, g.constI([-1, D])]);
    const bpV = g.o('Concat', [g.o('Shape', [xp], { start: 0, end: 2 }), g.constI([spec.dVocab])], { axis: 0 });
    let logits = g.o('Reshape', [this.unembed(xu), bpV]);
    if (spec.finalSoftcap !== null) logits = softcap(g, logits, spec.finalSoftcap);
    g.rename(logits, 'logits');
    g.output('logits');
    if (this.plan.hooks && !this.plan.grad) addLogitPicks(g);
  }

  /** the graph as built so far, encoded */
  protected built(): BuiltGraph {
    return this.g.built(this.sites);
  }

  build(): BuiltGraph {
    const { spec } = this;
    // the residual stream: each block's two addends are summed together with the norm that reads them
    let addends: [string, string | undefined] = this.embed();
    for (let l = 0; l < spec.nLayers; l++) {
      const hooks = [...(l > 0 ? [`blocks.${l - 1}.hook_resid_post`] : []), `blocks.${l}.hook_resid_pre`];
      const { sum, normed } = this.addNorm(...addends, hooks, spec.layers[l].ln1, `blocks.${l}.ln1.hook_scale`);
      addends = this.block(l, sum, normed);
    }

    const xf = this.addNorm(
      ...addends,
      [`blocks.${spec.nLayers - 1}.hook_resid_post`],
      spec.lnFinal,
      'ln_final.hook_scale',
    ).normed;
    this.logits(xf);
    if (this.plan.grad) addModelBackward(this.g, spec, this.plan.grad.hooks);
    this.plan.extra?.(this.g);
    return this.built();
  }
}

export function buildModelGraph(
  spec: ModelSpec,
  tensors: Map<string, TensorEntry>,
  plan: GraphPlan,
  location: (file: string) => string = (f) => f,
): BuiltGraph {
  return new ModelGraph(spec, tensors, plan, location).build();
}

/**
 * The logit lens as a graph: S streams of P residual vectors [S, P, D] → final norm with each
 * vector's OWN statistics → unembedding → final soft-cap → logits [S, P, V]. Lets the lens run on
 * the backend (WebGPU/WASM/CPU) instead of an N·D·V loop in JS, and reduces the logits there too,
 * so that only what a document shows leaves the session (S·P·V floats would be ~40 MB for GPT-2
 * small at 16 tokens, and a JS pass over them cost more than the unembedding):
 *   top_logits / top_ids [S, P, k]  the k largest logits (input `k` int64 [1]), largest first,
 *                                   ties lower id first
 *   logsumexp  [S, P]               log Σ_v exp(logit_v), max-shifted
 *   final_ids  [P]                  argmax of the LAST stream's logits (first on ties)
 *   final_logit [S, P]              each stream's logit of that token
 *   final_above [S, P]              how many tokens have a larger logit (its rank − 1)
 */
export function buildLensGraph(
  spec: ModelSpec,
  tensors: Map<string, TensorEntry>,
  location: (file: string) => string = (f) => f,
  precision: WeightPrecision = 'f32',
  vocabRows?: number,
): BuiltGraph {
  const g = new OnnxGraph(location, precision);
  const x = g.input('resid', 'float', ['S', 'P', spec.dModel]);
  const out = lensNodes(g, spec, tensors, x, g.input('k', 'int64', [1]), vocabRows);
  g.output(g.rename(out.logits, 'logits'));
  for (const name of LENS_OUTPUTS) g.output(g.rename(out[name], name), LENS_INT64.has(name) ? 'int64' : 'float');
  return g.built();
}

export const LENS_OUTPUTS = ['top_logits', 'top_ids', 'logsumexp', 'final_ids', 'final_logit', 'final_above'];
const LENS_INT64 = new Set(['top_ids', 'final_ids']);

/**
 * The lens of residual vectors x [S, P, D]: ln_final with each vector's own statistics, W_U (+ b_U),
 * the soft-cap, then reduced to the k largest logits, the log-normaliser and the final prediction's
 * logit and rank (the last stream is the final resid_post: its argmax is the model's prediction).
 */
function lensNodes(
  g: OnnxGraph,
  spec: ModelSpec,
  tensors: Map<string, TensorEntry>,
  x: string,
  k: string,
  vocabRows?: number,
): Record<string, string> {
  const W = (name: string, after?: string) => g.weight(tensors.get(name)!, after);
  const D = spec.dModel;
  const xn = g.o('Reshape', [normalize(g, W, x, spec.lnFinal, undefined, true), g.constI([-1, D])]);
  let flat = unembedRows(
    g,
    vocabChunks(tensors.get(spec.unembed.w)!, vocabRows),
    spec.unembed.b ? tensors.get(spec.unembed.b) : undefined,
    xn,
  ); // `n d, v d -> n v`
  if (spec.finalSoftcap !== null) flat = softcap(g, flat, spec.finalSoftcap);
  const sp = g.o('Shape', [x], { start: 0, end: 2 });
  const logits = g.o('Reshape', [flat, g.o('Concat', [sp, g.constI([spec.dVocab])], { axis: 0 })]);
  const [topV, topI] = g.op('TopK', [logits, k], { axis: -1, largest: 1, sorted: 1 }, 2);
  const max = g.o('ReduceMax', [logits], { axes: [-1], keepdims: 1 });
  const lse = g.o('Add', [
    g.o('Squeeze', [max, g.constI([-1])]),
    g.o('Log', [g.o('ReduceSum', [g.o('Exp', [g.o('Sub', [logits, max])]), g.constI([-1])], { keepdims: 0 })]),
  ]);
  // the model's own prediction: the last stream is the final resid_post, so its lens is the model's unembedding
  const last = g.o('Slice', [logits, g.constI([-1]), g.constI([2 ** 31 - 1]), g.constI([0])]); // [1, P, V]
  const fid = g.o('ArgMax', [last], { axis: -1, keepdims: 1 }); // [1, P, 1]
  const fidAll = g.o('Expand', [fid, g.o('Concat', [sp, g.constI([1])], { axis: 0 })]); // [S, P, 1]
  const flog = g.o('GatherElements', [logits, fidAll], { axis: -1 }); // [S, P, 1]
  const above = g.o('ReduceSum', [g.o('Cast', [g.o('Greater', [logits, flog])], { to: 1 }), g.constI([-1])], {
    keepdims: 0,
  });
  return {
    logits,
    top_logits: topV,
    top_ids: topI,
    logsumexp: lse,
    final_ids: g.o('Reshape', [fid, g.constI([-1])]),
    final_logit: g.o('Squeeze', [flog, g.constI([-1])]),
    final_above: above,
  };
}

/** the hooked graph's lens inputs (addForwardLens): int64 [] k (0: no lens, every other run), int64 [P] positions */
export const LENS_K = 'lens.k';
export const LENS_POSITIONS = 'lens.positions';
/** the streams the logit lens reads: every layer's resid_pre, then the final resid_post */
export const lensHooks = (L: number): string[] => [
  ...Array.from({ length: L }, (_, l) => `blocks.${l}.hook_resid_pre`),
  `blocks.${L - 1}.hook_resid_post`,
];
/** the forward graph's lens outputs: LENS_OUTPUTS under `lens.` */
export const FORWARD_LENS_OUTPUTS = LENS_OUTPUTS.map((n) => `lens.${n}`);

/**
 * The logit lens in the forward graph (WebGPU, beside the readout's If): the then-branch of
 * an If on LENS_K > 0 gathers the lens streams (lensHooks, graph outputs) at LENS_POSITIONS, stacks
 * them [L + 1, P, D] and reduces them as lensNodes does, with the forward's own ln_final and W_U
 * (no second copy in GPU memory; 16-bit or q8 tables widened in the branch). Only the reduced
 * outputs leave the device, never the streams. A forward's k is 0: the else-branch gives empty ones.
 */
export function addForwardLens(
  g: OnnxGraph,
  spec: ModelSpec,
  tensors: Map<string, TensorEntry>,
  vocabRows?: number,
): void {
  const k = g.input(LENS_K, 'int64', []);
  const positions = g.input(LENS_POSITIONS, 'int64', ['lens_P']);
  const flag = g.o('Greater', [k, g.constI([0], [])]);
  const then = g.bodyWithWeights('lnt_');
  const streams = lensHooks(spec.nLayers).map((h) => then.o('Gather', [h, positions], { axis: 1 })); // [1, P, D]
  const out = lensNodes(
    then,
    spec,
    tensors,
    then.concat(streams, 0),
    then.o('Reshape', [k, then.constI([1])]),
    vocabRows,
  );
  const other = g.body('lne_');
  const none = other.o('ConstantOfShape', [other.constI([0])], { value: { tensor: { dims: [1], floats: [0] } } });
  for (const name of LENS_OUTPUTS) {
    const type = LENS_INT64.has(name) ? 'int64' : 'float';
    then.output(then.rename(then.o('Identity', [out[name]]), `lnt_${name}`), type);
    const empty = type === 'int64' ? other.o('Cast', [none], { to: 7 }) : other.o('Identity', [none]);
    other.output(other.rename(empty, `lne_${name}`), type);
  }
  const got = g.op('If', [flag], { then_branch: { graph: then }, else_branch: { graph: other } }, LENS_OUTPUTS.length);
  LENS_OUTPUTS.forEach((name, i) =>
    g.output(g.rename(got[i], `lens.${name}`), LENS_INT64.has(name) ? 'int64' : 'float'),
  );
}
