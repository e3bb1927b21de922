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
  /** the dtype its safetensors store */
  dtype: Extract<SafetensorsDtype, 'F32' | 'F16' | 'BF16'>;
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

export const CATALOG: readonly CatalogEntry[] = [
  { id: 'gpt2', family: 'gpt2', tl: ['gpt2-small'], params: 124 * M, dtype: 'F32' },
  { id: 'gpt2-medium', family: 'gpt2', tl: [], params: 355 * M, dtype: 'F32' },
  { id: 'gpt2-large', family: 'gpt2', tl: [], params: 774 * M, dtype: 'F32' },
  { id: 'gpt2-xl', family: 'gpt2', tl: [], params: 1.56 * B, dtype: 'F32' },
  {
    id: 'distilgpt2',
    family: 'gpt2',
    tl: ['distillgpt2', 'distill-gpt2', 'distil-gpt2', 'gpt2-xs'],
    params: 82 * M,
    dtype: 'F32',
  },
  ...pythia(),
  {
    id: 'EleutherAI/gpt-neox-20b',
    family: 'gpt_neox',
    tl: ['gpt-neox-20b', 'gpt-neox', 'neox'],
    params: 20.6 * B,
    dtype: 'F16',
  },
  { id: 'meta-llama/Llama-2-7b-hf', family: 'llama', tl: ['Llama-2-7b'], params: 6.74 * B, dtype: 'F16' },
  { id: 'meta-llama/Llama-2-7b-chat-hf', family: 'llama', tl: ['Llama-2-7b-chat'], params: 6.74 * B, dtype: 'F16' },
  { id: 'meta-llama/Meta-Llama-3-8B', family: 'llama', tl: [], params: 8.03 * B, dtype: 'BF16' },
  { id: 'meta-llama/Llama-3.1-8B', family: 'llama', tl: [], loupe: ['llama-3.1-8b'], params: 8.03 * B, dtype: 'BF16' },
  { id: 'meta-llama/Llama-3.2-1B', family: 'llama', tl: [], loupe: ['llama-3.2-1b'], params: 1.24 * B, dtype: 'BF16' },
  {
    id: 'meta-llama/Llama-3.2-1B-Instruct',
    family: 'llama',
    tl: [],
    loupe: ['llama-3.2-1b-instruct'],
    params: 1.24 * B,
    dtype: 'BF16',
  },
  { id: 'meta-llama/Llama-3.2-3B', family: 'llama', tl: [], loupe: ['llama-3.2-3b'], params: 3.21 * B, dtype: 'BF16' },
  {
    id: 'HuggingFaceTB/SmolLM2-135M',
    family: 'llama',
    tl: [],
    loupe: ['smollm2-135m'],
    params: 135 * M,
    dtype: 'BF16',
  },
  {
    id: 'HuggingFaceTB/SmolLM2-360M',
    family: 'llama',
    tl: [],
    loupe: ['smollm2-360m'],
    params: 362 * M,
    dtype: 'BF16',
  },
  { id: 'mistralai/Mistral-7B-v0.1', family: 'mistral', tl: ['mistral-7b'], params: 7.24 * B, dtype: 'BF16' },
  {
    id: 'mistralai/Mistral-7B-Instruct-v0.1',
    family: 'mistral',
    tl: ['mistral-7b-instruct'],
    params: 7.24 * B,
    dtype: 'BF16',
  },
  { id: 'Qwen/Qwen1.5-0.5B', family: 'qwen2', tl: ['qwen1.5-0.5b'], params: 620 * M, dtype: 'BF16' },
  { id: 'Qwen/Qwen2-0.5B', family: 'qwen2', tl: ['qwen2-0.5b'], params: 494 * M, dtype: 'BF16' },
  { id: 'Qwen/Qwen2-1.5B', family: 'qwen2', tl: ['qwen2-1.5b'], params: 1.54 * B, dtype: 'BF16' },
  { id: 'Qwen/Qwen2.5-0.5B', family: 'qwen2', tl: ['qwen2.5-0.5b'], params: 494 * M, dtype: 'BF16' },
  {
    id: 'Qwen/Qwen2.5-0.5B-Instruct',
    family: 'qwen2',
    tl: ['qwen2.5-0.5b-instruct'],
    params: 494 * M,
    dtype: 'BF16',
  },
  { id: 'Qwen/Qwen2.5-1.5B', family: 'qwen2', tl: ['qwen2.5-1.5b'], params: 1.54 * B, dtype: 'BF16' },
  { id: 'Qwen/Qwen2.5-3B', family: 'qwen2', tl: ['qwen2.5-3b'], params: 3.09 * B, dtype: 'BF16' },
  { id: 'Qwen/Qwen2.5-7B', family: 'qwen2', tl: ['qwen2.5-7b'], params: 7.62 * B, dtype: 'BF16' },
  { id: 'Qwen/Qwen3-0.6B', family: 'qwen3', tl: ['qwen3-0.6b'], params: 0.6 * B, dtype: 'BF16' },
  { id: 'Qwen/Qwen3-0.6B-Base', family: 'qwen3', tl: ['qwen3-0.6b-base'], params: 0.6 * B, dtype: 'BF16' },
  { id: 'Qwen/Qwen3-1.7B', family: 'qwen3', tl: ['qwen3-1.7b'], params: 1.7 * B, dtype: 'BF16' },
  { id: 'Qwen/Qwen3-4B', family: 'qwen3', tl: ['qwen3-4b'], params: 4.0 * B, dtype: 'BF16' },
  { id: 'Qwen/Qwen3-8B', family: 'qwen3', tl: ['qwen3-8b'], params: 8.2 * B, dtype: 'BF16' },
  { id: 'google/gemma-2b', family: 'gemma', tl: ['gemma-2b'], params: 2.51 * B, dtype: 'F32' },
  { id: 'google/gemma-2b-it', family: 'gemma', tl: ['gemma-2b-it'], params: 2.51 * B, dtype: 'F32' },
  { id: 'google/gemma-7b', family: 'gemma', tl: ['gemma-7b'], params: 8.54 * B, dtype: 'F32' },
  { id: 'google/gemma-2-2b', family: 'gemma2', tl: ['gemma-2-2b'], params: 2.61 * B, dtype: 'F32' },
  { id: 'google/gemma-2-2b-it', family: 'gemma2', tl: ['gemma-2-2b-it'], params: 2.61 * B, dtype: 'F32' },
  { id: 'google/gemma-2-9b', family: 'gemma2', tl: ['gemma-2-9b'], params: 9.24 * B, dtype: 'F32' },
  { id: 'google/gemma-2-9b-it', family: 'gemma2', tl: ['gemma-2-9b-it'], params: 9.24 * B, dtype: 'F32' },
  { id: 'google/gemma-2-27b', family: 'gemma2', tl: ['gemma-2-27b'], params: 27.2 * B, dtype: 'F32' },
  { id: 'google/gemma-3-270m', family: 'gemma3_text', tl: ['gemma-3-270m'], params: 268 * M, dtype: 'BF16' },
  { id: 'google/gemma-3-270m-it', family: 'gemma3_text', tl: ['gemma-3-270m-it'], params: 268 * M, dtype: 'BF16' },
  {
    id: 'google/gemma-3-1b-pt',
    family: 'gemma3_text',
    tl: ['gemma-3-1b-pt'],
    loupe: ['gemma-3-1b'],
    params: 1.0 * B,
    dtype: 'BF16',
  },
  { id: 'google/gemma-3-1b-it', family: 'gemma3_text', tl: ['gemma-3-1b-it'], params: 1.0 * B, dtype: 'BF16' },
  {
    id: 'google/gemma-3-4b-pt',
    family: 'gemma3',
    tl: ['gemma-3-4b-pt'],
    loupe: ['gemma-3-4b'],
    params: 4.3 * B,
    dtype: 'BF16',
  },
  { id: 'google/gemma-3-4b-it', family: 'gemma3', tl: ['gemma-3-4b-it'], params: 4.3 * B, dtype: 'BF16' },
  {
    id: 'google/gemma-3-12b-pt',
    family: 'gemma3',
    tl: ['gemma-3-12b-pt'],
    loupe: ['gemma-3-12b'],
    params: 12.2 * B,
    dtype: 'BF16',
  },
  { id: 'google/gemma-3-12b-it', family: 'gemma3', tl: ['gemma-3-12b-it'], params: 12.2 * B, dtype: 'BF16' },
  {
    id: 'google/gemma-3-27b-pt',
    family: 'gemma3',
    tl: ['gemma-3-27b-pt'],
    loupe: ['gemma-3-27b'],
    params: 27.4 * B,
    dtype: 'BF16',
  },
  { id: 'google/gemma-3-27b-it', family: 'gemma3', tl: ['gemma-3-27b-it'], params: 27.4 * B, dtype: 'BF16' },
  {
    id: 'microsoft/Phi-3-mini-4k-instruct',
    family: 'phi3',
    tl: ['phi-3'],
    loupe: ['phi-3-mini'],
    params: 3.82 * B,
    dtype: 'BF16',
  },
  {
    id: 'microsoft/Phi-3.5-mini-instruct',
    family: 'phi3',
    tl: [],
    loupe: ['phi-3.5-mini'],
    params: 3.82 * B,
    dtype: 'BF16',
  },
  {
    id: 'microsoft/Phi-4-mini-instruct',
    family: 'phi3',
    tl: [],
    loupe: ['phi-4-mini'],
    params: 3.84 * B,
    dtype: 'BF16',
  },
  { id: 'microsoft/phi-4', family: 'phi3', tl: ['phi-4'], params: 14.7 * B, dtype: 'BF16' },
  { id: 'allenai/OLMo-2-0425-1B', family: 'olmo2', tl: ['olmo-2-1b'], params: 1.48 * B, dtype: 'F32' },
  { id: 'allenai/OLMo-2-1124-7B', family: 'olmo2', tl: ['olmo-2-7b'], params: 7.3 * B, dtype: 'F32' },
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
  return { verdict, downloadBytes: stats.storedBytes, memory };
}
