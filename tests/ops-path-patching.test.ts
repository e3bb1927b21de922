/**
 * patch's path scan (Wang et al. 2022's path patching) and its noising direction on induction-gpt2,
 * against a float64 implementation of the definitions with the reference forward (tests/reference):
 * path patching = (1) clean and corrupted runs; (2) the base prompt with every head's hook_z frozen to
 * the base run's except the sender's, from the other run, MLPs recomputed, receivers' q/k/v kept;
 * (3) the base prompt with those receiver values patched in. Noising = the corrupted run's activation
 * patched into the clean run.
 */
import { describe, it, expect, beforeAll } from 'vitest';
import type { LoadedModel } from '../src/engine/api';
import { operation as patch } from '../src/ops/patch';
import type { RefModel } from './reference/forward64';
import { refRun, byteRng, distinctBytes, type RefEdit } from './ops-ablate-reference';
import { useSharedModels } from './helpers/shared-models';
import type { OperationDocument } from '../src/ops/index';
type PatchDocument = OperationDocument<'patch'>;

let gpt2: LoadedModel, gpt2Ref: RefModel;
useSharedModels((m) => ({ gpt2, gpt2Ref } = m));

const L = 2,
  H = 4;
const zHooks = [0, 1].map((l) => `blocks.${l}.attn.hook_z`);

/** the float64 path-patching metric from sender (l, h) into the receivers (null: the logits) */
function refPath(
  ref: RefModel,
  doc: PatchDocument,
  noising: boolean,
  receivers: { hook: string; head: number }[] | null,
) {
  const clean = doc.tokens.map((t) => t.id);
  const corr = doc.corrupted_tokens.map((t) => t.id);
  const c = refRun(ref, clean, [], zHooks);
  const k = refRun(ref, corr, [], zHooks);
  const [baseIds, base, src] = noising ? [clean, c, k] : [corr, k, c];
  const a = doc.answer.token_id;
  const cf = doc.counterfactual.token_id;
  const ld = (l: Float64Array) => l[a] - l[cf];
  const norm = (l: Float64Array) => (ld(l) - ld(k.last)) / (ld(c.last) - ld(k.last));
  return (l: number, h: number) => {
    const edits: RefEdit[] = [
      ...zHooks.map((hook) => ({ hook, positions: 'all' as const, source: base.hooks[hook].data })),
      { hook: zHooks[l], positions: 'all', head: h, source: src.hooks[zHooks[l]].data },
    ];
    const frozen = refRun(ref, baseIds, edits, receivers?.map((r) => r.hook) ?? []);
    if (!receivers) return norm(frozen.last);
    const r = refRun(
      ref,
      baseIds,
      receivers.map((x) => ({ hook: x.hook, head: x.head, positions: 'all', source: frozen.hooks[x.hook].data })),
    );
    return norm(r.last);
  };
}

describe('path patching and noising on induction-gpt2', () => {
  const u = byteRng(11);
  const R = distinctBytes(u, 20);
  const R2 = distinctBytes(u, 20);
  const input = { token_ids: [256, ...R, ...R], corrupted_token_ids: [256, ...R2, ...R], answer: `#${R[0]}` };
  let docK: PatchDocument;

  beforeAll(async () => {
    docK = await patch.run(gpt2, {
      ...input,
      scans: ['path'],
      path_receivers: [0, 1, 2, 3].map((head) => ({ layer: 1, head, inputs: ['k' as const] })),
    });
  });

  it('sender → induction heads’ keys equals the float64 definition, and the previous-token heads carry it', () => {
    const receivers = [0, 1, 2, 3].map((head) => ({ hook: 'blocks.1.attn.hook_k', head }));
    const want = refPath(gpt2Ref, docK, false, receivers);
    const got = docK.path!.grid;
    expect(got[1]).toEqual([null, null, null, null]);
    let worst = 0;
    for (let h = 0; h < H; h++) {
      worst = Math.max(worst, Math.abs(got[0][h]! - want(0, h)));
      expect(got[0][h]!).toBeCloseTo(want(0, h), 4);
    }
    console.log(
      `path L0Hh → L1 keys: ${got[0].map((x) => x!.toFixed(3)).join(' ')}; max |Δ| vs float64 ${worst.toExponential(2)}`,
    );
    // the README's previous-token heads (L0H0, L0H1) are the senders whose path to the keys restores the answer
    expect(Math.min(got[0][0]!, got[0][1]!)).toBeGreaterThan(Math.max(got[0][2]!, got[0][3]!));
    expect(docK.direction).toBe('denoising');
    expect(docK.path!.receivers).toBe('L1H0 (k), L1H1 (k), L1H2 (k), L1H3 (k)');
  });

  it('noising: head_out cells and path patching into the logits equal the float64 definitions', async () => {
    const doc = await patch.run(gpt2, { ...input, direction: 'noising', scans: ['head_out', 'path'] });
    const clean = doc.tokens.map((t) => t.id);
    const corr = doc.corrupted_tokens.map((t) => t.id);
    const k = refRun(gpt2Ref, corr, [], zHooks);
    const c = refRun(gpt2Ref, clean, [], zHooks);
    const a = doc.answer.token_id;
    const cf = doc.counterfactual.token_id;
    const ld = (l: Float64Array) => l[a] - l[cf];
    const want = refPath(gpt2Ref, doc, true, null);
    for (let l = 0; l < L; l++)
      for (let h = 0; h < H; h++) {
        const p = refRun(gpt2Ref, clean, [
          { hook: zHooks[l], head: h, positions: 'all', source: k.hooks[zHooks[l]].data },
        ]);
        expect(doc.head_out![l][h]!).toBeCloseTo((ld(p.last) - ld(k.last)) / (ld(c.last) - ld(k.last)), 4);
        expect(doc.path!.grid[l][h]!).toBeCloseTo(want(l, h), 4);
      }
    expect(doc.direction).toBe('noising');
    expect(doc.interventions[0].from).toBe("the corrupted prompt's run");
    expect(doc.method).toMatch(/^Noising/);
    console.log(`noising head_out: ${JSON.stringify(doc.head_out)}; path → logits ${JSON.stringify(doc.path!.grid)}`);
  });

  it('bad path input is BAD_INPUT', async () => {
    const bad = (extra: object) =>
      patch.run(gpt2, { ...input, ...extra }).then(
        () => null,
        (e) => e,
      );
    expect(await bad({ scans: ['head_out'], path_receivers: [{ layer: 1, head: 0 }] })).toMatchObject({
      code: 'BAD_INPUT',
    });
    expect(await bad({ scans: ['path'], path_receivers: [{ layer: 0, head: 0 }] })).toMatchObject({
      code: 'BAD_INPUT',
    });
    expect(await bad({ scans: ['path'], path_senders: [{ layer: 5, head: 0 }] })).toMatchObject({ code: 'BAD_INPUT' });
  });
});
