/** What the browser offers the engine: WebGPU adapter and limits, storage. Runs in the worker. */
import type { GpuInfo, StorageInfo } from './protocol';
import { env } from '../src/engine/env';

/** limits worth showing: the ones that bound model size and kernel shapes */
const LIMIT_KEYS = [
  'maxBufferSize',
  'maxStorageBufferBindingSize',
  'maxComputeWorkgroupStorageSize',
  'maxComputeInvocationsPerWorkgroup',
  'maxComputeWorkgroupSizeX',
  'maxComputeWorkgroupsPerDimension',
  'maxStorageBuffersPerShaderStage',
];

let adapterPromise: Promise<GpuInfo> | null = null;

/** The adapter env.webgpu() found (asked for once per worker), described for the doctor panel. */
export function gpuInfo(): Promise<GpuInfo> {
  adapterPromise ??= (async (): Promise<GpuInfo> => {
    const { adapter, reason } = await env.webgpu();
    if (!adapter) return { available: false, reason: reason ?? 'no WebGPU adapter' };
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
  try {
    persisted = (await s.persisted?.()) ?? null;
  } catch {
    /* not in every worker */
  }
  return { usage: est.usage ?? null, quota: est.quota ?? null, persisted };
}

export function jsHeapBytes(): number | null {
  const m = (performance as Performance & { memory?: { usedJSHeapSize: number } }).memory;
  return m ? m.usedJSHeapSize : null;
}
