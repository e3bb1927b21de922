/**
 * The names researchers give models, mapped to Hub ids: TransformerLens's official names and
 * aliases for the families Loupe runs, in one table the CLI, MCP and the page share.
 *
 *   lookupModelName('gpt2-small')     -> { entry: { id: 'gpt2', … }, name: 'gpt2-small' }
 *   lookupModelName('Gemma-3-270M')   -> the google/gemma-3-270m entry (case-insensitive, as TL's)
 *   nearestModelNames('gemma-3-207m') -> ['gemma-3-270m', 'gemma-3-27b-pt', …]
 *   judgeEntry(entry, { hostBytes })  -> { verdict: 'fits WASM' | 'needs q8' | 'WebGPU only' | 'too large here', … }
 *
 * `id` and `tl` are copied from TransformerLens's transformer_lens/supported_models.py
 * (OFFICIAL_MODEL_NAMES and MODEL_ALIASES, read at commit 4cd36aa, July 2026); its lookup
 * (loading_from_pretrained.py make_model_alias_map) lowercases both aliases and official names, and
 * so does this one. `loupe` holds Loupe's own short names where TL has none (e.g. llama-3.2-1b,
 * phi-3-mini, or gemma-3-1b for TL's gemma-3-1b-pt), and a few entries TL lacks carry only those.
 *
 * `params` and `dtype` are nominal (the model card's parameter count, the dtype its safetensors
 * store): `loupe models` and the page's picker judge an entry from them before anything is fetched;
 * a load judges the real safetensors headers again before any weight byte (source/preflight.ts).
 */
import { estimateMemory, type BudgetLimits, type MemoryBackend, type WeightPrecision } from './budget';
import type { SafetensorsDtype } from './safetensors-types';

export interface CatalogEntry {
  /** the Hub id (TransformerLens's official name) */
  id: string;
  /** config.json's model_type: the adapter that runs it */
  family: string;
  /** TransformerLens's aliases, in its order */
  tl: string[];
  /** Loupe's own names for it, where TransformerLens has none that short */
  loupe?: string[];
  /** nominal parameter count (the model card's; the whole checkpoint for Gemma 3's multimodal ones) */
  params: number;
  /** the dtype its safetensors store (GPT-OSS: the dtype its MXFP4 experts are dequantised to at load) */
  dtype: Extract<SafetensorsDtype, 'F32' | 'F16' | 'BF16'>;
  /** bytes its safetensors take where that is not params × dtype (GPT-OSS's MXFP4 experts: about 4.25 bits each) */
  storedBytes?: number;
}

const M = 1e6,
  B = 1e9;

/** Pythia's sizes (EleutherAI/pythia README's total parameters) and the names EleutherAI gave them before */
const PYTHIA: [string, number, string | null][] = [
  ['14m', 14_067_712, null],
  ['31m', 30_494_720, null],
  ['70m', 70_426_624, '19m'],
  ['160m', 162_322_944, '125m'],
  ['410m', 405_334_016, '350m'],
  ['1b', 1_011_781_632, '800m'],
  ['1.4b', 1_414_647_808, '1.3b'],
  ['2.8b', 2_775_208_960, '2.7b'],
  ['6.9b', 6_857_302_016, '6.7b'],
  ['12b', 11_846_072_320, '13b'],
];

function pythia(): CatalogEntry[] {
  const out: CatalogEntry[] = [];
  for (const [size, params, old] of PYTHIA) {
    for (const dedup of ['', '-deduped']) {
      if (dedup && !old) continue; // 14m and 31m have no deduped run
      const tl = [`pythia-${size}${dedup}`];
      if (old) {
        if (!dedup) tl.push(...(size === '70m' ? ['pythia'] : []), `EleutherAI/pythia-${old}`, `pythia-${old}`);
        else tl.push(`EleutherAI/pythia-${old}${dedup}`, `pythia-${old}${dedup}`);
      }
      out.push({ id: `EleutherAI/pythia-${size}${dedup}`, family: 'gpt_neox', tl, params, dtype: 'F16' });
    }
  }
  return out;
}

/** the entries of one family whose safetensors store one dtype: [Hub id, TL's aliases, params, Loupe's names] */
function family(
  family: string,
  dtype: CatalogEntry['dtype'],
  rows: [id: string, tl: string[], params: number, loupe?: string[]][],
): CatalogEntry[] {
  return rows.map(([id, tl, params, loupe]) => ({ id, family, tl, ...(loupe ? { loupe } : {}), params, dtype }));
}

export const CATALOG: readonly CatalogEntry[] = [
  ...family('gpt2', 'F32', [
    ['gpt2', ['gpt2-small'], 124 * M],
    ['gpt2-medium', [], 355 * M],
    ['gpt2-large', [], 774 * M],
    ['gpt2-xl', [], 1.56 * B],
    ['distilgpt2', ['distillgpt2', 'distill-gpt2', 'distil-gpt2', 'gpt2-xs'], 82 * M],
  ]),
  ...pythia(),
  ...family('gpt_neox', 'F16', [['EleutherAI/gpt-neox-20b', ['gpt-neox-20b', 'gpt-neox', 'neox'], 20.6 * B]]),
  ...family('llama', 'F16', [
    ['meta-llama/Llama-2-7b-hf', ['Llama-2-7b'], 6.74 * B],
    ['meta-llama/Llama-2-7b-chat-hf', ['Llama-2-7b-chat'], 6.74 * B],
  ]),
  ...family('llama', 'BF16', [
    ['meta-llama/Meta-Llama-3-8B', [], 8.03 * B],
    ['meta-llama/Llama-3.1-8B', [], 8.03 * B, ['llama-3.1-8b']],
    ['meta-llama/Llama-3.2-1B', [], 1.24 * B, ['llama-3.2-1b']],
    ['meta-llama/Llama-3.2-1B-Instruct', [], 1.24 * B, ['llama-3.2-1b-instruct']],
    ['meta-llama/Llama-3.2-3B', [], 3.21 * B, ['llama-3.2-3b']],
    ['HuggingFaceTB/SmolLM2-135M', [], 135 * M, ['smollm2-135m']],
    ['HuggingFaceTB/SmolLM2-360M', [], 362 * M, ['smollm2-360m']],
  ]),
  ...family('mistral', 'BF16', [
    ['mistralai/Mistral-7B-v0.1', ['mistral-7b'], 7.24 * B],
    ['mistralai/Mistral-7B-Instruct-v0.1', ['mistral-7b-instruct'], 7.24 * B],
  ]),
  ...family('qwen2', 'BF16', [
    ['Qwen/Qwen1.5-0.5B', ['qwen1.5-0.5b'], 620 * M],
    ['Qwen/Qwen2-0.5B', ['qwen2-0.5b'], 494 * M],
    ['Qwen/Qwen2-1.5B', ['qwen2-1.5b'], 1.54 * B],
    ['Qwen/Qwen2.5-0.5B', ['qwen2.5-0.5b'], 494 * M],
    ['Qwen/Qwen2.5-0.5B-Instruct', ['qwen2.5-0.5b-instruct'], 494 * M],
    ['Qwen/Qwen2.5-1.5B', ['qwen2.5-1.5b'], 1.54 * B],
    ['Qwen/Qwen2.5-3B', ['qwen2.5-3b'], 3.09 * B],
    ['Qwen/Qwen2.5-7B', ['qwen2.5-7b'], 7.62 * B],
  ]),
  ...family('qwen3', 'BF16', [
    ['Qwen/Qwen3-0.6B', ['qwen3-0.6b'], 0.6 * B],
    ['Qwen/Qwen3-0.6B-Base', ['qwen3-0.6b-base'], 0.6 * B],
    ['Qwen/Qwen3-1.7B', ['qwen3-1.7b'], 1.7 * B],
    ['Qwen/Qwen3-4B', ['qwen3-4b'], 4.0 * B],
    ['Qwen/Qwen3-8B', ['qwen3-8b'], 8.2 * B],
  ]),
  ...family('gemma', 'F32', [
    ['google/gemma-2b', ['gemma-2b'], 2.51 * B],
    ['google/gemma-2b-it', ['gemma-2b-it'], 2.51 * B],
    ['google/gemma-7b', ['gemma-7b'], 8.54 * B],
  ]),
  ...family('gemma2', 'F32', [
    ['google/gemma-2-2b', ['gemma-2-2b'], 2.61 * B],
    ['google/gemma-2-2b-it', ['gemma-2-2b-it'], 2.61 * B],
    ['google/gemma-2-9b', ['gemma-2-9b'], 9.24 * B],
    ['google/gemma-2-9b-it', ['gemma-2-9b-it'], 9.24 * B],
    ['google/gemma-2-27b', ['gemma-2-27b'], 27.2 * B],
  ]),
  ...family('gemma3_text', 'BF16', [
    ['google/gemma-3-270m', ['gemma-3-270m'], 268 * M],
    ['google/gemma-3-270m-it', ['gemma-3-270m-it'], 268 * M],
    ['google/gemma-3-1b-pt', ['gemma-3-1b-pt'], 1.0 * B, ['gemma-3-1b']],
    ['google/gemma-3-1b-it', ['gemma-3-1b-it'], 1.0 * B],
  ]),
  ...family('gemma3', 'BF16', [
    ['google/gemma-3-4b-pt', ['gemma-3-4b-pt'], 4.3 * B, ['gemma-3-4b']],
    ['google/gemma-3-4b-it', ['gemma-3-4b-it'], 4.3 * B],
    ['google/gemma-3-12b-pt', ['gemma-3-12b-pt'], 12.2 * B, ['gemma-3-12b']],
    ['google/gemma-3-12b-it', ['gemma-3-12b-it'], 12.2 * B],
    ['google/gemma-3-27b-pt', ['gemma-3-27b-pt'], 27.4 * B, ['gemma-3-27b']],
    ['google/gemma-3-27b-it', ['gemma-3-27b-it'], 27.4 * B],
  ]),
  ...family('phi3', 'BF16', [
    ['microsoft/Phi-3-mini-4k-instruct', ['phi-3'], 3.82 * B, ['phi-3-mini']],
    ['microsoft/Phi-3.5-mini-instruct', [], 3.82 * B, ['phi-3.5-mini']],
    ['microsoft/Phi-4-mini-instruct', [], 3.84 * B, ['phi-4-mini']],
    ['microsoft/phi-4', ['phi-4'], 14.7 * B],
  ]),
  // mixture of experts (arch/moe.ts): every expert's weights count, and every expert runs on every token
  ...family('mixtral', 'BF16', [
    ['mistralai/Mixtral-8x7B-v0.1', ['mixtral', 'mixtral-8x7b'], 46.7 * B],
    ['mistralai/Mixtral-8x7B-Instruct-v0.1', ['mixtral-instruct', 'mixtral-8x7b-instruct'], 46.7 * B],
  ]),
  // TL at 4cd36aa: OLMoE's alias is `olmoe`; no Qwen2-MoE or Qwen3-MoE checkpoint has an official name or
  // alias (its bridge's registry lists Qwen3MoeForCausalLM checkpoints by Hub id only), so those names are Loupe's
  ...family('qwen2_moe', 'BF16', [['Qwen/Qwen1.5-MoE-A2.7B', [], 14.3 * B, ['qwen1.5-moe-a2.7b']]]),
  ...family('qwen3_moe', 'BF16', [
    ['Qwen/Qwen3-30B-A3B', [], 30.5 * B, ['qwen3-30b-a3b']],
    ['Qwen/Qwen3-30B-A3B-Base', [], 30.5 * B, ['qwen3-30b-a3b-base']],
  ]),
  ...family('olmoe', 'BF16', [['allenai/OLMoE-1B-7B-0924', ['olmoe'], 6.92 * B, ['olmoe-1b-7b']]]),
  // GPT-OSS (arch/gpt_oss.ts): experts stored as MXFP4 and held as BF16 once dequantised at load, so a
  // load holds about three times what it downloads (model cards' counts; repositories' file sizes).
  // TransformerLens's supported_models.py (read at 0c6bfe6) has no GPT-OSS: the short names are Loupe's
  { ...family('gpt_oss', 'BF16', [['openai/gpt-oss-20b', [], 20.9 * B, ['gpt-oss-20b']]])[0], storedBytes: 13.8 * B },
  {
    ...family('gpt_oss', 'BF16', [['openai/gpt-oss-120b', [], 116.8 * B, ['gpt-oss-120b']]])[0],
    storedBytes: 65.3 * B,
  },
  ...family('olmo2', 'F32', [
    ['allenai/OLMo-2-0425-1B', ['olmo-2-1b'], 1.48 * B],
    ['allenai/OLMo-2-1124-7B', ['olmo-2-7b'], 7.3 * B],
  ]),
  // Gemma 4 (Gemma4ForConditionalGeneration): the model cards' totals, per-layer embedding tables
  // and the vision (and, E2B/E4B, audio) towers included, which a load never reads. TransformerLens
  // names not checked here, so Loupe's. 26B-A4B (enable_moe_block, 128 experts beside each dense MLP,
  // arch/gemma4.ts): its card's 25.2B total (3.8B active), as the others not re-read from the checkpoint;
  // every expert's weights count, and every expert runs on every token, as for the other MoE families.
  ...family('gemma4', 'BF16', [
    ['google/gemma-4-E2B', [], 5.1 * B, ['gemma-4-e2b']],
    ['google/gemma-4-E2B-it', [], 5.1 * B, ['gemma-4-e2b-it']],
    ['google/gemma-4-E4B', [], 8.0 * B, ['gemma-4-e4b']],
    ['google/gemma-4-E4B-it', [], 8.0 * B, ['gemma-4-e4b-it']],
    ['google/gemma-4-26B-A4B', [], 25.2 * B, ['gemma-4-26b-a4b']],
    ['google/gemma-4-26B-A4B-it', [], 25.2 * B, ['gemma-4-26b-a4b-it']],
    ['google/gemma-4-31B', [], 30.7 * B, ['gemma-4-31b']],
    ['google/gemma-4-31B-it', [], 30.7 * B, ['gemma-4-31b-it']],
  ]),
  // Qwen3.5 (Qwen3_5ForConditionalGeneration): the model cards' language-model counts; each
  // checkpoint also holds a vision tower, which a load never reads
  ...family('qwen3_5', 'BF16', [
    ['Qwen/Qwen3.5-0.8B', [], 0.8 * B, ['qwen3.5-0.8b']],
    ['Qwen/Qwen3.5-2B', [], 2 * B, ['qwen3.5-2b']],
    ['Qwen/Qwen3.5-4B', [], 4 * B, ['qwen3.5-4b']],
    ['Qwen/Qwen3.5-4B-Base', [], 4 * B, ['qwen3.5-4b-base']],
    ['Qwen/Qwen3.5-9B', [], 9 * B, ['qwen3.5-9b']],
    ['Qwen/Qwen3.5-27B', [], 27 * B, ['qwen3.5-27b']],
  ]),
];

/** every name of an entry: its Hub id, TL's aliases, Loupe's */
export function namesOf(e: CatalogEntry): string[] {
  return [e.id, ...e.tl, ...(e.loupe ?? [])];
}

/** the name a list shows first: TransformerLens's default alias (the first in its table), else Loupe's, else the id */
export function shortName(e: CatalogEntry): string {
  return [...e.tl, ...(e.loupe ?? [])].find((n) => !n.includes('/')) ?? e.id;
}

let byName: Map<string, CatalogEntry> | null = null;
function nameMap(): Map<string, CatalogEntry> {
  if (!byName) {
    byName = new Map();
    for (const e of CATALOG) for (const n of namesOf(e)) byName.set(n.toLowerCase(), e);
  }
  return byName;
}

/** the entry a name (Hub id or alias, any case) names, or undefined */
export function lookupModelName(name: string): { entry: CatalogEntry; name: string } | undefined {
  const entry = nameMap().get(name.trim().toLowerCase());
  return entry ? { entry, name: name.trim() } : undefined;
}

/** edit distance with adjacent transpositions (optimal string alignment), for suggestions: '207m' is one edit from '270m' */
function distance(a: string, b: string): number {
  const d: number[][] = Array.from({ length: a.length + 1 }, (_, i) => [i, ...new Array<number>(b.length).fill(0)]);
  for (let j = 1; j <= b.length; j++) d[0][j] = j;
  for (let i = 1; i <= a.length; i++)
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      d[i][j] = Math.min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1])
        d[i][j] = Math.min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.length][b.length];
}

/** the `n` names of the table nearest to `name` (edit distance, case-insensitive), nearest first */
export function nearestModelNames(name: string, n = 3): string[] {
  const q = name.trim().toLowerCase().slice(0, 200);
  const scored: [string, number][] = [];
  for (const e of CATALOG) for (const nm of namesOf(e)) scored.push([nm, distance(q, nm.toLowerCase())]);
  scored.sort((a, b) => a[1] - b[1] || a[0].length - b[0].length || (a[0] < b[0] ? -1 : 1));
  return scored.slice(0, n).map(([nm]) => nm);
}

/** what an entry is, judged before anything is fetched */
export type Verdict = 'fits WASM' | 'needs q8' | 'WebGPU only' | 'too large here';

export interface EntryJudgement {
  verdict: Verdict;
  /** bytes the safetensors take to download (nominal) */
  downloadBytes: number;
  /** per backend: the precision that would run (auto's choice, else q8 where only q8 fits) and its peak memory */
  memory: { backend: MemoryBackend; precision: WeightPrecision; peakBytes: number; fits: boolean }[];
}

const BYTES: Record<CatalogEntry['dtype'], number> = { F32: 4, F16: 2, BF16: 2 };

/**
 * An entry judged by the engine's memory model (budget.ts) from its nominal size: on WASM at f32 or
 * the stored dtype ('fits WASM'), only at q8 ('needs q8'), on WebGPU only (GPU memory unknown unless
 * given), or nowhere within `limits` ('too large here').
 */
export function judgeEntry(e: CatalogEntry, limits: BudgetLimits = {}): EntryJudgement {
  const stats = { nParams: e.params, byDtype: { [e.dtype]: e.params }, storedBytes: e.params * BYTES[e.dtype] };
  const memory = (['node', 'wasm', 'webgpu'] as const).map((backend) => {
    const tries = (['f32', 'stored', 'q8'] as const).map((p) => estimateMemory(stats, backend, p, limits));
    const est = tries.find((t) => t.fits) ?? tries[2];
    return { backend, precision: est.precision, peakBytes: est.peakBytes, fits: est.fits };
  });
  const [, wasm, webgpu] = memory;
  const verdict: Verdict = wasm.fits
    ? wasm.precision === 'q8'
      ? 'needs q8'
      : 'fits WASM'
    : webgpu.fits
      ? 'WebGPU only'
      : 'too large here';
  return { verdict, downloadBytes: e.storedBytes ?? stats.storedBytes, memory };
}
