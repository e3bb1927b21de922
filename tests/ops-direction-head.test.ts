/**
 * The steering direction of kind 'head' (a head's output, "steer along its output" on the page)
 * against the independent float64 reference forward: the vector before normalisation is
 * blocks.{l}.attn.hook_result[final position, head] = z_h · W_O[h] of the reference.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { loadModelNode } from '../src/node/load';
import type { LoadedModel } from '../src/engine/api';
import { resolveDirection } from '../src/ops/lib/directions';
import { MemoryHandleStore } from '../src/ops/lib/handle-store';
import { loadModelDir, referenceForward, type RefModel } from './reference';
import { SHARED } from './helpers/shared';

const DIR = SHARED + '/models/induction-gpt2';
const PROMPT = 'abcabcab';

let model: LoadedModel;
let ref: RefModel;
beforeAll(async () => {
  model = await loadModelNode(DIR);
  ref = loadModelDir(DIR);
});
afterAll(async () => {
  await model?.dispose();
});

describe('direction kind head', () => {
  it("is the head's hook_result at the final position (float64 reference)", async () => {
    const ids = model.tokenize(PROMPT, { prependBos: true });
    const r = referenceForward(ref, ids, { record: (n) => n === 'blocks.1.attn.hook_result' });
    const res = r.hooks['blocks.1.attn.hook_result'];
    const [, T, H, D] = res.dims;
    for (const head of [0, H - 1]) {
      const d = await resolveDirection(
        model,
        { kind: 'head', layer: 1, head, prompt: PROMPT },
        { layer: 1, normalize: false, store: new MemoryHandleStore() },
      );
      const want = res.data.subarray(((T - 1) * H + head) * D, ((T - 1) * H + head + 1) * D);
      let max = 0;
      for (let j = 0; j < D; j++) max = Math.max(max, Math.abs(d.vector[j] - want[j]));
      expect(max).toBeLessThan(1e-4);
      expect(d.hook).toBe('blocks.1.attn.hook_result');
      expect(d.description).toContain(`L1H${head}`);
    }
  });

  it('names a head outside the model', async () => {
    await expect(
      resolveDirection(
        model,
        { kind: 'head', layer: 99, head: 0, prompt: PROMPT },
        { layer: 0, store: new MemoryHandleStore() },
      ),
    ).rejects.toThrow(/not a head of this model/);
  });
});
