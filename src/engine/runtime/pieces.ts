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
 *   externalData = pieces.map((p) => ({ path: p.path, data: pieceData(p, bytesOf(p.file, p.start, p.end)) }))
 *
 * A BF16 weight the graph holds as a constant (precision f32: widened at load) is handed over
 * widened to float32 (`widen` pieces: a float32 initializer, no Cast left to fold). onnxruntime-web
 * 1.30's native WebGPU build has no provider for Cast from bfloat16: its CPU provider has no such
 * kernel (nor from int16/uint16; measured) and its WebGPU Cast takes f16, f32, i32, u32, bool and
 * i64 only (onnxruntime/core/providers/webgpu/tensor/cast.cc), so the Cast that JSEP's build folds
 * leaves the session uncreatable ("Provider type for Cast node … is not set"). BF16 → float32 is
 * exact (the 16 bits are the float32's high half), so the numbers are those of the fold.
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
  /** the bytes the graph's tensors take from it (the range may hold unused tensors between them), as handed over */
  used: number;
  /** BF16 in the file, float32 to onnxruntime: the piece is twice its range's bytes, offsets doubled */
  widen?: boolean;
}

/** onnx TensorProto data types */
const BFLOAT16 = 16,
  FLOAT = 1;

/** The bytes onnxruntime gets for a piece's range (the widen pieces' BF16 as float32), into `into` where given. */
export function pieceData(p: Pick<Piece, 'widen'>, bytes: Uint8Array, into?: Uint8Array): Uint8Array {
  if (!p.widen) return bytes;
  const n = bytes.byteLength >> 1;
  const out = into ?? new Uint8Array(n * 4);
  // a view at an odd offset (a safetensors header need not be padded) is copied to read it as 16-bit
  const even = bytes.byteOffset % 2 ? bytes.slice() : bytes;
  const src = new Uint16Array(even.buffer, even.byteOffset, n);
  const dst = new Uint32Array(out.buffer, out.byteOffset, n);
  for (let i = 0; i < n; i++) dst[i] = src[i] << 16;
  return out.subarray(0, n * 4);
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
  // a weight declared as a graph input too (precision stored/q8) is widened at use, in the graph
  const inputs = new Set(model.graph.input.map((i: any) => i.name));
  const byFile = new Map<string, { file: string; widen: boolean; refs: Ref[] }>();
  for (const init of model.graph.initializer) {
    if (init.dataLocation !== 1) continue;
    const file = entry(init, 'location').value as string;
    const widen = init.dataType === BFLOAT16 && !inputs.has(init.name);
    if (widen) init.dataType = FLOAT;
    const ref = {
      init,
      file,
      offset: Number(entry(init, 'offset')?.value ?? 0),
      length: Number(entry(init, 'length').value),
    };
    const key = `${widen ? 'f32' : ''}:${file}`;
    if (!byFile.has(key)) byFile.set(key, { file, widen, refs: [] });
    byFile.get(key)!.refs.push(ref);
  }
  const pieces: Piece[] = [];
  for (const { file, widen, refs } of byFile.values()) {
    refs.sort((a, b) => a.offset - b.offset);
    // sizes as handed over: a widened range is twice its bytes
    const k = widen ? 2 : 1;
    const name = widen ? `${file}.f32` : file;
    let cur: Piece | null = null;
    for (const r of refs) {
      if (r.length * k > ORT_WEB_MAX_BYTES) {
        throw new LoupeError(
          'TOO_LARGE',
          `Tensor ${String(r.init.name).replace(/^w:/, '')} is ${((r.length * k) / 1024 ** 3).toFixed(2)} GiB` +
            `${widen ? ' as float32' : ''}; onnxruntime-web takes at most 2 GiB in one piece.`,
          'Use --weights stored (16-bit weights are half the size) or the node backend.',
        );
      }
      const end = r.offset + r.length;
      if (!cur || ((end - cur.start) * k > maxBytes && r.offset >= cur.end)) {
        cur = {
          path: `${name}.${pieces.filter((p) => p.file === file && !!p.widen === widen).length}`,
          file,
          start: r.offset,
          end,
          used: r.length * k,
          ...(widen ? { widen } : {}),
        };
        pieces.push(cur);
      } else {
        cur.end = Math.max(cur.end, end);
        cur.used += r.length * k;
      }
      entry(r.init, 'location').value = cur.path;
      entry(r.init, 'length').value = String(r.length * k);
      const off = entry(r.init, 'offset');
      if (off) off.value = String((r.offset - cur.start) * k);
      else r.init.externalData.push({ key: 'offset', value: String((r.offset - cur.start) * k) });
    }
  }
  return { graphBytes: onnx.ModelProto.encode(model).finish(), pieces };
}
