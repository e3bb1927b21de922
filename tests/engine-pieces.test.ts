/**
 * Weight files past 2 GiB and 4 GiB: onnxruntime-web refuses an external data buffer of 2 GiB or
 * more, so weights reach it in pieces (src/engine/runtime/pieces.ts) read by range. Tested on a
 * sparse file: a valid safetensors header whose tensors start after a 4.5 GB hole (no disk, no
 * memory), on both Node backends, against the float64 reference; and the piece planner on its own.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import {
  closeSync,
  mkdtempSync,
  openSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
  writeSync,
  copyFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import * as path from 'node:path';
import onnxProto from 'onnx-proto';
import { loadModelNode, nodeFactory } from '../src/node/load';
import { loadModelFilesNode } from '../src/node/load-files-node';
import { createModel, modelPartsFrom } from '../src/engine/model';
import type { EngineSession } from '../src/engine/runtime/ort-session';
import type { ReadableWeightSet } from '../src/engine/safetensors';
import { pieceGraph } from '../src/engine/runtime/pieces';
import { buildModelGraph } from '../src/engine/graph/build-model';
import { describeModel } from '../src/engine/arch';
import { readSafetensorsHeaderFromDisk } from '../src/node/load-files-node';
import {
  ALL_FAMILY_CASES,
  makeCaseModel,
  caseTokens,
  referenceForward,
  maxAbsDiff,
  type RandomModel,
} from './reference';

const { onnx } = onnxProto as any;
const HOLE = 4_500_000_000; // > 4 GiB: offsets past 2^32

/** A copy of `dir` whose model.safetensors keeps every tensor but places the data after a hole of `hole` bytes. */
function sparseCopy(dir: string, hole: number): string {
  const out = mkdtempSync(path.join(tmpdir(), 'loupe-sparse-'));
  for (const f of ['config.json', 'tokenizer.json', 'tokenizer_config.json'])
    copyFileSync(path.join(dir, f), path.join(out, f));
  const bytes = readFileSync(path.join(dir, 'model.safetensors'));
  const n = Number(bytes.readBigUInt64LE(0));
  const header = JSON.parse(bytes.subarray(8, 8 + n).toString('utf8'));
  for (const [k, v] of Object.entries<any>(header))
    if (k !== '__metadata__') v.data_offsets = v.data_offsets.map((o: number) => o + hole);
  const json = Buffer.from(JSON.stringify(header));
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(json.length));
  const fd = openSync(path.join(out, 'model.safetensors'), 'w');
  try {
    writeSync(fd, len, 0, 8, 0);
    writeSync(fd, json, 0, json.length, 8);
    const data = bytes.subarray(8 + n);
    writeSync(fd, data, 0, data.length, 8 + json.length + hole); // the hole stays unallocated
  } finally {
    closeSync(fd);
  }
  return out;
}

describe('weight files over 4 GiB (sparse)', () => {
  let rm: RandomModel;
  let sparse: string;
  beforeAll(() => {
    rm = makeCaseModel(
      ALL_FAMILY_CASES.find((c) => c.name === 'llama3-rope-untied-bias')!,
      { dtype: 'F16' },
    );
    sparse = sparseCopy(rm.dir, HOLE);
  });
  afterAll(() => {
    rm?.cleanup();
    if (sparse) rmSync(sparse, { recursive: true, force: true });
  });

  it('the file is past 4 GiB and its data really sits past the hole', () => {
    const size = statSync(path.join(sparse, 'model.safetensors')).size;
    expect(size).toBeGreaterThan(HOLE);
    const h = readSafetensorsHeaderFromDisk(path.join(sparse, 'model.safetensors'), 'model.safetensors');
    expect(Math.min(...h.tensors.map((t) => t.fileOffset))).toBeGreaterThan(2 ** 32);
  });

  it.each(['wasm', 'node'] as const)(
    '%s: loads and agrees with the float64 reference (both precisions)',
    async (backend) => {
      const c = ALL_FAMILY_CASES.find((x) => x.name === 'llama3-rope-untied-bias')!;
      const tokens = caseTokens(rm, c.seqLen);
      const ref = referenceForward(rm, tokens);
      for (const weights of ['stored', 'f32'] as const) {
        const m = await loadModelNode(sparse, { backend, weights });
        try {
          const out = await m.run(tokens);
          expect(maxAbsDiff(ref.logits.data, out.logits.data).maxAbs, `${backend} ${weights}`).toBeLessThan(1e-4);
        } finally {
          await m.dispose();
        }
      }
    },
  );
});

describe('pieceGraph', () => {
  let rm: RandomModel;
  afterAll(() => rm?.cleanup());

  it('splits external data into runs of whole tensors no larger than the limit, offsets relative to each piece', () => {
    rm = makeCaseModel(
      ALL_FAMILY_CASES.find((c) => c.name === 'gpt2-tied')!,
      { dtype: 'F16' },
    );
    const header = readSafetensorsHeaderFromDisk(path.join(rm.dir, 'model.safetensors'), 'model.safetensors');
    const tensors = new Map(header.tensors.map((t) => [t.name, t]));
    const spec = describeModel({ config: JSON.parse(readFileSync(path.join(rm.dir, 'config.json'), 'utf8')), tensors });
    const graph = buildModelGraph(spec, tensors, { hooks: false, withResult: false });
    const limit = 8192;
    const { graphBytes, pieces } = pieceGraph(graph.bytes, limit);
    expect(pieces.length).toBeGreaterThan(3);
    const byPath = new Map(pieces.map((p) => [p.path, p]));
    const inits = onnx.ModelProto.decode(graphBytes).graph.initializer.filter((i: any) => i.dataLocation === 1);
    expect(inits.length).toBeGreaterThan(0);
    for (const init of inits) {
      const kv = Object.fromEntries(init.externalData.map((e: any) => [e.key, e.value]));
      const p = byPath.get(kv.location)!;
      expect(p, kv.location).toBeDefined();
      const t = tensors.get(String(init.name).replace(/^w:/, ''))!;
      // the piece holds the tensor's bytes where the rewritten entry says
      expect(p.start + Number(kv.offset)).toBe(t.fileOffset);
      expect(p.start + Number(kv.offset) + Number(kv.length)).toBeLessThanOrEqual(p.end);
    }
    for (const p of pieces)
      expect(
        p.end - p.start <= limit ||
          inits.some((i: any) => Number(i.externalData.find((e: any) => e.key === 'length').value) > limit),
      ).toBe(true);
  });
});

describe('onnxruntime-web pieces read tensor by tensor', () => {
  let rm: RandomModel;
  afterAll(() => rm?.cleanup());

  /** a model on Node's WASM backend whose sessions are collected; `alter` edits the weight set first */
  async function load(alter?: (w: ReadableWeightSet) => void) {
    const files = await loadModelFilesNode(rm.dir);
    alter?.(files.weights as ReadableWeightSet);
    const factory = await nodeFactory('wasm');
    const sessions: EngineSession[] = [];
    const create = factory.create.bind(factory);
    factory.create = async (g, w) => {
      const s = await create(g, w);
      sessions.push(s);
      return s;
    };
    const model = await createModel(modelPartsFrom(files, { bundled: false, weightsMode: 'stored' }), factory);
    return { model, sessions };
  }

  it("a file on disk is read as onnxruntime-web copies each tensor, with the float64 reference's numbers", async () => {
    const c = ALL_FAMILY_CASES.find((x) => x.name === 'gpt2-tied')!;
    rm = makeCaseModel(c, { dtype: 'F16' });
    const tokens = caseTokens(rm, c.seqLen);
    const { model, sessions } = await load();
    try {
      const out = await model.run(tokens);
      expect(sessions.map((s) => s.pieces)).toEqual(['lazy']);
      expect(maxAbsDiff(referenceForward(rm, tokens).logits.data, out.logits.data).maxAbs).toBeLessThan(1e-4);
    } finally {
      await model.dispose();
    }
  });

  it('where ranges cannot be read synchronously (Blobs outside a worker) the pieces are read whole first, same numbers', async () => {
    const c = ALL_FAMILY_CASES.find((x) => x.name === 'gpt2-tied')!;
    const tokens = caseTokens(rm, c.seqLen);
    const { model, sessions } = await load((w) => {
      const read = w.readRange!;
      const path_ = [...w.paths.keys()][0];
      w.ranged = new Map([
        [
          path_,
          {
            size: statSync(w.paths.get(path_)!).size,
            read: () => {
              throw new Error('no synchronous reads here');
            },
            readAsync: async (o: number, n: number) => read(path_, o, n),
          },
        ],
      ]);
    });
    try {
      const out = await model.run(tokens);
      expect(sessions.map((s) => s.pieces)).toEqual(['whole']);
      expect(maxAbsDiff(referenceForward(rm, tokens).logits.data, out.logits.data).maxAbs).toBeLessThan(1e-4);
    } finally {
      await model.dispose();
    }
  });
});
