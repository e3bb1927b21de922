/** The backends a Node process runs models on (load.ts): the one list the CLI, `loupe mcp --headless` and doctor read. */
export const NODE_BACKENDS = ['node', 'wasm', 'webgpu'] as const;
export type NodeBackend = (typeof NODE_BACKENDS)[number];

export const NODE_BACKENDS_HELP =
  "node (onnxruntime-node on the CPU, default), wasm (onnxruntime-web) or webgpu (onnxruntime-node's WebGPU provider)";

export function isNodeBackend(b: unknown): b is NodeBackend {
  return typeof b === 'string' && (NODE_BACKENDS as readonly string[]).includes(b);
}
