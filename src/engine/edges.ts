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
 * An edge u → b exists when u's forward index is below b's `prevIndex`: a head of layer l reads
 * every node before layer l, the MLP of layer l also its own layer's heads (not in a parallel
 * attention/MLP block, where it reads what the heads read), and logits reads everything.
 */

export interface EdgeLayout {
  nLayers: number;
  nHeads: number;
  /** the MLP reads the block's input, not its heads (GPT-NeoX's parallel residual) */
  parallel: boolean;
  nForward: number;
  nBackward: number;
}

export type QKV = 'q' | 'k' | 'v';

export function edgeLayout(nLayers: number, nHeads: number, parallel: boolean): EdgeLayout {
  return { nLayers, nHeads, parallel, nForward: 1 + nLayers * (nHeads + 1), nBackward: nLayers * (3 * nHeads + 1) + 1 };
}

export const forwardHead = (g: EdgeLayout, l: number, h: number) => 1 + l * (g.nHeads + 1) + h;
export const forwardMlp = (g: EdgeLayout, l: number) => 1 + l * (g.nHeads + 1) + g.nHeads;
export const backwardHead = (g: EdgeLayout, l: number, qkv: QKV, h: number) =>
  l * (3 * g.nHeads + 1) + 'qkv'.indexOf(qkv) * g.nHeads + h;
export const backwardMlp = (g: EdgeLayout, l: number) => l * (3 * g.nHeads + 1) + 3 * g.nHeads;
export const backwardLogits = (g: EdgeLayout) => g.nBackward - 1;

/** the first forward index that does NOT feed backward input b (graph.py prev_index) */
export function prevIndex(g: EdgeLayout, b: number): number {
  if (b === g.nBackward - 1) return g.nForward;
  const per = 3 * g.nHeads + 1;
  const l = Math.floor(b / per);
  const first = 1 + l * (g.nHeads + 1);
  return b % per === 3 * g.nHeads && !g.parallel ? first + g.nHeads : first;
}
