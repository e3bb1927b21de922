/**
 * Weight bytes for onnxruntime-web in pieces. onnxruntime-web refuses an external data buffer of
 * 2 GiB or more ("File size (2471646712) is greater than 2 GiB": Llama-3.2-1B's one shard), so the
 * weights reach it as pieces of at most PIECE_BYTES, each a run of whole tensors of one file, and
 * the graph's external-data entries are rewritten to point into the pieces. Only bytes the graph
 * references are read: a tensor the graph does not use is never loaded, and offsets past 4 GiB
 * are plain numbers.
 *
 *   const { graphBytes, pieces } = pieceGraph(graph.bytes);
 *   pieces: [{ path: 'model.safetensors.0', file: 'model.safetensors', start, end }, …]
 *   externalData = pieces.map((p) => ({ path: p.path, data: bytesOf(p.file, p.start, p.end) }))
 */
import onnxProto from 'onnx-proto';
import { LoupeError } from '../errors';

const { onnx } = onnxProto as any;

/** the largest piece; a single tensor above it gets a piece of its own (up to the 2 GiB limit) */
export const PIECE_BYTES = 1024 ** 3;
/** onnxruntime-web's own limit on one external data buffer */
const ORT_WEB_MAX_BYTES = 2 * 1024 ** 3 - 1;

export interface Piece {
  /** the name the rewritten graph's `location` fields use */
  path: string;
  file: string;
  /** byte range of `file` */
  start: number;
  end: number;
  /** the bytes the graph's tensors take from it (the range may hold unused tensors between them) */
  used: number;
}

interface Ref {
  init: any;
  file: string;
  offset: number;
  length: number;
}

function entry(init: any, key: string): any {
  return init.externalData.find((kv: any) => kv.key === key);
}

/** Rewrite a graph's external data into pieces; returns the new graph bytes and the pieces to feed. */
export function pieceGraph(
  graphBytes: Uint8Array,
  maxBytes = PIECE_BYTES,
): { graphBytes: Uint8Array; pieces: Piece[] } {
  const model = onnx.ModelProto.decode(graphBytes);
  const byFile = new Map<string, Ref[]>();
  for (const init of model.graph.initializer) {
    if (init.dataLocation !== 1) continue;
    const file = entry(init, 'location').value as string;
    const ref = {
      init,
      file,
      offset: Number(entry(init, 'offset')?.value ?? 0),
      length: Number(entry(init, 'length').value),
    };
    if (!byFile.has(file)) byFile.set(file, []);
    byFile.get(file)!.push(ref);
  }
  const pieces: Piece[] = [];
  for (const [file, refs] of byFile) {
    refs.sort((a, b) => a.offset - b.offset);
    let cur: Piece | null = null;
    for (const r of refs) {
      if (r.length > ORT_WEB_MAX_BYTES) {
        throw new LoupeError(
          'TOO_LARGE',
          `Tensor ${String(r.init.name).replace(/^w:/, '')} is ${(r.length / 1024 ** 3).toFixed(2)} GiB; onnxruntime-web takes at most 2 GiB in one piece.`,
          'Use --weights stored (16-bit weights are half the size) or the node backend.',
        );
      }
      const end = r.offset + r.length;
      if (!cur || (end - cur.start > maxBytes && r.offset >= cur.end)) {
        cur = {
          path: `${file}.${pieces.filter((p) => p.file === file).length}`,
          file,
          start: r.offset,
          end,
          used: r.length,
        };
        pieces.push(cur);
      } else {
        cur.end = Math.max(cur.end, end);
        cur.used += r.length;
      }
      entry(r.init, 'location').value = cur.path;
      const off = entry(r.init, 'offset');
      if (off) off.value = String(r.offset - cur.start);
      else r.init.externalData.push({ key: 'offset', value: String(r.offset - cur.start) });
    }
  }
  return { graphBytes: onnx.ModelProto.encode(model).finish(), pieces };
}
