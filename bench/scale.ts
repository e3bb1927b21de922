/**
 * `npm run bench:scale [shape …] [--backends node,wasm] [--weights stored,f32,q8] [--runs nocache,cold,again] [--keep]`
 *
 * Random-weight F16 models in the Hugging Face layout (config.json, one model.safetensors,
 * tokenizer.json) at real shapes, generated under $TMPDIR/loupe-scale and deleted afterwards
 * unless --keep. Per shape, backend and weight precision, in a fresh Node process each:
 *   ready_ms      loadModelNode → session ready (cold: first process on freshly written files;
 *                 again: a second process, the files in the OS page cache; on node with f32
                 weights from 16-bit files it reads the optimized model the cold run saved,
                 src/node/optimized-cache.ts)
 *                 (q8: the quantised weights the cold run kept, src/node/q8-cache.ts; the run
 *                 `nocache` quantises in memory with LOUPE_Q8_CACHE=0, as before the cache)
 *   session_ms    of ready_ms, onnxruntime's session creation (bench/scale-child.ts)
 *   trace_ms      the first `trace` operation (forward + DLA) on a 16-token prompt
 *   peak / weights  the process's peak RSS (VmHWM) over the bytes the session holds the weights in
 *                   (ModelInfo.weight_bytes), Node's own ~90 MB included
 *   WASM heap     onnxruntime-web's heap at the end (it only grows: its peak), wasm rows only
 * A run that fails (e.g. TOO_LARGE) prints its error code instead of numbers.
 */
import { spawnSync } from 'node:child_process';
import { closeSync, existsSync, mkdirSync, openSync, rmSync, writeFileSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import * as path from 'node:path';
import { mdTable, startResults } from './results';
import { tokenizerFiles } from './model-gen';
import { useScratchCacheDir } from '../tests/helpers/scratch-cache';

export interface Shape {
  name: string;
  family: 'llama' | 'qwen2' | 'gemma2' | 'gemma3_text' | 'gpt2' | 'gpt_neox';
  D: number;
  L: number;
  H: number;
  Hkv: number;
  Dh: number;
  M: number;
  V: number;
  tied: boolean;
}

export const SHAPES: Shape[] = [
  { name: 'gpt2-small', family: 'gpt2', D: 768, L: 12, H: 12, Hkv: 12, Dh: 64, M: 3072, V: 50257, tied: true },
  { name: 'pythia-410m', family: 'gpt_neox', D: 1024, L: 24, H: 16, Hkv: 16, Dh: 64, M: 4096, V: 50304, tied: false },
  { name: 'qwen2.5-0.5b', family: 'qwen2', D: 896, L: 24, H: 14, Hkv: 2, Dh: 64, M: 4864, V: 151936, tied: true },
  { name: 'llama-3.2-1b', family: 'llama', D: 2048, L: 16, H: 32, Hkv: 8, Dh: 64, M: 8192, V: 128256, tied: true },
  { name: 'gemma-2-2b', family: 'gemma2', D: 2304, L: 26, H: 8, Hkv: 4, Dh: 256, M: 9216, V: 256000, tied: true },
  { name: 'gemma-3-1b', family: 'gemma3_text', D: 1152, L: 26, H: 4, Hkv: 1, Dh: 256, M: 6912, V: 262144, tied: true },
  { name: 'gemma-3-270m', family: 'gemma3_text', D: 640, L: 18, H: 4, Hkv: 1, Dh: 256, M: 2048, V: 262144, tied: true },
];

function config(s: Shape): Record<string, unknown> {
  if (s.family === 'gpt2') {
    return {
      architectures: ['GPT2LMHeadModel'],
      model_type: 'gpt2',
      n_embd: s.D,
      n_layer: s.L,
      n_head: s.H,
      n_inner: s.M,
      vocab_size: s.V,
      n_positions: 1024,
      n_ctx: 1024,
      layer_norm_epsilon: 1e-5,
      activation_function: 'gelu_new',
      bos_token_id: s.V - 1,
      eos_token_id: s.V - 1,
      torch_dtype: 'float16',
    };
  }
  if (s.family === 'gpt_neox') {
    return {
      architectures: ['GPTNeoXForCausalLM'],
      model_type: 'gpt_neox',
      hidden_size: s.D,
      num_hidden_layers: s.L,
      num_attention_heads: s.H,
      intermediate_size: s.M,
      vocab_size: s.V,
      max_position_embeddings: 2048,
      layer_norm_eps: 1e-5,
      rotary_pct: 0.25,
      rotary_emb_base: 10000,
      hidden_act: 'gelu',
      use_parallel_residual: true,
      tie_word_embeddings: false,
      bos_token_id: 0,
      eos_token_id: 0,
      torch_dtype: 'float16',
    };
  }
  const base = {
    architectures: [
      s.family === 'llama'
        ? 'LlamaForCausalLM'
        : s.family === 'qwen2'
          ? 'Qwen2ForCausalLM'
          : s.family === 'gemma3_text'
            ? 'Gemma3ForCausalLM'
            : 'Gemma2ForCausalLM',
    ],
    model_type: s.family,
    hidden_size: s.D,
    num_hidden_layers: s.L,
    num_attention_heads: s.H,
    num_key_value_heads: s.Hkv,
    head_dim: s.Dh,
    intermediate_size: s.M,
    vocab_size: s.V,
    max_position_embeddings: 2048,
    rms_norm_eps: 1e-6,
    rope_theta: s.family === 'qwen2' ? 1e6 : 500000,
    tie_word_embeddings: s.tied,
    torch_dtype: 'float16',
    bos_token_id: s.V - 1,
    eos_token_id: s.V - 1,
  };
  if (s.family === 'llama')
    return {
      ...base,
      hidden_act: 'silu',
      rope_scaling: {
        rope_type: 'llama3',
        factor: 32,
        low_freq_factor: 1,
        high_freq_factor: 4,
        original_max_position_embeddings: 8192,
      },
    };
  if (s.family === 'qwen2') return { ...base, hidden_act: 'silu', use_sliding_window: false };
  // google/gemma-3-1b-pt's config.json: 5 local layers (window 512, rope base 1e4) to 1 global (1e6)
  if (s.family === 'gemma3_text')
    return {
      ...base,
      rope_theta: 1e6,
      rope_local_base_freq: 10000,
      hidden_activation: 'gelu_pytorch_tanh',
      query_pre_attn_scalar: 256,
      sliding_window: 512,
      sliding_window_pattern: 6,
      attn_logit_softcapping: null,
      final_logit_softcapping: null,
      rope_scaling: null,
    };
  return {
    ...base,
    hidden_activation: 'gelu_pytorch_tanh',
    query_pre_attn_scalar: 256,
    attn_logit_softcapping: 50,
    final_logit_softcapping: 30,
    sliding_window: 4096,
  };
}

function tensors(s: Shape): { name: string; dims: number[]; norm?: boolean }[] {
  const t: { name: string; dims: number[]; norm?: boolean }[] = [];
  const { D, H, Hkv, Dh, M, V } = s;
  if (s.family === 'gpt2') {
    // HF GPT-2: Conv1D weights [in, out], tied unembedding
    t.push({ name: 'transformer.wte.weight', dims: [V, D] }, { name: 'transformer.wpe.weight', dims: [1024, D] });
    for (let l = 0; l < s.L; l++) {
      const p = `transformer.h.${l}`;
      t.push({ name: `${p}.ln_1.weight`, dims: [D], norm: true }, { name: `${p}.ln_1.bias`, dims: [D] });
      t.push({ name: `${p}.attn.c_attn.weight`, dims: [D, 3 * D] }, { name: `${p}.attn.c_attn.bias`, dims: [3 * D] });
      t.push({ name: `${p}.attn.c_proj.weight`, dims: [D, D] }, { name: `${p}.attn.c_proj.bias`, dims: [D] });
      t.push({ name: `${p}.ln_2.weight`, dims: [D], norm: true }, { name: `${p}.ln_2.bias`, dims: [D] });
      t.push({ name: `${p}.mlp.c_fc.weight`, dims: [D, M] }, { name: `${p}.mlp.c_fc.bias`, dims: [M] });
      t.push({ name: `${p}.mlp.c_proj.weight`, dims: [M, D] }, { name: `${p}.mlp.c_proj.bias`, dims: [D] });
    }
    t.push({ name: 'transformer.ln_f.weight', dims: [D], norm: true }, { name: 'transformer.ln_f.bias', dims: [D] });
    return t;
  }
  if (s.family === 'gpt_neox') {
    t.push({ name: 'gpt_neox.embed_in.weight', dims: [V, D] });
    for (let l = 0; l < s.L; l++) {
      const p = `gpt_neox.layers.${l}`;
      for (const n of ['input_layernorm', 'post_attention_layernorm'])
        t.push({ name: `${p}.${n}.weight`, dims: [D], norm: true }, { name: `${p}.${n}.bias`, dims: [D] });
      t.push(
        { name: `${p}.attention.query_key_value.weight`, dims: [3 * D, D] },
        { name: `${p}.attention.query_key_value.bias`, dims: [3 * D] },
      );
      t.push({ name: `${p}.attention.dense.weight`, dims: [D, D] }, { name: `${p}.attention.dense.bias`, dims: [D] });
      t.push(
        { name: `${p}.mlp.dense_h_to_4h.weight`, dims: [M, D] },
        { name: `${p}.mlp.dense_h_to_4h.bias`, dims: [M] },
      );
      t.push(
        { name: `${p}.mlp.dense_4h_to_h.weight`, dims: [D, M] },
        { name: `${p}.mlp.dense_4h_to_h.bias`, dims: [D] },
      );
    }
    t.push(
      { name: 'gpt_neox.final_layer_norm.weight', dims: [D], norm: true },
      { name: 'gpt_neox.final_layer_norm.bias', dims: [D] },
    );
    t.push({ name: 'embed_out.weight', dims: [V, D] });
    return t;
  }
  t.push({ name: 'model.embed_tokens.weight', dims: [V, D] });
  for (let l = 0; l < s.L; l++) {
    const p = `model.layers.${l}`;
    t.push({ name: `${p}.input_layernorm.weight`, dims: [D], norm: true });
    t.push({ name: `${p}.self_attn.q_proj.weight`, dims: [H * Dh, D] });
    t.push({ name: `${p}.self_attn.k_proj.weight`, dims: [Hkv * Dh, D] });
    t.push({ name: `${p}.self_attn.v_proj.weight`, dims: [Hkv * Dh, D] });
    if (s.family === 'qwen2')
      for (const [k, n] of [
        ['q', H],
        ['k', Hkv],
        ['v', Hkv],
      ] as const)
        t.push({ name: `${p}.self_attn.${k}_proj.bias`, dims: [n * Dh] });
    if (s.family === 'gemma3_text') {
      t.push({ name: `${p}.self_attn.q_norm.weight`, dims: [Dh], norm: true });
      t.push({ name: `${p}.self_attn.k_norm.weight`, dims: [Dh], norm: true });
    }
    t.push({ name: `${p}.self_attn.o_proj.weight`, dims: [D, H * Dh] });
    t.push({ name: `${p}.post_attention_layernorm.weight`, dims: [D], norm: true });
    if (s.family === 'gemma2' || s.family === 'gemma3_text') {
      t.push({ name: `${p}.pre_feedforward_layernorm.weight`, dims: [D], norm: true });
      t.push({ name: `${p}.post_feedforward_layernorm.weight`, dims: [D], norm: true });
    }
    t.push({ name: `${p}.mlp.gate_proj.weight`, dims: [M, D] });
    t.push({ name: `${p}.mlp.up_proj.weight`, dims: [M, D] });
    t.push({ name: `${p}.mlp.down_proj.weight`, dims: [D, M] });
  }
  t.push({ name: 'model.norm.weight', dims: [D], norm: true });
  if (!s.tied) t.push({ name: 'lm_head.weight', dims: [V, D] }); // llama-3.1-8b's own unembedding
  return t;
}

/** A table of f16 bit patterns of N(0, 0.02) values; tensors are filled by copying random runs of it (fast, and no denormals). */
function f16Table(): Uint16Array {
  const n = 1 << 16;
  const out = new Uint16Array(n);
  let a = 12345;
  const u = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return (((t ^ (t >>> 14)) >>> 0) + 0.5) / 4294967296;
  };
  const f32 = new Float32Array(1),
    u32 = new Uint32Array(f32.buffer);
  for (let i = 0; i < n; i++) {
    f32[0] = 0.02 * Math.sqrt(-2 * Math.log(u())) * Math.cos(2 * Math.PI * u());
    const x = u32[0],
      sign = (x >>> 16) & 0x8000,
      e = ((x >>> 23) & 0xff) - 127 + 15,
      m = (x >>> 13) & 0x3ff;
    out[i] = e <= 0 ? sign : sign | (e << 10) | m; // tiny values flush to ±0
  }
  return out;
}

export function generate(s: Shape, dir: string): number {
  mkdirSync(dir, { recursive: true });
  writeFileSync(path.join(dir, 'config.json'), JSON.stringify(config(s)));
  const { tokenizer, tokenizerConfig } = tokenizerFiles({
    nLayers: s.L,
    dModel: s.D,
    nHeads: s.H,
    dMlp: s.M,
    vocab: s.V,
    nPositions: 2048,
    seed: 1,
  });
  writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(tokenizer));
  writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(tokenizerConfig));
  const list = tensors(s);
  const header: Record<string, unknown> = { __metadata__: { format: 'pt' } };
  let off = 0;
  for (const t of list) {
    const bytes = t.dims.reduce((a, b) => a * b, 1) * 2;
    header[t.name] = { dtype: 'F16', shape: t.dims, data_offsets: [off, off + bytes] };
    off += bytes;
  }
  let json = JSON.stringify(header);
  json += ' '.repeat((8 - ((8 + json.length) % 8)) % 8);
  const fd = openSync(path.join(dir, 'model.safetensors'), 'w');
  try {
    const len = Buffer.alloc(8);
    len.writeBigUInt64LE(BigInt(json.length));
    writeSync(fd, len);
    writeSync(fd, Buffer.from(json));
    const table = f16Table();
    const chunk = new Uint16Array(1 << 22);
    let seed = 7;
    for (const t of list) {
      let n = t.dims.reduce((a, b) => a * b, 1);
      while (n > 0) {
        const k = Math.min(n, chunk.length);
        if (t.norm)
          chunk.fill(s.family === 'gemma2' || s.family === 'gemma3_text' ? 0 : 0x3c00, 0, k); // gemma stores w − 1
        else
          for (let i = 0; i < k; i += 4096) {
            seed = (seed * 1103515245 + 12345) >>> 0;
            const st = seed % (table.length - 4096);
            chunk.set(table.subarray(st, st + Math.min(4096, k - i)), i);
          }
        writeSync(fd, new Uint8Array(chunk.buffer, 0, k * 2));
        n -= k;
      }
    }
  } finally {
    closeSync(fd);
  }
  return off;
}

interface Row {
  shape: string;
  backend: string;
  weights: string;
  run: string;
  ready_ms?: number;
  session_ms?: number;
  weights_reason?: string;
  trace_ms?: number;
  peak_bytes?: number;
  weight_bytes?: number;
  heap_bytes?: number;
  error?: string;
}

/** one bench/scale-child.ts process; `nocache` turns the q8 cache off; `loadOnly`: no trace */
export function child(
  dir: string,
  backend: string,
  weights: string,
  run: string,
  loadOnly = false,
): Omit<Row, 'shape' | 'backend' | 'weights' | 'run'> {
  const env = run === 'nocache' ? { ...process.env, LOUPE_Q8_CACHE: '0' } : process.env;
  const r = spawnSync(
    process.execPath,
    [
      '--import',
      'tsx',
      path.join(import.meta.dirname, 'scale-child.ts'),
      dir,
      backend,
      weights,
      ...(loadOnly ? ['load-only'] : []),
    ],
    { encoding: 'utf8', maxBuffer: 1 << 26, env },
  );
  const line = r.stdout
    .trim()
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .pop();
  if (!line) return { error: `exit ${r.status}: ${(r.stderr || '').trim().split('\n').slice(-3).join(' | ')}` };
  return JSON.parse(line);
}

async function main() {
  // the bench's generated models are temporary, so is what Loupe caches for them (optimized
  // sessions, documents): a scratch LOUPE_CACHE_DIR, shared by its child processes, removed at exit
  if (!process.env.LOUPE_CACHE_DIR) process.on('exit', useScratchCacheDir());
  const record = startResults(
    'scale',
    'Big models: load, first trace and peak memory of real shapes (`npm run bench:scale`)',
  );
  const args = process.argv.slice(2);
  const opt = (k: string, d: string) => {
    const i = args.indexOf(`--${k}`);
    return i >= 0 ? args[i + 1] : d;
  };
  const keep = args.includes('--keep');
  const names = args.filter(
    (a, i) => !a.startsWith('--') && !(i > 0 && args[i - 1].startsWith('--') && args[i - 1] !== '--keep'),
  );
  const shapes = names.length ? SHAPES.filter((s) => names.includes(s.name)) : SHAPES;
  const backends = opt('backends', 'node,wasm').split(',');
  const precisions = opt('weights', 'stored,f32').split(',');
  const runs = opt('runs', 'cold,again').split(',');
  const root = path.join(tmpdir(), 'loupe-scale');
  const rows: Row[] = [];
  for (const s of shapes) {
    const dir = path.join(root, s.name);
    const t0 = Date.now();
    const bytes = existsSync(path.join(dir, 'model.safetensors')) ? -1 : generate(s, dir);
    console.error(
      `${s.name}: ${bytes < 0 ? 'reused' : `generated ${(bytes / 1e9).toFixed(2)} GB in ${((Date.now() - t0) / 1000).toFixed(0)} s`}`,
    );
    try {
      for (const backend of backends)
        for (const weights of precisions)
          for (const run of runs) {
            const r: Row = { shape: s.name, backend, weights, run, ...child(dir, backend, weights, run) };
            rows.push(r);
            console.error(JSON.stringify(r));
            if (r.error) break;
          }
    } finally {
      if (!keep) rmSync(dir, { recursive: true, force: true });
    }
  }
  const gb = (b?: number) => (b === undefined ? '–' : `${(b / 1e9).toFixed(2)} GB`);
  const head = [
    'shape',
    'backend',
    'weights',
    'run',
    'ready',
    'session',
    'first trace',
    'peak RSS',
    'weights held',
    'peak / weights',
    'WASM heap',
  ];
  const table = rows.map((r) =>
    r.error
      ? [r.shape, r.backend, r.weights, r.run, r.error, '', '', gb(r.peak_bytes), '', '', gb(r.heap_bytes)]
      : [
          r.shape,
          r.backend,
          r.weights,
          r.run,
          `${(r.ready_ms! / 1000).toFixed(1)} s`,
          `${(r.session_ms! / 1000).toFixed(1)} s`,
          `${(r.trace_ms! / 1000).toFixed(2)} s`,
          gb(r.peak_bytes),
          gb(r.weight_bytes),
          `${(r.peak_bytes! / r.weight_bytes!).toFixed(2)}×`,
          gb(r.heap_bytes),
        ],
  );
  console.log(mdTable({ head, rows: table }));
  record.save([{ head, rows: table }], [], rows);
}

// run as a script only (a bundle of bench/gpu.ts holds this module, its import.meta being the bundle's)
if (
  process.argv[1] &&
  import.meta.filename === path.resolve(process.argv[1]) &&
  /scale\.ts$/.test(import.meta.filename)
)
  void main();
