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

function header(d: Doc): string {
  const m = d.model ?? {};
  const toks = Array.isArray(d.tokens) ? d.tokens.map((t: any) => t.text).join(' | ') : '';
  return [
    `${d.operation} · ${m.id} (${m.architecture}, ${m.n_layers} layers × ${m.n_heads} heads, d_model ${m.d_model}, ${m.backend})`,
    // chat format: the prompt shown (and tokenized) is the template's rendering of what was typed
    ...(d.prompt_format?.chat
      ? [`chat format: ${q(d.prompt_format.user_prompt)} rendered by the model's chat_template`]
      : []),
    `prompt ${q(d.prompt ?? '')} → ${d.tokens?.length ?? 0} tokens: ${toks}`,
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
};

export function render(d: Doc, o: RenderOptions = {}): string {
  const v = views[d.operation];
  try {
    return v ? v(d, o) : generic(d);
  } catch {
    return generic(d); // a view must never hide a document
  }
}
