/** Loading from local folders in Node: header-only reads, paths for ORT, structured errors. */
import {
  closeSync,
  copyFileSync,
  ftruncateSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readFileSync,
  rmSync,
  truncateSync,
  writeFileSync,
  writeSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import * as path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { LoupeError } from '../src/engine/errors';
import { readTensorF32 } from '../src/engine/safetensors';
import { loadModelFilesNode, readFileRange } from '../src/node/load-files-node';
import { readSafetensorsSimple, shardModel } from './helpers/safetensors-writer';
import { SHARED } from './helpers/shared';

const GPT2 = SHARED + '/models/induction-gpt2';
const tmp = mkdtempSync(path.join(tmpdir(), 'loupe-node-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

async function code(p: Promise<unknown>): Promise<LoupeError> {
  try {
    await p;
  } catch (e) {
    expect(e).toBeInstanceOf(LoupeError);
    return e as LoupeError;
  }
  throw new Error('expected a LoupeError');
}

/** copy a model folder (small files only + chosen weights) */
function copyModel(name: string, opts: { skip?: string[] } = {}): string {
  const dir = path.join(tmp, name);
  mkdirSync(dir, { recursive: true });
  for (const f of [
    'config.json',
    'tokenizer.json',
    'tokenizer_config.json',
    'generation_config.json',
    'model.safetensors',
  ]) {
    if (!opts.skip?.includes(f)) copyFileSync(path.join(GPT2, f), path.join(dir, f));
  }
  return dir;
}

describe('loadModelFilesNode on folders', () => {
  it("'default' is the bundled stories260K, weights by path, not in memory", async () => {
    const events: { file: string; done?: boolean }[] = [];
    const f = await loadModelFilesNode('default', { onProgress: (p) => events.push(p) });
    expect(f.ref.kind).toBe('folder');
    expect(f.ref.id).toMatch(/public\/models\/stories260K$/);
    expect(f.config.model_type).toBe('llama');
    expect(f.tokenizerJson.model).toBeTruthy();
    expect(f.generationConfig).not.toBeNull();
    expect(f.weights.files.size).toBe(0);
    expect(f.weights.paths.get('model.safetensors')).toBe(path.join(f.ref.id, 'model.safetensors'));
    // Every tensor equals what an independent reader finds in the file.
    const ref = readSafetensorsSimple(new Uint8Array(readFileSync(path.join(f.ref.id, 'model.safetensors'))));
    expect(f.weights.tensors.size).toBe(ref.tensors.length);
    for (const t of ref.tensors) {
      const mine = readTensorF32(f.weights, t.name);
      expect(
        Buffer.compare(Buffer.from(mine.buffer, mine.byteOffset, mine.byteLength), Buffer.from(t.data)),
        t.name,
      ).toBe(0);
      expect(f.weights.tensors.get(t.name)!.shape).toEqual(t.shape);
    }
    expect(events.filter((e) => e.done).map((e) => e.file)).toEqual([
      'config.json',
      'tokenizer.json',
      'tokenizer_config.json',
      'generation_config.json',
      'model.safetensors',
    ]);
  });

  it('a sharded folder: every shard by path, same tensors as the original', async () => {
    const dir = path.join(tmp, 'sharded');
    const { shards } = shardModel(GPT2, dir, 3);
    const f = await loadModelFilesNode(dir);
    expect(f.weightFiles).toEqual(shards);
    expect([...f.weights.paths.keys()].sort()).toEqual(shards);
    const orig = await loadModelFilesNode(GPT2);
    expect(f.weights.tensors.size).toBe(orig.weights.tensors.size);
    for (const name of orig.weights.tensors.keys())
      expect(readTensorF32(f.weights, name)).toEqual(readTensorF32(orig.weights, name));
  });

  it('structured errors for broken folders', async () => {
    expect((await code(loadModelFilesNode(path.join(tmp, 'does-not-exist')))).code).toBe('MODEL_NOT_FOUND');
    expect((await code(loadModelFilesNode(copyModel('nocfg', { skip: ['config.json'] })))).code).toBe('MISSING_CONFIG');
    const noTok = await code(loadModelFilesNode(copyModel('notok', { skip: ['tokenizer.json'] })));
    expect(noTok.code).toBe('MISSING_TOKENIZER');
    expect(noTok.hint).toMatch(/tokenizer\.json|save_pretrained/);
    expect((await code(loadModelFilesNode(copyModel('noweights', { skip: ['model.safetensors'] })))).code).toBe(
      'FILE_NOT_FOUND',
    );

    const badCfg = copyModel('badcfg');
    writeFileSync(path.join(badCfg, 'config.json'), '{"model_type": ');
    expect((await code(loadModelFilesNode(badCfg))).code).toBe('BAD_CONFIG');

    const trunc = copyModel('trunc');
    truncateSync(path.join(trunc, 'model.safetensors'), 300_000);
    const t = await code(loadModelFilesNode(trunc));
    expect(t.code).toBe('SAFETENSORS_TRUNCATED');
    expect(t.message).toContain('model.safetensors');

    const badIndex = path.join(tmp, 'badindex');
    shardModel(GPT2, badIndex, 2);
    writeFileSync(path.join(badIndex, 'model.safetensors.index.json'), '{"weight_map": [1, 2]}');
    expect((await code(loadModelFilesNode(badIndex))).code).toBe('BAD_INDEX');

    const missingShard = path.join(tmp, 'missingshard');
    const { shards } = shardModel(GPT2, missingShard, 2);
    rmSync(path.join(missingShard, shards[1]));
    const ms = await code(loadModelFilesNode(missingShard));
    expect(ms.code).toBe('BAD_INDEX');
    expect(ms.message).toContain(shards[1]);
  });

  it('a 500 MB safetensors file loads by header only, with little memory', async () => {
    // A sparse file: a real header describing 500 MB of F32 tensors, data never written.
    const dir = copyModel('big', { skip: ['model.safetensors'] });
    const n = 25_000_000; // 100 MB per tensor
    const names = ['a', 'b', 'c', 'd', 'e'];
    const header: Record<string, unknown> = {};
    names.forEach((k, i) => {
      header[`big.${k}`] = { dtype: 'F32', shape: [5000, 5000], data_offsets: [i * n * 4, (i + 1) * n * 4] };
    });
    let json = JSON.stringify(header);
    while ((8 + json.length) % 8) json += ' ';
    const p = path.join(dir, 'model.safetensors');
    const fd = openSync(p, 'w');
    const len = Buffer.alloc(8);
    len.writeBigUInt64LE(BigInt(json.length));
    writeSync(fd, len, 0, 8, 0);
    writeSync(fd, Buffer.from(json), 0, json.length, 8);
    const size = 8 + json.length + names.length * n * 4;
    ftruncateSync(fd, size);
    // a recognisable value at the start of big.c
    const c0 = Buffer.from(new Float32Array([42.5, -1]).buffer);
    writeSync(fd, c0, 0, 8, 8 + json.length + 2 * n * 4);
    closeSync(fd);

    const before = process.memoryUsage().rss;
    const t0 = performance.now();
    const f = await loadModelFilesNode(dir);
    const ms = performance.now() - t0;
    const grew = process.memoryUsage().rss - before;
    console.log(
      `500 MB safetensors (${(size / 1e6).toFixed(0)} MB): loaded in ${ms.toFixed(1)} ms, RSS grew ${(grew / 1e6).toFixed(1)} MB`,
    );
    expect(f.weights.files.size).toBe(0);
    expect(f.weights.tensors.get('big.e')!.byteLength).toBe(n * 4);
    expect(grew).toBeLessThan(50e6);
    // reading a tensor reads that range only
    const c = f.weights.tensors.get('big.c')!;
    expect(Array.from(new Float32Array(readFileRange(p, c.fileOffset, 8).slice().buffer))).toEqual([42.5, -1]);
  });
});
