/** RunOptions.hookPositions: a hook's values at some of its positions, along one axis. */
import { LoupeError } from '../errors';
import type { Tensor } from '../tensor';

export function checkPositions(positions: number[], T: number): void {
  if (positions.length === 0) throw new LoupeError('BAD_INPUT', 'hookPositions is empty.');
  for (const p of positions)
    if (!Number.isInteger(p) || p < 0 || p >= T)
      throw new LoupeError(
        'BAD_INPUT',
        `hook position ${p} is outside this run's ${T} positions.`,
        `Use 0 … ${T - 1}.`,
      );
}

/** t taken at `positions` along `axis` (a copy), as onnxruntime's Gather does on the device */
export function gatherAt(t: Tensor, axis: number, positions: number[]): Tensor {
  const dims = [...t.dims];
  const outer = dims.slice(0, axis).reduce((a, b) => a * b, 1);
  const inner = dims.slice(axis + 1).reduce((a, b) => a * b, 1);
  const n = dims[axis];
  const data = new Float32Array(outer * positions.length * inner);
  for (let o = 0; o < outer; o++)
    positions.forEach((p, i) =>
      data.set(t.data.subarray((o * n + p) * inner, (o * n + p + 1) * inner), (o * positions.length + i) * inner),
    );
  dims[axis] = positions.length;
  return { dims, data };
}
