/**
 * The Node backend 'webgpu': onnxruntime-node's bundled WebGPU execution provider (Dawn: Vulkan
 * on Linux, Metal on macOS, D3D12 on Windows). The engine makes the page's WebGPU decisions from
 * the GpuCaps found here (plan.ts decideLoad: precision, vocabulary split, largest buffer; the q8
 * form in q8.ts).
 *
 * What onnxruntime-node 1.30 exposes: whether a session on the 'webgpu' provider can be created
 * (an adapter exists), and whether a float16 kernel runs on it. It does not expose the adapter's
 * vendor, architecture, limits or features (its `env.webgpu` is empty in Node). So:
 *  - shader-f16 is probed: Cast to float16, Add, Cast back, with no CPU fallback;
 *  - the buffer limit known up front is the WebGPU default maxStorageBufferBindingSize (128 MiB,
 *    which every adapter offers); a model that needs a larger buffer has that size probed
 *    (gpu-buffer-probe.ts: made and read back in a child process), unless
 *    $LOUPE_WEBGPU_BUFFER_BYTES states the limit, which then holds as given.
 *
 * On Linux the Vulkan driver is found, or Chromium's SwiftShader set up, by vulkan.ts.
 */
import type { GpuCaps } from '../engine/env';
import { LoupeError } from '../engine/errors';
import type { OrtModule } from '../engine/runtime/ort-session';
import { OnnxGraph } from '../engine/graph/onnx-builder';
import { prepareVulkan, swiftShaderIcd, type VulkanSetup } from './vulkan';
import { probeGpuBuffer } from './gpu-buffer-probe';

/** the WebGPU spec's default maxStorageBufferBindingSize: every adapter offers at least this */
export const DEFAULT_BUFFER_BYTES = 128 * 1024 ** 2;
export const BUFFER_BYTES_VAR = 'LOUPE_WEBGPU_BUFFER_BYTES';

export const NOT_EXPOSED =
  "onnxruntime-node does not expose the adapter's vendor, architecture, limits or features; " +
  'shader-f16 is probed by running a float16 kernel';

/** what `loupe doctor` and a refusal say about the route */
export interface WebGpuRoute {
  available: boolean;
  vulkan: VulkanSetup;
  caps?: GpuCaps;
  /** where caps.maxBufferBytes comes from */
  buffer_limit: string;
  not_exposed: string;
  /** why no session could be made on the provider */
  error?: string;
}

function bufferLimit(env: NodeJS.ProcessEnv): { bytes: number; source: string; probe?: true } {
  const v = env[BUFFER_BYTES_VAR];
  if (v === undefined || v === '')
    return {
      bytes: DEFAULT_BUFFER_BYTES,
      source:
        'the WebGPU default maxStorageBufferBindingSize (onnxruntime-node exposes no adapter limits; a larger ' +
        `buffer is probed; ${BUFFER_BYTES_VAR} states the adapter's own)`,
      probe: true,
    };
  const n = Number(v);
  if (!Number.isSafeInteger(n) || n < 1024 ** 2)
    throw new LoupeError(
      'BAD_INPUT',
      `${BUFFER_BYTES_VAR} must be a whole number of bytes, at least 1 MiB (got '${v}').`,
    );
  return { bytes: n, source: `from ${BUFFER_BYTES_VAR}` };
}

/** Cast to float16, Add, Cast back: [1, 2.5, -3, 4] → [2, 5, -6, 8] only where WGSL f16 runs */
function f16Graph(): Uint8Array {
  const g = new OnnxGraph(() => '');
  const x = g.input('x', 'float', [4]);
  const h = g.o('Cast', [x], { to: 10 });
  g.rename(g.o('Cast', [g.o('Add', [h, h])], { to: 1 }), 'y');
  g.output('y');
  return g.encode();
}
const F16_IN = [1, 2.5, -3, 4];

async function runsOnGpu(ort: OrtModule, graph: Uint8Array): Promise<Float32Array> {
  const s = await ort.InferenceSession.create(graph, {
    executionProviders: ['webgpu'],
    logSeverityLevel: 4,
    extra: { session: { 'session.disable_cpu_ep_fallback': '1' } },
  });
  try {
    const out = await s.run({ x: new ort.Tensor('float32', Float32Array.from(F16_IN), [4]) });
    return out.y.data as Float32Array;
  } finally {
    await s.release?.();
  }
}

/** Float32 Add: the provider's session is made (an adapter and a device exist) and computes */
function addGraph(): Uint8Array {
  const g = new OnnxGraph(() => '');
  const x = g.input('x', 'float', [4]);
  g.rename(g.o('Add', [x, x]), 'y');
  g.output('y');
  return g.encode();
}

/** onnxruntime's message without its source location: 'Failed to get a WebGPU adapter: No supported adapters' */
function providerMessage(m: string): string {
  return /Failed to get a WebGPU \w+[^\n]*/.exec(m)?.[0] ?? m.split('\n')[0];
}

const routes = new WeakMap<object, Promise<WebGpuRoute>>();

/** The provider's route on this machine, probed once per onnxruntime module. */
export function webGpuRoute(ort: OrtModule): Promise<WebGpuRoute> {
  let r = routes.get(ort);
  if (!r) routes.set(ort, (r = probe(ort)));
  return r;
}

async function probe(ort: OrtModule): Promise<WebGpuRoute> {
  const vulkan = prepareVulkan();
  const limit = bufferLimit(process.env);
  const base = { vulkan, buffer_limit: limit.source, not_exposed: NOT_EXPOSED };
  try {
    const y = await runsOnGpu(ort, addGraph());
    if (!F16_IN.every((v, i) => y[i] === 2 * v)) throw new Error(`a float32 Add returned [${[...y].join(', ')}]`);
  } catch (e) {
    return { ...base, available: false, error: providerMessage((e as Error).message) };
  }
  const shaderF16 = await runsOnGpu(ort, f16Graph()).then(
    (y) => F16_IN.every((v, i) => y[i] === 2 * v),
    () => false,
  );
  const caps: GpuCaps = {
    shaderF16,
    maxBufferBytes: limit.bytes,
    limitSource: limit.source,
    shaderF16Source: 'probed: a float16 kernel run on the provider with no CPU fallback',
    ...(limit.probe ? { probeBuffer: probeGpuBuffer } : {}),
  };
  return { ...base, available: true, caps };
}

/** The caps for a WebGPU session factory, or BACKEND_UNAVAILABLE naming what is missing. */
export async function webGpuCaps(ort: OrtModule): Promise<GpuCaps> {
  const r = await webGpuRoute(ort);
  if (r.caps) return r.caps;
  const v = r.vulkan;
  const swift = swiftShaderIcd();
  throw new LoupeError(
    'BACKEND_UNAVAILABLE',
    `No WebGPU adapter: onnxruntime-node's WebGPU provider could not start (${r.error}).` +
      (v.missing ? ` Missing: ${v.missing}.` : ''),
    (v.drivers === 'none' || v.missing
      ? ''
      : `The Vulkan driver (${v.icd.join(', ')}) offered no adapter that Dawn accepts. `) +
      (swift && !v.icd.includes(swift)
        ? `Chromium's SwiftShader is installed: set VK_ICD_FILENAMES=${swift} (or leave VK_ICD_FILENAMES unset with no driver installed). `
        : "Install a Vulkan driver (your GPU vendor's, or Mesa's), or Chromium for its SwiftShader. ") +
      'Use --backend node meanwhile.',
    { backend: 'webgpu', vulkan: v },
  );
}
