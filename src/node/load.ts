/**
 * Load a model in Node: 'default' (the bundled stories260K), a folder, a Hub id or a URL.
 * backend 'node' = onnxruntime-node on the CPU (default); 'wasm' = onnxruntime-web's WASM build in
 * Node, selectable so the two runtimes can be compared on the same graph; 'webgpu' =
 * onnxruntime-node's WebGPU provider (webgpu-node.ts), with the page's WebGPU precision and
 * vocabulary split. The load is decided once, from the headers (judgeModel → plan.ts), and
 * createModel runs at that decision.
 */
import { totalmem } from 'node:os';
import type { LoadedModel, LoadOptions } from '../engine/api';
import type { ModelSource } from '../engine/source/types';
import { LoupeError } from '../engine/errors';
import { createModel, modelPartsFrom } from '../engine/model';
import { isBundledSpec } from '../engine/source/ref';
import { parseWeightsMode, OFFERED_PRECISIONS } from '../engine/precision';
import type { LoadDecision } from '../engine/plan';
import { webSessionFactory, type OrtModule, type SessionFactory } from '../engine/runtime/ort-session';
import { judgeModel, type ModelJudgement, type ModelPlan } from '../engine/source/preflight';
import { loadModelFilesNode, sourceFromSpec, type NodeLoadOptions } from './load-files-node';
import { nodeSessionFactory } from './ort-session-node';
import { FolderSource } from './folder-source';
import { requireOrtNode } from './ort-node';
import type { LocalAccess } from './local-access';
import { watchWasmHeaps } from '../engine/runtime/wasm-heap';
import { nodeQ8Store } from './q8-cache';
import { NODE_BACKENDS, type NodeBackend } from './backends';
import { webGpuCaps } from './webgpu-node';
import type { GpuCaps } from '../engine/env';

export interface NodeModelOptions
  extends Omit<LoadOptions, 'backend'>, Pick<NodeLoadOptions, 'cache' | 'endpoint' | 'token'> {
  backend?: NodeBackend;
  /** intra-op threads for onnxruntime-node (default: ORT's choice) */
  threads?: number;
  /** local folders the caller may load from (default 'any': the CLI's user; see local-access.ts) */
  local?: LocalAccess;
  /** `spec` already resolved (sourceFromSpec), so it is not resolved again */
  source?: ModelSource;
  /** asked once the plan is judged, before any weight byte (`loupe serve`: the page's preview); throw to stop */
  confirm?: (plan: ModelPlan, judgement: ModelJudgement | null) => void | Promise<void>;
  /**
   * A test seam: the session factory as the model gets it, wrapped (tests/engine-device-lost.test.ts
   * makes runs fail as a lost device does). Not set by any surface.
   */
  wrapFactory?: (f: SessionFactory) => SessionFactory;
}

/** `extraOptions`: onnxruntime session options over the defaults (the bench measures them) */
export async function nodeFactory(
  backend: NodeBackend,
  threads?: number,
  extraOptions?: Record<string, unknown>,
): Promise<SessionFactory> {
  if (backend === 'node' || backend === 'webgpu') {
    const ort = ortNode();
    const gpu = backend === 'webgpu' ? await webGpuCaps(ort) : undefined;
    return nodeSessionFactory(ort, threads, extraOptions, gpu);
  }
  watchWasmHeaps(); // before the runtime makes its heap: the memory report measures it
  const ort = (await import('onnxruntime-web')) as unknown as OrtModule;
  // One thread: no worker_threads inside ORT-web in Node; comparable with the page's single-thread WASM.
  ort.env.wasm.numThreads = 1;
  return webSessionFactory(ort, 'wasm', undefined, extraOptions);
}

function ortNode(): OrtModule {
  try {
    return requireOrtNode<OrtModule>();
  } catch (e) {
    throw new LoupeError(
      'BACKEND_UNAVAILABLE',
      `onnxruntime-node could not be loaded: ${(e as Error).message}`,
      "Use --backend wasm, or reinstall with 'npm ci'.",
    );
  }
}

/** WebGPU: the adapter's caps, found before any download (no adapter is BACKEND_UNAVAILABLE); they decide the precision */
export async function nodeGpuCaps(backend: NodeBackend): Promise<GpuCaps | undefined> {
  return backend === 'webgpu' ? webGpuCaps(ortNode()) : undefined;
}

export async function loadModelNode(spec: string, opts: NodeModelOptions = {}): Promise<LoadedModel> {
  const backend = opts.backend ?? 'node';
  const source = opts.source ?? sourceFromSpec(spec, { ...opts, names: true });
  const memory = { hostBytes: totalmem(), ...opts.memory };
  // architecture, tensors, precision and memory judged from the headers, before any weight byte
  const mode = parseWeightsMode(opts.weights);
  let decision: LoadDecision | undefined;
  const gpu = await nodeGpuCaps(backend);
  const files = await loadModelFilesNode(source, {
    ...opts,
    judge: async (plan) => {
      const offer = { backends: [...NODE_BACKENDS], precisions: OFFERED_PRECISIONS };
      const j = await judgeModel(plan, backend, mode, memory, offer, gpu);
      decision = j?.decision;
      await opts.confirm?.(plan, j);
    },
  });
  const made = await nodeFactory(backend, opts.threads);
  const factory = opts.wrapFactory ? opts.wrapFactory(made) : made;
  const bundled = isBundledSpec(spec);
  // a folder is named as the caller typed it
  const parts = modelPartsFrom(files, {
    bundled,
    id: source instanceof FolderSource && !bundled ? spec : undefined,
    memory,
    weightsMode: opts.weights,
  });
  return createModel({ ...parts, decision, q8Store: nodeQ8Store(source, opts.cache) }, factory);
}
