/**
 * Transcoder sets: sparse feature dictionaries that stand in for every MLP of a model, read in the
 * layouts the field publishes them in, described from their safetensors headers alone (so a set is
 * judged before its weights are fetched), and checked against a model.
 *
 * Layouts (circuit-tracer 4bb8c0e, `transcoder/`, `utils/caching.py`, `utils/hf_utils.py`):
 *  - circuit-tracer PLT: config.yaml `model_kind: transcoder_set`, `layer_{i}.safetensors` (or the
 *    config's `transcoders:` list) with W_enc [F,d], W_dec [F,d], b_enc [F], b_dec [d], optional
 *    `activation_function.threshold` [F] (JumpReLU) and W_skip [d,d] (skip(x) = x·W_skipᵀ).
 *  - circuit-tracer CLT: `model_kind: cross_layer_transcoder`, W_enc_{i}.safetensors {W_enc_i [F,d],
 *    b_enc_i, b_dec_i, threshold_i} and W_dec_{i}.safetensors {W_dec_i [F, L−i, d]}: a layer-i
 *    feature writes to the MLP outputs of layers i … L−1. (circuit-tracer's local loader reads no skip.)
 *  - Gemma Scope 2 (the files a config's `transcoders:` list names): w_enc [d,F], w_dec [F,d]
 *    (CLT: [F, L, d], of which rows i… are used), b_enc, b_dec, threshold, optional
 *    affine_skip_connection [d,d] with skip(x) = x·affine (cross_layer_transcoder.py:449-548,
 *    single_layer_transcoder.py:495-561).
 *  - SAELens transcoders, one folder per layer (transcoder_path with `{layer}`): cfg.json
 *    (architecture transcoder | skip_transcoder | jumprelu_transcoder, hook_name, d_in, d_out, d_sae)
 *    + sae_weights.safetensors {W_enc [d_in, d_sae], W_dec [d_sae, d_out], b_enc, b_dec [d_out],
 *    threshold?, W_skip [d_out, d_in]?} (sae_lens/saes/transcoder.py).
 * Activations: JumpReLU a = x·[x > θ] (strict; activation_functions.py:14; SAELens's is relu(x)·[x > θ]),
 * ReLU, or TopK(k) a = x·[x among the k largest] (config `activation: topk`, `k`).
 *
 * Feature-input hooks (where the encoder and the skip read, per block; TransformerLens names):
 *   hook_resid_mid       the residual stream before ln2 (LayerNorm and RMSNorm alike)
 *   mlp.hook_in          ln2's output, the MLP's input: LayerNorm (x − x̄)/s·w + b, RMSNorm x/s·w
 *   ln2.hook_normalized  TL's normalized value: LayerNorm after w and b (= mlp.hook_in), RMSNorm x/s BEFORE w
 * Feature-output hooks: hook_mlp_out or mlp.hook_out (the same tensor on models without post-norms).
 */
import { LoupeError } from './errors';
import type { ModelSpec } from './spec';
import type { TensorEntry } from './safetensors-types';

export type TranscoderKind = 'plt' | 'clt';
export type TranscoderLayout = 'circuit_tracer' | 'gemma_scope_2' | 'saelens';
export const FEATURE_INPUT_HOOKS = ['mlp.hook_in', 'hook_resid_mid', 'ln2.hook_normalized'] as const;
export const FEATURE_OUTPUT_HOOKS = ['hook_mlp_out', 'mlp.hook_out'] as const;
export type FeatureInputHook = (typeof FEATURE_INPUT_HOOKS)[number];
export type FeatureOutputHook = (typeof FEATURE_OUTPUT_HOOKS)[number];

export interface TranscoderInfo {
  /** the id the model knows the set by */
  id: string;
  kind: TranscoderKind;
  layout: TranscoderLayout;
  n_layers: number;
  d_model: number;
  /** features per layer */
  d_transcoder: number;
  activation: 'jumprelu' | 'relu' | 'topk';
  k: number | null;
  /** SAELens's JumpReLU is relu(x)·[x > θ]; circuit-tracer's is x·[x > θ] */
  relu_before_threshold: boolean;
  skip: boolean;
  input_hook: FeatureInputHook;
  output_hook: FeatureOutputHook;
  /** circuit-tracer's scan: what Neuronpedia knows the set by (config `scan`, else the source) */
  scan: string;
  /** stored dtypes of the weights */
  dtype: string;
  /** bytes of all the set's weights as stored */
  weight_bytes: number;
}

export interface TranscoderLayerSpec {
  /** [F, d] ('F_d') or [d, F] ('d_F') */
  W_enc: TensorEntry;
  encLayout: 'F_d' | 'd_F';
  b_enc: TensorEntry;
  b_dec: TensorEntry;
  threshold?: TensorEntry;
  /** PLT [F, d]; CLT [F, n, d] whose second axis starts at output layer `decFirst` */
  W_dec: TensorEntry;
  decFirst: number;
  /** skip(x) = x·W_skipᵀ ('x_Wt') or x·W_skip ('x_W') */
  W_skip?: TensorEntry;
  skipLayout: 'x_Wt' | 'x_W';
}

export interface TranscoderSpec {
  info: TranscoderInfo;
  layers: TranscoderLayerSpec[];
}

/** What a loader learned before any weight byte: the config and every file's header, per layer. */
export interface TranscoderHeaders {
  /** config.yaml (circuit-tracer layouts) or the first layer's cfg.json (SAELens), parsed */
  config: Record<string, unknown>;
  layout: TranscoderLayout;
  /** model_kind, from the config (SAELens: plt) */
  kind: TranscoderKind;
  /** per layer, the tensors of its file(s), by their names in the file (already keyed to the loader's file names) */
  layers: Map<string, TensorEntry>[];
  /** per layer, SAELens cfg.json (hooks, architecture) */
  layerConfigs?: Record<string, unknown>[];
  scan: string;
}

// ------------------------------------------------------------------ config.yaml

/**
 * config.yaml as circuit-tracer writes it: flat `key: value` scalars and block lists (`key:` then
 * `- item` lines), comments and quotes. A nested mapping under a key reads as null (no key
 * Loupe uses is one); flow collections (`[a, b]`, `{a: b}`) are kept as their text.
 */
export function parseTranscoderYaml(text: string, file = 'config.yaml'): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  const lines = text.replace(/^\uFEFF/, '').split(/\r?\n/);
  let listKey: string | null = null;
  const scalar = (raw: string, line: number): unknown => {
    let v = raw.trim();
    if (v.startsWith('"') || v.startsWith("'")) {
      const q = v[0];
      const end = v.indexOf(q, 1);
      if (end < 0) throw bad(`${file} line ${line}: unterminated quote`);
      return v.slice(1, end);
    }
    v = v.replace(/\s+#.*$/, '').trim();
    if (v === '' || v === '~' || v === 'null') return null;
    if (v === 'true' || v === 'false') return v === 'true';
    if (/^[-+]?(\d+\.?\d*([eE][-+]?\d+)?|\.\d+)$/.test(v)) return Number(v);
    return v;
  };
  lines.forEach((raw, i) => {
    const line = i + 1;
    const text_ = raw.replace(/\t/g, '  ');
    if (/^\s*(#.*)?$/.test(text_)) return;
    if (text_ === '---' || text_ === '...') return;
    const indent = text_.length - text_.trimStart().length;
    const t = text_.trim();
    if (t.startsWith('- ') || t === '-') {
      if (listKey === null) throw bad(`${file} line ${line}: a list item outside a list`);
      (out[listKey] as unknown[]).push(scalar(t.slice(1), line));
      return;
    }
    if (indent > 0) {
      if (listKey !== null && Array.isArray(out[listKey]) && (out[listKey] as unknown[]).length === 0)
        out[listKey] = null;
      listKey = null;
      return; // inside a nested mapping
    }
    const m = /^([^:#]+?)\s*:(?:\s+(.*))?$/.exec(t);
    if (!m) throw bad(`${file} line ${line}: expected "key: value"`);
    const key = m[1].trim().replace(/^["']|["']$/g, '');
    if (m[2] === undefined || m[2].trim() === '' || m[2].trim().startsWith('#')) {
      out[key] = [];
      listKey = key;
    } else {
      out[key] = scalar(m[2], line);
      listKey = null;
    }
  });
  // a key with nothing under it is null, not an empty list
  for (const [k, v] of Object.entries(out)) if (Array.isArray(v) && v.length === 0) out[k] = null;
  return out;
}

function bad(msg: string, hint?: string): LoupeError {
  return new LoupeError(
    'BAD_CONFIG',
    msg,
    hint ??
      "A transcoder set is a config.yaml in circuit-tracer's layout (model_kind, feature_input_hook, feature_output_hook) beside its safetensors files.",
  );
}

export const mismatch = (msg: string, hint?: string, details?: unknown) =>
  new LoupeError(
    'TRANSCODER_MISMATCH',
    msg,
    hint ?? 'Pick the transcoder set trained on this model (its config.yaml model_name, or cfg.json model_name).',
    details,
  );

// ------------------------------------------------------------------ which files

/** circuit-tracer's own hook names inside a block, from what a config gives (a full TL name is accepted) */
export function blockHook(name: unknown, what: string): string {
  if (typeof name !== 'string' || name.trim() === '') throw bad(`The transcoder config has no ${what}.`);
  return name.trim().replace(/^blocks\.\d+\./, '');
}

/** a config's `transcoders:` entry → where it lives: an hf:// file of another repository, or a path in this one */
export function parseTranscoderPath(entry: string): { repo?: string; revision?: string; file: string } {
  const m = /^hf:\/\/([^/]+\/[^/?]+)\/([^?]+)(?:\?(.*))?$/.exec(entry.trim());
  if (m) {
    const revision = new URLSearchParams(m[3] ?? '').get('revision') ?? undefined;
    return { repo: m[1], ...(revision ? { revision } : {}), file: m[2] };
  }
  if (/^[a-z]+:\/\//i.test(entry) || entry.split('/').includes('..'))
    throw bad(
      `The transcoder file ${JSON.stringify(entry)} is neither an hf:// file nor a path inside the set's folder.`,
    );
  return { file: entry.replace(/^\.?\/+/, '') };
}

/**
 * The files of each layer for a circuit-tracer config (relative to the set's folder, or hf://
 * entries of the `transcoders:` list). Without a list, one file per model layer is named.
 */
export function transcoderFiles(
  config: Record<string, unknown>,
  nLayers: number,
): { kind: TranscoderKind; files: string[][] } {
  const kind = config.model_kind;
  if (kind !== 'transcoder_set' && kind !== 'cross_layer_transcoder')
    throw bad(
      `config.yaml model_kind is ${JSON.stringify(kind ?? null)}; Loupe reads transcoder_set and cross_layer_transcoder.`,
    );
  const list = config.transcoders;
  if (list !== undefined && list !== null) {
    if (!Array.isArray(list) || list.some((x) => typeof x !== 'string') || list.length === 0)
      throw bad('config.yaml transcoders must be a list of file paths (one per layer).');
    return { kind: kind === 'transcoder_set' ? 'plt' : 'clt', files: (list as string[]).map((f) => [f]) };
  }
  const L = Array.from({ length: nLayers }, (_, i) => i);
  return kind === 'transcoder_set'
    ? { kind: 'plt', files: L.map((i) => [`layer_${i}.safetensors`]) }
    : { kind: 'clt', files: L.map((i) => [`W_enc_${i}.safetensors`, `W_dec_${i}.safetensors`]) };
}

// ------------------------------------------------------------------ the description

const FLOAT = new Set(['F32', 'F16', 'BF16']);

/** Describe a set from its headers (no weight bytes): shapes checked, layout and activation decided. */
export function describeTranscoders(h: TranscoderHeaders, id: string): TranscoderSpec {
  const L = h.layers.length;
  if (L === 0) throw bad('The transcoder set has no layers.');
  const layers: TranscoderLayerSpec[] = [];
  let F = -1,
    D = -1;
  const dtypes = new Set<string>();
  let bytes = 0;
  const take = (tensors: Map<string, TensorEntry>, l: number, names: string[], required = true) => {
    for (const n of names) {
      const t = tensors.get(n);
      if (t) {
        if (!FLOAT.has(t.dtype))
          throw new LoupeError(
            'SAFETENSORS_UNKNOWN_DTYPE',
            `Transcoder layer ${l}: ${n} has dtype ${t.dtype}; Loupe reads F32, F16 and BF16.`,
          );
        dtypes.add(t.dtype);
        bytes += t.byteLength;
        return t;
      }
    }
    if (!required) return undefined;
    throw new LoupeError(
      'MISSING_TENSOR',
      `Transcoder layer ${l} (${[...new Set([...tensors.values()].map((t) => t.file))].join(', ') || 'no file'}) has no ${names.join(' / ')}.`,
      `The ${h.layout} layout stores ${h.kind === 'clt' ? 'W_enc_i, b_enc_i, b_dec_i (threshold_i) and W_dec_i' : 'W_enc, W_dec, b_enc, b_dec'} per layer.`,
      { layer: l, tensor: names[0] },
    );
  };
  const shape = (t: TensorEntry, want: number[], l: number) => {
    if (t.shape.length !== want.length || t.shape.some((d, i) => want[i] >= 0 && d !== want[i]))
      throw new LoupeError(
        'BAD_TENSOR_SHAPE',
        `Transcoder layer ${l}: ${t.name} has shape [${t.shape}], expected [${want.map((d) => (d < 0 ? '?' : d))}].`,
        'The file does not match its layout (or the layers disagree on d_model / width).',
        { layer: l, tensor: t.name },
      );
  };
  const ls = h.layerConfigs;
  for (let l = 0; l < L; l++) {
    const ts = h.layers[l];
    const gs2 = h.layout === 'gemma_scope_2';
    const sl = h.layout === 'saelens';
    const suffix = h.layout === 'circuit_tracer' && h.kind === 'clt' ? `_${l}` : '';
    const W_enc = take(ts, l, [gs2 ? 'w_enc' : `W_enc${suffix}`])!;
    const encLayout: 'F_d' | 'd_F' = gs2 || sl ? 'd_F' : 'F_d';
    if (W_enc.shape.length !== 2) shape(W_enc, [-1, -1], l);
    const [f, d] = encLayout === 'F_d' ? W_enc.shape : [W_enc.shape[1], W_enc.shape[0]];
    if (l === 0) {
      F = f;
      D = d;
    }
    shape(W_enc, encLayout === 'F_d' ? [F, D] : [D, F], l);
    const b_enc = take(ts, l, [`b_enc${suffix}`])!;
    shape(b_enc, [F], l);
    const b_dec = take(ts, l, [`b_dec${suffix}`])!;
    shape(b_dec, [D], l);
    const threshold = take(
      ts,
      l,
      gs2 || sl ? ['threshold'] : [`activation_function.threshold`, `threshold${suffix}`],
      false,
    );
    if (threshold) shape(threshold, [F], l);
    const W_dec = take(ts, l, [gs2 ? 'w_dec' : `W_dec${suffix}`])!;
    let decFirst = 0;
    if (h.kind === 'plt') shape(W_dec, [F, D], l);
    else if (gs2) {
      shape(W_dec, [F, L, D], l);
      decFirst = l;
    } else shape(W_dec, [F, L - l, D], l);
    const W_skip = take(ts, l, gs2 ? ['affine_skip_connection'] : [`W_skip${suffix}`], false);
    if (W_skip) shape(W_skip, [D, D], l);
    if (l > 0 && !!W_skip !== !!layers[0].W_skip)
      throw bad(
        `Transcoder layer ${l} ${W_skip ? 'has' : 'lacks'} a skip connection that layer 0 ${W_skip ? 'lacks' : 'has'}.`,
      );
    if (l > 0 && !!threshold !== !!layers[0].threshold)
      throw bad(`Transcoder layers disagree on having thresholds (layer ${l}).`);
    // skip layouts: circuit-tracer PLT and SAELens x·W_skipᵀ; Gemma Scope 2 x·affine; a circuit-tracer CLT x·W_skip[l]
    const skipLayout: 'x_Wt' | 'x_W' = gs2 || (h.kind === 'clt' && !gs2) ? 'x_W' : 'x_Wt';
    layers.push({ W_enc, encLayout, b_enc, b_dec, threshold, W_dec, decFirst, W_skip, skipLayout });
    void ls;
  }

  // activation: the config's `activation` (relu | topk), else JumpReLU where thresholds are stored, else ReLU
  const cfg = h.config;
  let activation: TranscoderInfo['activation'];
  let k: number | null = null;
  let reluFirst = false;
  if (h.layout === 'saelens') {
    const arch = String(ls?.[0]?.architecture ?? 'transcoder');
    const fn = String(ls?.[0]?.activation_fn ?? ls?.[0]?.activation_fn_str ?? 'relu');
    if (arch === 'jumprelu_transcoder') {
      activation = 'jumprelu';
      reluFirst = true;
      if (!layers[0].threshold)
        throw new LoupeError('MISSING_TENSOR', 'A jumprelu_transcoder stores threshold; layer 0 has none.');
    } else if (fn === 'topk') {
      activation = 'topk';
      k = Number((ls?.[0]?.activation_fn_kwargs as Record<string, unknown> | undefined)?.k ?? ls?.[0]?.k);
    } else activation = 'relu';
  } else {
    const a = cfg.activation;
    if (a === 'topk') {
      activation = 'topk';
      k = Number(cfg.k);
    } else if (a === 'relu') activation = 'relu';
    else if (a === undefined || a === null || a === 'jumprelu' || a === 'jump_relu')
      activation = layers[0].threshold ? 'jumprelu' : 'relu';
    else
      throw new LoupeError(
        'UNSUPPORTED_CONFIG',
        `Transcoder activation ${JSON.stringify(a)} is not supported.`,
        'Supported: JumpReLU (a stored threshold), relu, topk.',
      );
    if (h.layout === 'gemma_scope_2') activation = 'jumprelu';
  }
  if (activation === 'topk' && (!Number.isInteger(k) || k! < 1 || k! > F))
    throw bad(`A TopK transcoder needs an integer k between 1 and its width ${F} (got ${k}).`);
  if (activation === 'jumprelu' && !layers[0].threshold)
    throw new LoupeError('MISSING_TENSOR', 'A JumpReLU transcoder stores a threshold per feature; layer 0 has none.');

  // hooks: config.yaml feature_input_hook / feature_output_hook; SAELens cfg hook_name (+ metadata hook_name_out)
  let input: string, output: string;
  if (h.layout === 'saelens') {
    const c0 = ls?.[0] ?? {};
    input = blockHook(c0.hook_name, 'hook_name');
    const meta = (c0.metadata ?? {}) as Record<string, unknown>;
    output = blockHook(c0.hook_name_out ?? meta.hook_name_out ?? 'hook_mlp_out', 'hook_name_out');
    ls?.forEach((c, l) => {
      const m = /^blocks\.(\d+)\./.exec(String(c.hook_name ?? ''));
      if (m && Number(m[1]) !== l)
        throw mismatch(`The SAELens transcoder for layer ${l} reads ${String(c.hook_name)}, another layer's hook.`);
      if (blockHook(c.hook_name, 'hook_name') !== input)
        throw bad(`SAELens transcoders read different hooks (layer ${l}: ${String(c.hook_name)}).`);
    });
  } else {
    input = blockHook(cfg.feature_input_hook, 'feature_input_hook');
    output = blockHook(cfg.feature_output_hook, 'feature_output_hook');
  }
  if (!(FEATURE_INPUT_HOOKS as readonly string[]).includes(input))
    throw mismatch(
      `The transcoders read ${input}, which Loupe does not take as a feature-input hook.`,
      `Supported feature-input hooks: ${FEATURE_INPUT_HOOKS.join(', ')}.`,
      { input_hook: input },
    );
  if (!(FEATURE_OUTPUT_HOOKS as readonly string[]).includes(output))
    throw mismatch(
      `The transcoders write ${output}, which Loupe does not take as a feature-output hook.`,
      `Supported feature-output hooks: ${FEATURE_OUTPUT_HOOKS.join(', ')}.`,
      { output_hook: output },
    );

  return {
    info: {
      id,
      kind: h.kind,
      layout: h.layout,
      n_layers: L,
      d_model: D,
      d_transcoder: F,
      activation,
      k,
      relu_before_threshold: reluFirst,
      skip: !!layers[0].W_skip,
      input_hook: input as FeatureInputHook,
      output_hook: output as FeatureOutputHook,
      scan: h.scan,
      dtype: [...dtypes].sort().join('+'),
      weight_bytes: bytes,
    },
    layers,
  };
}

/**
 * Refuse a set that does not fit a model, naming the mismatch: d_model, the layer count, the hooks
 * (a post-norm model's mlp.hook_out is before its post-feedforward norm, which the local
 * replacement model does not reach), parallel blocks.
 */
export function checkTranscodersFor(spec: ModelSpec, tc: TranscoderInfo): void {
  if (tc.d_model !== spec.dModel)
    throw mismatch(`The transcoders' d_model is ${tc.d_model} but this model's is ${spec.dModel}.`, undefined, {
      transcoder_d_model: tc.d_model,
      model_d_model: spec.dModel,
    });
  if (tc.n_layers !== spec.nLayers)
    throw mismatch(
      `The transcoder set has ${tc.n_layers} layers but this model has ${spec.nLayers}.`,
      'A set needs one transcoder per layer of the model (a CLT: one encoder per layer).',
      { transcoder_layers: tc.n_layers, model_layers: spec.nLayers },
    );
  if (spec.layers.some((l) => l.parallel))
    throw mismatch(
      'This model runs attention and MLP in parallel; the local replacement model needs sequential blocks.',
      'Pick a model with sequential blocks.',
    );
  if (tc.output_hook === 'mlp.hook_out' && spec.layers.some((l) => l.postMlpNorm))
    throw mismatch(
      "The transcoders write mlp.hook_out, before this model's post-feedforward norm; Loupe replaces the MLP output at hook_mlp_out there.",
      'Use a set whose feature_output_hook is hook_mlp_out.',
    );
}

/** The default transcoder set id on a model: where it came from */
export function transcoderIdOf(source: string, path: string): string {
  const p = path.replace(/^\/+|\/+$/g, '');
  return `${source.trim()}${p ? `//${p}` : ''}`;
}
