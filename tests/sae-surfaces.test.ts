/**
 * One `sae_features` document from three surfaces — the CLI (`--json`), the operation called
 * directly, and the headless MCP server (`loupe mcp --headless` over stdio, SDK Client) — must be
 * identical. The SAE is a random one in SAELens layout for the bundled stories260K, served by the
 * local Hub stand-in; the CLI and the MCP server find it through HF_ENDPOINT (each with its own
 * empty directory cache), the direct call through its own loaders. A mismatched SAE (d_in 32) is
 * an isError result with SAE_MISMATCH over MCP, and the server stays usable.
 */
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { Client } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { LoadedModel } from '../src/engine/api';
import { loadModelNode } from '../src/node/load';
import { createNodeSaeLoaders } from '../src/node/load-sae';
import { operations } from '../src/ops/index';
import { startHubServer, type HubServer } from './helpers/hub-server';
import { makeRandomSae, type RandomSae } from './helpers/random-sae';
import { errorOf } from './bridge-fake-page';
import type { OperationDocument } from '../src/ops/index';
type SaeFeaturesDocument = OperationDocument<'sae_features'>;

const ROOT = path.resolve(__dirname, '..');
const BIN = path.join(ROOT, 'bin', 'loupe.mjs');
const REPO = 'loupe-test/stories260K-saes';
const SAE_PATH = 'blocks.2.hook_resid_pre';
const BAD_PATH = 'd32/blocks.2.hook_resid_pre';
const PROMPT = 'Once upon a time, there was a little';
const INPUT = { prompt: PROMPT, sae_source: REPO, sae_path: SAE_PATH, top_k: 6 };

let hub: HubServer;
let saes: RandomSae[] = [];
let client: Client;
let model: LoadedModel;
const caches: string[] = [];
let stderr = '';

function serve(sae: RandomSae, dir: string): void {
  for (const f of ['cfg.json', 'sae_weights.safetensors'])
    hub.addFile(REPO, `${dir}/${f}`, readFileSync(path.join(sae.dir, f)));
}

/** the environment of a child surface: the Hub stand-in, and a fresh cache of its own */
function childEnv(): Record<string, string> {
  const cache = mkdtempSync(path.join(tmpdir(), 'loupe-sae-surfaces-'));
  caches.push(cache);
  return { ...(process.env as Record<string, string>), HF_ENDPOINT: hub.url, LOUPE_CACHE_DIR: cache };
}

beforeAll(async () => {
  hub = await startHubServer();
  hub.addRepo(REPO, null);
  const good = makeRandomSae({ hook: SAE_PATH, dIn: 64, dSae: 256, seed: 21, modelName: 'stories260K' });
  const bad = makeRandomSae({ hook: SAE_PATH, dIn: 32, dSae: 64, seed: 22 });
  saes = [good, bad];
  serve(good, SAE_PATH);
  serve(bad, BAD_PATH);
  // descriptions for a few features, in Neuronpedia's export layout, next to the SAE
  const records = Array.from({ length: 128 }, (_, i) => ({
    modelId: 'stories260K',
    layer: '2-res-test',
    index: String(i * 2),
    description: `even feature ${i * 2}`,
  }));
  hub.addFile(REPO, `${SAE_PATH}/explanations.json`, JSON.stringify(records));

  const transport = new StdioClientTransport({
    command: process.execPath,
    args: [BIN, 'mcp', '--headless'],
    cwd: ROOT,
    env: childEnv(),
    stderr: 'pipe',
  });
  transport.stderr?.on('data', (d) => (stderr += d.toString()));
  client = new Client({ name: 'sae-surfaces-test', version: '1' });
  await client.connect(transport);
  model = await loadModelNode('default', { backend: 'node' });
});

afterAll(async () => {
  await client?.close();
  await model?.dispose();
  await hub?.close();
  for (const s of saes) rmSync(s.dir, { recursive: true, force: true });
  for (const c of caches) rmSync(c, { recursive: true, force: true });
});

describe('sae_features on every surface', () => {
  it('CLI --json, the operation called directly and headless MCP give the same document', async () => {
    // the CLI runs in a child process while this one serves the Hub stand-in: never execFileSync here
    const cli = promisify(execFile)(
      process.execPath,
      [BIN, 'sae_features', 'default', PROMPT, '--sae-source', REPO, '--sae-path', SAE_PATH, '--top-k', '6', '--json'],
      { cwd: ROOT, env: childEnv() },
    );
    const mcp = client.callTool({ name: 'sae_features', arguments: INPUT });
    const sae = createNodeSaeLoaders({ cache: false, endpoint: hub.url });
    const direct: SaeFeaturesDocument = await operations.sae_features.run(model, INPUT, {
      loadSae: sae.loadSae,
      loadSaeFile: sae.loadSaeFile,
    });
    const viaMcp = await mcp;
    expect(viaMcp.isError, stderr).toBeFalsy();
    const viaCli = JSON.parse((await cli).stdout);

    // a real decomposition, with descriptions where the file has them and null elsewhere
    expect(direct.sae).toMatchObject({ source: REPO, path: SAE_PATH, hook: SAE_PATH, d_in: 64, d_sae: 256 });
    expect(direct.descriptions.count).toBe(128);
    expect(direct.positions.length).toBe(direct.tokens.length);
    const listed = direct.positions.flatMap((p) => p.features);
    expect(listed.length).toBeGreaterThan(direct.positions.length);
    expect(listed.some((f) => f.description === null) && listed.some((f) => f.description !== null)).toBe(true);
    for (const f of listed) expect(f.description === null).toBe(f.feature % 2 === 1);
    expect(direct.logit_attribution.available).toBe(true);

    expect(viaCli).toEqual(direct);
    expect(viaMcp.structuredContent).toEqual(direct);
    // every surface fetched the SAE itself (separate caches), each file once: its header by two
    // range reads (judged before the download), then the rest after it
    expect(hub.stats(REPO, `${SAE_PATH}/sae_weights.safetensors`).requests).toBe(3 * 3);
  });

  it('a mismatched SAE is an isError result (SAE_MISMATCH) over MCP, and the server stays usable', async () => {
    const e = errorOf(await client.callTool({ name: 'sae_features', arguments: { ...INPUT, sae_path: BAD_PATH } }));
    expect(e.code).toBe('SAE_MISMATCH');
    expect(e.message).toMatch(/32/);
    const again = await client.callTool({ name: 'sae_features', arguments: INPUT });
    expect(again.isError).toBeFalsy();
    // the second call in the same server used its loaded SAE / cache: no new weight request
    expect(hub.stats(REPO, `${SAE_PATH}/sae_weights.safetensors`).requests).toBe(3 * 3);
  });
});
