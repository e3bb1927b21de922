/**
 * A GPT-2-small-shaped model with random weights, in the exact Hugging Face layout
 * (config.json, model.safetensors with HF GPT-2 tensor names and Conv1D [in, out] layout, a
 * byte-level BPE tokenizer.json + tokenizer_config.json), generated once and cached under
 * os.tmpdir() by a hash of its shape and of this generator's version.
 *
 * Tensors are streamed to disk one at a time (the 500 MB of weights are never all in memory).
 * The tokenizer is only there so the engine can load the model: 256 byte symbols, 50 000 merges
 * of two byte symbols, and <|endoftext|> as id 50256, as in GPT-2. The bench feeds random ids.
 */
import { createHash } from 'node:crypto';
import {
  closeSync,
  existsSync,
  mkdirSync,
  openSync,
  readFileSync,
  renameSync,
  rmSync,
  writeFileSync,
  writeSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import * as path from 'node:path';

export interface BenchShape {
  nLayers: number;
  dModel: number;
  nHeads: number;
  dMlp: number;
  vocab: number;
  nPositions: number;
  seed: number;
}

export const GPT2_SMALL: BenchShape = {
  nLayers: 12,
  dModel: 768,
  nHeads: 12,
  dMlp: 3072,
  vocab: 50257,
  nPositions: 1024,
  seed: 20240601,
};

/** bump when the files written here change */
const GENERATOR_VERSION = 1;

export interface BenchModel {
  dir: string;
  shape: BenchShape;
  /** bytes of tensor data in model.safetensors (what the weights weigh) */
  weightBytes: number;
  nParams: number;
  /** true when this call wrote the files */
  generated: boolean;
  generateMs: number;
}

interface TensorPlan {
  name: string;
  dims: number[];
  /** values ~ mean + std · N(0, 1) */
  std: number;
  mean: number;
}

function tensorPlan(s: BenchShape): TensorPlan[] {
  const { dModel: D, dMlp: M, vocab: V, nPositions: P } = s;
  const t: TensorPlan[] = [];
  const w = (name: string, dims: number[], std: number, mean = 0) => t.push({ name, dims, std, mean });
  // scales keep activations O(1) through 12 layers (no overflow, no denormals that would slow the CPU)
  w('transformer.wte.weight', [V, D], 0.1);
  w('transformer.wpe.weight', [P, D], 0.05);
  for (let l = 0; l < s.nLayers; l++) {
    const p = `transformer.h.${l}`;
    w(`${p}.ln_1.weight`, [D], 0.1, 1);
    w(`${p}.ln_1.bias`, [D], 0.02);
    w(`${p}.attn.c_attn.weight`, [D, 3 * D], 1 / Math.sqrt(D));
    w(`${p}.attn.c_attn.bias`, [3 * D], 0.02);
    w(`${p}.attn.c_proj.weight`, [D, D], 1 / Math.sqrt(D) / 4);
    w(`${p}.attn.c_proj.bias`, [D], 0.02);
    w(`${p}.ln_2.weight`, [D], 0.1, 1);
    w(`${p}.ln_2.bias`, [D], 0.02);
    w(`${p}.mlp.c_fc.weight`, [D, M], 1 / Math.sqrt(D));
    w(`${p}.mlp.c_fc.bias`, [M], 0.02);
    w(`${p}.mlp.c_proj.weight`, [M, D], 1 / Math.sqrt(M) / 4);
    w(`${p}.mlp.c_proj.bias`, [D], 0.02);
  }
  w('transformer.ln_f.weight', [D], 0.1, 1);
  w('transformer.ln_f.bias', [D], 0.02);
  return t; // tied embeddings: no lm_head.weight, as in GPT-2
}

function config(s: BenchShape): Record<string, unknown> {
  return {
    architectures: ['GPT2LMHeadModel'],
    model_type: 'gpt2',
    vocab_size: s.vocab,
    n_positions: s.nPositions,
    n_ctx: s.nPositions,
    n_embd: s.dModel,
    n_layer: s.nLayers,
    n_head: s.nHeads,
    n_inner: s.dMlp === 4 * s.dModel ? null : s.dMlp,
    activation_function: 'gelu_new',
    layer_norm_epsilon: 1e-5,
    resid_pdrop: 0.0,
    embd_pdrop: 0.0,
    attn_pdrop: 0.0,
    initializer_range: 0.02,
    scale_attn_weights: true,
    scale_attn_by_inverse_layer_idx: false,
    reorder_and_upcast_attn: false,
    tie_word_embeddings: true,
    use_cache: true,
    bos_token_id: s.vocab - 1,
    eos_token_id: s.vocab - 1,
    torch_dtype: 'float32',
  };
}

/** GPT-2's bytes-to-unicode table */
function bytesToUnicode(): string[] {
  const bs: number[] = [];
  for (let b = 0x21; b <= 0x7e; b++) bs.push(b);
  for (let b = 0xa1; b <= 0xac; b++) bs.push(b);
  for (let b = 0xae; b <= 0xff; b++) bs.push(b);
  const cs = bs.slice();
  let n = 0;
  for (let b = 0; b < 256; b++)
    if (!bs.includes(b)) {
      bs.push(b);
      cs.push(256 + n);
      n++;
    }
  const table: string[] = new Array(256);
  for (let i = 0; i < bs.length; i++) table[bs[i]] = String.fromCharCode(cs[i]);
  return table;
}

export function tokenizerFiles(s: BenchShape): {
  tokenizer: Record<string, unknown>;
  tokenizerConfig: Record<string, unknown>;
} {
  const eos = '<|endoftext|>';
  const table = bytesToUnicode();
  const vocab: Record<string, number> = {};
  for (let b = 0; b < 256; b++) vocab[table[b]] = b;
  const merges: string[] = [];
  let next = 256;
  const eosId = s.vocab - 1;
  // two-byte merges, printable ASCII pairs first so common text merges a little
  const order = [...Array(256).keys()].sort(
    (a, b) => Number(!(a >= 0x20 && a < 0x7f)) - Number(!(b >= 0x20 && b < 0x7f)) || a - b,
  );
  outer: for (const a of order) {
    for (const b of order) {
      if (next >= eosId) break outer;
      const tok = table[a] + table[b];
      merges.push(`${table[a]} ${table[b]}`);
      vocab[tok] = next++;
    }
  }
  vocab[eos] = eosId;
  const added = [
    { id: eosId, content: eos, single_word: false, lstrip: false, rstrip: false, normalized: true, special: true },
  ];
  const tokenizer = {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: added,
    normalizer: null,
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: {
      type: 'BPE',
      dropout: null,
      unk_token: null,
      continuing_subword_prefix: '',
      end_of_word_suffix: '',
      fuse_unk: false,
      byte_fallback: false,
      ignore_merges: false,
      vocab,
      merges,
    },
  };
  const tokenizerConfig = {
    add_bos_token: false,
    add_prefix_space: false,
    added_tokens_decoder: {
      [String(eosId)]: {
        content: eos,
        lstrip: false,
        normalized: true,
        rstrip: false,
        single_word: false,
        special: true,
      },
    },
    bos_token: eos,
    eos_token: eos,
    unk_token: eos,
    clean_up_tokenization_spaces: false,
    model_max_length: s.nPositions,
    tokenizer_class: 'GPT2Tokenizer',
  };
  return { tokenizer, tokenizerConfig };
}

/** mulberry32 uniforms in (0, 1) and Box–Muller normals, filled straight into a Float32Array */
function makeFiller(seed: number) {
  let a = seed >>> 0;
  const uniform = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return (((t ^ (t >>> 14)) >>> 0) + 0.5) / 4294967296;
  };
  return (out: Float32Array, mean: number, std: number) => {
    const n = out.length;
    let i = 0;
    while (i < n) {
      const r = Math.sqrt(-2 * Math.log(uniform()));
      const th = 2 * Math.PI * uniform();
      out[i++] = mean + std * r * Math.cos(th);
      if (i < n) out[i++] = mean + std * r * Math.sin(th);
    }
  };
}

function shapeHash(s: BenchShape): string {
  return createHash('sha256')
    .update(JSON.stringify({ s, v: GENERATOR_VERSION }))
    .digest('hex')
    .slice(0, 12);
}

function numel(d: number[]): number {
  return d.reduce((a, b) => a * b, 1);
}

export function benchModelDir(s: BenchShape = GPT2_SMALL): string {
  return path.join(tmpdir(), `loupe-bench-gpt2-${s.nLayers}x${s.dModel}-${shapeHash(s)}`);
}

/** The cached model folder, written first when missing (atomically: a temp folder renamed into place). */
export function ensureBenchModel(s: BenchShape = GPT2_SMALL, log: (m: string) => void = () => undefined): BenchModel {
  const dir = benchModelDir(s);
  const plan = tensorPlan(s);
  const nParams = plan.reduce((a, t) => a + numel(t.dims), 0);
  const weightBytes = nParams * 4;
  const done = path.join(dir, '.complete');
  if (existsSync(done)) {
    const meta = JSON.parse(readFileSync(done, 'utf8'));
    if (meta.weightBytes === weightBytes)
      return { dir, shape: s, weightBytes, nParams, generated: false, generateMs: 0 };
  }
  const t0 = performance.now();
  log(`generating a random GPT-2-small-shaped model (${(nParams / 1e6).toFixed(1)}M params) in ${dir} …`);
  const tmp = `${dir}.tmp-${process.pid}`;
  rmSync(tmp, { recursive: true, force: true });
  mkdirSync(tmp, { recursive: true });
  try {
    // header
    const header: Record<string, unknown> = { __metadata__: { format: 'pt' } };
    let off = 0;
    for (const t of plan) {
      const len = numel(t.dims) * 4;
      header[t.name] = { dtype: 'F32', shape: t.dims, data_offsets: [off, off + len] };
      off += len;
    }
    let json = JSON.stringify(header);
    while ((8 + Buffer.byteLength(json)) % 8 !== 0) json += ' ';
    const hbytes = Buffer.from(json, 'utf8');
    const lenBuf = Buffer.alloc(8);
    lenBuf.writeBigUInt64LE(BigInt(hbytes.length));
    const fd = openSync(path.join(tmp, 'model.safetensors'), 'w');
    try {
      writeSync(fd, lenBuf);
      writeSync(fd, hbytes);
      const fill = makeFiller(s.seed);
      for (const t of plan) {
        const data = new Float32Array(numel(t.dims));
        fill(data, t.mean, t.std);
        const bytes = new Uint8Array(data.buffer); // little-endian on every platform Node runs on here
        let w = 0;
        while (w < bytes.length) w += writeSync(fd, bytes, w, bytes.length - w);
      }
    } finally {
      closeSync(fd);
    }
    writeFileSync(path.join(tmp, 'config.json'), JSON.stringify(config(s), null, 2));
    const { tokenizer, tokenizerConfig } = tokenizerFiles(s);
    writeFileSync(path.join(tmp, 'tokenizer.json'), JSON.stringify(tokenizer));
    writeFileSync(path.join(tmp, 'tokenizer_config.json'), JSON.stringify(tokenizerConfig, null, 2));
    writeFileSync(
      path.join(tmp, 'generation_config.json'),
      JSON.stringify({ bos_token_id: s.vocab - 1, eos_token_id: s.vocab - 1 }, null, 2),
    );
    writeFileSync(
      path.join(tmp, '.complete'),
      JSON.stringify({ weightBytes, nParams, shape: s, version: GENERATOR_VERSION }),
    );
    rmSync(dir, { recursive: true, force: true });
    renameSync(tmp, dir);
  } catch (e) {
    rmSync(tmp, { recursive: true, force: true });
    throw e;
  }
  const generateMs = performance.now() - t0;
  log(`  written in ${(generateMs / 1000).toFixed(1)} s`);
  return { dir, shape: s, weightBytes, nParams, generated: true, generateMs };
}

/** deterministic random token ids in [0, hi) (mulberry32) */
export function randomIds(n: number, hi: number, seed: number): number[] {
  let a = seed >>> 0;
  const r = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return Array.from({ length: n }, () => Math.floor(r() * hi));
}
