// Proves the float64 reference forward (tests/reference/) against things nobody here wrote:
// llama2.c's run.c outputs for stories260K, and the induction-gpt2 README's attention scores
// (measured with an independent PyTorch forward). Also checks every random family case, its
// files, its tokenizer, and that each exercised feature moves the logits far beyond 1e-4.

import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Tokenizer } from '@huggingface/tokenizers';
import {
  referenceForward,
  greedyGenerate64,
  loadModelDir,
  hookNames,
  lastLogits,
  erf,
  ALL_FAMILY_CASES,
  makeCaseModel,
  caseTokens,
  mulberry32,
  encodeSafetensors,
  decodeSafetensors,
  roundToDtype,
  f16BitsToF32,
  f32ToF16Bits,
  maxAbsDiff,
  compareHooks,
  type RandomModel,
  type RefModel,
  type RefTensor,
  type RefFeature,
} from './reference';
import { SHARED } from './helpers/shared';

const STORIES = join(SHARED, 'models/stories260K');
const INDUCTION = join(SHARED, 'models/induction-gpt2');
const RUNC = join(SHARED, 'references/stories260K-run-c.json');

function maxDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  return maxAbsDiff(a, b).maxAbs;
}

// ---------------------------------------------------------------- safetensors io

describe('safetensors writer / reader', () => {
  it('round-trips F32 exactly and rounds F16 / BF16 to nearest even', () => {
    const vals = [0, 1, -2.5, 1 / 3, 65504, 1e-7, 6.1e-5, -0.1, 3.14159, 70000];
    const bytes = encodeSafetensors({
      a: { dims: [2, 5], data: vals, dtype: 'F32' },
      b: { dims: [10], data: vals, dtype: 'F16' },
      c: { dims: [10], data: vals, dtype: 'BF16' },
    });
    // header is 8-byte aligned as HF's writer does
    const hlen = Number(new DataView(bytes.buffer).getBigUint64(0, true));
    expect((8 + hlen) % 8).toBe(0);
    const r = decodeSafetensors(bytes);
    expect(r.metadata).toEqual({ format: 'pt' });
    expect(Array.from(r.tensors.a.data)).toEqual(Array.from(Float32Array.from(vals)));
    expect(r.tensors.a.dims).toEqual([2, 5]);
    const f16 = r.tensors.b.data;
    expect(f16[3]).toBe(0.333251953125); // 1/3 in half precision
    expect(f16[4]).toBe(65504); // largest half
    expect(f16[9]).toBe(Infinity); // overflow
    expect(f16[5]).toBe(2 ** -24 * 2); // 1e-7 → the subnormal 2·2^-24 (nearest)
    const bf = r.tensors.c.data;
    expect(bf[3]).toBe(0.333984375); // 1/3 in bfloat16
    expect(bf[8]).toBe(3.140625);
    expect(Array.from(f16)).toEqual(Array.from(roundToDtype(vals, 'F16')));
    // ties to even: 1 + 2^-11 is halfway between 1 and 1 + 2^-10 → 1
    expect(f16BitsToF32(f32ToF16Bits(1 + 2 ** -11))).toBe(1);
    expect(f16BitsToF32(f32ToF16Bits(1 + 3 * 2 ** -11))).toBe(1 + 2 * 2 ** -10);
  });

  it('rejects a tensor whose byte length does not match its shape', () => {
    const bytes = encodeSafetensors({ a: { dims: [4], data: [1, 2, 3, 4] } });
    const hlen = Number(new DataView(bytes.buffer).getBigUint64(0, true));
    const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + hlen)));
    header.a.shape = [5];
    let json = JSON.stringify(header);
    while (json.length < hlen) json += ' ';
    const bad = bytes.slice();
    bad.set(new TextEncoder().encode(json), 8);
    expect(() => decodeSafetensors(bad)).toThrow(/byte length/);
  });
});

describe('erf / gelu', () => {
  it('erf matches known values to 1e-14', () => {
    const known: [number, number][] = [
      [0.5, 0.5204998778130465],
      [1, 0.8427007929497149],
      [2, 0.9953222650189527],
      [-3, -0.9999779095030014],
      [0.01, 0.011283415555849618],
    ];
    for (const [x, v] of known) expect(Math.abs(erf(x) - v)).toBeLessThan(1e-14);
  });
});

// ---------------------------------------------------------------- stories260K vs llama2.c

describe('stories260K (Llama) against llama2.c run.c', () => {
  const ref = JSON.parse(readFileSync(RUNC, 'utf8'));
  const model = loadModelDir(STORIES);

  it('final-position logits within 1e-4', () => {
    const r = referenceForward(model, ref.prompt_ids);
    const ll = lastLogits(r);
    expect(ll.length).toBe(ref.final_position_logits.length);
    const d = maxDiff(ll, ref.final_position_logits);
    console.log(
      `stories260K: max |Δ| vs run.c final logits = ${d.toExponential(3)} (argmax ${ll.indexOf(Math.max(...ll))}, run.c ${ref.argmax})`,
    );
    expect(d).toBeLessThan(ref.tolerance_logits ?? 1e-4);
  });

  it('greedy generation reproduces run.c ids', () => {
    const gen = greedyGenerate64(model, ref.prompt_ids, ref.greedy_next_64_ids.length);
    expect(gen).toEqual(ref.greedy_next_64_ids);
  });

  it('negative control: a wrong rotary base is caught', () => {
    const wrong: RefModel = { config: { ...model.config, rope_theta: 500 }, tensors: model.tensors };
    const d = maxDiff(lastLogits(referenceForward(wrong, ref.prompt_ids)), ref.final_position_logits);
    expect(d).toBeGreaterThan(1e-2);
  });
});

// ---------------------------------------------------------------- induction-gpt2 vs its README

describe('induction-gpt2 (GPT-2) against its README scores', () => {
  // README table: random bytes 0–255, [EOT] + R + R, R = 30
  const README_INDUCTION = [0.0, 0.0, 0.027, 0.003, 0.785, 0.805, 0.804, 0.816];
  const README_PREV = [0.657, 0.679, 0.071, 0.224, 0.039, 0.033, 0.031, 0.034];

  it('induction and previous-token scores within 0.05 on 20 repeated random byte sequences', () => {
    const model = loadModelDir(INDUCTION);
    const rand = mulberry32(2024);
    const N = 20,
      R = 30;
    const ind = new Array(8).fill(0),
      prev = new Array(8).fill(0);
    for (let s = 0; s < N; s++) {
      const rr = Array.from({ length: R }, () => Math.floor(rand() * 256));
      const toks = [256, ...rr, ...rr];
      const T = toks.length;
      const res = referenceForward(model, toks, { record: (n) => n.endsWith('hook_pattern') });
      for (let l = 0; l < 2; l++) {
        const p = res.hooks[`blocks.${l}.attn.hook_pattern`].data;
        for (let h = 0; h < 4; h++) {
          let a = 0,
            b = 0;
          // second copy: query i attends to the token after the earlier occurrence (i - R + 1)
          for (let i = R + 1; i < T; i++) a += p[(h * T + i) * T + (i - R + 1)];
          for (let i = 1; i < T; i++) b += p[(h * T + i) * T + (i - 1)];
          ind[l * 4 + h] += a / R / N;
          prev[l * 4 + h] += b / (T - 1) / N;
        }
      }
    }
    const fmt = (a: number[]) => a.map((x) => x.toFixed(3)).join('  ');
    console.log(`induction-gpt2 heads      L0H0   L0H1   L0H2   L0H3   L1H0   L1H1   L1H2   L1H3`);
    console.log(`induction  (reference)   ${fmt(ind)}`);
    console.log(`induction  (README)      ${fmt(README_INDUCTION)}`);
    console.log(`prev-token (reference)   ${fmt(prev)}`);
    console.log(`prev-token (README)      ${fmt(README_PREV)}`);
    for (let k = 0; k < 8; k++) {
      expect(Math.abs(ind[k] - README_INDUCTION[k])).toBeLessThan(0.05);
      expect(Math.abs(prev[k] - README_PREV[k])).toBeLessThan(0.05);
    }
  });

  it('refuses more tokens than learned positions', () => {
    const model = loadModelDir(INDUCTION);
    expect(() => referenceForward(model, new Array(65).fill(1))).toThrow(/learned positions/);
  });
});

// ---------------------------------------------------------------- random family cases

describe('random-weight family cases', () => {
  const models = new Map<string, RandomModel>();
  beforeAll(() => {
    for (const c of ALL_FAMILY_CASES) models.set(c.name, makeCaseModel(c));
  });
  afterAll(() => {
    for (const m of models.values()) m.cleanup();
  });

  it('covers every family and the required features', () => {
    const fams = new Set(ALL_FAMILY_CASES.map((c) => c.family));
    for (const f of ['gpt2', 'gpt_neox', 'llama', 'qwen2', 'qwen3', 'gemma', 'gemma2'])
      expect(fams.has(f as any)).toBe(true);
    const o = ALL_FAMILY_CASES.map((c) => c.options);
    expect(o.some((x) => x.nKvHeads !== undefined && x.nHeads !== undefined && x.nKvHeads < x.nHeads)).toBe(true);
    expect(o.some((x) => x.rotaryPct === 0.25) && o.some((x) => x.rotaryPct === 0.5)).toBe(true);
    expect(o.some((x) => x.parallelResidual === true) && o.some((x) => x.parallelResidual === false)).toBe(true);
    expect(o.some((x) => x.tied === true) && o.some((x) => x.tied === false)).toBe(true);
    expect(o.some((x) => (x.ropeScaling as any)?.rope_type === 'llama3')).toBe(true);
    expect(o.some((x) => x.dtype === 'F16') && o.some((x) => x.dtype === 'BF16')).toBe(true);
    expect(o.some((x) => x.slidingWindow && x.attnSoftcap && x.finalSoftcap)).toBe(true);
    expect(ALL_FAMILY_CASES.length).toBeGreaterThanOrEqual(10);
  });

  for (const c of ALL_FAMILY_CASES) {
    it(`${c.name}: runs, every hook has its TransformerLens shape, finite logits with spread`, () => {
      const m = models.get(c.name)!;
      const toks = caseTokens(m, c.seqLen);
      const T = toks.length;
      const r = referenceForward(m, toks);
      const names = hookNames(m);
      expect(Object.keys(r.hooks)).toEqual(names);
      const cfg = m.config.text_config ?? m.config; // Gemma 3's multimodal configs nest the decoder's
      const D = cfg.n_embd ?? cfg.hidden_size;
      const H = cfg.n_head ?? cfg.num_attention_heads;
      const Hkv = cfg.num_key_value_heads ?? H;
      const Dh = cfg.head_dim ?? D / H;
      const M = cfg.n_inner ?? cfg.intermediate_size ?? 4 * D;
      const V = cfg.vocab_size;
      const expectDims = (name: string): number[] => {
        const tail = name.replace(/^blocks\.\d+\./, '');
        switch (tail) {
          case 'hook_embed':
          case 'hook_pos_embed':
          case 'hook_resid_pre':
          case 'hook_resid_mid':
          case 'hook_resid_post':
          case 'hook_attn_out':
          case 'hook_mlp_out':
            return [1, T, D];
          case 'ln1.hook_scale':
          case 'ln2.hook_scale':
          case 'ln1_post.hook_scale':
          case 'ln2_post.hook_scale':
          case 'ln_final.hook_scale':
            return [1, T, 1];
          case 'attn.hook_q':
          case 'attn.hook_z':
            return [1, T, H, Dh];
          case 'attn.hook_k':
          case 'attn.hook_v':
            return [1, T, Hkv, Dh];
          case 'attn.hook_attn_scores':
          case 'attn.hook_pattern':
            return [1, H, T, T];
          case 'attn.hook_result':
            return [1, T, H, D];
          case 'mlp.hook_pre':
          case 'mlp.hook_pre_linear':
          case 'mlp.hook_post':
            return [1, T, M];
          case 'logits':
            return [1, T, V];
        }
        throw new Error(`unexpected hook ${name}`);
      };
      for (const n of names) {
        expect(r.hooks[n].dims, n).toEqual(expectDims(n));
        expect(r.hooks[n].data.length, n).toBe(r.hooks[n].dims.reduce((a, b) => a * b, 1));
      }
      expect(names.includes('hook_pos_embed')).toBe(c.family === 'gpt2');
      expect(names.some((n) => n.endsWith('hook_resid_mid'))).toBe(
        !(c.family === 'gpt_neox' && cfg.use_parallel_residual),
      );
      const L = r.logits.data;
      let mean = 0,
        sd = 0;
      for (const v of L) {
        expect(Number.isFinite(v)).toBe(true);
        mean += v;
      }
      mean /= L.length;
      for (const v of L) sd += (v - mean) ** 2;
      sd = Math.sqrt(sd / L.length);
      expect(sd).toBeGreaterThan(0.5);
      if (cfg.final_logit_softcapping) for (const v of L) expect(Math.abs(v)).toBeLessThan(cfg.final_logit_softcapping);
      // attention patterns: rows sum to 1, causal, sliding window respected, not saturated
      let maxSum = 0,
        nRows = 0;
      for (let l = 0; l < (cfg.n_layer ?? cfg.num_hidden_layers); l++) {
        const p = r.hooks[`blocks.${l}.attn.hook_pattern`].data;
        const s = r.hooks[`blocks.${l}.attn.hook_attn_scores`].data;
        let window: number | null = null;
        if (c.family === 'gemma2') {
          const sliding = cfg.layer_types ? cfg.layer_types[l] === 'sliding_attention' : l % 2 === 0;
          if (sliding) window = cfg.sliding_window;
        }
        if (c.family === 'gemma3') {
          const sliding = cfg.layer_types
            ? cfg.layer_types[l] === 'sliding_attention'
            : (l + 1) % (cfg.sliding_window_pattern ?? 6) !== 0;
          if (sliding) window = cfg.sliding_window;
        }
        if (c.family === 'phi3' && cfg.sliding_window) window = cfg.sliding_window;
        for (let h = 0; h < H; h++)
          for (let i = 0; i < T; i++) {
            let sum = 0,
              mx = 0;
            for (let j = 0; j < T; j++) {
              const v = p[(h * T + i) * T + j];
              const masked = j > i || (window !== null && i - j >= window);
              if (masked) {
                expect(v).toBe(0);
                expect(s[(h * T + i) * T + j]).toBe(-Infinity);
              } else expect(Number.isFinite(s[(h * T + i) * T + j])).toBe(true);
              sum += v;
              mx = Math.max(mx, v);
            }
            expect(Math.abs(sum - 1)).toBeLessThan(1e-12);
            if (i >= 2) {
              maxSum += mx;
              nRows++;
            }
          }
      }
      expect(maxSum / nRows).toBeLessThan(0.7); // softmaxes are not saturated
    });

    it(`${c.name}: files reload identically with our reader; tokenizer.json loads in @huggingface/tokenizers`, () => {
      const m = models.get(c.name)!;
      const back = loadModelDir(m.dir);
      expect(back.config).toEqual(m.config);
      expect(Object.keys(back.tensors).sort()).toEqual(Object.keys(m.tensors).sort());
      for (const [k, t] of Object.entries(m.tensors)) {
        expect(back.dtypes[k]).toBe(m.dtype);
        expect(maxDiff(back.tensors[k].data, t.data)).toBe(0);
      }
      const toks = caseTokens(m, c.seqLen);
      expect(maxDiff(referenceForward(back, toks).logits.data, referenceForward(m, toks).logits.data)).toBe(0);

      const tj = JSON.parse(readFileSync(join(m.dir, 'tokenizer.json'), 'utf8'));
      const tc = JSON.parse(readFileSync(join(m.dir, 'tokenizer_config.json'), 'utf8'));
      const tk = new Tokenizer(tj, tc);
      const text = 'the cat sat on the mat';
      const enc = tk.encode(text);
      expect(enc.ids.length).toBeGreaterThan(1);
      for (const id of enc.ids) expect(id).toBeLessThan(m.config.vocab_size ?? m.config.text_config.vocab_size);
      expect(enc.ids.length).toBeLessThan(text.length); // word merges are used
      expect(tk.decode(enc.ids, { skip_special_tokens: true })).toBe(text);
      expect(tk.token_to_id(tc.bos_token)).toBe(m.config.bos_token_id);
      if (tc.add_bos_token) expect(enc.ids[0]).toBe(m.config.bos_token_id);
    });
  }
});

describe('sharded output', () => {
  it('writes model.safetensors.index.json + shards that reload to the same model', () => {
    const c = ALL_FAMILY_CASES.find((x) => x.name === 'qwen2-qkv-bias')!;
    const m = makeCaseModel(c, { shards: 3 });
    try {
      const idx = JSON.parse(readFileSync(join(m.dir, 'model.safetensors.index.json'), 'utf8'));
      const files = [...new Set(Object.values(idx.weight_map as Record<string, string>))].sort();
      expect(files).toEqual([
        'model-00001-of-00003.safetensors',
        'model-00002-of-00003.safetensors',
        'model-00003-of-00003.safetensors',
      ]);
      expect(Object.keys(idx.weight_map).sort()).toEqual(Object.keys(m.tensors).sort());
      const total = Object.values(m.tensors).reduce((a, t) => a + t.data.length * 4, 0);
      expect(idx.metadata.total_size).toBe(total);
      const back = loadModelDir(m.dir);
      for (const [k, t] of Object.entries(m.tensors)) expect(maxDiff(back.tensors[k].data, t.data)).toBe(0);
    } finally {
      m.cleanup();
    }
  });
});

// ---------------------------------------------------------------- oracle self-consistency

describe('oracle self-consistency', () => {
  const models = new Map<string, RandomModel>();
  beforeAll(() => {
    for (const c of ALL_FAMILY_CASES) models.set(c.name, makeCaseModel(c));
  });
  afterAll(() => {
    for (const m of models.values()) m.cleanup();
  });

  it('is causal: changing the last token leaves earlier positions unchanged (all cases)', () => {
    for (const c of ALL_FAMILY_CASES) {
      const m = models.get(c.name)!;
      const a = caseTokens(m, c.seqLen);
      const b = a.slice();
      const V = m.config.vocab_size ?? m.config.text_config.vocab_size;
      b[b.length - 1] = (b[b.length - 1] + 1) % V;
      const ra = referenceForward(m, a),
        rb = referenceForward(m, b);
      const T = a.length;
      expect(maxDiff(ra.logits.data.subarray(0, (T - 1) * V), rb.logits.data.subarray(0, (T - 1) * V))).toBe(0);
      expect(maxDiff(ra.logits.data.subarray((T - 1) * V), rb.logits.data.subarray((T - 1) * V))).toBeGreaterThan(1e-3);
    }
  });

  it('rotary is relative: layer-0 scores of a sequence shifted by one position are unchanged (rotary families)', () => {
    for (const c of ALL_FAMILY_CASES) {
      if (c.family === 'gpt2') continue;
      const m = models.get(c.name)!;
      const x = caseTokens(m, 8, 3);
      const y = [x[0], ...x];
      const sx = referenceForward(m, x).hooks['blocks.0.attn.hook_attn_scores'];
      const sy = referenceForward(m, y).hooks['blocks.0.attn.hook_attn_scores'];
      const H = sx.dims[1],
        T = x.length,
        Ty = T + 1;
      let d = 0;
      for (let h = 0; h < H; h++)
        for (let i = 0; i < T; i++)
          for (let j = 0; j <= i; j++) {
            const a = sx.data[(h * T + i) * T + j],
              b = sy.data[(h * Ty + i + 1) * Ty + j + 1];
            d = Math.max(d, a === b ? 0 : Math.abs(a - b)); // equal -Infinity (sliding window) counts as equal
          }
      expect(d, c.name).toBeLessThan(1e-10);
    }
  });

  it('interventions through the hook callback: identity, head ablation, steering, patching', () => {
    const m = models.get('llama-gqa-tied')!;
    const toks = caseTokens(m, 10);
    const base = referenceForward(m, toks);
    // identity replacement changes nothing
    const same = referenceForward(m, toks, { hook: (_n, v) => Float64Array.from(v) });
    expect(maxDiff(same.logits.data, base.logits.data)).toBe(0);
    // zeroing head 1 of layer 0's hook_z removes exactly that head's hook_result from hook_attn_out
    const H = 4,
      Dh = 8,
      D = 32,
      T = toks.length;
    const abl = referenceForward(m, toks, {
      hook: (n, v) => {
        if (n !== 'blocks.0.attn.hook_z') return;
        const w = Float64Array.from(v);
        for (let t = 0; t < T; t++) for (let d = 0; d < Dh; d++) w[(t * H + 1) * Dh + d] = 0;
        return w;
      },
    });
    const res = base.hooks['blocks.0.attn.hook_result'].data;
    const expected = Float64Array.from(base.hooks['blocks.0.hook_attn_out'].data);
    for (let t = 0; t < T; t++) for (let o = 0; o < D; o++) expected[t * D + o] -= res[(t * H + 1) * D + o];
    expect(maxDiff(abl.hooks['blocks.0.hook_attn_out'].data, expected)).toBeLessThan(1e-12);
    expect(abl.hooks['blocks.0.attn.hook_z'].data[(0 * H + 1) * Dh]).toBe(0); // hooks record the replaced value
    expect(maxDiff(abl.logits.data, base.logits.data)).toBeGreaterThan(1e-3);
    // steering: add α·d at resid_pre of layer 1 — the layer input differs by exactly α·d
    const dir = Float64Array.from({ length: D }, (_, i) => Math.sin(i));
    const steer = referenceForward(m, toks, {
      hook: (n, v) => (n === 'blocks.1.hook_resid_pre' ? v.map((x, k) => x + 2 * dir[k % D]) : undefined),
    });
    const rp0 = base.hooks['blocks.1.hook_resid_pre'].data,
      rp1 = steer.hooks['blocks.1.hook_resid_pre'].data;
    for (let k = 0; k < rp0.length; k++) expect(Math.abs(rp1[k] - rp0[k] - 2 * dir[k % D])).toBeLessThan(1e-12);
    expect(maxDiff(steer.hooks['blocks.0.hook_resid_post'].data, base.hooks['blocks.0.hook_resid_post'].data)).toBe(0);
    // patching a whole residual stream from another run reproduces that run downstream
    const other = caseTokens(m, 10, 99);
    const src = referenceForward(m, other);
    const patched = referenceForward(m, toks, {
      hook: (n) => (n === 'blocks.1.hook_resid_pre' ? src.hooks['blocks.1.hook_resid_pre'].data : undefined),
    });
    expect(maxDiff(patched.logits.data, src.logits.data)).toBeLessThan(1e-12);
  });

  it('compareHooks treats masked scores as equal and reports mismatches', () => {
    const m = models.get('gemma2-softcap-window')!;
    const toks = caseTokens(m, 12);
    const r = referenceForward(m, toks);
    const eng: Record<string, { dims: number[]; data: Float32Array }> = {};
    for (const [k, v] of Object.entries(r.hooks))
      eng[k] = { dims: v.dims, data: Float32Array.from(v.data, (x) => (x === -Infinity ? -3.4e38 : x)) };
    const ok = compareHooks(r.hooks, eng, hookNames(m));
    expect(ok.every((x) => x.ok)).toBe(true);
    eng['blocks.1.hook_mlp_out'].data[5] += 1e-3;
    const bad = compareHooks(r.hooks, eng, hookNames(m)).filter((x) => !x.ok);
    expect(bad.map((x) => x.name)).toEqual(['blocks.1.hook_mlp_out']);
  });
});

// ---------------------------------------------------------------- every feature matters

describe('each exercised feature moves the logits far beyond the 1e-4 tolerance', () => {
  /** a mutated model, or the model with features of the reference left out (the third entry) */
  type Mut = [string, (m: RandomModel) => RefModel, RefFeature[]?];
  const same = (m: RandomModel): RefModel => m;
  /** Gemma 3's nested decoder config */
  const textCfg =
    (patch: Record<string, unknown>) =>
    (m: RandomModel): RefModel => ({
      config: { ...m.config, text_config: { ...m.config.text_config, ...patch } },
      tensors: m.tensors,
      dtype: m.dtype,
    });
  const cfg =
    (patch: Record<string, unknown>) =>
    (m: RandomModel): RefModel => ({ config: { ...m.config, ...patch }, tensors: m.tensors, dtype: m.dtype });
  const tensor =
    (name: string, f: (t: RefTensor) => RefTensor) =>
    (m: RandomModel): RefModel => ({
      config: m.config,
      tensors: { ...m.tensors, [name]: f(m.tensors[name]) },
      dtype: m.dtype,
    });
  const zero = (t: RefTensor) => ({ dims: t.dims, data: new Float32Array(t.data.length) });
  const ones = (t: RefTensor) => ({ dims: t.dims, data: new Float32Array(t.data.length).fill(1) });
  const MUTS: Record<string, Mut[]> = {
    'gpt2-tied': [['c_attn bias zeroed', tensor('transformer.h.0.attn.c_attn.bias', zero)]],
    'gpt2-untied-erf-f16': [
      ['gelu_new instead of erf gelu', cfg({ activation_function: 'gelu_new' })],
      ['tied instead of lm_head', cfg({ tie_word_embeddings: true })],
    ],
    'neox-parallel-rot25': [
      ['sequential residual', cfg({ use_parallel_residual: false })],
      ['full rotary', cfg({ rotary_pct: 1 })],
    ],
    'neox-sequential-rot50': [
      ['parallel residual', cfg({ use_parallel_residual: true })],
      ['rotary 0.25', cfg({ rotary_pct: 0.25 })],
    ],
    'llama-gqa-tied': [['rope_theta 1e6', cfg({ rope_theta: 1e6 })]],
    'llama3-rope-untied-bias': [
      ['no rope_scaling', cfg({ rope_scaling: null })],
      ['no mlp bias', cfg({ mlp_bias: false })],
      ['no attention bias', cfg({ attention_bias: false })],
    ],
    'llama-mha-bf16': [['rope_theta 10000', cfg({ rope_theta: 10000 })]],
    'qwen2-qkv-bias': [['k bias zeroed', tensor('model.layers.0.self_attn.k_proj.bias', zero)]],
    'qwen3-qk-norm': [['q_norm weight = 1', tensor('model.layers.0.self_attn.q_norm.weight', ones)]],
    'gemma-mqa': [['erf gelu instead of tanh gelu', cfg({ hidden_activation: 'gelu' })]],
    'gemma2-softcap-window': [
      ['no attention soft-cap', cfg({ attn_logit_softcapping: null })],
      ['no final soft-cap', cfg({ final_logit_softcapping: null })],
      ['no sliding window', cfg({ sliding_window: null })],
      ['query_pre_attn_scalar = head_dim', cfg({ query_pre_attn_scalar: 16 })],
    ],
    'gemma2-layer-types': [
      ['all layers full attention', cfg({ layer_types: ['full_attention', 'full_attention'] })],
      ['no soft-caps', cfg({ attn_logit_softcapping: null, final_logit_softcapping: null })],
    ],
    'gemma3-text-bf16': [
      ['no q_norm / k_norm', same, ['qk_norm']],
      ['no sandwich post-norms', same, ['post_norms']],
      ['query_pre_attn_scalar = head_dim', cfg({ query_pre_attn_scalar: 16 })],
      ['no sliding window', same, ['sliding_window']],
      ["Gemma 2's alternation, not the 5:1 pattern", same, ['layer_pattern']],
      ['sliding layers on rope_theta', same, ['local_rope_base']],
      ['rope_scaling on every layer', same, ['rope_scaling_global_only']],
      ['embedding scale in float32', same, ['embed_scale_dtype']],
      ['erf gelu instead of tanh gelu', same, ['gelu_tanh']],
    ],
    'gemma3-multimodal-text': [
      ['sliding layers on rope_theta', textCfg({ rope_local_base_freq: 5000 })],
      ['all layers full attention', textCfg({ layer_types: ['full_attention', 'full_attention', 'full_attention'] })],
    ],
    'phi3-longrope-short-untied': [
      ['k and v rows of qkv_proj swapped', same, ['qkv_split']],
      ['gate and up halves swapped', same, ['gate_up_split']],
      ['long factors at 12 ≤ 32 positions', same, ['longrope_by_length']],
      ['no longrope attention factor', same, ['longrope_attention_factor']],
      ['no sliding window', same, ['sliding_window']],
    ],
    'phi4-mini-longrope-long-partial': [
      ['full rotary', same, ['partial_rotary']],
      ['short factors at 12 > 4 positions', same, ['longrope_by_length']],
      ['no longrope attention factor', same, ['longrope_attention_factor']],
    ],
    'olmo2-post-norms': [
      ['q/k norm per head, not over the projection', same, ['qk_norm_full']],
      ['its norms before attention and MLP', same, ['post_norms']],
      ['no q_norm / k_norm', same, ['qk_norm']],
    ],
  };

  const DECISIVE = ['gemma3', 'phi3', 'olmo2'];
  it('every mutation of a case changes its logits by > 5e-4 (gemma3, phi3, olmo2: > 1e-2)', () => {
    const lines: string[] = [];
    for (const c of ALL_FAMILY_CASES) {
      const muts = MUTS[c.name];
      expect(muts, c.name).toBeDefined();
      const m = makeCaseModel(c);
      try {
        const toks = caseTokens(m, c.seqLen);
        const base = referenceForward(m, toks, { record: false }).logits.data;
        for (const [label, f, drop] of muts) {
          const d = maxDiff(referenceForward(f(m), toks, { record: false, drop }).logits.data, base);
          lines.push(`${c.name.padEnd(31)} ${label.padEnd(44)} max |Δlogit| = ${d.toExponential(2)}`);
          // this round's families are held to 100× the tolerance (the GELU choice by large logits, see gemma3-text-bf16)
          expect(d, `${c.name}: ${label}`).toBeGreaterThan(DECISIVE.includes(c.family) ? 1e-2 : 5e-4);
        }
      } finally {
        m.cleanup();
      }
    }
    console.log(lines.join('\n'));
  });
});
