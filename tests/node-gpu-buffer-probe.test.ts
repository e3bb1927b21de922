/**
 * The Node WebGPU buffer probe (src/node/gpu-buffer-probe.ts) on this machine's adapter (here and
 * in CI: Chromium's SwiftShader, whose Vulkan device holds a 256 MiB buffer and not an 8 GiB one):
 * a size above the WebGPU default that the device holds is made and read back; one over its limits
 * fails with the reason, in the child, and this process carries on.
 */
import { describe, it, expect } from 'vitest';
import { probeGpuBuffer } from '../src/node/gpu-buffer-probe';
import { webGpuRoute } from '../src/node/webgpu-node';
import { requireOrtNode } from '../src/node/ort-node';
import type { OrtModule } from '../src/engine/runtime/ort-session';

const route = await webGpuRoute(requireOrtNode<OrtModule>());

describe.skipIf(!route.available)('the WebGPU buffer probe', () => {
  it('the route offers it when no limit is stated, with the limit known up front and its source', () => {
    expect(route.caps!.probeBuffer).toBe(probeGpuBuffer);
    expect(route.caps!.maxBufferBytes).toBe(128 * 1024 ** 2);
    expect(route.caps!.limitSource).toMatch(/WebGPU default maxStorageBufferBindingSize/);
  });

  it('256 MiB (twice the default) works; 8 GiB fails with the reason; smaller and larger sizes are then known', async () => {
    const ok = await probeGpuBuffer(256 * 1024 ** 2);
    expect(ok.ok, ok.source).toBe(true);
    expect(ok.source).toMatch(/^probed: a 268 MB tensor made and read back .* in a child process$/);
    const no = await probeGpuBuffer(8 * 1024 ** 3);
    expect(no.ok).toBe(false);
    expect(no.source).toMatch(/failed \(.+\)/);
    expect((await probeGpuBuffer(200 * 1024 ** 2)).source).toMatch(/a larger one worked/);
    expect((await probeGpuBuffer(9 * 1024 ** 3)).source).toMatch(/a smaller one did/);
  }, 240_000);
});
