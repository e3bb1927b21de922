/**
 * edge_attribution end to end on a gpt2-shaped random model whose tokenizer has single-token
 * names, with the IOI-style generator: the CLI (--generate, and --dataset FILE of the same pairs
 * as JSON Lines), the operation called directly and headless MCP (as a job: progress per pair,
 * then the document; and a cancelled job) give the same document within 1e-4. The page's run is
 * e2e/edges.spec.ts.
 */
import { execFile } from 'node:child_process';
import { writeFileSync, realpathSync } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { Client } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import { loadModelNode } from '../src/node/load';
import type { LoadedModel } from '../src/engine/api';
import { getOperation, type OperationDocument } from '../src/ops/index';
import { resolveDataset } from '../src/ops/lib/dataset';
import { makeRandomModel, type RandomModel } from './reference';

type Doc = OperationDocument<'edge_attribution'>;
const ROOT = path.resolve(__dirname, '..');
const BIN = path.join(ROOT, 'bin', 'loupe.mjs');
export const IOI_NAMES = ['Mary', 'John', 'Alice', 'Bob', 'Tom', 'James', 'Anna', 'David'];
const GEN = { task: 'ioi', n: 6, seed: 4, length: 10 };
const INPUT = { generate: GEN, method: 'eap_ig_inputs', ig_steps: 3, evaluate: true };

let rm: RandomModel;
let dir: string;
let model: LoadedModel;
let direct: Doc;

beforeAll(async () => {
  rm = makeRandomModel('gpt2', { seed: 9, dModel: 32, nLayers: 2, nHeads: 4, vocabSize: 420, words: IOI_NAMES });
  dir = realpathSync(rm.dir);
  model = await loadModelNode(dir, { backend: 'node' });
  direct = JSON.parse(JSON.stringify(await getOperation('edge_attribution')!.run(model, INPUT)));
}, 120_000);
afterAll(async () => {
  await model?.dispose();
  rm?.cleanup();
});

function close(a: unknown, b: unknown, tol: number, at = '$', skip = new Set<string>()): void {
  if (typeof a === 'number' && typeof b === 'number') {
    expect(Math.abs(a - b), at).toBeLessThanOrEqual(tol);
    return;
  }
  if (Array.isArray(a) && Array.isArray(b)) {
    expect(a.length, at).toBe(b.length);
    a.forEach((x, i) => close(x, b[i], tol, `${at}[${i}]`, skip));
    return;
  }
  if (a && b && typeof a === 'object' && typeof b === 'object') {
    const keys = Object.keys(a).filter((k) => !skip.has(k));
    expect(keys.sort(), at).toEqual(
      Object.keys(b)
        .filter((k) => !skip.has(k))
        .sort(),
    );
    for (const k of keys) close((a as any)[k], (b as any)[k], tol, `${at}.${k}`, skip);
    return;
  }
  expect(a, at).toEqual(b);
}

const cli = async (args: string[]) =>
  JSON.parse(
    (
      await promisify(execFile)(process.execPath, [BIN, 'edge_attribution', dir, ...args, '--json'], {
        cwd: ROOT,
        maxBuffer: 64 << 20,
      })
    ).stdout,
  );

describe('IOI edge attribution: CLI, operation and MCP', () => {
  it('the generated IOI dataset runs: names are single tokens, pairs of equal length, scores and a curve', () => {
    expect(direct.dataset.source).toBe('generated');
    expect(direct.dataset.n_examples).toBeGreaterThan(3);
    expect(direct.evaluation!.signed.curve).toHaveLength(10);
    expect(direct.edges.some((e) => Math.abs(e.score) > 1e-6)).toBe(true);
  });

  it('the CLI with --generate gives the same document within 1e-4', async () => {
    close(
      await cli(['--generate', JSON.stringify(GEN), '--method', 'eap_ig_inputs', '--ig-steps', '3', '--evaluate']),
      direct,
      1e-4,
    );
  }, 120_000);

  it('the CLI with --dataset FILE (the same pairs as JSON Lines): same pairs, same SHA-256, same scores', async () => {
    const ds = await resolveDataset(model, {
      generate: { ...GEN, task: 'ioi' },
      dataset_format: 'auto',
      prepend_bos: true,
    });
    const file = path.join(rm.dir, 'ioi.jsonl');
    writeFileSync(file, ds.pairs.map((p) => JSON.stringify(p)).join('\n') + '\n');
    const viaFile = await cli(['--dataset', file, '--method', 'eap_ig_inputs', '--ig-steps', '3', '--evaluate']);
    expect(viaFile.dataset).toMatchObject({ source: 'text', format: 'jsonl', sha256: direct.dataset.sha256 });
    close(viaFile, direct, 1e-4, '$', new Set(['source', 'format', 'generator']));
  }, 120_000);

  describe('headless MCP', () => {
    let client: Client;
    beforeAll(async () => {
      const transport = new StdioClientTransport({
        command: process.execPath,
        args: [BIN, 'mcp', '--headless', '--allow-local', path.dirname(dir)],
        cwd: ROOT,
        env: process.env as Record<string, string>,
        stderr: 'pipe',
      });
      client = new Client({ name: 'edges-test', version: '1' });
      await client.connect(transport);
      const loaded = await client.callTool({ name: 'load_model', arguments: { model: dir } });
      expect(loaded.isError, JSON.stringify(loaded.content)).toBeFalsy();
    }, 60_000);
    afterAll(async () => {
      await client?.close();
    });
    const call = async (name: string, args: Record<string, unknown>) =>
      (await client.callTool({ name, arguments: args })).structuredContent as Record<string, any>;

    it('as a job: progress per pair, then the same document within 1e-4', async () => {
      const job = await call('edge_attribution', { ...INPUT, as_job: true });
      expect(job.status).toBe('running');
      const stages = new Set<string>();
      for (let i = 0; i < 600; i++) {
        const s = await call('job_status', { job_id: job.job_id });
        if (s.progress) stages.add(s.progress.stage);
        if (s.status !== 'running') break;
        await new Promise((r) => setTimeout(r, 25));
      }
      const res = await client.callTool({ name: 'job_result', arguments: { job_id: job.job_id, wait_s: 50 } });
      expect(res.isError, JSON.stringify(res.content).slice(0, 400)).toBeFalsy();
      const text = (res.content as { type: string; text?: string }[]).find((c) => c.type === 'text')?.text;
      close(res.structuredContent ?? JSON.parse(text!), direct, 1e-4);
      expect([...stages].some((s) => /attributing|evaluating|runs/.test(s))).toBe(true);
    }, 120_000);

    it('a cancelled job ends CANCELLED', async () => {
      const job = await call('edge_attribution', { ...INPUT, generate: { ...GEN, n: 200 }, as_job: true });
      await new Promise((r) => setTimeout(r, 300));
      await call('job_cancel', { job_id: job.job_id });
      let s: Record<string, any> = {};
      for (let i = 0; i < 400; i++) {
        s = await call('job_status', { job_id: job.job_id });
        if (s.status !== 'running') break;
        await new Promise((r) => setTimeout(r, 25));
      }
      expect(s.status).toBe('cancelled');
      // the engine is free again: a call after it answers
      const after = await client.callTool({
        name: 'edge_attribution',
        arguments: { generate: { ...GEN, n: 1 }, method: 'eap' },
      });
      expect(after.isError).toBeFalsy();
    }, 120_000);
  });
});
