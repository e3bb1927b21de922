/**
 * Hook points: which TransformerLens hooks a model has, their shapes, and which accept interventions.
 * Shapes are batch-first; T is the number of query positions in this run, Tk the number of key
 * positions (past + T).
 */
import { headsOf, type ModelSpec } from '../spec';

export interface HookInfo {
  name: string;
  /** axis that indexes heads, if any */
  headAxis?: number;
  /** axis that indexes (query) positions */
  posAxis: number;
  /** accepts x' = x * mul + add */
  site: boolean;
}

/**
 * A linear-attention layer's own hooks (Qwen3.5's gated delta-net; TransformerLens has none, so
 * these follow its style): q, k [B, T, Hk, Dk] after the conv, silu and L2 norm; v [B, T, Hv, Dv]
 * after the conv and silu; beta [B, T, Hv] (sigmoid); decay [B, T, Hv], the log of each step's
 * decay g ≤ 0; core [B, T, Hv, Dv], the delta rule's read-out Sᵀq/√Dk; gate [B, T, Hv, Dv],
 * in_proj_z before its silu; z [B, T, Hv, Dv], the gated norm's output that out_proj reads.
 */
export const LINEAR_ATTN_HOOKS = [
  'hook_q',
  'hook_k',
  'hook_v',
  'hook_beta',
  'hook_decay',
  'hook_core',
  'hook_gate',
  'hook_z',
];

/**
 * Gemma 4's per-layer input block (after the MLP; TransformerLens has none, so these follow its
 * style): hook_per_layer_input [B, T, P], the layer's per-layer input p_l; per_layer.hook_pre
 * [B, T, P], W_gate x of the stream after the MLP; per_layer.hook_post [B, T, P], act(pre) ⊙ p_l;
 * ln_per_layer.hook_scale, its output norm's scale; hook_per_layer_out [B, T, D], the addend.
 * hook_resid_post is (resid_mid + mlp_out + per_layer_out) · layer_scalar.
 */
export const PER_LAYER_HOOKS = [
  'hook_per_layer_input',
  'per_layer.hook_pre',
  'per_layer.hook_post',
  'ln_per_layer.hook_scale',
  'hook_per_layer_out',
];

/** UNKNOWN_HOOK's hint for a name: an attention hook of a linear-attention layer names that layer's own hooks */
export function unknownHookHint(spec: ModelSpec, name: string, general: string): string {
  const m = /^blocks\.(\d+)\.attn\./.exec(name);
  return m && spec.layers[Number(m[1])]?.linearAttn
    ? `Layer ${m[1]} is a linear-attention (gated delta-net) layer, without attention heads: its hooks are ` +
        `blocks.${m[1]}.linear_attn.${LINEAR_ATTN_HOOKS.join('|')} and blocks.${m[1]}.hook_attn_out.`
    : general;
}

export function layerHooks(spec: ModelSpec, l: number, withResult: boolean): string[] {
  const b = `blocks.${l}`;
  const layer = spec.layers[l];
  const names = [`${b}.hook_resid_pre`, ...(layer.ln1 ? [`${b}.ln1.hook_scale`] : [])];
  if (layer.linearAttn) names.push(...LINEAR_ATTN_HOOKS.map((h) => `${b}.linear_attn.${h}`));
  else {
    if (layer.attn?.outputGate) names.push(`${b}.attn.hook_gate`);
    names.push(`${b}.attn.hook_q`);
    // a layer that shares an earlier layer's keys and values (Gemma 4) has no k or v of its own
    if (layer.attn?.kvFrom === undefined) names.push(`${b}.attn.hook_k`, `${b}.attn.hook_v`);
    names.push(`${b}.attn.hook_attn_scores`, `${b}.attn.hook_pattern`, `${b}.attn.hook_z`);
    if (withResult) names.push(`${b}.attn.hook_result`);
  }
  if (layer.postAttnNorm) names.push(`${b}.ln1_post.hook_scale`);
  names.push(`${b}.hook_attn_out`);
  if (!layer.parallel) names.push(`${b}.hook_resid_mid`);
  if (layer.ln2) names.push(`${b}.ln2.hook_scale`);
  if (!layer.moe || layer.moe.beside) {
    names.push(`${b}.mlp.hook_pre`);
    if (layer.mlp?.kind === 'gated') names.push(`${b}.mlp.hook_pre_linear`);
    names.push(`${b}.mlp.hook_post`);
  }
  // Gemma 4: the dense MLP's post-norm, then the experts' input norm, router, experts and post-norm
  if (layer.moe?.beside) names.push(`${b}.ln2_post_dense.hook_scale`, `${b}.ln2_experts.hook_scale`);
  if (layer.moe) names.push(...moeHooks(b, layer.moe.experts.length, !!layer.moe.shared));
  if (layer.moe?.beside) names.push(`${b}.ln2_post_experts.hook_scale`);
  if (layer.postMlpNorm) names.push(`${b}.ln2_post.hook_scale`);
  names.push(`${b}.hook_mlp_out`);
  if (layer.perLayer) names.push(...PER_LAYER_HOOKS.map((h) => `${b}.${h}`));
  names.push(`${b}.hook_resid_post`);
  return names;
}

/**
 * A mixture-of-experts MLP's hooks (graph/build-model.ts moe): the router's logits [B,T,E]; the
 * routing weights as a dense [B,T,E] (zero for experts not chosen); TransformerLens's
 * hook_expert_weights and hook_expert_indices [B,T,k] (the chosen experts, largest weight first;
 * indices as float32 integers); each expert's output already multiplied by its routing weight,
 * [B,T,D] (zero where not routed, so hook_mlp_out is their sum, plus the shared expert's).
 */
export function moeHooks(b: string, E: number, shared: boolean): string[] {
  return [
    `${b}.mlp.hook_router_logits`,
    `${b}.mlp.hook_router_weights`,
    `${b}.mlp.hook_expert_weights`,
    `${b}.mlp.hook_expert_indices`,
    ...Array.from({ length: E }, (_, e) => `${b}.mlp.experts.${e}.hook_out`),
    ...(shared ? [`${b}.mlp.shared_expert.hook_out`] : []),
  ];
}

export function allHookNames(spec: ModelSpec, withResult = false): string[] {
  const names = ['hook_embed'];
  if (spec.posEmbed) names.push('hook_pos_embed');
  for (let l = 0; l < spec.nLayers; l++) names.push(...layerHooks(spec, l, withResult));
  names.push('ln_final.hook_scale');
  return names;
}

export function hookInfo(name: string): HookInfo {
  const leaf = name.slice(name.lastIndexOf('.') + 1);
  if (leaf === 'hook_sae_recons' || leaf === 'hook_sae_error') return { name, posAxis: 1, site: false };
  // outputs only: the chosen experts in the order top-k gives (an edit there would not reach the sum)
  if (leaf === 'hook_expert_weights' || leaf === 'hook_expert_indices') return { name, posAxis: 1, site: false };
  if (leaf === 'hook_attn_scores') return { name, headAxis: 1, posAxis: 2, site: false }; // masked with -inf: x*0 would be NaN
  if (leaf === 'hook_pattern') return { name, headAxis: 1, posAxis: 2, site: true };
  if (['hook_q', 'hook_k', 'hook_v', 'hook_z', 'hook_result', 'hook_gate', 'hook_core'].includes(leaf))
    return { name, headAxis: 2, posAxis: 1, site: true };
  if (leaf === 'hook_beta' || leaf === 'hook_decay') return { name, headAxis: 2, posAxis: 1, site: true };
  return { name, posAxis: 1, site: true };
}

export function hookShape(spec: ModelSpec, name: string, B: number, T: number, Tk = T): number[] {
  const leaf = name.slice(name.lastIndexOf('.') + 1);
  const { dModel: D, nHeads: H } = spec;
  const layer = /^blocks\.(\d+)\./.exec(name);
  const l = layer ? Number(layer[1]) : -1;
  const { Hkv, Dh } = headsOf(spec, l);
  const M = spec.layers[l]?.mlp?.width ?? spec.dMlp;
  if (/^blocks\.\d+\.(hook_per_layer_input|per_layer\.hook_(pre|post))$/.test(name))
    return [B, T, spec.perLayerInput?.width ?? 0];
  const la = /^blocks\.(\d+)\.linear_attn\./.exec(name);
  const s = la ? spec.layers[Number(la[1])]?.linearAttn : undefined;
  if (s) {
    if (leaf === 'hook_q' || leaf === 'hook_k') return [B, T, s.nKHeads, s.dK];
    if (leaf === 'hook_beta' || leaf === 'hook_decay') return [B, T, s.nVHeads];
    return [B, T, s.nVHeads, s.dV];
  }
  switch (leaf) {
    case 'hook_scale':
      return [B, T, 1];
    case 'hook_gate':
    case 'hook_q':
    case 'hook_z':
      return [B, T, H, Dh];
    case 'hook_k':
    case 'hook_v':
      return [B, T, Hkv, Dh];
    case 'hook_attn_scores':
    case 'hook_pattern':
      return [B, H, T, Tk];
    case 'hook_result':
      return [B, T, H, D];
    case 'hook_pre':
    case 'hook_pre_linear':
    case 'hook_post':
      return [B, T, M];
    case 'logits':
      return [B, T, spec.dVocab];
    case 'hook_router_logits':
    case 'hook_router_weights':
      return [B, T, spec.nExperts ?? 0];
    case 'hook_expert_weights':
    case 'hook_expert_indices':
      return [B, T, spec.topK ?? 0];
    default:
      return [B, T, D];
  }
}

/** ONNX input names carrying an intervention for a hook site */
export const mulInput = (hook: string) => `${hook}::mul`;
export const addInput = (hook: string) => `${hook}::add`;
