/**
 * An edge circuit laid out by layer: input at the bottom, then per layer a row of heads and its
 * MLP above them, logits at the top; each edge a curve from its upstream node to the input it
 * enters (a head's q, k and v inputs are three points on its node), its width by |score| and its
 * colour by sign (diverging: negative = patching it lowers M), dashed by the head input it enters
 * (QKV_DASH); the pointer finds an edge within HIT_WIDTH / 2 of it. Clicking a head selects it.
 */
import { chartFrame } from './frame';
import { palette, divergingColor } from './palette';
import { showTooltip, hideTooltip } from './tooltip';
import { fmt } from './format';

/** how an edge into a head's query, key or value input is dashed (the view's legend draws the same) */
export const QKV_DASH: Record<string, string | null> = { q: null, k: '5 2', v: '1.5 2', '': null };
/** how an edge into a mixture-of-experts layer's router (`…<router>`) is dashed: dash-dot, apart from q/k/v */
export const ROUTER_DASH = '6 2 1.5 2';
/** the dash pattern of one edge (null: solid) */
export const edgeDash = (e: { qkv: string | null; name: string }): string | null =>
  e.qkv ? (QKV_DASH[e.qkv] ?? null) : e.name.endsWith('<router>') ? ROUTER_DASH : null;
/** the width of the pointer's target along each edge, in px */
export const HIT_WIDTH = 10;

export interface CircuitEdge {
  name: string;
  upstream: string;
  downstream: string;
  qkv: 'q' | 'k' | 'v' | null;
  score: number;
}

export interface CircuitOptions {
  layers: number;
  heads: number;
  /** a mixture-of-experts model's experts per layer (each a node in the MLP's row) and its shared expert */
  experts?: number;
  shared?: boolean;
  /** the edges to draw (the circuit) */
  edges: CircuitEdge[];
  label: string;
  onSelectHead?: (layer: number, head: number) => void;
  /** the head to outline (linked views) */
  selected?: { layer: number; head: number } | null;
  maxWidth?: number;
}

export function drawCircuit(svgEl: SVGSVGElement, o: CircuitOptions): void {
  const p = palette();
  const L = o.layers;
  const H = o.heads;
  const nMlp = o.experts ? o.experts + (o.shared ? 1 : 0) : 1;
  const width = Math.min(o.maxWidth ?? 900, Math.max(420, 60 + Math.max(H, nMlp) * 56));
  const rowH = 34;
  const margin = { left: 44, right: 20, top: 26, bottom: 26 };
  const height = margin.top + margin.bottom + (2 * L + 1) * rowH;
  const inner = width - margin.left - margin.right;
  const yOf = (row: number) => height - margin.bottom - row * rowH; // row 0 = input, 2l+1 = heads of l, 2l+2 = MLP of l
  const headX = (h: number) => margin.left + ((h + 0.5) * inner) / H;
  const mid = margin.left + inner / 2;
  // a layer's MLP nodes: m{l}, or its experts m{l}.e{e} and m{l}.shared spread along the row
  const E = o.experts ?? 0;
  const mlpSuffixes = E ? [...Array.from({ length: E }, (_, e) => `.e${e}`), ...(o.shared ? ['.shared'] : [])] : [''];
  const mlpX = (j: number) => margin.left + ((j + 0.5) * inner) / nMlp;
  const pos = (node: string): { x: number; y: number } => {
    if (node === 'input') return { x: mid, y: yOf(0) };
    if (node === 'logits') return { x: mid, y: yOf(2 * L + 1) - rowH / 2 };
    const a = /^a(\d+)\.h(\d+)$/.exec(node);
    if (a) return { x: headX(+a[2]), y: yOf(2 * +a[1] + 1) };
    const m = /^m(\d+)(.*)$/.exec(node)!;
    return { x: mlpX(Math.max(0, mlpSuffixes.indexOf(m[2]))), y: yOf(2 * +m[1] + 2) };
  };
  const qkvDx = { q: -9, k: 0, v: 9 } as const;

  const svg = chartFrame(svgEl, { width, height, label: o.label, palette: p });

  // layer guides
  for (let l = 0; l < L; l++) {
    svg
      .append('text')
      .attr('x', 6)
      .attr('y', yOf(2 * l + 1) + 4)
      .attr('fill', p.muted)
      .text(`L${l}`);
    svg
      .append('line')
      .attr('x1', margin.left)
      .attr('x2', width - margin.right)
      .attr('y1', yOf(2 * l + 1) + rowH / 2)
      .attr('y2', yOf(2 * l + 1) + rowH / 2)
      .attr('stroke', p.grid)
      .attr('stroke-width', 0.5);
  }

  const max = Math.max(1e-12, ...o.edges.map((e) => Math.abs(e.score)));
  const used = new Set<string>(['input', 'logits']);
  for (const e of o.edges) {
    used.add(e.upstream);
    used.add(e.downstream);
  }
  // strongest last, so it is drawn on top
  const sorted = [...o.edges].sort((a, b) => Math.abs(a.score) - Math.abs(b.score));
  const pathOf = (e: CircuitEdge) => {
    const a = pos(e.upstream);
    const b = pos(e.downstream);
    const bx = b.x + (e.qkv ? qkvDx[e.qkv] : e.name.endsWith('<router>') ? 6 : e.name.endsWith('<in>') ? -6 : 0);
    const by = b.y + 7;
    const my = (a.y + by) / 2;
    return `M${a.x},${a.y - 7} C${a.x},${my} ${bx},${my} ${bx},${by}`;
  };
  svg
    .append('g')
    .attr('fill', 'none')
    .attr('pointer-events', 'none')
    .selectAll('path')
    .data(sorted)
    .join('path')
    .attr('class', 'circuit-edge')
    .attr('data-edge', (e) => e.name)
    .attr('d', pathOf)
    .attr('stroke', (e) => divergingColor(Math.max(-1, Math.min(1, e.score / max)) * 0.85 + Math.sign(e.score) * 0.15))
    .attr('stroke-width', (e) => 0.6 + 5 * (Math.abs(e.score) / max))
    .attr('stroke-dasharray', edgeDash)
    // weak edges fade, in both themes (the diverging scale's middle is near the dark theme's text colour)
    .attr('opacity', (e) => 0.3 + 0.6 * (Math.abs(e.score) / max));
  // what the pointer finds: an invisible stroke HIT_WIDTH wide over each edge (a drawn one can be 0.6 px)
  svg
    .append('g')
    .attr('fill', 'none')
    .selectAll('path')
    .data(sorted)
    .join('path')
    .attr('class', 'circuit-edge-hit')
    .attr('data-edge', (e) => e.name)
    .attr('d', pathOf)
    .attr('stroke', 'transparent')
    .attr('stroke-width', HIT_WIDTH)
    .attr('pointer-events', 'stroke')
    .on('mousemove', (ev, e) =>
      showTooltip(ev, [
        e.name,
        `score ${fmt(e.score, 5)} (estimated ΔM when patched)`,
        e.qkv ? `into the ${e.qkv} input` : '',
      ]),
    )
    .on('mouseleave', hideTooltip);

  const nodes = [
    'input',
    ...Array.from({ length: L }, (_, l) => [
      ...Array.from({ length: H }, (_, h) => `a${l}.h${h}`),
      ...mlpSuffixes.map((x) => `m${l}${x}`),
    ]).flat(),
    'logits',
  ];
  const g = svg.append('g');
  for (const n of nodes) {
    const { x, y } = pos(n);
    const head = /^a(\d+)\.h(\d+)$/.exec(n);
    const on = used.has(n);
    const sel = head && o.selected && o.selected.layer === +head[1] && o.selected.head === +head[2];
    const shape = g
      .append(head ? 'circle' : 'rect')
      .attr('class', head ? 'circuit-head' : 'circuit-node')
      .attr('data-node', n)
      .attr('fill', on ? p.bg : p.bg)
      .attr('stroke', sel ? p.highlight : on ? p.fg : p.grid)
      .attr('stroke-width', sel ? 3 : on ? 1.5 : 1);
    if (head) shape.attr('cx', x).attr('cy', y).attr('r', 9);
    else
      shape
        .attr('x', x - 26)
        .attr('y', y - 8)
        .attr('width', 52)
        .attr('height', 16)
        .attr('rx', 3);
    const text = g
      .append('text')
      .attr('x', x)
      .attr('y', y + 3.5)
      .attr('text-anchor', 'middle')
      .attr('font-size', head ? 8 : 10)
      .attr('fill', on ? p.fg : p.muted)
      .attr('pointer-events', 'none')
      .text(head ? `${head[2]}` : n);
    void text;
    if (head && o.onSelectHead) {
      const l = +head[1],
        h = +head[2];
      shape
        .style('cursor', 'pointer')
        .on('click', () => o.onSelectHead!(l, h))
        .on('mousemove', (ev) => showTooltip(ev, [`L${l}H${h} — click to open`]))
        .on('mouseleave', hideTooltip);
    }
  }
}
