/**
 * SAEs and transcoders on mixture-of-experts models, in the layouts the sets for those models are
 * published in:
 *  - SAELens (cfg.json + sae_weights.safetensors, hook blocks.{l}.hook_resid_post) on qwen3_moe's
 *    residual stream: feature activations and reconstruction within 1e-4 of float64 SAELens math
 *    applied to the float64 model reference's residual stream;
 *  - circuit-tracer's CLT (the layout of mntss/clt-131k, GPT-OSS-20B's: config.yaml
 *    model_kind: cross_layer_transcoder, feature_input_hook hook_resid_mid, feature_output_hook
 *    hook_mlp_out, W_enc_{i} [F,d] / W_dec_{i} [F, L−i, d]) replacing each whole MoE block's MLP:
 *    the active features and every error node |mlp_out − Σ_{i≤l} a_i·W_dec_i[:, l−i] − b_dec_l|
 *    within 1e-4 of a float64 computation on the reference's hooks;
 *  - refusals before any weight byte is read (a logging source checks): a transcoder set's wrong
 *    d_model or layer count or unknown hook from config.yaml and headers, an SAE's wrong d_in or
 *    unknown hook from cfg.json.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { rmSync, writeFileSync, readFileSync, existsSync, mkdtempSync, openSync, readSync, closeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import * as path from 'node:path';
import { loadModelNode } from '../src/node/load';
import { FolderSource } from '../src/node/folder-source';
import { createNodeSaeLoaders } from '../src/node/load-sae';
import { loadSaeFiles } from '../src/engine/sae';
import { makeSaeLoaders } from '../src/engine/source/sae-loader';
import type { ModelSource } from '../src/engine/source/types';
import { describeTranscoders, type TranscoderHeaders, type TranscoderInfo } from '../src/engine/transcoder';
import { ensureTranscoders } from '../src/ops/lib/transcoders';
import { writeSparseSafetensors } from './helpers/sparse-model';
import type { LoadedModel } from '../src/engine/api';
import { makeRandomSae, saeEncode64, saeDecode64 } from './helpers/random-sae';
import { makeRandomTranscoders, type RandomTranscoderSet } from './helpers/random-transcoders';
import {
  MOE_FAMILY_CASES,
  makeCaseModel,
  caseTokens,
  referenceForward,
  maxAbsDiff,
  type RandomModel,
} from './reference';

const TOL = 1e-4;

/**
 * Transcoder loaders over folders that log every read: a whole-file fetch, or a range beyond a
 * safetensors file's 8-byte length and JSON header, counts as a weight read.
 */
function loggingLoaders() {
  const weightReads: string[] = [];
  const loaders = makeSaeLoaders((dir) => {
    const folder = new FolderSource(dir);
    const headerEnd = (file: string) => {
      const fd = openSync(folder.localPath(file), 'r');
      const b = Buffer.alloc(8);
      readSync(fd, b, 0, 8, 0);
      closeSync(fd);
      return 8 + Number(b.readBigUInt64LE(0));
    };
    const source: ModelSource = {
      ref: folder.ref,
      fetchFile: (file, o) => {
        if (file.endsWith('.safetensors')) weightReads.push(file);
        return folder.fetchFile(file, o);
      },
      readRange: (file, offset, length, o) => {
        if (file.endsWith('.safetensors') && existsSync(folder.localPath(file)) && offset + length > headerEnd(file))
          weightReads.push(`${file}@${offset}`);
        return folder.readRange(file, offset, length, o);
      },
    };
    return { source };
  });
  return { loaders, weightReads };
}
/** the transcoders' input and output hooks: GPT-OSS-20B's CLT's, and the MLP's own input and output */
const HOOKS = [
  ['hook_resid_mid', 'hook_mlp_out'],
  ['mlp.hook_in', 'mlp.hook_out'],
] as const;

describe.each(MOE_FAMILY_CASES)('SAEs and transcoders on $name', (CASE) => {
  let rm: RandomModel;
  let model: LoadedModel;
  let tokens: number[];
  let ref: ReturnType<typeof referenceForward>;
  let L: number, D: number, T: number;
  const loaders = createNodeSaeLoaders({ cache: false });
  beforeAll(async () => {
    rm = makeCaseModel(CASE);
    model = await loadModelNode(rm.dir);
    tokens = caseTokens(rm, CASE.seqLen);
    ref = referenceForward(rm, tokens);
    ({ n_layers: L, d_model: D } = model.info);
    T = tokens.length;
  });
  afterAll(async () => {
    await model?.dispose();
    rm?.cleanup();
  });

  it('an SAE for another model (d_in) or a hook the model lacks is SAE_MISMATCH from cfg.json, before its weights', async () => {
    const { loaders, weightReads } = loggingLoaders();
    const judge = (cfg: Record<string, any>) => model.checkSaeConfig(cfg);
    const hook = `blocks.${L - 1}.hook_resid_post`;
    const cases = [
      makeRandomSae({ hook, dIn: D + 4, dSae: 16 }),
      makeRandomSae({ hook: `blocks.0.mlp.experts.99.hook_out`, dIn: D, dSae: 16 }),
      makeRandomSae({ hook, dIn: D, dSae: 16 }),
    ];
    try {
      for (const [i, s] of cases.slice(0, 2).entries()) {
        const err: any = await loaders.loadSae({ source: s.dir, path: '' }, { judge }).catch((e) => e);
        expect(err, `case ${i}`).toMatchObject({ code: 'SAE_MISMATCH' });
        expect(err.hint).toBeTruthy();
      }
      expect(weightReads).toEqual([]);
      // a matching one loads, and the log sees its weights read
      await loaders.loadSae({ source: cases[2].dir, path: '' }, { judge });
      expect(weightReads.length).toBeGreaterThan(0);
    } finally {
      for (const s of cases) rmSync(s.dir, { recursive: true, force: true });
    }
  });

  it('a SAELens SAE at blocks.{l}.hook_resid_post: activations and reconstruction within 1e-4 of float64', async () => {
    const hook = `blocks.${L - 1}.hook_resid_post`;
    const sae = makeRandomSae({ hook, dIn: D, dSae: 80, architecture: 'jumprelu', modelName: 'qwen3-30b-a3b' });
    try {
      await model.attachSae(await loadSaeFiles(new FolderSource(sae.dir), ''), 'res');
      const out = await model.run(tokens, {
        sae: 'res',
        hooks: [`${hook}.hook_sae_acts_post`, `${hook}.hook_sae_recons`],
      });
      const x = ref.hooks[hook].data;
      let worstA = 0,
        worstR = 0,
        active = 0;
      for (let t = 0; t < T; t++) {
        const r = saeEncode64(sae, x.subarray(t * D, (t + 1) * D));
        const acts = out.hooks[`${hook}.hook_sae_acts_post`].data.subarray(t * 80, (t + 1) * 80);
        const rec = out.hooks[`${hook}.hook_sae_recons`].data.subarray(t * D, (t + 1) * D);
        worstA = Math.max(worstA, maxAbsDiff(r.acts, acts).maxAbs);
        worstR = Math.max(worstR, maxAbsDiff(saeDecode64(sae, r.acts), rec).maxAbs);
        active += r.acts.filter((v) => v > 0).length;
      }
      console.log(
        `SAE on ${hook}: acts |Δ| ${worstA.toExponential(2)}, recons |Δ| ${worstR.toExponential(2)}, ${active} active`,
      );
      expect(active).toBeGreaterThan(T);
      expect(worstA).toBeLessThan(TOL);
      expect(worstR).toBeLessThan(TOL);
    } finally {
      rmSync(sae.dir, { recursive: true, force: true });
    }
  });

  describe.each(HOOKS)(
    "circuit-tracer's CLT layout replacing each MoE block's MLP, %s → %s",
    (inputHook, outputHook) => {
      let tc: RandomTranscoderSet;
      const F = 64;
      const xin: Float64Array[] = [];
      beforeAll(() => {
        // the encoder's input from the reference: resid_mid, or ln2's output (RMSNorm: x / √(mean x² + ε) · w)
        const eps = rm.config.rms_norm_eps;
        for (let l = 0; l < L; l++) {
          const x = Float64Array.from(ref.hooks[`blocks.${l}.hook_resid_mid`].data);
          if (inputHook === 'mlp.hook_in') {
            const w = rm.tensors[`model.layers.${l}.post_attention_layernorm.weight`].data;
            for (let p = 0; p < T; p++) {
              let ms = 0;
              for (let d = 0; d < D; d++) ms += x[p * D + d] ** 2 / D;
              for (let d = 0; d < D; d++) x[p * D + d] = (x[p * D + d] / Math.sqrt(ms + eps)) * w[d];
            }
          }
          xin.push(x);
        }
        tc = makeRandomTranscoders({
          kind: 'clt',
          nLayers: L,
          dModel: D,
          features: F,
          calibrate: xin,
          l0: 6,
          decScale: 0.5,
          inputHook,
          outputHook,
          extraConfig: 'model_name: "openai/gpt-oss-20b"',
        });
      });
      afterAll(() => tc?.cleanup());

      it('active features and every error node within 1e-4 of float64 on the reference hooks', async () => {
        const id = `clt-${inputHook}`;
        const files = await loaders.loadTranscoders(
          { source: tc.dir, path: '' },
          { nLayers: L, judge: (h) => void model.checkTranscoders(h, id) },
        );
        const info = model.attachTranscoders(files, id);
        expect(info).toMatchObject({ kind: 'clt', input_hook: inputHook, output_hook: outputHook });
        const rep = await model.replacement(tokens, id);
        // float64: a_{l,p} = x·[x > θ] of W_enc·resid_mid + b_enc; recon_l = Σ_{i≤l} a_i·W_dec_i[:, l−i] + b_dec_l
        const acts: Float64Array[] = [];
        const want: { l: number; p: number; f: number; a: number }[] = [];
        const errs = new Float64Array(L * T);
        // the same with each layer's own decoder only (no writes to later layers)
        const errsOwn = new Float64Array(L * T);
        for (let l = 0; l < L; l++) {
          const { W_enc, b_enc, threshold } = tc.ref.layers[l];
          const x = xin[l];
          const a = new Float64Array(T * F);
          for (let p = 1; p < T; p++)
            for (let f = 0; f < F; f++) {
              let s = b_enc[f];
              for (let i = 0; i < D; i++) s += W_enc[f * D + i] * x[p * D + i];
              if (s > threshold![f]) ((a[p * F + f] = s), want.push({ l, p, f, a: s }));
            }
          acts.push(a);
          // the whole block's MLP output (every routed expert, and qwen2_moe's gated shared expert)
          const mlp = ref.hooks[`blocks.${l}.hook_mlp_out`].data;
          for (let p = 1; p < T; p++) {
            let n2 = 0,
              own2 = 0;
            for (let d = 0; d < D; d++) {
              let r = tc.ref.layers[l].b_dec[d];
              let own = 0;
              for (let i = 0; i <= l; i++) {
                const W = tc.ref.layers[i].W_dec;
                const n = L - i;
                let c = 0;
                for (let f = 0; f < F; f++) c += acts[i][p * F + f] * W[(f * n + (l - i)) * D + d];
                r += c;
                if (i === l) own = tc.ref.layers[l].b_dec[d] + c;
              }
              n2 += (mlp[p * D + d] - r) ** 2;
              own2 += (mlp[p * D + d] - own) ** 2;
            }
            errs[l * T + p] = Math.sqrt(n2);
            errsOwn[l * T + p] = Math.sqrt(own2);
          }
        }
        const got = rep.features;
        expect(got.layer.length).toBe(want.length);
        expect(want.length).toBeGreaterThan(L * (T - 1));
        let worstA = 0;
        want.forEach((w, i) => {
          expect([got.layer[i], got.position[i], got.feature[i]]).toEqual([w.l, w.p, w.f]);
          worstA = Math.max(worstA, Math.abs(got.activation[i] - w.a));
        });
        const e = rep.errorNorms();
        const worstE = maxAbsDiff(errs, e).maxAbs;
        // the decoders to later layers matter: leaving them out moves the errors far past the tolerance
        const ownOnly = maxAbsDiff(errsOwn, e).maxAbs;
        console.log(
          `CLT ${inputHook} → ${outputHook} on ${CASE.name}: ${want.length} active features, act |Δ| ${worstA.toExponential(2)}, error-norm |Δ| ${worstE.toExponential(2)} (own-layer decoders only: ${ownOnly.toExponential(2)})`,
        );
        expect(worstA).toBeLessThan(TOL);
        expect(worstE).toBeLessThan(TOL);
        expect(ownOnly).toBeGreaterThan(100 * TOL);
      });

      it('refusals from the headers: wrong d_model, wrong layer count, unknown hook', async () => {
        const judge = (h: any) => void model.checkTranscoders(h, 'x');
        const other = makeRandomTranscoders({
          kind: 'clt',
          nLayers: L,
          dModel: D + 8,
          features: 8,
          outputHook: 'hook_mlp_out',
        });
        const fewer = makeRandomTranscoders({ kind: 'clt', nLayers: L + 1, dModel: D, features: 8 });
        const hooked = makeRandomTranscoders({
          kind: 'clt',
          nLayers: L,
          dModel: D,
          features: 8,
          inputHook,
          outputHook,
        });
        // a refusal comes from the headers and config.yaml alone: no weight byte is read
        const { loaders, weightReads } = loggingLoaders();
        try {
          await expect(
            loaders.loadTranscoders({ source: other.dir, path: '' }, { nLayers: L, judge }),
          ).rejects.toMatchObject({
            code: 'TRANSCODER_MISMATCH',
          });
          await expect(
            loaders.loadTranscoders({ source: fewer.dir, path: '' }, { nLayers: L + 1, judge }),
          ).rejects.toMatchObject({ code: 'TRANSCODER_MISMATCH' });
          const cfg = path.join(hooked.dir, 'config.yaml');
          writeFileSync(cfg, hooked.config.replace(inputHook, 'mlp.experts.0.hook_out'));
          const err: any = await loaders
            .loadTranscoders({ source: hooked.dir, path: '' }, { nLayers: L, judge })
            .catch((e) => e);
          expect(err).toMatchObject({ code: 'TRANSCODER_MISMATCH' });
          expect(err.message).toContain('mlp.experts.0.hook_out');
          expect(err.hint).toBeTruthy();
          expect(weightReads).toEqual([]);
          // the log sees weight reads: the same set with its hook restored loads, reading them
          writeFileSync(cfg, hooked.config);
          await loaders.loadTranscoders({ source: hooked.dir, path: '' }, { nLayers: L, judge });
          expect(weightReads.length).toBeGreaterThan(0);
        } finally {
          other.cleanup();
          fewer.cleanup();
          hooked.cleanup();
        }
      });
    },
  );
});

describe("GPT-OSS-20B's cross-layer transcoder at its published size", () => {
  it('24 layers × 131,072 features × d_model 2,880 in BF16 is TOO_LARGE from its headers, no weight byte read', async () => {
    // the layout and size of mntss/clt-131k, as sparse files (headers, then holes); the dtype is assumed
    const [L, F, D] = [24, 131072, 2880];
    const dir = mkdtempSync(path.join(tmpdir(), 'loupe-gptoss-clt-'));
    try {
      writeFileSync(
        path.join(dir, 'config.yaml'),
        'model_name: openai/gpt-oss-20b\nmodel_kind: cross_layer_transcoder\n' +
          'feature_input_hook: hook_resid_mid\nfeature_output_hook: hook_mlp_out\n',
      );
      for (let i = 0; i < L; i++) {
        writeSparseSafetensors(path.join(dir, `W_enc_${i}.safetensors`), [
          { name: `W_enc_${i}`, dtype: 'BF16', shape: [F, D] },
          { name: `b_enc_${i}`, dtype: 'BF16', shape: [F] },
          { name: `b_dec_${i}`, dtype: 'BF16', shape: [D] },
          { name: `threshold_${i}`, dtype: 'BF16', shape: [F] },
        ]);
        writeSparseSafetensors(path.join(dir, `W_dec_${i}.safetensors`), [
          { name: `W_dec_${i}`, dtype: 'BF16', shape: [F, L - i, D] },
        ]);
      }
      const { loaders, weightReads } = loggingLoaders();
      // a stand-in for the model (Loupe has no gpt_oss adapter): the set is described from its headers as checkTranscoders does
      let described: TranscoderInfo | undefined;
      const model = {
        info: { n_layers: L },
        transcoderSets: () => [],
        checkTranscoders: (h: TranscoderHeaders, id: string) => (described = describeTranscoders(h, id).info),
      } as unknown as LoadedModel;
      const err: any = await ensureTranscoders(model, { source: dir, path: '' }, {
        loadTranscoders: loaders.loadTranscoders,
      } as any).catch((e) => e);
      expect(err.code, err.message).toBe('TOO_LARGE');
      expect(described).toMatchObject({ kind: 'clt', n_layers: L, d_model: D, d_transcoder: F, dtype: 'BF16' });
      expect(described!.input_hook).toBe('hook_resid_mid');
      // W_enc 24·F·D + W_dec F·D·(24+…+1) = F·D·324 weights, plus biases and thresholds
      expect(described!.weight_bytes).toBeGreaterThan(2 * F * D * 324);
      expect(err).toMatchObject({ code: 'TOO_LARGE' });
      console.log(`GPT-OSS-20B CLT (BF16): ${(described!.weight_bytes / 2 ** 30).toFixed(1)} GiB → ${err.message}`);
      expect(weightReads).toEqual([]);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
