/**
 * The generation loop shared by `generate`, `steer` and `sweep`: greedy or seeded sampling, with a
 * KV cache (one prompt pass, then one engine run per new token that feeds only that token and the
 * cache), optionally carrying interventions, and optionally several variants at once through the
 * engine's batch dimension (row r is steered by the interventions whose `batch` includes r).
 *
 * Interventions during generation (the contract of this module):
 *  - the prompt pass applies every intervention exactly as given (positions are absolute, BOS = 0);
 *  - each later step applies an intervention to the new token iff its positions are 'all' (or
 *    omitted) or list that token's absolute position; `patch` and a `mean` without a value refer
 *    to prompt activations and apply to the prompt pass only.
 *  - `useCache: false` re-runs the whole sequence each step with the interventions unchanged: the
 *    same semantics, used to prove the cached loop right and to measure its speed-up.
 */
import type {
  Intervention,
  KVCache,
  LoadedModel,
  LogitReduce,
  LogitRow,
  RunOptions,
  RunResult,
} from '../../engine/api';
import { LoupeError, throwIfAborted } from '../../engine/errors';
import { argmax, rng } from './math';
import { checkBatch, checkNewTokens, checkTokenCount } from '../../engine/caps';

export interface SamplingOptions {
  /** 0 (default) = greedy */
  temperature?: number;
  /** keep only the k most likely tokens before sampling (0/undefined = all) */
  topK?: number;
  /** nucleus sampling: keep the smallest set whose probability reaches p (1/undefined = all) */
  topP?: number;
  /** seed of the sampler; each batch row uses its own generator with this same seed */
  seed?: number;
  /** per-row seeds (batch row r samples with seeds[r]), for independent samples in one batch; overrides seed */
  seeds?: number[];
}

export interface GenerateOptions extends SamplingOptions {
  maxNewTokens: number;
  interventions?: Intervention[];
  /** stop a row when it emits the EOS token (default true); the EOS id is kept in `ids` */
  stopAtEos?: boolean;
  signal?: AbortSignal;
  /** called for every generated token of every row */
  onToken?: (t: { step: number; row: number; id: number }) => void;
  /** default true; false re-runs the full sequence every step (reference / benchmark path) */
  useCache?: boolean;
  /** return the prompt pass's last-position logits (BatchGenerateResult.promptLogits); default false */
  promptLogits?: boolean;
  /**
   * with promptLogits: those logits reduced where they are (BatchGenerateResult.promptRows), not
   * read back, where the first token is picked in the graph (greedy, top-k); sampling from the whole
   * row reads the row (promptLogits)
   */
  promptReduce?: LogitReduce;
}

export interface GenerateResult {
  /** generated token ids only (the prompt excluded) */
  ids: number[];
  /** the text these tokens add to the prompt */
  text: string;
  stop_reason: 'eos' | 'max_new_tokens';
}

/** a generated row as documents list it (schema/generation.ts generationBlock) */
export function generationFields(r: GenerateResult) {
  return { generated_token_ids: r.ids, generated_text: r.text, stop_reason: r.stop_reason };
}

export interface BatchGenerateResult {
  rows: GenerateResult[];
  /** with `promptLogits`: logits at the final prompt position of each row, from the prompt pass (with interventions) */
  promptLogits: Float32Array[];
  /** with `promptReduce`, where it applied: those rows reduced (promptLogits is then empty) */
  promptRows?: LogitRow[];
  /** engine runs made (1 prompt pass + steps) */
  runs: number;
}

/** The text generated tokens add to a prompt (decoding the whole sequence keeps word-initial spaces right). */
export function continuationText(model: LoadedModel, prompt: number[], generated: number[]): string {
  if (generated.length === 0) return '';
  const full = model.decode([...prompt, ...generated]);
  const pre = model.decode(prompt);
  return full.startsWith(pre) ? full.slice(pre.length) : model.decode(generated);
}

/** Pick the next token from one row of logits. */
export function pickToken(
  logits: ArrayLike<number>,
  offset: number,
  V: number,
  s: SamplingOptions,
  u: () => number,
): number {
  if (!((s.temperature ?? 0) > 0)) return argmax(logits, offset, V);
  const idx = Array.from({ length: V }, (_, i) => i);
  idx.sort((a, b) => logits[offset + b] - logits[offset + a] || a - b);
  const k = sampledTopK(s, V);
  return sampleSorted(k ? idx.slice(0, k) : idx, (i) => logits[offset + i], s, u);
}

/** the k of top-k sampling where it narrows the vocabulary, else 0 */
function sampledTopK(s: SamplingOptions, V: number): number {
  return (s.temperature ?? 0) > 0 && s.topK && s.topK > 0 && s.topK < V ? s.topK : 0;
}

/**
 * Sample among candidate ids sorted by logit, largest first (ties: lower id first): the whole
 * vocabulary, or its top k. Softmax at the temperature over them, then nucleus (top-p) if asked.
 */
function sampleSorted(idx: number[], logit: (id: number) => number, s: SamplingOptions, u: () => number): number {
  const temperature = s.temperature!;
  const m = logit(idx[0]) / temperature;
  let probs = idx.map((i) => Math.exp(logit(i) / temperature - m));
  let z = probs.reduce((a, b) => a + b, 0);
  if (s.topP !== undefined && s.topP < 1) {
    let c = 0;
    let k = 0;
    while (k < probs.length) {
      c += probs[k] / z;
      k++;
      if (c >= s.topP) break;
    }
    idx = idx.slice(0, k);
    probs = probs.slice(0, k);
    z = probs.reduce((a, b) => a + b, 0);
  }
  let r = u() * z;
  for (let k = 0; k < idx.length; k++) {
    r -= probs[k];
    if (r <= 0) return idx[k];
  }
  return idx[idx.length - 1];
}

/**
 * What a step reads back of its logits, reduced in the graph (RunOptions.pick): greedy decoding
 * the argmax, top-k sampling the k largest logits and their ids; sampling over the whole
 * vocabulary (temperature without top-k, with or without top-p) needs the row itself.
 */
function stepPick(s: SamplingOptions, V: number, logits: boolean): RunOptions['pick'] {
  if (!((s.temperature ?? 0) > 0)) return { argmax: true, logits };
  const k = sampledTopK(s, V);
  return k ? { topK: k, logits } : undefined;
}

/** Row r's next token from a run's result: its argmax or top k where the run picked them, else its logits row. */
function chooseToken(res: RunResult, r: number, V: number, s: SamplingOptions, u: () => number): number {
  if (res.argmax) return res.argmax[r];
  if (res.top) {
    const { k, logits, ids } = res.top;
    const logitOf = new Map(ids.slice(r * k, (r + 1) * k).map((id, j) => [id, logits[r * k + j]]));
    const idx = [...logitOf.keys()].sort((a, b) => logitOf.get(b)! - logitOf.get(a)! || a - b);
    return sampleSorted(idx, (id) => logitOf.get(id)!, s, u);
  }
  return pickToken(res.logits.data, r * V, V, s, u);
}

/** which interventions act on the single new token at absolute position `pos` (see the module note) */
function stepInterventions(ivs: Intervention[], pos: number): Intervention[] {
  const out: Intervention[] = [];
  for (const iv of ivs) {
    if (iv.op === 'patch' || (iv.op === 'mean' && iv.value === undefined)) continue;
    const p = iv.positions;
    if (p === undefined || p === 'all' || p.includes(pos)) out.push({ ...iv, positions: 'all' });
  }
  return out;
}

/**
 * Generate for `rows` variants of the same prompt at once. Rows differ only by the interventions
 * addressed to them through `batch`. Each row samples with its own generator seeded identically
 * (unless `seeds` gives each row its own seed), so two rows with identical logits produce identical tokens.
 */
export async function generateBatch(
  model: LoadedModel,
  ids: number[],
  rows: number,
  opts: GenerateOptions,
): Promise<BatchGenerateResult> {
  const maxNew = opts.maxNewTokens;
  checkNewTokens(maxNew);
  checkBatch(rows);
  checkTokenCount(model, ids.length, maxNew);
  const ivs = opts.interventions ?? [];
  const useCache = opts.useCache ?? true;
  if (!useCache && ivs.some((iv) => iv.op === 'patch')) {
    throw new LoupeError(
      'BAD_INTERVENTION',
      'patch interventions cannot be used with full re-run generation.',
      'Use the KV-cached loop (the default).',
    );
  }
  const stopAtEos = opts.stopAtEos ?? true;
  const eos = model.eosTokenId;
  const V = model.info.d_vocab;
  const gens = Array.from({ length: rows }, (_, r) => rng(opts.seeds?.[r] ?? opts.seed ?? 0));
  const out: number[][] = Array.from({ length: rows }, () => []);
  const done: boolean[] = new Array(rows).fill(false);
  const stop: GenerateResult['stop_reason'][] = new Array(rows).fill('max_new_tokens');
  let runs = 0;

  throwIfAborted(opts.signal);
  const T = ids.length;
  // generation reads only the last position's logits: unembed just that one
  const firstPick = stepPick(opts, V, !!opts.promptLogits);
  const reduce = opts.promptLogits && firstPick ? opts.promptReduce : undefined;
  const first = await model.run(ids, {
    interventions: ivs,
    batch: rows > 1 ? rows : undefined,
    // the cache stays on the device where the backend keeps values there (WebGPU in Node)
    returnCache: useCache && maxNew > 1 ? 'device' : false,
    logitPositions: [T - 1],
    pick: firstPick,
    ...(reduce ? { reduceLogits: reduce } : {}),
    signal: opts.signal,
  });
  runs++;
  const promptLogits: Float32Array[] = [];
  if (opts.promptLogits && !reduce)
    for (let r = 0; r < rows; r++) promptLogits.push(first.logits.data.slice(r * V, (r + 1) * V));
  // each step reads back its next token (greedy), its top k (top-k sampling) or its logits row (stepPick)
  const pick = stepPick(opts, V, false);

  let past: KVCache | undefined = first.present;
  try {
    let res: RunResult = first;
    for (let step = 0; step < maxNew; step++) {
      const next: number[] = [];
      for (let r = 0; r < rows; r++) {
        if (done[r]) {
          next.push(out[r][out[r].length - 1]);
          continue;
        }
        const id = chooseToken(res, r, V, opts, gens[r]);
        out[r].push(id);
        next.push(id);
        opts.onToken?.({ step, row: r, id });
        if (stopAtEos && eos !== undefined && id === eos) {
          done[r] = true;
          stop[r] = 'eos';
        }
      }
      if (step === maxNew - 1 || done.every(Boolean)) break;
      throwIfAborted(opts.signal);
      const pos = T + step; // absolute position of the token fed now
      if (useCache) {
        res = await model.run(rows > 1 ? next.map((t) => [t]) : [next[0]], {
          interventions: stepInterventions(ivs, pos),
          past,
          returnCache: step < maxNew - 2 ? 'device' : false,
          pick,
          signal: opts.signal,
        });
        past?.release?.();
        past = res.present;
      } else {
        const seqs = out.map((o) => [...ids, ...o]);
        // rows that stopped early are padded with their last token so every row has the same length
        const len = T + step + 1;
        for (const s of seqs) while (s.length < len) s.push(s[s.length - 1]);
        res = await model.run(rows > 1 ? seqs : seqs[0], {
          interventions: ivs,
          logitPositions: [len - 1],
          pick,
          signal: opts.signal,
        });
      }
      runs++;
    }
  } finally {
    past?.release?.();
  }
  return {
    rows: out.map((o, r) => ({ ids: o, text: continuationText(model, ids, o), stop_reason: stop[r] })),
    promptLogits,
    ...(reduce ? { promptRows: first.logitRows } : {}),
    runs,
  };
}

/** Generate one continuation. `ids` are the prompt's token ids (BOS included when wanted). */
export async function generateTokens(
  model: LoadedModel,
  ids: number[],
  opts: GenerateOptions,
): Promise<GenerateResult> {
  if (opts.maxNewTokens === 0) {
    checkTokenCount(model, ids.length);
    return { ids: [], text: '', stop_reason: 'max_new_tokens' };
  }
  const r = await generateBatch(model, ids, 1, opts);
  return r.rows[0];
}
