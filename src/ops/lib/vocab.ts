/**
 * Which tokens an operation may name on its own initiative — default steering targets and controls,
 * a dashboard's promoted and suppressed tokens: tokens the model can produce and the page can show.
 * Three kinds are left out, each by a rule a document states (`VocabFilter.rule`):
 *  - special: BOS, EOS and tokens written as markup ("<unk>", "<|endoftext|>"), which no text produces;
 *  - undecodable: tokens that do not decode to text on their own (U+FFFD, or nothing but control
 *    characters; newline and tab count as text), such as a lone UTF-8 continuation byte;
 *  - untrained: tokens whose unembedding row sits near the common row of the special and
 *    undecodable tokens. A token never seen in training keeps the row that the softmax's push on
 *    every absent token gives it, the same for all of them (on stories260K 250 byte-fallback tokens
 *    share one row and tie at every direct logit effect), and a token seen a handful of times has
 *    barely left it. Detected only when those tokens form such a cluster: their median distance to
 *    its centre (the coordinate-wise median of their rows) below CLUSTER × the median row norm;
 *    then every token within that radius counts as untrained.
 *    Distances and norms come from PROJECTIONS random unit directions through one pass over W_U
 *    (unembedDots): ‖u‖² ≈ (d_model / k) Σ_j (u · x_j)², no copy of W_U.
 * Computed once per loaded model (a pass over the vocabulary's strings and one over W_U).
 */
import type { LoadedModel } from '../../engine/api';
import { gaussian, rng } from './math';

/**
 * the radius of the untrained cluster, in units of the median unembedding row norm: on stories260K
 * the byte-fallback rows lie within 0.09 of their centre, rarely seen pieces ("[", "<", NBSP) within
 * 0.13–0.48, and every common piece beyond 0.64
 */
export const CLUSTER = 0.5;
/** random directions of the distance estimate */
export const PROJECTIONS = 64;
/** rows read to find the cluster's centre (a sample of the suspects when there are more) */
const MAX_CENTRE_ROWS = 512;

export type TokenKind = 'ok' | 'special' | 'undecodable' | 'untrained';

export interface VocabFilter {
  /** per token id */
  kind: TokenKind[];
  usable: (id: number) => boolean;
  counts: Record<Exclude<TokenKind, 'ok'>, number>;
  /** how tokens were left out, in words, with the counts */
  rule: string;
}

const cache = new WeakMap<LoadedModel, Promise<VocabFilter>>();

/** text that shows nothing on its own: U+FFFD, empty, or only control characters other than newline and tab */
export function undecodable(text: string): boolean {
  if (text.includes('\uFFFD')) return true;
  const visible = text.replace(/[\u0000-\u0008\u000B-\u001F\u007F-\u009F\u200B-\u200D\uFEFF]/g, '');
  return visible.length === 0;
}

/** markup written as a token: <unk>, <s>, <|endoftext|>, <pad> (byte-fallback pieces decode to their byte, not to "<0x41>") */
export function looksSpecial(text: string): boolean {
  return /^<\|[^<>]*\|>$/.test(text) || /^<\/?[A-Za-z_][\w.:-]*>$/.test(text) || /^\[[A-Z]{2,}[A-Z_]*\]$/.test(text);
}

export function vocabFilter(model: LoadedModel, signal?: AbortSignal): Promise<VocabFilter> {
  let p = cache.get(model);
  if (!p) {
    p = build(model, signal);
    cache.set(model, p);
    p.catch(() => cache.delete(model));
  }
  return p;
}

async function build(model: LoadedModel, signal?: AbortSignal): Promise<VocabFilter> {
  const V = model.info.d_vocab;
  const D = model.info.d_model;
  const strings = model.tokenStrings(Array.from({ length: V }, (_, i) => i));
  const kind: TokenKind[] = strings.map((s, id) =>
    id === model.bosTokenId || id === model.eosTokenId || looksSpecial(s.trim())
      ? 'special'
      : undecodable(s)
        ? 'undecodable'
        : 'ok',
  );
  const suspects = kind.flatMap((k, id) => (k === 'ok' ? [] : [id]));
  if (suspects.length >= 3) {
    // the centre: the coordinate-wise median of (a sample of) the suspects' rows
    const step = Math.max(1, Math.ceil(suspects.length / MAX_CENTRE_ROWS));
    const sample = suspects.filter((_, i) => i % step === 0);
    const { unembedRows } = await model.weightProducts({ unembedIds: sample }, signal);
    const centre = new Float64Array(D);
    const col = new Float64Array(sample.length);
    for (let j = 0; j < D; j++) {
      for (let i = 0; i < sample.length; i++) col[i] = unembedRows.data[i * D + j];
      col.sort();
      const m = sample.length >> 1;
      centre[j] = sample.length % 2 ? col[m] : (col[m - 1] + col[m]) / 2;
    }
    // k random unit directions, and the centre's projections on them
    const u = rng(7);
    const k = PROJECTIONS;
    const x = new Float64Array(k * D);
    for (let j = 0; j < k; j++) {
      let n = 0;
      for (let d = 0; d < D; d++) n += (x[j * D + d] = gaussian(u)) ** 2;
      n = Math.sqrt(n);
      for (let d = 0; d < D; d++) x[j * D + d] /= n;
    }
    const cx = new Float64Array(k);
    for (let j = 0; j < k; j++) for (let d = 0; d < D; d++) cx[j] += centre[d] * x[j * D + d];
    const dots = (await model.weightProducts({ unembedDots: { dims: [k, D], data: x } }, signal)).unembedDots.data;
    const norm = new Float64Array(V);
    const dist = new Float64Array(V);
    for (let v = 0; v < V; v++) {
      let a = 0,
        b = 0;
      for (let j = 0; j < k; j++) {
        const p = dots[j * V + v];
        a += p * p;
        b += (p - cx[j]) ** 2;
      }
      norm[v] = Math.sqrt((D / k) * a);
      dist[v] = Math.sqrt((D / k) * b);
    }
    const median = (xs: Float64Array | number[]) => {
      const s = Float64Array.from(xs).sort();
      return s.length ? s[s.length >> 1] : 0;
    };
    const radius = CLUSTER * median(norm);
    if (median(suspects.map((id) => dist[id])) < radius)
      for (let v = 0; v < V; v++) if (kind[v] === 'ok' && dist[v] < radius) kind[v] = 'untrained';
  }
  const counts = { special: 0, undecodable: 0, untrained: 0 };
  for (const t of kind) if (t !== 'ok') counts[t]++;
  const parts = [
    counts.special ? `${counts.special} special (BOS, EOS, markup such as <unk>)` : '',
    counts.undecodable
      ? `${counts.undecodable} that do not decode to text on their own (U+FFFD or control characters)`
      : '',
    counts.untrained
      ? `${counts.untrained} untrained (unembedding row within ${CLUSTER} × the median row norm of the ` +
        `row the special and undecodable tokens share, estimated from ${PROJECTIONS} random projections)`
      : '',
  ].filter(Boolean);
  return {
    kind,
    usable: (id) => kind[id] === 'ok',
    counts,
    rule: parts.length ? `left out ${parts.join('; ')}` : 'no token left out (none special, undecodable or untrained)',
  };
}
