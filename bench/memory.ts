/**
 * `tsx bench/memory.ts [shape] [--backends node,wasm] [--weights stored,f32] [--keep]`
 *
 * Peak memory over the weight bytes, per onnxruntime session option that could lower it, on a
 * random-weight model of a bench:scale shape (default gpt2-small), each variant in a fresh
 * process (bench/memory-child.ts): the defaults; pre-packing off (onnxruntime keeps a packed
 * copy of every constant matmul weight); the CPU memory arena off (activations are freed instead
 * of kept in the arena); initializers from the device allocator instead of the arena. Prints
 * RSS and peak RSS after the load and after one `trace`, each over the weight bytes, and the time.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import * as path from 'node:path';
import { SHAPES, generate } from './scale';
import { useScratchCacheDir } from '../tests/helpers/scratch-cache';

const VARIANTS: Record<string, Record<string, unknown>> = {
  default: {},
  'no prepacking': { extra: { session: { disable_prepacking: '1' } } },
  'no CPU arena': { enableCpuMemArena: false },
  'initializers off the arena': { extra: { session: { use_device_allocator_for_initializers: '1' } } },
  'no prepacking, no arena': { enableCpuMemArena: false, extra: { session: { disable_prepacking: '1', use_device_allocator_for_initializers: '1' } } },
};

function main() {
  if (!process.env.LOUPE_CACHE_DIR) process.on('exit', useScratchCacheDir());
  const args = process.argv.slice(2);
  const opt = (k: string, d: string) => { const i = args.indexOf(`--${k}`); return i >= 0 ? args[i + 1] : d; };
  const name = args.find((a, i) => !a.startsWith('--') && !(i > 0 && args[i - 1].startsWith('--') && args[i - 1] !== '--keep')) ?? 'gpt2-small';
  const shape = SHAPES.find((s) => s.name === name);
  if (!shape) throw new Error(`unknown shape ${name}`);
  const only = opt('variants', '');
  const dir = path.join(tmpdir(), 'loupe-memory', shape.name);
  if (!existsSync(path.join(dir, 'model.safetensors'))) generate(shape, dir);
  const rows: string[] = [];
  try {
    for (const backend of opt('backends', 'node,wasm').split(',')) for (const weights of opt('weights', 'stored,f32').split(',')) {
      for (const [v, o] of Object.entries(VARIANTS)) {
        if (only && !only.split(',').includes(v)) continue;
        const r = spawnSync(process.execPath, ['--import', 'tsx', path.join(import.meta.dirname, 'memory-child.ts'), dir, backend, weights, JSON.stringify(o)], { encoding: 'utf8', maxBuffer: 1 << 26 });
        const line = r.stdout.trim().split('\n').filter((l) => l.startsWith('{')).pop();
        const m = line ? JSON.parse(line) : { error: `exit ${r.status}: ${(r.stderr || '').trim().split('\n').slice(-2).join(' | ')}` };
        console.error(JSON.stringify({ backend, weights, variant: v, ...m }));
        const w = m.weight_bytes as number;
        const x = (b: number) => (b / w).toFixed(2) + '×';
        rows.push(m.error ? `| ${backend} | ${weights} | ${v} | ${m.error} | | | | |`
          : `| ${backend} | ${weights} | ${v} | ${(w / 1e9).toFixed(2)} GB | ${x(m.rss_ready)} / ${x(m.hwm_ready)} | ${x(m.rss_trace)} / ${x(m.hwm_trace)} | ${m.wasm_heap ? x(m.wasm_heap) : '–'} | ${(m.ready_ms / 1000).toFixed(1)} s (session ${(m.session_ms / 1000).toFixed(1)} s) | ${(m.trace_ms / 1000).toFixed(1)} s |`);
      }
    }
  } finally {
    if (!args.includes('--keep')) rmSync(dir, { recursive: true, force: true });
  }
  console.log(`${shape.name}: RSS / peak RSS over the weight bytes`);
  console.log('| backend | weights | session options | weights | after load (RSS / peak) | after trace (RSS / peak) | WASM heap | ready | first trace |');
  console.log('|---|---|---|---|---|---|---|---|---|');
  for (const r of rows) console.log(r);
}
main();
