/**
 * Gemma Scope 2's own layout (google/gemma-scope-2-{size}-{pt|it}: Gemma 3's SAEs and
 * transcoders), read for SAEs here (sae.ts) and for transcoders (transcoder.ts). A folder such as
 * `resid_post/layer_12_width_16k_l0_medium/` holds
 *   config.json         {hf_hook_point_in, hf_hook_point_out?, width, l0, model_name, architecture: "jump_relu", …}
 *   params.safetensors  {w_enc [d_in, F], w_dec [F, d_out], b_enc [F], b_dec [d_out], threshold [F],
 *                        affine_skip_connection [d_in, d_out]? (transcoders "…_affine")}
 * and computes pre = x·w_enc + b_enc, acts = relu(pre)·[pre > threshold], out = acts·w_dec + b_dec
 * (+ x·affine_skip_connection): no b_dec is subtracted from the input.
 *
 * Known only from public code, not from a published specification: the tensor names, shapes and
 * encoder are the Gemma Scope 2 tutorial's (`JumpReLUSAE` loading `params.safetensors` with
 * hf_hub_download); the config keys and the module names in hf_hook_point_in are those SAELens's
 * loader tests read (tests/loading/test_pretrained_sae_loaders.py: test_get_gemma_3_config_from_hf,
 * test_infer_gemma_3_raw_cfg_dict); the transcoders' skip multiplies untransposed, x·affine (circuit-tracer,
 * single_layer_transcoder.py). Loupe's tests write files in this layout (tests/helpers/random-sae.ts).
 */
import { LoupeError } from './errors';

export const GEMMA_SCOPE_2_CONFIG = 'config.json';
export const GEMMA_SCOPE_2_PARAMS = 'params.safetensors';

/** the tensor names of params.safetensors, by the SAELens name of what they hold */
export const GEMMA_SCOPE_2_TENSORS = {
  W_enc: 'w_enc',
  W_dec: 'w_dec',
  b_enc: 'b_enc',
  b_dec: 'b_dec',
  threshold: 'threshold',
  W_skip: 'affine_skip_connection',
} as const;

export interface GemmaScope2Config {
  /** the TransformerLens hook the dictionary reads (see gemmaScope2Hook) */
  hookIn: string;
  /** the hook a transcoder writes; undefined for an SAE (it reconstructs what it reads) */
  hookOut?: string;
  /** the Hugging Face module names, as config.json gives them */
  hfHookIn: string;
  hfHookOut?: string;
  /** F, when config.json states it (the tensors' shapes decide) */
  width?: number;
  l0?: number;
  modelName?: string;
  /** config.json says the transcoder has an affine skip connection */
  affine: boolean;
}

/**
 * A Hugging Face module name of Gemma 3's decoder (as hf_hook_point_in/out name them, with or
 * without the multimodal `language_model.` level) as the TransformerLens hook holding that tensor:
 *   layers.{l}.output                               → blocks.{l}.hook_resid_post
 *   layers.{l}.post_feedforward_layernorm.output    → blocks.{l}.hook_mlp_out (Gemma 3's is after its post-norm)
 *   layers.{l}.self_attn.o_proj.input               → blocks.{l}.attn.hook_z (d_in = H·Dh, heads flattened
 *                                                     head-major; SAELens names these SAEs hook_attn_out)
 *   layers.{l}.pre_feedforward_layernorm.output     → blocks.{l}.mlp.hook_in (the MLP's input, ln2's output with
 *                                                     its weight; SAELens names it ln2.hook_normalized)
 * Anything else is UNSUPPORTED_CONFIG naming the field.
 */
export function gemmaScope2Hook(hf: string, field = 'hf_hook_point_in'): string {
  const m = /^(?:model\.)?(?:language_model\.)?(?:model\.)?layers\.(\d+)\.(.+)$/.exec(hf);
  const tail = m?.[2];
  const hook =
    tail === 'output'
      ? 'hook_resid_post'
      : tail === 'post_feedforward_layernorm.output'
        ? 'hook_mlp_out'
        : tail === 'self_attn.o_proj.input'
          ? 'attn.hook_z'
          : tail === 'pre_feedforward_layernorm.output'
            ? 'mlp.hook_in'
            : undefined;
  if (!m || !hook)
    throw new LoupeError(
      'UNSUPPORTED_CONFIG',
      `Gemma Scope 2 config.json ${field} = ${JSON.stringify(hf)} is not a hook point Loupe knows.`,
      'Known: model.layers.{l}.output, .post_feedforward_layernorm.output, .self_attn.o_proj.input, .pre_feedforward_layernorm.output.',
      { field, value: hf },
    );
  return `blocks.${Number(m[1])}.${hook}`;
}

/** config.json of a Gemma Scope 2 folder, checked: BAD_CONFIG / UNSUPPORTED_CONFIG naming the field */
export function parseGemmaScope2Config(cfg: Record<string, any>): GemmaScope2Config {
  const bad = (field: string, what: string) =>
    new LoupeError('BAD_CONFIG', `Gemma Scope 2 config.json: ${field} ${what}.`, undefined, { field });
  if (typeof cfg.hf_hook_point_in !== 'string') throw bad('hf_hook_point_in', 'is missing (a module name string)');
  const arch = cfg.architecture ?? 'jump_relu';
  if (arch !== 'jump_relu' && arch !== 'jumprelu')
    throw new LoupeError(
      'UNSUPPORTED_CONFIG',
      `Gemma Scope 2 config.json architecture = ${JSON.stringify(arch)} is not supported.`,
      'Gemma Scope 2 dictionaries are JumpReLU (architecture "jump_relu").',
      { field: 'architecture', value: arch },
    );
  const int = (k: string) => {
    const v = cfg[k];
    if (v === undefined || v === null) return undefined;
    if (!Number.isInteger(v) || v < 1) throw bad(k, 'must be a positive integer');
    return v as number;
  };
  const out = typeof cfg.hf_hook_point_out === 'string' ? cfg.hf_hook_point_out : undefined;
  const hookIn = gemmaScope2Hook(cfg.hf_hook_point_in);
  const hookOut =
    out !== undefined && out !== cfg.hf_hook_point_in ? gemmaScope2Hook(out, 'hf_hook_point_out') : undefined;
  return {
    hookIn,
    ...(hookOut ? { hookOut, hfHookOut: out } : {}),
    hfHookIn: cfg.hf_hook_point_in,
    width: int('width'),
    l0: typeof cfg.l0 === 'number' && Number.isFinite(cfg.l0) ? cfg.l0 : undefined,
    modelName: typeof cfg.model_name === 'string' ? cfg.model_name : undefined,
    affine: cfg.affine_connection === true,
  };
}
