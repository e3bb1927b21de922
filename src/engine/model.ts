/**
 * LoadedModel: a model description + tokenizer + onnxruntime sessions behind the engine API
 * (api.ts). createModel decides the model's precision, vocabulary split and readout once, at load;
 * EngineModel builds each graph variant (graph/variants.ts) on first use and keeps its session,
 * and runs one task at a time, in order.
 */
import type {
  DeviceTensor,
  EdgeRun,
  LoadedModel,
  ModelInfo,
  ModelMemory,
  RunOptions,
  RunResult,
  KVCache,
  Intervention,
  LensTop,
  LogitReduce,
  LogitRow,
  HookStats,
  AttributionReduce,
  TokenizeOptions,
  Tensor64,
  WeightProducts,
  WeightProductsInput,
} from './api';
import { checkTextLength } from './caps';
import { LoupeError, throwIfAborted } from './errors';
import type { ModelSpec } from './spec';
import type { Tensor } from './tensor';
import type { WeightSet } from './safetensors-types';
import type { GpuCaps } from './env';
import { describeModel } from './arch';
import { materializeDerived } from './mxfp4';
import {
  FORWARD_LENS_OUTPUTS,
  LENS_K,
  LENS_OUTPUTS,
  lensHooks,
  PICK_ARGMAX,
  PICK_TOP_IDS,
  PICK_TOP_LOGITS,
  type BuiltGraph,
  type GraphPlan,
} from './graph/build-model';
import { readoutFor, readoutProducts, FORWARD_READOUT_OUTPUTS, type ReadoutMode } from './readout';
import { addInput, allHookNames, hookInfo, hookShape as shapeOfHook, unknownHookHint } from './graph/hooks';
import { combineGraph, compileInterventions, type SiteFeed } from './runtime/interventions';
import { buildFeeds } from './runtime/feeds';
import { TransferCounter, onDevice } from './runtime/transfers';
import {
  attributionGraph,
  attributionKey,
  hostAttribution,
  hostStats,
  logitReduceFeeds,
  logitReduceFetches,
  logitReduceGraph,
  logitReduceKey,
  logitRows,
  statsFetches,
  statsGraph,
  statsKey,
  statsOf,
} from './runtime/reduce';
import {
  differenceFeeds,
  wrapOrtSession,
  type EngineSession,
  type OrtTensorLike,
  type RunKeep,
  type SessionFactory,
} from './runtime/ort-session';
import { guardDevice } from './runtime/device-lost';
import { checkPositions, gatherAt } from './runtime/positions';
import { ModelTokenizer } from './tokenizer';
import { readParam, specTensorNames, storedParam, valueProduct, type ReadTensor } from './params';
import { checkSaeConfig, prepareSae, withSaeWeights, type SaeFiles, type SaeGraphSpec, type SaeInfo } from './sae';
import { readTensorF32, type ReadableWeightSet } from './safetensors';
import type { ModelFiles } from './source/files';
import { BUNDLED_MODEL_ID } from './source/ref';
import { gradName } from './graph/backward';
import { edgeLayoutOf, EDGE_GATE, EDGE_GRAD_SUM, EDGE_OUT, EDGE_SRC, EDGE_W } from './graph/edge-graph';
import {
  buildVariant,
  variantFamily,
  variantKey,
  BASE_VARIANT,
  type GraphVariant,
  type LeanPlan,
} from './graph/variants';
import { q8WeightSet, q8ForWebGpu, dequantizeQ8, q4Names, quantFile, type Q8Store } from './q8';
import { checkTranscodersFor, describeTranscoders, type TranscoderHeaders, type TranscoderInfo } from './transcoder';
import type { TranscoderFiles } from './source/transcoder-loader';
import {
  prepareReplacement,
  type AttachedTranscoders,
  type DeviceHelper,
  type ReplacementOptions,
} from './replacement';
import type { LocalReplacement } from './api';
import { budgetOf, fmtGB, weightBytesAt, RUNTIME_SLACK_BYTES, WASM_HEAP_BYTES, type BudgetLimits } from './budget';
import type { WeightsMode } from './precision';
import { decideLoad, type LoadDecision } from './plan';

/** number of positions whose logits a run computes */
const logitPosCount = (opts: RunOptions, T: number) => opts.logitPositions?.length ?? T;

export interface ModelParts {
  config: Record<string, any>;
  tokenizerJson: Record<string, unknown>;
  tokenizerConfig: Record<string, unknown> | null;
  weights: WeightSet;
  readTensor: ReadTensor;
  id: string;
  /** the catalog name the model was asked for by, when not its id (ModelInfo.requested_name) */
  requested?: string;
  revision: string;
  source: ModelInfo['source'];
  /** the Hub commit the weights came from */
  commit?: string;
  /** the memory budget the model must fit on its backend (see budget.ts) */
  memory?: BudgetLimits;
  /** weight precision asked for (precision.ts); default auto */
  weightsMode?: WeightsMode;
  /** the load the loader decided from the headers (judgeModel; plan.ts) for this backend; without it createModel decides */
  decision?: LoadDecision;
  /** onnxruntime fused kernels of the model's graphs (GraphPlan.fused); default the activation and norm ones (the bench measures more) */
  fused?: GraphPlan['fused'];
  /** where q8 weights are kept between loads (q8.ts); none: quantised in memory at each load */
  q8Store?: Q8Store;
  /** set by q8Parts when the quantised weights are held in JS: why (the memory report says it) */
  q8InJs?: string;
  /** how DLA's readout products run (readout/choose.ts); default its choice (the bench and tests force either) */
  readout?: ReadoutMode;
}

/** One session run; onnxruntime's failure is a RUNTIME_ERROR (`where`: which graph) with `hint`. */
async function runSession(
  session: EngineSession,
  feeds: Record<string, OrtTensorLike>,
  fetches: string[],
  hint: string,
  where = '',
  opts?: RunKeep,
): Promise<Record<string, OrtTensorLike>> {
  try {
    return await session.run(feeds, fetches, opts);
  } catch (e) {
    if (e instanceof LoupeError && e.code === 'DEVICE_LOST') throw e; // the model recovers (recoverDevice)
    throw new LoupeError('RUNTIME_ERROR', `onnxruntime failed${where}: ${(e as Error).message}`, hint);
  }
}

const toTensor = (t: OrtTensorLike): Tensor => ({ dims: [...t.dims], data: t.data as Float32Array });

/** a lens's reduced outputs (build-model.ts LENS_OUTPUTS, under `prefix`) as LensTop */
function lensTopOf(out: Record<string, OrtTensorLike>, k: number, prefix = ''): LensTop {
  const ints = (t: OrtTensorLike) => Array.from(t.data as BigInt64Array, Number);
  const f = (n: string) => out[prefix + n].data as Float32Array;
  return {
    k,
    topLogits: f('top_logits'),
    topIds: ints(out[prefix + 'top_ids']),
    logSumExp: f('logsumexp'),
    finalIds: ints(out[prefix + 'final_ids']),
    finalLogit: f('final_logit'),
    finalAbove: f('final_above'),
  };
}

/** a tensor the runtime keeps on the device, handed out as a DeviceTensor (released once, however often asked) */
function deviceTensor(t: OrtTensorLike, dims: number[] = [...t.dims]): DeviceTensor {
  let live = true;
  return {
    dims,
    device: t,
    release: () => {
      if (live) t.dispose?.();
      live = false;
    },
  };
}

/** Resolve after pending tasks (not just microtasks) have run: setImmediate in Node, a MessageChannel hop elsewhere. */
function yieldToEventLoop(): Promise<void> {
  const g = globalThis as any;
  if (typeof g.setImmediate === 'function') return new Promise((r) => g.setImmediate(r));
  if (typeof g.MessageChannel === 'function') {
    return new Promise((r) => {
      const ch = new g.MessageChannel();
      ch.port1.onmessage = () => {
        ch.port1.close();
        r();
      };
      ch.port2.postMessage(0);
    });
  }
  return new Promise((r) => setTimeout(r, 0));
}

/**
 * Loaded files → the parts createModel takes, in the browser and in Node alike. The one place
 * that names a loaded model: the bundled one by its id, a folder by what the caller typed (`id`),
 * anything else by its ref.
 */
export function modelPartsFrom(
  files: ModelFiles,
  o: { bundled: boolean; id?: string; memory?: BudgetLimits; weightsMode?: WeightsMode },
): ModelParts {
  const weights = files.weights as ReadableWeightSet;
  return {
    config: files.config as Record<string, any>,
    tokenizerJson: files.tokenizerJson,
    tokenizerConfig: files.tokenizerConfig,
    weights,
    readTensor: (name, into) => readTensorF32(weights, name, into),
    id: o.bundled ? BUNDLED_MODEL_ID : (o.id ?? files.ref.id),
    ...(files.ref.requested && !o.bundled ? { requested: files.ref.requested } : {}),
    revision: files.ref.revision ?? '',
    ...(files.commit ? { commit: files.commit } : {}),
    source: o.bundled ? 'bundled' : files.ref.kind,
    memory: o.memory,
    weightsMode: o.weightsMode,
  };
}

/**
 * ModelInfo.post_norms: whether the blocks have sandwich norms, which that one flag can describe
 * only when every block has both, as RMSNorms with the model's epsilon (Gemma 2's); any other
 * layout is refused here rather than misread above the engine.
 */
function postNormsOf(spec: ModelSpec): boolean {
  const norms = spec.layers.flatMap((l) => [l.postAttnNorm, l.postMlpNorm]);
  if (norms.every((n) => !n)) return false;
  if (norms.every((n) => n && n.kind === 'rmsnorm' && n.eps === spec.lnFinal.eps)) return true;
  throw new LoupeError(
    'UNSUPPORTED_ARCHITECTURE',
    `${spec.family}: post-norms in only some blocks, or not RMSNorms with the model's epsilon, are not supported.`,
    "Loupe supports Gemma 2's sandwich norms (every block, RMSNorm).",
  );
}

export async function createModel(parts: ModelParts, factory: SessionFactory): Promise<LoadedModel> {
  const spec = describeModel({ config: parts.config, tensors: parts.weights.tensors });
  materializeDerived(parts.weights as ReadableWeightSet); // GPT-OSS's experts (mxfp4.ts), before any session
  const tokenizer = new ModelTokenizer(parts.tokenizerJson, parts.tokenizerConfig, parts.config);
  const used = [...specTensorNames(spec)].map((name) => parts.weights.tensors.get(name)!);
  const dtypes = new Set<string>(used.map((e) => e.dtype));
  // Loaders decide the load before downloading (source/preflight.ts judgeModel); a source that could not
  // read headers first (or a caller with its own files) is decided here, once, before any session.
  const d =
    parts.decision ??
    (await decideLoad({
      spec,
      tensors: parts.weights.tensors,
      backend: factory.backend,
      mode: parts.weightsMode,
      gpu: factory.gpu,
      memory: parts.memory,
    }));
  const stats = d.stats;
  const nParams = stats.nParams;
  const choice = { precision: d.precision, reason: d.reason };
  const split = d.vocab;
  const info: ModelInfo = {
    id: parts.id,
    ...(parts.requested ? { requested_name: parts.requested } : {}),
    revision: parts.revision,
    ...(parts.commit ? { commit: parts.commit } : {}),
    source: parts.source,
    architecture: spec.modelType,
    n_layers: spec.nLayers,
    n_heads: spec.nHeads,
    n_kv_heads: spec.nKvHeads,
    d_model: spec.dModel,
    d_head: spec.dHead,
    d_mlp: spec.dMlp,
    ...(spec.nExperts ? { num_experts: spec.nExperts, experts_per_token: spec.topK } : {}),
    ...(spec.layers[0].moe?.shared ? { shared_expert: true } : {}),
    d_vocab: spec.dVocab,
    n_ctx: spec.nCtx,
    n_params: nParams,
    dtype: [...dtypes].join('+'),
    backend: factory.backend,
    norm: spec.norm,
    norm_eps: spec.lnFinal.eps,
    pos_embed: !!spec.posEmbed,
    post_norms: postNormsOf(spec),
    parallel_attn_mlp: spec.layers.some((l) => l.parallel),
    // a mixture-of-experts model's experts are gated MLPs
    act_fn: (spec.layers[0].mlp ?? spec.layers[0].moe!).act,
    gated_mlp: (spec.layers[0].mlp?.kind ?? 'gated') === 'gated',
    final_softcap: spec.finalSoftcap,
    weights: choice.precision,
    weights_reason: choice.reason,
    weight_bytes: weightBytesAt(stats, choice.precision),
    vocab_chunks: split.chunks,
    vocab_reason: split.reason,
    readout: 'stream',
    readout_reason: '',
  };
  const sessionParts =
    choice.precision === 'q8' || choice.precision === 'q4'
      ? await q8Parts(parts, spec, info, !!factory.gpu, choice.precision)
      : parts;
  Object.assign(
    info,
    readoutFor(spec, {
      stored: parts.weights,
      held: sessionParts.weights,
      used,
      backend: factory.backend,
      precision: choice.precision,
      memory: parts.memory ?? {},
      forced: parts.readout,
      inForward: factory.readoutInForward,
    }),
  );
  // every session guarded: a run on a lost GPU device throws DEVICE_LOST (runtime/device-lost.ts)
  const model = new EngineModel(spec, info, tokenizer, { ...sessionParts, decision: d }, guardDevice(factory));
  await model.warm();
  return model;
}

/**
 * At q8 (q4) every session is built from the quantised weight set (q8.ts), and parameters read in JS
 * (DLA, weight products) are the dequantised values the sessions use, so nothing mixes precisions.
 */
async function q8Parts(
  parts: ModelParts,
  spec: ModelSpec,
  info: ModelInfo,
  webgpu: boolean,
  scheme: 'q8' | 'q4',
): Promise<ModelParts> {
  const q8 = await q8WeightSet(parts.weights as ReadableWeightSet, spec, parts.q8Store, scheme);
  info.weights_reason +=
    q8.q8Source === 'cache'
      ? `; read from the ${scheme} cache`
      : q8.q8Source === 'built+cached'
        ? `; quantised at load, kept in the ${scheme} cache`
        : '; quantised at load';
  const weights = webgpu ? q8ForWebGpu(q8) : q8;
  // held in JS only where no entry was written to read back (a cached or written entry is read by range)
  const q8InJs = !weights.files.has(quantFile(scheme))
    ? undefined
    : q8.q8StoreFailure
      ? `the ${scheme} weights are held in JS: their cache entry could not be written (${q8.q8StoreFailure})`
      : `the ${scheme} weights are held in JS: this load has no ${scheme} cache to write them to and read them back from`;
  return {
    ...parts,
    weights,
    ...(q8InJs ? { q8InJs } : {}),
    readTensor: (name, into) =>
      weights.tensors.get(name)?.q8 || weights.tensors.get(name)?.q4
        ? dequantizeQ8(weights, name)
        : parts.readTensor(name, into),
  };
}

/** why weight files are in `WeightSet.files`: a source read whole (runtime/ort-session.ts passes views of them) */
const SOURCE_IN_JS =
  "the model's files are held in JS: its source was read whole (the bundled model, a folder picked in the page, a source without a cache)";

/** a variant's graph and the session running it */
interface VariantSession {
  session: EngineSession;
  graph: BuiltGraph;
}

class EngineModel implements LoadedModel {
  /** each variant's session by variantKey, from the moment its creation starts */
  private sessions = new Map<string, Promise<VariantSession>>();
  /** sessions whose creation finished, by key (makeRoom releases them) */
  private readonly created = new Map<string, VariantSession>();
  private attached = new Map<string, { spec: SaeGraphSpec; weights: WeightSet }>();
  private transcoders = new Map<string, AttachedTranscoders>();
  private params = new Map<string, Tensor>();
  private readonly hookSets: Record<'base' | 'result', Set<string>>;
  private queue: Promise<unknown> = Promise.resolve();
  private lastHooksBytes = 0;
  private readonly transfers = new TransferCounter();
  /** helper sessions (runtime/reduce.ts) by graph and place */
  private readonly helpers = new Map<string, Promise<EngineSession>>();
  /** GPU device losses recovered (recoverDevice) */
  private deviceRecoveries = 0;

  constructor(
    readonly spec: ModelSpec,
    readonly info: ModelInfo,
    private readonly tokenizer: ModelTokenizer,
    private readonly parts: ModelParts,
    private readonly factory: SessionFactory,
  ) {
    this.hookSets = { base: new Set(allHookNames(spec, false)), result: new Set(allHookNames(spec, true)) };
  }

  get bosTokenId() {
    return this.tokenizer.bosTokenId;
  }
  get eosTokenId() {
    return this.tokenizer.eosTokenId ?? this.spec.eosTokenId;
  }

  /** build the base session at load time so the first run is not also the slow one */
  async warm(): Promise<void> {
    await this.variant(BASE_VARIANT);
  }

  // Every text reaches the tokenizer through these three, each refusing a text longer than a run
  // could take before tokenizing it (a 16 M-character answer held a companion for minutes).
  tokenize(text: string, opts: TokenizeOptions = {}): number[] {
    checkTextLength(this.spec.nCtx, text, opts.field ?? 'text');
    return this.tokenizer.encode(text, opts.prependBos ?? true);
  }
  chatPrompt(text: string, field = 'prompt'): string {
    checkTextLength(this.spec.nCtx, text, field);
    return this.tokenizer.chatPrompt(text);
  }
  decode(ids: number[]): string {
    return this.tokenizer.decode(ids);
  }
  tokenStrings(ids: number[]): string[] {
    return this.tokenizer.tokenStrings(ids);
  }
  wordIds(text: string, field = 'token'): number[] {
    checkTextLength(this.spec.nCtx, text, field);
    return this.tokenizer.wordIds(text);
  }
  tokenId(text: string, field = 'token'): number | undefined {
    checkTextLength(this.spec.nCtx, text, field);
    return this.tokenizer.tokenId(text);
  }

  hookNames(opts: { withResult?: boolean } = {}): string[] {
    return allHookNames(this.spec, opts.withResult ?? false);
  }

  hookShape(hook: string, B: number, T: number, Tk = T): number[] {
    if (hook !== 'logits' && !this.hookSets.result.has(hook)) return [];
    return shapeOfHook(this.spec, hook, B, T, Tk);
  }

  param(name: string, opts: { keep?: boolean } = {}): Tensor {
    let p = this.params.get(name);
    if (!p) {
      p = readParam(this.spec, this.parts.readTensor, name);
      if (opts.keep ?? true) this.params.set(name, p);
    }
    return p;
  }

  valueProduct(x: Tensor, init: Tensor64): Tensor64 {
    const { dModel: D, nKvHeads: Hkv, dHead: Dh, nLayers: L } = this.spec;
    if (x.data.length !== L * D || init.data.length !== L * Hkv * Dh)
      throw new LoupeError(
        'BAD_INPUT',
        `valueProduct: x must be [${L}, ${D}] and init [${L}, ${Hkv * Dh}], got [${x.dims}] and [${init.dims}].`,
      );
    // the layers' matrices read one after another into one buffer, dropped after the call
    let scratch = new Uint8Array(0);
    const read = (name: string) => {
      const e = this.parts.weights.tensors.get(name);
      if (e && !e.q8 && !e.q4 && scratch.byteLength < e.byteLength) scratch = new Uint8Array(e.byteLength);
      return this.parts.readTensor(name, scratch);
    };
    return { dims: [L, Hkv * Dh], data: valueProduct(this.spec, read, x.data, init.data) };
  }

  hasParam(name: string): boolean {
    return storedParam(this.spec, name);
  }

  /** an editable hook's values per position; undefined for a hook an SAE cannot sit at */
  private saeHookDim = (hook: string): number | undefined => {
    if (!this.hookSets.base.has(hook) || !hookInfo(hook).site) return undefined;
    const dims = shapeOfHook(this.spec, hook, 1, 1);
    return hook.endsWith('hook_pattern') ? undefined : dims.slice(2).reduce((a, b) => a * b, 1);
  };

  checkSaeConfig(cfg: Record<string, unknown>): void {
    checkSaeConfig(cfg, this.saeHookDim);
  }

  attachSae(files: SaeFiles, id: string): SaeInfo {
    if (this.attached.has(id)) throw new LoupeError('BAD_INPUT', `An SAE is already attached as '${id}'.`);
    const { spec, files: saeFiles } = prepareSae(files, id, this.attached.size, this.saeHookDim);
    this.attached.set(id, { spec, weights: withSaeWeights(this.parts.weights, spec, saeFiles) });
    return spec.info;
  }

  saes(): SaeInfo[] {
    return [...this.attached.values()].map((a) => a.spec.info);
  }

  checkTranscoders(headers: TranscoderHeaders, id: string): TranscoderInfo {
    const tc = describeTranscoders(headers, id);
    checkTranscodersFor(this.spec, tc.info);
    return tc.info;
  }

  attachTranscoders(files: TranscoderFiles, id: string): TranscoderInfo {
    if (this.transcoders.has(id)) throw new LoupeError('BAD_INPUT', `A transcoder set is already attached as '${id}'.`);
    const spec = describeTranscoders(files.headers, id);
    checkTranscodersFor(this.spec, spec.info);
    this.transcoders.set(id, { spec, weights: files.weights });
    return spec.info;
  }

  transcoderSets(): TranscoderInfo[] {
    return [...this.transcoders.values()].map((t) => t.spec.info);
  }

  replacement(tokens: number[], id: string, opts: ReplacementOptions = {}): Promise<LocalReplacement> {
    const tc = this.transcoders.get(id);
    if (!tc)
      throw new LoupeError(
        'BAD_INPUT',
        `No transcoder set is attached as '${id}'.`,
        `Attached: ${[...this.transcoders.keys()].join(', ') || 'none'}. Load one first.`,
      );
    const rows = this.validateTokens(tokens, {});
    return prepareReplacement(
      {
        spec: this.spec,
        ort: this.factory.ort,
        run: (t, o) => this.run(t, o),
        param: (n) => this.param(n),
        unembedVectors: async (ids, signal) => this.weightProducts({ unembedIds: ids, unembedSum: true }, signal),
        unembedDots: async (x, signal) => (await this.weightProducts({ unembedDots: x }, signal)).unembedDots.data,
        upload: (feeds) => this.upload(feeds),
        runReplacement: (feeds, fetches, forward, keep) =>
          this.enqueue(async () => {
            await yieldToEventLoop();
            const { session } = await this.variant({ kind: 'replacement', transcoders: id, forward });
            if (keep && !session.keepsOnDevice)
              throw new LoupeError('INTERNAL', 'The frozen backward graph keeps nothing on the device.');
            return runSession(
              session,
              feeds,
              fetches,
              'This may be out of memory; try fewer positions or a smaller batch.',
              ' in the frozen backward graph',
              keep ? { keep: fetches } : undefined,
            );
          }),
        ...(this.factory.backend === 'webgpu' && this.factory.helper
          ? {
              deviceHelper: (bytes: Uint8Array) => this.deviceHelper(bytes),
              deviceBufferBytes: this.factory.gpu?.maxBufferBytes,
            }
          : {}),
      },
      tc,
      rows[0],
      opts,
    );
  }

  /**
   * Feeds copied to the device once where the backend keeps values there (SessionFactory.upload),
   * for many runs; else the same feeds, written with each run. `release` frees the device copies.
   */
  private async upload(
    feeds: Record<string, OrtTensorLike>,
  ): Promise<{ feeds: Record<string, OrtTensorLike>; release(): void }> {
    const up = this.factory.upload;
    if (!up) return { feeds, release: () => undefined };
    const out: Record<string, OrtTensorLike> = {};
    const release = () => Object.values(out).forEach((t) => t.dispose?.());
    await this.enqueue(async () => {
      try {
        for (const [k, t] of Object.entries(feeds)) {
          out[k] = await up(t);
          this.transfers.uploaded(t);
        }
      } catch (e) {
        release();
        throw e;
      }
    });
    return { feeds: out, release };
  }

  deviceDifference(a: DeviceTensor, b: DeviceTensor, row: number): Promise<DeviceTensor> {
    return this.enqueue(async () => {
      const diff = this.factory.difference;
      if (!diff)
        throw new LoupeError('BAD_INPUT', `The ${this.factory.backend} backend keeps no values on the device.`);
      if (!(Number.isInteger(row) && row >= 0 && row < a.dims[0]) || a.dims.join() !== b.dims.join())
        throw new LoupeError('BAD_INPUT', `deviceDifference: row ${row} of [${a.dims}] − [${b.dims}].`);
      const feeds = differenceFeeds(this.factory.ort, a.device as OrtTensorLike, b.device as OrtTensorLike, row);
      const y = await diff(feeds);
      this.transfers.record(feeds, { y });
      return deviceTensor(y, [1, ...a.dims.slice(1)]);
    });
  }

  async toDevice(t: Tensor): Promise<Tensor | DeviceTensor> {
    if (!this.factory.upload) return t;
    const { feeds } = await this.upload({ x: new this.factory.ort.Tensor('float32', t.data, t.dims) });
    return deviceTensor(feeds.x);
  }

  /**
   * The add of each site with patch sources on the device (interventions.ts), made there: the
   * source itself where it is all the add is, else a combineGraph run per source. `release` frees
   * what was made, once the run that feeds them is over.
   */
  private async deviceAdds(
    sites: Map<string, SiteFeed>,
  ): Promise<{ adds: Map<string, OrtTensorLike>; release(): void }> {
    const adds = new Map<string, OrtTensorLike>();
    const made: OrtTensorLike[] = [];
    const release = () => made.forEach((t) => t.dispose?.());
    const T = this.factory.ort.Tensor;
    const f32 = (d: { data: Float32Array; dims: number[] }) => new T('float32', d.data, d.dims);
    const just = (d: { data: Float32Array }, v: number) => d.data.length === 1 && d.data[0] === v;
    try {
      for (const [site, f] of sites) {
        if (!f.terms.length) continue;
        let add: OrtTensorLike | null = just(f.add, 0) ? null : f32(f.add);
        for (const t of f.terms) {
          const source = t.source.device as OrtTensorLike;
          if (!add && just(t.coef, 1)) {
            add = source;
            continue;
          }
          const s = await this.helper('combine@keep', true, combineGraph, true);
          const feeds = { a: add ?? f32(f.add), c: f32(t.coef), s: source };
          const y = (await runSession(s, feeds, ['y'], 'This may be out of memory.', ' patching', { keep: ['y'] })).y;
          made.push(y);
          add = y;
        }
        adds.set(site, add!);
      }
    } catch (e) {
      release();
      throw e;
    }
    return { adds, release };
  }

  saeWeight(id: string, name: 'W_enc' | 'b_enc' | 'W_dec' | 'b_dec' | 'threshold'): Tensor {
    const a = this.sae(id);
    const e = a.spec[name];
    if (!e) throw new LoupeError('BAD_INPUT', `SAE '${id}' has no ${name}.`);
    return { dims: [...e.shape], data: readTensorF32(a.weights, e.name) };
  }

  private sae(id: string) {
    const a = this.attached.get(id);
    if (!a)
      throw new LoupeError(
        'BAD_INPUT',
        `No SAE is attached as '${id}'.`,
        `Attached: ${[...this.attached.keys()].join(', ') || 'none'}. Load one first.`,
      );
    return a;
  }

  /** Final norm (each row's own statistics) + unembedding + soft-cap of residual vectors [N, D] → [N, V]. */
  unembed(resid: Tensor, signal?: AbortSignal): Promise<Tensor> {
    return this.enqueue(async () => {
      throwIfAborted(signal);
      const D = this.spec.dModel;
      if (resid.dims.length !== 2 || resid.dims[1] !== D)
        throw new LoupeError('BAD_INPUT', `unembed needs residual vectors [N, ${D}], got [${resid.dims}].`);
      const { session } = await this.variant({ kind: 'lens' });
      const out = await session.run(this.lensFeeds({ dims: [1, ...resid.dims], data: resid.data }, 1), ['logits']);
      return { dims: [resid.dims[0], this.spec.dVocab], data: out.logits.data as Float32Array };
    });
  }

  lensTop(resid: Tensor, k: number, signal?: AbortSignal): Promise<LensTop> {
    return this.enqueue(async () => {
      throwIfAborted(signal);
      const D = this.spec.dModel;
      if (resid.dims.length !== 3 || resid.dims[2] !== D || resid.dims[0] < 1)
        throw new LoupeError('BAD_INPUT', `lensTop needs residual vectors [S, P, ${D}], got [${resid.dims}].`);
      if (!Number.isInteger(k) || k < 1 || k > this.spec.dVocab)
        throw new LoupeError('BAD_INPUT', `lensTop: k must be 1 … ${this.spec.dVocab}, got ${k}.`);
      return this.lensTopNow(resid, k);
    });
  }

  private async lensTopNow(resid: Tensor, k: number): Promise<LensTop> {
    const { session } = await this.variant({ kind: 'lens' });
    return lensTopOf(await session.run(this.lensFeeds(resid, k), LENS_OUTPUTS), k);
  }

  /**
   * RunOptions.lens where the forward graph has no lens (node, WASM): its
   * streams, fetched by the run, stacked [L + 1, P, D] and reduced in the lens session; those not
   * asked for as hooks are dropped from the result
   */
  private async lensOfHooks(
    hooks: Record<string, Tensor>,
    lens: { positions: number[]; k: number },
    asked: string[] | 'all',
  ): Promise<LensTop> {
    const names = lensHooks(this.spec.nLayers);
    const D = this.spec.dModel;
    const P = lens.positions.length;
    const streams = new Float32Array(names.length * P * D);
    names.forEach((h, l) =>
      lens.positions.forEach((p, i) => streams.set(hooks[h].data.subarray(p * D, (p + 1) * D), (l * P + i) * D)),
    );
    if (asked !== 'all') for (const h of names) if (!asked.includes(h)) delete hooks[h];
    return this.lensTopNow({ dims: [names.length, P, D], data: streams }, lens.k);
  }

  /** RunOptions.lens checked: one row, in range, with no option that changes the graph or the hooks' form */
  private checkLens(opts: RunOptions, B: number, T: number): { inGraph: boolean } {
    const { positions, k } = opts.lens!;
    const clash = (
      ['grad', 'past', 'returnCache', 'sae', 'withResult', 'lean', 'hookPositions', 'hooksOnDevice'] as const
    ).filter((o) => opts[o]);
    if (clash.length) throw new LoupeError('BAD_INPUT', `lens does not apply with ${clash.join(', ')}.`);
    if (B !== 1) throw new LoupeError('BAD_INPUT', `lens reads one row, got ${B}.`);
    if (!Number.isInteger(k) || k < 1 || k > this.spec.dVocab)
      throw new LoupeError('BAD_INPUT', `lens.k must be 1 … ${this.spec.dVocab}, got ${k}.`);
    checkPositions(positions, T);
    // in the forward graph's If (readout 'forward'); a run fetching hooks as well takes the host's way
    const hooks = opts.hooks === 'all' || (opts.hooks?.length ?? 0) > 0;
    return { inGraph: this.info.readout === 'forward' && !hooks };
  }

  private lensFeeds(resid: Tensor, k: number): Record<string, OrtTensorLike> {
    const T = this.factory.ort.Tensor;
    return { resid: new T('float32', resid.data, resid.dims), k: new T('int64', BigInt64Array.from([BigInt(k)]), [1]) };
  }

  weightProducts(input: WeightProductsInput, signal?: AbortSignal): Promise<WeightProducts> {
    return this.enqueue(() =>
      readoutProducts(this.spec, this.parts.weights as ReadableWeightSet, input, {
        mode: this.info.readout,
        session: async () => (await this.variant({ kind: 'readout' })).session,
        // one token through the forward graph, its If taking the products (readout/graph.ts)
        forward: async (feeds) => {
          const { session, graph } = await this.variant(BASE_VARIANT);
          const f = buildFeeds(this.factory.ort, this.spec, graph, { rows: [[0]], sites: new Map(), readout: feeds });
          return runSession(session, f, FORWARD_READOUT_OUTPUTS, 'This may be out of memory.', ' in the readout');
        },
        tensor: (type, data, dims) => new this.factory.ort.Tensor(type, data, dims),
        noEmpty: this.info.backend === 'webgpu',
        signal,
        yieldTurn: yieldToEventLoop,
      }),
    );
  }

  /** A variant's session, built on first use and kept (lean and gradient variants: two of each family at most). */
  private variant(v: GraphVariant): Promise<VariantSession> {
    const key = variantKey(v);
    let s = this.sessions.get(key);
    const family = variantFamily(v);
    if (!s && family) {
      // lean and gradient variants each hold the weights again: keep at most two of a kind, dropping the oldest
      const keys = [...this.sessions.keys()].filter((k) => k.startsWith(`${family}:`));
      for (const old of keys.slice(0, Math.max(0, keys.length - 1))) {
        const gone = this.sessions.get(old)!;
        this.sessions.delete(old);
        this.created.delete(old);
        void gone.then((x) => x.session.release()).catch(() => undefined);
      }
    }
    if (!s) {
      s = (async () => {
        const sae = v.kind === 'hooked' && v.sae ? this.sae(v.sae) : undefined;
        const tc = v.kind === 'replacement' ? this.transcoders.get(v.transcoders) : undefined;
        const weights = sae?.weights ?? (tc ? withTranscoderWeights(this.parts.weights, tc) : this.parts.weights);
        const precision = this.info.weights;
        const vocabRows = this.info.vocab_chunks > 1 ? Math.ceil(this.spec.dVocab / this.info.vocab_chunks) : undefined;
        const graph = buildVariant(v, {
          spec: this.spec,
          tensors: weights.tensors,
          precision,
          vocabRows,
          fused: this.parts.fused,
          sae: sae?.spec,
          transcoders: tc?.spec,
          readoutInForward: this.info.readout === 'forward',
          unembedApart: this.factory.unembedApart,
        });
        if (this.factory.backend === 'wasm' && precision !== 'f32') await this.makeRoom(key, graph.weightBytes);
        const made = { graph, session: this.transfers.wrap(await this.factory.create(graph, weights)) };
        this.created.set(key, made);
        return made;
      })();
      s.catch(() => this.sessions.delete(key));
      this.sessions.set(key, s);
    }
    return s;
  }

  /**
   * Every onnxruntime-web session keeps its own copy of the weights it uses in the one wasm32 heap
   * (4 GiB at most; the heap never shrinks, but freed memory is reused). When a new variant's
   * weights would not fit beside the live sessions' (a lens, gradient or readout variant beside
   * the forward's), the others are released first and re-created when next used: slower, instead
   * of std::bad_alloc. Only where the graph's bytes are what the heap holds (stored, q8).
   */
  private async makeRoom(key: string, need: number): Promise<void> {
    let held = 0;
    for (const [k, x] of this.created) if (k !== key) held += x.graph.weightBytes;
    if (held + need + RUNTIME_SLACK_BYTES <= (this.parts.memory?.wasmHeapBytes ?? WASM_HEAP_BYTES)) return;
    for (const [k, x] of [...this.created]) {
      if (k === key) continue;
      this.created.delete(k);
      this.sessions.delete(k);
      await x.session.release().catch(() => undefined);
    }
  }

  /** ORT sessions are not re-entrant on every backend: the model's work goes one task at a time, in order. */
  private enqueue<T>(task: () => Promise<T>): Promise<T> {
    const next = this.queue.then(task);
    this.queue = next.catch(() => undefined);
    return next;
  }

  run(tokens: number[] | number[][], opts: RunOptions = {}): Promise<RunResult> {
    return this.enqueue(() => this.runNow(tokens, opts));
  }

  private async runNow(tokens: number[] | number[][], opts: RunOptions): Promise<RunResult> {
    // WASM runs block their thread: give queued messages (a cancel, a heartbeat) a turn between runs
    await yieldToEventLoop();
    throwIfAborted(opts.signal);
    const rows = this.validateTokens(tokens, opts);
    if (opts.edges) return this.runEdges(rows, opts, opts.edges);
    const B = rows.length;
    const T = rows[0].length;
    const Tk = (opts.past?.length ?? 0) + T;
    // the logit lens: in the forward graph where it has the lens's If, else its streams fetched here
    const lens = opts.lens ? this.checkLens(opts, B, T) : undefined;
    const lensHost = lens && !lens.inGraph ? lensHooks(this.spec.nLayers) : [];
    // hooks reduced (to statistics, to attribution products) are fetched too; those not asked for
    // whole are not returned, and stay on the device until reduced where the values stay there
    const statHooks = [...new Set(opts.hookStats ?? [])];
    const atpHooks = opts.attribution ? Object.keys(opts.attribution.keep) : [];
    const reducedHooks = [...new Set([...statHooks, ...atpHooks])];
    const asked = opts.hooks === 'all' ? 'all' : [...new Set([...(opts.hooks ?? []), ...reducedHooks, ...lensHost])];
    const { kind, wanted: fetched, hookSet, shapeOf } = this.hooksFor({ ...opts, hooks: asked });
    const whole = opts.hooks === 'all' ? fetched : (opts.hooks ?? []);
    const statOnly = reducedHooks.filter((h) => !whole.includes(h));
    const wanted = fetched.filter((h) => !statOnly.includes(h));
    const interventions = opts.interventions ?? [];
    const sites = compileInterventions(interventions, {
      shapeOf: (h) => (hookSet.has(h) ? shapeOf(h, B, T, Tk) : []),
      isSite: (h) => hookSet.has(h) && hookInfo(h).site,
      means: await this.meansFor(interventions, rows[0], opts),
    });

    const gradHooks = opts.grad ? this.checkGrad(opts, hookSet, B, logitPosCount(opts, T)) : undefined;
    const pick = this.checkPick(opts);
    // gradient runs always take a lean forward (only their intervention sites; outputs = the hooks
    // fetched or differentiated): every other site's edit would be computed, and differentiated, for nothing
    const lean: LeanPlan | undefined =
      (opts.lean || gradHooks) && !opts.sae && kind === 'base'
        ? {
            sites: [...new Set(interventions.map((i) => i.hook))].sort(),
            outputs: [...new Set([...fetched, ...(gradHooks ?? [])])].sort(),
          }
        : undefined;
    const { session, graph } = await this.variant({
      kind: 'hooked',
      withResult: kind === 'result',
      sae: opts.sae,
      lean,
      grad: gradHooks,
    });
    const feeds = buildFeeds(this.factory.ort, this.spec, graph, {
      rows,
      past: opts.past,
      logitPositions: opts.logitPositions,
      sites,
      gradSeed: opts.grad?.seed,
      argmax: pick.argmax,
      topK: pick.topK,
      lens: lens?.inGraph ? opts.lens : undefined,
    });
    if (lens?.inGraph && !graph.inputNames.includes(LENS_K))
      throw new LoupeError('INTERNAL', `the ${variantKey(BASE_VARIANT)} graph has no logit lens.`);
    // the layers that own a cache (a Gemma 4 KV-sharing layer reads its source layer's)
    const owners = Array.from({ length: this.spec.nLayers }, (_, l) => l).filter(
      (l) => this.spec.layers[l].attn?.kvFrom === undefined,
    );
    const kvOf = (l: number) => this.spec.layers[l].attn?.kvFrom ?? l;
    const presentNames = opts.returnCache ? owners.flatMap((l) => [`present.${l}.key`, `present.${l}.value`]) : [];
    if (opts.attribution) this.checkAttribution(opts.attribution, gradHooks);
    const fetches = [
      ...pick.fetches,
      ...(lens?.inGraph ? FORWARD_LENS_OUTPUTS : []),
      ...fetched,
      ...(gradHooks ?? []).map(gradName),
      ...presentNames,
    ];
    // gradients only reduced (attribution) are not returned
    const gradsOut = (opts.grad?.hooks ?? []).filter((h) => !atpHooks.includes(h));
    const onDev = session.keepsOnDevice ?? false;

    // hooks at some positions only: gathered on the device where the values stay there, else here
    const at = opts.hookPositions;
    if (at) checkPositions(at, T);
    const axes = Object.fromEntries(wanted.map((h) => [h, hookInfo(h).posAxis]));
    const gather = at && session.keepsOnDevice ? { positions: at, axes } : undefined;
    const keepCache = opts.returnCache === 'device' && session.keepsOnDevice;
    const reduce = opts.reduceLogits;
    if (reduce) this.checkReduce(reduce, pick.fetches);
    // reduced logits stay where the session keeps its values until the reduction has run
    const keep = [
      ...(keepCache ? presentNames : []),
      ...(reduce && session.keepsOnDevice ? ['logits'] : []),
      ...(onDev ? [...statOnly, ...statOnly.filter((h) => atpHooks.includes(h)).map(gradName)] : []),
      ...(onDev && opts.hooksOnDevice ? wanted : []),
    ];
    // sites patched from sources on the device: their adds made there
    const device = await this.deviceAdds(sites);
    for (const [site, t] of device.adds) feeds[addInput(site)] = t;
    const out = await runSession(
      session,
      feeds,
      fetches,
      'This may be out of memory; try a shorter prompt or a smaller batch.',
      '',
      { gather, keep: keep.length ? keep : undefined },
    ).finally(device.release);
    throwIfAborted(opts.signal);
    const hookAt = (h: string) => (at && !gather ? gatherAt(toTensor(out[h]), axes[h], at) : toTensor(out[h]));
    const result: RunResult = {
      logits:
        reduce || !out.logits
          ? { dims: [B, logitPosCount(opts, T), 0], data: new Float32Array(0) }
          : toTensor(out.logits),
      hooks: {},
    };
    // hooksOnDevice: those the session did keep there (the page's WebGPU session hands hooks back in JS)
    for (const h of wanted)
      if (opts.hooksOnDevice && onDevice(out[h]))
        (result.deviceHooks ??= {})[h] = { dims: [...out[h].dims], device: out[h], release: () => out[h].dispose?.() };
      else result.hooks[h] = hookAt(h);
    const ints = (t: OrtTensorLike) => Array.from(t.data as BigInt64Array, Number);
    if (pick.argmax) result.argmax = ints(out[PICK_ARGMAX]);
    if (pick.topK)
      result.top = { k: pick.topK, logits: out[PICK_TOP_LOGITS].data as Float32Array, ids: ints(out[PICK_TOP_IDS]) };
    if (reduce) result.logitRows = await this.reducedLogits(out.logits, reduce);
    if (opts.attribution) result.attribution = await this.attributionOf(opts.attribution, out);
    if (statHooks.length) result.hookStats = await this.statsOf(statHooks, out);
    if (gradHooks) result.grads = Object.fromEntries(gradsOut.map((h) => [h, toTensor(out[gradName(h)])]));
    if (lens?.inGraph) result.lens = lensTopOf(out, opts.lens!.k, 'lens.');
    else if (lens) result.lens = await this.lensOfHooks(result.hooks, opts.lens!, opts.hooks ?? []);
    this.lastHooksBytes = [...Object.values(result.hooks), ...Object.values(result.grads ?? {})].reduce(
      (s, t) => s + t.data.byteLength,
      0,
    );
    if (keepCache) {
      const names = (kind: string) =>
        Array.from({ length: this.spec.nLayers }, (_, l) => out[`present.${kvOf(l)}.${kind}`]);
      const device = { keys: names('key'), values: names('value'), batch: B };
      result.present = {
        keys: [],
        values: [],
        length: Tk,
        device,
        release: () => new Set([...device.keys, ...device.values]).forEach((t) => t.dispose?.()),
      };
    } else if (opts.returnCache) {
      const cache: KVCache = { keys: [], values: [], length: Tk };
      for (let l = 0; l < this.spec.nLayers; l++) {
        // a layer sharing another's keys and values holds that layer's tensors (the same objects, no copy)
        const from = kvOf(l);
        cache.keys.push(from === l ? toTensor(out[`present.${l}.key`]) : cache.keys[from]);
        cache.values.push(from === l ? toTensor(out[`present.${l}.value`]) : cache.values[from]);
      }
      result.present = cache;
    }
    return result;
  }

  private checkReduce(r: LogitReduce, fetched: string[]): void {
    const V = this.spec.dVocab;
    if (!fetched.includes('logits'))
      throw new LoupeError('BAD_INPUT', 'reduceLogits needs the logits: not with pick.logits false.');
    const bad = r.ids.find((i) => !Number.isInteger(i) || i < 0 || i >= V);
    if (bad !== undefined || r.ids.length === 0)
      throw new LoupeError('BAD_INPUT', `reduceLogits.ids must be 1 or more token ids in 0 … ${V - 1}.`);
    if (r.ref && r.ref.length !== V)
      throw new LoupeError('BAD_INPUT', `reduceLogits.ref must hold ${V} log-probabilities, got ${r.ref.length}.`);
  }

  /** a run's logits reduced to rows (runtime/reduce.ts) where they are: on the device, or here */
  private async reducedLogits(logits: OrtTensorLike, r: LogitReduce): Promise<LogitRow[]> {
    const dev = onDevice(logits);
    try {
      const s = await this.helper(`${logitReduceKey(r)}@${dev ? 'device' : 'host'}`, dev, () =>
        logitReduceGraph(!!r.ref),
      );
      const feeds: Record<string, OrtTensorLike> = { logits, ...logitReduceFeeds(this.factory.ort, r) };
      // a scan's reference row, the same for every batch: copied to the device once
      if (dev && r.ref && this.factory.upload) feeds.ref = await this.refOnDevice(r.ref, feeds.ref);
      const out = await runSession(s, feeds, logitReduceFetches(r), 'This may be out of memory.', ' reducing logits');
      return logitRows(out, r.ids.length);
    } finally {
      if (dev) logits.dispose?.();
    }
  }

  /**
   * The last reference row (LogitReduce.ref) copied to the device, kept while the same array is
   * given (an array given again is taken to hold the same values): a scan writes it once, not per batch.
   */
  private deviceRef?: { ref: Float32Array; tensor: OrtTensorLike };

  private async refOnDevice(ref: Float32Array, t: OrtTensorLike): Promise<OrtTensorLike> {
    if (this.deviceRef?.ref !== ref) {
      this.dropRef();
      this.deviceRef = { ref, tensor: await this.factory.upload!(t) };
      this.transfers.uploaded(t);
    }
    return this.deviceRef.tensor;
  }

  private dropRef(): void {
    this.deviceRef?.tensor.dispose?.();
    this.deviceRef = undefined;
  }

  /** hooks' statistics (runtime/reduce.ts): on the device those kept there, in one helper run; here the rest */
  private async statsOf(hooks: string[], out: Record<string, OrtTensorLike>): Promise<Record<string, HookStats>> {
    const r: Record<string, HookStats> = {};
    const dev = hooks.filter((h) => onDevice(out[h]));
    for (const h of hooks) if (!dev.includes(h)) r[h] = hostStats(toTensor(out[h]), hookInfo(h).posAxis);
    if (!dev.length) return r;
    try {
      const specs = dev.map((h) => ({ rank: out[h].dims.length, posAxis: hookInfo(h).posAxis }));
      const s = await this.helper(statsKey(specs), true, () => statsGraph(specs));
      const feeds = Object.fromEntries(dev.map((h, i) => [`x${i}`, out[h]]));
      const o = await runSession(s, feeds, statsFetches(dev.length), 'This may be out of memory.', ' reducing hooks');
      dev.forEach((h, i) => (r[h] = statsOf(o, i, out[h].dims)));
    } finally {
      for (const h of dev) out[h].dispose?.();
    }
    return r;
  }

  private checkAttribution(a: AttributionReduce, gradHooks: string[] | undefined): void {
    for (const h of Object.keys(a.keep))
      if (!gradHooks?.includes(h) || !a.against[h])
        throw new LoupeError('BAD_INPUT', `attribution: ${h} needs a gradient (grad.hooks) and an \`against\` value.`);
  }

  /**
   * Σ (against − value) · ∂M/∂value per hook over every axis but its `keep` (runtime/reduce.ts):
   * in one helper run on the device where the values are there, else here in float64.
   */
  private async attributionOf(
    a: AttributionReduce,
    out: Record<string, OrtTensorLike>,
  ): Promise<Record<string, Float32Array | Float64Array>> {
    const hooks = Object.keys(a.keep);
    const sub = a.subtract !== false;
    const r: Record<string, Float32Array | Float64Array> = {};
    const dev = hooks.filter((h) => onDevice(out[h]));
    const T = this.factory.ort.Tensor;
    const host = (x: Tensor | DeviceTensor): Tensor => {
      if ('data' in x) return x;
      throw new LoupeError('INTERNAL', 'attribution: a value on the device fed to a host reduction.');
    };
    for (const h of hooks)
      if (!dev.includes(h))
        r[h] = hostAttribution(
          host(a.against[h]),
          sub ? toTensor(out[h]) : null,
          toTensor(out[gradName(h)]),
          a.keep[h],
        );
    if (!dev.length) return r;
    try {
      const specs = dev.map((h) => ({ rank: out[h].dims.length, keep: a.keep[h], subtract: sub }));
      const s = await this.helper(attributionKey(specs), true, () => attributionGraph(specs));
      const feeds: Record<string, OrtTensorLike> = {};
      dev.forEach((h, i) => {
        const c = a.against[h];
        feeds[`c${i}`] = 'data' in c ? new T('float32', c.data, c.dims) : (c.device as OrtTensorLike);
        if (sub) feeds[`v${i}`] = out[h];
        feeds[`g${i}`] = out[gradName(h)];
      });
      const names = dev.map((_, i) => `r${i}`);
      const o = await runSession(s, feeds, names, 'This may be out of memory.', ' reducing attribution products');
      dev.forEach((h, i) => (r[h] = o[`r${i}`].data as Float32Array));
    } finally {
      for (const h of dev) {
        out[h].dispose?.();
        out[gradName(h)].dispose?.();
      }
    }
    return r;
  }

  /**
   * A weightless graph's session on the device, its outputs kept there where asked (`keep`), for
   * one computation (the caller releases it); its runs are counted and go through the model's queue.
   */
  private async deviceHelper(bytes: Uint8Array): Promise<DeviceHelper | undefined> {
    const s = this.transfers.wrap(await this.factory.helper!(bytes, true, true));
    if (!s.keepsOnDevice) {
      await s.release();
      return undefined;
    }
    return {
      run: (feeds, fetches, keep = []) =>
        this.enqueue(() => runSession(s, feeds, fetches, 'This may be out of memory.', ' on the device', { keep })),
      offDevice: () => s.placement?.()?.ops,
      release: () => s.release(),
    };
  }

  /** a helper session (a weightless graph), made on first use and kept; its runs are counted */
  private helper(key: string, dev: boolean, graph: () => Uint8Array, keep = false): Promise<EngineSession> {
    let s = this.helpers.get(key);
    if (!s) {
      const { ort, helper } = this.factory;
      s = (async () =>
        this.transfers.wrap(
          helper ? await helper(graph(), dev, keep) : wrapOrtSession(await ort.InferenceSession.create(graph())),
        ))();
      s.catch(() => this.helpers.delete(key));
      this.helpers.set(key, s);
    }
    return s;
  }

  /** A run of the edge-patching variant (api.ts EdgeRun): its inputs checked and shaped, then one session run. */
  private async runEdges(rows: number[][], opts: RunOptions, e: EdgeRun): Promise<RunResult> {
    const B = rows.length;
    const T = rows[0].length;
    const { nForward: Nf, nBackward: Nb } = edgeLayoutOf(this.spec);
    const D = this.spec.dModel;
    const bad = (m: string, hint?: string) => new LoupeError('BAD_INPUT', `Edge run: ${m}`, hint);
    if ((opts.hooks && opts.hooks.length) || opts.interventions?.length || opts.sae || opts.past || opts.returnCache)
      throw bad('hooks, interventions, an SAE and a KV cache do not apply to the edge variant.');
    if (opts.withResult || opts.lean) throw bad('withResult and lean do not apply to the edge variant.');
    if (opts.grad && opts.grad.hooks.length) throw bad('grad.hooks must be empty: the gradient is ∂M/∂w (edgeGrad).');
    if (opts.grad && e.outputs) throw bad('outputs are not returned by gradient runs.');
    const fits = (dims: readonly number[], want: (number | number[])[]) =>
      dims.length === want.length &&
      dims.every((d, i) => (Array.isArray(want[i]) ? (want[i] as number[]).includes(d) : d === want[i]));
    const refuse = (what: string, dims: readonly number[], want: (number | number[])[]) =>
      bad(`${what} has shape [${dims}], expected [${want.map((x) => (Array.isArray(x) ? x.join('|') : x))}].`);
    const shaped = (
      t: Tensor | undefined,
      what: string,
      want: (number | number[])[],
      dflt: number[],
      fill = 0,
    ): Tensor => {
      if (!t) return { dims: dflt, data: new Float32Array(dflt.reduce((a, b) => a * b, 1)).fill(fill) };
      if (!fits(t.dims, want) || t.data.length !== t.dims.reduce((a, b) => a * b, 1)) throw refuse(what, t.dims, want);
      return t;
    };
    // an input on the device (a source an earlier run left there, weights copied there once) is fed
    // as it is, after buildFeeds; a placeholder stands in for it until then
    const onDev: Record<string, DeviceTensor> = {};
    const placed = (
      t: Tensor | DeviceTensor | undefined,
      name: string,
      what: string,
      want: (number | number[])[],
    ): Tensor | undefined => {
      if (!t || 'data' in t) return t;
      if (!fits(t.dims, want)) throw refuse(what, t.dims, want);
      onDev[name] = t;
      const dims = want.map((x) => (Array.isArray(x) ? x[0] : x));
      return { dims, data: new Float32Array(dims.reduce((a, b) => a * b, 1)) };
    };
    const rowsOf = opts.grad ? [B] : [1, B];
    const wShape = [rowsOf, Nf, Nb];
    const w = shaped(placed(e.weights, EDGE_W, 'weights', wShape), 'weights', wShape, [opts.grad ? B : 1, Nf, Nb]);
    const srcShape = [[1, B], Nf, [1, T], [1, D]];
    const src = shaped(placed(e.source, EDGE_SRC, 'source', srcShape), 'source', srcShape, [1, Nf, 1, 1]);
    const gShape = [[1, B], Nf];
    const gate = opts.grad ? shaped(placed(e.gate, EDGE_GATE, 'gate', gShape), 'gate', gShape, [1, Nf], 1) : undefined;
    if ((e.gate || e.sumRows) && !opts.grad) throw bad('gate and sumRows apply to gradient runs only.');
    const P = logitPosCount(opts, T);
    if (opts.grad) {
      const want = [B, P, this.spec.dVocab];
      const sd = opts.grad.seed.dims;
      if (sd.length !== 3 || sd.some((d, i) => d !== want[i]))
        throw bad(`grad.seed must have shape [${want}], got [${sd}].`);
    }
    const { session, graph } = await this.variant({ kind: 'edge', grad: !!opts.grad });
    const feeds = buildFeeds(this.factory.ort, this.spec, graph, {
      rows,
      logitPositions: opts.logitPositions,
      sites: new Map(),
      gradSeed: opts.grad?.seed,
      edges: { w, src, self: e.subtract ? 1 : 0, gate },
    });
    for (const [name, t] of Object.entries(onDev)) feeds[name] = t.device as OrtTensorLike;
    const gradOut = e.sumRows ? EDGE_GRAD_SUM : gradName(EDGE_W);
    const fetches = [
      ...(e.logits === false ? [] : ['logits']),
      ...(opts.grad ? [gradOut] : []),
      ...(e.outputs ? [EDGE_OUT] : []),
    ];
    const keep = e.outputs === 'device' && session.keepsOnDevice;
    const out = await runSession(
      session,
      feeds,
      fetches,
      'This may be out of memory; try fewer examples per batch.',
      '',
      keep ? { keep: [EDGE_OUT] } : undefined,
    );
    const kept = keep && onDevice(out[EDGE_OUT]) ? out[EDGE_OUT] : undefined;
    if (opts.signal?.aborted) kept?.dispose?.();
    throwIfAborted(opts.signal);
    const logits = out.logits ? toTensor(out.logits) : { dims: [B, P, 0], data: new Float32Array(0) };
    const result: RunResult = { logits, hooks: {} };
    if (opts.grad) result.edgeGrad = toTensor(out[gradOut]);
    if (kept) result.edgeOutputsOnDevice = deviceTensor(kept);
    else if (e.outputs) result.edgeOutputs = toTensor(out[EDGE_OUT]);
    this.lastHooksBytes = (result.edgeGrad?.data.byteLength ?? 0) + (result.edgeOutputs?.data.byteLength ?? 0);
    return result;
  }

  /**
   * Which graph variant a run needs ('result' when any hook_result is asked for), the hooks it
   * returns, the hooks that exist in that variant (plus the attached SAE's), and their shapes.
   */
  private hooksFor(opts: RunOptions) {
    const wanted =
      opts.hooks === 'all' ? [...(opts.withResult ? this.hookSets.result : this.hookSets.base)] : (opts.hooks ?? []);
    const kind: 'base' | 'result' =
      opts.withResult || wanted.some((h) => h.endsWith('.hook_result')) ? 'result' : 'base';
    const sae = opts.sae ? this.sae(opts.sae).spec.info : undefined;
    const hookSet = sae
      ? new Set([...this.hookSets[kind], ...['acts_post', 'recons', 'error'].map((k) => `${sae.hook}.hook_sae_${k}`)])
      : this.hookSets[kind];
    const shapeOf = (h: string, b: number, t: number, tk: number) =>
      sae && h.startsWith(`${sae.hook}.hook_sae_`)
        ? h.endsWith('acts_post')
          ? [b, t, sae.d_sae]
          : shapeOfHook(this.spec, sae.hook, b, t, tk)
        : shapeOfHook(this.spec, h, b, t, tk);
    for (const h of wanted) {
      if (!hookSet.has(h))
        throw new LoupeError(
          'UNKNOWN_HOOK',
          `'${h}' is not a hook of this model.`,
          unknownHookHint(
            this.spec,
            h,
            `Hooks look like blocks.0.hook_resid_pre, blocks.0.attn.hook_pattern; call hookNames() for the full list.`,
          ),
        );
    }
    return { kind, wanted, hookSet, shapeOf };
  }

  /** RunOptions.pick checked: what the run fetches of the logits, and the k of its top k (0: none). */
  private checkPick(opts: RunOptions): { fetches: string[]; argmax: boolean; topK: number } {
    const p = opts.pick;
    if (!p) return { fetches: ['logits'], argmax: false, topK: 0 };
    if (opts.grad) throw new LoupeError('BAD_INPUT', 'pick does not apply to gradient runs.');
    const V = this.spec.dVocab;
    const topK = p.topK ?? 0;
    if (!Number.isInteger(topK) || topK < 0 || topK > V)
      throw new LoupeError('BAD_INPUT', `pick.topK must be an integer 1 … ${V}, got ${p.topK}.`);
    const argmax = !!p.argmax;
    if (p.logits === false && !argmax && !topK && !opts.lens)
      throw new LoupeError('BAD_INPUT', 'pick.logits is false and nothing else is picked.', 'Ask for argmax or topK.');
    const fetches = [
      ...(p.logits === false ? [] : ['logits']),
      ...(argmax ? [PICK_ARGMAX] : []),
      ...(topK ? [PICK_TOP_LOGITS, PICK_TOP_IDS] : []),
    ];
    return { fetches, argmax, topK };
  }

  /** Validate a gradient request; returns the hooks in a canonical order (one graph variant per set). */
  private checkGrad(opts: RunOptions, hookSet: Set<string>, B: number, P: number): string[] {
    const g = opts.grad!;
    if (opts.past || opts.returnCache || opts.withResult)
      throw new LoupeError(
        'BAD_INPUT',
        'Gradients are computed without a KV cache and without hook_result.',
        'Run the full prompt without past/returnCache/withResult.',
      );
    if (!Array.isArray(g.hooks) || g.hooks.length === 0)
      throw new LoupeError(
        'BAD_INPUT',
        'grad.hooks is empty.',
        'Name at least one hook, e.g. blocks.0.hook_resid_pre.',
      );
    for (const h of g.hooks) {
      if (!hookSet.has(h))
        throw new LoupeError(
          'UNKNOWN_HOOK',
          `'${h}' is not a hook of this model.`,
          unknownHookHint(this.spec, h, 'Call hookNames() for the full list.'),
        );
      if (h.endsWith('.hook_result') || h.endsWith('.hook_sae_recons') || h.endsWith('.hook_sae_error'))
        throw new LoupeError(
          'BAD_INPUT',
          `'${h}' is computed beside the graph, not on the path to the logits, so it has no gradient here.`,
          h.endsWith('hook_result')
            ? 'Use attn.hook_z (the per-head input of W_O).'
            : 'Use the SAE hook itself or hook_sae_acts_post.',
        );
    }
    const V = this.spec.dVocab;
    const want = [B, P, V];
    if (g.seed.dims.length !== 3 || g.seed.dims.some((d, i) => d !== want[i]) || g.seed.data.length !== B * P * V) {
      throw new LoupeError('BAD_INPUT', `grad.seed must have the logits' shape [${want}], got [${g.seed.dims}].`);
    }
    return [...new Set(g.hooks)].sort();
  }

  private validateTokens(tokens: number[] | number[][], opts: RunOptions): number[][] {
    let rows: number[][] = Array.isArray(tokens[0]) ? (tokens as number[][]) : [tokens as number[]];
    if (opts.batch !== undefined) {
      if (!Number.isInteger(opts.batch) || opts.batch < 1)
        throw new LoupeError('BAD_INPUT', `batch must be a positive integer (got ${opts.batch}).`);
      if (rows.length === 1) rows = Array.from({ length: opts.batch }, () => rows[0]);
      else if (rows.length !== opts.batch)
        throw new LoupeError('BAD_INPUT', `batch ${opts.batch} does not match ${rows.length} token rows.`);
    }
    const T = rows[0]?.length ?? 0;
    if (T === 0)
      throw new LoupeError('EMPTY_PROMPT', 'There are no tokens to run.', 'Type a prompt (or keep BOS prepended).');
    if (rows.some((r) => r.length !== T))
      throw new LoupeError('BAD_INPUT', 'All token rows of a batch must have the same length.');
    const P = opts.past?.length ?? 0;
    if (P + T > this.spec.nCtx) {
      throw new LoupeError(
        'PROMPT_TOO_LONG',
        `${P + T} tokens exceed this model's context of ${this.spec.nCtx}.`,
        `Shorten the prompt to at most ${this.spec.nCtx - P} tokens.`,
        { tokens: P + T, n_ctx: this.spec.nCtx },
      );
    }
    const V = this.spec.dVocab;
    for (const r of rows)
      for (const id of r) {
        if (!Number.isInteger(id) || id < 0 || id >= V)
          throw new LoupeError('BAD_TOKEN_ID', `Token id ${id} is outside the vocabulary (0..${V - 1}).`);
      }
    return rows;
  }

  /** 'mean' interventions without a value use the clean activation's mean over this prompt's positions. */
  private async meansFor(
    list: Intervention[],
    row: number[],
    opts: RunOptions,
  ): Promise<Map<string, Tensor> | undefined> {
    const need = [...new Set(list.filter((i) => i.op === 'mean' && !i.value).map((i) => i.hook))];
    if (need.length === 0) return undefined;
    for (const h of need)
      if (!this.hookSets.result.has(h)) throw new LoupeError('UNKNOWN_HOOK', `'${h}' is not a hook of this model.`);
    const clean = await this.runNow(row, {
      hooks: need,
      past: undefined,
      signal: opts.signal,
      withResult: need.some((h) => h.endsWith('hook_result')),
    });
    const means = new Map<string, Tensor>();
    for (const h of need) {
      const t = clean.hooks[h];
      const info = hookInfo(h);
      const dims = t.dims;
      const T = dims[info.posAxis];
      const restAxes = dims.map((_, a) => a).filter((a) => a !== 0 && a !== info.posAxis);
      const restSize = restAxes.reduce((s, a) => s * dims[a], 1);
      const acc = new Float64Array(restSize);
      const strides = dims.map((_, a) => dims.slice(a + 1).reduce((s, d) => s * d, 1));
      for (let i = 0; i < t.data.length; i++) {
        let rest = 0;
        for (const ax of restAxes) rest = rest * dims[ax] + (Math.floor(i / strides[ax]) % dims[ax]);
        acc[rest] += t.data[i];
      }
      means.set(h, { dims: [restSize], data: Float32Array.from(acc, (v) => v / T) });
    }
    return means;
  }

  memory(): ModelMemory {
    let js = 0,
      params = 0;
    const why: string[] = [];
    for (const [f, b] of this.parts.weights.files) {
      js += b.byteLength;
      const quantised = f === quantFile('q8') || f === quantFile('q4');
      if (quantised && this.parts.q8InJs) why.push(this.parts.q8InJs);
      else if (!quantised && !why.includes(SOURCE_IN_JS)) why.push(SOURCE_IN_JS);
    }
    for (const p of this.params.values()) params += p.data.byteLength;
    return {
      weight_bytes: this.info.weight_bytes,
      precision: this.info.weights,
      js_weight_bytes: js,
      ...(why.length ? { js_weights_why: why.join('; ') } : {}),
      param_bytes: params,
      sessions: this.sessions.size,
      hooks_bytes: this.lastHooksBytes,
      transfers: this.transfers.counts(),
      ...(this.deviceRecoveries ? { device_recoveries: this.deviceRecoveries } : {}),
      ...(this.parts.decision ? { budget: budgetOf(this.parts.decision.estimate) } : {}),
    };
  }

  /**
   * After DEVICE_LOST: every session and helper released, the factory's values on the device
   * dropped (so that the runtime makes a new device), and the base session made again on it.
   * In the queue, after the failed task. DEVICE_LOST again where the runtime cannot (JSEP).
   */
  recoverDevice(): Promise<void> {
    return this.enqueue(async () => {
      await this.releaseAll();
      await this.factory.reset?.();
      const lost = () => this.factory.deviceLost?.() ?? false;
      await this.variant(BASE_VARIANT).catch((e) => {
        if (!lost()) throw e;
      });
      // the runtime kept its lost device (JSEP makes one per module): only a new process recovers
      if (lost())
        throw new LoupeError(
          'DEVICE_LOST',
          'The GPU device was lost, and this runtime cannot make a new one in this process.',
          'Start the engine again (the page restarts its model worker); or use another backend.',
          { again: false, restart: true },
        );
      this.deviceRecoveries++;
    });
  }

  private async releaseAll(): Promise<void> {
    this.dropRef();
    const sessions = [...this.sessions.values()];
    const helpers = [...this.helpers.values()];
    this.sessions.clear();
    this.created.clear();
    this.helpers.clear();
    for (const s of sessions) await (await s.catch(() => undefined))?.session.release().catch(() => undefined);
    for (const s of helpers) await (await s.catch(() => undefined))?.release().catch(() => undefined);
  }

  async dispose(): Promise<void> {
    this.dropRef();
    for (const s of this.sessions.values()) await (await s).session.release().catch(() => undefined);
    for (const s of this.helpers.values()) await (await s.catch(() => undefined))?.release().catch(() => undefined);
    this.helpers.clear();
    this.sessions.clear();
    this.created.clear();
  }
}

/** the model's weights plus a transcoder set's files (its skip matrices are the replacement graph's only weights of its own) */
function withTranscoderWeights(base: WeightSet, tc: AttachedTranscoders): WeightSet {
  return {
    files: new Map([...base.files, ...tc.weights.files]),
    paths: new Map([...base.paths, ...tc.weights.paths]),
    ranged: new Map([...(base.ranged ?? []), ...(tc.weights.ranged ?? [])]),
    tensors: new Map([...base.tensors, ...tc.weights.tensors]),
    metadata: base.metadata,
  };
}
