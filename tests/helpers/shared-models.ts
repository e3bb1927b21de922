/**
 * The two real models in ../shared, loaded once per test file both on the engine and on the
 * float64 reference (tests/reference), and disposed after it.
 */
import { beforeAll, afterAll } from 'vitest';
import * as path from 'node:path';
import { loadModelNode } from '../../src/node/load';
import type { LoadedModel } from '../../src/engine/api';
import { loadModelDir, type RefModel } from '../reference';
import { SHARED } from './shared';

export interface SharedModels {
  /** induction-gpt2 on the engine */
  gpt2: LoadedModel;
  /** the bundled stories260K on the engine */
  stories: LoadedModel;
  gpt2Ref: RefModel;
  storiesRef: RefModel;
}

/** Registers beforeAll/afterAll; `set` receives the models once they are loaded. */
export function useSharedModels(set: (m: SharedModels) => void): void {
  let loaded: SharedModels | undefined;
  beforeAll(async () => {
    const [gpt2, stories] = await Promise.all([
      loadModelNode(path.join(SHARED, 'models/induction-gpt2')),
      loadModelNode('default'),
    ]);
    loaded = {
      gpt2,
      stories,
      gpt2Ref: loadModelDir(path.join(SHARED, 'models/induction-gpt2')),
      storiesRef: loadModelDir(path.join(SHARED, 'models/stories260K')),
    };
    set(loaded);
  });
  afterAll(async () => {
    await loaded?.gpt2.dispose();
    await loaded?.stories.dispose();
  });
}
