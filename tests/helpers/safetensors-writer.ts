/**
 * Test-side safetensors writing, independent of src/engine/safetensors.ts:
 *  - `writeSafetensors(tensors, metadata?)` a valid file (tensors laid out in order, header padded to 8)
 *  - `rawSafetensors(header, data)`          any header object + data buffer, for corrupt files
 *  - `readSafetensorsSimple(bytes)`          minimal reader (no validation) for splitting real files
 *  - `shardModel(srcDir, outDir, n)`         copy a model folder with its weights split into n shards + index
 */
import { copyFileSync, existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import * as path from 'node:path';

export interface RawTensor {
  name: string;
  dtype: string;
  shape: number[];
  /** raw little-endian bytes of the data */
  data: Uint8Array;
}

export function f32Bytes(values: ArrayLike<number>): Uint8Array {
  return new Uint8Array(Float32Array.from(values).buffer);
}

/** header JSON padded with spaces so the data starts 8-aligned, as the reference writer does */
function headerBytes(header: unknown): Uint8Array {
  let json = JSON.stringify(header);
  while ((8 + json.length) % 8 !== 0) json += ' ';
  return new TextEncoder().encode(json);
}

export function rawSafetensors(header: unknown, data: Uint8Array, opts: { headerLength?: bigint } = {}): Uint8Array {
  const h = headerBytes(header);
  const out = new Uint8Array(8 + h.byteLength + data.byteLength);
  new DataView(out.buffer).setBigUint64(0, opts.headerLength ?? BigInt(h.byteLength), true);
  out.set(h, 8);
  out.set(data, 8 + h.byteLength);
  return out;
}

export function writeSafetensors(tensors: RawTensor[], metadata?: Record<string, string>): Uint8Array {
  const header: Record<string, unknown> = {};
  if (metadata) header.__metadata__ = metadata;
  let off = 0;
  for (const t of tensors) {
    header[t.name] = { dtype: t.dtype, shape: t.shape, data_offsets: [off, off + t.data.byteLength] };
    off += t.data.byteLength;
  }
  const data = new Uint8Array(off);
  off = 0;
  for (const t of tensors) {
    data.set(t.data, off);
    off += t.data.byteLength;
  }
  return rawSafetensors(header, data);
}

export function readSafetensorsSimple(bytes: Uint8Array): { tensors: RawTensor[]; metadata?: Record<string, string> } {
  const n = Number(new DataView(bytes.buffer, bytes.byteOffset).getBigUint64(0, true));
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + n))) as Record<
    string,
    { dtype: string; shape: number[]; data_offsets: [number, number] }
  >;
  const tensors: RawTensor[] = [];
  let metadata: Record<string, string> | undefined;
  for (const [name, v] of Object.entries(header)) {
    if (name === '__metadata__') {
      metadata = v as unknown as Record<string, string>;
      continue;
    }
    tensors.push({
      name,
      dtype: v.dtype,
      shape: v.shape,
      data: bytes.slice(8 + n + v.data_offsets[0], 8 + n + v.data_offsets[1]),
    });
  }
  return { tensors, metadata };
}

/** Copy a model folder, splitting model.safetensors into `n` shards (round-robin by size) + index. */
export function shardModel(
  srcDir: string,
  outDir: string,
  n: number,
): { shards: string[]; weightMap: Record<string, string> } {
  mkdirSync(outDir, { recursive: true });
  for (const f of readdirSync(srcDir)) {
    if (f !== 'model.safetensors' && !existsSync(path.join(outDir, f)))
      copyFileSync(path.join(srcDir, f), path.join(outDir, f));
  }
  const { tensors, metadata } = readSafetensorsSimple(
    new Uint8Array(readFileSync(path.join(srcDir, 'model.safetensors'))),
  );
  const groups: RawTensor[][] = Array.from({ length: n }, () => []);
  const sizes = new Array(n).fill(0);
  for (const t of [...tensors].sort((a, b) => b.data.byteLength - a.data.byteLength)) {
    const i = sizes.indexOf(Math.min(...sizes));
    groups[i].push(t);
    sizes[i] += t.data.byteLength;
  }
  const shards: string[] = [];
  const weightMap: Record<string, string> = {};
  const pad = (k: number) => String(k).padStart(5, '0');
  groups.forEach((g, i) => {
    const name = `model-${pad(i + 1)}-of-${pad(n)}.safetensors`;
    shards.push(name);
    writeFileSync(path.join(outDir, name), writeSafetensors(g, metadata));
    for (const t of g) weightMap[t.name] = name;
  });
  const total = tensors.reduce((a, t) => a + t.data.byteLength, 0);
  writeFileSync(
    path.join(outDir, 'model.safetensors.index.json'),
    JSON.stringify({ metadata: { total_size: total }, weight_map: weightMap }, null, 2),
  );
  return { shards, weightMap };
}
