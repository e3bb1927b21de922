// The engine thread's entry (headless-engine.ts): a worker thread has no module hooks of its own,
// so it registers tsx before loading the TypeScript (as bin/loupe.mjs does for the main thread).
import { register } from 'tsx/esm/api';

register();
await import('./engine-thread.ts');
