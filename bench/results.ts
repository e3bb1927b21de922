/**
 * A bench script's results as tables, kept in bench/results/<name>.json beside the engine bench's
 * latest.json, with when, where and at what load they were measured. docs/BENCHMARKS.md is
 * written from these files (bench/benchmarks-doc.ts, run by `save` in a child process: the
 * generator reads every bench's types, which import the scripts that save), never by hand.
 */
import { spawnSync } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { ROOT, packageVersion } from './lib';

export const RESULTS_DIR = path.join(ROOT, 'bench', 'results');

export interface ResultTable {
  head: string[];
  rows: string[][];
}

export interface MachineInfo {
  cores: number;
  cpu: string;
  total_memory_bytes: number;
  platform: string;
  node: string;
  onnxruntime_node: string;
  onnxruntime_web: string;
}

/** bench/results/<name>.json of a script other than the engine bench */
export interface TablesResults {
  schema: 'loupe-bench-tables/1';
  /** what was measured, one line */
  title: string;
  /** the command that measured it */
  command: string;
  /** ISO time the run started and ended */
  date: string;
  finished: string;
  machine: MachineInfo;
  load_average_start: number[];
  load_average_end: number[];
  tables: ResultTable[];
  /** lines printed with the tables (what a column means, a ratio the script computed) */
  notes: string[];
  /** the raw numbers the tables were made from */
  raw?: unknown;
}

export function machineInfo(): MachineInfo {
  return {
    cores: os.cpus().length,
    cpu: os.cpus()[0]?.model ?? 'unknown',
    total_memory_bytes: os.totalmem(),
    platform: `${os.platform()} ${os.release()} ${os.arch()}`,
    node: process.version,
    onnxruntime_node: packageVersion('onnxruntime-node'),
    onnxruntime_web: packageVersion('onnxruntime-web'),
  };
}

/**
 * Start a run's record: call at the start, then `save` at the end. The file is named by the
 * script and its arguments (bench/results/scale-qwen2.5-0.5b_--weights_q8.json), so a run
 * replaces the previous run of the same command only.
 */
export function startResults(script: string, title: string) {
  const date = new Date().toISOString();
  const load_average_start = os.loadavg();
  const args = process.argv.slice(2);
  const command = `tsx bench/${script}.ts ${args.join(' ')}`.trim();
  const name = `${script}${args.length ? '-' + args.join('_') : ''}`.replace(/[^A-Za-z0-9._-]+/g, '_').slice(0, 120);
  return {
    /** writes bench/results/<name>.json and rewrites docs/BENCHMARKS.md */
    save(tables: ResultTable[], notes: string[] = [], raw?: unknown): string {
      const doc: TablesResults = {
        schema: 'loupe-bench-tables/1',
        title,
        command,
        date,
        finished: new Date().toISOString(),
        machine: machineInfo(),
        load_average_start,
        load_average_end: os.loadavg(),
        tables,
        notes,
        ...(raw === undefined ? {} : { raw }),
      };
      mkdirSync(RESULTS_DIR, { recursive: true });
      const file = path.join(RESULTS_DIR, `${name}.json`);
      writeFileSync(file, JSON.stringify(doc, null, 2) + '\n');
      spawnSync(process.execPath, ['--import', 'tsx', path.join(ROOT, 'bench', 'benchmarks-doc.ts')], {
        stdio: 'inherit',
      });
      return file;
    },
  };
}

/** a table as markdown */
export function mdTable(t: ResultTable): string {
  const line = (cells: string[]) => `| ${cells.join(' | ')} |`;
  return [line(t.head), line(t.head.map(() => '---')), ...t.rows.map(line)].join('\n') + '\n';
}
