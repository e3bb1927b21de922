/**
 * The size of onnxruntime-web's WASM heap, for the memory report (the worker's status bar and
 * doctor, the CLI doctor, the bench). onnxruntime-web does not expose its module, but its
 * (threaded) build creates the heap in JavaScript with `new WebAssembly.Memory(...)`: watching
 * that constructor from before the runtime starts sees every heap it makes. A heap only grows,
 * so its buffer's size now is its peak.
 *
 *   watchWasmHeaps();            // once, before the first onnxruntime-web session
 *   wasmHeapBytes()              // the largest heap's bytes, or null when none was seen
 */
const heaps: WeakRef<WebAssembly.Memory>[] = [];
let watching = false;

export function watchWasmHeaps(): void {
  if (watching || typeof WebAssembly === 'undefined' || typeof WeakRef === 'undefined') return;
  watching = true;
  const Original = WebAssembly.Memory;
  // a subclass, so `instanceof WebAssembly.Memory` and the prototype's methods stay as they were
  class Watched extends Original {
    constructor(desc: WebAssembly.MemoryDescriptor) {
      super(desc);
      heaps.push(new WeakRef(this));
    }
  }
  (WebAssembly as { Memory: typeof WebAssembly.Memory }).Memory = Watched;
}

export function wasmHeapBytes(): number | null {
  let max: number | null = null;
  for (const r of heaps) {
    const m = r.deref();
    if (m) max = Math.max(max ?? 0, m.buffer.byteLength);
  }
  return max;
}
