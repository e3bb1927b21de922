/**
 * Mixture-of-experts interventions over MCP: `loupe mcp --headless --allow-local DIR` driven by the
 * SDK's Client over stdio, on a random Mixtral (8 experts, top 2) in a folder DIR allows. The ablate
 * tool's schema offers `expert` and `route`; ablating one expert's output, forbidding its routing
 * and forcing it each return the document the operation returns called directly on the same model
 * (whose numbers tests/engine-moe checks against the float64 reference), and a bad expert is an
 * isError result naming the field.
 */
import path from 'node:path';
import type { Client } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { LoadedModel } from '../src/engine/api';
import { loadModelNode } from '../src/node/load';
import { operations } from '../src/ops/index';
import { OrderedClient } from './helpers/mcp-client';
import { MOE_FAMILY_CASES, makeCaseModel, type RandomModel } from './reference';

const ROOT = path.resolve(__dirname, '..');
const BIN = path.join(ROOT, 'bin', 'loupe.mjs');

let client: Client;
let rm: RandomModel;
let allowed: string;
let dir: string;
let model: LoadedModel;

beforeAll(async () => {
  rm = makeCaseModel(MOE_FAMILY_CASES[0]);
  allowed = path.dirname(rm.dir);
  dir = rm.dir;
  const transport = new StdioClientTransport({
    command: process.execPath,
    args: [BIN, 'mcp', '--headless', '--allow-local', allowed],
    cwd: ROOT,
    stderr: 'pipe',
  });
  client = new OrderedClient({ name: 'moe-mcp-test', version: '1' });
  await client.connect(transport);
  model = await loadModelNode(rm.dir, { backend: 'node' });
}, 60_000);
afterAll(async () => {
  await client?.close();
  await model?.dispose();
  rm?.cleanup();
});

describe('MoE interventions over MCP (headless)', () => {
  it('the ablate tool offers expert and route', async () => {
    const { tools } = await client.listTools();
    const props = (tools.find((t) => t.name === 'ablate')!.inputSchema.properties ?? {}) as Record<string, any>;
    expect(props.expert).toMatchObject({ type: 'integer' });
    expect(props.route.enum).toEqual(['forbid', 'force']);
  });

  it('ablate one expert, forbid and force its routing: each equals the operation called directly', async () => {
    const seen: number[] = [];
    // the expert layer 1 weighs most at the last position, so that each edit reaches the prediction
    const probe = (await operations.ablate.run(model, { prompt: 'abc ab', layer: 1, expert: 0 }, {})) as any;
    const tokens = probe.tokens.map((t: { id: number }) => t.id);
    const w = (await model.run(tokens, { hooks: ['blocks.1.mlp.hook_router_weights'] })).hooks[
      'blocks.1.mlp.hook_router_weights'
    ];
    const E = model.info.num_experts!;
    const last = Array.from(w.data.slice(w.data.length - E));
    const top = last.indexOf(Math.max(...last));
    const load = await client.callTool({ name: 'load_model', arguments: { model: dir } });
    expect(load.isError, JSON.stringify(load.content)).toBeFalsy();
    for (const [extra, label, hook] of [
      [{}, `L1E${top}`, `blocks.1.mlp.experts.${top}.hook_out`],
      [{ route: 'forbid' }, `L1E${top}.forbid`, 'blocks.1.mlp.hook_router_logits'],
      [{ route: 'force' }, `L1E${top}.force`, 'blocks.1.mlp.hook_router_logits'],
    ] as const) {
      const args = { prompt: 'abc ab', layer: 1, expert: top, ...extra };
      const r = await client.callTool({ name: 'ablate', arguments: args });
      expect(r.isError, JSON.stringify(r.content)).toBeFalsy();
      const doc = r.structuredContent as any;
      expect(doc.entries[0].label).toBe(label);
      expect(doc.interventions[0].hook).toBe(hook);
      const direct = (await operations.ablate.run(model, args, {})) as any;
      // the model block names where it was loaded from; everything else is the same document
      expect({ ...doc, model: undefined }).toEqual({ ...direct, model: undefined });
      // the edit changes the prediction's logit (the three differ from one another too, below)
      expect(Math.abs(doc.entries[0].logit_delta)).toBeGreaterThan(1e-4);
      seen.push(doc.entries[0].logit_delta);
    }
    expect(new Set(seen.map((x) => x.toFixed(6))).size).toBe(3);
  }, 120_000);

  it('an expert the layer does not have is an isError result naming it', async () => {
    const r = await client.callTool({ name: 'ablate', arguments: { prompt: 'abc ab', layer: 1, expert: 8 } });
    expect(r.isError).toBe(true);
    const err = JSON.parse((r.content as { text: string }[])[0].text).error;
    expect(err.code).toBe('BAD_INPUT');
    expect(err.message).toMatch(/expert 8/i);
  }, 60_000);
});
