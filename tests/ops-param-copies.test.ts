/**
 * #11 "no second copy": the operations that read whole weight matrices in JavaScript — W_U for the
 * steering operations' default targets and controls and for direct logit effects, W_O / W_out for a
 * feature's way into the residual stream — leave no float32 copy of them kept on the model
 * (memory().param_bytes). W_U's products come from weightProducts, streamed over the weight bytes;
 * W_O / W_out are read for the one map that needs them and dropped (param keep: false). What stays
 * is small vectors (ln_final.w), far below the smallest matrix these operations read.
 * (DLA's own parameter copies after a trace: tests/ops-trace.test.ts.)
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { rmSync } from 'node:fs';
import { loadModelNode } from '../src/node/load';
import { createNodeSaeLoaders } from '../src/node/load-sae';
import type { LoadedModel } from '../src/engine/api';
import { operations } from '../src/ops/index';
import { makeRandomSae, type RandomSae } from './helpers/random-sae';
import { STORIES } from './sae-ref';

const loaders = createNodeSaeLoaders({ cache: false });
const ctx = { loadSae: loaders.loadSae, loadSaeFile: loaders.loadSaeFile };
const PROMPT = 'Once upon a time, there was a';

describe('operations keep no whole weight matrix in JavaScript (stories260K)', () => {
  const saes: RandomSae[] = [];
  let zSae: RandomSae, postSae: RandomSae;
  beforeAll(() => {
    zSae = makeRandomSae({ hook: 'blocks.2.attn.hook_z', dIn: 64, dSae: 32, seed: 7 });
    postSae = makeRandomSae({ hook: 'blocks.1.mlp.hook_post', dIn: 172, dSae: 32, seed: 8 });
    saes.push(zSae, postSae);
  });
  afterAll(() => {
    for (const s of saes) rmSync(s.dir, { recursive: true, force: true });
  });

  /** a fresh model, `use` run on it, then its kept parameter copies */
  async function keptAfter(use: (m: LoadedModel) => Promise<unknown>) {
    const model = await loadModelNode(STORIES);
    try {
      await use(model);
      const { d_model: D, d_vocab: V, n_heads: H, d_head: Dh, d_mlp: M } = model.info;
      // the smallest whole matrix these operations read: one layer's W_O (W_U is [D, V], W_out [M, D])
      const smallestMatrix = 4 * D * Math.min(V, H * Dh, M);
      return { bytes: model.memory().param_bytes, smallestMatrix };
    } finally {
      await model.dispose();
    }
  }

  it('steer with a random direction (default targets from its direct logit effect over the vocabulary, controls from unembedding cosines)', async () => {
    const { bytes, smallestMatrix } = await keptAfter((m) =>
      operations.steer.run(m, { prompt: PROMPT, layer: 2, direction: 'random:1', alpha: 4, max_new_tokens: 2 }, {}),
    );
    expect(bytes).toBeLessThan(smallestMatrix);
  });

  it('steer with a token direction, and sweep', async () => {
    const { bytes, smallestMatrix } = await keptAfter(async (m) => {
      await operations.steer.run(
        m,
        { prompt: PROMPT, layer: 2, direction: 'tokens: happy - big', alpha: 4, max_new_tokens: 2 },
        {},
      );
      await operations.sweep.run(
        m,
        { prompt: PROMPT, layer: 2, direction: 'random:2', alphas: [0, 2], max_new_tokens: 1 },
        {},
      );
    });
    expect(bytes).toBeLessThan(smallestMatrix);
  });

  it('causality (probability-matched controls by unembedding cosine)', async () => {
    const { bytes, smallestMatrix } = await keptAfter((m) =>
      operations.causality.run(m, { prompt: PROMPT, layer: 2, direction: 'tokens: happy', n_random: 4, seed: 1 }, {}),
    );
    expect(bytes).toBeLessThan(smallestMatrix);
  });

  it('sae_steer and feature through W_O (hook_z), feature through W_out (mlp.hook_post), dashboard of a neuron', async () => {
    const { bytes, smallestMatrix } = await keptAfter(async (m) => {
      await operations.sae_steer.run(
        m,
        { prompt: PROMPT, sae_source: zSae.dir, feature: 3, alpha: 2, max_new_tokens: 2 },
        ctx,
      );
      await operations.feature.run(m, { prompt: PROMPT, sae_source: zSae.dir, feature: 3, top_k: 3 }, ctx);
      await operations.feature.run(m, { prompt: PROMPT, sae_source: postSae.dir, feature: 2, top_k: 3 }, ctx);
      await operations.dashboard.run(
        m,
        {
          subject: 'neuron',
          layer: 1,
          neuron: 5,
          corpus: 'Once upon a time there was a cat. The cat was happy.',
          window: 8,
          batch_size: 2,
          top_k: 2,
          bins: 4,
          top_tokens: 3,
        },
        {},
      );
    });
    expect(bytes).toBeLessThan(smallestMatrix);
  });
});
