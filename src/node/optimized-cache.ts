/**
 * onnxruntime's optimized model, kept between runs (a fast second start). With weights widened to
 * float32 from a 16-bit file (`--weights f32` or auto's choice), onnxruntime constant-folds every
 * widening at session creation, most of a start, redone by every `loupe` command. The first start saves the optimized graph with its float32 weights
 * in an external file (`optimizedModelFilePath`); a second start with the same graph, the same
 * weight files, the same onnxruntime and the same options loads that with optimization off.
 * Pre-packing is not saved by onnxruntime; it still runs at each start.
 *
 * An entry costs the float32 weights on disk (twice the 16-bit files), so only that case is
 * cached: 16-bit weights kept 16-bit are read as they are and have little to fold. Entries live
 * under $LOUPE_CACHE_DIR/optimized/<key>/ (model.onnx + weights.bin); LOUPE_OPTIMIZED_CACHE=0
 * turns the cache off. The key hashes the graph bytes (tensor names, offsets, dtypes, precision,
 * Loupe's graph as built), each weight file's path, size, mtime and inode, the onnxruntime
 * version, the session options and the CPU, so a changed file or a new version never reads a
 * stale entry; a broken entry is deleted and the session built afresh. Each save drops entries
 * whose weight files are gone and keeps the MAX_ENTRIES used last.
 */
import { createHash } from 'node:crypto';
import {
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  statSync,
  utimesSync,
  writeFileSync,
} from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import type { BuiltGraph } from '../engine/graph/build-model';
import type { WeightSet } from '../engine/safetensors-types';
import { defaultCacheDir } from './dir-cache';
import { isRegularFile } from './file-range';
import { packageVersion } from './package';

export const OPTIMIZED_WEIGHTS_FILE = 'weights.bin';
/** entries kept (the ones used last); each is a model's float32 weights */
export const MAX_ENTRIES = 3;

export function optimizedCacheRoot(): string {
  return path.join(defaultCacheDir(), 'optimized');
}

/** Whether this graph is worth an entry: float32 weights widened from a 16-bit file, all on disk. */
export function worthCaching(graph: BuiltGraph, weights: WeightSet): boolean {
  if (process.env.LOUPE_OPTIMIZED_CACHE === '0' || graph.precision !== 'f32') return false;
  const used = new Set<string>();
  let narrow = false;
  for (const e of weights.tensors.values()) {
    used.add(e.file);
    if (e.dtype === 'F16' || e.dtype === 'BF16') narrow = true;
  }
  return narrow && [...used].every((f) => weights.paths.has(f));
}

/** The entry's key: everything that decides what onnxruntime's optimized model is. */
export function optimizedKey(
  graph: BuiltGraph,
  weights: WeightSet,
  options: Record<string, unknown>,
  ortVersions: unknown,
): string {
  const h = createHash('sha256');
  h.update(graph.bytes);
  const files = [...new Set([...weights.tensors.values()].map((e) => e.file))].sort();
  for (const f of files) {
    const p = path.resolve(weights.paths.get(f)!);
    const s = statSync(p);
    h.update(JSON.stringify([f, p, s.size, s.mtimeMs, s.ino, s.dev]));
  }
  h.update(
    JSON.stringify({
      options,
      ortVersions,
      loupe: packageVersion(),
      cpu: os.cpus()[0]?.model ?? '',
      arch: process.arch,
      platform: process.platform,
    }),
  );
  return h.digest('hex').slice(0, 32);
}

/** the optimized model of a complete entry, or undefined */
export function cachedModelPath(key: string): string | undefined {
  const dir = path.join(optimizedCacheRoot(), key);
  const model = path.join(dir, 'model.onnx');
  try {
    // an entry's files that are not regular files inside the cache (a FIFO would hang onnxruntime): a broken entry
    const root = optimizedCacheRoot();
    if (!isRegularFile(model, root) || !isRegularFile(path.join(dir, OPTIMIZED_WEIGHTS_FILE), root)) return undefined;
  } catch {
    dropEntry(key);
    return undefined;
  }
  try {
    const now = new Date();
    utimesSync(dir, now, now);
  } catch {
    /* used-last order only */
  }
  return model;
}

/** Drop entries whose weight files are gone, then all but the MAX_ENTRIES used last. */
export function pruneEntries(root = optimizedCacheRoot()): void {
  let names: string[];
  try {
    names = readdirSync(root).filter((n) => !n.includes('.partial-'));
  } catch {
    return;
  }
  const live: { dir: string; used: number }[] = [];
  for (const n of names) {
    const dir = path.join(root, n);
    try {
      const record = path.join(dir, 'sources.json');
      if (!isRegularFile(record, root)) throw new Error('no record');
      const sources = JSON.parse(readFileSync(record, 'utf8')) as string[];
      if (sources.every((p) => existsSync(p))) {
        live.push({ dir, used: statSync(dir).mtimeMs });
        continue;
      }
    } catch {
      /* no record: not an entry of ours */
    }
    rmSync(dir, { recursive: true, force: true });
  }
  live.sort((a, b) => b.used - a.used);
  for (const e of live.slice(MAX_ENTRIES)) rmSync(e.dir, { recursive: true, force: true });
}

export function dropEntry(key: string): void {
  rmSync(path.join(optimizedCacheRoot(), key), { recursive: true, force: true });
}

/**
 * Where a first start writes the optimized model (a temporary folder) and the session options
 * that make onnxruntime write it; `commit` makes it the entry once the session exists (another
 * process that got there first wins), `abort` throws it away.
 */
export function saveTarget(
  key: string,
  sources: string[],
): { options: Record<string, unknown>; session: Record<string, string>; commit(): void; abort(): void } {
  const root = optimizedCacheRoot();
  const tmp = path.join(root, `${key}.partial-${process.pid}`);
  rmSync(tmp, { recursive: true, force: true });
  mkdirSync(tmp, { recursive: true });
  writeFileSync(path.join(tmp, 'sources.json'), JSON.stringify(sources.map((p) => path.resolve(p))));
  return {
    // logSeverityLevel 3: onnxruntime warns that a model optimized at this level is for this machine only (the key says so)
    options: { optimizedModelFilePath: path.join(tmp, 'model.onnx'), logSeverityLevel: 3 },
    session: {
      optimized_model_external_initializers_file_name: OPTIMIZED_WEIGHTS_FILE,
      optimized_model_external_initializers_min_size_in_bytes: '1024',
    },
    commit() {
      try {
        if (!existsSync(path.join(tmp, 'model.onnx')) || !existsSync(path.join(tmp, OPTIMIZED_WEIGHTS_FILE)))
          throw new Error('incomplete');
        renameSync(tmp, path.join(root, key));
      } catch {
        rmSync(tmp, { recursive: true, force: true });
      }
      pruneEntries(root);
    },
    abort() {
      rmSync(tmp, { recursive: true, force: true });
    },
  };
}
