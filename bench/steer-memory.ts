/**
 * What one `steer` leaves in memory and costs, in its own process (#11 "no second copy"): load a
 * model, run `steer` once with a random direction (its default targets come from the direction's
 * direct logit effect over the whole vocabulary, its controls from unembedding cosines: every use
 * of W_U the steering operations have), and print the engine's parameter copies in JavaScript
 * (memory().param_bytes), the process's RSS and peak RSS (VmHWM) at ready and over the steer (reset
 * before it through /proc/self/clear_refs), the steer's time, and then the time of one more direct
 * logit effect over the vocabulary (lib/directions.ts directLogitScores; median of 3).
 *
 *   tsx bench/steer-memory.ts [DIR] [node|wasm]     (default: the GPT-2-small-shaped bench model, node)
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { loadModelNode } from '../src/node/load';
import { getOperation } from '../src/ops/index';
import { directLogitScores, randomVector } from '../src/ops/lib/directions';
import { ensureBenchModel } from './model-gen';
import { startResults } from './results';

const status = (k: string) =>
  Number(new RegExp(`${k}:\\s+(\\d+)`).exec(readFileSync('/proc/self/status', 'utf8'))![1]) * 1024;
const gb = (b: number) => +(b / 1e9).toFixed(3);

async function main() {
  const record = startResults('steer-memory', 'What one `steer` leaves in memory and costs (bench/steer-memory.ts)');
  const dir = process.argv[2] || ensureBenchModel(undefined, (m) => console.error(m)).dir;
  const backend = (process.argv[3] ?? 'node') as 'node' | 'wasm';
  const model = await loadModelNode(dir, { backend });
  const ready = { rss: status('VmRSS'), hwm: status('VmHWM') };
  try {
    writeFileSync('/proc/self/clear_refs', '5');
  } catch {
    /* not Linux: the peak is the process's */
  }
  const t0 = performance.now();
  await getOperation('steer')!.run(
    model,
    {
      prompt: 'the quick brown fox jumps over the lazy dog',
      layer: 6,
      direction: 'random:1',
      alpha: 4,
      max_new_tokens: 4,
    } as never,
    {},
  );
  const steerMs = performance.now() - t0;
  const paramBytes = model.memory().param_bytes;
  const rssAfter = status('VmRSS'),
    peakSteer = status('VmHWM');
  // one direct logit effect over the vocabulary after that (W_U's products warm, as in a second operation), median of 3
  const d = randomVector(model.info.d_model, 2);
  const dla: number[] = [];
  for (let i = 0; i < 3; i++) {
    const t = performance.now();
    await directLogitScores(model, d);
    dla.push(performance.now() - t);
  }
  const result = {
    backend,
    steer_ms: Math.round(steerMs),
    param_bytes: paramBytes,
    rss_ready_gb: gb(ready.rss),
    hwm_ready_gb: gb(ready.hwm),
    rss_after_steer_gb: gb(rssAfter),
    peak_during_steer_gb: gb(peakSteer),
    direct_logit_ms: Math.round(dla.sort((a, b) => a - b)[1]),
  };
  console.log(JSON.stringify(result));
  const head = [
    'backend',
    'steer',
    'JS parameter copies',
    'RSS / peak at ready',
    'RSS after / peak during steer',
    'one more direct logit effect',
  ];
  const row = [
    backend,
    `${result.steer_ms} ms`,
    `${(result.param_bytes / 1e6).toFixed(2)} MB`,
    `${result.rss_ready_gb} / ${result.hwm_ready_gb} GB`,
    `${result.rss_after_steer_gb} / ${result.peak_during_steer_gb} GB`,
    `${result.direct_logit_ms} ms`,
  ];
  record.save([{ head, rows: [row] }], [], result);
  await model.dispose();
}
void main();
