/**
 * The feeds of one run: a value for every input build-model.ts declares (see its header for the
 * names and shapes), from the token rows, the KV cache, the logit positions, the compiled
 * interventions and, for gradient variants, the seed ∂M/∂logits.
 */
import { LoupeError } from '../errors';
import type { KVCache } from '../api';
import { headsOf, readoutWidths, type ModelSpec } from '../spec';
import type { Tensor } from '../tensor';
import { LENS_K, LENS_POSITIONS, PICK_ARGMAX_FLAG, PICK_K, type BuiltGraph } from '../graph/build-model';
import { mulInput, addInput } from '../graph/hooks';
import { GRAD_SEED } from '../graph/backward-model';
import { EDGE_GATE, EDGE_SELF, EDGE_SRC, EDGE_W } from '../graph/edge-graph';
import { ropeTables } from './rope';
import { FORWARD_READOUT_FLAG, FORWARD_READOUT_PREFIX, UNEMBED_DOTS, UNEMBED_SUM, UNEMBED_X } from '../readout/graph';
import { attentionMask } from './masks';
import type { SiteFeed } from './interventions';
import type { OrtModule, OrtTensorLike } from './ort-session';

export interface FeedRequest {
  /** token rows, all of length T */
  rows: number[][];
  /** keys/values of the P positions before these (none: P = 0) */
  past?: KVCache;
  /** positions whose logits the run computes (default: all T) */
  logitPositions?: number[];
  /** x' = x * mul + add per hook site; sites not in the map get mul = 1, add = 0 */
  sites: Map<string, SiteFeed>;
  /** ∂M/∂logits [B, P', V], for graphs with a backward pass */
  gradSeed?: Tensor;
  /** the edge variant's inputs (graph/edge-graph.ts), already shaped */
  edges?: { w: Tensor; src: Tensor; self: number; gate?: Tensor };
  /** the readout products' inputs (readout/graph.ts readoutFeeds), for a graph that has them in its forward */
  readout?: Record<string, OrtTensorLike>;
  /** what of the logits to reduce in the graph (RunOptions.pick): each position's argmax, its k largest (0: none) */
  argmax?: boolean;
  topK?: number;
  /** the logit lens in the graph (build-model.ts addForwardLens): the positions read and the k listed */
  lens?: { positions: number[]; k: number };
}

/** the sliding-window size of the model's local-attention layers (null: every layer is global) */
export function slidingWindowOf(spec: ModelSpec): number | null {
  return spec.layers.find((l) => l.attn && l.attn.slidingWindow !== null)?.attn?.slidingWindow ?? null;
}

/**
 * Layer l's cache before any position: no keys or values [B, Hkv, 0, Dh]; a linear-attention
 * layer's zero conv state [B, K − 1, C] and zero recurrent state [B, Hv, Dk, Dv] (what HF's
 * zero-padded conv and fresh state compute)
 */
function emptyPast(spec: ModelSpec, l: number, B: number): [Tensor, Tensor] {
  const s = spec.layers[l].linearAttn;
  const zeros = (dims: number[]): Tensor => ({ dims, data: new Float32Array(dims.reduce((a, d) => a * d, 1)) });
  if (s)
    return [zeros([B, s.convKernel - 1, 2 * s.nKHeads * s.dK + s.nVHeads * s.dV]), zeros([B, s.nVHeads, s.dK, s.dV])];
  const { Hkv, Dh } = headsOf(spec, l);
  return [zeros([B, Hkv, 0, Dh]), zeros([B, Hkv, 0, Dh])];
}

export function buildFeeds(
  ort: OrtModule,
  spec: ModelSpec,
  graph: BuiltGraph,
  req: FeedRequest,
): Record<string, OrtTensorLike> {
  const { rows, past } = req;
  const B = rows.length;
  const T = rows[0].length;
  const P = past?.length ?? 0;
  const Tk = P + T;
  const f32 = (data: Float32Array, dims: number[]) => new ort.Tensor('float32', data, dims);
  const i64 = (values: number[], dims: number[]) => new ort.Tensor('int64', BigInt64Array.from(values, BigInt), dims);
  const feeds: Record<string, OrtTensorLike> = {};

  feeds.input_ids = i64(rows.flat(), [B, T]);

  const logitPos = req.logitPositions ?? Array.from({ length: T }, (_, t) => t);
  for (const p of logitPos)
    if (!Number.isInteger(p) || p < 0 || p >= T)
      throw new LoupeError('BAD_INPUT', `logit position ${p} is outside this run's ${T} positions.`);
  if (logitPos.length === 0) throw new LoupeError('BAD_INPUT', 'logitPositions is empty.');
  feeds.logit_positions = i64(logitPos, [logitPos.length]);

  // absolute positions: a run continuing a KV cache starts at P
  const positions = Array.from({ length: T }, (_, t) => P + t);
  if (graph.inputNames.includes('position_ids')) feeds.position_ids = i64(positions, [T]);
  if (spec.rotary) {
    const { cos, sin } = ropeTables(spec.rotary, positions);
    feeds.rope_cos = f32(cos, [T, spec.rotary.dim]);
    feeds.rope_sin = f32(sin, [T, spec.rotary.dim]);
  }
  if (spec.rotaryLocal) {
    const { cos, sin } = ropeTables(spec.rotaryLocal, positions);
    feeds.rope_cos_local = f32(cos, [T, spec.rotaryLocal.dim]);
    feeds.rope_sin_local = f32(sin, [T, spec.rotaryLocal.dim]);
  }

  feeds.attn_mask = f32(attentionMask(T, P, null), [T, Tk]);
  if (graph.inputNames.includes('attn_mask_local'))
    feeds.attn_mask_local = f32(attentionMask(T, P, slidingWindowOf(spec)), [T, Tk]);

  const device = past?.device;
  if (device && device.batch !== B)
    throw new LoupeError('BAD_INPUT', `KV cache batch ${device.batch} does not match batch ${B}.`);
  for (let l = 0; l < spec.nLayers; l++) {
    // (a graph without a cache, or a layer that reads another's keys and values: no past input)
    if (!graph.inputNames.includes(`past.${l}.key`)) continue;
    if (device) {
      // a cache on the device is fed as it is (runtime/ort-session.ts: a 'gpu-buffer' tensor)
      feeds[`past.${l}.key`] = device.keys[l] as OrtTensorLike;
      feeds[`past.${l}.value`] = device.values[l] as OrtTensorLike;
      continue;
    }
    const [emptyK, emptyV] = emptyPast(spec, l, B);
    const k = past?.keys[l] ?? emptyK;
    const v = past?.values[l] ?? emptyV;
    if (k.dims[0] !== B) throw new LoupeError('BAD_INPUT', `KV cache batch ${k.dims[0]} does not match batch ${B}.`);
    feeds[`past.${l}.key`] = f32(k.data, k.dims);
    feeds[`past.${l}.value`] = f32(v.data, v.dims);
  }

  const one = new Float32Array([1]);
  const zero = new Float32Array([0]);
  for (const site of graph.sites) {
    const c = req.sites.get(site);
    // (a site with sources on the device: its add made there replaces this one, model.ts deviceAdds)
    feeds[mulInput(site)] = c ? f32(c.mul.data, c.mul.dims) : f32(one, [1]);
    feeds[addInput(site)] = c ? f32(c.add.data, c.add.dims) : f32(zero, [1]);
  }

  if (graph.inputNames.includes(PICK_K)) {
    feeds[PICK_ARGMAX_FLAG] = i64([req.argmax ? 1 : 0], []);
    feeds[PICK_K] = i64([req.topK ?? 0], []);
  }
  if (graph.inputNames.includes(LENS_K)) {
    feeds[LENS_K] = i64([req.lens?.k ?? 0], []); // 0: the If skips the lens
    feeds[LENS_POSITIONS] = i64(req.lens?.positions ?? [], [req.lens?.positions.length ?? 0]);
  }
  if (graph.inputNames.includes(FORWARD_READOUT_FLAG)) {
    // 0 on a forward: the If skips the products (readout/graph.ts addForwardReadout)
    feeds[FORWARD_READOUT_FLAG] = i64([req.readout ? 1 : 0], []);
    const { nLayers: L, dModel: D } = spec;
    const { HD, M } = readoutWidths(spec); // the stacks' widths: Gemma 4's layers are padded to the widest
    const widths: Record<string, number> = { z: HD, post: M, attn_dirs: D, mlp_dirs: D };
    for (const [name, w] of Object.entries(widths))
      feeds[FORWARD_READOUT_PREFIX + name] = req.readout?.[name] ?? f32(new Float32Array(0), [L, 0, w]);
    feeds[FORWARD_READOUT_PREFIX + UNEMBED_SUM] = req.readout?.[UNEMBED_SUM] ?? i64([0], []);
    feeds[FORWARD_READOUT_PREFIX + UNEMBED_DOTS] = req.readout?.[UNEMBED_DOTS] ?? i64([0], []);
    feeds[FORWARD_READOUT_PREFIX + UNEMBED_X] = req.readout?.[UNEMBED_X] ?? f32(new Float32Array(0), [0, D]);
  }
  if (req.gradSeed) feeds[GRAD_SEED] = f32(req.gradSeed.data, req.gradSeed.dims);
  if (req.edges) {
    const e = req.edges;
    feeds[EDGE_W] = f32(e.w.data, e.w.dims);
    feeds[EDGE_SRC] = f32(e.src.data, e.src.dims);
    feeds[EDGE_SELF] = f32(new Float32Array([e.self]), [1]);
    if (e.gate) feeds[EDGE_GATE] = f32(e.gate.data, e.gate.dims);
  }
  return feeds;
}
