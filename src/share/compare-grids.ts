/**
 * What of a document the page's Compare panel and the MCP `compare` tool can put side by side and subtract: its grids (layer × head,
 * layer × position, query × key, target × effect …), per operation. Each grid names its rows and
 * columns, so two documents' grids are matched by those names — ablation tables rank their rows
 * differently run to run, and a Δ of two grids whose rows or columns are different things (other
 * positions, other targets, another model's heads) would be a number that means nothing. `deltaOf`
 * says why when there is no Δ.
 */
import { showToken } from './token-text';

export interface Grid {
  /** which grid of the document (documents of one operation have the same keys) */
  key: string;
  /** what a cell holds, for titles and legends */
  what: string;
  values: (number | null)[][];
  rows: string[];
  cols: string[];
  kind: 'diverging' | 'sequential';
  /** the colour scale's fixed range (probabilities, scores); else the data's */
  domain?: [number, number];
  /** what the rows and columns are, for the reason a Δ is refused ("positions", "heads" …) */
  rowsAre: string;
  colsAre: string;
  /**
   * rows are a ranked selection (a run's top neurons): the Δ is taken on the rows both name, the
   * others have none (said in its note), instead of no Δ at all
   */
  partialRows?: boolean;
}

type Doc = any;
const layerLabels = (n: number) => Array.from({ length: n }, (_, l) => `L${l}`);
const headLabels = (n: number) => Array.from({ length: n }, (_, h) => `H${h}`);
/** tokens with their position, so two prompts' columns match only where position and token agree */
const tokLabels = (doc: Doc, positions?: number[]) =>
  (positions ?? doc.tokens.map((_: unknown, i: number) => i)).map(
    (p: number) => `${p} ${showToken(doc.tokens[p]?.text ?? '')}`,
  );
const EFFECTS = [
  ['logprob_delta', 'Δ log-prob (nats)'],
  ['logit_delta', 'Δ logit'],
  ['prob_delta', 'Δ probability'],
  ['kl', 'KL (nats)'],
] as const;

/** one grid per effect over a list of labelled ablation entries (rows: the targets) */
function effectGrids(prefix: string, entries: Doc[], rowsAre: string): Grid[] {
  return EFFECTS.map(([k, what]) => ({
    key: `${prefix}${k}`,
    what: `${prefix ? `${prefix.replace(/[:.]$/, '')} ` : ''}${what}`,
    values: entries.map((e) => [e[k]]),
    rows: entries.map((e) => String(e.label)),
    cols: [what],
    kind: k === 'kl' ? ('sequential' as const) : ('diverging' as const),
    rowsAre,
    colsAre: 'effects',
  }));
}

/** layer × head grid from a list of {layer, head, …} rows */
function headGrid(rows: Doc[], L: number, H: number, value: (r: Doc) => number): (number | null)[][] {
  const g: (number | null)[][] = Array.from({ length: L }, () => new Array(H).fill(null));
  for (const r of rows) if (r.layer < L && r.head < H) g[r.layer][r.head] = value(r);
  return g;
}

const GRIDS: Record<string, (doc: Doc) => Grid[]> = {
  trace: (d) => [
    {
      key: 'head_attribution',
      what: 'head DLA (logits)',
      values: d.head_attribution,
      kind: 'diverging',
      rows: layerLabels(d.head_attribution.length),
      cols: headLabels(d.head_attribution[0]?.length ?? 0),
      rowsAre: 'layers',
      colsAre: 'heads',
    },
    {
      key: 'terms',
      what: 'decomposition terms (logits)',
      values: d.decomposition.terms.map((t: Doc) => [t.value]),
      kind: 'diverging',
      rows: d.decomposition.terms.map((t: Doc) => String(t.name)),
      cols: ['value'],
      rowsAre: 'terms',
      colsAre: 'values',
    },
    {
      key: 'top_neurons',
      what: 'top neurons: DLA and activation',
      values: d.top_neurons.map((n: Doc) => [n.logit_attribution, n.activation]),
      kind: 'diverging',
      rows: d.top_neurons.map((n: Doc) => `L${n.layer}N${n.neuron}`),
      cols: ['DLA (logits)', 'activation'],
      rowsAre: 'neurons',
      colsAre: 'values',
      partialRows: true,
    },
  ],
  logit_lens: (d) => [
    {
      key: 'final_token_prob',
      what: 'P(final token)',
      kind: 'sequential',
      domain: [0, 1],
      values: d.layers.map((l: Doc) => l.positions.map((p: Doc) => p.final_token_prob)),
      rows: d.layers.map((l: Doc) => String(l.label ?? l.layer)),
      cols: tokLabels(d, d.positions),
      rowsAre: 'layers',
      colsAre: 'positions',
    },
  ],
  attention: (d) =>
    d.heads.map((h: Doc) => ({
      key: `L${h.layer}H${h.head}`,
      what: `L${h.layer}H${h.head} attention`,
      values: h.pattern,
      kind: 'sequential',
      domain: [0, 1],
      rows: tokLabels(d),
      cols: tokLabels(d),
      rowsAre: 'positions',
      colsAre: 'positions',
    })),
  activations: (d) => {
    const sites: string[] = [...new Set<string>(d.layers.flatMap((l: Doc) => l.sites.map((s: Doc) => s.site)))];
    return (['mean', 'std', 'min', 'max'] as const).map((stat) => ({
      key: stat,
      what: `${stat} per layer and site`,
      kind: 'diverging' as const,
      values: d.layers.map((l: Doc) => sites.map((s) => l.sites.find((x: Doc) => x.site === s)?.[stat] ?? null)),
      rows: d.layers.map((l: Doc) => `L${l.layer}`),
      cols: sites,
      rowsAre: 'layers',
      colsAre: 'sites',
    }));
  },
  head_scores: (d) =>
    (['induction', 'previous_token', 'duplicate_token'] as const).map((s) => ({
      key: s,
      what: `${s.replace('_', ' ')} score`,
      kind: 'sequential' as const,
      domain: [0, 1] as [number, number],
      values: headGrid(d.heads, d.model.n_layers, d.model.n_heads, (r) => r[s]),
      rows: layerLabels(d.model.n_layers),
      cols: headLabels(d.model.n_heads),
      rowsAre: 'layers',
      colsAre: 'heads',
    })),
  patch: (d) => [
    ...(['resid_pre', 'attn_out', 'mlp_out'] as const)
      .filter((k) => d[k])
      .map((k) => ({
        key: k,
        what: `${k} patching (normalised logit diff)`,
        values: d[k],
        kind: 'diverging' as const,
        domain: [-1, 1] as [number, number],
        rows: layerLabels(d[k].length),
        cols: tokLabels(d),
        rowsAre: 'layers',
        colsAre: 'positions',
      })),
    ...(d.head_out
      ? [
          {
            key: 'head_out',
            what: 'head output patching (normalised logit diff)',
            values: d.head_out,
            kind: 'diverging' as const,
            domain: [-1, 1] as [number, number],
            rows: layerLabels(d.head_out.length),
            cols: headLabels(d.head_out[0]?.length ?? 0),
            rowsAre: 'layers',
            colsAre: 'heads',
          },
        ]
      : []),
  ],
  attribution_patching: (d) => {
    const L = d.model.n_layers,
      H = d.model.n_heads;
    const hooks: string[] = [...new Set<string>(d.sites.map((s: Doc) => s.hook.replace(/^blocks\.\d+\./, '')))];
    return [
      {
        key: 'heads',
        what: 'head estimate (ΔM)',
        values: headGrid(d.heads, L, H, (r) => r.estimate),
        kind: 'diverging' as const,
        rows: layerLabels(L),
        cols: headLabels(H),
        rowsAre: 'layers',
        colsAre: 'heads',
      },
      ...hooks.map((hk) => {
        const g: (number | null)[][] = Array.from({ length: L }, () => new Array(d.tokens.length).fill(null));
        for (const s of d.sites)
          if (s.hook.endsWith(hk) && s.layer < L && s.position < d.tokens.length) g[s.layer][s.position] = s.estimate;
        return {
          key: hk,
          what: `${hk} estimate (ΔM)`,
          values: g,
          kind: 'diverging' as const,
          rows: layerLabels(L),
          cols: tokLabels(d),
          rowsAre: 'layers',
          colsAre: 'positions',
        };
      }),
    ];
  },
  integrated_gradients: (d) => [
    {
      key: 'attributions',
      what: 'attribution (units of M)',
      kind: 'diverging',
      values: [d.attributions.map((a: Doc) => a.attribution)],
      rows: ['attribution'],
      cols: tokLabels(
        d,
        d.attributions.map((a: Doc) => a.position),
      ),
      rowsAre: 'rows',
      colsAre: 'positions',
    },
  ],
  ablate: (d) => effectGrids('', d.entries, 'targets'),
  circuit: (d) =>
    [
      ...effectGrids('heads:', d.heads, 'heads'),
      ...effectGrids('neurons:', d.neurons, 'neurons'),
      ...effectGrids('groups:', d.groups, 'groups'),
    ].filter((g) => g.rows.length),
  layer_ablation: (d) =>
    (['logprob_delta', 'kl'] as const).map((k) => ({
      key: k,
      what: k === 'kl' ? 'KL (nats)' : 'Δ log-prob (nats)',
      kind: k === 'kl' ? ('sequential' as const) : ('diverging' as const),
      values: d.layers.map((l: Doc) => [l[`attn_${k}`], l[`mlp_${k}`]]),
      rows: d.layers.map((l: Doc) => `L${l.layer}`),
      cols: ['attn_out', 'mlp_out'],
      rowsAre: 'layers',
      colsAre: 'components',
    })),
};

/** the grids of a document, or null when its operation has none */
export function gridsOf(op: string, doc: Doc): Grid[] | null {
  const f = GRIDS[op];
  if (!f || !doc) return null;
  try {
    const gs = f(doc);
    return gs.length ? gs : null;
  } catch {
    return null; // a document of an older shape: compared as numbers instead
  }
}

export type Delta =
  | { ok: true; values: (number | null)[][]; rows: string[]; cols: string[]; note: string | null }
  | { ok: false; reason: string };

const modelOf = (d: Doc) =>
  d?.model ? `${d.model.id}${d.model.revision && d.model.revision !== 'main' ? `@${d.model.revision}` : ''}` : '';
/** positions match by number (their label is "position token"); other axes by the whole label */
const keyOf = (label: string, are: string) => (are === 'positions' ? label.split(' ')[0] : label);

/**
 * B − A over the cells both grids name the same (rows and columns matched by label, in A's
 * order; positions by number, with a note where the tokens there differ), or why there is none:
 * the models differ, or the rows or columns are different things or different in number.
 */
export function deltaOf(docA: Doc, docB: Doc, a: Grid | undefined, b: Grid | undefined): Delta {
  if (!a || !b)
    return {
      ok: false,
      reason: `Not comparable: only ${a ? 'A' : 'B'} has ${(a ?? b)?.what ?? 'this grid'} (the two runs asked for different things).`,
    };
  const mA = modelOf(docA),
    mB = modelOf(docB);
  if (mA !== mB)
    return {
      ok: false,
      reason:
        `Not comparable: A ran on ${mA || 'an unknown model'} and B on ${mB || 'an unknown model'}; ` +
        'their layers, heads and positions are not the same quantities. Both are shown, without a Δ.',
    };
  const axis = (xa: string[], xb: string[], are: string, name: 'rows' | 'cols', partial = false) => {
    const ka = xa.map((x) => keyOf(x, are)),
      kb = xb.map((x) => keyOf(x, are));
    const ib = new Map(kb.map((k, i) => [k, i]));
    if (partial && new Set(ka).size === ka.length)
      return { ib, ka, differ: [] as string[], missing: ka.filter((k) => !ib.has(k)) };
    if (ka.length !== kb.length || new Set(ka).size !== ka.length || !ka.every((k) => ib.has(k))) {
      const why = are === 'positions' ? ' — the prompts have different token counts' : '';
      return {
        error:
          `Not comparable: the two have different ${are} (A ${xa.length}, ` +
          `B ${xb.length}${xa.length === xb.length ? ', not the same ones' : ''})${why}, ` +
          `so no ${name === 'rows' ? 'row' : 'column'} of one is one of the other.`,
      };
    }
    const differ = are === 'positions' ? xa.filter((x, i) => x !== xb[ib.get(ka[i])!]).map((x) => keyOf(x, are)) : [];
    return { ib, ka, differ, missing: [] as string[] };
  };
  const r = axis(a.rows, b.rows, a.rowsAre, 'rows', !!a.partialRows && !!b.partialRows);
  if ('error' in r) return { ok: false, reason: r.error! };
  const c = axis(a.cols, b.cols, a.colsAre, 'cols');
  if ('error' in c) return { ok: false, reason: c.error! };
  const values = r.ka.map((rk, i) =>
    c.ka.map((ck, j) => {
      const ri = r.ib.get(rk);
      const va = a.values[i]?.[j],
        vb = ri === undefined ? undefined : b.values[ri]?.[c.ib.get(ck)!];
      return typeof va === 'number' && typeof vb === 'number' ? vb - va : null;
    }),
  );
  const differ = [...new Set([...r.differ, ...c.differ])];
  const notes = [
    differ.length
      ? `Position${differ.length > 1 ? 's' : ''} ${differ.join(', ')} hold${differ.length > 1 ? '' : 's'} ` +
        'different tokens in A and B: there the Δ compares different inputs at the same place.'
      : '',
    r.missing.length
      ? `${r.missing.join(', ')} ${r.missing.length > 1 ? 'are' : 'is'} in A's list of ${a.rowsAre} but not in B's: no Δ there.`
      : '',
  ].filter(Boolean);
  const note = notes.length ? notes.join(' ') : null;
  return { ok: true, values, rows: a.rows, cols: a.cols, note };
}
