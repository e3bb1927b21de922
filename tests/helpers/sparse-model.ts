/**
 * Models at real sizes without the disk: a valid safetensors header, then a hole (a sparse file
 * that takes no blocks), next to config.json and tokenizer.json. For judging before download
 * and for > 2 GiB / > 4 GiB file paths. Delete the folder when done.
 *
 *   const dir = writeSparseGpt2(tmp, 'gpt2-xl', { nLayer: 48, nEmbd: 1600, nHead: 25 }, 'F32');
 */
import { closeSync, copyFileSync, ftruncateSync, mkdirSync, openSync, writeFileSync, writeSync } from 'node:fs';
import * as path from 'node:path';

export interface SparseTensor {
  name: string;
  dtype: 'F32' | 'F16' | 'BF16';
  shape: number[];
}

const BYTES = { F32: 4, F16: 2, BF16: 2 } as const;

/** Write `file` as a safetensors header describing `tensors`, the data left as a hole; returns its size. */
export function writeSparseSafetensors(file: string, tensors: SparseTensor[]): { size: number; headerBytes: number } {
  const header: Record<string, unknown> = {};
  let off = 0;
  for (const t of tensors) {
    const n = t.shape.reduce((a, b) => a * b, 1) * BYTES[t.dtype];
    header[t.name] = { dtype: t.dtype, shape: t.shape, data_offsets: [off, off + n] };
    off += n;
  }
  let json = JSON.stringify(header);
  while ((8 + json.length) % 8) json += ' ';
  const fd = openSync(file, 'w');
  try {
    const len = Buffer.alloc(8);
    len.writeBigUInt64LE(BigInt(json.length));
    writeSync(fd, len, 0, 8, 0);
    writeSync(fd, Buffer.from(json), 0, json.length, 8);
    ftruncateSync(fd, 8 + json.length + off);
  } finally {
    closeSync(fd);
  }
  return { size: 8 + json.length + off, headerBytes: 8 + json.length };
}

export interface Gpt2Shape {
  nLayer: number;
  nEmbd: number;
  nHead: number;
  vocab?: number;
  nPositions?: number;
}

/** GPT-2 tensors (HF names, Conv1D layout) for a shape. */
export function gpt2Tensors(s: Gpt2Shape, dtype: SparseTensor['dtype']): SparseTensor[] {
  const D = s.nEmbd,
    V = s.vocab ?? 50257,
    P = s.nPositions ?? 1024;
  const t: SparseTensor[] = [
    { name: 'transformer.wte.weight', dtype, shape: [V, D] },
    { name: 'transformer.wpe.weight', dtype, shape: [P, D] },
  ];
  for (let l = 0; l < s.nLayer; l++) {
    const h = `transformer.h.${l}`;
    t.push(
      { name: `${h}.ln_1.weight`, dtype, shape: [D] },
      { name: `${h}.ln_1.bias`, dtype, shape: [D] },
      { name: `${h}.attn.c_attn.weight`, dtype, shape: [D, 3 * D] },
      { name: `${h}.attn.c_attn.bias`, dtype, shape: [3 * D] },
      { name: `${h}.attn.c_proj.weight`, dtype, shape: [D, D] },
      { name: `${h}.attn.c_proj.bias`, dtype, shape: [D] },
      { name: `${h}.ln_2.weight`, dtype, shape: [D] },
      { name: `${h}.ln_2.bias`, dtype, shape: [D] },
      { name: `${h}.mlp.c_fc.weight`, dtype, shape: [D, 4 * D] },
      { name: `${h}.mlp.c_fc.bias`, dtype, shape: [4 * D] },
      { name: `${h}.mlp.c_proj.weight`, dtype, shape: [4 * D, D] },
      { name: `${h}.mlp.c_proj.bias`, dtype, shape: [D] },
    );
  }
  t.push({ name: 'transformer.ln_f.weight', dtype, shape: [D] }, { name: 'transformer.ln_f.bias', dtype, shape: [D] });
  return t;
}

/**
 * A GPT-2 model folder of shape `s` with one sparse model.safetensors; config from `tokenizerFrom`'s
 * folder is not reused (its sizes differ), only its tokenizer files.
 */
export function writeSparseGpt2(
  root: string,
  name: string,
  s: Gpt2Shape,
  dtype: SparseTensor['dtype'],
  tokenizerFrom: string,
  tensors = gpt2Tensors(s, dtype),
): { dir: string; size: number; headerBytes: number; nParams: number } {
  const dir = path.join(root, name);
  mkdirSync(dir, { recursive: true });
  writeFileSync(
    path.join(dir, 'config.json'),
    JSON.stringify({
      model_type: 'gpt2',
      architectures: ['GPT2LMHeadModel'],
      vocab_size: s.vocab ?? 50257,
      n_positions: s.nPositions ?? 1024,
      n_ctx: s.nPositions ?? 1024,
      n_embd: s.nEmbd,
      n_layer: s.nLayer,
      n_head: s.nHead,
      activation_function: 'gelu_new',
      layer_norm_epsilon: 1e-5,
      tie_word_embeddings: true,
      bos_token_id: 50256,
      eos_token_id: 50256,
    }),
  );
  copyFileSync(path.join(tokenizerFrom, 'tokenizer.json'), path.join(dir, 'tokenizer.json'));
  const r = writeSparseSafetensors(path.join(dir, 'model.safetensors'), tensors);
  return { dir, ...r, nParams: tensors.reduce((a, t) => a + t.shape.reduce((x, y) => x * y, 1), 0) };
}
