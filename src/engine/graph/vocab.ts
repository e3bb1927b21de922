/**
 * Vocabulary-sized tables in the graph: the embedding W_E [V, D] and the unembedding W_U [V, D]
 * (often one tied tensor), split along the vocabulary into chunks of rows when one piece would be
 * too big (precision.ts chooseVocabSplit says when and why):
 *
 *  - a 16-bit table widened at use ('stored') would otherwise be widened whole for the unembedding:
 *    Llama-3.2-1B's tied 128256×2048 embedding is 1.05 GB as float32 on top of its 0.53 GB of
 *    float16, more than the 4 GiB WASM heap had left;
 *  - a WebGPU buffer cannot exceed the adapter's maxStorageBufferBindingSize / maxBufferSize
 *    (Gemma's 256000×2304 embedding is 2.36 GB as float32).
 *
 * A chunk is a run of whole rows, so its bytes are a contiguous range of the safetensors file: each
 * chunk is its own initializer pointing into the file (no copy), and every use goes through
 * OnnxGraph.weight / gatherRows, the one place a weight becomes float32. The numbers equal the
 * unsplit graph's: a lookup selects whole rows (Where, no arithmetic) and each logit is the same
 * dot product over D (the chunks only split the V axis of the product).
 */
import type { OnnxGraph } from './onnx-builder';
import type { TensorEntry } from '../safetensors-types';

/**
 * Rows [start, end) of a weight (any rank ≥ 1, split on axis 0): the same file bytes, no copy. A q8
 * table (blocks along its rows, q8.ts) takes the same rows of its scales.
 */
export function rowSlice(e: TensorEntry, start: number, end: number): TensorEntry {
  const rowBytes = e.byteLength / e.shape[0];
  const q8 = e.q8 && { ...e.q8, scale: rowSlice(e.q8.scale, start, end) };
  return {
    ...e,
    name: `${e.name}[${start}:${end}]`,
    shape: [end - start, ...e.shape.slice(1)],
    fileOffset: e.fileOffset + start * rowBytes,
    byteLength: (end - start) * rowBytes,
    ...(q8 ? { q8 } : {}),
  };
}

/** A vocabulary table as chunks of at most `rows` rows (the whole table when `rows` is absent or covers it). */
export function vocabChunks(e: TensorEntry, rows?: number): TensorEntry[] {
  const V = e.shape[0];
  if (!rows || rows >= V) return [e];
  const out: TensorEntry[] = [];
  for (let s = 0; s < V; s += rows) out.push(rowSlice(e, s, Math.min(V, s + rows)));
  return out;
}

/**
 * Rows of a chunked table for int64 `ids` (any shape) → float32 [...ids, D]. Each chunk gathers
 * the clipped local ids (only the gathered rows are widened) and Where keeps the rows of the
 * chunk each id falls in. The index arithmetic is float32 (exact: ids are far below 2^24): with
 * int64 arithmetic onnxruntime-web's WebGPU provider gathered the wrong rows (reproduced in
 * headless Chromium's SwiftShader adapter; WASM and onnxruntime-node were right either way).
 */
export function lookupRows(g: OnnxGraph, chunks: TensorEntry[], ids: string): string {
  if (chunks.length === 1) return g.gatherRows(chunks[0], ids);
  const idsF = g.o('Cast', [ids], { to: 1 });
  let x = '';
  let start = 0;
  for (const c of chunks) {
    const n = c.shape[0];
    const s = g.constF([start], []);
    const local = g.o('Cast', [g.o('Clip', [g.o('Sub', [idsF, s]), g.constF([0], []), g.constF([n - 1], [])])], {
      to: 6,
    }); // int32
    const rows = g.gatherRows(c, local);
    x =
      start === 0
        ? rows
        : g.o('Where', [g.o('Unsqueeze', [g.o('GreaterOrEqual', [idsF, s]), g.constI([-1])]), rows, x]);
    start += n;
  }
  return x;
}

/**
 * x [N, D] → x · W_Uᵀ (+ b_U) [N, V], one Gemm per chunk (`n d, v d -> n v`) concatenated along V.
 * Each chunk's weight is asked for after the previous chunk's product (`after`), so a weight
 * widened at use exists one chunk at a time.
 */
export function unembedRows(g: OnnxGraph, chunks: TensorEntry[], bias: TensorEntry | undefined, x: string): string {
  const parts: string[] = [];
  let after = x;
  let start = 0;
  for (const c of chunks) {
    const n = c.shape[0];
    const args = [x, g.weight(c, after)];
    if (bias) args.push(g.weight(chunks.length === 1 ? bias : rowSlice(bias, start, start + n)));
    after = g.o('Gemm', args, { transB: 1 });
    parts.push(after);
    start += n;
  }
  return g.concat(parts, 1);
}
