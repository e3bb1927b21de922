/**
 * Fields shared by every document. Every operation's output schema extends `documentBase`.
 * Bump SCHEMA_VERSION on any breaking change of a document's fields.
 */
import { z } from 'zod';
import type { InterventionRecord, LoadedModel } from '../engine/api';

export const SCHEMA_VERSION = '1.0.0';

export const modelBlock = z.object({
  id: z.string(),
  /** the name asked for and the Hub id it resolved to, when a catalog name (engine/catalog.ts) named the model, as NeuronScope records them */
  requested_name: z.string().optional(),
  resolved_name: z.string().optional(),
  revision: z.string(),
  /** the Hub commit the weights came from (X-Repo-Commit), so a document names the exact bytes after a branch moves */
  commit: z.string().optional(),
  architecture: z.string(),
  n_layers: z.number().int(),
  n_heads: z.number().int(),
  n_kv_heads: z.number().int(),
  d_model: z.number().int(),
  d_head: z.number().int(),
  d_mlp: z.number().int(),
  d_vocab: z.number().int(),
  n_ctx: z.number().int(),
  n_params: z.number().int(),
  backend: z.string(),
  dtype: z.string(),
  /** weight precision that ran: f32 (widened at load) or stored (16-bit, widened at use); absent in documents from before it was recorded */
  weights: z.string().optional(),
});
export type ModelBlock = z.infer<typeof modelBlock>;

const positions = z.union([z.literal('all'), z.array(z.number().int())]);

/** one intervention a document lists (engine/api.ts InterventionRecord): every intervening operation uses this */
export const interventionRecord = z.object({
  hook: z.string(),
  op: z.enum(['zero', 'scale', 'add', 'set', 'mean', 'patch']),
  head: z.number().int().optional(),
  neuron: z.number().int().optional(),
  positions: positions.optional(),
  alpha: z.number().optional(),
  value: z.array(z.number()).optional(),
  direction: z.unknown().optional(),
  normalize: z.boolean().optional(),
  from: z.string().optional(),
  sae: z.object({ source: z.string(), path: z.string() }).optional(),
}) satisfies z.ZodType<InterventionRecord>;

export const interventionList = z
  .array(interventionRecord)
  .describe('the interventions run, as data (engine/api.ts InterventionRecord)');

export const tokenEntry = z.object({ id: z.number().int(), text: z.string() });

/** the one input field that asks for chat format (engine/chat.ts), shared by every prompt-taking operation */
export const chatField = z
  .boolean()
  .default(false)
  .describe(
    "Chat format for instruct checkpoints: render prompt as one user message through the model's own " +
      "chat_template (tokenizer_config.json), ending with the assistant's turn, and run the rendered text. " +
      'BOS is not prepended again (the template writes it). NO_CHAT_TEMPLATE when the model has none.',
  );

/** how the prompt was formatted before tokenizing; present only when chat format was asked for */
export const promptFormat = z.object({
  chat: z.literal(true),
  /** the text as the user gave it; the document's `prompt` (and `tokens`) are the rendered text */
  user_prompt: z.string(),
  rendered: z.string(),
});
export type PromptFormat = z.infer<typeof promptFormat>;

export function documentBase<Op extends string>(operation: Op) {
  return z.object({
    schema_version: z.literal(SCHEMA_VERSION),
    operation: z.literal(operation),
    model: modelBlock,
    prompt: z.string(),
    tokens: z.array(tokenEntry),
    prompt_format: promptFormat.optional(),
    /** what happened to the job that a reader of its numbers should know (a GPU device lost and recovered) */
    notices: z
      .array(z.string())
      .optional()
      .describe('what happened during the run that the numbers do not show, e.g. a GPU device lost and recovered'),
  });
}

export function modelBlockOf(model: LoadedModel): ModelBlock {
  const i = model.info;
  return {
    id: i.id,
    ...(i.requested_name ? { requested_name: i.requested_name, resolved_name: i.id } : {}),
    revision: i.revision,
    ...(i.commit ? { commit: i.commit } : {}),
    architecture: i.architecture,
    n_layers: i.n_layers,
    n_heads: i.n_heads,
    n_kv_heads: i.n_kv_heads,
    d_model: i.d_model,
    d_head: i.d_head,
    d_mlp: i.d_mlp,
    d_vocab: i.d_vocab,
    n_ctx: i.n_ctx,
    n_params: i.n_params,
    backend: i.backend,
    dtype: i.dtype,
    weights: i.weights,
  };
}

/** The common head of a document: call at the top of every operation. */
export function documentHead<Op extends string>(operation: Op, model: LoadedModel, prompt: string, ids: number[]) {
  const texts = model.tokenStrings(ids);
  return {
    schema_version: SCHEMA_VERSION as typeof SCHEMA_VERSION,
    operation,
    model: modelBlockOf(model),
    prompt,
    tokens: ids.map((id, i) => ({ id, text: texts[i] })),
  };
}
