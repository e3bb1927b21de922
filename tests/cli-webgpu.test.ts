/**
 * `loupe trace … --backend webgpu` (onnxruntime-node's WebGPU provider), and logit_lens, against the node backend
 * in-process: on the bundled stories260K spawned as a user would, with no Vulkan variables set, so
 * the process finds its driver itself (here and in CI: Chromium's SwiftShader); on one small random
 * model of each family the float64 reference tests cover through the CLI's main() in this process
 * (its Vulkan set up the same way, once); every number of the document within
 * 1e-4, the logit lens also on Gemma 4, Qwen3.5, gpt-oss and the MoE families (q8 and q4 too, and q4 against its scheme's float64 reference; F16 weights at `stored` widened where the adapter has no shader-f16); `loupe mcp --headless --backend webgpu` (its engine thread) with a buffer limit that splits
 * the vocabulary, still agreeing; a limit too small for a weight (TOO_LARGE naming the limit and what
 * would fit); no adapter (BACKEND_UNAVAILABLE naming what is missing).
 */
import { describe, it, expect, afterAll } from 'vitest';
import { execFile } from 'node:child_process';
import { tmpdir } from 'node:os';
import { resolve } from 'node:path';
import { loadModelNode } from '../src/node/load';
import { getOperation } from '../src/ops/index';
import {
  ALL_FAMILY_CASES,
  MOE_FAMILY_CASES,
  caseTokens,
  compareHooks,
  makeCaseModel,
  makeRandomModel,
  maxAbsDiff,
  referenceForward,
  type RandomModel,
} from './reference';
import { q4Reference } from './helpers/q4-reference';
import { makeGemma4Model } from './reference/gemma4-64';
import { makeQwen35Model } from './reference/qwen3_5-64';
import { makeGptOssModel } from './reference/gpt_oss-64';
import { viaJson } from './schema-helpers';
import { main } from '../src/cli/main';
import type { WeightsMode } from '../src/engine/precision';
import { webGpuRoute } from '../src/node/webgpu-node';
import { requireOrtNode } from '../src/node/ort-node';
import type { OrtModule } from '../src/engine/runtime/ort-session';
import type { Client } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';
import { OrderedClient } from './helpers/mcp-client';

const BIN = resolve(__dirname, '../bin/loupe.mjs');
const TOL = 1e-4;
const PROMPT = 'the cat sat on the mat';
const TOP_K = 3;

/** the process's environment without the Vulkan loader's variables: the CLI must set up its driver itself */
function bareEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env, NO_COLOR: '1', ...extra };
  for (const k of ['VK_ICD_FILENAMES', 'VK_DRIVER_FILES']) if (!(k in extra)) delete env[k];
  return env;
}

function loupe(args: string[], env = bareEnv()): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((res) => {
    execFile(process.execPath, [BIN, ...args], { cwd: tmpdir(), maxBuffer: 64 << 20, env }, (err, stdout, stderr) => {
      res({ code: err ? (typeof (err as any).code === 'number' ? (err as any).code : 1) : 0, stdout, stderr });
    });
  });
}

/** `model` differs by backend (its backend, readout, reasons); everything else must match, numbers within TOL */
function compare(a: unknown, b: unknown, at: string, out: string[]): void {
  if (typeof a === 'number' && typeof b === 'number') {
    if (!(Math.abs(a - b) <= TOL) && !(Number.isNaN(a) && Number.isNaN(b))) out.push(`${at}: ${a} vs ${b}`);
  } else if (Array.isArray(a) && Array.isArray(b)) {
    if (a.length !== b.length) out.push(`${at}: length ${a.length} vs ${b.length}`);
    else a.forEach((x, i) => compare(x, b[i], `${at}[${i}]`, out));
  } else if (a && b && typeof a === 'object' && typeof b === 'object') {
    const ka = Object.keys(a).sort(),
      kb = Object.keys(b).sort();
    if (ka.join() !== kb.join()) out.push(`${at}: keys ${ka} vs ${kb}`);
    else for (const k of ka) compare((a as any)[k], (b as any)[k], `${at}.${k}`, out);
  } else if (a !== b) out.push(`${at}: ${JSON.stringify(a)} vs ${JSON.stringify(b)}`);
}

/** the CLI's main() in this process: one WebGPU device for every call (a spawned CLI makes its own, ~2 s on SwiftShader) */
async function inProcess(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  let stdout = '',
    stderr = '';
  const code = await main(args, { stdout: (s) => void (stdout += s), stderr: (s) => void (stderr += s) });
  return { code, stdout, stderr };
}

/**
 * trace (and logit_lens, reduced in the forward graph's If on WebGPU: build-model.ts addForwardLens)
 * on WebGPU against node. `spawned`: trace as a user runs it, in a process of its own with no Vulkan variables
 */
async function expectAgrees(dir: string, weights?: WeightsMode, spawned = false): Promise<any> {
  const w = weights ? ['--weights', weights] : [];
  const model = await loadModelNode(dir, { weights });
  try {
    const docs = [];
    for (const op of ['trace', 'logit_lens']) {
      const args = [op, dir, PROMPT, '--top-k', String(TOP_K), '--backend', 'webgpu', ...w, '--json'];
      const r = spawned && op === 'trace' ? await loupe(args) : await inProcess(args);
      expect(r.code, r.stderr).toBe(0);
      const gpu = JSON.parse(r.stdout);
      const cpu = viaJson(await getOperation(op)!.run(model, { prompt: PROMPT, top_k: TOP_K }, {})) as any;
      expect(gpu.model.backend).toBe('webgpu');
      expect(cpu.model.backend).toBe('node');
      const diffs: string[] = [];
      compare({ ...gpu, model: undefined }, { ...cpu, model: undefined }, op, diffs);
      expect(diffs.slice(0, 5)).toEqual([]);
      expect(gpu.model.d_vocab).toBe(cpu.model.d_vocab);
      docs.push(gpu);
    }
    return docs[0];
  } finally {
    await model.dispose();
  }
}

/** one case per family: the first of each in the reference tests' list */
const FAMILIES = ALL_FAMILY_CASES.filter((c, i) => ALL_FAMILY_CASES.findIndex((d) => d.family === c.family) === i);

describe('loupe trace and logit_lens --backend webgpu agree with node within 1e-4', () => {
  const made: RandomModel[] = [];
  afterAll(() => made.forEach((m) => m.cleanup()));

  it('the bundled stories260K', async () => {
    const doc = await expectAgrees('default', undefined, true);
    expect(doc.model.weights).toBe('f32');
  });

  it('the bundled stories260K at q8 (the WebGPU form: float32 scales), against node at q8', async () => {
    const doc = await expectAgrees('default', 'q8');
    expect(doc.model.weights).toBe('q8');
  });

  it('the bundled stories260K at q4 (MatMulNBits on the GPU), against node at q4', async () => {
    const doc = await expectAgrees('default', 'q4');
    expect(doc.model.weights).toBe('q4');
  });

  it('q4 on WebGPU against the float64 reference of its scheme written out (tests/helpers/q4-reference.ts)', async () => {
    const c = ALL_FAMILY_CASES.find((x) => x.name === 'neox-parallel-rot25')!;
    const rm = makeCaseModel(c, { dtype: 'F16' });
    made.push(rm);
    const model = await loadModelNode(rm.dir, { backend: 'webgpu', weights: 'q4' });
    try {
      expect(model.info.backend).toBe('webgpu');
      const tokens = caseTokens(rm, c.seqLen);
      const ref = referenceForward(q4Reference(rm), tokens);
      const out = await model.run(tokens, { hooks: 'all' });
      const names = model.hookNames().filter((n) => n in ref.hooks);
      const bad = compareHooks(ref.hooks, out.hooks, names, TOL).filter((r) => !r.ok);
      expect(bad, JSON.stringify(bad.slice(0, 3))).toEqual([]);
      expect(maxAbsDiff(ref.logits.data, out.logits.data).maxAbs).toBeLessThan(TOL);
      expect(maxAbsDiff(referenceForward(rm, tokens).logits.data, out.logits.data).maxAbs).toBeGreaterThan(100 * TOL);
    } finally {
      await model.dispose();
    }
  });

  it('F16 weights at --weights stored: without shader-f16 (SwiftShader) widened to float32 at load, and agreeing', async () => {
    const c = ALL_FAMILY_CASES.find((x) => x.name === 'gpt2-untied-erf-f16')!;
    const rm = makeCaseModel(c);
    made.push(rm);
    const doc = await expectAgrees(rm.dir, 'stored');
    // the probe in this process (SwiftShader: no shader-f16) decides what the CLI's must have chosen
    const route = await webGpuRoute(requireOrtNode<OrtModule>());
    expect(route.vulkan.drivers === 'swiftshader' ? route.caps?.shaderF16 : false).toBe(false);
    expect(doc.model.weights).toBe(route.caps?.shaderF16 ? 'stored' : 'f32');
  });

  it.each(FAMILIES.map((c) => [c.family, c] as const))('%s', async (_family, c) => {
    const rm = makeCaseModel(c);
    made.push(rm);
    await expectAgrees(rm.dir);
  });

  // the families with float64 references of their own (layers of differing widths, linear attention,
  // experts): the logit lens in the forward graph's If, in this process, against node
  const lensCases: [string, () => { dir: string; cleanup(): void }][] = [
    ['gemma4', () => makeGemma4Model()],
    ['qwen3_5', () => makeQwen35Model()],
    ['gpt_oss', () => makeGptOssModel()],
    ...MOE_FAMILY_CASES.map((c): [string, () => RandomModel] => [c.name, () => makeCaseModel(c)]),
  ];
  it.each(lensCases)('%s: logit_lens', async (_name, make) => {
    const rm = make();
    const gpu = await loadModelNode(rm.dir, { backend: 'webgpu' });
    const cpu = await loadModelNode(rm.dir);
    try {
      expect(gpu.info.readout).toBe('forward');
      const input = { prompt: PROMPT, top_k: TOP_K };
      const g = viaJson(await getOperation('logit_lens')!.run(gpu, input, {})) as any;
      const c = viaJson(await getOperation('logit_lens')!.run(cpu, input, {})) as any;
      const diffs: string[] = [];
      compare({ ...g, model: undefined }, { ...c, model: undefined }, 'logit_lens', diffs);
      expect(diffs.slice(0, 5)).toEqual([]);
    } finally {
      await gpu.dispose();
      await cpu.dispose();
      rm.cleanup();
    }
  });

  it('a weight larger than the buffer limit is TOO_LARGE, naming the limit and what would fit', async () => {
    // W_in 64 × 8192 float32 = 2 MiB > 1 MiB
    const rm = makeRandomModel('gpt2', { seed: 6, dModel: 64, nLayers: 1, nHeads: 2, dMlp: 8192, vocabSize: 300 });
    made.push(rm);
    const r = await loupe(
      ['trace', rm.dir, PROMPT, '--backend', 'webgpu', '--json'],
      bareEnv({ LOUPE_WEBGPU_BUFFER_BYTES: String(1024 ** 2) }),
    );
    expect(r.code).not.toBe(0);
    const e = JSON.parse(r.stdout).error;
    expect(e.code).toBe('TOO_LARGE');
    expect(e.message).toMatch(/maxStorageBufferBindingSize/);
    expect(e.message).toMatch(/LOUPE_WEBGPU_BUFFER_BYTES/);
    expect(e.details.limit).toBe('maxStorageBufferBindingSize');
    expect(e.details.limit_bytes).toBe(1024 ** 2);
    expect(e.hint).toContain(`at least ${64 * 8192 * 4} bytes`);
  });
});

describe('loupe mcp --headless --backend webgpu', () => {
  let rm: RandomModel;
  let client: Client;
  afterAll(async () => {
    await client?.close();
    rm?.cleanup();
  });

  it('runs in its engine thread; a buffer limit below the vocabulary table splits it, and trace and logit_lens still agree', async () => {
    // 1000 × 288 float32 = 1.15 MB > the 1 MiB limit; the largest other weight, c_attn 288 × 864, is 1.00 MB < 1 MiB
    rm = makeRandomModel('gpt2', { seed: 5, dModel: 288, nLayers: 1, nHeads: 2, dMlp: 512, vocabSize: 1000 });
    const env = bareEnv({ LOUPE_WEBGPU_BUFFER_BYTES: String(1024 ** 2) });
    const transport = new StdioClientTransport({
      command: process.execPath,
      args: [BIN, 'mcp', '--headless', '--backend', 'webgpu', '--allow-local', rm.dir],
      env: env as Record<string, string>,
      stderr: 'pipe',
    });
    client = new OrderedClient({ name: 'webgpu-test', version: '1' });
    await client.connect(transport);
    const loaded = await client.callTool({ name: 'load_model', arguments: { model: rm.dir } });
    expect(loaded.isError, JSON.stringify(loaded.content)).toBeFalsy();
    const info = (loaded.structuredContent as any).model;
    expect(info.backend).toBe('webgpu');
    expect(info.vocab_chunks).toBeGreaterThan(1);
    expect(info.vocab_reason).toMatch(/^split into 2 chunks of 500 rows/);
    const model = await loadModelNode(rm.dir);
    try {
      // the logit lens too: its If in the forward graph reads the table in its chunks
      for (const op of ['trace', 'logit_lens']) {
        const r = await client.callTool({ name: op, arguments: { prompt: PROMPT, top_k: TOP_K } });
        expect(r.isError).toBeFalsy();
        const cpu = viaJson(await getOperation(op)!.run(model, { prompt: PROMPT, top_k: TOP_K }, {})) as any;
        const diffs: string[] = [];
        compare({ ...(r.structuredContent as any), model: undefined }, { ...cpu, model: undefined }, op, diffs);
        expect(diffs.slice(0, 5)).toEqual([]);
      }
    } finally {
      await model.dispose();
    }
    // a backend named in load_model wins over the companion's --backend; 'auto' is the companion's
    const cpu = await client.callTool({ name: 'load_model', arguments: { model: rm.dir, backend: 'node' } });
    expect((cpu.structuredContent as any).model.backend).toBe('node');
    const auto = await client.callTool({ name: 'load_model', arguments: { model: rm.dir, backend: 'auto' } });
    expect((auto.structuredContent as any).model.backend).toBe('webgpu');
  });
});

describe('no WebGPU adapter', () => {
  it('is BACKEND_UNAVAILABLE naming what is missing, before any model is read', async () => {
    const r = await loupe(
      ['trace', 'default', PROMPT, '--backend', 'webgpu', '--json'],
      bareEnv({ VK_ICD_FILENAMES: '/nonexistent/icd.json' }),
    );
    expect(r.code).toBe(1);
    const e = JSON.parse(r.stdout).error;
    expect(e.code).toBe('BACKEND_UNAVAILABLE');
    expect(e.message).toMatch(/No WebGPU adapter/);
    expect(e.message).toMatch(/Failed to get a WebGPU adapter/);
    expect(e.message).toContain('Missing: no such driver manifest: /nonexistent/icd.json');
    expect(e.hint).toMatch(/--backend node/);
    expect(e.details.vulkan.drivers).toBe('environment');
    expect(e.details.vulkan.icd).toEqual(['/nonexistent/icd.json']);
    expect(r.stderr).not.toMatch(/loading default/);
  });

  it('--backend takes only the Node backends', async () => {
    const r = await loupe(['trace', 'default', PROMPT, '--backend', 'cuda']);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/--backend must be node, wasm, webgpu/);
  });
});
