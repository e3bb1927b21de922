/**
 * `loupe mcp --headless` driven by the SDK's Client over stdio: the same tools run by the engine
 * in the companion's process. Its documents must equal the CLI's `--json` and a direct call of
 * the operation; progress must arrive and increase; cancelling a call or a job must stop the run
 * (the companion logs when the engine is actually free again); jobs and handles must work.
 */
import { execFile } from 'node:child_process';
import path from 'node:path';
import { promisify } from 'node:util';
import type { Client } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { LoadedModel } from '../src/engine/api';
import { loadModelNode } from '../src/node/load';
import { operations } from '../src/ops/index';
import { mintHandle, parseHandle } from '../src/ops/lib/handles';
import { errorOf, poll, sleep, until } from './bridge-fake-page';
import { OrderedClient } from './helpers/mcp-client';

const ROOT = path.resolve(__dirname, '..');
const BIN = path.join(ROOT, 'bin', 'loupe.mjs');
const PROMPT = 'Once upon a time';

let client: Client;
let stderr = '';
let model: LoadedModel;

beforeAll(async () => {
  const transport = new StdioClientTransport({
    command: process.execPath,
    args: [BIN, 'mcp', '--headless'],
    cwd: ROOT,
    stderr: 'pipe',
  });
  transport.stderr?.on('data', (d) => (stderr += d.toString()));
  client = new OrderedClient({ name: 'headless-test', version: '1' });
  await client.connect(transport);
  model = await loadModelNode('default', { backend: 'node' });
});
afterAll(async () => {
  await client?.close();
  await model?.dispose();
});

async function call(name: string, args: Record<string, unknown>) {
  return client.callTool({ name, arguments: args });
}

describe('loupe mcp --headless', () => {
  it('trace returns the same document as the CLI --json and as the operation called directly', async () => {
    const r = await call('trace', { prompt: PROMPT, top_k: 5 });
    expect(r.isError).toBeFalsy();
    const { stdout } = await promisify(execFile)(
      process.execPath,
      [BIN, 'trace', 'default', PROMPT, '--top-k', '5', '--json'],
      { cwd: ROOT },
    );
    expect(r.structuredContent).toEqual(JSON.parse(stdout));
    expect(r.structuredContent).toEqual(await operations.trace.run(model, { prompt: PROMPT, top_k: 5 }, {}));
    // the schema-checked document, its link (bundled model: re-runnable in any workbench) and resource
    const meta = r._meta as Record<string, string>;
    expect(meta['loupe/link']).toMatch(/^http:\/\/127\.0\.0\.1:5178\/#s=/);
    const doc = await client.readResource({ uri: meta['loupe/resource'] });
    expect(JSON.parse((doc.contents[0] as { text: string }).text)).toEqual(r.structuredContent);
  });

  it('sends progress notifications that increase', async () => {
    // a model loaded on first use reports its files' bytes as earlier stages: load it first, so this run's
    // progress is generation's alone (also when this test runs by itself)
    expect((await call('load_model', { model: 'default' })).isError).toBeFalsy();
    const seen: { progress: number; total?: number }[] = [];
    const r = await client.callTool(
      { name: 'generate', arguments: { prompt: PROMPT, max_new_tokens: 120, stop_at_eos: false } },
      { onprogress: (p) => seen.push(p) },
    );
    expect(r.isError).toBeFalsy();
    expect((r.structuredContent as { generated_token_ids: number[] }).generated_token_ids).toHaveLength(120);
    expect(seen.length).toBeGreaterThanOrEqual(2);
    for (let i = 1; i < seen.length; i++) expect(seen[i].progress).toBeGreaterThan(seen[i - 1].progress);
    expect(seen.at(-1)).toMatchObject({ progress: 120, total: 120 });
  });

  it('client cancellation stops the run in the engine', async () => {
    const ctl = new AbortController();
    let progressed = 0;
    const before = stderr.length;
    const pending = client
      .callTool(
        { name: 'generate', arguments: { prompt: PROMPT, max_new_tokens: 480, stop_at_eos: false } },
        {
          signal: ctl.signal,
          onprogress: () => void progressed++,
        },
      )
      .catch((e) => e);
    await until(() => progressed >= 2, 20_000, 'progress');
    ctl.abort('test cancels');
    expect(await pending).toBeInstanceOf(Error);
    const line = await until(
      () => /generate: stopped (\d+) ms after cancellation/.exec(stderr.slice(before)),
      3000,
      'the engine to stop',
    );
    expect(Number(line[1])).toBeLessThan(1000);
    // the engine is free: a quick call answers at once, well before the cancelled run would have ended
    const r = await call('trace', { prompt: 'Hi' });
    expect(r.isError).toBeFalsy();
  });

  it('jobs: as_job returns at once; job_status and job_result give the same document as a direct call; job_cancel stops one', async () => {
    const started = await call('generate', { prompt: PROMPT, max_new_tokens: 60, stop_at_eos: false, as_job: true });
    const job = started.structuredContent as { job_id: string; status: string; expires_at: string };
    expect(job.status).toBe('running');
    const done = await poll(
      async () => {
        const s = (await call('job_status', { job_id: job.job_id })).structuredContent as { status: string };
        return s.status !== 'running' ? s : undefined;
      },
      20_000,
      'the job to finish',
      100,
    );
    expect(done.status).toBe('succeeded');
    const result = await call('job_result', { job_id: job.job_id });
    expect(result.structuredContent).toEqual(
      await operations.generate.run(model, { prompt: PROMPT, max_new_tokens: 60, stop_at_eos: false }, {}),
    );

    const before = stderr.length;
    const long = (await call('generate', { prompt: PROMPT, max_new_tokens: 480, stop_at_eos: false, as_job: true }))
      .structuredContent as { job_id: string };
    await poll(
      async () =>
        ((await call('job_status', { job_id: long.job_id })).structuredContent as { progress: unknown }).progress,
      20_000,
      'job progress',
      50,
    );
    const c = (await call('job_cancel', { job_id: long.job_id })).structuredContent as { status: string };
    expect(['running', 'cancelled']).toContain(c.status);
    await until(
      () => /generate: stopped \d+ ms after cancellation/.test(stderr.slice(before)),
      3000,
      'the job to stop',
    );
    const s = (await call('job_status', { job_id: long.job_id })).structuredContent as { status: string };
    expect(s.status).toBe('cancelled');
    expect(errorOf(await call('job_result', { job_id: long.job_id })).code).toBe('CANCELLED');
  });

  it('load_model and list_models', async () => {
    const r = await call('load_model', { model: 'default' });
    expect(r.structuredContent).toMatchObject({
      loaded: true,
      model: { id: 'stories260K', backend: 'node', n_layers: 5 },
    });
    const l = await call('list_models', {});
    expect((l.structuredContent as { models: { id: string; loaded?: boolean }[] }).models[0]).toMatchObject({
      id: 'default',
      source: 'bundled',
      loaded: true,
    });
    // webgpu: onnxruntime-node's WebGPU provider (SwiftShader here and in CI; tests/cli-webgpu.test.ts), then back to node
    const gpu = await call('load_model', { model: 'default', backend: 'webgpu' });
    expect(gpu.structuredContent).toMatchObject({ loaded: true, model: { id: 'stories260K', backend: 'webgpu' } });
    const back = await call('load_model', { model: 'default', backend: 'node' });
    expect(back.structuredContent).toMatchObject({ loaded: true, model: { backend: 'node' } });
  });

  it('load_model with weights q8: the model and every document say q8; a bad precision is refused', async () => {
    const r = await call('load_model', { model: 'default', weights: 'q8' });
    expect(r.structuredContent).toMatchObject({ loaded: true, model: { id: 'stories260K', weights: 'q8' } });
    const t = await call('trace', { prompt: PROMPT, top_k: 3 });
    expect((t.structuredContent as { model: { weights: string } }).model.weights).toBe('q8');
    expect((await call('load_model', { model: 'default', weights: 'int8' })).isError).toBe(true);
    const back = await call('load_model', { model: 'default' });
    expect(back.structuredContent).toMatchObject({ loaded: true, model: { weights: 'f32' } });
  });

  it('handles carry this process instance; one from another instance is HANDLE_EXPIRED', async () => {
    const cap = await call('capture', {
      prompts: [
        { text: 'I love it', label: 1 },
        { text: 'I hate it', label: 0 },
      ],
    });
    expect(cap.isError).toBeFalsy();
    const handle = (cap.structuredContent as { handle: string }).handle;
    const instance = parseHandle(handle)?.instance;
    expect(instance).toMatch(/^[0-9a-f]{12}$/);
    const status = (await call('loupe_status', {})).structuredContent as { instance_id: string; mode: string };
    expect(status).toMatchObject({ mode: 'headless', instance_id: instance });
    const other = mintHandle('capture', instance === '000000000000' ? '111111111111' : '000000000000');
    const stale = errorOf(await call('probe', { capture: other }));
    expect(stale.code).toBe('HANDLE_EXPIRED');
    expect(stale.message).toMatch(/made by a page \(or process\)/); // the instance check, not a store miss
    // inside a string as well (steer's "probe:<handle>")
    const steer = errorOf(
      await call('steer', {
        prompt: PROMPT,
        layer: 1,
        alpha: 4,
        direction: `probe:${mintHandle('probe', '000000000000')}`,
      }),
    );
    expect(steer.code).toBe('HANDLE_EXPIRED');
  });

  it('agent-fixable errors are isError results with a hint', async () => {
    const e = errorOf(await call('trace', { prompt: PROMPT, top_k: -1 }));
    expect(e.code).toBe('BAD_INPUT');
    expect(e.hint).toBeTruthy();
    await sleep(0);
  });
});
