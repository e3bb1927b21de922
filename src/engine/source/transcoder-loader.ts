/**
 * Loading a transcoder set through the SAE loaders' sources and caches (sae-loader.ts: one
 * `plan` per source string, the same byte caches, the same progress events), judged before any
 * weight byte:
 *
 *   1. the layout: circuit-tracer's config.yaml (its `transcoders:` list, or one file per model
 *      layer), or SAELens folders when transcoder_path holds `{layer}` (cfg.json each);
 *   2. every file's safetensors header by two range reads (never a tensor byte); a file missing
 *      for a suffix of layers is a layer-count mismatch, any other missing file FILE_NOT_FOUND;
 *   3. `judge(headers)`: the caller's check against the model and its memory budget;
 *   4. the files, through the surface's weight reader: Node keeps them on disk (a folder, the
 *      directory cache) and the page in IndexedDB, read by range; nothing is held whole unless
 *      the source can only give whole files.
 */
import { LoupeError, throwIfAborted } from '../errors';
import type { ReadableWeightSet } from '../safetensors';
import type { TensorEntry } from '../safetensors-types';
import { memoryWeightReader, type WeightReader } from './files';
import { CAPS } from '../caps';
import { childAbort, HeaderBudget, pool, ProgressTracker, readWeightHeader } from './preflight';
import type { ByteCache, FileProgress, FileHead, ModelSource } from './types';
import {
  parseTranscoderPath,
  parseTranscoderYaml,
  transcoderFiles,
  type TranscoderHeaders,
  type TranscoderKind,
  type TranscoderLayout,
} from '../transcoder';

export interface TranscoderSourceRef {
  source: string;
  path: string;
}

export interface TranscoderLoadOptions {
  signal?: AbortSignal;
  onProgress?: (p: FileProgress) => void;
  /** the model's layer count: the files a set without a `transcoders:` list has, and the layers SAELens folders are read for */
  nLayers: number;
  /** decide from the headers, before any weight byte: throw (TRANSCODER_MISMATCH, TOO_LARGE) to stop */
  judge?: (headers: TranscoderHeaders) => void | Promise<void>;
}

export interface TranscoderFiles {
  ref: TranscoderSourceRef;
  headers: TranscoderHeaders;
  /** every tensor of the set under `{file key}::{name in the file}`, with its bytes, path or range reader */
  weights: ReadableWeightSet;
}

/** where a source string's bytes come from: its source, and the cache they go through (none for local folders) */
export interface TranscoderPlan {
  source: ModelSource;
  cache?: ByteCache;
  /** how big weight files are read: Node keeps them on disk; default whole or from the cache by range */
  reader?: (source: ModelSource, cache: ByteCache | undefined) => WeightReader;
}

const HINT =
  'transcoder_source is a Hub repository, an http(s) URL of a folder, or (CLI) ' +
  "a local folder; transcoder_path is the set's folder inside it, holding circuit-tracer's " +
  "config.yaml, or a SAELens folder pattern with {layer} (e.g. 'layer_{layer}').";

/** a file's name in the set's weights: unique, one path segment (sessions lay weight files out by name) */
const keyOf = (i: number, file: string) =>
  `transcoder${i}-${file.slice(file.lastIndexOf('/') + 1).replace(/[^A-Za-z0-9._-]/g, '_')}`;

function joinPath(dir: string, file: string): string {
  const d = dir.replace(/^\/+|\/+$/g, '');
  return d ? `${d}/${file}` : file;
}

interface FileRef {
  layer: number;
  /** the name in the repository (relative to its root) */
  file: string;
  plan: TranscoderPlan;
  /** the name it has in the set's weights (unique over the set) */
  key: string;
}

/** Load a set: see the header. `planFor` maps a source string to its plan, as for SAEs. */
export async function loadTranscoderFiles(
  ref: TranscoderSourceRef,
  planFor: (source: string) => TranscoderPlan,
  opts: TranscoderLoadOptions,
): Promise<TranscoderFiles> {
  const { nLayers } = opts;
  if (!Number.isInteger(nLayers) || nLayers < 1)
    throw new LoupeError('INTERNAL', 'loadTranscoders needs the model layer count.');
  const base = planFor(ref.source.trim());
  const tracker = new ProgressTracker(opts.onProgress);
  const fetchOpts = (plan: TranscoderPlan) => ({ signal: opts.signal, onProgress: tracker.handler, cache: plan.cache });
  const text = async (file: string, optional: boolean) => {
    // a config's cap (caps.ts): config.yaml and cfg.json are read whole
    const bytes = await base.source.fetchFile(file, { ...fetchOpts(base), optional, maxBytes: CAPS.maxSaeConfigBytes });
    return bytes ? new TextDecoder().decode(bytes) : null;
  };

  // 1. the layout and each layer's files
  let layout: TranscoderLayout = 'circuit_tracer';
  let kind: TranscoderKind;
  let config: Record<string, unknown>;
  let layerConfigs: Record<string, unknown>[] | undefined;
  let files: FileRef[];
  let suffixProbe: FileRef | null = null;
  if (ref.path.includes('{layer}')) {
    layout = 'saelens';
    kind = 'plt';
    layerConfigs = [];
    for (let l = 0; l < nLayers; l++) {
      const dir = ref.path.replaceAll('{layer}', String(l));
      const cfg = await text(joinPath(dir, 'cfg.json'), true);
      if (cfg === null) throw missingLayer(l, joinPath(dir, 'cfg.json'), l > 0, nLayers);
      try {
        layerConfigs.push(JSON.parse(cfg));
      } catch {
        throw new LoupeError('BAD_CONFIG', `${joinPath(dir, 'cfg.json')} is not valid JSON.`);
      }
    }
    const extra = await text(joinPath(ref.path.replaceAll('{layer}', String(nLayers)), 'cfg.json'), true);
    if (extra !== null) throw tooMany(nLayers);
    config = layerConfigs[0];
    files = layerConfigs.map((_, l) => {
      const f = joinPath(ref.path.replaceAll('{layer}', String(l)), 'sae_weights.safetensors');
      return { layer: l, file: f, plan: base, key: keyOf(l, f) };
    });
  } else {
    const cfgText = await text(joinPath(ref.path, 'config.yaml'), true);
    if (cfgText === null)
      throw new LoupeError(
        'FILE_NOT_FOUND',
        `No config.yaml at ${joinPath(ref.path, 'config.yaml') || 'the root'} of ${ref.source}.`,
        HINT,
        {
          file: joinPath(ref.path, 'config.yaml'),
        },
      );
    config = parseTranscoderYaml(cfgText, joinPath(ref.path, 'config.yaml'));
    const plan = transcoderFiles(config, nLayers);
    kind = plan.kind;
    const listed = config.transcoders !== undefined && config.transcoders !== null;
    if (listed && plan.files.length !== nLayers)
      throw new LoupeError(
        'TRANSCODER_MISMATCH',
        `config.yaml lists ${plan.files.length} transcoder files but this model has ${nLayers} layers.`,
        'Pick the transcoder set trained on this model.',
        { transcoder_layers: plan.files.length, model_layers: nLayers },
      );
    let n = 0;
    files = plan.files.flatMap((fs, l) =>
      fs.map((entry) => {
        const p = parseTranscoderPath(entry);
        if (p.repo) {
          layout = 'gemma_scope_2';
          const repo = p.revision ? `${p.repo}@${p.revision}` : p.repo;
          return { layer: l, file: p.file, plan: planFor(repo), key: keyOf(n++, p.file) };
        }
        const f = joinPath(ref.path, p.file);
        return { layer: l, file: f, plan: base, key: keyOf(n++, f) };
      }),
    );
    if (!listed) {
      const f = joinPath(ref.path, kind === 'plt' ? `layer_${nLayers}.safetensors` : `W_enc_${nLayers}.safetensors`);
      suffixProbe = { layer: nLayers, file: f, plan: base, key: keyOf(n, f) };
    }
  }
  const scan =
    typeof config.scan === 'string' && config.scan
      ? config.scan
      : `${ref.source.trim()}${ref.path.replace(/^\/+|\/+$/g, '') ? `//${ref.path.replace(/^\/+|\/+$/g, '')}` : ''}`;

  // 2. every header, a few at once
  const heads = new Map<string, { entries: TensorEntry[]; head?: FileHead; bound?: number }>();
  const budget = new HeaderBudget();
  const missing: FileRef[] = [];
  const { ctl, release } = childAbort(opts.signal);
  try {
    await pool([...files, ...(suffixProbe ? [suffixProbe] : [])], 2, ctl, async (f) => {
      const src = f.plan.source;
      const o = { ...fetchOpts(f.plan), signal: ctl.signal, optional: true };
      if (!src.readRange) {
        heads.set(f.key, { entries: [] }); // judged after the download
        return;
      }
      const r = await readWeightHeader(src as Required<ModelSource>, f.file, o, budget);
      if (!r) {
        missing.push(f);
        return;
      }
      heads.set(f.key, { entries: r.header.tensors.map((t) => ({ ...t, file: f.key })), head: r.head, bound: r.bound });
    });
  } finally {
    release();
  }
  throwIfAborted(opts.signal);
  if (suffixProbe && !missing.includes(suffixProbe)) throw tooMany(nLayers);
  const absent = missing.filter((f) => f !== suffixProbe).sort((a, b) => a.layer - b.layer);
  if (absent.length) {
    const first = absent[0].layer;
    const suffix = files.filter((f) => f.layer >= first).every((f) => absent.includes(f));
    throw missingLayer(first, absent[0].file, suffix && first > 0 && kind === 'plt', nLayers);
  }

  const headersOf = (entries: Map<string, TensorEntry[]>): TranscoderHeaders => {
    const layers = Array.from({ length: nLayers }, () => new Map<string, TensorEntry>());
    for (const f of files)
      for (const t of entries.get(f.key) ?? []) layers[f.layer].set(t.name, { ...t, name: `${f.key}::${t.name}` });
    return { config, layout, kind, layers, ...(layerConfigs ? { layerConfigs } : {}), scan };
  };
  const headers = headersOf(new Map([...heads].map(([k, v]) => [k, v.entries])));
  const judged = files.every((f) => heads.get(f.key)!.entries.length > 0);
  if (judged) await opts.judge?.(headers);

  // 3. the files
  const reader0 = (plan: TranscoderPlan) => (plan.reader ?? ((s) => memoryWeightReader(s)))(plan.source, plan.cache);
  const first = reader0(base);
  const weights: ReadableWeightSet = (first.createWeightSet?.() as ReadableWeightSet | undefined) ?? {
    files: new Map(),
    paths: new Map(),
    tensors: new Map(),
    metadata: {},
  };
  const got = new Map<string, TensorEntry[]>();
  const c2 = childAbort(opts.signal);
  try {
    await pool(files, 2, c2.ctl, async (f) => {
      const reader = f.plan === base ? first : reader0(f.plan);
      const r = await reader.read(f.file, {
        ...fetchOpts(f.plan),
        signal: c2.ctl.signal,
        head: heads.get(f.key)?.head,
        // the size judged from the header bounds the download (caps.ts)
        ...(heads.get(f.key)?.bound != null ? { maxBytes: heads.get(f.key)!.bound } : {}),
      });
      if (!r) throw missingLayer(f.layer, f.file, false, nLayers);
      if (r.bytes) weights.files.set(f.key, r.bytes);
      if (r.path) weights.paths.set(f.key, r.path);
      if (r.file) (weights.ranged ??= new Map()).set(f.key, r.file);
      got.set(
        f.key,
        r.header.tensors.map((t) => ({ ...t, file: f.key })),
      );
    });
  } finally {
    c2.release();
  }
  throwIfAborted(opts.signal);
  const final = headersOf(got);
  if (!judged) await opts.judge?.(final);
  for (const layer of final.layers) for (const t of layer.values()) weights.tensors.set(t.name, t);
  return { ref, headers: final, weights };
}

function tooMany(nLayers: number): LoupeError {
  return new LoupeError(
    'TRANSCODER_MISMATCH',
    `The transcoder set has more layers than this model's ${nLayers} (it has a file for layer ${nLayers}).`,
    'Pick the transcoder set trained on this model.',
    { model_layers: nLayers },
  );
}

function missingLayer(layer: number, file: string, suffix: boolean, nLayers: number): LoupeError {
  if (suffix)
    return new LoupeError(
      'TRANSCODER_MISMATCH',
      `The transcoder set has ${layer} layers (no ${file}) but this model has ${nLayers}.`,
      'Pick the transcoder set trained on this model.',
      { transcoder_layers: layer, model_layers: nLayers, file },
    );
  return new LoupeError('FILE_NOT_FOUND', `The transcoder file for layer ${layer}, ${file}, is missing.`, HINT, {
    layer,
    file,
  });
}
