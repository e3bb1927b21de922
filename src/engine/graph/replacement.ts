/**
 * The frozen local replacement model's backward pass, for attribution graphs (circuit-tracer's
 * definitions; replacement_model_transformerlens.py:197-232, context_transformerlens.py:168-232):
 * attention patterns and every norm's scale are constants of the clean run, each MLP is cut except
 * the transcoder's linear skip, so every target is an affine function of the sources and an edge
 * is one vector-Jacobian product. Many targets go at once, one per batch row.
 *
 * The frozen model, per block (TL hook names; biases, positions and position 0 are constants and
 * drop out of the gradient):
 *   x1 = ln1(r) with frozen scale   v = x1·W_V   z_h = P_h v_kv(h)   a = Σ_h z_h W_O[h]  [post-norm]
 *   mid = r + a    x_l = in_hook(mid)    o_l = skip(x_l) + sources at o_l    r' = mid + o_l
 *   y = ln_final(r_L)
 * Its transpose is written here by hand: VJP by VJP, last block first. (backward.ts's generic
 * transform would do the same arithmetic but its rules read the shapes of forward tensors, so
 * onnxruntime would run the frozen forward too, doubling the work; here nothing forward runs.)
 *
 * Inputs (B rows, T positions, L layers):
 *   seed_vec [B, D]            each row's target vector u_t (an encoder row, or a demeaned W_U column)
 *   seed_at  [L+1, B, T, 1]    1 where row b's target reads: layer l's feature-input hook, or (l = L) y
 *   pattern  [L, H, T, T]      clean attention patterns
 *   scale_ln1 / scale_ln2 / [scale_post_attn] [L, T, 1], scale_lnf [T, 1]   clean norm scales
 *   src_embed [T, D]           the token sources' vectors at hook_embed
 *   src_err   [L, T, D]        the error vectors at each feature-output hook
 *   src_dec_{m} [T, P_m, D]    decoder vectors × activation of the features writing to layer m's
 *                              output, by position (padded with zero rows to P_m per position)
 * Outputs: out_embed [B, T], out_err [B, L, T], out_dec_{m} [T, B, P_m]: the source dot products
 * u_tᵀ J v_s, i.e. rows of the adjacency A[target, source].
 *
 * buildReplacementForward is the same frozen model run forward, for interventions with the error
 * nodes held fixed: `delta` [L, B, T, D] added at each feature-output hook → `y_last` [B, D], the
 * change of ln_final's output at the last position (the model is affine, so this is exact).
 */
import { OnnxGraph } from './onnx-builder';
import type { BuiltGraph } from './build-model';
import { attentionOf, type LinearRef, type ModelSpec, type NormSpec } from '../spec';
import type { TensorEntry } from '../safetensors-types';
import type { WeightPrecision } from '../precision';
import type { TranscoderSpec } from '../transcoder';

export const REPLACEMENT_OUTPUTS = (L: number) => [
  'out_embed',
  'out_err',
  ...Array.from({ length: L }, (_, m) => `out_dec_${m}`),
];

/** The frozen model's pieces over one graph: its weights, the frozen norms and linear maps both ways. */
function frozenPieces(g: OnnxGraph, spec: ModelSpec, tensors: Map<string, TensorEntry>, shapeOf: string) {
  const entry = (name: string) => {
    const e = tensors.get(name);
    if (!e) throw new Error(`replacement graph: tensor ${name} not in the weight index`);
    return e;
  };
  const W = (name: string) => g.weight(entry(name));
  const { dModel: D, nHeads: H, dHead: Dh } = spec;
  const c = (v: number) => g.constF([v], []);
  const bt = g.o('Slice', [g.o('Shape', [shapeOf]), g.constI([1]), g.constI([3])]); // [B, T]
  const shapes = new Map<number, string>();
  const btN = (n: number) => {
    if (!shapes.has(n)) shapes.set(n, g.o('Concat', [bt, g.constI([n])], { axis: 0 }));
    return shapes.get(n)!;
  };
  /** x[l] of an input stacked over layers */
  const at = (x: string, l: number) =>
    g.o('Squeeze', [g.o('Slice', [x, g.constI([l]), g.constI([l + 1]), g.constI([0])]), g.constI([0])]);
  const wEff = (n: NormSpec) => (n.weightOffset ? g.o('Add', [W(n.w), c(1)]) : W(n.w));
  const centre = (y: string) => g.o('Sub', [y, g.o('ReduceMean', [y], { axes: [-1], keepdims: 1 })]);
  return {
    W,
    btN,
    at,
    /** a norm with frozen scale s, its linear part: LayerNorm (x − x̄)/s ⊙ w, RMSNorm x/s ⊙ w */
    norm(x: string, n: NormSpec, s: string, weighted = true) {
      const y = g.o('Div', [n.kind === 'layernorm' ? centre(x) : x, s]);
      return weighted ? g.o('Mul', [y, wEff(n)]) : y;
    },
    /** its transpose: LayerNorm C(g ⊙ w / s) (C: centring; symmetric), RMSNorm g ⊙ w / s */
    normT(gr: string, n: NormSpec, s: string, weighted = true) {
      const y = g.o('Div', [weighted ? g.o('Mul', [gr, wEff(n)]) : gr, s]);
      return n.kind === 'layernorm' ? centre(y) : y;
    },
    /** y = x·op(W): torch [out, in] `b t i, o i -> b t o`, Conv1D [in, out] `b t i, i o -> b t o` */
    lin(x: string, w: string, layout: LinearRef['layout'], inDim: number, outDim: number) {
      const x2 = g.o('Reshape', [x, g.constI([-1, inDim])]);
      return g.o('Reshape', [g.o('Gemm', [x2, w], layout === 'out_in' ? { transB: 1 } : {}), btN(outDim)]);
    },
    /** its transpose: `b t o, o i -> b t i` / `b t o, i o -> b t i` */
    linT(gr: string, w: string, layout: LinearRef['layout'], inDim: number, outDim: number) {
      const g2 = g.o('Reshape', [gr, g.constI([-1, outDim])]);
      return g.o('Reshape', [g.o('Gemm', [g2, w], layout === 'out_in' ? {} : { transB: 1 }), btN(inDim)]);
    },
    /** W_V as its own weight [Hkv·Dh, D] (out_in) or [D, Hkv·Dh] (in_out), out of a fused projection where there is one */
    wV(l: number): { w: string; layout: LinearRef['layout'] } {
      const q = attentionOf(spec, l).qkv;
      if (q.kind === 'separate') return { w: W(q.v.w), layout: q.v.layout };
      if (q.kind === 'gpt2_fused') {
        // c_attn Conv1D [D, 3D], columns q | k | v
        return { w: g.o('Slice', [W(q.qkv.w), g.constI([2 * D]), g.constI([3 * D]), g.constI([1])]), layout: 'in_out' };
      }
      // NeoX query_key_value [3D, D], rows `(h three dh)`
      const w4 = g.o('Reshape', [W(q.qkv.w), g.constI([H, 3, Dh, D])]);
      return {
        w: g.o('Reshape', [g.o('Slice', [w4, g.constI([2]), g.constI([3]), g.constI([1])]), g.constI([H * Dh, D])]),
        layout: 'out_in',
      };
    },
    /** skip(x) = x·W_skipᵀ ('x_Wt') or x·W_skip ('x_W'), and its transpose */
    skip(x: string, w: TensorEntry, layout: 'x_Wt' | 'x_W', transpose: boolean) {
      const x2 = g.o('Reshape', [x, g.constI([-1, D])]);
      const tB = (layout === 'x_Wt') !== transpose;
      return g.o('Reshape', [g.o('Gemm', [x2, g.weight(w)], tB ? { transB: 1 } : {}), btN(D)]);
    },
  };
}

/** the inputs both directions take: patterns and norm scales of the clean run */
function frozenInputs(g: OnnxGraph, spec: ModelSpec) {
  const { nLayers: L, nHeads: H } = spec;
  const post = spec.layers.some((l) => l.postAttnNorm);
  return {
    pattern: g.input('pattern', 'float', [L, H, 'T', 'T']),
    s1: g.input('scale_ln1', 'float', [L, 'T', 1]),
    s2: g.input('scale_ln2', 'float', [L, 'T', 1]),
    spa: post ? g.input('scale_post_attn', 'float', [L, 'T', 1]) : '',
    sf: g.input('scale_lnf', 'float', ['T', 1]),
  };
}

/** A builder of the frozen model: `body` writes its graph over the weights and the transcoder set. */
function frozenGraph(
  body: (g: OnnxGraph, spec: ModelSpec, tensors: Map<string, TensorEntry>, tc: TranscoderSpec) => void,
) {
  return (
    spec: ModelSpec,
    tensors: Map<string, TensorEntry>,
    tc: TranscoderSpec,
    precision: WeightPrecision = 'f32',
    location: (file: string) => string = (f) => f,
  ): BuiltGraph => {
    const g = new OnnxGraph(location, precision);
    body(g, spec, tensors, tc);
    return g.built();
  };
}

/** the feature-input hook's transpose is a norm's unless it is the residual itself (RMSNorm's hook_normalized stops before w) */
const inHookWeighted = (tc: TranscoderSpec, n: NormSpec) =>
  !(tc.info.input_hook === 'ln2.hook_normalized' && n.kind === 'rmsnorm');

export const buildReplacementGraph = frozenGraph((g, spec, tensors, tc) => {
  const { nLayers: L, dModel: D, nHeads: H, nKvHeads: Hkv, dHead: Dh } = spec;
  const rep = H / Hkv;
  const seedVec = g.input('seed_vec', 'float', ['B', D]);
  const seedAt = g.input('seed_at', 'float', [L + 1, 'B', 'T', 1]);
  const { pattern, s1, s2, spa, sf } = frozenInputs(g, spec);
  const srcEmbed = g.input('src_embed', 'float', ['T', D]);
  const srcErr = g.input('src_err', 'float', [L, 'T', D]);
  const f = frozenPieces(g, spec, tensors, seedAt);
  const vecRow = g.o('Unsqueeze', [seedVec, g.constI([1])]); // [B, 1, D]
  const inject = (l: number) => g.o('Mul', [f.at(seedAt, l), vecRow]); // [B, T, D]

  // the final norm's output y (the logit targets' place)
  let gr = f.normT(inject(L), spec.lnFinal, sf);
  const errOut: string[] = [];
  for (let l = L - 1; l >= 0; l--) {
    const layer = spec.layers[l];
    // gr is ∂/∂ resid_post_l = ∂/∂ o_l: read the sources that enter at this layer's feature-output hook
    errOut.unshift(g.o('ReduceSum', [g.o('Mul', [gr, f.at(srcErr, l)]), g.constI([2])], { keepdims: 0 })); // [B, T]
    const dec = g.input(`src_dec_${l}`, 'float', ['T', `P${l}`, D]);
    const out = g.o('MatMul', [
      g.o('Transpose', [gr], { perm: [1, 0, 2] }),
      g.o('Transpose', [dec], { perm: [0, 2, 1] }),
    ]);
    g.rename(out, `out_dec_${l}`); // [T, B, P_l]
    g.output(`out_dec_${l}`);

    // o_l = skip(x_l) + …; x_l = in_hook(mid); targets at x_l are injected here
    let gx = inject(l);
    const sk = tc.layers[l].W_skip;
    if (sk) gx = g.o('Add', [gx, f.skip(gr, sk, tc.layers[l].skipLayout, true)]);
    const gmid = g.o('Add', [
      gr,
      tc.info.input_hook === 'hook_resid_mid'
        ? gx
        : f.normT(gx, layer.ln2!, f.at(s2, l), inHookWeighted(tc, layer.ln2!)),
    ]);

    // attention's value path: a = Σ_h (P_h v) W_O[h], v = ln1(r) W_V
    let ga = gmid;
    if (layer.postAttnNorm) ga = f.normT(ga, layer.postAttnNorm, f.at(spa, l));
    const gz = f.linT(ga, f.W(attentionOf(spec, l).o.w), attentionOf(spec, l).o.layout, H * Dh, D); // [B, T, H·Dh]
    const gzh = g.o('Transpose', [g.o('Reshape', [gz, g.constI([0, 0, H, Dh])])], { perm: [0, 2, 1, 3] }); // [B, H, T, Dh]
    const pT = g.o('Transpose', [f.at(pattern, l)], { perm: [0, 2, 1] }); // [H, Tk, Tq]
    let gv = g.o('MatMul', [pT, gzh]); // [B, H, Tk, Dh]
    // grouped-query attention: kv head k serves query heads k·rep … k·rep + rep − 1
    if (rep > 1)
      gv = g.o('ReduceSum', [g.o('Reshape', [gv, g.constI([0, Hkv, rep, -1, Dh])]), g.constI([2])], { keepdims: 0 });
    const gvFlat = g.o('Reshape', [g.o('Transpose', [gv], { perm: [0, 2, 1, 3] }), f.btN(Hkv * Dh)]);
    const v = f.wV(l);
    const gx1 = f.linT(gvFlat, v.w, v.layout, D, Hkv * Dh);
    gr = g.o('Add', [gmid, f.normT(gx1, layer.ln1!, f.at(s1, l))]);
  }
  // ∂/∂ hook_embed: the token sources
  g.rename(g.o('ReduceSum', [g.o('Mul', [gr, srcEmbed]), g.constI([2])], { keepdims: 0 }), 'out_embed');
  g.output('out_embed');
  const err = g.concat(
    errOut.map((e) => g.o('Unsqueeze', [e, g.constI([1])])),
    1,
  );
  g.identity(err, 'out_err');
  g.output('out_err');
});

export const buildReplacementForward = frozenGraph((g, spec, tensors, tc) => {
  const { nLayers: L, dModel: D, nHeads: H, nKvHeads: Hkv, dHead: Dh } = spec;
  const rep = H / Hkv;
  const delta = g.input('delta', 'float', [L, 'B', 'T', D]);
  const { pattern, s1, s2, spa, sf } = frozenInputs(g, spec);
  const f = frozenPieces(g, spec, tensors, delta);
  let r: string | null = null; // no token is changed: the stream starts at zero
  for (let l = 0; l < L; l++) {
    const layer = spec.layers[l];
    let mid: string | null = r;
    if (r !== null) {
      const v = f.wV(l);
      const vh = g.o(
        'Transpose',
        [
          g.o('Reshape', [
            f.lin(f.norm(r, layer.ln1!, f.at(s1, l)), v.w, v.layout, D, Hkv * Dh),
            g.constI([0, 0, Hkv, Dh]),
          ]),
        ],
        {
          perm: [0, 2, 1, 3],
        },
      ); // [B, Hkv, T, Dh]
      const vAll =
        rep === 1
          ? vh
          : g.o('Reshape', [
              g.o('Expand', [g.o('Unsqueeze', [vh, g.constI([2])]), g.constI([1, 1, rep, 1, 1])]),
              g.constI([0, H, -1, Dh]),
            ]);
      const z = g.o('MatMul', [f.at(pattern, l), vAll]); // [B, H, T, Dh]
      const zFlat = g.o('Reshape', [g.o('Transpose', [z], { perm: [0, 2, 1, 3] }), f.btN(H * Dh)]);
      let a = f.lin(zFlat, f.W(attentionOf(spec, l).o.w), attentionOf(spec, l).o.layout, H * Dh, D);
      if (layer.postAttnNorm) a = f.norm(a, layer.postAttnNorm, f.at(spa, l));
      mid = g.o('Add', [r, a]);
    }
    let mo = f.at(delta, l);
    const sk = tc.layers[l].W_skip;
    if (mid !== null && sk) {
      const x =
        tc.info.input_hook === 'hook_resid_mid'
          ? mid
          : f.norm(mid, layer.ln2!, f.at(s2, l), inHookWeighted(tc, layer.ln2!));
      mo = g.o('Add', [mo, f.skip(x, sk, tc.layers[l].skipLayout, false)]);
    }
    r = mid === null ? mo : g.o('Add', [mid, mo]);
  }
  const y = f.norm(r!, spec.lnFinal, sf);
  const last = g.o('Slice', [y, g.constI([-1]), g.constI([2 ** 31 - 1]), g.constI([1])]); // [B, 1, D]
  g.rename(g.o('Reshape', [last, g.constI([-1, D])]), 'y_last');
  g.output('y_last');
});
