/**
 * The MCP server end to end in one process: the SDK's Client ↔ (in-memory transport) ↔ our
 * server ↔ PageExecutor's hub ↔ a fake page. The operation registry here is two small test
 * operations, so that this file exercises the MCP mechanics (schemas, results, errors, progress,
 * cancellation, jobs, resources) independently of the real operations; the real ones are covered
 * by bridge-stdio and bridge-headless.
 */
import type { Client } from '@modelcontextprotocol/client';
import { InMemoryTransport } from '@modelcontextprotocol/client';
import { ProtocolError } from '@modelcontextprotocol/client';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { createMcpServer } from '../src/bridge/mcp-server';
import { ResultStore } from '../src/bridge/results';
import { PageExecutor } from '../src/bridge/page-executor';
import type { Operation } from '../src/ops/types';
import { decodeShare, parseFragment } from '../src/share/codec';
import { errorOf, FakePage, sleep, text, tmpDist, until } from './bridge-fake-page';
import { OrderedClient } from './helpers/mcp-client';

const traceOp: Operation = {
  name: 'trace',
  title: 'Trace',
  description: 'TEST trace: returns a value for a prompt. Units: none. Cost: trivial.',
  input: z.object({ prompt: z.string().min(1).describe('the prompt') }),
  output: z.object({ operation: z.literal('trace'), prompt: z.string(), value: z.number() }),
  run: async () => {
    throw new Error('runs in the page');
  },
};
const countOp: Operation = {
  name: 'count',
  title: 'Count',
  description: 'TEST long op: counts to n.',
  long: true,
  input: z.object({ n: z.number().int().min(1) }),
  output: z.object({ operation: z.literal('count'), n: z.number() }),
  run: async () => {
    throw new Error('runs in the page');
  },
};
const operations = { trace: traceOp, count: countOp };
const MODEL = {
  id: 'stories260K',
  source: 'bundled',
  n_layers: 5,
  ref: { kind: 'bundled', id: 'stories260K', revision: '' },
};

let executor: PageExecutor;
let client: Client;
let closeServer: () => Promise<void>;
const pages: FakePage[] = [];

beforeEach(async () => {
  executor = new PageExecutor({ port: 0, distDir: tmpDist(), version: 'test', noPageWaitMs: 300, log: () => {} });
  await executor.started();
  const mcp = createMcpServer({
    executor,
    operations,
    version: 'test',
    pageUrl: () => `http://127.0.0.1:${executor.port}/`,
    callDeadlineMs: 5000,
  });
  closeServer = mcp.close;
  const [a, b] = InMemoryTransport.createLinkedPair();
  await mcp.server.connect(a);
  client = new OrderedClient({ name: 'test-agent', version: '9.9' });
  await client.connect(b);
});
afterEach(async () => {
  await client.close();
  await closeServer();
  await Promise.all(pages.splice(0).map((p) => p.close()));
  await executor.close();
});

async function pair(o: { tabId?: string } = {}): Promise<FakePage> {
  const hub = executor.ownHub!;
  const p = await FakePage.connect(hub.port, { token: hub.token, model: MODEL, ...o });
  pages.push(p);
  return p;
}

describe('tools/list', () => {
  it('lists the bridge tools and one tool per operation, with no page connected', async () => {
    const { tools } = await client.listTools();
    expect(tools.map((t) => t.name)).toEqual([
      'loupe_status',
      'load_model',
      'list_models',
      'job_status',
      'job_result',
      'job_cancel',
      'compare',
      'trace',
      'count',
    ]);
    const trace = tools.find((t) => t.name === 'trace')!;
    expect(trace.description!.startsWith(traceOp.description)).toBe(true);
    expect(trace.inputSchema).toMatchObject({
      type: 'object',
      properties: { prompt: { type: 'string', description: 'the prompt' } },
      required: ['prompt'],
    });
    expect(trace.outputSchema).toMatchObject({ type: 'object', properties: { value: { type: 'number' } } });
    expect(trace.inputSchema.properties).not.toHaveProperty('as_job');
    const count = tools.find((t) => t.name === 'count')!;
    expect(count.inputSchema.properties).toHaveProperty('as_job');
    expect(count.description).toMatch(/as_job/);
    expect((count.outputSchema as unknown as { anyOf: unknown[] }).anyOf).toHaveLength(2);
  });
});

describe('tools/call', () => {
  it('loupe_status gives the pairing URL and says no page is paired', async () => {
    const r = await client.callTool({ name: 'loupe_status', arguments: {} });
    const s = r.structuredContent as Record<string, any>;
    expect(s).toMatchObject({ mode: 'page', role: 'hub', page: null });
    expect(s.pairing_url).toMatch(new RegExp(`^http://127\\.0\\.0\\.1:${executor.port}/#pair=[0-9a-f]{64}$`));
    expect(JSON.parse(text(r))).toEqual(s);
  });

  it('with no page: isError NO_PAGE with the pairing URL, after the short wait', async () => {
    const t0 = Date.now();
    const r = await client.callTool({ name: 'trace', arguments: { prompt: 'Hi' } });
    expect(Date.now() - t0).toBeGreaterThanOrEqual(290);
    const e = errorOf(r);
    expect(e.code).toBe('NO_PAGE');
    expect(e.message).toContain(executor.ownHub!.pairingUrl);
    expect(e.hint).toBeTruthy();
  });

  it('an unknown tool is a JSON-RPC error', async () => {
    const e = await client.callTool({ name: 'no_such_tool', arguments: {} }).catch((x) => x);
    expect(e).toBeInstanceOf(ProtocolError);
    expect(e.code).toBe(-32602);
  });

  it('bad arguments are an isError BAD_INPUT that never reaches the page', async () => {
    const page = await pair();
    const e = errorOf(await client.callTool({ name: 'trace', arguments: { prompt: 3 } }));
    expect(e.code).toBe('BAD_INPUT');
    expect(e.message).toMatch(/prompt/);
    expect(errorOf(await client.callTool({ name: 'trace', arguments: { prompt: 'x', as_job: true } })).code).toBe(
      'BAD_INPUT',
    );
    expect(page.calls).toHaveLength(0);
  });

  it('runs an operation in the page: structuredContent = text = the document, plus link and resource; progress increases', async () => {
    const page = await pair();
    page.onCall = async (m, p) => {
      for (let i = 1; i <= 4; i++) {
        p.progress(m.id, i, 4, 'step');
        await sleep(120);
      }
      p.result(m.id, { operation: 'trace', prompt: m.args.prompt, value: 42 });
    };
    const progress: { progress: number; total?: number; message?: string }[] = [];
    const r = await client.callTool(
      { name: 'trace', arguments: { prompt: 'Once upon' } },
      {
        onprogress: (p) => progress.push(p),
      },
    );
    const doc = { operation: 'trace', prompt: 'Once upon', value: 42 };
    expect(r.isError).toBeFalsy();
    expect(r.structuredContent).toEqual(doc);
    expect(JSON.parse(text(r))).toEqual(doc);
    expect(page.calls[0].agent).toEqual({ name: 'test-agent', version: '9.9' });

    // progress: arrived, strictly increasing, ends at the total
    expect(progress.length).toBeGreaterThanOrEqual(3);
    for (let i = 1; i < progress.length; i++) expect(progress[i].progress).toBeGreaterThan(progress[i - 1].progress);
    expect(progress.at(-1)).toMatchObject({ progress: 4, total: 4 });

    // the shareable link decodes to this operation, input and result on the hub's origin
    const link = (r._meta as Record<string, string>)['loupe/link'];
    expect(link.startsWith(`http://127.0.0.1:${executor.port}/#s=`)).toBe(true);
    const state = decodeShare(parseFragment(new URL(link).hash).get('s')!);
    expect(state).toMatchObject({
      op: 'trace',
      input: { prompt: 'Once upon' },
      result: doc,
      model: { kind: 'bundled', id: 'stories260K' },
    });
    expect((r.content as { text?: string }[]).some((c) => c.text?.includes(link))).toBe(true);

    // the document is a resource of this session, listed with its operation, model and prompt
    const uri = (r._meta as Record<string, string>)['loupe/resource'];
    expect(uri).toMatch(/^loupe:\/\/results\/[0-9a-f]{32}$/);
    expect((r.content as { type: string; uri?: string }[]).find((c) => c.type === 'resource_link')?.uri).toBe(uri);
    const listed = (await client.listResources()).resources;
    expect(listed.map((x) => x.uri)).toEqual([uri]);
    expect(listed[0]._meta).toMatchObject({
      'loupe/operation': 'trace',
      'loupe/prompt': 'Once upon',
      'loupe/link': link,
    });
    const read = await client.readResource({ uri });
    expect(JSON.parse((read.contents[0] as { text: string }).text)).toEqual(doc);
    expect((await client.listResourceTemplates()).resourceTemplates[0].uriTemplate).toBe('loupe://results/{id}');

    // a document is data the companion holds: a reload of the page does not take it away
    await pair({ tabId: page.tabId });
    expect((await client.listResources()).resources.map((x) => x.uri)).toEqual([uri]);
    // a URI this session never made is not readable
    const gone = await client.readResource({ uri: 'loupe://results/' + '0'.repeat(32) }).catch((x) => x);
    expect(gone).toBeInstanceOf(ProtocolError);
    expect(String(gone.message)).toMatch(/HANDLE_EXPIRED/);
  });

  it("a document that does not match the operation's schema is an isError, not a broken result", async () => {
    const page = await pair();
    page.onCall = (m, p) => p.result(m.id, { operation: 'trace', prompt: 'x', value: 'not a number' });
    const e = errorOf(await client.callTool({ name: 'trace', arguments: { prompt: 'x' } }));
    expect(e.code).toBe('INTERNAL');
    expect(e.message).toMatch(/does not match its schema/);
  });

  it('client cancellation cancels the call in the page', async () => {
    const page = await pair();
    const ctl = new AbortController();
    const call = client.callTool({ name: 'count', arguments: { n: 5 } }, { signal: ctl.signal }).catch((x) => x);
    const m = await page.waitCall();
    ctl.abort('user pressed stop');
    await until(() => page.cancels.includes(m.id), 1000, 'the cancel to reach the page');
    expect(await call).toBeInstanceOf(Error);
  });

  it('page reloaded mid-call: isError PAGE_GONE within a second, and the next call succeeds after re-pairing', async () => {
    const page = await pair({ tabId: 'tab-r' });
    const call = client.callTool({ name: 'count', arguments: { n: 100 } });
    await page.waitCall();
    const t0 = Date.now();
    await page.close();
    const r = await call;
    expect(Date.now() - t0).toBeLessThan(1000);
    expect(errorOf(r).code).toBe('PAGE_GONE');
    const again = await pair({ tabId: 'tab-r' });
    again.onCall = (m, p) => p.result(m.id, { operation: 'count', n: 3 });
    const ok = await client.callTool({ name: 'count', arguments: { n: 3 } });
    expect(ok.structuredContent).toEqual({ operation: 'count', n: 3 });
  });
});

async function pollStatus(jobId: string, pred: (s: Record<string, any>) => boolean): Promise<Record<string, any>> {
  for (let i = 0; i < 100; i++) {
    const s = (await client.callTool({ name: 'job_status', arguments: { job_id: jobId } })).structuredContent as Record<
      string,
      any
    >;
    if (pred(s)) return s;
    await sleep(20);
  }
  throw new Error('job_status never matched');
}

describe('jobs', () => {
  it('as_job returns a job at once; job_status shows progress; job_result returns the document', async () => {
    const page = await pair();
    const r = await client.callTool({ name: 'count', arguments: { n: 7, as_job: true } });
    const job = r.structuredContent as Record<string, any>;
    expect(job).toMatchObject({ tool: 'count', status: 'running', progress: null, error: null });
    expect(job.job_id).toMatch(/^job_[0-9a-f]{32}$/);
    expect(Date.parse(job.expires_at)).toBeGreaterThan(Date.now());
    const m = await page.waitCall();
    expect(m.args).toEqual({ n: 7 }); // as_job is the bridge's, not the operation's
    page.progress(m.id, 3, 7, 'counting');
    const st = await pollStatus(job.job_id, (x) => x.progress !== null);
    expect(st).toMatchObject({ status: 'running', progress: { done: 3, total: 7, stage: 'counting' } });
    // still running: job_result answers with the status, not an error
    const early = await client.callTool({ name: 'job_result', arguments: { job_id: job.job_id } });
    expect(early.isError).toBeFalsy();
    expect(early.structuredContent).toMatchObject({ status: 'running' });
    setTimeout(() => page.result(m.id, { operation: 'count', n: 7 }), 100);
    const done = await client.callTool({ name: 'job_result', arguments: { job_id: job.job_id, wait_s: 5 } });
    expect(done.structuredContent).toEqual({ operation: 'count', n: 7 });
    expect(
      ((await client.callTool({ name: 'job_status', arguments: { job_id: job.job_id } })).structuredContent as any)
        .status,
    ).toBe('succeeded');
  });

  it('job_cancel stops the job in the page', async () => {
    const page = await pair();
    const job = (await client.callTool({ name: 'count', arguments: { n: 1000, as_job: true } }))
      .structuredContent as Record<string, any>;
    const m = await page.waitCall();
    const c = await client.callTool({ name: 'job_cancel', arguments: { job_id: job.job_id } });
    expect(c.isError).toBeFalsy();
    await until(() => page.cancels.includes(m.id), 1000, 'the cancel to reach the page');
    const s = await pollStatus(job.job_id, (x) => x.status !== 'running');
    expect(s.status).toBe('cancelled');
    expect(errorOf(await client.callTool({ name: 'job_result', arguments: { job_id: job.job_id } })).code).toBe(
      'CANCELLED',
    );
  });

  it('an unknown job id is HANDLE_EXPIRED', async () => {
    expect(
      errorOf(await client.callTool({ name: 'job_status', arguments: { job_id: 'job_' + '0'.repeat(32) } })).code,
    ).toBe('HANDLE_EXPIRED');
  });
});

describe('results as resources', () => {
  it('compare takes two result URIs; a URI of no result of this session is HANDLE_EXPIRED', async () => {
    const page = await pair();
    page.onCall = (m, p) =>
      p.result(m.id, { operation: 'trace', prompt: m.args.prompt, value: String(m.args.prompt).length });
    const a = await client.callTool({ name: 'trace', arguments: { prompt: 'abcd' } });
    const b = await client.callTool({ name: 'trace', arguments: { prompt: 'ab' } });
    const ua = (a._meta as Record<string, string>)['loupe/resource'];
    const ub = (b._meta as Record<string, string>)['loupe/resource'];
    const c = await client.callTool({ name: 'compare', arguments: { a: ua, b: ub } });
    expect(c.isError).toBeFalsy();
    expect(c.structuredContent).toMatchObject({
      a: { uri: ua, operation: 'trace', prompt: 'abcd' },
      b: { uri: ub, operation: 'trace', prompt: 'ab' },
      numbers: { compared: 1, max_abs_diff: 2, match: false },
    });
    expect((c.structuredContent as { numbers: { first_differences: string[] } }).numbers.first_differences).toEqual([
      'prompt',
      'value',
    ]);
    const bad = errorOf(await client.callTool({ name: 'compare', arguments: { a: ua, b: 'loupe://results/nope' } }));
    expect(bad.code).toBe('HANDLE_EXPIRED');
  });

  it('a store keeps its latest results within its count and bytes, oldest evicted first', () => {
    const byCount = new ResultStore(3, 1e9);
    const uris = [1, 2, 3, 4, 5].map((i) => byCount.add('trace', { operation: 'trace', i }).uri);
    expect(byCount.list().map((r) => r.uri)).toEqual(uris.slice(2));
    expect(() => byCount.get(uris[0])).toThrow(/HANDLE_EXPIRED|not a result/);
    const bySize = new ResultStore(100, 2500);
    const big = (i: number) => ({ operation: 'trace', i, pad: 'x'.repeat(1000) });
    const kept = [0, 1, 2, 3].map((i) => bySize.add('trace', big(i)).uri);
    expect(bySize.list().map((r) => r.uri)).toEqual(kept.slice(2)); // two of ~1 KB fit in 2.5 KB
    const huge = bySize.add('trace', { pad: 'y'.repeat(10_000) }); // one over the budget stays, alone
    expect(bySize.list().map((r) => r.uri)).toEqual([huge.uri]);
  });
});
