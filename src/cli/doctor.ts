/**
 * `loupe doctor`: what this machine offers Loupe — runtime, backends, threads — and whether the
 * two Node backends agree on the bundled model (the same check the engine's tests make), the
 * WebGPU route (onnxruntime-node's WebGPU provider: its Vulkan driver, shader-f16, the buffer
 * limit, and what onnxruntime-node does not expose) with its agreement with node where it runs, plus
 * where the weight cache lives and how big it is, and what `--weights q8` and `q4` cost in numbers on the
 * bundled model (max |Δ| of the logits and of trace's DLA against the stored precision; reported,
 * not judged). Exit 1 when a check fails.
 */
import * as os from 'node:os';
import * as path from 'node:path';
import { existsSync, promises as fsp, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { loadModelForCli, type Io } from './load-model';
import { DirCache, defaultCacheDir } from '../node/dir-cache';
import { q8CacheRoot } from '../node/q8-cache';
import { toLoupeError } from '../engine/errors';
import { requireOrtNode } from '../node/ort-node';
import { wasmHeapBytes } from '../engine/runtime/wasm-heap';
import { precisionCost } from '../ops/lib/precision-cost';
import { webGpuRoute, type WebGpuRoute } from '../node/webgpu-node';
import type { OrtModule } from '../engine/runtime/ort-session';

/** logits of node and wasm (and of webgpu and node) must agree this closely on the bundled model */
export const AGREEMENT_TOLERANCE = 1e-4;
const PROMPT = 'Once upon a time';

async function dirSize(dir: string): Promise<{ bytes: number; files: number }> {
  let bytes = 0,
    files = 0;
  let entries;
  try {
    entries = await fsp.readdir(dir, { withFileTypes: true });
  } catch {
    return { bytes, files };
  }
  for (const e of entries) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) {
      const s = await dirSize(p);
      bytes += s.bytes;
      files += s.files;
    } else if (e.isFile()) {
      bytes += (await fsp.stat(p)).size;
      files++;
    }
  }
  return { bytes, files };
}

/** a package's version from its package.json, found by walking up from its entry point
 * (some packages, e.g. onnxruntime-web, do not export ./package.json) */
function packageVersion(name: string): string | null {
  try {
    const req = createRequire(import.meta.url);
    let dir = path.dirname(req.resolve(name));
    for (let i = 0; i < 8; i++) {
      const f = path.join(dir, 'package.json');
      if (existsSync(f)) {
        const pkg = JSON.parse(readFileSync(f, 'utf8')) as { name?: string; version?: string };
        if (pkg.name === name) return pkg.version ?? null;
      }
      dir = path.dirname(dir);
    }
    return null;
  } catch {
    return null;
  }
}

async function tryBackend(
  name: 'onnxruntime-node' | 'onnxruntime-web',
): Promise<{ available: boolean; version: string | null; error?: string }> {
  try {
    if (name === 'onnxruntime-node') requireOrtNode();
    else await import('onnxruntime-web');
    return { available: true, version: packageVersion(name) };
  } catch (e) {
    return { available: false, version: packageVersion(name), error: (e as Error).message };
  }
}

function maxDiff(a: Float32Array, b: Float32Array): number {
  let d = 0;
  for (let i = 0; i < Math.min(a.length, b.length); i++) d = Math.max(d, Math.abs(a[i] - b[i]));
  return d;
}

/** onnxruntime-node's WebGPU provider on this machine (webgpu-node.ts) */
async function webGpuStatus(): Promise<Record<string, unknown>> {
  let ort: OrtModule;
  try {
    ort = requireOrtNode<OrtModule>();
  } catch (e) {
    return { available: false, error: `onnxruntime-node could not be loaded: ${(e as Error).message}` };
  }
  let r: WebGpuRoute;
  try {
    r = await webGpuRoute(ort);
  } catch (e) {
    return { available: false, error: toLoupeError(e).message }; // e.g. a malformed LOUPE_WEBGPU_BUFFER_BYTES
  }
  return {
    available: r.available,
    provider: 'onnxruntime-node webgpu (Dawn)',
    vulkan: r.vulkan,
    ...(r.caps ? { shader_f16: r.caps.shaderF16, max_buffer_bytes: r.caps.maxBufferBytes } : {}),
    buffer_limit: r.buffer_limit,
    adapter: r.not_exposed,
    ...(r.error ? { error: r.error } : {}),
  };
}

function webgpuLine(w: Record<string, any>): string {
  const driver = w.vulkan
    ? `; Vulkan ${w.vulkan.drivers}${w.vulkan.icd?.length ? ` (${w.vulkan.icd.join(', ')})` : ''}${w.vulkan.loader ? `, loader ${w.vulkan.loader}` : ''}`
    : '';
  if (!w.available)
    return `unavailable: ${w.error}${w.vulkan?.missing ? ` (missing: ${w.vulkan.missing})` : ''}${driver}`;
  return (
    `available${driver}; shader-f16 ${w.shader_f16 ? 'yes' : 'no'} (probed); buffer limit ${w.max_buffer_bytes} bytes ` +
    `(${w.buffer_limit}); adapter: ${w.adapter}`
  );
}

/**
 * `loupe doctor --verify-cache`: every complete file of the model cache (and of the q8 cache of
 * local folders) hashed against its record (dir-cache.ts); exit 1 when any differs or has none.
 */
async function verifyCache(json: boolean, io: Io): Promise<number> {
  const t0 = performance.now();
  const roots = [defaultCacheDir(), q8CacheRoot()];
  const reports = [];
  for (const root of roots) reports.push({ root, ...(await new DirCache(root).verify()) });
  const seconds = (performance.now() - t0) / 1000;
  const files = reports.reduce((n, r) => n + r.files, 0);
  const bytes = reports.reduce((n, r) => n + r.bytes, 0);
  const problems = reports.flatMap((r) => r.problems);
  if (json) io.stdout(JSON.stringify({ cache_verify: { roots, files, bytes, seconds, problems } }, null, 2) + '\n');
  else
    io.stdout(
      [
        `verified    ${files} files, ${(bytes / 1e6).toFixed(1)} MB in ${seconds.toFixed(1)} s ` +
          `(${(bytes / 1e6 / Math.max(seconds, 1e-3)).toFixed(0)} MB/s) under ${roots.join(', ')}`,
        ...problems.map((p) => `${p.code.padEnd(11)} ${p.message}`),
        problems.length
          ? 'delete those files (or their model folders) and load the models again'
          : 'every file is as recorded',
      ].join('\n') + '\n',
    );
  return problems.length ? 1 : 0;
}

export async function doctor(argv: string[], io: Io): Promise<number> {
  const json = argv.includes('--json');
  if (argv.includes('--verify-cache')) return verifyCache(json, io);
  const say = (s: string) => {
    if (!argv.includes('--quiet')) io.stderr(s + '\n');
  };
  const report: Record<string, any> = {
    runtime: { node: process.version, platform: `${process.platform}-${process.arch}`, v8: process.versions.v8 },
    threads: {
      available: typeof os.availableParallelism === 'function' ? os.availableParallelism() : os.cpus().length,
    },
    backends: {
      node: await tryBackend('onnxruntime-node'),
      wasm: await tryBackend('onnxruntime-web'),
      webgpu: await webGpuStatus(),
    },
  };
  const gpu = report.backends.webgpu.available === true;

  // the agreement check: same prompt, both backends, max |Δ| over every logit
  say('doctor: running the bundled model on each backend …');
  const agreement: Record<string, any> = { model: 'default', prompt: PROMPT, tolerance: AGREEMENT_TOLERANCE };
  const webgpuAgreement: Record<string, any> = { model: 'default', prompt: PROMPT, tolerance: AGREEMENT_TOLERANCE };
  const memory: Record<string, any> = {};
  // which path each backend ran the model on, and why (precision.ts): weight precision, vocabulary split
  const paths: Record<string, Record<string, unknown>> = {};
  /** the bundled model's logits on one backend; its path and memory recorded */
  const logitsOn = async (backend: string): Promise<Float32Array> => {
    const m = await loadModelForCli('default', backend);
    const i = m.info;
    paths[backend] = {
      weights: i.weights,
      weights_reason: i.weights_reason,
      vocab_chunks: i.vocab_chunks,
      vocab_reason: i.vocab_reason,
      readout: i.readout,
      readout_reason: i.readout_reason,
    };
    try {
      const ids = m.tokenize(PROMPT);
      const logits = (await m.run(ids, { hooks: 'all' })).logits.data;
      agreement.tokens = ids.length;
      memory[backend] = {
        ...m.memory(),
        ...(backend === 'wasm' ? { wasm_heap_bytes: wasmHeapBytes() } : {}),
        rss_bytes: process.memoryUsage().rss,
      };
      return logits;
    } finally {
      await m.dispose().catch(() => undefined);
    }
  };
  let nodeLogits: Float32Array | undefined;
  try {
    nodeLogits = await logitsOn('node');
    const wasm = await logitsOn('wasm');
    agreement.max_abs_logit_diff = maxDiff(nodeLogits, wasm);
    agreement.ok = nodeLogits.length === wasm.length && agreement.max_abs_logit_diff <= AGREEMENT_TOLERANCE;
  } catch (e) {
    agreement.ok = false;
    agreement.error = toLoupeError(e).toJSON().error;
  }
  // the page's Doctor checks WebGPU against WASM; here against node, the CLI's default
  if (gpu && nodeLogits) {
    try {
      const webgpu = await logitsOn('webgpu');
      webgpuAgreement.max_abs_logit_diff = maxDiff(webgpu, nodeLogits);
      webgpuAgreement.ok =
        webgpu.length === nodeLogits.length && webgpuAgreement.max_abs_logit_diff <= AGREEMENT_TOLERANCE;
    } catch (e) {
      webgpuAgreement.ok = false;
      webgpuAgreement.error = toLoupeError(e).toJSON().error;
    }
  }
  report.agreement = agreement;
  report.webgpu_agreement =
    webgpuAgreement.ok !== undefined
      ? webgpuAgreement
      : {
          ok: null,
          not_run: gpu ? 'the node backend did not run' : 'the webgpu backend is unavailable',
        };
  report.memory = memory;

  // q8's and q4's cost on the bundled model (onnxruntime-node): reported so that 8- and 4-bit weights are never silent
  const costs: Record<'q8' | 'q4', Record<string, any>> = { q8: {}, q4: {} };
  for (const scheme of ['q8', 'q4'] as const) {
    say(`doctor: running the bundled model at stored and ${scheme} weights …`);
    try {
      const [base, cand] = [
        await loadModelForCli('default', 'node', undefined, 'stored'),
        await loadModelForCli('default', 'node', undefined, scheme),
      ];
      try {
        costs[scheme] = { model: 'default', prompt: PROMPT, ...(await precisionCost(base, cand, PROMPT)) };
      } finally {
        await base.dispose().catch(() => undefined);
        await cand.dispose().catch(() => undefined);
      }
    } catch (e) {
      costs[scheme] = { model: 'default', error: toLoupeError(e).toJSON().error };
    }
  }
  report.q8_cost = costs.q8;
  report.q4_cost = costs.q4;
  report.paths = paths;

  const dir = defaultCacheDir();
  const size = await dirSize(dir);
  report.cache = { location: dir, env: 'LOUPE_CACHE_DIR', bytes: size.bytes, files: size.files };
  // no adapter is not a failure (most machines have none); a WebGPU that disagrees is
  report.ok =
    report.backends.node.available &&
    report.backends.wasm.available &&
    agreement.ok &&
    report.webgpu_agreement.ok !== false;

  if (json) io.stdout(JSON.stringify({ doctor: report }) + '\n');
  else {
    const mb = (n: number) => `${(n / 1e6).toFixed(1)} MB`;
    const b = (x: any) => (x.available ? `available (${x.version})` : `unavailable: ${x.error}`);
    io.stdout(
      [
        `runtime     Node ${report.runtime.node} on ${report.runtime.platform}`,
        `threads     ${report.threads.available}`,
        `backend     node: ${b(report.backends.node)}`,
        `backend     wasm: ${b(report.backends.wasm)}`,
        `backend     webgpu: ${webgpuLine(report.backends.webgpu)}`,
        `agreement   ${agreement.ok ? 'ok' : 'FAILED'}: ` +
          (agreement.error
            ? agreement.error.message
            : `max |Δ logit| node vs wasm = ${agreement.max_abs_logit_diff.toExponential(2)} ` +
              `over ${agreement.tokens} tokens (tolerance ${AGREEMENT_TOLERANCE})`),
        `agreement   webgpu: ` +
          (webgpuAgreement.ok === undefined
            ? `not run (${report.webgpu_agreement.not_run})`
            : `${webgpuAgreement.ok ? 'ok' : 'FAILED'}: ` +
              (webgpuAgreement.error
                ? webgpuAgreement.error.message
                : `max |Δ logit| webgpu vs node = ${webgpuAgreement.max_abs_logit_diff.toExponential(2)} ` +
                  `(tolerance ${AGREEMENT_TOLERANCE})`)),
        ...Object.entries(memory).map(
          ([b, m]) =>
            `memory      ${b}: weights ${mb(m.weight_bytes)} (${m.precision}), weights in JS ` +
            `${mb(m.js_weight_bytes)}${m.js_weights_why ? ` (${m.js_weights_why})` : ''}, ` +
            `param copies ${mb(m.param_bytes)}, hooks returned ` +
            `${mb(m.hooks_bytes)}${m.wasm_heap_bytes != null ? `, WASM heap ${mb(m.wasm_heap_bytes)}` : ''}, ` +
            `process RSS ${mb(m.rss_bytes)}`,
        ),
        ...Object.entries(costs).map(
          ([scheme, q]) =>
            `${scheme} cost     ` +
            (q.error
              ? `not measured: ${q.error.message}`
              : `vs ${q.baseline} on the bundled model: max |Δ logit| ${q.max_abs_logit_diff.toExponential(2)} ` +
                `(max |logit| ${q.max_abs_logit.toFixed(2)}), max |Δ DLA| ${q.max_abs_dla_diff.toExponential(2)} ` +
                `(max |DLA| ${q.max_abs_dla.toFixed(2)}), ${q.same_prediction ? 'same' : 'a different'} prediction`),
        ),
        ...Object.entries(paths).map(
          ([k, p]) =>
            `path        ${k}: weights ${p.weights} (${p.weights_reason}); vocabulary ${p.vocab_reason}; DLA readout ${p.readout} (${p.readout_reason})`,
        ),
        `cache       ${dir} (${(size.bytes / 1e6).toFixed(1)} MB in ${size.files} files; set LOUPE_CACHE_DIR to move it)`,
      ].join('\n') + '\n',
    );
  }
  return report.ok ? 0 : 1;
}
