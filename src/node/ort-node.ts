/**
 * The one place onnxruntime-node is loaded, so that its telemetry is off in every Node entry
 * point (CLI, headless MCP, `npm start`, bench, tests).
 *
 * onnxruntime-node 1.30's native library has telemetry on by default: on the first session it
 * writes a device id and an event database under ~/.cache/Microsoft/DeveloperTools/.onnxruntime
 * and carries an event-collector URL (mobile.events.data.microsoft.com). The library reads
 * ORT_DISABLE_TELEMETRY from the process environment; the Node binding exposes no API for it.
 * Setting process.env here sets the C environment too (Node's setenv), before the library's
 * first getenv (in the main thread only: a worker thread's process.env is a copy, so the headless
 * engine thread's starter calls this first). Child processes inherit it. tests/ort-telemetry.test.ts checks that no file is
 * written and that nothing else in src/, bench/ or tests/ loads the package directly.
 */
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);

export function disableOrtTelemetry(): void {
  process.env.ORT_DISABLE_TELEMETRY = '1';
}

/** require('onnxruntime-node') with telemetry off; throws what require throws. */
export function requireOrtNode<T = unknown>(): T {
  disableOrtTelemetry();
  return require('onnxruntime-node') as T;
}
