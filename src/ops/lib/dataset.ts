/**
 * Datasets of clean/corrupted pairs, the one input of every dataset operation (edge_attribution,
 * and the dataset mode of patch, ablate, attribution_patching, integrated_gradients).
 *
 * A pair is {clean, corrupted, answer, counterfactual}: the prompts as text (BOS prepended unless
 * prepend_bos is false) or as `clean_token_ids` / `corrupted_token_ids` (used exactly), the two
 * tokens as text or "#id" (lib/tokens.ts resolveToken). It comes from one of:
 *  - `dataset`: the pairs inline (MCP, the page, --input);
 *  - `dataset_text`: JSON Lines (one pair object a line) or CSV (a header row naming the fields;
 *    EAP-IG's correct_idx / incorrect_idx columns are read as answer / counterfactual ids; id
 *    lists as space- or comma-separated numbers): what the CLI's --dataset FILE and a dropped
 *    file fill in;
 *  - `generate`: a templated task made with the model's tokenizer (generateDataset below).
 * A pair whose clean and corrupted prompts tokenize to different lengths is dropped (never padded),
 * and the document says which and why; an answer or counterfactual that is not one token is
 * BAD_INPUT naming the pair. Every dataset document carries `dataset` (datasetReport): the count
 * used, the dropped pairs and the SHA-256 of the canonical pairs, so two runs on the same pairs —
 * from a file, inline or generated — say so.
 */
import { z } from 'zod';
import { LoupeError, throwIfAborted } from '../../engine/errors';
import type { LoadedModel } from '../../engine/api';
import { CAPS, checkTokenCount } from '../../engine/caps';
import { distinctTokens, resolveToken } from './tokens';
import { sha256Hex } from './corpus';
import { rng } from './math';
import type { OpContext } from '../types';

const ids = z.array(z.number().int().min(0)).min(1);

export const pairSchema = z.object({
  clean: z.string().optional().describe('The clean prompt (its run is the one patched/attributed).'),
  corrupted: z.string().optional().describe('The corrupted prompt; must tokenize to as many tokens as the clean one.'),
  clean_token_ids: ids.optional().describe('Clean token ids, used exactly instead of clean (no BOS added).'),
  corrupted_token_ids: ids.optional().describe('Corrupted token ids, used exactly instead of corrupted.'),
  answer: z.string().describe('Token (text or "#id") whose logit counts positively.'),
  counterfactual: z.string().describe('Token (text or "#id") whose logit counts negatively.'),
});
export type DatasetPair = z.infer<typeof pairSchema>;

/** pairs a dataset report shows as given (the page's table of pairs) */
export const DATASET_SAMPLE = 8;

export const GENERATORS = ['ioi', 'greater_than', 'induction'] as const;

export const generateSchema = z.object({
  task: z
    .enum(GENERATORS)
    .describe(
      'ioi: "When A and B went to the store, B gave a drink to" → A vs B, corrupted with a third name ' +
        'for the second B; greater_than: "The war lasted from the year 17YY to the year 17" → YY+1 vs YY−1, ' +
        'corrupted with 01; induction: BOS + R + R[:-1] → R[-1], corrupted first copy R′ → R′[-1] (R, R′ of ' +
        'distinct tokens each, R′[-1] ≠ R[-1]).',
    ),
  n: z.number().int().min(1).describe('How many pairs to make (before any is dropped).'),
  seed: z.number().int().default(0).describe('Seed of the choices (names, years, random sequences).'),
  length: z.number().int().min(2).max(256).default(10).describe('induction: tokens in the repeated sequence R.'),
});
export type GenerateSpec = z.infer<typeof generateSchema>;

/** input fields of a dataset operation; exactly one source. Spread into the operation's input schema. */
export const datasetFields = {
  dataset: z
    .array(pairSchema)
    .optional()
    .describe(
      'The pairs inline: [{"clean": "…", "corrupted": "…", "answer": " A", "counterfactual": " B"}, …] (or clean_token_ids / corrupted_token_ids).',
    ),
  dataset_text: z
    .string()
    .optional()
    .describe(
      'The pairs as JSON Lines (one pair object per line) or CSV with a header row (clean, ' +
        'corrupted, answer, counterfactual, clean_token_ids, corrupted_token_ids; ' +
        'correct_idx / incorrect_idx as token ids). The CLI fills it from --dataset FILE.',
    )
    // contentMediaType: the page's form offers a file drop/pick for it
    .meta({ contentMediaType: 'text/plain' }),
  dataset_format: z
    .enum(['auto', 'jsonl', 'csv'])
    .default('auto')
    .describe('How to read dataset_text: auto = JSON Lines when it starts with "{", else CSV.'),
  generate: generateSchema.optional().describe('Make the pairs from a templated task with the model’s tokenizer.'),
};

export interface DatasetInput {
  dataset?: DatasetPair[];
  dataset_text?: string;
  dataset_format: 'auto' | 'jsonl' | 'csv';
  generate?: GenerateSpec;
  prepend_bos: boolean;
}

/** whether an operation's input names a dataset (its dataset mode) */
export const hasDataset = (i: Partial<DatasetInput>) =>
  i.dataset !== undefined || i.dataset_text !== undefined || i.generate !== undefined;

export const datasetReport = z.object({
  source: z.enum(['inline', 'text', 'generated']),
  format: z.enum(['jsonl', 'csv']).nullable().describe('how dataset_text was read (null for other sources)'),
  generator: generateSchema.nullable(),
  n_given: z.number().int().describe('pairs in the dataset'),
  n_examples: z.number().int().describe('pairs used (n_given − dropped)'),
  dropped: z
    .array(
      z.object({
        index: z.number().int().describe('0-based index of the pair in the dataset'),
        reason: z.string(),
        clean_tokens: z.number().int(),
        corrupted_tokens: z.number().int(),
      }),
    )
    .describe('pairs left out, and why (clean and corrupted of different token lengths)'),
  sha256: z.string().describe('SHA-256 of the canonical JSON of the pairs as given (before tokenizing)'),
  sample: z
    .array(pairSchema.extend({ index: z.number().int(), used: z.boolean() }))
    .optional() // documents made before it existed stay valid
    .describe(`the first ${DATASET_SAMPLE} pairs as given, each with its index and whether it was used (not dropped)`),
});
export type DatasetReport = z.infer<typeof datasetReport>;

/** one usable pair, tokenized */
export interface Example {
  /** index in the dataset */
  index: number;
  clean: number[];
  corrupted: number[];
  answer: number;
  counterfactual: number;
}

export interface Dataset {
  examples: Example[];
  report: DatasetReport;
  /** the pairs as given (the page's dataset panel shows them) */
  pairs: DatasetPair[];
}

const bad = (m: string, hint?: string) => new LoupeError('BAD_INPUT', m, hint);

/** parse dataset_text (BAD_INPUT naming the line of a bad record) */
export function parseDatasetText(
  text: string,
  format: 'auto' | 'jsonl' | 'csv',
): { pairs: unknown[]; format: 'jsonl' | 'csv' } {
  if (text.length > CAPS.maxDatasetChars)
    throw new LoupeError(
      'TOO_LARGE',
      `dataset_text has ${text.length.toLocaleString('en-US')} characters, more than the cap of ${CAPS.maxDatasetChars.toLocaleString('en-US')}.`,
      `Give at most ${CAPS.maxDatasetPairs} pairs.`,
    );
  const fmt = format === 'auto' ? (/^\s*\{/.test(text) ? 'jsonl' : 'csv') : format;
  if (fmt === 'jsonl') {
    const pairs: unknown[] = [];
    text.split(/\r?\n/).forEach((line, i) => {
      if (line.trim() === '') return;
      try {
        pairs.push(JSON.parse(line));
      } catch (e) {
        throw bad(
          `dataset line ${i + 1} is not JSON: ${(e as Error).message}.`,
          'JSON Lines has one pair object per line: {"clean": "…", "corrupted": "…", "answer": " A", "counterfactual": " B"}.',
        );
      }
    });
    return { pairs, format: fmt };
  }
  const rows = csvRows(text);
  if (rows.length === 0) return { pairs: [], format: fmt };
  const header = rows[0].map((h) => h.trim());
  const known = new Set([...Object.keys(pairSchema.shape), 'correct_idx', 'incorrect_idx']);
  if (!header.some((h) => known.has(h)))
    throw bad(
      `The CSV header (${header.slice(0, 6).join(', ')}) names none of the pair fields.`,
      'The first row names the columns: clean, corrupted, answer, counterfactual (or clean_token_ids, corrupted_token_ids; correct_idx, incorrect_idx).',
    );
  const idList = (s: string, line: number, col: string) => {
    const parts = s
      .trim()
      .split(/[\s,]+/)
      .filter(Boolean);
    const out = parts.map(Number);
    if (out.some((x) => !Number.isInteger(x) || x < 0))
      throw bad(`dataset line ${line}: ${col} must be token ids separated by spaces or commas.`);
    return out;
  };
  const pairs = rows.slice(1).map((r, k) => {
    const line = k + 2;
    const rec: Record<string, unknown> = {};
    header.forEach((h, i) => {
      const v = r[i];
      if (v === undefined || v === '' || !known.has(h)) return;
      if (h === 'clean_token_ids' || h === 'corrupted_token_ids') rec[h] = idList(v, line, h);
      else if (h === 'correct_idx') rec.answer ??= `#${v.trim()}`;
      else if (h === 'incorrect_idx') rec.counterfactual ??= `#${v.trim()}`;
      else rec[h] = v;
    });
    return rec;
  });
  return { pairs, format: fmt };
}

/** RFC 4180 rows: quoted fields may hold commas, newlines and doubled quotes; blank lines are skipped */
function csvRows(text: string): string[][] {
  const rows: string[][] = [];
  let row: string[] = [];
  let field = '';
  let quoted = false;
  let any = false;
  for (let i = 0; i < text.length; i++) {
    const ch = text[i];
    if (quoted) {
      if (ch === '"') {
        if (text[i + 1] === '"') {
          field += '"';
          i++;
        } else quoted = false;
      } else field += ch;
      continue;
    }
    if (ch === '"' && field === '') {
      quoted = true;
      any = true;
    } else if (ch === ',') {
      row.push(field);
      field = '';
      any = true;
    } else if (ch === '\n' || ch === '\r') {
      if (ch === '\r' && text[i + 1] === '\n') i++;
      if (any || field !== '') rows.push([...row, field]);
      row = [];
      field = '';
      any = false;
    } else {
      field += ch;
      any = true;
    }
  }
  if (quoted) throw bad('dataset_text: a quoted CSV field is not closed.');
  if (any || field !== '') rows.push([...row, field]);
  return rows;
}

/** The dataset an operation's input names, tokenized and checked; dropped pairs reported. */
export async function resolveDataset(model: LoadedModel, input: DatasetInput): Promise<Dataset> {
  const given = [input.dataset !== undefined, input.dataset_text !== undefined, input.generate !== undefined].filter(
    Boolean,
  );
  if (given.length !== 1)
    throw bad(
      given.length === 0
        ? 'No dataset: give dataset (pairs), dataset_text (JSON Lines or CSV) or generate.'
        : 'Give one of dataset, dataset_text and generate, not several.',
      'A dataset is a list of {clean, corrupted, answer, counterfactual} pairs.',
    );
  let raw: unknown[];
  let format: 'jsonl' | 'csv' | null = null;
  let source: DatasetReport['source'];
  if (input.generate) {
    raw = generateDataset(model, input.generate, input.prepend_bos);
    source = 'generated';
  } else if (input.dataset_text !== undefined) {
    ({ pairs: raw, format } = parseDatasetText(input.dataset_text, input.dataset_format));
    source = 'text';
  } else {
    raw = input.dataset!;
    source = 'inline';
  }
  if (raw.length === 0)
    throw bad('The dataset is empty.', 'Give at least one {clean, corrupted, answer, counterfactual} pair.');
  if (raw.length > CAPS.maxDatasetPairs)
    throw new LoupeError(
      'TOO_LARGE',
      `The dataset has ${raw.length} pairs, more than the cap of ${CAPS.maxDatasetPairs}.`,
      `Give at most ${CAPS.maxDatasetPairs} pairs per call.`,
    );
  const pairs = raw.map((p, i) => {
    const r = pairSchema.safeParse(p);
    if (!r.success)
      throw bad(
        `dataset pair ${i}: ${r.error.issues.map((x) => `${x.path.join('.') || '(pair)'}: ${x.message}`).join('; ')}`,
        'Each pair is {clean, corrupted, answer, counterfactual} (prompts as text or clean_token_ids / corrupted_token_ids).',
      );
    return canonical(r.data);
  });
  const examples: Example[] = [];
  const dropped: DatasetReport['dropped'] = [];
  pairs.forEach((p, i) => {
    const clean = promptOf(model, p.clean, p.clean_token_ids, input.prepend_bos, i, 'clean');
    const corrupted = promptOf(model, p.corrupted, p.corrupted_token_ids, input.prepend_bos, i, 'corrupted');
    const answer = tokenOf(model, p.answer, i, 'answer');
    const counterfactual = tokenOf(model, p.counterfactual, i, 'counterfactual');
    if (clean.length !== corrupted.length) {
      dropped.push({
        index: i,
        reason: `clean has ${clean.length} tokens, corrupted ${corrupted.length}`,
        clean_tokens: clean.length,
        corrupted_tokens: corrupted.length,
      });
      return;
    }
    examples.push({ index: i, clean, corrupted, answer, counterfactual });
  });
  if (examples.length === 0)
    throw bad(
      `Every pair of the dataset was dropped (${dropped.length}: clean and corrupted of different token lengths).`,
      'Make each corrupted prompt tokenize to as many tokens as its clean prompt (e.g. swap one single-token word).',
    );
  return {
    examples,
    pairs,
    report: {
      source,
      format,
      generator: input.generate ?? null,
      n_given: pairs.length,
      n_examples: examples.length,
      dropped,
      sha256: await sha256Hex(JSON.stringify(pairs)),
      sample: pairs.slice(0, DATASET_SAMPLE).map((p, index) => ({
        index,
        ...p,
        used: !dropped.some((d) => d.index === index),
      })),
    },
  };
}

/** the pair's fields in one order, absent ones left out: what the SHA-256 is taken over */
function canonical(p: DatasetPair): DatasetPair {
  const out: Record<string, unknown> = {};
  for (const k of ['clean', 'corrupted', 'clean_token_ids', 'corrupted_token_ids', 'answer', 'counterfactual'] as const)
    if (p[k] !== undefined) out[k] = p[k];
  return out as DatasetPair;
}

function promptOf(
  model: LoadedModel,
  text: string | undefined,
  tokenIds: number[] | undefined,
  prependBos: boolean,
  i: number,
  which: 'clean' | 'corrupted',
): number[] {
  let ids: number[];
  if (tokenIds) {
    const V = model.info.d_vocab;
    const out = tokenIds.find((t) => t >= V);
    if (out !== undefined)
      throw new LoupeError(
        'BAD_TOKEN_ID',
        `dataset pair ${i}: ${which}_token_ids holds ${out}, outside the vocabulary (d_vocab = ${V}).`,
      );
    ids = tokenIds;
  } else {
    if (!text) throw bad(`dataset pair ${i}: the ${which} prompt is empty.`, `Give ${which} or ${which}_token_ids.`);
    ids = model.tokenize(text, { prependBos, field: `dataset pair ${i}: ${which}` });
    if (ids.length === 0) throw bad(`dataset pair ${i}: the ${which} prompt tokenizes to no tokens.`);
  }
  try {
    checkTokenCount(model, ids.length);
  } catch (e) {
    throw new LoupeError('PROMPT_TOO_LONG', `dataset pair ${i}: ${(e as LoupeError).message}`, (e as LoupeError).hint);
  }
  return ids;
}

function tokenOf(model: LoadedModel, text: string, i: number, field: 'answer' | 'counterfactual'): number {
  try {
    return resolveToken(model, text, field);
  } catch (e) {
    const le = e as LoupeError;
    throw new LoupeError('BAD_INPUT', `dataset pair ${i}: ${le.message}`, le.hint);
  }
}

/** examples grouped by token length (in dataset order within a length), in batches of at most `rows` */
export function batchesByLength(examples: Example[], rows: number): Example[][] {
  const byLen = new Map<number, Example[]>();
  for (const e of examples) byLen.set(e.clean.length, [...(byLen.get(e.clean.length) ?? []), e]);
  const out: Example[][] = [];
  for (const group of byLen.values()) for (let i = 0; i < group.length; i += rows) out.push(group.slice(i, i + rows));
  return out;
}

// ------------------------------------------------------------------ generators

const NAMES = [
  'Mary',
  'John',
  'Alice',
  'Bob',
  'Tom',
  'James',
  'Anna',
  'David',
  'Sarah',
  'Michael',
  'Emma',
  'Daniel',
  'Laura',
  'Paul',
  'Kate',
  'Mark',
  'Lisa',
  'Peter',
  'Jane',
  'Steve',
  'Amy',
  'Chris',
  'Rachel',
  'Ryan',
  'Helen',
  'Adam',
];
const PLACES = ['store', 'park', 'school', 'office', 'garden', 'station', 'hospital', 'restaurant'];
const OBJECTS = ['drink', 'book', 'ball', 'ring', 'kiss', 'bone', 'basketball', 'computer', 'necklace'];
const IOI_TEMPLATES = [
  'When {A} and {B} went to the {P}, {C} gave a {O} to',
  'Then, {A} and {B} were working at the {P}. {C} decided to give a {O} to',
  'After {A} and {B} went to the {P}, {C} gave a {O} to',
  'While {A} and {B} were working at the {P}, {C} handed a {O} to',
];
const NOUNS = ['war', 'contract', 'plan', 'marriage', 'drought', 'journey', 'reign', 'trial'];

/** the words of `list` that are one token with a leading space, as the model's tokenizer sees them */
function singleTokens(model: LoadedModel, list: string[]): string[] {
  return list.filter((w) => model.tokenId(' ' + w) !== undefined);
}

/**
 * Pairs of a templated task, as text (ioi, greater_than) or token ids (induction), a pure function
 * of (tokenizer, spec). Choices are drawn from words that are one token with a leading space for
 * this tokenizer; too few such words is BAD_INPUT naming the task.
 */
export function generateDataset(model: LoadedModel, g: GenerateSpec, prependBos: boolean): DatasetPair[] {
  if (g.n > CAPS.maxDatasetPairs)
    throw new LoupeError('TOO_LARGE', `generate.n = ${g.n} exceeds the cap of ${CAPS.maxDatasetPairs} pairs.`);
  const r = rng(g.seed);
  const pick = <T>(xs: T[]) => xs[Math.floor(r() * xs.length)];
  const pairs: DatasetPair[] = [];
  if (g.task === 'ioi') {
    const names = singleTokens(model, NAMES);
    if (names.length < 3)
      throw bad(
        `generate ioi: only ${names.length} of its ${NAMES.length} names are one token for this tokenizer (it needs 3).`,
        'Give the pairs yourself (dataset), with single-token names.',
      );
    for (let i = 0; i < g.n; i++) {
      const a = pick(names); // the indirect object: the answer
      let b = pick(names); // the subject, named twice in the clean prompt
      while (b === a) b = pick(names);
      let c = pick(names); // the corrupted prompt's second subject
      while (c === a || c === b) c = pick(names);
      const [x, y] = r() < 0.5 ? [a, b] : [b, a];
      const t = pick(IOI_TEMPLATES);
      const place = pick(PLACES);
      const object = pick(OBJECTS);
      const fill = (s2: string) =>
        t.replace('{A}', x).replace('{B}', y).replace('{C}', s2).replace('{P}', place).replace('{O}', object);
      pairs.push({ clean: fill(b), corrupted: fill(c), answer: ' ' + a, counterfactual: ' ' + b });
    }
    return pairs;
  }
  if (g.task === 'greater_than') {
    const two = (n: number) => String(n).padStart(2, '0');
    const missing = Array.from({ length: 100 }, (_, k) => two(k)).filter((s) => model.tokenId(s) === undefined);
    if (missing.length)
      throw bad(
        `generate greater_than: ${missing.length} two-digit numbers (e.g. "${missing[0]}") are not single tokens for this tokenizer.`,
        "It needs a tokenizer with every two-digit number as one token (GPT-2's); give the pairs yourself otherwise.",
      );
    for (let i = 0; i < g.n; i++) {
      const century = 11 + Math.floor(r() * 8); // 11xx … 18xx
      const yy = 2 + Math.floor(r() * 97); // 02 … 98
      const noun = pick(NOUNS);
      const text = (y: string) => `The ${noun} lasted from the year ${century}${y} to the year ${century}`;
      pairs.push({ clean: text(two(yy)), corrupted: text('01'), answer: two(yy + 1), counterfactual: two(yy - 1) });
    }
    return pairs;
  }
  // induction: BOS + R + R[:-1] → R[-1]; corrupted BOS + R′ + R[:-1] → R′[-1]
  const bos = prependBos && model.bosTokenId !== undefined ? [model.bosTokenId] : [];
  for (let i = 0; i < g.n; i++) {
    // distinct tokens in each sequence (as head_scores draws them): a repeat is the task's, never
    // a chance one, and the two answers differ
    const R = distinctTokens(model, g.length, r);
    let R2 = distinctTokens(model, g.length, r);
    while (R2[R2.length - 1] === R[R.length - 1]) R2 = distinctTokens(model, g.length, r);
    pairs.push({
      clean_token_ids: [...bos, ...R, ...R.slice(0, -1)],
      corrupted_token_ids: [...bos, ...R2, ...R.slice(0, -1)],
      answer: `#${R[R.length - 1]}`,
      counterfactual: `#${R2[R2.length - 1]}`,
    });
  }
  return pairs;
}

/**
 * A single-pair operation run once per pair of the dataset its input names (its dataset mode):
 * `perPair` gets each example with a context whose progress says which pair it is on, and
 * returns that pair's document. Cancellation is checked between pairs.
 */
export async function forEachPair<D>(
  model: LoadedModel,
  input: DatasetInput,
  ctx: OpContext,
  perPair: (ex: Example, ctx: OpContext) => Promise<D>,
  /** checks of the whole dataset before the first pair runs */
  before?: (dataset: Dataset) => void,
): Promise<{ dataset: Dataset; docs: D[] }> {
  const dataset = await resolveDataset(model, input);
  before?.(dataset);
  const docs: D[] = [];
  const n = dataset.examples.length;
  for (const ex of dataset.examples) {
    throwIfAborted(ctx.signal);
    const k = docs.length + 1;
    docs.push(
      await perPair(ex, {
        ...ctx,
        onProgress: (p) => ctx.onProgress?.({ stage: `pair ${k}/${n}: ${p.stage}`, done: p.done, total: p.total }),
      }),
    );
  }
  return { dataset, docs };
}

/** a pair as the single-pair inputs of the patching operations take it (token ids, "#id" tokens) */
export const pairInputOf = (ex: Example) => ({
  token_ids: ex.clean,
  corrupted_token_ids: ex.corrupted,
  answer: `#${ex.answer}`,
  counterfactual: `#${ex.counterfactual}`,
});

/** BAD_INPUT when a single-pair prompt is given beside a dataset */
export function checkOneSource(input: Record<string, unknown>, promptFields: string[]): void {
  const given = promptFields.filter((f) => {
    const v = input[f];
    return v !== undefined && v !== '' && !(Array.isArray(v) && v.length === 0);
  });
  if (given.length)
    throw bad(
      `Give either a dataset or a single pair: ${given.join(', ')} and a dataset were both given.`,
      'Leave the prompt fields empty in dataset mode (each pair carries its own prompts and tokens).',
    );
}
