/**
 * Human-readable rendering of documents for the terminal (the default without --json).
 * Operations without a dedicated view get a generic one: scalars, then short tables of arrays.
 */

type Doc = Record<string, any>;

export function table(headers: string[], rows: (string | number)[][]): string {
  const cells = [headers, ...rows.map((r) => r.map(cell))];
  const widths = headers.map((_, c) => Math.max(...cells.map((r) => (r[c] ?? '').length)));
  const line = (r: string[]) =>
    r
      .map((x, c) => (typeof rows[0]?.[c] === 'number' && r !== cells[0] ? x.padStart(widths[c]) : x.padEnd(widths[c])))
      .join('  ')
      .trimEnd();
  return [line(cells[0]), widths.map((w) => '-'.repeat(w)).join('  '), ...cells.slice(1).map(line)].join('\n');
}

function cell(v: unknown): string {
  if (typeof v === 'number') return fmt(v);
  if (typeof v === 'string') return v;
  return JSON.stringify(v);
}

export function fmt(x: number): string {
  if (Number.isInteger(x)) return String(x);
  const a = Math.abs(x);
  if (a !== 0 && (a < 1e-3 || a >= 1e6)) return x.toExponential(3);
  return x.toFixed(4);
}

const q = (s: string) => JSON.stringify(s);

/** text that does not decode on its own (a lone byte of a UTF-8 sequence, a control character) */
const UNREADABLE = /[\uFFFD\u0000-\u001F\u007F]/;

/** a token for the terminal: its text, or `#id` where the text is a byte fragment or a control character */
export function tokenText(text: string, id?: number): string {
  return UNREADABLE.test(text) && id !== undefined ? `#${id}` : text;
}

function header(d: Doc): string {
  const m = d.model ?? {};
  const toks = Array.isArray(d.tokens) ? d.tokens.map((t: any) => tokenText(t.text, t.id)).join(' | ') : '';
  // a prompt made of byte tokens (an induction set's random ids) has no readable text: its tokens say it
  const prompt = UNREADABLE.test(d.prompt ?? '') ? '(not text on its own)' : q(d.prompt ?? '');
  return [
    `${d.operation} · ${m.id} (${m.architecture}, ${m.n_layers} layers × ${m.n_heads} heads, d_model ${m.d_model}, ${m.backend})`,
    // chat format: the prompt shown (and tokenized) is the template's rendering of what was typed
    ...(d.prompt_format?.chat
      ? [`chat format: ${q(d.prompt_format.user_prompt)} rendered by the model's chat_template`]
      : []),
    `${d.dataset ? "first pair's clean prompt" : 'prompt'} ${prompt} → ${d.tokens?.length ?? 0} tokens: ${toks}`,
  ].join('\n');
}

function trace(d: Doc): string {
  const out = [header(d), ''];
  out.push(
    `predicted at position ${d.position}: ${q(d.predicted_token)} (#${d.predicted_token_id})   convention: ${d.convention}`,
  );
  out.push(
    '',
    'top predictions',
    table(
      ['token', 'id', 'logit', 'prob'],
      d.top_predictions.map((p: any) => [q(p.token), p.token_id, p.logit, p.prob]),
    ),
  );
  const t = d.target;
  const what =
    t.kind === 'logit_difference'
      ? `logit(${q(t.token)}) − logit(${q(t.counterfactual_token)})`
      : t.kind === 'centered_logit'
        ? `centred logit of ${q(t.token)}`
        : `logit of ${q(t.token)}`;
  out.push('', `direct logit attribution to the ${what}`);
  out.push(
    table(
      ['head', 'attribution'],
      d.top_heads.map((h: any) => [`L${h.layer}H${h.head}`, h.logit_attribution]),
    ),
  );
  out.push(
    '',
    'neurons by attribution',
    table(
      ['neuron', 'activation', 'attribution'],
      d.top_neurons.map((n: any) => [`L${n.layer}N${n.neuron}`, n.activation, n.logit_attribution]),
    ),
  );
  const terms = d.decomposition.terms.filter((x: any) => !/^L\d+H\d+$/.test(x.name));
  out.push(
    '',
    'decomposition (heads listed above; all terms in the JSON)',
    table(
      ['term', 'value'],
      terms.map((x: any) => [x.name, x.value]),
    ),
  );
  out.push(
    `sum of all ${d.decomposition.terms.length} terms = ${fmt(d.decomposition.sum)}   ` +
      `target = ${fmt(d.decomposition.target)}   difference = ${fmt(d.checks.sum_minus_target)}`,
  );
  return out.join('\n');
}

function generate(d: Doc, o: RenderOptions): string {
  const text = o.color ? `${d.prompt}\x1b[1m${d.generated_text}\x1b[0m` : `${d.prompt}⟦${d.generated_text}⟧`;
  return [
    header(d),
    '',
    `${d.sampling.method}${d.sampling.method === 'sample' ? ` (temperature ${d.sampling.temperature}, seed ${d.sampling.seed})` : ''}, ` +
      `stopped: ${d.stop_reason}`,
    '',
    text,
    '',
    `ids: ${d.generated_token_ids.join(' ')}`,
  ].join('\n');
}

function activations(d: Doc): string {
  const rows: (string | number)[][] = [];
  for (const l of d.layers)
    for (const s of l.sites)
      rows.push([l.layer, s.site, `[${s.shape.join(',')}]`, s.mean, s.std, s.min, s.max, s.argmax.position]);
  return [header(d), '', table(['layer', 'site', 'shape', 'mean', 'std', 'min', 'max', 'argmax pos'], rows)].join('\n');
}

function attention(d: Doc): string {
  const toks: string[] = d.tokens.map((t: any) => t.text);
  const out = [header(d)];
  for (const h of d.heads) {
    out.push('', `L${h.layer}H${h.head}: destination → top source (weight), entropy`);
    out.push(
      table(
        ['pos', 'token', 'top source', 'weight', 'entropy'],
        h.top_source.map((s: any, i: number) => [
          i,
          q(toks[i]),
          `${s.position} ${q(toks[s.position])}`,
          s.weight,
          h.entropy[i],
        ]),
      ),
    );
  }
  return out.join('\n');
}

function logitLens(d: Doc): string {
  const out = [header(d), ''];
  const last = d.positions[d.positions.length - 1];
  const fin = d.final_predictions.find((f: any) => f.position === last);
  out.push(`position ${last}: final prediction ${q(fin.token)} (prob ${fmt(fin.prob)})`);
  out.push(
    table(
      ['layer', 'hook', 'top tokens', 'p(final)', 'rank'],
      d.layers.map((l: any) => {
        const p = l.positions.find((x: any) => x.position === last);
        return [
          l.layer,
          l.hook,
          p.top.map((t: any) => `${q(t.token)} ${fmt(t.prob)}`).join(', '),
          p.final_token_prob,
          p.final_token_rank,
        ];
      }),
    ),
  );
  return out.join('\n');
}

/** the lines of `rows` past the first `n`, said rather than shown */
const more = (total: number, n: number, what: string) => (total > n ? [`… ${total - n} more ${what} in --json`] : []);

function saeFeatures(d: Doc): string {
  const out = [header(d), '', `SAE ${d.sae.id} at ${d.sae.hook} (d_sae ${d.sae.d_sae}, ${d.sae.architecture})`];
  const r = d.reconstruction;
  out.push(
    `reconstruction over ${r.positions} positions: mse ${fmt(r.mse)}, fvu ${r.fvu === null ? '—' : fmt(r.fvu)}` +
      (r.without_bos ? `; without BOS: fvu ${r.without_bos.fvu === null ? '—' : fmt(r.without_bos.fvu)}` : ''),
  );
  for (const p of d.positions) {
    out.push('', `position ${p.position} ${q(tokenText(p.token, p.token_id))}: ${p.l0} active features`);
    if (!p.features.length) continue;
    out.push(
      table(
        ['feature', 'activation', 'logit attribution', 'description'],
        p.features.map((f: any) => [f.feature, f.activation, f.logit_attribution ?? '', f.description ?? '']),
      ),
    );
  }
  const la = d.logit_attribution;
  out.push(
    '',
    la.available
      ? `logit attribution to ${q(d.prediction.token)} at position ${d.prediction.position}: features ` +
          `${fmt(la.features_sum)} + b_dec ${fmt(la.b_dec_term)} + error ${fmt(la.error_term)} = ${fmt(la.hook_direct_term)}`
      : `no logit attribution: ${la.reason}`,
  );
  return out.join('\n');
}

function saeSteer(d: Doc): string {
  const f = d.feature;
  const out = [
    header(d),
    '',
    `feature ${f.index}${f.description ? ` (${f.description})` : ''} of ${d.sae.id}: ${d.edit} at ${d.hook}, ` +
      `positions ${d.positions}`,
  ];
  const metrics = Object.keys(d.metric_definitions).filter((k) => k !== 'position');
  if (d.mode === 'sweep') {
    const sw = d.sweep;
    out.push(
      '',
      `sweep over ${d.edit === 'add' ? 'α' : 'the clamp value'} (${d.metric_definitions.position})`,
      table(
        ['alpha', ...metrics, 'text'],
        sw.alphas.map((a: number, i: number) => [
          a,
          ...metrics.map((m) => sw.curves[m]?.[i] ?? ''),
          q(sw.generations.find((g: any) => g.alpha === a)?.generated_text ?? ''),
        ]),
      ),
      '',
      `trend: ${Object.entries(sw.monotone)
        .filter(([k]) => k !== 'rule')
        .map(([k, v]) => `${k} ${v}`)
        .join(', ')}`,
      `base text: ${q(d.base.generated_text)}`,
    );
  } else {
    out.push(
      '',
      table(
        ['metric', 'value'],
        metrics.map((m) => [m, d[m] ?? '—']),
      ),
      '',
      `base:    ${q(d.base.generated_text)}`,
      `steered: ${q(d.steered.generated_text)}`,
    );
  }
  for (const [name, rows] of [
    ['targets', d.targets],
    ['controls', d.controls],
  ] as const) {
    const cols = d.mode === 'sweep' ? ['token', 'id', 'base logprob'] : ['token', 'id', 'base logprob', 'steered', 'Δ'];
    out.push(
      '',
      name,
      table(
        cols,
        rows.map((t: any) =>
          [q(tokenText(t.token, t.token_id)), t.token_id, t.base_logprob, t.steered_logprob, t.delta].slice(
            0,
            cols.length,
          ),
        ),
      ),
    );
  }
  return out.join('\n');
}

function edgeAttribution(d: Doc): string {
  const out = [header(d), ''];
  const ds = d.dataset;
  out.push(
    `${ds.n_examples} pairs (${ds.source}${ds.generator ? ` ${ds.generator.task}, seed ${ds.generator.seed}` : ''})` +
      `, method ${d.method}, metric ${d.metric}: M(clean) ${fmt(d.m_clean)}, M(corrupted) ${fmt(d.m_corrupted)}`,
  );
  const N = 20;
  const ranked = [...d.edges].sort((a: any, b: any) => Math.abs(b.score) - Math.abs(a.score));
  out.push(
    '',
    `edges by |score| (top ${Math.min(N, ranked.length)} of ${d.n_edges}; negative = patching it lowers M)`,
    d.statistics
      ? table(
          ['rank', 'edge', 'score', '95% CI', 'p', 'p Holm', 'p BH'],
          ranked
            .slice(0, N)
            .map((e: any, i: number) => [
              i + 1,
              e.name,
              e.score,
              `[${fmt(e.ci_low)}, ${fmt(e.ci_high)}]`,
              e.p_value,
              e.p_holm,
              e.p_bh,
            ]),
        )
      : table(
          ['rank', 'edge', 'score'],
          ranked.slice(0, N).map((e: any, i: number) => [i + 1, e.name, e.score]),
        ),
    ...more(ranked.length, N, 'edges'),
    ...(d.statistics ? ['', d.statistics.method, d.statistics.correction] : []),
  );
  for (const w of d.warnings ?? []) out.push('', `warning: ${w}`);
  const c = d.completeness;
  if (c)
    out.push('', `completeness: Σ input scores ${fmt(c.input_scores)} vs ΔM ${fmt(c.target)} (error ${fmt(c.error)})`);
  if (d.evaluation) {
    const e = d.evaluation;
    out.push('', `faithfulness: CPR ${fmt(e.signed.cpr)} (signed ranking), CMD ${fmt(e.abs.cmd)} (|score| ranking)`);
  }
  for (const ce of d.circuit_evaluation ?? [])
    out.push(
      `circuit (${ce.source}): ${ce.n_edges} edges, ${ce.n_after_prune} after pruning, ` +
        `M ${fmt(ce.metric)}, faithfulness ${fmt(ce.faithfulness)}`,
    );
  return out.join('\n');
}

/** any document: scalar fields, then arrays of objects as tables (first 20 rows) */
export function generic(d: Doc): string {
  const out = [d.model ? header(d) : ''];
  const skip = new Set(['schema_version', 'operation', 'model', 'prompt', 'tokens', 'prompt_format']);
  for (const [k, v] of Object.entries(d)) {
    if (skip.has(k)) continue;
    if (v === null || typeof v !== 'object') out.push(`${k}: ${cell(v)}`);
  }
  for (const [k, v] of Object.entries(d)) {
    if (skip.has(k) || v === null || typeof v !== 'object') continue;
    if (Array.isArray(v) && v.length && v.every((x) => x && typeof x === 'object' && !Array.isArray(x))) {
      const cols = Object.keys(v[0]).filter((c) =>
        v.slice(0, 20).every((x: any) => x[c] === null || typeof x[c] !== 'object'),
      );
      if (cols.length) {
        out.push(
          '',
          `${k}${v.length > 20 ? ` (first 20 of ${v.length})` : ''}`,
          table(
            cols,
            v.slice(0, 20).map((x: any) => cols.map((c) => x[c] ?? '')),
          ),
        );
        continue;
      }
    }
    const s = JSON.stringify(v);
    out.push('', `${k}: ${s.length > 400 ? s.slice(0, 400) + ' …' : s}`);
  }
  return out.join('\n');
}

export interface RenderOptions {
  /** ANSI emphasis (only on a terminal, and not with NO_COLOR) */
  color?: boolean;
}

const views: Record<string, (d: Doc, o: RenderOptions) => string> = {
  trace,
  generate,
  activations,
  attention,
  logit_lens: logitLens,
  sae_features: saeFeatures,
  sae_steer: saeSteer,
  edge_attribution: edgeAttribution,
};

export function render(d: Doc, o: RenderOptions = {}): string {
  const v = views[d.operation];
  try {
    return v ? v(d, o) : generic(d);
  } catch {
    return generic(d); // a view must never hide a document
  }
}
