/**
 * `tsx bench/q8-start.ts [shape] [--backends node,wasm] [--repeat 3]` — issue 11's target for a
 * second start: a cached load ≤ 1.5× the time to create the session from bytes already in memory.
 *
 * Per backend, on a random-weight F16 model of the shape (default qwen2.5-0.5b, bench/scale.ts),
 * each a fresh process loading with --weights q8 and no trace (bench/scale-child.ts load-only):
 * one cold load that writes the q8 cache entry (the first backend's: a later backend's "cold" load
 * reads it, the cache being one per run), then `repeat` pairs, alternating, of
 *   nocache  LOUPE_Q8_CACHE=0: quantised in memory; its session_ms is onnxruntime creating the
 *            session from the quantised bytes in memory (node: from the graph folder they were
 *            written to, as ort-session-node.ts hands every in-memory weight file over)
 *   cached   ready_ms of a load reading the entry (the whole second start: files, headers,
 *            tokenizer, graph, the entry's check, the session)
 * and prints the medians and cached ready / nocache session. A scratch LOUPE_CACHE_DIR.
 */
import { rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import * as path from 'node:path';
import { startResults } from './results';
import { child, generate, SHAPES } from './scale';
import { useScratchCacheDir } from '../tests/helpers/scratch-cache';

function main() {
  if (!process.env.LOUPE_CACHE_DIR) process.on('exit', useScratchCacheDir());
  const args = process.argv.slice(2);
  const opt = (k: string, d: string) => {
    const i = args.indexOf(`--${k}`);
    return i >= 0 ? args[i + 1] : d;
  };
  const shape = SHAPES.find(
    (s) =>
      s.name ===
      (args.find((a, i) => !a.startsWith('--') && !(i > 0 && args[i - 1].startsWith('--'))) ?? 'qwen2.5-0.5b'),
  )!;
  const repeat = Number(opt('repeat', '3'));
  const dir = path.join(tmpdir(), 'loupe-q8-start', shape.name);
  generate(shape, dir);
  const record = startResults(
    'q8-start',
    `q8 second start: a cached load vs a session from memory, ${shape.name} shape`,
  );
  const notes: string[] = [];
  const med = (x: number[]) => [...x].sort((a, b) => a - b)[Math.floor(x.length / 2)];
  try {
    for (const backend of opt('backends', 'node,wasm').split(',')) {
      const cold = child(dir, backend, 'q8', 'cold', true);
      console.error(JSON.stringify({ backend, run: 'cold', ...cold }));
      const rows: Record<'nocache' | 'cached', { ready_ms?: number; session_ms?: number; peak_bytes?: number }[]> = {
        nocache: [],
        cached: [],
      };
      for (let i = 0; i < repeat; i++) {
        for (const run of ['nocache', 'cached'] as const) {
          const r = child(dir, backend, 'q8', run, true);
          console.error(JSON.stringify({ backend, run, ...r }));
          if (r.error) throw new Error(r.error);
          rows[run].push(r);
        }
      }
      const m = (run: 'nocache' | 'cached', k: 'ready_ms' | 'session_ms' | 'peak_bytes') =>
        med(rows[run].map((r) => r[k]!));
      const ratio = m('cached', 'ready_ms') / m('nocache', 'session_ms');
      notes.push(
        `${shape.name} ${backend} q8 (medians of ${repeat}): cold ${(cold.ready_ms! / 1000).toFixed(1)} s; uncached ready ${(m('nocache', 'ready_ms') / 1000).toFixed(1)} s, its session from memory ${(m('nocache', 'session_ms') / 1000).toFixed(2)} s, peak ${(m('nocache', 'peak_bytes') / 1e9).toFixed(2)} GB; cached ready ${(m('cached', 'ready_ms') / 1000).toFixed(2)} s (session ${(m('cached', 'session_ms') / 1000).toFixed(2)} s), peak ${(m('cached', 'peak_bytes') / 1e9).toFixed(2)} GB; cached ready / session from memory = ${ratio.toFixed(2)} (target ≤ 1.5)`,
      );
      console.log(notes[notes.length - 1]);
    }
    record.save([], notes);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

main();
