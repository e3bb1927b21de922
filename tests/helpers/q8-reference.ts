/**
 * The q8 scheme (src/engine/q8.ts) written out from its definition, in float64, for tests that judge
 * the engine's q8 weights independently (engine-q8, engine-unembed-dots).
 */
import { f32ToF16Bits, f16BitsToF32, type RefModel } from '../reference';

/** GPT-2's Conv1D weights are stored [in, out]; every other matrix is [out, in] (or an embedding [rows, d_model]). */
const CONV1D = /\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight$/;

/** The q8 scheme from its definition, in float64: the values the engine's session should compute with. */
export function q8Reference(rm: RefModel & { family?: string }): RefModel {
  const tensors: RefModel['tensors'] = { ...rm.tensors };
  for (const [name, t] of Object.entries(rm.tensors)) {
    if (t.dims.length !== 2) continue;
    const [R, C] = t.dims;
    const inputsAlongRows = CONV1D.test(name) && (rm.family ?? rm.config.model_type) === 'gpt2';
    const nIn = inputsAlongRows ? R : C,
      nOut = inputsAlongRows ? C : R;
    const block = nIn % 32 === 0 ? 32 : nIn;
    const idx = (o: number, i: number) => (inputsAlongRows ? i * C + o : o * C + i);
    const out = new Float64Array(R * C);
    for (let o = 0; o < nOut; o++) {
      for (let b0 = 0; b0 < nIn; b0 += block) {
        let m = 0;
        for (let i = b0; i < b0 + block; i++) m = Math.max(m, Math.abs(t.data[idx(o, i)]));
        const s = f16BitsToF32(f32ToF16Bits(Math.fround(m / 127)));
        for (let i = b0; i < b0 + block; i++) {
          const x = s > 0 ? t.data[idx(o, i)] / s : 0;
          const q = Math.max(-127, Math.min(127, Math.sign(x) * Math.floor(Math.abs(x) + 0.5)));
          out[idx(o, i)] = q * s;
        }
      }
    }
    tensors[name] = { dims: t.dims, data: out };
  }
  return { config: rm.config, tensors };
}
