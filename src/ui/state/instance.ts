/** The page's single AppState, with the model worker it owns. */
import { AppState } from './app.svelte';

export const app = new AppState(
  () => new Worker(new URL('../../../workers/engine.worker.ts', import.meta.url), { type: 'module', name: 'loupe-engine' }),
);
