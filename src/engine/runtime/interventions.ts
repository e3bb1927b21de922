/**
 * Compile interventions (plain data, see api.ts) into the `mul`/`add` feeds of their hook sites:
 * each site computes x' = x * mul + add, so several interventions on one site compose exactly:
 * (x*m1 + a1)*m2 + a2 = x*(m1 m2) + (a1 m2 + a2).
 *
 * Value layouts accepted for add/set/mean: length 1 (a scalar), the size of the hook's last axis
 * (broadcast over positions and heads), or the full per-position slice (all non-batch,
 * non-position axes, row-major). Patch sources have the hook's shape with batch 1 or B, or no
 * batch axis.
 *
 * A patch source on the device (a DeviceTensor) is not read here: the site's add is then
 * add + Σ_k coef_k ⊙ source_k, made on the device (combineGraph, once per source) from the
 * coefficients computed here. Each feed is written at the smallest shape that broadcasts to the
 * hook's (the axes it is constant along kept at 1): a patch at one position of a few batch rows
 * writes [B, T, 1], not [B, T, d_model], and a whole hook's zero one float.
 */
import { LoupeError } from '../errors';
import type { DeviceTensor, Intervention } from '../api';
import type { Tensor } from '../tensor';
import { numel } from '../tensor';
import { hookInfo } from '../graph/hooks';
import { OnnxGraph } from '../graph/onnx-builder';

/** a dense float32 array with the shape it is fed at */
export interface Dense {
  dims: number[];
  data: Float32Array;
}

export interface SiteFeed {
  mul: Dense;
  add: Dense;
  /** sources on the device, each weighted by its coefficients: add + Σ coef ⊙ source is the site's add */
  terms: { coef: Dense; source: DeviceTensor }[];
}

/** a site's feeds while interventions are applied: dense at the hook's shape */
interface Building {
  dims: number[];
  mul: Float32Array;
  add: Float32Array;
  terms: { coef: Float32Array; source: DeviceTensor }[];
}

/** inputs a, c, s (float, broadcasting): y = a + c ⊙ s, a site's add with one device source folded in */
export function combineGraph(): Uint8Array {
  const g = new OnnxGraph(() => '');
  const cs = g.o('Mul', [g.input('c', 'float'), g.input('s', 'float')]);
  g.rename(g.o('Add', [g.input('a', 'float'), cs]), 'y');
  g.output('y');
  return g.encode();
}

/** the array at the smallest shape that broadcasts to `dims`: each axis it is constant along becomes 1 */
export function compact(data: Float32Array, dims: number[]): Dense {
  let cur = data;
  const cd = dims.slice();
  for (let a = 0; a < cd.length; a++) {
    const n = cd[a];
    if (n === 1) continue;
    const outer = cd.slice(0, a).reduce((x, y) => x * y, 1);
    const inner = cd.slice(a + 1).reduce((x, y) => x * y, 1);
    let constant = true;
    for (let o = 0; o < outer && constant; o++) {
      const base = o * n * inner;
      for (let k = 1; k < n && constant; k++)
        for (let j = 0, at = base + k * inner; j < inner; j++)
          if (cur[at + j] !== cur[base + j]) {
            constant = false;
            break;
          }
    }
    if (!constant) continue;
    const next = new Float32Array(outer * inner);
    for (let o = 0; o < outer; o++) next.set(cur.subarray(o * n * inner, o * n * inner + inner), o * inner);
    cur = next;
    cd[a] = 1;
  }
  // one value: fed as a one-element tensor (on WebGPU a device scalar, made once per value)
  return { dims: cur.length === 1 ? [1] : cd, data: cur };
}

interface Ctx {
  shapeOf: (hook: string) => number[];
  isSite: (hook: string) => boolean;
  /** mean activations for 'mean' interventions without a value, keyed by hook (dims = hook shape, batch 1) */
  means?: Map<string, Tensor>;
}

const bad = (msg: string, hint?: string) => new LoupeError('BAD_INTERVENTION', msg, hint);

export function compileInterventions(list: Intervention[], ctx: Ctx): Map<string, SiteFeed> {
  const feeds = new Map<string, Building>();
  for (const iv of list) {
    if (!ctx.isSite(iv.hook)) {
      throw new LoupeError(
        ctx.shapeOf(iv.hook).length ? 'BAD_INTERVENTION' : 'UNKNOWN_HOOK',
        `'${iv.hook}' is not an intervenable hook of this model.`,
        'Use a TransformerLens hook name such as blocks.0.hook_resid_pre or blocks.0.attn.hook_z (hook_attn_scores is read-only; edit hook_pattern instead).',
      );
    }
    const dims = ctx.shapeOf(iv.hook);
    let f = feeds.get(iv.hook);
    if (!f) {
      const n = numel(dims);
      f = { dims, mul: new Float32Array(n).fill(1), add: new Float32Array(n), terms: [] };
      feeds.set(iv.hook, f);
    }
    apply(f, iv, ctx);
  }
  const out = new Map<string, SiteFeed>();
  for (const [hook, f] of feeds)
    out.set(hook, {
      mul: compact(f.mul, f.dims),
      add: compact(f.add, f.dims),
      terms: f.terms.map((t) => ({ coef: compact(t.coef, f.dims), source: t.source })),
    });
  return out;
}

function apply(f: Building, iv: Intervention, ctx: Ctx): void {
  const { dims } = f;
  const info = hookInfo(iv.hook);
  const rank = dims.length;
  const B = dims[0];
  const T = dims[info.posAxis];
  const last = dims[rank - 1];
  const restAxes = dims.map((_, a) => a).filter((a) => a !== 0 && a !== info.posAxis);
  const restSize = restAxes.reduce((s, a) => s * dims[a], 1);

  const rows = iv.batch ?? Array.from({ length: B }, (_, b) => b);
  for (const b of rows)
    if (!Number.isInteger(b) || b < 0 || b >= B) throw bad(`batch row ${b} is out of range (batch ${B}).`);
  const positions = iv.positions === undefined || iv.positions === 'all' ? null : new Set(iv.positions);
  if (positions)
    for (const p of positions)
      if (!Number.isInteger(p) || p < 0 || p >= T)
        throw bad(
          `position ${p} is out of range: this run has ${T} positions (0..${T - 1}).`,
          'Positions count tokens from 0, BOS included.',
        );
  if (iv.head !== undefined) {
    if (info.headAxis === undefined)
      throw bad(`${iv.hook} has no head axis; 'head' applies to hook_q/k/v/z/result/pattern.`);
    if (!Number.isInteger(iv.head) || iv.head < 0 || iv.head >= dims[info.headAxis])
      throw bad(`head ${iv.head} is out of range (0..${dims[info.headAxis] - 1}) for ${iv.hook}.`);
  }
  if (iv.neuron !== undefined && (!Number.isInteger(iv.neuron) || iv.neuron < 0 || iv.neuron >= last))
    throw bad(`index ${iv.neuron} is out of range (0..${last - 1}) on the last axis of ${iv.hook}.`);
  const alpha = iv.alpha ?? 1;
  if (!Number.isFinite(alpha)) throw bad('alpha must be a finite number.');

  // value lookup: scalar, last-axis vector, or full rest slice
  let value: ArrayLike<number> | undefined = iv.value;
  let valueMode: 'scalar' | 'last' | 'rest' = 'scalar';
  if (iv.op === 'mean' && !value) {
    const m = ctx.means?.get(iv.hook);
    if (!m) throw bad(`mean for ${iv.hook} was not computed.`);
    value = m.data;
  }
  // add's source instead of a value: x + α·source, the source shaped as a patch's
  const withSource = iv.op === 'patch' || (iv.op === 'add' && iv.source !== undefined && value === undefined);
  if ((iv.op === 'add' && !withSource) || iv.op === 'set' || iv.op === 'mean') {
    if (!value) throw bad(`'${iv.op}' on ${iv.hook} needs a value.`);
    if (value.length === 1) valueMode = 'scalar';
    else if (value.length === last) valueMode = 'last';
    else if (value.length === restSize) valueMode = 'rest';
    else
      throw bad(
        `value has length ${value.length}; ${iv.hook} needs 1, ${last} (its last axis) or ${restSize} (a whole position).`,
      );
    for (let i = 0; i < value.length; i++)
      if (!Number.isFinite(value[i])) throw bad('value contains a non-finite number.');
  }
  let src: Tensor | undefined;
  let term: Float32Array | undefined;
  let srcBatch = 1;
  if (withSource) {
    const source = iv.source;
    if (!source) throw bad(`'patch' on ${iv.hook} needs a source activation.`);
    const want = dims.slice(1);
    const got = source.dims.length === rank ? source.dims.slice(1) : source.dims;
    srcBatch = source.dims.length === rank ? source.dims[0] : 1;
    if (got.length !== want.length || got.some((d, i) => d !== want[i]) || (srcBatch !== 1 && srcBatch !== B)) {
      throw bad(
        `patch source has shape [${source.dims}] but ${iv.hook} has shape [${dims}] in this run.`,
        'Patching needs prompts of equal token length; the source is the same hook from the other run.',
      );
    }
    if ('data' in source) src = source;
    else {
      // on the device: its coefficients here (one term per source), its values folded in there
      let t = f.terms.find((x) => x.source.device === source.device);
      if (!t) f.terms.push((t = { coef: new Float32Array(f.mul.length), source }));
      term = t.coef;
    }
  }
  if (!['zero', 'scale', 'add', 'set', 'mean', 'patch'].includes(iv.op))
    throw bad(`unknown op '${iv.op}'.`, 'Use zero, scale, add, set, mean or patch.');

  // strides for coordinate decoding
  const strides = new Array(rank);
  strides[rank - 1] = 1;
  for (let a = rank - 2; a >= 0; a--) strides[a] = strides[a + 1] * dims[a + 1];
  const perRow = strides[0];
  const coord = new Array(rank);
  for (const b of rows) {
    for (let r = 0; r < perRow; r++) {
      let rem = r;
      for (let a = 1; a < rank; a++) {
        coord[a] = Math.floor(rem / strides[a]);
        rem -= coord[a] * strides[a];
      }
      if (positions && !positions.has(coord[info.posAxis])) continue;
      if (iv.head !== undefined && coord[info.headAxis!] !== iv.head) continue;
      if (iv.neuron !== undefined && coord[rank - 1] !== iv.neuron) continue;
      const i = b * perRow + r;
      let m = 1,
        a = 0;
      switch (iv.op) {
        case 'zero':
          m = 0;
          break;
        case 'scale':
          m = alpha;
          break;
        case 'add':
          if (withSource) {
            a = src ? alpha * src.data[(srcBatch === 1 ? 0 : b) * perRow + r] : 0;
            break;
          }
        // falls through
        case 'set':
        case 'mean': {
          let restIdx = 0;
          for (const ax of restAxes) restIdx = restIdx * dims[ax] + coord[ax];
          const v =
            valueMode === 'scalar' ? value![0] : valueMode === 'last' ? value![coord[rank - 1]] : value![restIdx];
          if (iv.op === 'add') a = alpha * v;
          else {
            m = 0;
            a = v;
          }
          break;
        }
        case 'patch':
          m = 0;
          a = src ? src.data[(srcBatch === 1 ? 0 : b) * perRow + r] : 0;
          break;
      }
      f.mul[i] *= m;
      f.add[i] = f.add[i] * m + a;
      for (const t of f.terms) t.coef[i] *= m;
      if (term) term[i] = iv.op === 'patch' ? 1 : term[i] + alpha;
    }
  }
}
