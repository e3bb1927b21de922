/** Model spec parsing (pure) and the source factories. */
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { LoupeError } from '../src/engine/errors';
import { readTensorF32 } from '../src/engine/safetensors';
import { createSource } from '../src/engine/source/create-source';
import { loadModelFiles } from '../src/engine/source/files';
import { HubSource } from '../src/engine/source/hub-source';
import { MemorySource } from '../src/engine/source/memory-source';
import { resolveModelRef } from '../src/engine/source/ref';
import { UrlSource } from '../src/engine/source/url-source';
import { sourceFromSpec } from '../src/node/load-files-node';
import { FolderSource } from '../src/node/folder-source';
import { f32Bytes, writeSafetensors } from './helpers/safetensors-writer';
import { SHARED } from './helpers/shared';

const HF = 'https://huggingface.co';

describe('resolveModelRef', () => {
  it.each<[string, unknown]>([
    ['default', { kind: 'bundled', id: 'stories260K', revision: '' }],
    ['', { kind: 'bundled', id: 'stories260K', revision: '' }],
    ['owner/name', { kind: 'hub', id: 'owner/name', revision: 'main', endpoint: HF }],
    ['  owner/name@v1.0 ', { kind: 'hub', id: 'owner/name', revision: 'v1.0', endpoint: HF }],
    [
      'HuggingFaceTB/SmolLM2-135M@refs/pr/3',
      { kind: 'hub', id: 'HuggingFaceTB/SmolLM2-135M', revision: 'refs/pr/3', endpoint: HF },
    ],
    ['gpt2', { kind: 'hub', id: 'gpt2', revision: 'main', endpoint: HF }],
    [
      'https://huggingface.co/EleutherAI/pythia-70m',
      { kind: 'hub', id: 'EleutherAI/pythia-70m', revision: 'main', endpoint: HF },
    ],
    [
      'https://huggingface.co/EleutherAI/pythia-70m/tree/step1000',
      { kind: 'hub', id: 'EleutherAI/pythia-70m', revision: 'step1000', endpoint: HF },
    ],
    ['https://example.org/models/tiny', { kind: 'url', id: 'https://example.org/models/tiny/', revision: '' }],
    ['http://127.0.0.1:8080/m/', { kind: 'url', id: 'http://127.0.0.1:8080/m/', revision: '' }],
    ['./models/x', { kind: 'folder', id: './models/x', revision: '' }],
    ['/abs/path', { kind: 'folder', id: '/abs/path', revision: '' }],
    ['~/models/x', { kind: 'folder', id: '~/models/x', revision: '' }],
    ['..', { kind: 'folder', id: '..', revision: '' }],
    ['file:///tmp/m%20x', { kind: 'folder', id: '/tmp/m x', revision: '' }],
  ])('%j', (spec, expected) => {
    expect(resolveModelRef(spec)).toEqual(expected);
  });

  it('an existing folder wins over a Hub-looking name (Node passes isFolder); a custom endpoint is kept', () => {
    expect(resolveModelRef('models/tiny', { isFolder: (p) => p === 'models/tiny' })).toEqual({
      kind: 'folder',
      id: 'models/tiny',
      revision: '',
    });
    expect(resolveModelRef('models/tiny', { isFolder: () => false }).kind).toBe('hub');
    expect(resolveModelRef('a/b', { endpoint: 'http://127.0.0.1:1234/' })).toMatchObject({
      kind: 'hub',
      endpoint: 'http://127.0.0.1:1234',
    });
  });

  it.each(['a/b/c', 'owner/na me', '-bad/name', 'owner/name@', 'a/..', '@rev'])(
    'refuses %j with BAD_INPUT and a hint',
    (spec) => {
      let err: unknown;
      try {
        resolveModelRef(spec);
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(LoupeError);
      expect((err as LoupeError).code).toBe('BAD_INPUT');
      expect((err as LoupeError).hint).toMatch(/owner\/name/);
    },
  );
});

describe('sources', () => {
  it('HubSource URLs encode revisions and file paths; UrlSource joins base and file', () => {
    const h = new HubSource('owner/name', { revision: 'refs/pr/1', endpoint: 'http://127.0.0.1:5/' });
    expect(h.url('sub dir/model.safetensors')).toBe(
      'http://127.0.0.1:5/owner/name/resolve/refs%2Fpr%2F1/sub%20dir/model.safetensors',
    );
    expect(h.cacheKey('config.json')).toEqual({
      endpoint: 'http://127.0.0.1:5',
      id: 'owner/name',
      revision: 'refs/pr/1',
      file: 'config.json',
    });
    const u = new UrlSource('https://example.org/m');
    expect(u.url('config.json')).toBe('https://example.org/m/config.json');
    expect(() => new UrlSource('not a url')).toThrowError(LoupeError);
  });

  it('createSource (browser) and sourceFromSpec (Node) pick the right source', () => {
    const b = createSource(resolveModelRef('default'), { baseUrl: 'http://127.0.0.1:9/app/index.html' });
    expect(b).toBeInstanceOf(UrlSource);
    expect((b as UrlSource).url('config.json')).toBe('http://127.0.0.1:9/app/models/stories260K/config.json');
    expect(createSource(resolveModelRef('a/b@dev'))).toBeInstanceOf(HubSource);
    expect(() => createSource(resolveModelRef('./x'))).toThrowError(/CLI/);
    const n = sourceFromSpec('default');
    expect(n).toBeInstanceOf(FolderSource);
    expect(sourceFromSpec(SHARED + '/models/induction-gpt2')).toBeInstanceOf(FolderSource);
    expect(sourceFromSpec('owner/name', { endpoint: 'http://127.0.0.1:1' }).ref).toMatchObject({
      kind: 'hub',
      endpoint: 'http://127.0.0.1:1',
    });
  });

  it('MemorySource loads generated models through loadModelFiles', async () => {
    const gpt2 = SHARED + '/models/induction-gpt2';
    const src = new MemorySource(
      {
        'config.json': readFileSync(`${gpt2}/config.json`, 'utf8'),
        'tokenizer.json': readFileSync(`${gpt2}/tokenizer.json`, 'utf8'),
        'model.safetensors': writeSafetensors([{ name: 'w', dtype: 'F32', shape: [3], data: f32Bytes([1, 2, 3]) }]),
      },
      'gen',
    );
    const f = await loadModelFiles(src);
    expect(f.tokenizerConfig).toBeNull();
    expect(f.generationConfig).toBeNull();
    expect(Array.from(readTensorF32(f.weights, 'w'))).toEqual([1, 2, 3]);
    const missing = await loadModelFiles(new MemorySource({ 'tokenizer.json': '{}' })).catch((e) => e);
    expect(missing.code).toBe('MISSING_CONFIG');
  });
});
