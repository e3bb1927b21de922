/**
 * GPT-OSS (transformers' modeling_gpt_oss.py, configuration_gpt_oss.py): Llama's pre-norm decoder
 * with biased q/k/v/o projections (attention_bias), a learned sink logit per head in every
 * attention softmax (`self_attn.sinks`), sliding-window and full layers alternating (`layer_types`,
 * by default the even layers slide, sliding_window 128), YaRN rotary (rope_scaling or
 * rope_parameters; absent, HF's default: factor 32 of 4096 positions, beta 32 / 1, no truncation,
 * theta 150000) and a mixture-of-experts MLP in every layer:
 *   router   `mlp.router` [E, D] with its bias; the num_experts_per_tok largest logits, softmax over
 *            them (`topk` then `softmax`), which is the softmax over all E renormalised over the
 *            chosen (spec.ts MoeSpec.routing, normTopK)
 *   experts  stacked, each with its biases: gate_up_proj rows interleave gate (even) and up (odd);
 *            (clamp(up, ±limit) + 1) ⊙ g·σ(alpha·g), g = min(gate, limit) (alpha 1.702, limit 7,
 *            as GptOssExperts fixes them), then down_proj
 * The experts, MXFP4 blocks and scales in the published checkpoints or dense in a dequantised one,
 * become per-expert matrices at load (mxfp4.ts: MXFP4 dequantised to BFloat16, exactly).
 */
import { LoupeError } from '../errors';
import { checkMxfp4, deriveRows, type DerivedRows } from '../mxfp4';
import type { ExpertSpec, ModelSpec, MoeSpec } from '../spec';
import { type AdapterInput, type Config, type TensorIndex, linear, need, unsupportedConfig } from './common';
import { llamaLike } from './llama';
import type { MoeConfig } from './moe';

/** GptOssConfig's rope default (its __post_init__) */
const YARN_DEFAULT = {
  rope_type: 'yarn',
  factor: 32,
  beta_fast: 32,
  beta_slow: 1,
  truncate: false,
  original_max_position_embeddings: 4096,
};

/** the clamped SwiGLU's constants in modeling_gpt_oss.py's GptOssExperts */
const SWIGLU = { swiglu_alpha: 1.702, swiglu_limit: 7 };

/** config.json with GptOssConfig's defaults and its rope as `rope_theta` + `rope_scaling` (common.ts ropeScaling reads those) */
export function gptOssConfig(config: Config): Config {
  const c: Config = { rms_norm_eps: 1e-5, head_dim: 64, sliding_window: 128, ...config };
  const q = c.quantization_config;
  if (q !== undefined && q !== null && (typeof q !== 'object' || q.quant_method !== 'mxfp4'))
    throw unsupportedConfig('quantization_config.quant_method', q?.quant_method ?? q, "'mxfp4' (or none)");
  const rp = c.rope_parameters ?? c.rope_scaling ?? YARN_DEFAULT;
  if (!rp || typeof rp !== 'object' || Array.isArray(rp))
    throw unsupportedConfig(c.rope_parameters ? 'rope_parameters' : 'rope_scaling', rp, 'an object with rope_type');
  const { rope_theta: theta, ...scaling } = rp;
  c.rope_theta = typeof theta === 'number' ? theta : typeof c.rope_theta === 'number' ? c.rope_theta : 150_000;
  c.rope_scaling = scaling;
  // GptOssExperts fixes alpha 1.702 and limit 7.0 whatever the config says (only the MXFP4 kernel
  // path reads swiglu_limit): another value would make the two disagree, so it is refused
  for (const [k, v] of Object.entries(SWIGLU))
    if (c[k] !== undefined && c[k] !== null && c[k] !== v) throw unsupportedConfig(k, c[k], `${v}`);
  return c;
}

/** one layer's router and experts (`p`: the layer's prefix), every shape checked from the headers */
function expertsOf(t: TensorIndex, p: string, D: number, m: MoeConfig, glu: MoeSpec['glu']): MoeSpec {
  const { E, width: M } = m;
  const b = `${p}.mlp`;
  const gu = `${b}.experts.gate_up_proj`;
  const dp = `${b}.experts.down_proj`;
  const mxfp4 = [gu, dp].some((x) => t.has(`${x}_blocks`) || t.has(`${x}_scales`));
  if (mxfp4) {
    if (D % 32 !== 0 || M % 32 !== 0)
      throw new LoupeError(
        'BAD_CONFIG',
        `MXFP4 experts need hidden_size (${D}) and intermediate_size (${M}) to be multiples of 32 (its block size).`,
        'config.json and the weights disagree.',
        { field: D % 32 !== 0 ? 'hidden_size' : 'intermediate_size' },
      );
    checkMxfp4(t, gu, E, 2 * M, D);
    checkMxfp4(t, dp, E, D, M);
  } else {
    need(t, gu, [E, D, 2 * M]);
    need(t, dp, [E, M, D]);
  }
  need(t, `${gu}_bias`, [E, 2 * M]);
  need(t, `${dp}_bias`, [E, D]);
  const rows = (proj: string, e: number, start: number, step: number, count: number): DerivedRows =>
    mxfp4
      ? { kind: 'mxfp4', src: `${proj}_blocks`, scales: `${proj}_scales`, expert: e, start, step, count }
      : { kind: 'dense', src: proj, expert: e, start, step, count };
  const bias = (proj: string, e: number, start: number, step: number, count: number): DerivedRows => ({
    kind: 'bias',
    src: `${proj}_bias`,
    expert: e,
    start,
    step,
    count,
  });
  const experts = Array.from({ length: E }, (_, e): ExpertSpec => {
    const q = `${b}.experts.${e}`;
    // gate_up_proj rows: gate j at 2j, up j at 2j + 1
    const half = (name: string, start: number) => ({
      w: deriveRows(t, `${q}.${name}.weight`, rows(gu, e, start, 2, M)),
      b: deriveRows(t, `${q}.${name}.bias`, bias(gu, e, start, 2, M)),
      layout: 'out_in' as const,
    });
    return {
      gate: half('gate_proj', 0),
      up: half('up_proj', 1),
      down: {
        w: deriveRows(t, `${q}.down_proj.weight`, rows(dp, e, 0, 1, D)),
        b: deriveRows(t, `${q}.down_proj.bias`, bias(dp, e, 0, 1, D)),
        layout: 'out_in',
      },
    };
  });
  return {
    router: linear(t, `${b}.router`, E, D, true),
    experts,
    topK: m.k,
    routing: 'softmax_topk',
    normTopK: true,
    act: 'silu',
    dExpert: M,
    glu,
  };
}

export function gptOss(input: AdapterInput): ModelSpec {
  const c = gptOssConfig(input.config);
  const glu = { alpha: SWIGLU.swiglu_alpha, limit: SWIGLU.swiglu_limit };
  return llamaLike(
    { config: c, tensors: input.tensors },
    {
      family: 'gpt_oss',
      alternatingSlidingWindow: true,
      sinks: true,
      moe: {
        block: 'mlp',
        names: ['gate_proj', 'up_proj', 'down_proj'],
        expertsKey: 'num_local_experts',
        widthKey: 'intermediate_size',
        normTopK: 'always',
        layer: (t, p, D, m) => expertsOf(t, p, D, m, glu),
      },
    },
  );
}
