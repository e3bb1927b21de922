/**
 * Loupe's one table of limits: every size read from a file, a link or a request is checked
 * against one of these before anything proportional to it is allocated, and over a limit is
 * TOO_LARGE (or BAD_CONFIG for a model's config), naming the field and the limit. The CLI, the
 * page's worker, the headless companion and the MCP tools all refuse the same things.
 *
 * Adding a limit: one entry here (a doc comment saying what it bounds and why that value), a
 * check where the size is read — `checkCap('maxX', value, 'field')` or a specific helper below —
 * before the allocation it bounds, and a row in docs/bridge.md's table of limits
 * (tests/caps-docs.test.ts asks for every key there).
 */
import { LoupeError } from './errors';

const MiB = 1024 * 1024;

export const CAPS = {
  // ---- a model's dimensions (config.json), checked before the adapter builds anything per layer
  /** transformer blocks (num_hidden_layers / n_layer); the largest published models have ~130 */
  maxLayers: 1024,
  /** attention heads per layer, query or key/value (num_attention_heads, num_key_value_heads) */
  maxHeads: 1024,
  /** residual width (hidden_size / n_embd) */
  maxDModel: 65_536,
  /** MLP width (intermediate_size / n_inner) */
  maxDMlp: 1_048_576,
  /** experts per mixture-of-experts layer (num_local_experts / num_experts); the largest published have 256 */
  maxExperts: 512,
  /** experts each token is routed to (num_experts_per_tok); every expert runs on every token (graph/build-model.ts moe) */
  maxExpertsPerToken: 64,
  /** width of one head (head_dim) */
  maxDHead: 4096,
  /** vocabulary size (vocab_size); the largest tokenizers have ~262k entries */
  maxVocab: 4_194_304,
  /** context a config may claim (max_position_embeddings / n_positions); runs are bounded by maxTokens */
  maxPositions: 16_777_216,

  // ---- a model's weight files: the index and the safetensors headers, read before any weight byte
  /** safetensors files of one model (the shards model.safetensors.index.json names) */
  maxShards: 1024,
  /** bytes of one safetensors header (the reference implementation's cap is 100 MB) */
  maxHeaderBytes: 100_000_000,
  /** bytes of all of one model's safetensors headers together (real models: a few MB) */
  maxHeaderBytesTotal: 128 * MiB,
  /** characters of one file name in the index, or one revision (a cache's path component is 255 bytes) */
  maxNameChars: 200,

  // ---- small files: read with a hard cap, validated before they are cached
  /** config.json, generation_config.json */
  maxConfigBytes: 1 * MiB,
  /** tokenizer.json (the largest real ones are ~35 MB) */
  maxTokenizerBytes: 64 * MiB,
  /** tokenizer_config.json (it carries the chat template and the added tokens) */
  maxTokenizerConfigBytes: 16 * MiB,
  /** model.safetensors.index.json */
  maxIndexBytes: 64 * MiB,
  /** an SAE's cfg.json */
  maxSaeConfigBytes: 1 * MiB,
  /** a feature-descriptions file (explanations.json, a Neuronpedia export), as stored (gzip or not) */
  maxDescriptionsBytes: 256 * MiB,
  /** an SAE's weights (sae_weights.safetensors): its header is read first and judged against this */
  maxSaeBytes: 2 * 1024 * MiB,
  /**
   * a transcoder set's weight files together, as stored: judged from their headers before the download
   * (a 16k PLT set for a 640-wide, 18-layer model is 1.5 GiB at float32)
   */
  maxTranscoderBytes: 32 * 1024 * MiB,
  /** one layer's transcoder encoder as float32, held while that layer is encoded (features × d_model × 4) */
  maxTranscoderLayerBytes: 1024 * MiB,
  /** an attribution graph's float32 adjacency rows (chosen features + logits, each over every node), held until it is pruned */
  maxAdjacencyBytes: 1024 * MiB,

  // ---- the headless companion's engine thread
  /**
   * MiB of JS heap the headless companion's engine thread may use (weights live outside it): past it
   * the thread is ended, the call is TOO_LARGE, and the companion answers on
   */
  engineHeapMiB: 4096,

  // ---- time: every request has both
  /**
   * seconds a request may go without a byte before it fails (NETWORK_ERROR); --idle-timeout / LOUPE_IDLE_TIMEOUT.
   * A stalled download is retried twice (resuming), so one that stalls every time fails after 3 × this plus
   * 0.9 s of backoff (181 s at 60 s), or at requestDeadlineS if that comes first
   */
  idleTimeoutS: 60,
  /** seconds any one request may take in all, before its bytes are counted in */
  requestDeadlineS: 300,
  /** bytes per second the deadline allows on top of requestDeadlineS for the bytes a request may carry */
  requestMinRateBytesPerS: 64 * 1024,

  // ---- chat templates (rendered with @huggingface/jinja, bounded)
  /** characters of a chat_template */
  maxTemplateChars: 1 * MiB,
  /**
   * steps one rendering may take: evaluations, blocks (every loop iteration), items a loop walks or
   * range() builds, KiB of output (a real template takes a few thousand)
   */
  maxTemplateSteps: 200_000,
  /** seconds one rendering may take, whatever it spends them on */
  templateDeadlineS: 5,
  /** characters of any string (or items of any list) a rendering builds, its output included */
  maxTemplateOutputChars: 1 * MiB,

  // ---- tokenizer
  /** characters of one regex in tokenizer.json (a normalizer's or pre-tokenizer's pattern) */
  maxTokenizerRegexChars: 4096,

  // ---- text and tokens of a request
  /** tokens per prompt, whatever the model's context (the model's n_ctx also applies) */
  maxTokens: 2048,
  /** tokens one generate/steer call may add */
  maxNewTokens: 1024,
  /**
   * characters per token a text may have before tokenizing: any text that reaches the tokenizer
   * (prompt, answer, counterfactual, targets, controls, corpus entries, dataset pairs) longer than
   * min(n_ctx, maxTokens) × this is refused before it is tokenized
   */
  maxCharsPerToken: 64,

  // ---- runs and documents
  /** rows of one batched engine run */
  maxBatch: 64,
  /** entries of a top-k list */
  maxTopK: 1000,
  /** numbers one document may carry in its large arrays (patterns, lens tables) */
  maxDocumentNumbers: 4_000_000,

  // ---- datasets of clean/corrupted pairs (ops/lib/dataset.ts) and edge circuits
  /** pairs of one dataset, inline, as text or generated */
  maxDatasetPairs: 4096,
  /** characters of a dataset given as text (JSON Lines or CSV): about 1 kB a pair at maxDatasetPairs */
  maxDatasetChars: 4 * MiB,
  /** bytes of a circuit file (EAP-IG Graph.to_json) the CLI reads: GPT-2 small's is 2.4 MB, Gemma-2-2B's about 6 MB */
  maxCircuitFileBytes: 64 * MiB,
  /** edges edge_attribution's `exact` scores without allow_large_exact: it costs edges × pairs forward rows */
  maxExactEdges: 2000,

  // ---- documents from outside (share links, imported sessions)
  /** characters of a share link's fragment */
  maxLinkChars: 2_000_000,
  /** bytes a share link's payload may inflate to */
  maxLinkJsonBytes: 16 * MiB,
  /** bytes of an imported session file */
  maxSessionFileBytes: 256 * MiB,
  /** entries a session keeps (and an import brings in) */
  maxSessionEntries: 100,
  /** values (numbers, strings, booleans, nulls) one document from outside may hold in all: maxDocumentNumbers in its large arrays and room for the rest */
  maxDocumentValues: 8_000_000,
  /** levels of nesting of a document from outside (real documents have fewer than 10) */
  maxDocumentDepth: 64,
  /** heads of a whole model (n_layers × n_heads) a document from outside may describe: views draw a cell per head (the largest published models have ~16k) */
  maxModelHeads: 32_768,
} as const;

export type CapName = keyof typeof CAPS;

const fmt = (n: number) => n.toLocaleString('en-US');

/** TOO_LARGE (or `code`) when `value` exceeds the cap, naming the field and the limit. */
export function checkCap(
  cap: CapName,
  value: number,
  field: string,
  opts: { code?: 'TOO_LARGE' | 'BAD_CONFIG'; unit?: string; hint?: string; details?: Record<string, unknown> } = {},
): void {
  const limit = CAPS[cap];
  if (!(value <= limit)) {
    const unit = opts.unit ? ` ${opts.unit}` : '';
    throw new LoupeError(
      opts.code ?? 'TOO_LARGE',
      `${field} = ${fmt(value)}${unit} exceeds Loupe's limit of ${fmt(limit)}${unit} (${cap}).`,
      opts.hint ?? 'The input is larger than anything Loupe is built to read; check that it is the right one.',
      { field, value, limit, cap, ...opts.details },
    );
  }
}

/** TOO_LARGE: a file over the bound its reader set (the size the plan judged, or a small file's cap). */
export function fileTooLarge(file: string, bytes: number, maxBytes: number, declared: boolean): LoupeError {
  return new LoupeError(
    'TOO_LARGE',
    `${file} ${declared ? 'declares' : 'has more than'} ${fmt(bytes)} bytes, more than the ${fmt(maxBytes)} it may have.`,
    'The file is larger than the plan judged before the download (or than Loupe reads for such a file); nothing of it was kept.',
    { file, bytes, maxBytes },
  );
}

/** A dimension read from config.json: a positive integer within its cap, else BAD_CONFIG naming the field. */
export function checkDim(cap: CapName, value: unknown, field: string): number {
  const hint = "The model's config.json is damaged or hostile.";
  if (typeof value === 'number' && value > CAPS[cap])
    checkCap(cap, value, `config.json: ${field}`, { code: 'BAD_CONFIG', hint });
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < 1)
    throw new LoupeError(
      'BAD_CONFIG',
      `config.json: ${field} = ${JSON.stringify(value)} is not a positive integer.`,
      hint,
      {
        field,
        value,
      },
    );
  return value;
}

/**
 * Characters a text may have before it is tokenized: min(n_ctx, maxTokens) × maxCharsPerToken.
 * A longer text cannot fit the tokens a run may take, and tokenizing it first costs seconds to minutes.
 */
export function maxTextChars(nCtx: number): number {
  return Math.min(nCtx, CAPS.maxTokens) * CAPS.maxCharsPerToken;
}

/** PROMPT_TOO_LONG before tokenizing a text that cannot fit (see maxTextChars); `field` names it. */
export function checkTextLength(nCtx: number, text: string, field = 'text'): void {
  const limit = maxTextChars(nCtx);
  if (text.length > limit) {
    const tokens = Math.min(nCtx, CAPS.maxTokens);
    throw new LoupeError(
      'PROMPT_TOO_LONG',
      `${field} has ${fmt(text.length)} characters, more than the ${fmt(limit)} (${tokens} ` +
        `tokens × ${CAPS.maxCharsPerToken}) a text may have before it is tokenized.`,
      `Shorten ${field}: a run takes at most ${tokens} tokens.`,
      { field, chars: text.length, limit, n_ctx: nCtx },
    );
  }
}

/** prompt length against the model's context and the global cap; `extra` = tokens still to come */
export function checkTokenCount(model: { info: { n_ctx: number } }, n: number, extra = 0): void {
  const nCtx = model.info.n_ctx;
  const limit = Math.min(nCtx, CAPS.maxTokens);
  if (n + extra > limit) {
    const which =
      nCtx <= CAPS.maxTokens ? `the model's context (n_ctx = ${nCtx})` : `Loupe's cap of ${CAPS.maxTokens} tokens`;
    const what = extra > 0 ? `${n} prompt tokens + ${extra} new tokens = ${n + extra}` : `${n} tokens`;
    throw new LoupeError(
      'PROMPT_TOO_LONG',
      `${what} exceed ${which}.`,
      extra > 0
        ? `Shorten the prompt or ask for at most ${Math.max(0, limit - n)} new tokens.`
        : `Shorten the prompt to at most ${limit} tokens (BOS included).`,
    );
  }
}

export function checkNewTokens(n: number): void {
  if (!Number.isInteger(n) || n < 0)
    throw new LoupeError('BAD_INPUT', `max_new_tokens must be a non-negative integer (got ${n}).`);
  if (n > CAPS.maxNewTokens)
    throw new LoupeError(
      'TOO_LARGE',
      `max_new_tokens = ${n} exceeds the cap of ${CAPS.maxNewTokens}.`,
      `Ask for at most ${CAPS.maxNewTokens} tokens per call.`,
    );
}

export function checkBatch(n: number): void {
  if (n > CAPS.maxBatch)
    throw new LoupeError(
      'TOO_LARGE',
      `A batch of ${n} rows exceeds the cap of ${CAPS.maxBatch}.`,
      'Split the request into smaller ones.',
    );
}

export function checkTopK(k: number, field = 'top_k'): void {
  if (k > CAPS.maxTopK)
    throw new LoupeError(
      'TOO_LARGE',
      `${field} = ${k} exceeds the cap of ${CAPS.maxTopK}.`,
      `Use ${field} ≤ ${CAPS.maxTopK}.`,
    );
}

/** how many numbers a document would carry; refuse before computing them */
export function checkDocumentSize(numbers: number, what: string, hint: string): void {
  if (numbers > CAPS.maxDocumentNumbers) {
    throw new LoupeError(
      'TOO_LARGE',
      `${what} would return ${fmt(numbers)} numbers, more than the cap of ${fmt(CAPS.maxDocumentNumbers)}.`,
      hint,
    );
  }
}

/** a JSON-safe number: documents never carry NaN or ±Infinity (JSON cannot hold them) */
export function finite(x: number): number {
  if (Number.isFinite(x)) return x;
  throw new LoupeError(
    'RUNTIME_ERROR',
    `A non-finite value (${x}) came out of the computation.`,
    'The model produced NaN or infinite activations for this input; try another backend or prompt.',
  );
}
