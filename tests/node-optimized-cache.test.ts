/**
 * A fast second start (src/node/optimized-cache.ts): float32 weights widened from a 16-bit file
 * are kept as onnxruntime's optimized model after the first start, and the second start reads
 * that entry instead of folding the widening again. Checked against the float64 reference; the
 * entry is shown to be what the second start reads (zeroing its weights changes the logits), a
 * changed weight file or a broken entry never gives stale numbers, and stored weights make none.
 */
import { readdirSync, statSync, truncateSync, utimesSync, writeFileSync } from 'node:fs';
import * as path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadModelNode } from '../src/node/load';
import { optimizedCacheRoot, OPTIMIZED_WEIGHTS_FILE } from '../src/node/optimized-cache';
import { ownCacheDir } from './helpers/scratch-cache';
import {
  ALL_FAMILY_CASES,
  caseTokens,
  makeCaseModel,
  maxAbsDiff,
  referenceForward,
  type RandomModel,
} from './reference';

const c = ALL_FAMILY_CASES.find((x) => x.name === 'llama3-rope-untied-bias')!;
let rm: RandomModel;
let cache: ReturnType<typeof ownCacheDir>;

beforeAll(() => {
  cache = ownCacheDir('loupe-optcache-');
  rm = makeCaseModel(c, { dtype: 'F16' });
});
afterAll(() => {
  cache?.restore();
  rm?.cleanup();
});

const entries = () => {
  try {
    return readdirSync(optimizedCacheRoot()).sort();
  } catch {
    return [];
  }
};

async function logits(weights: 'f32' | 'stored'): Promise<Float32Array> {
  const m = await loadModelNode(rm.dir, { backend: 'node', weights });
  try {
    return (await m.run(caseTokens(rm, c.seqLen))).logits.data;
  } finally {
    await m.dispose();
  }
}

describe('the optimized-model cache (node backend)', () => {
  it('first start saves an entry, the second reads it, both agree with the reference', async () => {
    const ref = referenceForward(rm, caseTokens(rm, c.seqLen)).logits.data;
    const first = await logits('f32');
    expect(maxAbsDiff(ref, first).maxAbs).toBeLessThan(1e-4);
    const [key, ...rest] = entries();
    expect(rest).toEqual([]);
    expect(statSync(path.join(optimizedCacheRoot(), key, OPTIMIZED_WEIGHTS_FILE)).size).toBeGreaterThan(0);
    const second = await logits('f32');
    expect(Array.from(second)).toEqual(Array.from(first));
    expect(entries()).toEqual([key]);

    // the second start really reads the entry: zero its weights and the logits change
    const w = path.join(optimizedCacheRoot(), key, OPTIMIZED_WEIGHTS_FILE);
    writeFileSync(w, new Uint8Array(statSync(w).size));
    const zeroed = await logits('f32');
    expect(maxAbsDiff(first, zeroed).maxAbs).toBeGreaterThan(1e-3);

    // a broken entry (cut short) is dropped and rebuilt: the reference's numbers again
    truncateSync(w, 10);
    expect(maxAbsDiff(ref, await logits('f32')).maxAbs).toBeLessThan(1e-4);
    expect(entries()).toEqual([key]);
    expect(statSync(w).size).toBeGreaterThan(10);
  });

  it('a changed weight file gets a new entry; stored (16-bit) weights make none', async () => {
    const before = entries();
    const f = path.join(rm.dir, 'model.safetensors');
    const t = new Date(Date.now() + 5000);
    utimesSync(f, t, t);
    await logits('f32');
    const after = entries();
    expect(after.length).toBe(before.length + 1);
    await logits('stored');
    expect(entries()).toEqual(after);
  });
});
