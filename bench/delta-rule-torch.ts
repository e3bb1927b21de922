/**
 * Cross-check of the gated delta rule's backward (src/engine/graph/delta-rule.ts), not part of npm test:
 * the forward Scan and the backward pass alone in one onnxruntime-node session on random q, k, v, β, g
 * (B 2, T 17, Hv 3, Dk 8, Dv 5), against torch autograd through transformers' torch_recurrent_gated_delta_rule
 * (modeling_qwen3_5.py, its loop transcribed in float64 in delta_rule_torch.py). `tsx bench/delta-rule-torch.ts`;
 * needs Debian's python3-torch under /usr/bin/python3 (LOUPE_PYTHON overrides); exits 3 without torch.
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { OnnxGraph } from '../src/engine/graph/onnx-builder';
import { addBackward } from '../src/engine/graph/backward';
import { deltaRuleScan } from '../src/engine/graph/delta-rule';
import { requireOrtNode } from '../src/node/ort-node';
import type { OrtModule } from '../src/engine/runtime/ort-session';

// telemetry off, as every onnxruntime-node load in Loupe (tests/ort-telemetry)
const ort = requireOrtNode<OrtModule>();

const [B, T, Hv, Dk, Dv] = [2, 17, 3, 8, 5];
let state = 12345;
const rnd = () => ((state = (state * 1103515245 + 12345) % 2 ** 31) / 2 ** 31) * 2 - 1;
const arr = (n: number, f = rnd) => Float32Array.from({ length: n }, f);
/** unit rows of width d, as the adapter's L2 norm leaves q and k */
const unit = (x: Float32Array, d: number) => {
  for (let i = 0; i < x.length; i += d) {
    const n = Math.hypot(...x.subarray(i, i + d));
    for (let j = 0; j < d; j++) x[i + j] /= n;
  }
  return x;
};
const names = ['q', 'k', 'v', 'beta', 'g'];
const dims: Record<string, number[]> = {
  q: [B, T, Hv, Dk],
  k: [B, T, Hv, Dk],
  v: [B, T, Hv, Dv],
  beta: [B, T, Hv],
  g: [B, T, Hv],
  s0: [B, Hv, Dk, Dv],
  seed: [B, T, Hv, Dv],
};
const g = new OnnxGraph((f) => f);
for (const n of [...names, 's0', 'seed']) g.input(n, 'float', dims[n]);
g.identity(deltaRuleScan(g, 'la_', { Hv, Dk, Dv }, ['s0', ...names])[1], 'out');
g.output('out');
addBackward(g, { output: 'out', seed: 'seed', wrt: names, symbols: [{}, {}] });

const size = (n: string) => dims[n].reduce((a, b) => a * b, 1);
const data: Record<string, Float32Array> = {
  q: unit(arr(size('q')), Dk).map((x) => x / Math.sqrt(Dk)), // the Scan's q is already scaled by 1/√Dk
  k: unit(arr(size('k')), Dk),
  v: arr(size('v')),
  beta: arr(size('beta'), () => 0.5 + 0.5 * rnd()),
  g: arr(size('g'), () => -0.55 - 0.5 * rnd()), // log decays in (−1.05, −0.05)
  s0: new Float32Array(size('s0')),
  seed: arr(size('seed')),
};
const session = await ort.InferenceSession.create(g.encode());
const out = await session.run(
  Object.fromEntries(Object.entries(data).map(([n, d]) => [n, new ort.Tensor('float32', d, dims[n])])),
);
const dir = mkdtempSync(path.join(tmpdir(), 'loupe-delta-rule-'));
const file = path.join(dir, 'engine.json');
const list = (t: any) => Array.from(t.data as Float32Array);
writeFileSync(
  file,
  JSON.stringify({
    dims: { B, T, Hv, Dk, Dv },
    inputs: Object.fromEntries(Object.entries(data).map(([n, d]) => [n, Array.from(d)])),
    out: list(out.out),
    grads: Object.fromEntries(names.map((n) => [n, list(out[`grad:${n}`])])),
  }),
);
const py = process.env.LOUPE_PYTHON ?? '/usr/bin/python3';
const r = spawnSync(py, [path.join(import.meta.dirname, 'delta_rule_torch.py'), file], { stdio: 'inherit' });
rmSync(dir, { recursive: true, force: true });
process.exit(r.status ?? 1);
