/**
 * Real tool results for the MCP Apps e2e: `loupe mcp --headless` over stdio driven by the official
 * client v2, every operation tool called once (a random SAE and transcoder set for the stories260K
 * shapes, in a folder the companion allows with --allow-local).
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Client } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';
import { makeRandomSae } from '../../tests/helpers/random-sae';
import { makeRandomTranscoders } from '../../tests/helpers/random-transcoders';

export const APP_PROMPT = 'Once upon a time, there was a little girl named Lily';
const P = APP_PROMPT;
const CORRUPT = 'Once upon a time, there was a little boy named Lily';
const ANSWER = { answer: ' she', counterfactual: ' he' };
const CORPUS = ['Once upon a time there was a cat.', 'The dog ran to the park.', 'Lily liked to play with her ball.'];
const LABELLED = [
  { text: 'Lily was happy and smiled.', label: 1 },
  { text: 'Tom was sad and cried.', label: 0 },
  { text: 'The sun was warm and nice.', label: 1 },
  { text: 'The rain was cold and bad.', label: 0 },
  { text: 'She liked the big red ball.', label: 1 },
  { text: 'He lost his toy and cried.', label: 0 },
];

export interface ToolCall {
  name: string;
  arguments: Record<string, unknown>;
}

/** the arguments of each operation tool, given the SAE and transcoder folders */
export function callsFor(sae: string, saePath: string, tc: string): Record<string, Record<string, unknown>> {
  const saeArgs = { sae_source: sae, sae_path: saePath };
  return {
    trace: { prompt: P, top_k: 8 },
    activations: { prompt: P },
    attention: { prompt: P, layers: [0, 1] },
    logit_lens: { prompt: P },
    head_scores: { prompt: P },
    composition_scores: {},
    ablate: { prompt: P, layer: 1, component: 'attn_out' },
    circuit: { prompt: P },
    layer_ablation: { prompt: P },
    patch: { prompt: P, corrupted_prompt: CORRUPT, ...ANSWER },
    attribution_patching: { prompt: P, corrupted_prompt: CORRUPT, ...ANSWER },
    integrated_gradients: { prompt: P, corrupted_prompt: CORRUPT, ...ANSWER, steps: 8 },
    edge_attribution: { generate: { task: 'induction', n: 4, length: 6 } },
    attribution_graph: { prompt: 'Once upon a time, there was', transcoder_source: tc },
    feature_intervention: {
      prompt: 'Once upon a time, there was',
      transcoder_source: tc,
      interventions: '<from attribution_graph>',
    },
    steer: { prompt: P, layer: 2, direction: 'random:1', alpha: 4, max_new_tokens: 8 },
    sweep: { prompt: P, layer: 2, direction: 'random:1', max_new_tokens: 6 },
    causality: { prompt: P, layer: 2, direction: 'random:1', targets: [' happy'] },
    capture: { prompts: LABELLED, hooks: ['blocks.2.hook_resid_post'] },
    probe: { capture: '<from capture>' },
    generate: { prompt: P, max_new_tokens: 12 },
    sae_features: { prompt: P, ...saeArgs, top_k: 6 },
    feature: { prompt: P, ...saeArgs, feature: 3 },
    sae_steer: { prompt: P, ...saeArgs, feature: 3, alpha: 4, max_new_tokens: 8 },
    dashboard: { layer: 1, neuron: 5, corpus: CORPUS.join('\n'), window: 8 },
  };
}

export interface Companion {
  client: Client;
  stderr: () => string;
  close(): Promise<void>;
}

export async function startCompanion(): Promise<Companion & { sae: string; saePath: string; tc: string }> {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'loupe-apps-e2e-'));
  const saePath = '';
  const sae = makeRandomSae({
    hook: 'blocks.2.hook_resid_pre',
    dIn: 64,
    dSae: 256,
    seed: 21,
    modelName: 'stories260K',
  });
  const tc = makeRandomTranscoders({ kind: 'plt', nLayers: 5, dModel: 64, features: 64, skip: true, seed: 21 });
  let err = '';
  const transport = new StdioClientTransport({
    command: process.execPath,
    args: ['bin/loupe.mjs', 'mcp', '--headless', '--allow-local', sae.dir, '--allow-local', tc.dir],
    stderr: 'pipe',
    env: { ...process.env } as Record<string, string>,
  });
  transport.stderr?.on('data', (d) => (err += d.toString()));
  const client = new Client({ name: 'apps-e2e', version: '1' });
  await client.connect(transport);
  return {
    client,
    sae: sae.dir,
    saePath,
    tc: tc.dir,
    stderr: () => err,
    close: async () => {
      await client.close().catch(() => undefined);
      for (const d of [dir, sae.dir, tc.dir]) rmSync(d, { recursive: true, force: true });
    },
  };
}
