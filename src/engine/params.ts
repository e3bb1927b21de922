/**
 * Parameters under TransformerLens names and shapes, read from the stored (unprocessed) weights.
 * Layout conversions live here and only here: Linear [out,in], Conv1D [in,out], GPT-2's fused
 * q|k|v columns, GPT-NeoX's per-head [H,3,Dh] rows.
 */
import { LoupeError } from './errors';
import {
  attentionOf,
  headsOf,
  uniformLayers,
  type AttentionSpec,
  type ModelSpec,
  type LinearRef,
  type NormSpec,
} from './spec';
import type { Tensor } from './tensor';

/**
 * A stored tensor's values as float32. `into`: scratch its bytes may be read into, so that a caller
 * reading tensor after tensor reuses one buffer; the result may then be a view of it, valid until
 * the next read into it.
 */
export type ReadTensor = (name: string, into?: Uint8Array) => Float32Array;

/**
 * Where element (out o, in i) of a linear map stored in either layout sits: base + o·oStep + i·iStep
 * (a fused matrix's rows: o counts from rows.start). The loops below step through it, so that a
 * matrix is read without a call per element.
 */
function steps(ref: LinearRef, nIn: number, nOut: number): { base: number; oStep: number; iStep: number } {
  return ref.layout === 'out_in'
    ? { base: (ref.rows?.start ?? 0) * nIn, oStep: nIn, iStep: 1 }
    : { base: 0, oStep: 1, iStep: nOut };
}

/** where q (0), k (1) or v (2) of a layer is stored: its matrix, that matrix's output count, and head h's dim k as output first(h) + k */
function qkvColumns(
  spec: ModelSpec,
  a: AttentionSpec,
  which: 0 | 1 | 2,
): { ref: LinearRef; nOut: number; first: (h: number) => number } {
  const { dModel: D, nHeads: H } = spec;
  // the layer's own key/value heads and head width (Gemma 4's full-attention layers differ)
  const [Hkv, Dh] = [a.nKvHeads ?? spec.nKvHeads, a.dHead ?? spec.dHead];
  // Qwen3.5's gated q_proj holds per head Dh query rows then Dh gate rows: `(h two dh)`
  if (a.qkv.kind === 'separate' && which === 0 && a.outputGate)
    return { ref: a.qkv.q, nOut: 2 * H * Dh, first: (h) => 2 * h * Dh };
  if (a.qkv.kind === 'separate')
    return { ref: [a.qkv.q, a.qkv.k, a.qkv.v][which], nOut: (which === 0 ? H : Hkv) * Dh, first: (h) => h * Dh };
  return {
    ref: a.qkv.qkv,
    nOut: 3 * D,
    first: a.qkv.kind === 'gpt2_fused' ? (h) => which * D + h * Dh : (h) => (h * 3 + which) * Dh,
  };
}

/**
 * init_l + x_l · W_V_l for every layer l (x [L, d_model], init [L, Hkv·Dh]): out[l, kv·Dh + k] =
 * init[l, kv·Dh + k] + Σ_d x[l, d] · W_V_l[kv, d, k] in float64, the terms added in order of d and
 * those where x is 0 left out (the same sums as a loop over readParam's W_V), each matrix read as
 * stored and used before the next is read (so `read` may reuse one buffer): no [Hkv, D, Dh] copy of
 * W_V. A layer whose x is all zero gets its init, and its W_V is not read.
 */
export function valueProduct(spec: ModelSpec, read: ReadTensor, x: Float32Array, init: Float64Array): Float64Array {
  const { dModel: D, nKvHeads: Hkv, dHead: Dh, nLayers: L } = spec;
  if (!uniformLayers(spec))
    throw new LoupeError(
      'UNSUPPORTED_OP',
      `valueProduct stacks one W_V per layer of ${Hkv}·${Dh} outputs; this ${spec.family} model's layers differ.`,
    );
  const out = Float64Array.from(init);
  for (let l = 0; l < L; l++) {
    const xl = x.subarray(l * D, (l + 1) * D);
    if (xl.every((v) => v === 0)) continue;
    const { ref, nOut, first } = qkvColumns(spec, attentionOf(spec, l), 2);
    const w = read(ref.w);
    const { base, oStep, iStep } = steps(ref, D, nOut);
    const o = l * Hkv * Dh;
    if (ref.layout === 'in_out') {
      // [in, out]: row d holds every head's outputs
      for (let d = 0; d < D; d++) {
        const xd = xl[d];
        if (xd === 0) continue;
        for (let h = 0; h < Hkv; h++) {
          const src = base + d * iStep + first(h),
            dst = o + h * Dh;
          for (let k = 0; k < Dh; k++) out[dst + k] += xd * w[src + k];
        }
      }
    } else {
      // [out, in]: row o holds output o over every d
      for (let h = 0; h < Hkv; h++)
        for (let k = 0; k < Dh; k++) {
          const src = base + (first(h) + k) * oStep;
          let acc = out[o + h * Dh + k];
          for (let d = 0; d < D; d++) if (xl[d] !== 0) acc += xl[d] * w[src + d * iStep];
          out[o + h * Dh + k] = acc;
        }
    }
  }
  return out;
}

/** a linear map's bias (its rows of a fused bias), or undefined */
function biasOf(ref: LinearRef | undefined, read: ReadTensor): Float32Array | undefined {
  if (!ref?.b) return undefined;
  const b = read(ref.b);
  return ref.rows ? b.slice(ref.rows.start, ref.rows.start + ref.rows.count) : Float32Array.from(b);
}

export function readParam(spec: ModelSpec, read: ReadTensor, name: string): Tensor {
  const { dModel: D, nHeads: H, dVocab: V } = spec;
  const unknown = () =>
    new LoupeError(
      'BAD_INPUT',
      `Unknown parameter '${name}'.`,
      'Use TransformerLens names, e.g. blocks.0.attn.W_O, unembed.W_U, ln_final.w.',
    );
  const normW = (n: NormSpec | undefined): Tensor => {
    if (!n) throw unknown(); // a block without that norm (OLMo 2 has no pre-norms)
    const w = Float32Array.from(read(n.w));
    if (n.weightOffset) for (let i = 0; i < w.length; i++) w[i] += 1;
    return { dims: [w.length], data: w };
  };
  // absent biases, and those of absent norms, read as zeros (code adds them unconditionally)
  const normB = (n: NormSpec | undefined): Tensor => ({
    dims: [D],
    data: n?.b ? Float32Array.from(read(n.b)) : new Float32Array(D),
  });

  if (name === 'embed.W_E') return { dims: [V, D], data: Float32Array.from(read(spec.embed.w)) };
  if (name === 'pos_embed.W_pos') {
    if (!spec.posEmbed) throw unknown();
    const w = read(spec.posEmbed.w);
    return { dims: [w.length / D, D], data: Float32Array.from(w) };
  }
  if (name === 'ln_final.w') return normW(spec.lnFinal);
  if (name === 'ln_final.b') return normB(spec.lnFinal);
  if (name === 'unembed.W_U') {
    const w = read(spec.unembed.w); // [V, D]
    const out = new Float32Array(D * V);
    for (let v = 0; v < V; v++) for (let d = 0; d < D; d++) out[d * V + v] = w[v * D + d];
    return { dims: [D, V], data: out };
  }
  if (name === 'unembed.b_U')
    return { dims: [V], data: spec.unembed.b ? Float32Array.from(read(spec.unembed.b)) : new Float32Array(V) };

  const m = /^blocks\.(\d+)\.(.+)$/.exec(name);
  if (!m) throw unknown();
  const l = Number(m[1]);
  const layer = spec.layers[l];
  if (!layer) throw unknown();
  const key = m[2];
  const attn = () => attentionOf(spec, l);
  // this layer's head geometry and MLP width (Gemma 4's differ by layer)
  const { Hkv, Dh } = headsOf(spec, l);
  const M = layer.mlp?.width ?? spec.dMlp;

  // q/k/v: which rows/cols of which stored tensor hold head h, dim k
  const qkvWeight = (which: 0 | 1 | 2): Tensor => {
    const heads = which === 0 ? H : Hkv;
    const out = new Float32Array(heads * D * Dh);
    const { ref, nOut, first } = qkvColumns(spec, attn(), which);
    const w = read(ref.w);
    const { base, oStep, iStep } = steps(ref, D, nOut);
    for (let h = 0; h < heads; h++) {
      const hb = base + first(h) * oStep;
      for (let d = 0; d < D; d++) {
        const src = hb + d * iStep,
          dst = (h * D + d) * Dh;
        for (let k = 0; k < Dh; k++) out[dst + k] = w[src + k * oStep];
      }
    }
    return { dims: [heads, D, Dh], data: out };
  };
  const qkvBias = (which: 0 | 1 | 2): Tensor => {
    const heads = which === 0 ? H : Hkv;
    const out = new Float32Array(heads * Dh);
    const a = attn();
    if (a.qkv.kind === 'separate') {
      const b = biasOf([a.qkv.q, a.qkv.k, a.qkv.v][which], read);
      if (b) out.set(b);
    } else if (a.qkv.qkv.b) {
      const b = read(a.qkv.qkv.b);
      for (let h = 0; h < heads; h++)
        for (let k = 0; k < Dh; k++)
          out[h * Dh + k] = b[a.qkv.kind === 'gpt2_fused' ? which * D + h * Dh + k : (h * 3 + which) * Dh + k];
    }
    return { dims: [heads, Dh], data: out };
  };
  const linearInOut = (ref: LinearRef, nIn: number, nOut: number): Tensor => {
    const w = read(ref.w);
    const { base, oStep, iStep } = steps(ref, nIn, nOut);
    const out = new Float32Array(nIn * nOut);
    for (let i = 0; i < nIn; i++) {
      const src = base + i * iStep,
        dst = i * nOut;
      for (let o = 0; o < nOut; o++) out[dst + o] = w[src + o * oStep];
    }
    return { dims: [nIn, nOut], data: out };
  };
  const bias = (ref: LinearRef | undefined, n: number): Tensor => ({
    dims: [n],
    data: biasOf(ref, read) ?? new Float32Array(n),
  });

  // attn.W_Q / W_K / W_V and attn.b_Q / b_K / b_V: q, k or v
  const qkv = /^attn\.([Wb])_([QKV])$/.exec(key);
  if (qkv) {
    const which = 'QKV'.indexOf(qkv[2]) as 0 | 1 | 2;
    const from = layer.attn?.kvFrom;
    if (which > 0 && from !== undefined)
      throw new LoupeError(
        'BAD_INPUT',
        `Layer ${l} has no ${qkv[1]}_${qkv[2]} of its own: it attends with layer ${from}'s keys and values (KV sharing).`,
        `Read blocks.${from}.attn.${qkv[1]}_${qkv[2]}.`,
      );
    return qkv[1] === 'W' ? qkvWeight(which) : qkvBias(which);
  }
  if (layer.moe) {
    // TransformerLens's MoE names: the router is mlp.W_gate [D, E]; expert e's mlp.experts.{e}.W_in / W_gate [D, M], W_out [M, D]
    const moe = layer.moe;
    const ex = /^mlp\.(?:experts\.(\d+)|(shared_expert))\.(W_in|W_gate|W_out)$/.exec(key);
    const expert = ex ? (ex[2] ? moe.shared?.mlp : moe.experts[Number(ex[1])]) : undefined;
    const Me = ex?.[2] ? (moe.shared?.dMlp ?? 0) : moe.dExpert;
    if (expert && ex![3] === 'W_in') return linearInOut(expert.up, D, Me);
    if (expert && ex![3] === 'W_gate') return linearInOut(expert.gate, D, Me);
    if (expert && ex![3] === 'W_out') return linearInOut(expert.down, Me, D);
    // Gemma 4's experts beside a dense MLP (whose W_in / W_gate / W_out keep their names): the router is mlp.W_router
    const bs = moe.beside;
    if (key === (bs ? 'mlp.W_router' : 'mlp.W_gate')) return linearInOut(moe.router, D, moe.experts.length);
    if (!bs && key === 'mlp.b_out') return bias(undefined, D);
    if (bs) {
      const vector = (name: string, n: number): Tensor => ({ dims: [n], data: Float32Array.from(read(name)) });
      if (key === 'mlp.router_scale') return vector(bs.routerNorm.w, D);
      if (key === 'mlp.per_expert_scale') return vector(bs.expertScale, moe.experts.length);
      if (key === 'ln2_experts.w') return normW(bs.preNorm);
      if (key === 'ln2_post_dense.w') return normW(bs.denseNorm);
      if (key === 'ln2_post_experts.w') return normW(bs.postNorm);
    }
  }
  switch (key) {
    case 'ln1.w':
      return normW(layer.ln1);
    case 'ln1.b':
      return normB(layer.ln1);
    case 'ln2.w':
      return normW(layer.ln2);
    case 'ln2.b':
      return normB(layer.ln2);
    case 'ln1_post.w':
      if (layer.postAttnNorm) return normW(layer.postAttnNorm);
      break;
    case 'ln2_post.w':
      if (layer.postMlpNorm) return normW(layer.postMlpNorm);
      break;
    case 'attn.W_O': {
      const t = linearInOut(attn().o, H * Dh, D); // [H*Dh, D] = [H, Dh, D]
      return { dims: [H, Dh, D], data: t.data };
    }
    case 'attn.b_O':
      return bias(attn().o, D);
    case 'mlp.W_in':
      if (layer.mlp) return linearInOut(layer.mlp.up, D, M);
      break;
    case 'mlp.b_in':
      if (layer.mlp) return bias(layer.mlp.up, M);
      break;
    case 'mlp.W_gate':
      if (layer.mlp?.gate) return linearInOut(layer.mlp.gate, D, M);
      break;
    case 'mlp.W_out':
      if (layer.mlp) return linearInOut(layer.mlp.down, M, D);
      break;
    case 'mlp.b_out':
      if (layer.mlp) return bias(layer.mlp.down, D);
      break;
    case 'layer_scalar': // Gemma 4: hook_resid_post is the block's sum times it; 1 where none is stored
      return { dims: [1], data: layer.scalar ? Float32Array.from(read(layer.scalar)) : Float32Array.of(1) };
  }
  throw unknown();
}

/** Every stored tensor a spec uses (each counted once: tied embeddings are one tensor). */
export function specTensorNames(spec: ModelSpec): Set<string> {
  const names = new Set<string>();
  const walk = (o: any) => {
    if (!o || typeof o !== 'object') return;
    for (const [k, v] of Object.entries(o)) {
      if ((k === 'w' || k === 'b') && typeof v === 'string') names.add(v);
      else walk(v);
    }
  };
  walk(spec);
  return names;
}

/**
 * Whether a parameter name is backed by a stored tensor (LoadedModel.hasParam): false for biases
 * the checkpoint lacks (readParam reads them as zeros) and for names this architecture has not.
 */
export function storedParam(spec: ModelSpec, name: string): boolean {
  const top: Record<string, string | undefined> = {
    'embed.W_E': spec.embed.w,
    'pos_embed.W_pos': spec.posEmbed?.w,
    'ln_final.w': spec.lnFinal.w,
    'ln_final.b': spec.lnFinal.b,
    'unembed.W_U': spec.unembed.w,
    'unembed.b_U': spec.unembed.b,
  };
  if (name in top) return top[name] !== undefined;
  const m = /^blocks\.(\d+)\.(.+)$/.exec(name);
  const layer = m ? spec.layers[Number(m[1])] : undefined;
  if (!m || !layer) return false;
  const a = layer.attn;
  const qkvRef = (i: 0 | 1 | 2): LinearRef | undefined =>
    !a ? undefined : a.qkv.kind === 'separate' ? [a.qkv.q, a.qkv.k, a.qkv.v][i] : a.qkv.qkv;
  const inLayer: Record<string, string | undefined> = {
    'ln1.w': layer.ln1?.w,
    'ln1.b': layer.ln1?.b,
    'ln2.w': layer.ln2?.w,
    'ln2.b': layer.ln2?.b,
    'ln1_post.w': layer.postAttnNorm?.w,
    'ln2_post.w': layer.postMlpNorm?.w,
    'attn.W_Q': qkvRef(0)?.w,
    'attn.W_K': a?.kvFrom === undefined ? qkvRef(1)?.w : undefined,
    'attn.W_V': a?.kvFrom === undefined ? qkvRef(2)?.w : undefined,
    'attn.b_Q': qkvRef(0)?.b,
    'attn.b_K': a?.kvFrom === undefined ? qkvRef(1)?.b : undefined,
    'attn.b_V': a?.kvFrom === undefined ? qkvRef(2)?.b : undefined,
    'attn.W_O': a?.o.w,
    'attn.b_O': a?.o.b,
    'mlp.W_in': layer.mlp?.up.w,
    'mlp.b_in': layer.mlp?.up.b,
    'mlp.W_gate': layer.mlp ? layer.mlp.gate?.w : layer.moe?.router.w,
    'mlp.W_out': layer.mlp?.down.w,
    'mlp.b_out': layer.mlp?.down.b,
    layer_scalar: layer.scalar,
    'mlp.W_router': layer.moe?.beside && layer.moe.router.w,
    'mlp.router_scale': layer.moe?.beside?.routerNorm.w,
    'mlp.per_expert_scale': layer.moe?.beside?.expertScale,
    'ln2_experts.w': layer.moe?.beside?.preNorm.w,
    'ln2_post_dense.w': layer.moe?.beside?.denseNorm.w,
    'ln2_post_experts.w': layer.moe?.beside?.postNorm.w,
  };
  const ex = /^mlp\.experts\.(\d+)\.(W_in|W_gate|W_out)$/.exec(m[2]);
  const expert = ex ? layer.moe?.experts[Number(ex[1])] : undefined;
  if (expert) return true;
  if (/^mlp\.shared_expert\.(W_in|W_gate|W_out)$/.test(m[2])) return !!layer.moe?.shared;
  return inLayer[m[2]] !== undefined;
}
