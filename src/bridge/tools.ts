/**
 * The MCP tool list: the bridge's own tools (loupe_status, load_model, list_models, job_*) and
 * one tool per registered operation, whose inputSchema/outputSchema are the operation's zod
 * schemas converted to JSON Schema draft-07 — the same conversion the SDK's McpServer applies,
 * so every client that works with SDK servers can read them.
 */
import { z } from 'zod';
import { WEIGHTS_HELP, WEIGHTS_MODES, type WeightsMode } from '../engine/precision';
import type { Operation } from '../ops/types';
import { toJsonSchema } from '../ops/schemas';
import { modelBlock } from '../schema/common';
import { toolUiMeta } from './apps';

export type JsonSchema = Record<string, unknown> & { type: 'object' };

export interface ToolDef {
  name: string;
  title?: string;
  description: string;
  inputSchema: JsonSchema;
  outputSchema?: JsonSchema;
  annotations?: {
    title?: string;
    readOnlyHint?: boolean;
    destructiveHint?: boolean;
    idempotentHint?: boolean;
    openWorldHint?: boolean;
  };
  /** `ui`: the MCP Apps view that draws its result (apps.ts) */
  _meta?: Record<string, unknown>;
}

/**
 * zod → JSON Schema with a root of type "object", as MCP requires for tool schemas. The schema
 * keeps its `$schema` (draft-07): MCP reads a schema without one as 2020-12, where draft-07's
 * tuple `items: [...]` is invalid, and clients that compile it (the official client v2) refused
 * the tools whose documents hold tuples.
 */
export function toObjectSchema(schema: z.ZodType, io: 'input' | 'output'): JsonSchema {
  const js = toJsonSchema(schema, io, 'draft-7');
  if (js.type !== 'object') js.type = 'object'; // e.g. a root union of objects: anyOf stays as the constraint
  return js as JsonSchema;
}

// ---- the bridge's own tools ----

export const loadModelInput = z.object({
  model: z
    .string()
    .min(1)
    .describe(
      "What to load: 'default' (the bundled stories260K, no download), a model name as TransformerLens gives it " +
        "('gpt2-small', 'gemma-3-270m', 'pythia-70m-deduped'; `loupe models` lists them), a Hugging Face Hub id such as " +
        "'openai-community/gpt2', a URL of a folder holding config.json, tokenizer.json and *.safetensors, " +
        'or (headless, inside a folder the companion allows with --allow-local) a local folder path.',
    ),
  revision: z.string().optional().describe("Hub revision (branch, tag or commit); default 'main'."),
  backend: z
    .enum(['auto', 'webgpu', 'wasm', 'node'])
    .optional()
    .describe(
      "Runtime: in the page 'auto' (WebGPU if available, else WASM), 'webgpu' or 'wasm'; " +
        "headless 'node' (default), 'wasm' or 'webgpu' (onnxruntime-node's WebGPU provider).",
    ),
  weights: z
    .enum(WEIGHTS_MODES as [WeightsMode, ...WeightsMode[]])
    .optional()
    .describe(`Weight precision: ${WEIGHTS_HELP} The model info and every document name the precision that ran.`),
});
export type LoadModelInput = z.infer<typeof loadModelInput>;

/** the model fields load_model and list_models name: the document's model block (schema/common.ts), id alone required */
const modelInfoLoose = modelBlock
  .pick({
    id: true,
    revision: true,
    architecture: true,
    n_layers: true,
    n_heads: true,
    d_model: true,
    n_params: true,
    backend: true,
    dtype: true,
    weights: true,
  })
  .partial()
  .required({ id: true })
  .loose();
/** What load_model returns (page and headless alike). */
export const loadModelOutput = z.looseObject({
  loaded: z.literal(true),
  model: modelInfoLoose,
  load_ms: z.number().optional(),
});
/** What list_models returns (page and headless alike). */
export const listModelsOutput = z.looseObject({
  loaded: modelInfoLoose.nullable().describe('the model operations run on now, or null'),
  models: z.array(
    z.looseObject({
      id: z.string(),
      revision: z.string().optional(),
      source: z.string().describe("'bundled', 'cached' (bytes kept by this browser or machine), 'folder' or 'hub'"),
      size_bytes: z.number().optional(),
      loaded: z.boolean().optional(),
    }),
  ),
});

export const jobIdInput = z.object({
  job_id: z.string().describe('The job_id a long operation returned when called with as_job: true.'),
});
export const jobResultInput = jobIdInput.extend({
  wait_s: z
    .number()
    .min(0)
    .max(50)
    .optional()
    .describe('Wait up to this many seconds for the job to finish before answering (default 0).'),
});

export const jobHandle = z.object({
  job_id: z.string(),
  tool: z.string(),
  status: z.enum(['running', 'succeeded', 'failed', 'cancelled']),
  progress: z.object({ stage: z.string(), done: z.number(), total: z.number() }).nullable(),
  created_at: z.string(),
  finished_at: z.string().nullable(),
  expires_at: z.string().describe('after this the job_id is forgotten (and a running job is stopped)'),
  error: z.object({ code: z.string(), message: z.string(), hint: z.string().optional() }).nullable(),
  hint: z.string(),
});
export type JobHandle = z.infer<typeof jobHandle>;

export const compareInput = z.object({
  a: z.string().describe('A: a result URI, loupe://results/{id}, from an earlier call in this session'),
  b: z.string().describe('B: another result URI of this session; Δ = B − A'),
});
const resultRef = z.object({
  uri: z.string(),
  operation: z.string(),
  model: z.string().nullable(),
  prompt: z.string().nullable(),
});
export const compareOutput = z.object({
  a: resultRef,
  b: resultRef,
  grids: z
    .array(
      z.object({
        key: z.string().describe('which grid of the documents'),
        what: z.string().describe('what a cell holds (units)'),
        rows: z.array(z.string()),
        cols: z.array(z.string()),
        delta: z
          .array(z.array(z.number().nullable()))
          .nullable()
          .describe("B − A per cell, rows and columns matched by name in A's order; null when not comparable"),
        max_abs_delta: z.number().nullable(),
        note: z.string().nullable(),
        reason: z.string().nullable().describe('why there is no Δ, when there is none'),
      }),
    )
    .describe(
      'every grid either document has (DLA heatmaps, logit lens, patterns, effects …), as the page compares them',
    ),
  numbers: z
    .object({
      compared: z.number().describe('numeric leaves walked in both documents together'),
      max_abs_diff: z.number(),
      match: z.boolean().describe('every number within 1e-4 (relative above 1) and every other field equal'),
      first_differences: z.array(z.string()).describe('paths of the first differences (at most 5)'),
    })
    .describe('the documents walked as numbers (backend and timings skipped)'),
});

const statusOutput = z.looseObject({
  mode: z.enum(['page', 'headless']),
  version: z.string(),
});

const LONG_NOTE =
  ' Long-running: pass as_job: true to get a job_id at once, then poll job_status and fetch the document with job_result.';
const SURFACE_NOTE =
  ' Runs on the model currently loaded in the paired Loupe page (or in this process with --headless); see loupe_status, change it with load_model.';

export function bridgeTools(mode: 'page' | 'headless'): ToolDef[] {
  const where =
    mode === 'headless'
      ? 'in this process (headless mode, onnxruntime-node)'
      : "in the user's paired Loupe browser tab";
  /** loupe_status and list_models take nothing */
  const noInput = toObjectSchema(z.object({}), 'input');
  /** the tools that only read this session's state */
  const readsState = { readOnlyHint: true, openWorldHint: false };
  return [
    {
      name: 'loupe_status',
      title: 'Loupe status',
      description:
        `Where Loupe runs tools (${where}), whether a page is paired and which model it has loaded, ` +
        'the pairing URL to give the user when no page is connected, and the running jobs. Cheap; call it first.',
      inputSchema: noInput,
      outputSchema: toObjectSchema(statusOutput, 'output'),
      annotations: readsState,
    },
    {
      name: 'load_model',
      title: 'Load a model',
      description:
        'Load a transformer language model (config.json + tokenizer.json + safetensors; Llama, GPT-2, ' +
        `Mistral, Qwen, Gemma … families) ${where}; every operation tool then runs on it. Downloads from the ` +
        'Hugging Face Hub on first use (can take minutes for 100M+ parameters; progress notifications report ' +
        "bytes), then loads from the cache. Returns the model's dimensions (n_layers, n_heads, d_model, …).",
      inputSchema: toObjectSchema(loadModelInput, 'input'),
      outputSchema: toObjectSchema(loadModelOutput, 'output'),
      annotations: { readOnlyHint: false, idempotentHint: true, openWorldHint: true },
    },
    {
      name: 'list_models',
      title: 'List models',
      description:
        'The model loaded now and the models available without a download (bundled, ' +
        `or cached ${mode === 'headless' ? 'on this machine' : 'in this browser'}), with sizes in bytes. Cheap.`,
      inputSchema: noInput,
      outputSchema: toObjectSchema(listModelsOutput, 'output'),
      annotations: readsState,
    },
    {
      name: 'job_status',
      title: 'Job status',
      description:
        'Status of a job started with as_job: true: running / succeeded / failed / cancelled, ' +
        'its latest progress (stage, done, total) and when its id expires. Cheap; poll every few seconds.',
      inputSchema: toObjectSchema(jobIdInput, 'input'),
      outputSchema: toObjectSchema(jobHandle, 'output'),
      annotations: readsState,
    },
    {
      name: 'job_result',
      title: 'Job result',
      description:
        "The finished job's document — exactly what the operation returns when called directly. " +
        "While the job is still running it returns the job's status instead (status: 'running'); " +
        'a failed or cancelled job returns its error. Results are kept until expires_at.',
      inputSchema: toObjectSchema(jobResultInput, 'input'),
      annotations: readsState,
    },
    {
      name: 'job_cancel',
      title: 'Cancel a job',
      description: 'Stop a running job (the page or process stops within one forward pass) and return its status.',
      inputSchema: toObjectSchema(jobIdInput, 'input'),
      outputSchema: toObjectSchema(jobHandle, 'output'),
      annotations: { readOnlyHint: false, idempotentHint: true, openWorldHint: false },
    },
  ];
}

/** compare: two stored results by URI, not their numbers resent. */
export const compareTool: ToolDef = {
  name: 'compare',
  title: 'Compare two results',
  description:
    "Put two results of this session side by side by their URIs (loupe://results/{id}, from a result's " +
    'resource_link or resources/list): for every grid they have — DLA layer × head, logit lens, ' +
    'attention patterns, patching maps, ablation effects — Δ = B − A per cell, rows and columns matched by name, ' +
    'or the reason there is none (different models, operations, targets or token counts). Cheap; runs no model.',
  inputSchema: toObjectSchema(compareInput, 'input'),
  outputSchema: toObjectSchema(compareOutput, 'output'),
  annotations: { readOnlyHint: true, openWorldHint: false },
};

export const BRIDGE_TOOL_NAMES = [
  'loupe_status',
  'load_model',
  'list_models',
  'job_status',
  'job_result',
  'job_cancel',
  'compare',
] as const;

/** One tool per operation: its description, its input (+ as_job for long ones), its output. */
export function operationTool(op: Operation): ToolDef {
  const input = toObjectSchema(op.input, 'input');
  const output = toObjectSchema(op.output, 'output');
  if (op.long) {
    input.properties = {
      ...(input.properties as Record<string, unknown> | undefined),
      as_job: {
        type: 'boolean',
        description: 'Return a job_id at once instead of waiting; poll job_status, then job_result.',
      },
    };
  }
  let outputSchema: JsonSchema = output;
  if (op.long) {
    // The call returns either the document or, with as_job, a job handle.
    const { definitions, $schema, ...doc } = output as Record<string, unknown>;
    const { $schema: _, ...handle } = toObjectSchema(jobHandle, 'output');
    outputSchema = {
      $schema,
      type: 'object',
      anyOf: [doc, handle],
      ...(definitions ? { definitions } : {}),
    };
  }
  return {
    name: op.name,
    title: op.title,
    description: op.description + (op.long ? LONG_NOTE : '') + SURFACE_NOTE,
    inputSchema: input,
    outputSchema,
    annotations: { readOnlyHint: true, openWorldHint: false },
  };
}

/**
 * Every tool. An operation whose view is built (`hasView`) names it in `_meta.ui` for every client:
 * the metadata is inert where a client has no MCP Apps support, and one list for all keeps
 * tools/list the same for every client (and cacheable).
 */
export function listTools(
  mode: 'page' | 'headless',
  ops: Record<string, Operation>,
  hasView: (op: string) => boolean = () => false,
): ToolDef[] {
  return [
    ...bridgeTools(mode),
    compareTool,
    ...Object.values(ops).map((op) => {
      const t = operationTool(op);
      return hasView(op.name) ? { ...t, _meta: toolUiMeta(op.name) } : t;
    }),
  ];
}
