/**
 * Model names as researchers give them (engine/catalog.ts): TransformerLens's official names and
 * aliases map to Hub ids, any case; a one-part name the table lacks is MODEL_NOT_FOUND naming the
 * nearest ones; an SAE source is never read as a model name. End to end, through the Hub stand-in
 * (nothing downloaded from anywhere else): `loupe trace gemma-3-270m` resolves the alias to
 * google/gemma-3-270m (served: a gemma3-shaped random model), judges it from its headers before
 * the weights, runs (its logits equal the float64 reference's) and records requested_name /
 * resolved_name; `loupe models` lists the table with each entry judged.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { CATALOG, judgeEntry, lookupModelName, namesOf, nearestModelNames } from '../src/engine/catalog';
import { SUPPORTED_MODEL_TYPES } from '../src/engine/arch';
import { isValidHubId } from '../src/engine/source/hub-source';
import { resolveModelRef } from '../src/engine/source/ref';
import { LoupeError } from '../src/engine/errors';
import { GiB } from '../src/engine/budget';
import { loadModelNode } from '../src/node/load';
import { startHubServer, type HubServer } from './helpers/hub-server';
import { Client } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';
import { ALL_FAMILY_CASES, makeCaseModel, referenceForward, type RandomModel } from './reference';

const BIN = resolve(__dirname, '../bin/loupe.mjs');

describe('the catalog: TransformerLens names → Hub ids', () => {
  it('every entry is a family Loupe runs, a valid Hub id, and no name names two entries', () => {
    const seen = new Map<string, string>();
    for (const e of CATALOG) {
      expect(SUPPORTED_MODEL_TYPES, e.id).toContain(e.family);
      expect(isValidHubId(e.id), e.id).toBe(true);
      for (const n of namesOf(e)) {
        const k = n.toLowerCase();
        expect(seen.get(k) ?? e.id, `${n} names ${seen.get(k)} and ${e.id}`).toBe(e.id);
        seen.set(k, e.id);
      }
    }
  });

  // each pair copied from TransformerLens's supported_models.py (MODEL_ALIASES), or Loupe's own name (†)
  const NAMES: [string, string][] = [
    ['gpt2', 'gpt2'],
    ['gpt2-small', 'gpt2'],
    ['gpt2-medium', 'gpt2-medium'],
    ['gpt2-xs', 'distilgpt2'],
    ['pythia-70m', 'EleutherAI/pythia-70m'],
    ['pythia', 'EleutherAI/pythia-70m'],
    ['EleutherAI/pythia-19m', 'EleutherAI/pythia-70m'],
    ['pythia-160m-deduped', 'EleutherAI/pythia-160m-deduped'],
    ['pythia-125m-deduped', 'EleutherAI/pythia-160m-deduped'],
    ['neox', 'EleutherAI/gpt-neox-20b'],
    ['gemma-2-2b', 'google/gemma-2-2b'],
    ['gemma-3-270m', 'google/gemma-3-270m'],
    ['gemma-3-1b-pt', 'google/gemma-3-1b-pt'],
    ['gemma-3-1b', 'google/gemma-3-1b-pt'], // †
    ['gemma-3-4b-it', 'google/gemma-3-4b-it'],
    ['qwen3-0.6b', 'Qwen/Qwen3-0.6B'],
    ['qwen2.5-0.5b', 'Qwen/Qwen2.5-0.5B'],
    ['llama-3.2-1b', 'meta-llama/Llama-3.2-1B'], // †
    ['Llama-2-7b', 'meta-llama/Llama-2-7b-hf'],
    ['mistral-7b', 'mistralai/Mistral-7B-v0.1'],
    ['olmo-2-1b', 'allenai/OLMo-2-0425-1B'],
    ['phi-3', 'microsoft/Phi-3-mini-4k-instruct'],
    ['phi-3-mini', 'microsoft/Phi-3-mini-4k-instruct'], // †
    ['phi-4', 'microsoft/phi-4'],
    // mixture of experts (TL 4cd36aa: Mixtral's and OLMoE's aliases; none for Qwen2-MoE or Qwen3-MoE)
    ['mixtral', 'mistralai/Mixtral-8x7B-v0.1'],
    ['mixtral-8x7b-instruct', 'mistralai/Mixtral-8x7B-Instruct-v0.1'],
    ['olmoe', 'allenai/OLMoE-1B-7B-0924'],
    ['olmoe-1b-7b', 'allenai/OLMoE-1B-7B-0924'], // †
    ['qwen3-30b-a3b', 'Qwen/Qwen3-30B-A3B'], // †
    ['qwen1.5-moe-a2.7b', 'Qwen/Qwen1.5-MoE-A2.7B'], // †
  ];
  it.each(NAMES)('%s → %s, in any case (as TL lowercases both sides)', (name, id) => {
    expect(lookupModelName(name)?.entry.id).toBe(id);
    expect(lookupModelName(name.toUpperCase())?.entry.id).toBe(id);
    const ref = resolveModelRef(`${name}@v1`, { names: true });
    expect(ref).toMatchObject({ kind: 'hub', id, revision: 'v1' });
    expect((ref as { requested?: string }).requested).toBe(name === id ? undefined : name);
  });

  it('a one-part name the table lacks is MODEL_NOT_FOUND with the nearest names; owner/name passes through', () => {
    let err: unknown;
    try {
      resolveModelRef('gemma-3-207m', { names: true });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(LoupeError);
    const le = err as LoupeError;
    expect(le.code).toBe('MODEL_NOT_FOUND');
    expect((le.details as { nearest: string[] }).nearest[0]).toBe('gemma-3-270m');
    expect(le.hint).toContain("'gemma-3-270m'");
    expect(nearestModelNames('pythia-70m-dedup')[0]).toBe('pythia-70m-deduped');
    expect(nearestModelNames('gpt2-smal')[0]).toBe('gpt2-small');
    expect(resolveModelRef('someone/gemma-3-270m', { names: true })).toMatchObject({ id: 'someone/gemma-3-270m' });
    expect(resolveModelRef('someone/gemma-3-270m', { names: true })).not.toHaveProperty('requested');
  });

  it('an SAE source is never read as a model name (the SAE loaders pass no `names`)', () => {
    expect(resolveModelRef('gpt2-small')).toMatchObject({ kind: 'hub', id: 'gpt2-small' });
    expect(resolveModelRef('gpt2-small-res-jb')).toMatchObject({ kind: 'hub', id: 'gpt2-small-res-jb' });
  });

  it('each entry is judged from its nominal size by the memory model, before anything is fetched', () => {
    const j = (name: string, limits = {}) => judgeEntry(lookupModelName(name)!.entry, limits);
    // BF16, 268M: f32 on the heap 268M × 4 × 2.2 + 256 MiB < 4 GiB
    expect(j('gemma-3-270m').verdict).toBe('fits WASM');
    expect(j('gemma-3-270m').memory.find((m) => m.backend === 'wasm')!.precision).toBe('f32');
    // BF16, 1.0B: f32 would need 8.8 GB of heap, stored 2.0 GB + 256 MiB
    expect(j('gemma-3-1b').memory.find((m) => m.backend === 'wasm')!.precision).toBe('stored');
    expect(j('gemma-3-1b').verdict).toBe('fits WASM');
    // F32, 2.61B: stored is f32 (10.4 GB), q8 2.61B × 1.0625 = 2.8 GB + 256 MiB < 4 GiB
    expect(j('gemma-2-2b').verdict).toBe('needs q8');
    expect(j('gemma-2-2b').downloadBytes).toBe(2.61e9 * 4);
    // BF16, 4.3B at q8: 4.6 GB > 4 GiB; on WebGPU (GPU memory unknown) it fits
    expect(j('gemma-3-4b').verdict).toBe('WebGPU only');
    // with 8 GiB of host memory, the page's peak of a 27B model (×3.4 of its q8 bytes) does not fit
    expect(j('gemma-3-27b', { hostBytes: 8 * GiB }).verdict).toBe('too large here');
  });
});

describe('`loupe trace gemma-3-270m` against the Hub stand-in', () => {
  let hub: HubServer;
  let rm: RandomModel;
  let cache: string;
  const REPO = 'google/gemma-3-270m';
  beforeAll(async () => {
    hub = await startHubServer();
    rm = makeCaseModel(ALL_FAMILY_CASES.find((c) => c.name === 'gemma3-text-bf16')!);
    hub.addRepo(REPO, rm.dir);
    cache = mkdtempSync(join(tmpdir(), 'loupe-catalog-'));
  });
  afterAll(async () => {
    await hub?.close();
    rm?.cleanup();
    rmSync(cache, { recursive: true, force: true });
  });

  const loupe = (args: string[]) =>
    new Promise<{ code: number; stdout: string; stderr: string }>((res) =>
      execFile(
        process.execPath,
        [BIN, ...args],
        {
          cwd: tmpdir(),
          maxBuffer: 64 << 20,
          env: { ...process.env, NO_COLOR: '1', HF_ENDPOINT: hub.url, LOUPE_CACHE_DIR: cache },
        },
        (err, stdout, stderr) =>
          res({ code: err ? (typeof (err as any).code === 'number' ? (err as any).code : 1) : 0, stdout, stderr }),
      ),
    );

  it('resolves the alias, judges the headers before the weights, runs, and records both names', async () => {
    const r = await loupe(['trace', 'gemma-3-270m', 'hello world', '--json', '--quiet']);
    expect(r.code, r.stderr).toBe(0);
    const doc = JSON.parse(r.stdout);
    expect(doc.model).toMatchObject({
      id: REPO,
      requested_name: 'gemma-3-270m',
      resolved_name: REPO,
      architecture: 'gemma3_text',
    });
    // the stand-in served only the resolved id; config.json came first, and the weight file's first
    // requests were header ranges (the judgement), before the request that fetched its body
    const log = hub.log.filter((q) => q.id === REPO);
    expect(log.length).toBeGreaterThan(0);
    expect(hub.log.some((q) => q.id && q.id !== REPO)).toBe(false);
    const files = log.map((q) => q.file);
    const weights = log.filter((q) => q.file === 'model.safetensors');
    expect(files.indexOf('config.json')).toBeLessThan(files.indexOf('model.safetensors'));
    expect(weights[0].range).toMatch(/^bytes=0-\d+$/);
    expect(weights.length).toBeGreaterThan(1);
    // it ran: the predicted logits are the float64 reference's on the document's tokens
    const ids = doc.tokens.map((t: { id: number }) => t.id);
    const ref = referenceForward(rm, ids).logits;
    const V = ref.dims[ref.dims.length - 1];
    const last = ref.data.subarray((ids.length - 1) * V, ids.length * V);
    for (const p of doc.top_predictions) expect(Math.abs(p.logit - last[p.token_id])).toBeLessThan(1e-4);
    let best = 0;
    for (let v = 1; v < V; v++) if (last[v] > last[best]) best = v;
    expect(doc.predicted_token_id).toBe(best);
  });

  it('a model too large for the backend is refused from its headers under the alias, no weight body fetched', async () => {
    const before = hub.stats(REPO, 'model.safetensors').bytes;
    let err: unknown;
    try {
      await loadModelNode('Gemma-3-270M', {
        endpoint: hub.url,
        cache: false,
        backend: 'wasm',
        weights: 'f32',
        memory: { wasmHeapBytes: 1024 },
      });
    } catch (e) {
      err = e;
    }
    expect((err as LoupeError).code).toBe('TOO_LARGE');
    const fetched = hub.stats(REPO, 'model.safetensors').bytes - before;
    const weightBytes = Object.values(rm.tensors).reduce((a, t) => a + t.data.byteLength / 2, 0); // BF16
    expect(fetched).toBeLessThan(weightBytes / 4);
  });

  it('an unknown name is a usage error naming the nearest ones, before any request', async () => {
    const n = hub.log.length;
    const r = await loupe(['trace', 'gemma-3-207m', 'hello', '--json']);
    expect(r.code).toBe(2);
    expect(JSON.parse(r.stdout).error.hint).toContain("'gemma-3-270m'");
    expect(hub.log.length).toBe(n);
  });

  it('`loupe models` lists the names with family, size, memory per backend and the page verdict', async () => {
    const r = await loupe(['models', '--json']);
    expect(r.code, r.stderr).toBe(0);
    const { models } = JSON.parse(r.stdout);
    const g = models.find((m: { id: string }) => m.id === REPO);
    expect(g).toMatchObject({ name: 'gemma-3-270m', family: 'gemma3_text', dtype: 'BF16', verdict: 'fits WASM' });
    expect(Object.keys(g.memory).sort()).toEqual(['node', 'wasm', 'webgpu']);
    expect(models.length).toBe(CATALOG.length);
    const text = await loupe(['models', 'olmo']);
    expect(text.stdout).toMatch(/olmo-2-1b\s+allenai\/OLMo-2-0425-1B\s+olmo2/);
  });

  it('MCP (headless) loads the alias too, and its documents carry both names', async () => {
    const transport = new StdioClientTransport({
      command: process.execPath,
      args: [BIN, 'mcp', '--headless'],
      cwd: tmpdir(),
      env: { ...(process.env as Record<string, string>), HF_ENDPOINT: hub.url, LOUPE_CACHE_DIR: cache },
      stderr: 'pipe',
    });
    const client = new Client({ name: 'catalog-test', version: '1' });
    await client.connect(transport);
    try {
      const load = await client.callTool({ name: 'load_model', arguments: { model: 'gemma-3-270m' } });
      expect(load.isError, JSON.stringify(load.content)).toBeFalsy();
      expect((load.structuredContent as any).model).toMatchObject({ id: REPO, requested_name: 'gemma-3-270m' });
      const tr = await client.callTool({ name: 'trace', arguments: { prompt: 'hello world', top_k: 3 } });
      expect(tr.isError, JSON.stringify(tr.content)).toBeFalsy();
      expect((tr.structuredContent as any).model).toMatchObject({
        requested_name: 'gemma-3-270m',
        resolved_name: REPO,
      });
    } finally {
      await client.close();
    }
  });
});
