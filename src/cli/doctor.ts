/**
 * `loupe doctor`: what this machine offers Loupe — runtime, backends, threads — and whether the
 * two Node backends agree on the bundled model (the same check the engine's tests make), plus
 * where the weight cache lives and how big it is, and what `--weights q8` costs in numbers on the
 * bundled model (max |Δ| of the logits and of trace's DLA against the stored precision; reported,
 * not judged). Exit 1 when a check fails.
 */
import * as os from 'node:os';
import * as path from 'node:path';
import { existsSync, promises as fsp, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { loadModelForCli, type Io } from './load-model';
import { defaultCacheDir } from '../node/dir-cache';
import { toLoupeError } from '../engine/errors';
import { requireOrtNode } from '../node/ort-node';
import { wasmHeapBytes } from '../engine/runtime/wasm-heap';
import { precisionCost } from '../ops/lib/precision-cost';

/** logits of the two Node backends must agree this closely on the bundled model */
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

export async function doctor(argv: string[], io: Io): Promise<number> {
  const json = argv.includes('--json');
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
    },
  };

  // the agreement check: same prompt, both backends, max |Δ| over every logit
  say('doctor: running the bundled model on both backends …');
  const agreement: Record<string, any> = { model: 'default', prompt: PROMPT, tolerance: AGREEMENT_TOLERANCE };
  const memory: Record<string, any> = {};
  // which path each backend ran the model on, and why (precision.ts): weight precision, vocabulary split
  const paths: Record<string, Record<string, unknown>> = {};
  try {
    const logits: Float32Array[] = [];
    for (const backend of ['node', 'wasm'] as const) {
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
        logits.push((await m.run(ids, { hooks: 'all' })).logits.data);
        agreement.tokens = ids.length;
        memory[backend] = {
          ...m.memory(),
          ...(backend === 'wasm' ? { wasm_heap_bytes: wasmHeapBytes() } : {}),
          rss_bytes: process.memoryUsage().rss,
        };
      } finally {
        await m.dispose().catch(() => undefined);
      }
    }
    let d = 0;
    for (let i = 0; i < logits[0].length; i++) d = Math.max(d, Math.abs(logits[0][i] - logits[1][i]));
    agreement.max_abs_logit_diff = d;
    agreement.ok = logits[0].length === logits[1].length && d <= AGREEMENT_TOLERANCE;
  } catch (e) {
    agreement.ok = false;
    agreement.error = toLoupeError(e).toJSON().error;
  }
  report.agreement = agreement;
  report.memory = memory;

  // q8's cost on the bundled model (onnxruntime-node): reported so that 8-bit weights are never silent
  say('doctor: running the bundled model at stored and q8 weights …');
  let q8: Record<string, any>;
  try {
    const [base, cand] = [
      await loadModelForCli('default', 'node', undefined, 'stored'),
      await loadModelForCli('default', 'node', undefined, 'q8'),
    ];
    try {
      q8 = { model: 'default', prompt: PROMPT, ...(await precisionCost(base, cand, PROMPT)) };
    } finally {
      await base.dispose().catch(() => undefined);
      await cand.dispose().catch(() => undefined);
    }
  } catch (e) {
    q8 = { model: 'default', error: toLoupeError(e).toJSON().error };
  }
  report.q8_cost = q8;
  report.paths = {
    ...paths,
    webgpu: "not in Node: the page's Doctor says which path WebGPU takes (shader-f16, buffer limits)",
  };

  const dir = defaultCacheDir();
  const size = await dirSize(dir);
  report.cache = { location: dir, env: 'LOUPE_CACHE_DIR', bytes: size.bytes, files: size.files };
  report.ok = report.backends.node.available && report.backends.wasm.available && agreement.ok;

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
        `agreement   ${agreement.ok ? 'ok' : 'FAILED'}: ` +
          (agreement.error
            ? agreement.error.message
            : `max |Δ logit| node vs wasm = ${agreement.max_abs_logit_diff.toExponential(2)} ` +
              `over ${agreement.tokens} tokens (tolerance ${AGREEMENT_TOLERANCE})`),
        ...Object.entries(memory).map(
          ([b, m]) =>
            `memory      ${b}: weights ${mb(m.weight_bytes)} (${m.precision}), weights in JS ` +
            `${mb(m.js_weight_bytes)}${m.js_weights_why ? ` (${m.js_weights_why})` : ''}, ` +
            `param copies ${mb(m.param_bytes)}, hooks returned ` +
            `${mb(m.hooks_bytes)}${m.wasm_heap_bytes != null ? `, WASM heap ${mb(m.wasm_heap_bytes)}` : ''}, ` +
            `process RSS ${mb(m.rss_bytes)}`,
        ),
        'q8 cost     ' +
          (q8.error
            ? `not measured: ${q8.error.message}`
            : `vs ${q8.baseline} on the bundled model: max |Δ logit| ${q8.max_abs_logit_diff.toExponential(2)} ` +
              `(max |logit| ${q8.max_abs_logit.toFixed(2)}), max |Δ DLA| ${q8.max_abs_dla_diff.toExponential(2)} ` +
              `(max |DLA| ${q8.max_abs_dla.toFixed(2)}), ${q8.same_prediction ? 'same' : 'a different'} prediction`),
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
