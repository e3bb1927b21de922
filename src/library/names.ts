/**
 * TransformerLens's short activation names (utils.get_act_name): 'resid_pre', 0 →
 * 'blocks.0.hook_resid_pre'; 'pattern', 1 → 'blocks.1.attn.hook_pattern'; 'scale', 2, 'ln2' →
 * 'blocks.2.ln2.hook_scale'; 'embed' → 'hook_embed'.
 */
import { LoupeError } from '../engine/errors';

const ATTN = new Set(['q', 'k', 'v', 'z', 'result', 'attn_scores', 'pattern']);
const MLP = new Set(['pre', 'post', 'pre_linear']);
const BLOCK = new Set(['resid_pre', 'resid_mid', 'resid_post', 'attn_out', 'mlp_out']);
/** TL's aliases */
const ALIAS: Record<string, string> = { attn: 'pattern', attn_logits: 'attn_scores', mlp_pre: 'pre', mlp_post: 'post' };

export function getActName(name: string, layer?: number, layerType?: 'ln1' | 'ln2' | 'attn' | 'mlp'): string {
  if (name.includes('.') || name.startsWith('hook_')) return name; // already a full name
  const n = ALIAS[name] ?? name;
  if (n === 'embed' || n === 'pos_embed') return `hook_${n}`;
  if (n === 'scale' && layer === undefined) return 'ln_final.hook_scale';
  if (layer === undefined || !Number.isInteger(layer) || layer < 0)
    throw new LoupeError('BAD_INPUT', `getActName('${name}') needs a layer.`);
  const b = `blocks.${layer}`;
  if (ATTN.has(n)) return `${b}.attn.hook_${n}`;
  if (MLP.has(n)) return `${b}.mlp.hook_${n}`;
  if (BLOCK.has(n)) return `${b}.hook_${n}`;
  if (n === 'scale' || n === 'normalized') {
    if (layerType !== 'ln1' && layerType !== 'ln2')
      throw new LoupeError('BAD_INPUT', `getActName('${name}', ${layer}) needs the norm: 'ln1' or 'ln2'.`);
    if (n === 'normalized') throw new LoupeError('BAD_INPUT', 'Loupe has hook_scale, not hook_normalized.');
    return `${b}.${layerType}.hook_scale`;
  }
  throw new LoupeError(
    'BAD_INPUT',
    `'${name}' is not a TransformerLens activation name.`,
    `Use one of ${[...BLOCK, ...ATTN, ...MLP, 'scale', 'embed', 'pos_embed'].join(', ')}.`,
  );
}
