/**
 * The mixture-of-experts MLP shared by the MoE adapters (mixtral, qwen2_moe, qwen3_moe, olmoe):
 * its config fields, read and checked before any tensor (`moeConfig`), and one layer's router and
 * experts from the checkpoint's per-expert tensors (`moeLayer`), as the Hub's checkpoints store
 * them: `{block}.gate.weight` [E, D] and `{block}.experts.{e}.{gate|up|down}.weight`.
 */
import { LoupeError } from '../errors';
import type { Activation, ExpertSpec, MoeSpec } from '../spec';
import { type Config, type TensorIndex, dim, linear, need, unsupportedConfig } from './common';

export interface MoeOptions {
  /** the MoE module under each layer: Mixtral `block_sparse_moe`, the others `mlp` */
  block: string;
  /** each expert's gate, up and down projections: Mixtral w1, w3, w2; the others gate_proj, up_proj, down_proj */
  names: [gate: string, up: string, down: string];
  /** config keys of the expert count and each expert's width */
  expertsKey: string;
  widthKey: string;
  /** Mixtral always renormalises the chosen experts' weights; the others when config.norm_topk_prob */
  normTopK: 'always' | 'config';
  /** Qwen2-MoE: a shared expert of shared_expert_intermediate_size with a sigmoid gate */
  shared?: boolean;
  /** a layer's router and experts from a layout of the adapter's own (GPT-OSS's stacked experts), instead of moeLayer */
  layer?: (t: TensorIndex, p: string, D: number, m: MoeConfig) => MoeSpec;
}

export interface MoeConfig {
  E: number;
  k: number;
  width: number;
  normTopK: boolean;
  sharedWidth?: number;
}

/**
 * The MoE fields of config.json (UNSUPPORTED_CONFIG / BAD_CONFIG naming the field): every layer
 * sparse (decoder_sparse_step 1, no mlp_only_layers; a model mixing dense and sparse layers is refused).
 */
export function moeConfig(c: Config, o: MoeOptions): MoeConfig {
  const E = dim(c, [o.expertsKey], 'maxExperts');
  const k = dim(c, ['num_experts_per_tok'], 'maxExpertsPerToken');
  if (k > E)
    throw new LoupeError(
      'BAD_CONFIG',
      `config.json: num_experts_per_tok (${k}) is more than ${o.expertsKey} (${E}).`,
      "The model's config.json is damaged.",
      { field: 'num_experts_per_tok', value: k },
    );
  const width = dim(c, [o.widthKey], 'maxDMlp');
  if (c.decoder_sparse_step !== undefined && c.decoder_sparse_step !== 1)
    throw unsupportedConfig('decoder_sparse_step', c.decoder_sparse_step, '1 (every layer sparse)');
  if (Array.isArray(c.mlp_only_layers) ? c.mlp_only_layers.length > 0 : c.mlp_only_layers != null)
    throw unsupportedConfig('mlp_only_layers', c.mlp_only_layers, '[] (every layer sparse)');
  const normTopK = o.normTopK === 'always' ? true : c.norm_topk_prob === true;
  if (o.normTopK === 'config' && c.norm_topk_prob !== undefined && typeof c.norm_topk_prob !== 'boolean')
    throw unsupportedConfig('norm_topk_prob', c.norm_topk_prob, 'true or false');
  const sharedWidth = o.shared ? dim(c, ['shared_expert_intermediate_size'], 'maxDMlp') : undefined;
  return { E, k, width, normTopK, ...(sharedWidth ? { sharedWidth } : {}) };
}

/** One layer's MoE from its tensors (`p`: the layer's prefix, e.g. `model.layers.3`), shapes checked from the headers. */
export function moeLayer(t: TensorIndex, p: string, D: number, m: MoeConfig, o: MoeOptions, act: Activation): MoeSpec {
  const b = `${p}.${o.block}`;
  const router = { w: need(t, `${b}.gate.weight`, [m.E, D]), layout: 'out_in' as const };
  const [g, u, d] = o.names;
  const expert = (q: string, M: number): ExpertSpec => ({
    gate: linear(t, `${q}.${g}`, M, D, false),
    up: linear(t, `${q}.${u}`, M, D, false),
    down: linear(t, `${q}.${d}`, D, M, false),
  });
  const experts = Array.from({ length: m.E }, (_, e) => expert(`${b}.experts.${e}`, m.width));
  const spec: MoeSpec = {
    router,
    experts,
    topK: m.k,
    routing: 'softmax_topk',
    normTopK: m.normTopK,
    act,
    dExpert: m.width,
  };
  if (m.sharedWidth)
    spec.shared = {
      mlp: {
        gate: linear(t, `${b}.shared_expert.gate_proj`, m.sharedWidth, D, false),
        up: linear(t, `${b}.shared_expert.up_proj`, m.sharedWidth, D, false),
        down: linear(t, `${b}.shared_expert.down_proj`, D, m.sharedWidth, false),
      },
      dMlp: m.sharedWidth,
      gate: { w: need(t, `${b}.shared_expert_gate.weight`, [1, D]), layout: 'out_in' },
    };
  return spec;
}
