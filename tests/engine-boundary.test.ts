/**
 * The engine boundary (api.ts): what ModelInfo exposes so operations never read model.spec, and
 * the stated semantics of param / hasParam. Checked against the config.json and safetensors names
 * the random models are written with, not against the engine's own spec.
 */
import { describe, it, expect, afterAll } from 'vitest';
import { loadModelNode } from '../src/node/load';
import type { LoadedModel } from '../src/engine/api';
import { ALL_FAMILY_CASES, makeCaseModel, type RandomModel } from './reference';

const opened: { rm: RandomModel; model: LoadedModel }[] = [];
async function open(name: string) {
  const c = ALL_FAMILY_CASES.find((x) => x.name === name)!;
  const rm = makeCaseModel(c);
  const model = await loadModelNode(rm.dir);
  opened.push({ rm, model });
  return { rm, model };
}
afterAll(async () => {
  for (const o of opened) {
    await o.model.dispose();
    o.rm.cleanup();
  }
});

describe('ModelInfo carries what operations need', () => {
  it('gemma2: post-norms, final soft-cap and eps from config.json', async () => {
    const { rm, model } = await open('gemma2-softcap-window');
    expect(model.info.post_norms).toBe(true);
    expect(model.info.pos_embed).toBe(false);
    expect(model.info.final_softcap).toBe(rm.config.final_logit_softcapping);
    expect(model.info.norm_eps).toBe(rm.config.rms_norm_eps);
    expect(model.hasParam('blocks.0.ln1_post.w')).toBe(true);
  });
  it('gpt2: none of them', async () => {
    const { rm, model } = await open('gpt2-tied');
    expect(model.info.post_norms).toBe(false);
    expect(model.info.pos_embed).toBe(true);
    expect(model.hookNames()).toContain('hook_pos_embed');
    expect(model.info.final_softcap).toBeNull();
    expect(model.info.norm_eps).toBe(rm.config.layer_norm_epsilon);
    expect(model.hasParam('blocks.0.ln1_post.w')).toBe(false);
  });
});

describe('param and hasParam', () => {
  it('a bias the checkpoint lacks reads as zeros, and hasParam says it is not stored', async () => {
    const { rm, model } = await open('llama-gqa-tied');
    expect(Object.keys(rm.tensors).some((n) => n.endsWith('o_proj.bias'))).toBe(false);
    expect(model.hasParam('blocks.0.attn.b_O')).toBe(false);
    const b = model.param('blocks.0.attn.b_O');
    expect(b.dims).toEqual([model.info.d_model]);
    expect(b.data.every((x) => x === 0)).toBe(true);
    expect(model.hasParam('blocks.0.attn.W_Q')).toBe(true);
    expect(model.hasParam('blocks.0.mlp.W_gate')).toBe(true);
  });
  it('names the architecture lacks: hasParam false, param BAD_INPUT', async () => {
    const { model } = await open('llama-gqa-tied');
    expect(model.hasParam('pos_embed.W_pos')).toBe(false);
    expect(() => model.param('pos_embed.W_pos')).toThrowError(expect.objectContaining({ code: 'BAD_INPUT' }));
    expect(model.hasParam('blocks.99.attn.W_Q')).toBe(false);
    expect(model.hasParam('nonsense')).toBe(false);
  });
  it('gpt2 stores its biases and positions', async () => {
    const { model } = await open('gpt2-tied');
    expect(model.hasParam('blocks.0.attn.b_O')).toBe(true);
    expect(model.hasParam('pos_embed.W_pos')).toBe(true);
    expect(model.hasParam('blocks.0.mlp.W_gate')).toBe(false);
  });
});
