/**
 * The edge graph of a transformer as the EAP-IG library lays it out (hannamw/EAP-IG
 * src/eap/graph.py, `Graph.from_model`; /work/shared/specs/edge-circuits.md (a)), which the edge
 * variant of the model graph (graph/edge-graph.ts) takes its per-edge weights in.
 *
 * Upstream ("forward") nodes, in residual-stream order: `input` (hook_embed, the token
 * embedding; positions and every b_O are the same in clean and corrupted runs and are not
 * nodes), then per layer l its heads `a{l}.h{h}` (hook_result: z_h · W_O[h], no bias) and its
 * MLP `m{l}` (hook_mlp_out). Downstream ("backward") inputs: per layer l the q, k and v input of
 * every head (the residual stream before ln1, one copy per query head: grouped-query attention
 * is ungrouped as TransformerLens's ungroup_grouped_query_attention does, so k and v inputs are
 * counted per query head), the MLP's input (before ln2), and last `logits` (the final
 * resid_post, before ln_final).
 *
 *   forward index   input = 0, a{l}.h{h} = 1 + l(H+1) + h, m{l} = 1 + l(H+1) + H      (nForward = 1 + L(H+1))
 *   backward index  a{l}.h{h}<q|k|v> = l(3H+1) + {0,H,2H} + h, m{l} = l(3H+1) + 3H, logits = L(3H+1)
 *
 * A mixture-of-experts layer's MLP is not one node but its experts, as a layer's attention is its
 * heads (the library has no MoE; these names are Loupe's): upstream `m{l}.e{e}` (experts.{e}.hook_out,
 * the expert's routing-weighted output) and `m{l}.shared` (Qwen2-MoE's gated shared expert);
 * downstream each expert's two inputs, `m{l}.e{e}<in>` (the residual stream its MLP reads) and
 * `m{l}.e{e}<router>` (the one the router reads to weigh it: the whole router runs on that copy and
 * the expert takes its own column), and `m{l}.shared` (the shared expert and its gate). With
 * F = E (+1 shared) MLP nodes and I = 2E (+1) MLP inputs per layer, m{l} above becomes the
 * F nodes from 1 + l(H+F) + H and the I inputs from l(3H+I) + 3H: experts' <in> (E), their
 * <router> (E), shared.
 *
 * An edge u → b exists when u's forward index is below b's `prevIndex`: a head of layer l reads
 * every node before layer l, the MLP of layer l also its own layer's heads (not in a parallel
 * attention/MLP block, where it reads what the heads read), and logits reads everything.
 */

export interface EdgeLayout {
  nLayers: number;
  nHeads: number;
  /** the MLP reads the block's input, not its heads (GPT-NeoX's parallel residual) */
  parallel: boolean;
  /** mixture-of-experts layers: experts per layer and whether a shared expert follows them */
  experts: number;
  shared: boolean;
  /** MLP nodes (forward) and MLP inputs (backward) per layer: 1 and 1, or E (+1) and 2E (+1) */
  nMlp: number;
  nMlpIn: number;
  nForward: number;
  nBackward: number;
}

export type QKV = 'q' | 'k' | 'v';

export function edgeLayout(
  nLayers: number,
  nHeads: number,
  parallel: boolean,
  moe?: { experts: number; shared: boolean },
): EdgeLayout {
  const experts = moe?.experts ?? 0;
  const shared = !!moe?.shared;
  const nMlp = experts ? experts + (shared ? 1 : 0) : 1;
  const nMlpIn = experts ? 2 * experts + (shared ? 1 : 0) : 1;
  return {
    nLayers,
    nHeads,
    parallel,
    experts,
    shared,
    nMlp,
    nMlpIn,
    nForward: 1 + nLayers * (nHeads + nMlp),
    nBackward: nLayers * (3 * nHeads + nMlpIn) + 1,
  };
}

const perForward = (g: EdgeLayout) => g.nHeads + g.nMlp;
const perBackward = (g: EdgeLayout) => 3 * g.nHeads + g.nMlpIn;
export const forwardHead = (g: EdgeLayout, l: number, h: number) => 1 + l * perForward(g) + h;
/** MLP node j of layer l (a dense MLP: j = 0; an MoE: expert j, or the shared expert at j = E) */
export const forwardMlp = (g: EdgeLayout, l: number, j = 0) => 1 + l * perForward(g) + g.nHeads + j;
export const backwardHead = (g: EdgeLayout, l: number, qkv: QKV, h: number) =>
  l * perBackward(g) + 'qkv'.indexOf(qkv) * g.nHeads + h;
/** MLP input j of layer l (a dense MLP: j = 0; an MoE: expert j's <in>, E + j its <router>, 2E shared) */
export const backwardMlp = (g: EdgeLayout, l: number, j = 0) => l * perBackward(g) + 3 * g.nHeads + j;
export const backwardLogits = (g: EdgeLayout) => g.nBackward - 1;

/** the first forward index that does NOT feed backward input b (graph.py prev_index) */
export function prevIndex(g: EdgeLayout, b: number): number {
  if (b === g.nBackward - 1) return g.nForward;
  const per = perBackward(g);
  const l = Math.floor(b / per);
  const first = 1 + l * perForward(g);
  return b % per >= 3 * g.nHeads && !g.parallel ? first + g.nHeads : first;
}
