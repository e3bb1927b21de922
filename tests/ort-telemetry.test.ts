/**
 * onnxruntime-node's telemetry is off in every Node entry point (issue 9, item 3). Each entry
 * point runs in a child process with a fresh HOME; the native library would write its device id
 * and event database under $HOME/.cache/Microsoft/DeveloperTools/.onnxruntime.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { Companion } from './helpers/hostile';

const ROOT = path.resolve(__dirname, '..');
const TSX = path.join(ROOT, 'node_modules', '.bin', 'tsx');

function filesUnder(dir: string): string[] {
  if (!existsSync(dir)) return [];
  return readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((d) => d.isFile())
    .map((d) => path.join(d.parentPath ?? (d as unknown as { path: string }).path, d.name));
}

/** Run argv with a fresh HOME (and no inherited ORT_DISABLE_TELEMETRY); return ORT's files there. */
function ortFilesAfter(argv: string[]): { files: string[]; status: number | null; stdout: string; stderr: string } {
  const home = mkdtempSync(path.join(os.tmpdir(), 'loupe-home-'));
  try {
    const env: NodeJS.ProcessEnv = {
      ...process.env,
      HOME: home,
      XDG_CACHE_HOME: path.join(home, '.cache'),
      LOUPE_CACHE_DIR: path.join(home, 'loupe-cache'),
    };
    delete env.ORT_DISABLE_TELEMETRY;
    const r = spawnSync(argv[0], argv.slice(1), { cwd: ROOT, env, encoding: 'utf8', timeout: 120_000, input: '' });
    return {
      files: filesUnder(path.join(home, '.cache', 'Microsoft')),
      status: r.status,
      stdout: r.stdout,
      stderr: r.stderr,
    };
  } finally {
    rmSync(home, { recursive: true, force: true });
  }
}

describe('onnxruntime-node telemetry', () => {
  it('the library loader runs a model without writing ~/.cache/Microsoft (headless MCP, serve, bench and tests load through it)', () => {
    const script = `(async () => {
const { loadModelNode } = await import(${JSON.stringify(path.join(ROOT, 'src/node/load.ts'))});
const m = await loadModelNode('default');
await m.run([1, 2, 3]);
await m.dispose();
console.log('ran');
})();`;
    const r = ortFilesAfter([TSX, '--eval', script]);
    expect(r.stdout.trim(), r.stderr).toBe('ran');
    expect(r.files).toEqual([]);
  });

  it('the CLI writes no telemetry files', () => {
    const run = ortFilesAfter([
      process.execPath,
      path.join(ROOT, 'bin/loupe.mjs'),
      'trace',
      'default',
      'Once upon a time',
      '--json',
    ]);
    expect(run.status, run.stderr).toBe(0);
    expect(JSON.parse(run.stdout).prediction ?? JSON.parse(run.stdout)).toBeTruthy();
    expect(run.files).toEqual([]);
  });

  it('a headless MCP companion that runs a tool writes no telemetry files', async () => {
    const home = mkdtempSync(path.join(os.tmpdir(), 'loupe-home-'));
    const env: NodeJS.ProcessEnv = {
      ...process.env,
      HOME: home,
      XDG_CACHE_HOME: path.join(home, '.cache'),
      LOUPE_CACHE_DIR: path.join(home, 'loupe-cache'),
    };
    delete env.ORT_DISABLE_TELEMETRY;
    const c = new Companion(['--headless'], env);
    try {
      await c.initialize();
      const r = await c.callRaw('trace', '{"prompt":"Once upon a time"}', 120_000);
      expect(
        r === 'timeout' ? r : (r.result as { structuredContent?: { operation?: string } }).structuredContent?.operation,
      ).toBe('trace');
      await c.close();
      expect(filesUnder(path.join(home, '.cache', 'Microsoft'))).toEqual([]);
    } finally {
      await c.close();
      rmSync(home, { recursive: true, force: true });
    }
  });

  it('nothing in src/, bench/ or tests/ loads onnxruntime-node except src/node/ort-node.ts', () => {
    const offenders: string[] = [];
    for (const dir of ['src', 'bench', 'tests', 'bin']) {
      for (const f of filesUnder(path.join(ROOT, dir))) {
        if (
          !/\.(ts|mts|js|mjs|cjs)$/.test(f) ||
          f.endsWith(path.join('src', 'node', 'ort-node.ts')) ||
          f === __filename
        )
          continue;
        if (!statSync(f).isFile()) continue;
        const text = readFileSync(f, 'utf8');
        if (/(require|import)\s*\(\s*['"]onnxruntime-node['"]|from\s+['"]onnxruntime-node['"]/.test(text))
          offenders.push(path.relative(ROOT, f));
      }
    }
    expect(offenders).toEqual([]);
  });
});
