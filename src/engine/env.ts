/**
 * What this runtime offers, probed once and read from here by everything else (after
 * transformers.js's `env`): WebGPU, cross-origin isolation (threaded WASM needs it), CPU threads,
 * and the Hub endpoint and token from $HF_ENDPOINT / $HF_TOKEN (Node; a page passes its own).
 * Each value is computed on first use and kept.
 */

export interface WebGpuProbe {
  /** the adapter, or null with the reason there is none */
  adapter: GpuAdapterLike | null;
  reason?: string;
}

export interface GpuAdapterLike {
  info?: { vendor?: string; architecture?: string; device?: string; description?: string; isFallbackAdapter?: boolean };
  isFallbackAdapter?: boolean;
  features: Iterable<string>;
  limits: Record<string, number>;
}

/** What a WebGPU adapter offers the engine's weights (onnxruntime-web asks its device for the adapter's own limits and for shader-f16 when offered). */
export interface GpuCaps {
  /** WGSL `f16`: without it no shader can read a 16-bit weight */
  shaderF16: boolean;
  /** the largest one buffer binding: min(maxStorageBufferBindingSize, maxBufferSize) */
  maxBufferBytes: number;
  /** where maxBufferBytes comes from (the page: GPUAdapter.limits; Node: src/node/webgpu-node.ts) */
  limitSource?: string;
  /** where shaderF16 comes from (the page: GPUAdapter.features; Node: a float16 kernel run) */
  shaderF16Source?: string;
  /**
   * Whether one buffer of `bytes` works on this adapter, where the limit is not read but probed
   * (Node: src/node/gpu-buffer-probe.ts); `source` says how it was found
   */
  probeBuffer?: (bytes: number) => Promise<{ ok: boolean; source: string }>;
}

export function gpuCaps(adapter: GpuAdapterLike): GpuCaps {
  const l = adapter.limits;
  const has = (k: string) => typeof l[k] === 'number';
  // the WebGPU spec's guaranteed minimums when an adapter does not say
  const binding = has('maxStorageBufferBindingSize') ? l.maxStorageBufferBindingSize : 128 * 1024 ** 2;
  const buffer = has('maxBufferSize') ? l.maxBufferSize : 256 * 1024 ** 2;
  const said = (k: string, v: number) =>
    `${k} ${v}${has(k) ? '' : ", the WebGPU spec's minimum: the adapter did not say"}`;
  return {
    shaderF16: [...adapter.features].includes('shader-f16'),
    maxBufferBytes: Math.min(binding, buffer),
    limitSource: `GPUAdapter.limits: ${said('maxStorageBufferBindingSize', binding)}, ${said('maxBufferSize', buffer)}`,
    shaderF16Source: 'GPUAdapter.features',
  };
}

type Nav = { gpu?: { requestAdapter(): Promise<GpuAdapterLike | null> }; hardwareConcurrency?: number };
const nav = (): Nav | undefined => (globalThis as { navigator?: Nav }).navigator;
const processEnv = (): Record<string, string | undefined> =>
  (globalThis as { process?: { env?: Record<string, string | undefined> } }).process?.env ?? {};

function once<T>(probe: () => T): () => T {
  let done = false;
  let value: T;
  return () => {
    if (!done) {
      value = probe();
      done = true;
    }
    return value;
  };
}

const probeWebGpu = once(async (): Promise<WebGpuProbe> => {
  const gpu = nav()?.gpu;
  if (!gpu) return { adapter: null, reason: 'navigator.gpu is missing: this browser (or this context) has no WebGPU.' };
  try {
    const adapter = await gpu.requestAdapter();
    return adapter
      ? { adapter }
      : { adapter: null, reason: 'WebGPU exists but no adapter was offered (blocklisted or disabled GPU).' };
  } catch (e) {
    return { adapter: null, reason: `requestAdapter failed: ${(e as Error).message}` };
  }
});
const probeIsolated = once(() => (globalThis as { crossOriginIsolated?: boolean }).crossOriginIsolated === true);
const probeThreads = once(() => nav()?.hardwareConcurrency ?? 1);
const probeEndpoint = once(() => processEnv().HF_ENDPOINT || undefined);
const probeToken = once(() => processEnv().HF_TOKEN || undefined);

export const env = {
  /** the WebGPU adapter (asked for once: requestAdapter is slow on software adapters) */
  webgpu: probeWebGpu,
  /** cross-origin isolated: SharedArrayBuffer, hence multi-threaded WASM */
  get isolated(): boolean {
    return probeIsolated();
  },
  /** logical CPUs (navigator.hardwareConcurrency; 1 when unknown) */
  get threads(): number {
    return probeThreads();
  },
  /** Hub endpoint from $HF_ENDPOINT (undefined: the default https://huggingface.co) */
  get endpoint(): string | undefined {
    return probeEndpoint();
  },
  /** Hub access token from $HF_TOKEN */
  get token(): string | undefined {
    return probeToken();
  },
  /** an environment variable of the process (Node; undefined in a page), read when asked */
  variable(name: string): string | undefined {
    return processEnv()[name];
  },
};
