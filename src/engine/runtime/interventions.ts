/**
 * Compile interventions (plain data, see api.ts) into the `mul`/`add` feeds of their hook sites:
 * each site computes x' = x * mul + add, so several interventions on one site compose exactly:
 * (x*m1 + a1)*m2 + a2 = x*(m1 m2) + (a1 m2 + a2).
 *
 * Value layouts accepted for add/set/mean: length 1 (a scalar), the size of the hook's last axis
 * (broadcast over positions and heads), or the full per-position slice (all non-batch,
 * non-position axes, row-major). Patch sources have the hook's shape with batch 1 or B, or no
 * batch axis.
 */
import { LoupeError } from '../errors';
import type { Intervention } from '../api';
import type { Tensor } from '../tensor';
import { numel } from '../tensor';
import { hookInfo } from '../graph/hooks';

export interface SiteFeed {
  dims: number[];
  mul: Float32Array;
  add: Float32Array;
}

interface Ctx {
  shapeOf: (hook: string) => number[];
  isSite: (hook: string) => boolean;
  /** mean activations for 'mean' interventions without a value, keyed by hook (dims = hook shape, batch 1) */
  means?: Map<string, Tensor>;
}

const bad = (msg: string, hint?: string) => new LoupeError('BAD_INTERVENTION', msg, hint);

export function compileInterventions(list: Intervention[], ctx: Ctx): Map<string, SiteFeed> {
  const feeds = new Map<string, SiteFeed>();
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
      f = { dims, mul: new Float32Array(n).fill(1), add: new Float32Array(n) };
      feeds.set(iv.hook, f);
    }
    apply(f, iv, ctx);
  }
  return feeds;
}

function apply(f: SiteFeed, iv: Intervention, ctx: Ctx): void {
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
  if (iv.op === 'add' || iv.op === 'set' || iv.op === 'mean') {
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
  let srcBatch = 1;
  if (iv.op === 'patch') {
    src = iv.source;
    if (!src) throw bad(`'patch' on ${iv.hook} needs a source activation.`);
    const want = dims.slice(1);
    const got = src.dims.length === rank ? src.dims.slice(1) : src.dims;
    srcBatch = src.dims.length === rank ? src.dims[0] : 1;
    if (got.length !== want.length || got.some((d, i) => d !== want[i]) || (srcBatch !== 1 && srcBatch !== B)) {
      throw bad(
        `patch source has shape [${src.dims}] but ${iv.hook} has shape [${dims}] in this run.`,
        'Patching needs prompts of equal token length; the source is the same hook from the other run.',
      );
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
          a = src!.data[(srcBatch === 1 ? 0 : b) * perRow + r];
          break;
      }
      f.mul[i] *= m;
      f.add[i] = f.add[i] * m + a;
    }
  }
}
