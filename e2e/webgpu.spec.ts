/**
 * WebGPU in headless Chromium (SwiftShader, a software adapter), on the page's onnxruntime-web build: the native
 * WebGPU execution provider (every check asserts the model ran there, not on the JSEP fallback, unless the page was
 * built with LOUPE_ORT_EP=jsep); a load the native build cannot make falls back to JSEP and says so. stories260K and induction-gpt2
 * run on the `webgpu` backend and agree with WASM within 1e-4 on logits and every hook (the
 * Doctor's agreement check), and a trace on WebGPU equals the CLI's (its readout in the forward graph's Ifs, and
 * the logit lens there, counted: only the products and the lens's top-k read back); with a forced low tensor
 * limit (?tensor_bytes) the vocabulary is split on WebGPU with the same numbers; Gemma 3, Phi-3/Phi-4-mini and OLMo 2
 * traces equal their float64 references and agree with WASM; at q4 (onnxruntime-web's WebGPU MatMulNBits) a
 * trace equals the float64 reference of q4's scheme written out; the four mixture-of-experts families' traces
 * equal their float64 references and every hook (router, routing weights, each expert) agrees with WASM; an attribution graph on WebGPU equals Node's,
 * its frozen constants fed from GPU buffers written once; patch, mean ablation and integrated gradients (their
 * sources and steps on the GPU) equal Node's. If this Chromium offers no
 * adapter the tests say so loudly and are skipped, never passed (LOUPE_REQUIRE_WEBGPU=1 fails them).
 */
import { execFileSync } from 'node:child_process';
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import type { Page } from '@playwright/test';
import {
  test,
  expect,
  openReady,
  compareDocs,
  waitModelReady,
  runOp,
  shot,
  pageDoc,
  loadFromHub,
  SHARED_MODELS,
  PROMPT,
  shotWidthsThemes,
  watchErrors,
  useBackend,
} from './fixtures';
import { ALL_FAMILY_CASES, MOE_FAMILY_CASES, makeCaseModel, referenceForward } from '../tests/reference';
import { q4Reference } from '../tests/helpers/q4-reference';
import { makeGemma4Model, gemma4Greedy } from '../tests/reference/gemma4-64';
import { makeRandomTranscoders } from '../tests/helpers/random-transcoders';
import { loadModelNode } from '../src/node/load';
import { createNodeSaeLoaders } from '../src/node/load-sae';
import { operation as attributionGraph } from '../src/ops/attribution_graph';
import { getOperation } from '../src/ops/index';

test.describe.configure({ mode: 'serial' });

async function requireWebGpu(page: Page): Promise<void> {
  const adapter = await page.evaluate(async () => {
    const gpu = (navigator as any).gpu;
    if (!gpu) return 'navigator.gpu is missing';
    const a = await gpu.requestAdapter();
    return a ? null : 'requestAdapter() returned null';
  });
  if (adapter) {
    const msg = `WEBGPU UNAVAILABLE in this Chromium (${adapter}): the WebGPU checks did NOT run.`;
    console.error(`\n${'!'.repeat(msg.length)}\n${msg}\n${'!'.repeat(msg.length)}\n`);
    if (process.env.LOUPE_REQUIRE_WEBGPU === '1') throw new Error(msg);
    test.skip(true, msg);
  }
}

/** the onnxruntime-web build the page was built to prefer (vite.config.ts ORT_BUILDS) */
const PREFERRED_ORT = process.env.LOUPE_ORT_EP === 'jsep' ? 'jsep' : 'native';

/** the loaded model runs on the preferred build, not a fallback */
async function expectPreferredOrt(page: Page, label: string): Promise<void> {
  const runtime = await page.evaluate(() => (globalThis as any).__loupe.model?.runtime);
  expect(runtime?.fallback, `${label}: fell back`).toBeUndefined();
  expect(runtime?.build, label).toBe(PREFERRED_ORT);
}

async function agreement(page: Page, label: string): Promise<void> {
  await expectPreferredOrt(page, label);
  if (!(await page.getByTestId('doctor').isVisible())) await page.getByRole('button', { name: 'Doctor' }).click();
  await expect(page.getByTestId('doc-webgpu')).toHaveText('available');
  await page.getByTestId('run-agreement').click();
  const res = page.getByTestId('agreement');
  const err = page.getByTestId('agreement-error');
  await expect(res.or(err)).toBeVisible({ timeout: 150_000 });
  if (await err.isVisible())
    throw new Error(`${label}: the agreement check failed in the page: ${(await err.textContent())?.trim()}`);
  const [pass, logit, hook, prob, top1] = await Promise.all(
    ['data-pass', 'data-max-logit', 'data-max-hook', 'data-max-prob', 'data-top1'].map((a) => res.getAttribute(a)),
  );
  console.log(
    `[e2e] ${label}: webgpu vs wasm max |Δ| logits ${Number(logit).toExponential(2)}, hooks ${Number(hook).toExponential(2)}, probs ${Number(prob).toExponential(2)}, top-1 ${top1 === 'true' ? 'same' : 'DIFFERENT'}`,
  );
  expect(Number(logit)).toBeLessThanOrEqual(1e-4);
  expect(Number(hook)).toBeLessThanOrEqual(1e-4);
  expect(top1).toBe('true');
  expect(pass).toBe('true');
  // the WASM twin was loaded on the same build (a fallback would be logged by the worker)
  expect(
    fallbacks.filter((m) => m.includes('could not load')),
    `${label}: a load fell back`,
  ).toEqual([]);
}

/** the worker's fallback notes ('[loupe] … could not load …; loading it on …'), per page */
const fallbacks: string[] = [];
test.beforeEach(({ page }) => {
  fallbacks.length = 0;
  page.on('console', (m) => {
    if (m.text().startsWith('[loupe]')) fallbacks.push(m.text());
  });
});

test('stories260K on WebGPU: a trace equals the CLI and every hook agrees with WASM', async ({ page, site }) => {
  test.setTimeout(300_000);
  const errors = watchErrors(page);
  await openReady(page, site.url);
  await requireWebGpu(page);
  await useBackend(page, 'webgpu');
  await expect(page.getByTestId('status-backend')).toContainText('webgpu');
  const transfers = async () => {
    await page.evaluate(() => (globalThis as any).__loupe.models.refreshMemory());
    return page.evaluate(() => (globalThis as any).__loupe.models.memory.transfers);
  };
  // a trace reads back the logits and its hooks at the traced position only, gathered there on the GPU:
  // V + per layer hook_z, attn_out, mlp_out, mlp.hook_post + resid_pre 0, the last resid_post, ln_final's scale;
  // then one token through the forward graph taking the readout's If (readout 'forward', the forward's
  // weights): per layer z·W_O [D], W_O·e [H·Dh], W_out·e [M]; the first trace also Σ_v W_U[:, v] [D], a run of its own
  const [V, L, D, HDh, M] = [512, 5, 64, 64, 172];
  const traceBytes = 4 * (V + L * (HDh + 2 * D + M) + 2 * D + 1) + 4 * L * (D + HDh + M);
  expect(await page.evaluate(() => (globalThis as any).__loupe.model?.info.readout)).toBe('forward');
  await page.getByTestId('prompt').fill(PROMPT + ' girl named Lily. She liked to play with her toys in the garden');
  await page.getByTestId('tab-trace').click();
  let t0 = await transfers();
  await runOp(page, 'trace', { timeout: 120_000 });
  let t1 = await transfers();
  expect([t1.runs - t0.runs, t1.read_bytes - t0.read_bytes]).toEqual([3, traceBytes + 4 * D]);
  await page.getByTestId('prompt').fill(PROMPT);
  await page.locator('#p-trace-top_k').fill('40');
  t0 = await transfers();
  const ms = await runOp(page, 'trace', { timeout: 120_000 });
  t1 = await transfers();
  expect([t1.runs - t0.runs, t1.read_bytes - t0.read_bytes]).toEqual([2, traceBytes]);
  const doc = await page.evaluate(() => (globalThis as any).__loupe.results.trace.doc);
  expect(doc.model.backend).toBe('webgpu');
  const cli = JSON.parse(
    execFileSync(process.execPath, ['bin/loupe.mjs', 'trace', 'default', PROMPT, '--json', '--top-k', '40'], {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'ignore'],
    }),
  );
  let d = 0;
  doc.head_attribution.forEach((row: number[], l: number) =>
    row.forEach((v, h) => (d = Math.max(d, Math.abs(v - cli.head_attribution[l][h])))),
  );
  console.log(`[e2e] trace on webgpu ${ms} ms; vs CLI (node) max |Δ| head attribution ${d.toExponential(2)}`);
  expect(d).toBeLessThan(1e-4);
  // generation with the KV cache kept on the GPU (present.* as 'gpu-buffer', fed back as past.*)
  const before = await transfers();
  await page.getByTestId('tab-generate').click();
  await page.locator('#p-generate-max_new_tokens').fill('12');
  await page.locator('#p-generate-stop_at_eos').uncheck();
  await runOp(page, 'generate', { timeout: 120_000 });
  const gen = await page.evaluate(() => (globalThis as any).__loupe.results.generate.doc);
  const cliGen = JSON.parse(
    execFileSync(
      process.execPath,
      ['bin/loupe.mjs', 'generate', 'default', PROMPT, '--json', '--max-new-tokens', '12', '--no-stop-at-eos'],
      { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] },
    ),
  );
  expect(gen.model.backend).toBe('webgpu');
  expect(gen.generated_token_ids).toEqual(cliGen.generated_token_ids);
  // the cache came back as GPU tensors and went in again from there; identity feeds from GPU buffers
  const moved = await transfers();
  console.log(`[e2e] webgpu transfers after trace + generate: ${JSON.stringify(moved)}`);
  expect(moved.device_outputs).toBeGreaterThanOrEqual(2 * 5 * 10); // 5 layers' keys and values, per step kept
  // greedy: each of the 12 runs reads back its argmax (one int64), not a row of the logits
  expect(moved.runs - before.runs).toBe(12);
  expect(moved.read_bytes - before.read_bytes).toBe(8 * 12);
  expect(moved.device_feeds).toBeGreaterThan(0);
  // the logit lens in the forward graph's If: one run, only what its document holds read back (per
  // stream and position the top k logits and ids, the normaliser, the final token's logit and rank; per
  // position the final token), never the (L+1)·T·D streams; equal to the CLI's on node
  await page.getByTestId('tab-logit_lens').click();
  t0 = await transfers();
  await runOp(page, 'logit_lens', { timeout: 120_000 });
  t1 = await transfers();
  const lens = await page.evaluate(() => (globalThis as any).__loupe.results.logit_lens.doc);
  const [T, k] = [lens.tokens.length, lens.layers[0].positions[0].top.length];
  expect([t1.runs - t0.runs, t1.read_bytes - t0.read_bytes]).toEqual([1, (L + 1) * T * (12 * k + 12) + 8 * T]);
  const cliLens = JSON.parse(
    execFileSync(process.execPath, ['bin/loupe.mjs', 'logit_lens', 'default', PROMPT, '--json'], {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'ignore'],
    }),
  );
  const cells = (doc: any) => doc.layers.flatMap((l: any) => l.positions);
  expect(cells(lens).map((c: any) => c.top.map((t: any) => t.token_id))).toEqual(
    cells(cliLens).map((c: any) => c.top.map((t: any) => t.token_id)),
  );
  let dl = 0;
  cells(lens).forEach((c: any, i: number) => {
    const o = cells(cliLens)[i];
    dl = Math.max(dl, Math.abs(c.final_token_prob - o.final_token_prob));
    c.top.forEach((t: any, j: number) => (dl = Math.max(dl, Math.abs(t.prob - o.top[j].prob))));
  });
  console.log(
    `[e2e] logit_lens on webgpu: read ${t1.read_bytes - t0.read_bytes} bytes; vs CLI max |Δ| prob ${dl.toExponential(2)}`,
  );
  expect(dl).toBeLessThan(1e-4);
  // the lens's If reads the hooks (graph outputs) from the outer graph: onnxruntime-web's optimizer does
  // not try to rename them (it logs CanUpdateImplicitInputNameInSubgraphs at error level when it does)
  expect(errors.filter((e) => e.includes('CanUpdateImplicitInputNameInSubgraphs'))).toEqual([]);
  await agreement(page, 'stories260K');
  await shot(page, 'doctor-webgpu');
});

test('induction-gpt2 on WebGPU agrees with WASM on logits and every hook', async ({ page, site, hub }) => {
  test.setTimeout(300_000);
  const repo = 'loupe-test/induction-gpt2-webgpu';
  hub.addRepo(repo, join(SHARED_MODELS, 'induction-gpt2'));
  await openReady(page, site.url);
  await requireWebGpu(page);
  await page.getByRole('tab', { name: 'Hub' }).click();
  await page.getByRole('button', { name: /show endpoint/i }).click();
  await page.getByTestId('hub-endpoint').fill(hub.url);
  await page.getByTestId('hub-id').fill(repo);
  await page.locator('#backend').selectOption('webgpu');
  await waitModelReady(page);
  await page.getByTestId('load-hub').click();
  await page.waitForFunction(
    (id) => (globalThis as any).__loupe.model?.info.id === id && (globalThis as any).__loupe.modelStatus === 'ready',
    repo,
    { timeout: 120_000 },
  );
  await expect(page.getByTestId('status-backend')).toContainText('webgpu');
  await page.getByTestId('prompt').fill('xq7#kLm2xq7#kLm2xq7#');
  await agreement(page, 'induction-gpt2');
});

test('a forced low tensor limit splits the vocabulary on WebGPU: same numbers as the CLI unsplit, and the page says which path ran and why', async ({
  page,
  site,
  hub,
}) => {
  test.setTimeout(300_000);
  // tied F16 llama (vocab 64, d_model 32: the table is 8 KB as float32); ?tensor_bytes=2000 → 5 chunks
  const rm = makeCaseModel(
    ALL_FAMILY_CASES.find((c) => c.name === 'llama-gqa-tied')!,
    { dtype: 'F16' },
  );
  const repo = 'loupe-test/llama-f16-split';
  hub.addRepo(repo, rm.dir);
  try {
    await openReady(page, `${site.url}?tensor_bytes=2000`);
    await requireWebGpu(page);
    const shaderF16 = await page.evaluate(async () =>
      (await (navigator as any).gpu.requestAdapter()).features.has('shader-f16'),
    );
    await page.getByRole('tab', { name: 'Hub' }).click();
    if (!(await page.getByTestId('hub-endpoint').isVisible()))
      await page.getByRole('button', { name: /show endpoint/i }).click();
    await page.getByTestId('hub-endpoint').fill(hub.url);
    await page.getByTestId('hub-endpoint').dispatchEvent('change');
    await page.getByTestId('hub-id').fill(repo);
    await page.locator('#backend').selectOption('webgpu');
    await waitModelReady(page);
    await page.getByTestId('load-hub').click();
    await page.waitForFunction(
      (id) => (globalThis as any).__loupe.model?.info.id === id && (globalThis as any).__loupe.modelStatus === 'ready',
      repo,
      { timeout: 120_000 },
    );
    const info = await page.evaluate(() => (globalThis as any).__loupe.model.info);
    expect(info.backend).toBe('webgpu');
    expect(info.vocab_chunks).toBe(5);
    expect(info.vocab_reason).toMatch(/^split into 5 chunks of 13 rows/);
    // F16 weights stay 16-bit on the GPU only with shader-f16 (SwiftShader has none: widened at load)
    expect(info.weights).toBe(shaderF16 ? 'stored' : 'f32');
    if (!shaderF16) expect(info.weights_reason).toMatch(/no shader-f16/);
    await expect(page.getByTestId('status-dtype')).toHaveText(`dtype: F16 · ${info.weights} · vocab ×5`);

    // the trace (forward, lens of DLA through the chunked lookup and vocabulary sum) equals the CLI's unsplit float32 run
    await page.getByTestId('prompt').fill('the cat sat on the mat');
    await page.getByTestId('tab-trace').click();
    await page.locator('#p-trace-top_k').fill('20');
    await runOp(page, 'trace', { timeout: 120_000 });
    const doc = await pageDoc(page, 'trace');
    expect(doc.model.backend).toBe('webgpu');
    const cli = JSON.parse(
      execFileSync(
        process.execPath,
        ['bin/loupe.mjs', 'trace', rm.dir, 'the cat sat on the mat', '--json', '--top-k', '20', '--weights', 'f32'],
        { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] },
      ),
    );
    let dh = 0,
      dl = 0;
    doc.head_attribution.forEach((row: number[], l: number) =>
      row.forEach((v, h) => (dh = Math.max(dh, Math.abs(v - cli.head_attribution[l][h])))),
    );
    expect(doc.top_predictions.map((p: any) => p.token_id)).toEqual(cli.top_predictions.map((p: any) => p.token_id));
    doc.top_predictions.forEach(
      (p: any, i: number) => (dl = Math.max(dl, Math.abs(p.logit - cli.top_predictions[i].logit))),
    );
    console.log(
      `[e2e] split vocabulary (5 chunks) on webgpu vs CLI unsplit (node): max |Δ| head attribution ${dh.toExponential(2)}, top logits ${dl.toExponential(2)}`,
    );
    expect(dh).toBeLessThan(1e-4);
    expect(dl).toBeLessThan(1e-4);

    // the Doctor names the path: precision and why, the split and why, shader-f16
    await page.getByRole('button', { name: 'Doctor' }).click();
    await expect(page.getByTestId('doc-weights')).toContainText(info.weights_reason);
    await expect(page.getByTestId('doc-vocab')).toContainText('split into 5 chunks');
    await expect(page.getByTestId('doc-shader-f16')).toContainText(shaderF16 ? 'yes' : 'no');
    await agreement(page, 'llama F16, vocabulary in 5 chunks');
    await shotWidthsThemes(page, 'doctor-webgpu-split');
  } finally {
    rm.cleanup();
  }
});

test("q8 on WebGPU: induction-gpt2 and a split F16 gemma2 agree with WASM q8, and a trace equals the CLI's q8 trace", async ({
  page,
  site,
  hub,
}) => {
  test.setTimeout(420_000);
  const repo = 'loupe-test/induction-gpt2-q8';
  hub.addRepo(repo, join(SHARED_MODELS, 'induction-gpt2'));
  // gemma2 (embedding scale, soft-caps, sliding window), F16, tied table; ?tensor_bytes=2000 → 9 chunks of int8 rows
  const rm = makeCaseModel(
    ALL_FAMILY_CASES.find((c) => c.name === 'gemma2-softcap-window')!,
    { dtype: 'F16' },
  );
  const gemma = 'loupe-test/gemma2-f16-q8';
  hub.addRepo(gemma, rm.dir);
  try {
    await openReady(page, `${site.url}?tensor_bytes=2000`);
    await requireWebGpu(page);
    await page.locator('#weights').selectOption('q8');
    await waitModelReady(page, 120_000);
    await page.locator('#backend').selectOption('webgpu');
    await waitModelReady(page, 120_000);
    for (const [id, prompt] of [
      [repo, 'xq7#kLm2xq7#kLm2xq7#'],
      [gemma, 'the cat sat on the mat'],
    ]) {
      await page.getByRole('tab', { name: 'Hub' }).click();
      if (!(await page.getByTestId('hub-endpoint').isVisible()))
        await page.getByRole('button', { name: /show endpoint/i }).click();
      await page.getByTestId('hub-endpoint').fill(hub.url);
      await page.getByTestId('hub-endpoint').dispatchEvent('change');
      await page.getByTestId('hub-id').fill(id);
      await page.getByTestId('load-hub').click();
      await page.waitForFunction(
        (m) => (globalThis as any).__loupe.model?.info.id === m && (globalThis as any).__loupe.modelStatus === 'ready',
        id,
        { timeout: 120_000 },
      );
      const info = await page.evaluate(() => (globalThis as any).__loupe.model.info);
      expect(info.backend).toBe('webgpu');
      expect(info.weights).toBe('q8');
      expect(info.weights_reason).toMatch(/float32 scale/);
      await expect(page.getByTestId('status-dtype')).toContainText('q8');
      // a cold load: the int8 weights read back from the q8 entry it wrote, the float32 scales and
      // norms widened from it as the session copies them to the GPU; none of them held in JS
      const mem = await page.evaluate(async () => {
        const m = (globalThis as any).__loupe.models;
        await m.refreshMemory();
        return m.memory;
      });
      console.log(`[e2e] ${id} q8 on webgpu, cold: ${JSON.stringify(mem)}`);
      expect(mem).toMatchObject({ jsWeightBytes: 0, jsWeightsWhy: null });
      await page.getByTestId('prompt').fill(prompt);
      await agreement(page, `${id} q8`);
    }
    // more chunks than one WebGPU Concat may take (7): the unembedding concatenates in groups
    expect(await page.evaluate(() => (globalThis as any).__loupe.model.info.vocab_chunks)).toBe(9);
    await shotWidthsThemes(page, 'doctor-webgpu-q8');

    // the trace (forward, DLA readout over dequantised W_O, W_out, W_U) equals the CLI's q8 run on WASM
    await page.getByTestId('tab-trace').click();
    await page.locator('#p-trace-top_k').fill('20');
    await runOp(page, 'trace', { timeout: 120_000 });
    const doc = await pageDoc(page, 'trace');
    expect(doc.model.backend).toBe('webgpu');
    expect(doc.model.weights).toBe('q8');
    const cli = JSON.parse(
      execFileSync(
        process.execPath,
        [
          'bin/loupe.mjs',
          'trace',
          rm.dir,
          'the cat sat on the mat',
          '--json',
          '--top-k',
          '20',
          '--weights',
          'q8',
          '--backend',
          'wasm',
        ],
        { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] },
      ),
    );
    let dh = 0;
    doc.head_attribution.forEach((row: number[], l: number) =>
      row.forEach((v, h) => (dh = Math.max(dh, Math.abs(v - cli.head_attribution[l][h])))),
    );
    expect(doc.top_predictions.map((p: any) => p.token_id)).toEqual(cli.top_predictions.map((p: any) => p.token_id));
    console.log(
      `[e2e] gemma2 F16 q8 on webgpu (9 chunks) vs CLI q8 on wasm: max |Δ| head attribution ${dh.toExponential(2)}`,
    );
    expect(dh).toBeLessThan(1e-4);
  } finally {
    rm.cleanup();
  }
});

test('Gemma 3, Phi-3 / Phi-4-mini (longrope short and long) and OLMo 2 on WebGPU: a trace equals the float64 reference and every hook agrees with WASM', async ({
  page,
  site,
  hub,
}) => {
  test.setTimeout(600_000);
  const names = [
    'gemma3-text-bf16',
    'phi3-longrope-short-untied',
    'phi4-mini-longrope-long-partial',
    'olmo2-post-norms',
  ];
  const models = names.map((n) => ({ n, rm: makeCaseModel(ALL_FAMILY_CASES.find((c) => c.name === n)!) }));
  try {
    await openReady(page, site.url);
    await requireWebGpu(page);
    await page.locator('#backend').selectOption('webgpu');
    await waitModelReady(page, 120_000);
    for (const { n, rm } of models) {
      const repo = `loupe-test/${n}`;
      hub.addRepo(repo, rm.dir);
      await loadFromHub(page, hub.url, repo);
      await page.waitForFunction(
        (id) =>
          (globalThis as any).__loupe.model?.info.id === id && (globalThis as any).__loupe.modelStatus === 'ready',
        repo,
        { timeout: 120_000 },
      );
      // within Phi-3's original 32 positions (short factors), past Phi-4-mini's 4 (long factors)
      await page.getByTestId('prompt').fill('the cat sat on the mat');
      await page.getByTestId('tab-trace').click();
      await runOp(page, 'trace', { timeout: 120_000 });
      const doc = await pageDoc(page, 'trace');
      expect(doc.model.backend).toBe('webgpu');
      const ids = doc.tokens.map((t: { id: number }) => t.id);
      expect(ids.length).toBeGreaterThan(4);
      expect(ids.length).toBeLessThanOrEqual(32);
      const ref = referenceForward(rm, ids).logits;
      const V = ref.dims[ref.dims.length - 1];
      let d = 0;
      for (const p of doc.top_predictions)
        d = Math.max(d, Math.abs(p.logit - ref.data[(ids.length - 1) * V + p.token_id]));
      console.log(`[e2e] ${n} on webgpu (${ids.length} tokens): top logits vs float64 max |Δ| ${d.toExponential(2)}`);
      expect(d).toBeLessThan(1e-4);
      await agreement(page, n);
    }
  } finally {
    for (const { rm } of models) rm.cleanup();
  }
});

test('mixture-of-experts models on WebGPU (Mixtral, Qwen3-MoE, Qwen2-MoE with its shared expert, OLMoE): a trace equals the float64 reference and every hook, routing and experts included, agrees with WASM', async ({
  page,
  site,
  hub,
}) => {
  test.setTimeout(600_000);
  const models = MOE_FAMILY_CASES.map((c) => ({ n: c.name, rm: makeCaseModel(c) }));
  try {
    await openReady(page, site.url);
    await requireWebGpu(page);
    await page.locator('#backend').selectOption('webgpu');
    await waitModelReady(page, 120_000);
    for (const { n, rm } of models) {
      const repo = `loupe-test/${n}`;
      hub.addRepo(repo, rm.dir);
      await loadFromHub(page, hub.url, repo);
      await page.waitForFunction(
        (id) =>
          (globalThis as any).__loupe.model?.info.id === id && (globalThis as any).__loupe.modelStatus === 'ready',
        repo,
        { timeout: 120_000 },
      );
      await page.getByTestId('prompt').fill('abc ab abc');
      await page.getByTestId('tab-trace').click();
      await runOp(page, 'trace', { timeout: 120_000 });
      const doc = await pageDoc(page, 'trace');
      expect(doc.model.backend).toBe('webgpu');
      const ids = doc.tokens.map((t: { id: number }) => t.id);
      const ref = referenceForward(rm, ids).logits;
      const V = ref.dims[ref.dims.length - 1];
      let d = 0;
      for (const p of doc.top_predictions)
        d = Math.max(d, Math.abs(p.logit - ref.data[(ids.length - 1) * V + p.token_id]));
      console.log(`[e2e] ${n} on webgpu (${ids.length} tokens): top logits vs float64 max |Δ| ${d.toExponential(2)}`);
      expect(d).toBeLessThan(1e-4);
      // each expert's logit attribution (layer × expert) equals the CLI's on onnxruntime-node
      const cli = JSON.parse(
        execFileSync(process.execPath, ['bin/loupe.mjs', 'trace', rm.dir, 'abc ab abc', '--json'], {
          encoding: 'utf8',
          stdio: ['ignore', 'pipe', 'ignore'],
        }),
      );
      expect(doc.tokens).toEqual(cli.tokens);
      let de = 0;
      doc.expert_attribution.forEach((row: number[], l: number) =>
        row.forEach((v, e) => (de = Math.max(de, Math.abs(v - cli.expert_attribution[l][e])))),
      );
      const shape = [doc.expert_attribution.length, doc.expert_attribution[0].length];
      console.log(`[e2e] ${n} on webgpu: expert attribution ${shape.join('×')} vs CLI max |Δ| ${de.toExponential(2)}`);
      expect(shape).toEqual([rm.config.num_hidden_layers, rm.config.num_local_experts ?? rm.config.num_experts]);
      expect(de).toBeLessThan(1e-4);
      // every hook, the router's and each expert's among them (the check runs hooks: 'all')
      await agreement(page, n);
    }
  } finally {
    for (const { rm } of models) rm.cleanup();
  }
});

test('q4 on WebGPU (MatMulNBits in onnxruntime-web): a trace equals the float64 reference of the scheme written out, and every hook agrees with WASM', async ({
  page,
  site,
  hub,
}) => {
  test.setTimeout(420_000);
  // NeoX, d_model 64 and d_mlp 256: every Linear is 4-bit (a fused qkv among them), the tables q8
  const rm = makeCaseModel(
    ALL_FAMILY_CASES.find((c) => c.name === 'neox-parallel-rot25')!,
    { dtype: 'F16' },
  );
  const repo = 'loupe-test/neox-f16-q4';
  hub.addRepo(repo, rm.dir);
  try {
    await openReady(page, site.url);
    await requireWebGpu(page);
    await page.locator('#weights').selectOption('q4');
    await waitModelReady(page, 120_000);
    await page.locator('#backend').selectOption('webgpu');
    await waitModelReady(page, 120_000);
    await loadFromHub(page, hub.url, repo);
    await page.waitForFunction(
      (id) => (globalThis as any).__loupe.model?.info.id === id && (globalThis as any).__loupe.modelStatus === 'ready',
      repo,
      { timeout: 120_000 },
    );
    const info = await page.evaluate(() => (globalThis as any).__loupe.model.info);
    expect(info.backend).toBe('webgpu');
    expect(info.weights).toBe('q4');
    await page.getByTestId('prompt').fill('the cat sat on the mat');
    await page.getByTestId('tab-trace').click();
    await runOp(page, 'trace', { timeout: 120_000 });
    const doc = await pageDoc(page, 'trace');
    expect(doc.model.backend).toBe('webgpu');
    expect(doc.model.weights).toBe('q4');
    const ids = doc.tokens.map((t: { id: number }) => t.id);
    const ref = referenceForward(q4Reference(rm), ids).logits;
    const plain = referenceForward(rm, ids).logits;
    const V = ref.dims[ref.dims.length - 1];
    let d = 0,
      dPlain = 0;
    for (const p of doc.top_predictions) {
      d = Math.max(d, Math.abs(p.logit - ref.data[(ids.length - 1) * V + p.token_id]));
      dPlain = Math.max(dPlain, Math.abs(p.logit - plain.data[(ids.length - 1) * V + p.token_id]));
    }
    console.log(
      `[e2e] neox F16 q4 on webgpu (${ids.length} tokens): top logits vs the q4 float64 reference max |Δ| ${d.toExponential(2)}, vs the unquantised one ${dPlain.toExponential(2)}`,
    );
    expect(d).toBeLessThan(1e-4);
    expect(dPlain).toBeGreaterThan(1e-2);
    await agreement(page, `${repo} q4`);
  } finally {
    rm.cleanup();
  }
});

test("patch, mean ablation and integrated gradients on WebGPU equal Node's, their sources fed from the GPU", async ({
  page,
  site,
}) => {
  test.setTimeout(300_000);
  const prompt = 'Once upon a time, there was a cat';
  const corrupted = 'Once upon a time, there was a dog';
  const targets = [
    { layer: 1, head: 2 },
    { layer: 3, component: 'mlp_out' },
  ];
  const model = await loadModelNode('default');
  // the two prompts' predictions agree: the metric's tokens given (any two ids whose difference moves)
  const metric = { answer: '#261', counterfactual: '#286' };
  const nodePatch: any = await getOperation('patch')!.run(model, {
    prompt,
    corrupted_prompt: corrupted,
    ...metric,
  } as any);
  const nodeAblate: any = await getOperation('ablate')!.run(model, { prompt, method: 'mean', targets } as any);
  const nodeIg: any = await getOperation('integrated_gradients')!.run(model, {
    prompt,
    corrupted_prompt: corrupted,
    ...metric,
  } as any);
  await model.dispose();
  await openReady(page, site.url);
  await requireWebGpu(page);
  await useBackend(page, 'webgpu');
  await page.getByTestId('prompt').fill(prompt);
  const near = (a: number[], b: number[], what: string) => {
    expect(a.length, what).toBe(b.length);
    a.forEach((x, i) => expect(Math.abs(x - b[i]), `${what}[${i}]`).toBeLessThan(1e-4));
  };
  await page.getByTestId('tab-patch').click();
  await page.locator('#p-patch-corrupted_prompt').fill(corrupted);
  await page.locator('#p-patch-answer').fill(metric.answer);
  await page.locator('#p-patch-counterfactual').fill(metric.counterfactual);
  await runOp(page, 'patch', { timeout: 240_000 });
  const patch = await pageDoc(page, 'patch');
  expect(patch.model.backend).toBe('webgpu');
  for (const k of ['resid_pre', 'attn_out', 'mlp_out', 'head_out'])
    near(patch[k].flat(), nodePatch[k].flat(), `patch ${k}`);
  await page.getByTestId('tab-ablate').click();
  await page.locator('#p-ablate-method').selectOption('mean');
  await page.locator('#p-ablate-targets').fill(JSON.stringify(targets));
  await runOp(page, 'ablate', { timeout: 240_000 });
  const ablate = await pageDoc(page, 'ablate');
  for (const k of ['logprob_delta', 'kl'])
    near(
      ablate.entries.map((e: any) => e[k]),
      nodeAblate.entries.map((e: any) => e[k]),
      `ablate ${k}`,
    );
  await page.getByTestId('tab-integrated_gradients').click();
  await page.locator('#p-integrated_gradients-corrupted_prompt').fill(corrupted);
  await page.locator('#p-integrated_gradients-answer').fill(metric.answer);
  await page.locator('#p-integrated_gradients-counterfactual').fill(metric.counterfactual);
  await runOp(page, 'integrated_gradients', { timeout: 240_000 });
  const ig = await pageDoc(page, 'integrated_gradients');
  near(
    ig.attributions.map((x: any) => x.attribution),
    nodeIg.attributions.map((x: any) => x.attribution),
    'integrated_gradients',
  );
  const moved = await page.evaluate(async () => {
    await (globalThis as any).__loupe.models.refreshMemory();
    return (globalThis as any).__loupe.models.memory.transfers;
  });
  console.log(`[e2e] patch, ablate, integrated_gradients on webgpu: transfers ${JSON.stringify(moved)}`);
  expect(moved.device_feeds).toBeGreaterThan(0);
});

test("an attribution graph and eap / EAP-IG edge scores on WebGPU equal Node's, the graph's constants and the edge runs' outputs kept on the GPU", async ({
  page,
  site,
  hub,
}) => {
  test.setTimeout(300_000);
  const repo = 'loupe-test/stories260K-transcoders-webgpu';
  const prompt = 'Once upon a time';
  const tc = makeRandomTranscoders({ kind: 'plt', nLayers: 5, dModel: 64, features: 16, skip: true, seed: 9 });
  try {
    const model = await loadModelNode('default');
    const nodeDoc = await attributionGraph.run(
      model,
      { prompt, transcoder_source: tc.dir },
      { loadTranscoders: createNodeSaeLoaders({ cache: false }).loadTranscoders },
    );
    const gen = { task: 'induction', n: 2, seed: 3, length: 8 };
    const nodeEdges: any = await getOperation('edge_attribution')!.run(model, { generate: gen, method: 'eap' });
    const igInput = { generate: gen, method: 'eap_ig_inputs', ig_steps: 3 };
    const nodeIg: any = await getOperation('edge_attribution')!.run(model, igInput as any);
    await model.dispose();
    hub.addRepo(repo, null);
    for (const f of readdirSync(tc.dir)) hub.addFile(repo, `plt/${f}`, readFileSync(join(tc.dir, f)));
    await openReady(page, site.url);
    await requireWebGpu(page);
    await useBackend(page, 'webgpu');
    await page.getByTestId('prompt').fill(prompt);
    await page.getByTestId('tab-attribution_graph').click();
    await page.locator('#p-attribution_graph-transcoder_source').fill(`${hub.url}/${repo}/resolve/main`);
    await page.locator('#p-attribution_graph-transcoder_path').fill('plt');
    const before = await page.evaluate(async () => {
      await (globalThis as any).__loupe.models.refreshMemory();
      return (globalThis as any).__loupe.models.memory.transfers;
    });
    await runOp(page, 'attribution_graph', { timeout: 240_000 });
    const doc = await pageDoc(page, 'attribution_graph');
    const after = await page.evaluate(async () => {
      await (globalThis as any).__loupe.models.refreshMemory();
      return (globalThis as any).__loupe.models.memory.transfers;
    });
    expect(doc.model.backend).toBe('webgpu');
    expect(doc.graph.nodes.map((n: any) => n.node_id)).toEqual(nodeDoc.graph.nodes.map((n: any) => n.node_id));
    // pruned on the GPU (the rows kept there): the same links as Node's float64 pruning of the rows
    expect(doc.method).toContain('on the device');
    const link = (l: any) => `${l.source}>${l.target}`;
    expect(doc.graph.links.map(link)).toEqual(nodeDoc.graph.links.map(link));
    expect(Math.abs(doc.scores.replacement - nodeDoc.scores.replacement)).toBeLessThan(1e-4);
    expect(Math.abs(doc.scores.completeness - nodeDoc.scores.completeness)).toBeLessThan(1e-4);
    // each backward run feeds the 6 + L frozen constants from the device
    const runs = doc.cost.runs;
    console.log(`[e2e] attribution graph on webgpu: ${runs} backward runs, transfers ${JSON.stringify(after)}`);
    expect(after.device_feeds - before.device_feeds).toBeGreaterThanOrEqual(runs * (6 + 5));

    // eap: the corrupted outputs stay on the GPU (a 'gpu-buffer' output) and feed the gradient run
    await page.getByTestId('tab-edge_attribution').click();
    await page.locator('#p-edge_attribution-generate').fill(JSON.stringify(gen));
    await page.locator('#p-edge_attribution-method').selectOption('eap');
    await runOp(page, 'edge_attribution', { timeout: 240_000 });
    const edges = await pageDoc(page, 'edge_attribution');
    const moved = await page.evaluate(async () => {
      await (globalThis as any).__loupe.models.refreshMemory();
      return (globalThis as any).__loupe.models.memory.transfers;
    });
    expect(edges.model.backend).toBe('webgpu');
    expect(edges.edges.map((e: any) => e.name)).toEqual(nodeEdges.edges.map((e: any) => e.name));
    let d = 0;
    edges.edges.forEach((e: any, i: number) => (d = Math.max(d, Math.abs(e.score - nodeEdges.edges[i].score))));
    console.log(`[e2e] eap on webgpu vs Node: max |Δ| score ${d.toExponential(2)}; transfers ${JSON.stringify(moved)}`);
    expect(d).toBeLessThan(1e-4);
    expect(moved.device_outputs - after.device_outputs).toBe(1);

    // EAP-IG (inputs): the corrupted and clean outputs kept, each pair's difference made on the GPU
    await page.locator('#p-edge_attribution-method').selectOption('eap_ig_inputs');
    await page.locator('#p-edge_attribution-ig_steps').fill('3');
    await runOp(page, 'edge_attribution', { timeout: 240_000 });
    const ig = await pageDoc(page, 'edge_attribution');
    const movedIg = await page.evaluate(async () => {
      await (globalThis as any).__loupe.models.refreshMemory();
      return (globalThis as any).__loupe.models.memory.transfers;
    });
    expect(ig.method).toBe('eap_ig_inputs');
    let dIg = 0;
    ig.edges.forEach((e: any, i: number) => (dIg = Math.max(dIg, Math.abs(e.score - nodeIg.edges[i].score))));
    console.log(`[e2e] eap_ig_inputs on webgpu vs Node: max |Δ| score ${dIg.toExponential(2)}`);
    expect(dIg).toBeLessThan(1e-4);
    // two forwards' outputs and one difference per pair stay on the GPU
    expect(movedIg.device_outputs - moved.device_outputs).toBe(2 + 2);
  } finally {
    tc.cleanup();
  }
});

test('a load the native build cannot make falls back to JSEP, says so in the status bar and the Doctor, and runs exactly', async ({
  page,
  site,
  hub,
}) => {
  test.skip(PREFERRED_ORT !== 'native', 'the page was built without the native build');
  test.setTimeout(300_000);
  // BF16 kept 16-bit (weights stored, on WASM) is widened at use by a Cast from bfloat16, which the native build
  // has no kernel for (runtime/pieces.ts); JSEP's build has one
  const c = ALL_FAMILY_CASES.find((x) => x.name === 'gemma3-text-bf16')!;
  const rm = makeCaseModel(c);
  const repo = 'loupe-test/gemma3-bf16-stored';
  hub.addRepo(repo, rm.dir);
  try {
    await openReady(page, site.url);
    await page.locator('#weights').selectOption('stored');
    await waitModelReady(page, 120_000);
    await expectPreferredOrt(page, 'the bundled model (F32) stored');
    await loadFromHub(page, hub.url, repo);
    await page.waitForFunction(
      (id) => (globalThis as any).__loupe.model?.info.id === id && (globalThis as any).__loupe.modelStatus === 'ready',
      repo,
      { timeout: 120_000 },
    );
    const m = await page.evaluate(() => (globalThis as any).__loupe.model);
    expect(m.info.backend).toBe('wasm');
    expect(m.info.weights).toBe('stored');
    expect(m.runtime.build).toBe('jsep');
    expect(m.runtime.fallback.from).toBe('native');
    // decided from the headers, before a download or a session on the native build
    expect(m.runtime.fallback.message).toMatch(/no Cast from bfloat16, and weights stored keep/);
    console.log(`[e2e] fallback: ${m.runtime.fallback.code}: ${m.runtime.fallback.message.slice(0, 160)}`);
    expect(fallbacks.some((t) => t.includes('could not load') && t.includes(repo))).toBe(true);
    await expect(page.getByTestId('status-backend')).toContainText('JSEP (fallback)');
    await page.getByRole('button', { name: 'Doctor' }).click();
    await expect(page.getByTestId('doc-ort')).toContainText('fallback');
    await page.getByTestId('prompt').fill('the cat sat on the mat');
    await page.getByTestId('tab-trace').click();
    await runOp(page, 'trace', { timeout: 120_000 });
    const doc = await pageDoc(page, 'trace');
    const ids = doc.tokens.map((t: { id: number }) => t.id);
    const ref = referenceForward(rm, ids).logits;
    const V = ref.dims[ref.dims.length - 1];
    let d = 0;
    for (const p of doc.top_predictions)
      d = Math.max(d, Math.abs(p.logit - ref.data[(ids.length - 1) * V + p.token_id]));
    console.log(
      `[e2e] gemma3 BF16 stored on JSEP's WASM after the fallback: top logits vs float64 max |Δ| ${d.toExponential(2)}`,
    );
    expect(d).toBeLessThan(1e-4);
  } finally {
    rm.cleanup();
  }
});

test('a page whose native runtime is missing (its .wasm refused) loads on JSEP and says why', async ({
  browser,
  site,
}) => {
  test.skip(PREFERRED_ORT !== 'native', 'the page was built without the native build');
  test.setTimeout(180_000);
  // no service worker: every request of the page and its worker goes through the route below
  const ctx = await browser.newContext({ serviceWorkers: 'block' });
  try {
    let refused = 0;
    await ctx.route(/\/ort\/ort-wasm-simd-threaded\.asyncify\.wasm$/, (r) => {
      refused++;
      return r.abort();
    });
    const page = await ctx.newPage();
    const notes: string[] = [];
    page.on('console', (m) => notes.push(m.text()));
    await openReady(page, site.url);
    const m = await page.evaluate(() => (globalThis as any).__loupe.model);
    expect(refused).toBeGreaterThan(0);
    expect(m.runtime.build).toBe('jsep');
    expect(m.runtime.fallback.from).toBe('native');
    console.log(
      `[e2e] native runtime missing: ${m.runtime.fallback.code}: ${m.runtime.fallback.message.slice(0, 160)}`,
    );
    expect(notes.some((t) => t.startsWith('[loupe]') && t.includes('could not load'))).toBe(true);
    await expect(page.getByTestId('status-backend')).toContainText('JSEP (fallback)');
    await page.getByTestId('prompt').fill(PROMPT);
    await runOp(page, 'trace');
    const wasm = await pageDoc(page, 'trace');
    expect(wasm.top_predictions.length).toBeGreaterThan(0);
    // on JSEP's WebGPU too (its readout streamed in JS: JSEP's Gemm fails inside the forward graph's readout If)
    await page.locator('#backend').selectOption('webgpu');
    await page.waitForFunction(
      () => {
        const a = (globalThis as any).__loupe;
        return a.model?.info.backend === 'webgpu' && a.model?.runtime.build === 'jsep' && a.modelStatus === 'ready';
      },
      null,
      { timeout: 120_000 },
    );
    await runOp(page, 'trace');
    const gpu = await pageDoc(page, 'trace');
    const { bad, max } = compareDocs(gpu, wasm, 1e-4, (p) => p.startsWith('.model') || p === '.notices');
    console.log(`[e2e] trace on JSEP's WebGPU vs its WASM: max |Δ| ${max.toExponential(2)}`);
    expect(bad).toEqual([]);
  } finally {
    await ctx.close();
  }
});

test('Gemma 4 on WebGPU (per-layer inputs, KV sharing, k_eq_v, wider full-attention heads, MoE): greedy generation through the KV cache equals the float64 reference and every hook agrees with WASM', async ({
  page,
  site,
  hub,
}) => {
  test.setTimeout(600_000);
  const [S, F] = ['sliding_attention', 'full_attention'] as const;
  const models = [
    {
      n: 'gemma4-ple-kv-sharing',
      m: makeGemma4Model({ layerTypes: [S, S, F, S, S, F], kvShared: 2, doubleWide: true, nKvHeads: 1 }),
    },
    {
      n: 'gemma4-multimodal-bf16-k-eq-v',
      m: makeGemma4Model({ multimodal: true, dtype: 'BF16', kEqV: true, perLayer: 0, tied: false, seed: 7 }),
    },
    {
      n: 'gemma4-moe',
      m: makeGemma4Model({ layerTypes: [S, F, S, F], nLayers: 4, moe: { experts: 6, topK: 2, width: 12 }, seed: 11 }),
    },
  ];
  try {
    await openReady(page, site.url);
    await requireWebGpu(page);
    await page.locator('#backend').selectOption('webgpu');
    await waitModelReady(page, 120_000);
    for (const { n, m } of models) {
      const repo = `loupe-test/${n}`;
      hub.addRepo(repo, m.dir);
      await loadFromHub(page, hub.url, repo);
      await page.waitForFunction(
        (id) =>
          (globalThis as any).__loupe.model?.info.id === id && (globalThis as any).__loupe.modelStatus === 'ready',
        repo,
        { timeout: 120_000 },
      );
      await page.getByTestId('prompt').fill('abc ab abc');
      await page.getByTestId('tab-generate').click();
      await page.locator('#p-generate-max_new_tokens').fill('6');
      await page.locator('#p-generate-stop_at_eos').uncheck();
      await runOp(page, 'generate', { timeout: 120_000 });
      const doc = await pageDoc(page, 'generate');
      expect(doc.model.backend).toBe('webgpu');
      const ids = doc.tokens.map((t: { id: number }) => t.id);
      const want = gemma4Greedy(m, ids, 6);
      console.log(
        `[e2e] ${n} on webgpu: generated ${JSON.stringify(doc.generated_token_ids)}, float64 ${JSON.stringify(want)}`,
      );
      expect(doc.generated_token_ids).toEqual(want);
      await agreement(page, n);
    }
  } finally {
    for (const { m } of models) m.cleanup();
  }
});
