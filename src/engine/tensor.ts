/** A dense float32 tensor, row-major, as every engine result is returned. */
export interface Tensor {
  dims: number[];
  data: Float32Array;
}

export function numel(dims: readonly number[]): number {
  return dims.reduce((a, b) => a * b, 1);
}

export function tensor(dims: number[], data?: Float32Array): Tensor {
  const n = numel(dims);
  return { dims, data: data ?? new Float32Array(n) };
}
