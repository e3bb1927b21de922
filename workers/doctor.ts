/** What the browser offers the engine: WebGPU adapter and limits, storage. Runs in the worker. */
import type { GpuInfo, StorageInfo } from './protocol';

/** limits worth showing: the ones that bound model size and kernel shapes */
const LIMIT_KEYS = [
  'maxBufferSize', 'maxStorageBufferBindingSize', 'maxComputeWorkgroupStorageSize',
  'maxComputeInvocationsPerWorkgroup', 'maxComputeWorkgroupSizeX', 'maxComputeWorkgroupsPerDimension',
  'maxStorageBuffersPerShaderStage',
];

interface GpuAdapterLike {
  info?: { vendor?: string; architecture?: string; device?: string; description?: string; isFallbackAdapter?: boolean };
  isFallbackAdapter?: boolean;
  features: Iterable<string>;
  limits: Record<string, number>;
}

let adapterPromise: Promise<GpuInfo> | null = null;

/** Ask for an adapter once per worker; requestAdapter can be slow on software adapters. */
export function gpuInfo(): Promise<GpuInfo> {
  adapterPromise ??= (async (): Promise<GpuInfo> => {
    const gpu = (navigator as Navigator & { gpu?: { requestAdapter(): Promise<GpuAdapterLike | null> } }).gpu;
    if (!gpu) return { available: false, reason: 'navigator.gpu is missing: this browser (or this context) has no WebGPU.' };
    let adapter: GpuAdapterLike | null;
    try {
      adapter = await gpu.requestAdapter();
    } catch (e) {
      return { available: false, reason: `requestAdapter failed: ${(e as Error).message}` };
    }
    if (!adapter) return { available: false, reason: 'WebGPU exists but no adapter was offered (blocklisted or disabled GPU).' };
    const info = adapter.info ?? {};
    const limits: Record<string, number> = {};
    for (const k of LIMIT_KEYS) if (typeof adapter.limits[k] === 'number') limits[k] = adapter.limits[k];
    return {
      available: true,
      vendor: info.vendor || undefined,
      architecture: info.architecture || undefined,
      device: info.device || undefined,
      description: info.description || undefined,
      isFallbackAdapter: info.isFallbackAdapter ?? adapter.isFallbackAdapter ?? false,
      features: [...adapter.features].sort(),
      limits,
    };
  })();
  return adapterPromise;
}

export async function storageInfo(): Promise<StorageInfo> {
  const s = navigator.storage;
  if (!s?.estimate) return { usage: null, quota: null, persisted: null };
  const est = await s.estimate();
  let persisted: boolean | null = null;
  try { persisted = (await s.persisted?.()) ?? null; } catch { /* not in every worker */ }
  return { usage: est.usage ?? null, quota: est.quota ?? null, persisted };
}

export function jsHeapBytes(): number | null {
  const m = (performance as Performance & { memory?: { usedJSHeapSize: number } }).memory;
  return m ? m.usedJSHeapSize : null;
}
