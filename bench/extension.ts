/**
 * What a bench extension is (extensions.ts lists them; gradients.ts is one in its own file): its
 * context, its rows and its result. Apart from the list so that an extension in its own file
 * imports no list that imports it.
 */
import type { LoadedModel } from '../src/engine/api';

export interface ExtContext {
  modelDir: string;
  threads: number;
  /** bytes of the model's weights */
  weightBytes: number;
  log(message: string): void;
  /** loadModelNode(modelDir, { backend: 'node', threads }) */
  loadModel(): Promise<LoadedModel>;
}

export interface ExtRow {
  metric: string;
  value: string;
  target?: string;
  /** whether the target is met (omit when there is no target) */
  ok?: boolean;
}

export interface ExtResult {
  rows: ExtRow[];
  json: Record<string, unknown>;
}

export interface BenchExtension {
  /** key in the JSON results */
  name: string;
  title: string;
  /** the child's time limit (default 300 s) */
  timeoutMs?: number;
  run(ctx: ExtContext): Promise<ExtResult>;
}

/** thrown by an extension whose operation is not (yet) in the project */
export class SkipExtension extends Error {}
