/**
 * The largest buffer onnxruntime-node's WebGPU provider can use, found by trying it: onnxruntime-node
 * 1.30 exposes none of the adapter's limits (its `env.webgpu` is empty in Node, and its provider
 * options cannot ask for them), while the device it makes asks for the adapter's own
 * maxBufferSize and maxStorageBufferBindingSize (webgpu_context.cc GetRequiredLimits). So a load
 * that needs a buffer above the WebGPU default asks here whether one of that size works: a child
 * process makes a tensor of that many bytes on the provider and reads its last element back
 * (gpu-buffer-probe-child.ts). A buffer over a limit fails there with Dawn's validation error, one
 * the device cannot allocate with its out-of-memory error, and a wrong value is a failure too, so
 * the answer cannot be silently wrong. Answers are kept per process.
 */
import { execFile } from 'node:child_process';
import { createRequire } from 'node:module';
import * as path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { fmtGB } from '../engine/budget';

export interface BufferProbe {
  ok: boolean;
  source: string;
}

const CHILD = fileURLToPath(new URL('./gpu-buffer-probe-child.ts', import.meta.url));
/** seconds a probe may take (SwiftShader fills 768 MiB in about a second) */
const PROBE_TIMEOUT_MS = 120_000;

function tsxLoader(): string {
  const pkg = createRequire(import.meta.url).resolve('tsx/package.json');
  return pathToFileURL(path.join(path.dirname(pkg), 'dist', 'loader.mjs')).href;
}

function runChild(bytes: number): Promise<{ ok: boolean; error?: string; ms?: number }> {
  return new Promise((resolve) => {
    execFile(
      process.execPath,
      ['--import', tsxLoader(), CHILD, String(bytes)],
      { env: process.env, timeout: PROBE_TIMEOUT_MS, maxBuffer: 1 << 20 },
      (err, stdout) => {
        const line = stdout.trim().split('\n').pop() ?? '';
        try {
          resolve(JSON.parse(line));
        } catch {
          resolve({ ok: false, error: err ? `the probe process failed (${err.message.split('\n')[0]})` : 'no answer' });
        }
      },
    );
  });
}

let largestOk = 0;
let smallestFailed = Infinity;
const pending = new Map<number, Promise<BufferProbe>>();

/** Whether a `bytes` buffer works on this machine's WebGPU provider (see the header). */
export function probeGpuBuffer(bytes: number): Promise<BufferProbe> {
  const what = `a ${fmtGB(bytes)} tensor made and read back on onnxruntime-node's WebGPU provider`;
  if (bytes <= largestOk) return Promise.resolve({ ok: true, source: `probed: ${what} (a larger one worked)` });
  if (bytes >= smallestFailed)
    return Promise.resolve({ ok: false, source: `probed: ${what} failed (a smaller one did)` });
  let p = pending.get(bytes);
  if (!p) {
    p = runChild(bytes).then((r) => {
      if (r.ok) largestOk = Math.max(largestOk, bytes);
      else smallestFailed = Math.min(smallestFailed, bytes);
      return r.ok
        ? { ok: true, source: `probed: ${what} in a child process` }
        : { ok: false, source: `probed: ${what} failed (${r.error})` };
    });
    pending.set(bytes, p);
  }
  return p;
}
