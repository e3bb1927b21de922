/**
 * This round's families at the edges of their input, through the Hub stand-in (nothing downloaded
 * from anywhere else): a config of a supported family with a feature Loupe cannot run is refused
 * from config.json alone, naming the field (UNSUPPORTED_CONFIG, before the tokenizer or any weight
 * header); a multimodal Gemma 3 checkpoint whose text model cannot be found is a clear error
 * before any weight byte; and a sharded one never fetches its vision tower's shard, and runs
 * equal to the float64 reference.
 */
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { writeFileSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { LoupeError } from '../src/engine/errors';
import { HubSource } from '../src/engine/source/hub-source';
import { loadModelFiles } from '../src/engine/source/files';
import { judgeModel, planModel } from '../src/engine/source/preflight';
import { loadModelNode } from '../src/node/load';
import { startHubServer, type HubServer } from './helpers/hub-server';
import {
  ALL_FAMILY_CASES,
  makeCaseModel,
  makeRandomModel,
  caseTokens,
  referenceForward,
  maxAbsDiff,
} from './reference';

let hub: HubServer;
const cleanups: (() => void)[] = [];
beforeAll(async () => {
  hub = await startHubServer();
});
afterAll(async () => {
  await hub?.close();
  for (const c of cleanups) c();
});

async function failure(p: Promise<unknown>): Promise<LoupeError> {
  try {
    await p;
  } catch (e) {
    expect(e, String(e)).toBeInstanceOf(LoupeError);
    return e as LoupeError;
  }
  throw new Error('expected a LoupeError');
}

/** a case's folder served as `repo`, its config.json patched */
function serve(repo: string, caseName: string, patch: (config: Record<string, any>) => Record<string, any>) {
  const rm = makeCaseModel(ALL_FAMILY_CASES.find((c) => c.name === caseName)!);
  cleanups.push(rm.cleanup);
  const config = patch(JSON.parse(readFileSync(join(rm.dir, 'config.json'), 'utf8')));
  writeFileSync(join(rm.dir, 'config.json'), JSON.stringify(config));
  hub.addRepo(repo, rm.dir);
  return rm;
}

/** the files of `repo` the stand-in was asked for */
const asked = (repo: string) => new Set(hub.log.filter((r) => r.id === repo).map((r) => r.file));

describe('a feature Loupe cannot run is UNSUPPORTED_CONFIG from config.json alone, naming the field', () => {
  const cases: [string, string, (c: Record<string, any>) => Record<string, any>, string, unknown][] = [
    [
      'gemma3: an unknown layer type',
      'gemma3-text-bf16',
      (c) => ({ ...c, layer_types: [...Array(6).fill('sliding_attention'), 'chunked_attention'] }),
      'layer_types[6]',
      'chunked_attention',
    ],
    [
      'gemma3: bidirectional attention (EmbeddingGemma)',
      'gemma3-text-bf16',
      (c) => ({ ...c, use_bidirectional_attention: true }),
      'use_bidirectional_attention',
      true,
    ],
    [
      'gemma3: scaled sliding layers (transformers 5 rope_parameters)',
      'gemma3-text-bf16',
      (c) => ({
        ...c,
        rope_parameters: {
          sliding_attention: { rope_type: 'linear', factor: 2, rope_theta: 10000 },
          full_attention: { rope_type: 'default', rope_theta: 1e6 },
        },
      }),
      'rope_parameters.sliding_attention.rope_type',
      'linear',
    ],
    [
      'gemma3 multimodal: a rope_scaling type in text_config',
      'gemma3-multimodal-text',
      (c) => ({ ...c, text_config: { ...c.text_config, rope_scaling: { rope_type: 'dynamic', factor: 4 } } }),
      'rope_scaling.rope_type',
      'dynamic',
    ],
    [
      'phi3: a rope_scaling type Phi3Config does not accept',
      'phi3-longrope-short-untied',
      (c) => ({ ...c, rope_scaling: { type: 'dynamic', factor: 2 } }),
      'rope_scaling.type',
      'dynamic',
    ],
    [
      'olmo2: a rope_scaling type',
      'olmo2-post-norms',
      (c) => ({ ...c, rope_scaling: { rope_type: 'dynamic', factor: 4, original_max_position_embeddings: 64 } }),
      'rope_scaling.rope_type',
      'dynamic',
    ],
  ];
  for (const [label, caseName, patch, field, value] of cases) {
    it(label, async () => {
      const repo = `bad/${field.replace(/[^a-z0-9]+/gi, '-')}-${caseName}`;
      serve(repo, caseName, patch);
      const e = await failure(planModel(new HubSource(repo, { endpoint: hub.url })));
      expect(e.code).toBe('UNSUPPORTED_CONFIG');
      expect(e.details).toMatchObject({ field, value });
      expect(e.message).toContain(field);
      expect([...asked(repo)]).toEqual(['config.json']); // no tokenizer, no header, no weight byte
    });
  }

  it('a longrope factor list of the wrong length is BAD_CONFIG naming it, also before any header', async () => {
    const repo = 'bad/longrope-length';
    serve(repo, 'phi3-longrope-short-untied', (c) => ({
      ...c,
      rope_scaling: { ...c.rope_scaling, long_factor: [1, 2] },
    }));
    const e = await failure(planModel(new HubSource(repo, { endpoint: hub.url })));
    expect(e.code).toBe('BAD_CONFIG');
    expect(e.details).toMatchObject({ field: 'rope_scaling.long_factor' });
    expect([...asked(repo)]).toEqual(['config.json']);
  });
});

describe('a multimodal Gemma 3 checkpoint whose text model cannot be found: a clear error before any weight byte', () => {
  it('no text_config: BAD_CONFIG from config.json alone', async () => {
    const repo = 'bad/gemma3-no-text-config';
    serve(repo, 'gemma3-multimodal-text', ({ text_config: _t, ...c }) => c);
    const e = await failure(planModel(new HubSource(repo, { endpoint: hub.url })));
    expect(e.code).toBe('BAD_CONFIG');
    expect(e.message).toMatch(/no text_config/);
    expect([...asked(repo)]).toEqual(['config.json']);
  });

  it('text weights under another prefix: MISSING_TENSOR naming both layouts, from the headers only', async () => {
    const repo = 'bad/gemma3-text-elsewhere';
    const rm = makeRandomModel('gemma3', {
      ...ALL_FAMILY_CASES.find((c) => c.name === 'gemma3-multimodal-text')!.options,
      multimodal: 'model.language_model.',
    });
    cleanups.push(rm.cleanup);
    // the same file with every text tensor renamed: rewrite the header's names in place (same length)
    const file = join(rm.dir, 'model.safetensors');
    const bytes = readFileSync(file);
    const n = Number(bytes.readBigUInt64LE(0));
    const header = bytes
      .subarray(8, 8 + n)
      .toString('utf8')
      .replaceAll('model.language_model.', 'model.langwage_model.');
    writeFileSync(file, Buffer.concat([bytes.subarray(0, 8), Buffer.from(header, 'utf8'), bytes.subarray(8 + n)]));
    hub.addRepo(repo, rm.dir);
    hub.resetCounters();
    const src = new HubSource(repo, { endpoint: hub.url });
    const plan = await planModel(src);
    const e = await failure(Promise.resolve().then(() => judgeModel(plan, 'node', 'f32')));
    expect(e.code).toBe('MISSING_TENSOR');
    expect(e.message).toMatch(
      /language_model\.model\.embed_tokens\.weight.*model\.language_model\.embed_tokens\.weight/,
    );
    const ranges = hub.stats(repo, 'model.safetensors').ranges;
    expect(ranges).toEqual(['bytes=0-7', `bytes=8-${8 + n - 1}`]); // its header, and not one tensor byte
  });
});

describe('a sharded multimodal Gemma 3 checkpoint', () => {
  it('never fetches the shard that holds only the vision tower, and runs equal to the float64 reference', async () => {
    const repo = 'ok/gemma3-4b-shaped';
    const c = ALL_FAMILY_CASES.find((x) => x.name === 'gemma3-multimodal-text')!;
    // shard 1: the vision tower and projector; shards 2, 3: the text model (as a save_pretrained by size may split it)
    const rm = makeRandomModel('gemma3', {
      ...c.options,
      shards: 3,
      shardOf: (t) => (!t.startsWith('language_model.') ? 0 : t.includes('layers.2.') || t.includes('.norm.') ? 2 : 1),
    });
    cleanups.push(rm.cleanup);
    hub.addRepo(repo, rm.dir);
    hub.resetCounters();
    const vision = 'model-00001-of-00003.safetensors';
    const index = JSON.parse(readFileSync(join(rm.dir, 'model.safetensors.index.json'), 'utf8'));
    expect(
      Object.entries(index.weight_map)
        .filter(([, f]) => f === vision)
        .map(([t]) => t),
    ).toEqual([
      'vision_tower.vision_model.embeddings.patch_embedding.weight',
      'vision_tower.vision_model.post_layernorm.weight',
      'multi_modal_projector.mm_input_projection_weight',
    ]);
    const files = await loadModelFiles(new HubSource(repo, { endpoint: hub.url }));
    expect(files.weightFiles).toEqual(['model-00002-of-00003.safetensors', 'model-00003-of-00003.safetensors']);
    expect(hub.stats(repo, vision).requests).toBe(0);
    const model = await loadModelNode(repo, { endpoint: hub.url });
    try {
      expect(hub.stats(repo, vision).requests).toBe(0);
      expect(model.info.architecture).toBe('gemma3');
      const tokens = caseTokens(rm, c.seqLen);
      const out = await model.run(tokens);
      expect(maxAbsDiff(referenceForward(rm, tokens).logits.data, out.logits.data).maxAbs).toBeLessThan(1e-4);
    } finally {
      await model.dispose();
    }
  });
});
