/**
 * `tsx bench/memory.ts [shape] [--backends node,wasm] [--weights stored,f32] [--variants default,…] [--readouts stream,session] [--keep]`
 *
 * Peak memory over the weight bytes, per onnxruntime session option that could lower it, on a
 * random-weight model of a bench:scale shape (default gpt2-small), each variant in a fresh
 * process (bench/memory-child.ts): the defaults; pre-packing off (onnxruntime keeps a packed
 * copy of every constant matmul weight); the CPU memory arena off (activations are freed instead
 * of kept in the arena); initializers from the device allocator instead of the arena. Each with
 * DLA's readout products streamed from the weight bytes or in their own session (`--readouts`;
 * default the engine's choice, readout/choose.ts). Prints RSS and peak RSS (VmHWM)
 * after the load and after one `trace`, each over the weight bytes, and the times (the first
 * trace, the time inside weightProducts during it, a second trace and its weightProducts, a forward).
 *
 * RSS counts a file page once per mapping, so a weight file mapped twice in one process (the
 * forward's session and a second session over the same file on onnxruntime-node) is counted
 * twice. Beside VmHWM the parent samples the child's PSS (/proc/PID/smaps_rollup, every 50 ms):
 * PSS counts each physical page once, shared pages split among the mappings that share them, so
 * its peak is the physical memory the process held (to the sampling: a peak shorter than 50 ms
 * can be missed). `pss@trace` is its peak up to the end of the first trace.
 */
import { spawn } from 'node:child_process';
import { existsSync, readFileSync, rmSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import * as path from 'node:path';
import { mdTable, startResults } from './results';
import { SHAPES, generate } from './scale';
import { useScratchCacheDir } from '../tests/helpers/scratch-cache';

const VARIANTS: Record<string, Record<string, unknown>> = {
  default: {},
  'no prepacking': { extra: { session: { disable_prepacking: '1' } } },
  'no CPU arena': { enableCpuMemArena: false },
  'initializers off the arena': { extra: { session: { use_device_allocator_for_initializers: '1' } } },
  'no prepacking, no arena': {
    enableCpuMemArena: false,
    extra: { session: { disable_prepacking: '1', use_device_allocator_for_initializers: '1' } },
  },
};

/** kB fields of /proc/PID/smaps_rollup, in bytes (undefined once the process is gone) */
function rollup(pid: number): Record<string, number> | undefined {
  try {
    const out: Record<string, number> = {};
    for (const m of readFileSync(`/proc/${pid}/smaps_rollup`, 'utf8').matchAll(/^(\w+):\s+(\d+) kB/gm))
      out[m[1]] = Number(m[2]) * 1024;
    return out;
  } catch {
    return undefined;
  }
}

/** one child run: its last JSON line, with the sampled peaks of PSS (to the first trace's end, and overall) and of RSS */
function measure(args: string[]): Promise<Record<string, any>> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '',
      stderr = '',
      pss = 0,
      rss = 0,
      pssTrace = 0;
    const sample = () => {
      const r = rollup(child.pid!);
      if (r) {
        pss = Math.max(pss, r.Pss ?? 0);
        rss = Math.max(rss, r.Rss ?? 0);
      }
    };
    const timer = setInterval(sample, 50);
    child.stdout.on('data', (d) => {
      stdout += d;
      // the child marks the end of its first trace
      if (!pssTrace && stdout.includes('"mark":"trace"')) {
        sample();
        pssTrace = pss;
      }
    });
    child.stderr.on('data', (d) => {
      stderr += d;
    });
    child.on('close', (code) => {
      clearInterval(timer);
      const line = stdout
        .trim()
        .split('\n')
        .filter((l) => l.startsWith('{') && !l.includes('"mark"'))
        .pop();
      const m = line ? JSON.parse(line) : { error: `exit ${code}: ${stderr.trim().split('\n').slice(-2).join(' | ')}` };
      resolve({ ...m, pss_trace: pssTrace, pss_peak: pss, rss_sampled_peak: rss });
    });
  });
}

async function main() {
  if (!process.env.LOUPE_CACHE_DIR) process.on('exit', useScratchCacheDir());
  const args = process.argv.slice(2);
  const opt = (k: string, d: string) => {
    const i = args.indexOf(`--${k}`);
    return i >= 0 ? args[i + 1] : d;
  };
  const name =
    args.find((a, i) => !a.startsWith('--') && !(i > 0 && args[i - 1].startsWith('--') && args[i - 1] !== '--keep')) ??
    'gpt2-small';
  const shape = SHAPES.find((s) => s.name === name);
  if (!shape) throw new Error(`unknown shape ${name}`);
  const only = opt('variants', '');
  const readouts = opt('readouts', '').split(',');
  const dir = path.join(tmpdir(), 'loupe-memory', shape.name);
  if (!existsSync(path.join(dir, 'model.safetensors'))) generate(shape, dir);
  const raw: Record<string, unknown>[] = [];
  const record = startResults('memory', `Memory by session options and readout, ${shape.name} shape (bench/memory.ts)`);
  const rows: string[][] = [];
  try {
    for (const backend of opt('backends', 'node,wasm').split(','))
      for (const weights of opt('weights', 'stored,f32').split(',')) {
        for (const [v, o] of Object.entries(VARIANTS))
          for (const readout of readouts) {
            if (only && !only.split(',').includes(v)) continue;
            const m = await measure([
              '--import',
              'tsx',
              path.join(import.meta.dirname, 'memory-child.ts'),
              dir,
              backend,
              weights,
              JSON.stringify(o),
              readout,
            ]);
            console.error(JSON.stringify({ backend, weights, variant: v, ...m }));
            const w = m.weight_bytes as number;
            const x = (b: number) => (b / w).toFixed(2) + '×';
            const sec = (ms: number) => (ms / 1000).toFixed(2) + ' s';
            rows.push(
              m.error
                ? [backend, weights, v, readout || 'auto', m.error, '', '', '', '', '', '', '', '']
                : [
                    backend,
                    weights,
                    v,
                    m.readout,
                    `${(w / 1e9).toFixed(2)} GB`,
                    `${x(m.rss_ready)} / ${x(m.hwm_ready)}`,
                    `${x(m.rss_trace)} / ${x(m.hwm_trace)}`,
                    `${x(m.pss_trace)} / ${x(m.pss_peak)}`,
                    m.wasm_heap ? x(m.wasm_heap) : '–',
                    `${(m.ready_ms / 1000).toFixed(1)} s (session ${(m.session_ms / 1000).toFixed(1)} s)`,
                    `${sec(m.trace_ms)} (readout ${sec(m.wp_ms)})`,
                    `${sec(m.trace2_ms)} (readout ${sec(m.wp2_ms)})`,
                    sec(m.forward_ms),
                  ],
            );
            raw.push({ backend, weights, variant: v, ...m });
          }
      }
  } finally {
    if (!args.includes('--keep')) rmSync(dir, { recursive: true, force: true });
  }
  const note = `${shape.name}: RSS / peak RSS (VmHWM), and sampled peak PSS, over the weight bytes`;
  const head = [
    'backend',
    'weights',
    'session options',
    'readout',
    'weights',
    'after load (RSS / peak)',
    'after trace (RSS / peak)',
    'peak PSS (to trace / all)',
    'WASM heap',
    'ready',
    'first trace',
    'second trace',
    'forward',
  ];
  console.log(`${note}\n`);
  console.log(mdTable({ head, rows }));
  record.save([{ head, rows }], [note], raw);
}
void main();
