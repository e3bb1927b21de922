/**
 * The graph onnxruntime-node actually runs: create a session (optimization level 'all', as the
 * engine does), have ORT write the optimized model, and count what its initializers hold.
 */
import { readFileSync } from 'node:fs';
import * as path from 'node:path';
import onnxProto from 'onnx-proto';
import { requireOrtNode } from '../../src/node/ort-node';

const { onnx } = onnxProto as any;

/** elements held per initializer element type (onnx TensorProto: 1 float32, 3 int8, 10 float16) and the Cast nodes left */
export async function optimizedGraphStats(
  modelPath: string,
): Promise<{ byType: Record<number, number>; casts: number }> {
  const ort = requireOrtNode<any>();
  const out = path.join(path.dirname(modelPath), 'optimized.onnx');
  const session = await ort.InferenceSession.create(modelPath, {
    executionProviders: ['cpu'],
    graphOptimizationLevel: 'all',
    optimizedModelFilePath: out,
    logSeverityLevel: 3,
  });
  await session.release();
  const g = onnx.ModelProto.decode(readFileSync(out)).graph;
  const byType: Record<number, number> = {};
  for (const t of g.initializer)
    byType[t.dataType] = (byType[t.dataType] ?? 0) + t.dims.reduce((a: number, b: any) => a * Number(b), 1);
  return { byType, casts: g.node.filter((n: any) => n.opType === 'Cast').length };
}
