/**
 * An attribution graph on a canvas (thousands of nodes and links stay responsive where one SVG
 * element per mark would not): rows are layers (token embeddings at the bottom, each transformer
 * layer, the logits on top), columns the prompt's positions labelled with their tokens. Within a
 * cell its nodes fill a small grid, the most influential first, never closer than NODE_STEP. Links are drawn by |weight| above
 * a threshold, coloured by sign; a focused node (hovered or selected) shows only its own links.
 */
import { palette, type Palette } from './palette';
import { showToken } from './format';

export interface GraphNodeIn {
  node_id: string;
  feature: number;
  layer: string;
  ctx_idx: number;
  feature_type: string;
  influence: number | null;
  activation: number | null;
  clerp: string;
  token_prob: number;
}

export type NodeType = 'feature' | 'error' | 'token' | 'logit';

export interface LaidNode {
  i: number;
  type: NodeType;
  /** 0 = embeddings, 1 … L = layers 0 … L−1, L + 1 = logits */
  row: number;
  pos: number;
  x: number;
  y: number;
  r: number;
}

export interface GraphLayout {
  width: number;
  height: number;
  nodes: LaidNode[];
  rows: number;
  rowY: (row: number) => number;
  colX: (pos: number) => number;
  colW: number;
  left: number;
  bottom: number;
}

export const TYPE_OF: Record<string, NodeType> = {
  'cross layer transcoder': 'feature',
  'mlp reconstruction error': 'error',
  embedding: 'token',
  logit: 'logit',
};

/** the least distance between two nodes' centres in a crowded cell: each stays reachable by the pointer */
export const NODE_STEP = 8;
/** the narrowest column: a long prompt widens the canvas (the box scrolls) rather than overlap nodes */
export const MIN_COL_W = 18;

/**
 * Rows are bands whose height grows with their most crowded cell: a cell's nodes fill a grid of
 * as many per line as its column holds at NODE_STEP apart, and as many lines as they need, so
 * co-located features never sit closer than NODE_STEP (21 features of one cell were 1 px apart).
 * `width` is the width to fill; with many positions the layout is wider (MIN_COL_W per column);
 * `zoom` widens every column.
 */
export function layoutGraph(nodes: GraphNodeIn[], nLayers: number, T: number, width: number, zoom = 1): GraphLayout {
  const rows = nLayers + 2;
  const left = 44,
    right = 10,
    top = 10;
  const colW = zoom * Math.max(MIN_COL_W, (width - left - right) / Math.max(1, T));
  const w = left + right + colW * Math.max(1, T);
  // position labels turn when a column is too narrow for them
  const bottom = colW < 40 ? 64 : 46;
  const baseH = Math.max(22, Math.min(46, 520 / rows));
  const colX = (pos: number) => left + pos * colW;
  const cells = new Map<string, number[]>();
  const rowOf = (n: GraphNodeIn): number => {
    const t = TYPE_OF[n.feature_type];
    if (t === 'token') return 0;
    if (t === 'logit') return nLayers + 1;
    return Number(n.layer) + 1;
  };
  nodes.forEach((n, i) => {
    const key = `${rowOf(n)}:${n.ctx_idx}`;
    const list = cells.get(key) ?? [];
    list.push(i);
    cells.set(key, list);
  });
  const perLine = Math.max(1, Math.floor((colW - 4) / NODE_STEP));
  const lines = new Array<number>(rows).fill(1);
  for (const [key, list] of cells) {
    const row = Number(key.split(':')[0]);
    if (row !== rows - 1) lines[row] = Math.max(lines[row], Math.ceil(list.length / perLine));
  }
  const bandH = lines.map((k) => Math.max(baseH, k * NODE_STEP + 10));
  // bands from the top: the logits first, the embeddings last
  const bandTop = new Array<number>(rows);
  let y = top;
  for (let row = rows - 1; row >= 0; row--) {
    bandTop[row] = y;
    y += bandH[row];
  }
  const height = y + bottom;
  const rowY = (row: number) => bandTop[row] + bandH[row] / 2;
  const laid: LaidNode[] = new Array(nodes.length);
  for (const [key, list] of cells) {
    const [row, pos] = key.split(':').map(Number);
    // most important first (circuit-tracer's influence is a cumulative fraction: smaller is more important); logits by probability
    list.sort((a, b) => rank(nodes[a]) - rank(nodes[b]) || a - b);
    if (row === rows - 1) {
      // the logits share the last position: spread them leftwards from it, room for their labels
      const step = Math.min(64, (w - left - right) / Math.max(1, list.length));
      const last = colX(pos) + colW / 2;
      list.forEach((i, k) => {
        const x = Math.max(left + step / 2, last - (list.length - 1 - k) * step);
        laid[i] = { i, type: 'logit', row, pos, x, y: rowY(row), r: 4.5 };
      });
      continue;
    }
    const n = list.length;
    const across = Math.min(n, perLine);
    const down = Math.ceil(n / perLine);
    // a cell with room spreads its nodes wider and draws them larger
    const step = n === 1 ? 0 : Math.max(NODE_STEP, Math.min(14, (colW - 6) / across));
    const r = n <= 2 ? Math.min(5, colW / 5) : Math.min(4, Math.max(2.5, step / 2.6));
    const x0 = colX(pos) + colW / 2 - (step * (across - 1)) / 2;
    const y0 = rowY(row) - (NODE_STEP * (down - 1)) / 2;
    list.forEach((i, k) => {
      const x = x0 + (k % perLine) * step;
      laid[i] = {
        i,
        type: TYPE_OF[nodes[i].feature_type],
        row,
        pos,
        x,
        y: y0 + Math.floor(k / perLine) * NODE_STEP,
        r,
      };
    });
  }
  return { width: w, height, nodes: laid, rows, rowY, colX, colW, left, bottom };
}

function rank(n: GraphNodeIn): number {
  if (TYPE_OF[n.feature_type] === 'logit') return -n.token_prob;
  return n.influence ?? 1;
}

export interface DrawState {
  /** links: [source, target] node indices and weights */
  links: { s: number; t: number; w: number }[];
  /** draw links with |weight| ≥ this */
  threshold: number;
  focus: number | null;
  selected: number | null;
  pinned: Set<number>;
  /** nodes of the supernode being looked at */
  group: Set<number>;
  tokens: string[];
  nLayers: number;
}

const TYPE_FILL = (p: Palette, t: NodeType) =>
  t === 'feature' ? p.accent : t === 'error' ? p.muted : t === 'token' ? p.fg : p.highlight;

export function drawGraph(canvas: HTMLCanvasElement, lay: GraphLayout, nodes: GraphNodeIn[], st: DrawState): number {
  const p = palette();
  const dpr = window.devicePixelRatio || 1;
  canvas.width = Math.round(lay.width * dpr);
  canvas.height = Math.round(lay.height * dpr);
  canvas.style.width = `${lay.width}px`;
  canvas.style.height = `${lay.height}px`;
  const ctx = canvas.getContext('2d')!;
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.fillStyle = p.bg;
  ctx.fillRect(0, 0, lay.width, lay.height);

  // rows and columns
  ctx.strokeStyle = p.grid;
  ctx.lineWidth = 1;
  ctx.font = `11px ${p.font}`;
  ctx.fillStyle = p.muted;
  ctx.textAlign = 'right';
  ctx.textBaseline = 'middle';
  for (let row = 0; row < lay.rows; row++) {
    const y = lay.rowY(row);
    ctx.beginPath();
    ctx.moveTo(lay.left, y);
    ctx.lineTo(lay.width - 8, y);
    ctx.globalAlpha = 0.5;
    ctx.stroke();
    ctx.globalAlpha = 1;
    ctx.fillText(row === 0 ? 'Emb' : row === lay.rows - 1 ? 'Lgt' : `L${row - 1}`, lay.left - 6, y);
  }
  const T = st.tokens.length;
  ctx.textAlign = 'center';
  ctx.textBaseline = 'top';
  const yLabel = lay.height - lay.bottom + 8;
  for (let pos = 0; pos < T; pos++) {
    const x = lay.colX(pos);
    if (pos > 0) {
      ctx.globalAlpha = 0.35;
      ctx.beginPath();
      ctx.moveTo(x, 8);
      ctx.lineTo(x, lay.height - lay.bottom);
      ctx.stroke();
      ctx.globalAlpha = 1;
    }
    ctx.fillStyle = p.muted;
    ctx.fillText(String(pos), x + lay.colW / 2, yLabel);
    ctx.fillStyle = p.fg;
    if (lay.colW >= 40)
      ctx.fillText(truncate(ctx, showToken(st.tokens[pos]), lay.colW - 2), x + lay.colW / 2, yLabel + 14);
    else {
      // narrow columns: the token turned, so neighbouring labels never overlap
      ctx.save();
      ctx.translate(x + lay.colW / 2 + 3, yLabel + 14);
      ctx.rotate(-Math.PI / 4);
      ctx.textAlign = 'right';
      ctx.textBaseline = 'middle';
      ctx.fillText(truncate(ctx, showToken(st.tokens[pos]), 56), 0, 0);
      ctx.restore();
    }
  }

  // links: all above the threshold, or the focused node's own
  const f = st.focus ?? st.selected;
  const own = (l: { s: number; t: number }) => f === null || l.s === f || l.t === f;
  let maxW = 0;
  for (const l of st.links) maxW = Math.max(maxW, Math.abs(l.w));
  let drawn = 0;
  const sorted = st.links.filter((l) => Math.abs(l.w) >= st.threshold).sort((a, b) => Math.abs(a.w) - Math.abs(b.w));
  for (const l of sorted) {
    const a = lay.nodes[l.s],
      b = lay.nodes[l.t];
    if (!a || !b) continue;
    const mine = own(l);
    const rel = maxW > 0 ? Math.abs(l.w) / maxW : 0;
    ctx.strokeStyle = l.w >= 0 ? p.pos : p.neg;
    ctx.globalAlpha = mine ? (f === null ? 0.12 + 0.6 * rel : 0.35 + 0.6 * rel) : 0.04;
    ctx.lineWidth = mine ? 0.6 + 2.4 * rel : 0.5;
    ctx.beginPath();
    ctx.moveTo(a.x, a.y);
    const my = (a.y + b.y) / 2;
    ctx.bezierCurveTo(a.x, my, b.x, my, b.x, b.y);
    ctx.stroke();
    if (mine) drawn++;
  }
  ctx.globalAlpha = 1;

  // nodes
  for (const n of lay.nodes) {
    if (!n) continue;
    const isF = f !== null && n.i === f;
    ctx.fillStyle = TYPE_FILL(p, n.type);
    ctx.globalAlpha = f === null || isF || st.group.has(n.i) ? 1 : 0.75;
    ctx.beginPath();
    if (n.type === 'error') ctx.rect(n.x - n.r, n.y - n.r, 2 * n.r, 2 * n.r);
    else if (n.type === 'logit') {
      ctx.moveTo(n.x, n.y - n.r - 1);
      ctx.lineTo(n.x + n.r + 1, n.y);
      ctx.lineTo(n.x, n.y + n.r + 1);
      ctx.lineTo(n.x - n.r - 1, n.y);
      ctx.closePath();
    } else ctx.arc(n.x, n.y, n.type === 'token' ? n.r + 0.5 : n.r, 0, 2 * Math.PI);
    ctx.fill();
    ctx.globalAlpha = 1;
    if (st.pinned.has(n.i) || isF || n.i === st.selected || st.group.has(n.i)) {
      ctx.strokeStyle = st.group.has(n.i) ? p.highlight : n.i === st.selected || isF ? p.fg : p.highlight;
      ctx.lineWidth = 1.6;
      ctx.beginPath();
      ctx.arc(n.x, n.y, n.r + 2.5, 0, 2 * Math.PI);
      ctx.stroke();
    }
  }
  // the logits' tokens above their nodes
  ctx.fillStyle = p.fg;
  ctx.textAlign = 'center';
  ctx.textBaseline = 'bottom';
  ctx.font = `10px ${p.font}`;
  const logits = lay.nodes.filter((n) => n && n.type === 'logit');
  const room = logits.length > 1 ? Math.abs(logits[1].x - logits[0].x) - 4 : 60;
  for (const n of logits) {
    const m = /^Output "(.*)" \(p=/.exec(nodes[n.i].clerp);
    ctx.fillText(
      truncate(ctx, showToken(m ? m[1] : String(nodes[n.i].feature)), Math.max(16, room)),
      n.x,
      n.y - n.r - 2,
    );
  }
  return drawn;
}

function truncate(ctx: CanvasRenderingContext2D, s: string, w: number): string {
  if (ctx.measureText(s).width <= w) return s;
  let t = s;
  while (t.length > 1 && ctx.measureText(`${t}…`).width > w) t = t.slice(0, -1);
  return `${t}…`;
}

/** the node under (x, y) within a few pixels, or null */
export function hitTest(lay: GraphLayout, x: number, y: number): number | null {
  let best: number | null = null;
  let bd = Infinity;
  for (const n of lay.nodes) {
    if (!n) continue;
    const d = (n.x - x) ** 2 + (n.y - y) ** 2;
    if (d < bd && d <= (n.r + 4) ** 2) {
      bd = d;
      best = n.i;
    }
  }
  return best;
}
