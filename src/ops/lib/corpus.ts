/**
 * A corpus for scans over many texts (the `dashboard` operation): text the user gives, read as
 * plain text or JSON Lines, or samples the loaded model generates; cut into token windows that
 * one batched engine run can take.
 *
 *  - plain text: documents are separated by blank lines;
 *  - JSON Lines: one JSON object per non-empty line, its `text` field a document (as Neuronpedia's
 *    and most dataset exports write them); 'auto' reads JSONL when the first non-blank character is `{`;
 *  - generated: `n` samples of `length` tokens from BOS, sample i drawn with seed + i, so the
 *    corpus is a pure function of (model, n, length, seed, temperature).
 * Each document is tokenized without BOS and cut into consecutive windows of at most `window`
 * tokens; the scan prepends BOS to each window (when asked), so every window starts in the same state.
 */
import { LoupeError, throwIfAborted } from '../../engine/errors';
import type { LoadedModel } from '../../engine/api';
import { CAPS } from '../../engine/caps';
import { generateBatch } from './generation';

/** characters of corpus text one call may read (about a million tokens for byte-level tokenizers) */
export const MAX_CORPUS_CHARS = 4_000_000;
/** windows one call may scan */
export const MAX_WINDOWS = 8192;
/** samples one call may generate */
export const MAX_SAMPLES = 1024;

export type CorpusFormat = 'auto' | 'text' | 'jsonl';

export interface CorpusDocument {
  /** token ids without BOS */
  ids: number[];
  origin: 'text' | 'generated';
}

export interface CorpusWindow {
  /** index into the documents */
  document: number;
  /** offset of the window's first token in its document */
  start: number;
  /** token ids without BOS */
  ids: number[];
}

/** Corpus text → document texts (BAD_INPUT naming the line of bad JSON Lines). */
export function corpusTexts(text: string, format: CorpusFormat): { texts: string[]; format: 'text' | 'jsonl' } {
  if (text.length > MAX_CORPUS_CHARS) {
    throw new LoupeError(
      'TOO_LARGE',
      `The corpus has ${text.length.toLocaleString('en-US')} characters, more than the cap of ${MAX_CORPUS_CHARS.toLocaleString('en-US')}.`,
      'Give a smaller sample of the corpus (a few thousand windows is what the dashboard scans).',
    );
  }
  const fmt = format === 'auto' ? (/^\s*\{/.test(text) ? 'jsonl' : 'text') : format;
  if (fmt === 'text')
    return {
      texts: text
        .split(/\r?\n[ \t]*\r?\n/)
        .map((d) => d.trim())
        .filter((d) => d.length > 0),
      format: fmt,
    };
  const texts: string[] = [];
  const lines = text.split(/\r?\n/);
  lines.forEach((line, i) => {
    if (line.trim() === '') return;
    let rec: unknown;
    try {
      rec = JSON.parse(line);
    } catch (e) {
      throw new LoupeError(
        'BAD_INPUT',
        `corpus line ${i + 1} is not JSON: ${(e as Error).message}.`,
        'JSON Lines has one JSON object per line, such as {"text": "Once upon a time"}; give corpus_format "text" to read the corpus as plain text.',
      );
    }
    const t = rec && typeof rec === 'object' && !Array.isArray(rec) ? (rec as Record<string, unknown>).text : undefined;
    if (typeof t !== 'string') {
      throw new LoupeError(
        'BAD_INPUT',
        `corpus line ${i + 1} has no string field "text".`,
        'Each JSON Lines record needs a "text" string, e.g. {"text": "Once upon a time"}.',
      );
    }
    if (t.trim().length > 0) texts.push(t);
  });
  return { texts, format: fmt };
}

/** document texts → token documents (no BOS) */
export function tokenizeDocuments(model: LoadedModel, texts: string[]): CorpusDocument[] {
  return texts
    .map((t) => ({ ids: model.tokenize(t, { prependBos: false, field: 'corpus entry' }), origin: 'text' as const }))
    .filter((d) => d.ids.length > 0);
}

export interface SampleOptions {
  n: number;
  length: number;
  seed: number;
  temperature: number;
  signal?: AbortSignal;
  /** tokens generated so far, of n × length */
  onProgress?: (done: number, total: number) => void;
}

/**
 * `n` samples from the model, from BOS: rows of one batched generation each draw with their own
 * seed (seed + i), so sample i is the same whatever the batch it ran in. A sample stops at EOS
 * (not kept).
 */
export async function generateSamples(
  model: LoadedModel,
  o: SampleOptions,
): Promise<{ documents: CorpusDocument[]; runs: number }> {
  if (o.n > MAX_SAMPLES)
    throw new LoupeError(
      'TOO_LARGE',
      `samples = ${o.n} exceeds the cap of ${MAX_SAMPLES}.`,
      `Ask for at most ${MAX_SAMPLES} samples, or give a text corpus.`,
    );
  const bos = model.bosTokenId;
  if (bos === undefined) {
    throw new LoupeError(
      'BAD_INPUT',
      'This model has no BOS token to start samples from.',
      'Give a text corpus (corpus) instead of samples.',
    );
  }
  const documents: CorpusDocument[] = [];
  let runs = 0;
  // progress in tokens generated (all samples × length), once per generation step
  const total = o.n * o.length;
  for (let first = 0; first < o.n; first += CAPS.maxBatch) {
    throwIfAborted(o.signal);
    o.onProgress?.(first * o.length, total);
    const rows = Math.min(CAPS.maxBatch, o.n - first);
    const seeds = Array.from({ length: rows }, (_, r) => o.seed + first + r);
    const res = await generateBatch(model, [bos], rows, {
      maxNewTokens: o.length,
      temperature: o.temperature,
      seeds,
      signal: o.signal,
      onToken: (t) => {
        if (t.row === 0) o.onProgress?.(first * o.length + (t.step + 1) * rows, total);
      },
    });
    runs += res.runs;
    for (const row of res.rows) {
      const ids =
        model.eosTokenId !== undefined && row.ids[row.ids.length - 1] === model.eosTokenId
          ? row.ids.slice(0, -1)
          : row.ids;
      if (ids.length > 0) documents.push({ ids, origin: 'generated' });
    }
  }
  o.onProgress?.(total, total);
  return { documents, runs };
}

/** documents → consecutive windows of at most `window` tokens (TOO_LARGE past MAX_WINDOWS) */
export function windowsOf(documents: CorpusDocument[], window: number): CorpusWindow[] {
  const out: CorpusWindow[] = [];
  documents.forEach((d, i) => {
    for (let s = 0; s < d.ids.length; s += window) {
      out.push({ document: i, start: s, ids: d.ids.slice(s, s + window) });
      if (out.length > MAX_WINDOWS) {
        throw new LoupeError(
          'TOO_LARGE',
          `The corpus makes more than ${MAX_WINDOWS} windows of ${window} tokens.`,
          `Give a smaller corpus (at most about ${(MAX_WINDOWS * window).toLocaleString('en-US')} tokens) or longer windows.`,
        );
      }
    }
  });
  return out;
}

/** SHA-256 (hex) of a string, through Web Crypto (Node 20, browsers and workers alike) */
export async function sha256Hex(text: string): Promise<string> {
  const digest = await globalThis.crypto.subtle.digest('SHA-256', new TextEncoder().encode(text));
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, '0')).join('');
}
