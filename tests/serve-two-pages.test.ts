/**
 * `loupe serve` with two pages (issue 42, item 3): the engine holds one model; when B's load
 * replaces the one A loaded, A is told at once (a 'model_replaced' notice naming B's model) and
 * A's runs are refused with MODEL_REPLACED until A loads again (then B is told). A connection
 * that never loaded (`loupe mcp --engine`) runs on whatever is loaded. The engine is a stub.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import * as Comlink from 'comlink';
import { startEngineServer, type EngineServer } from '../src/serve/server';
import { connectEngine, type EngineConnection } from '../src/serve/client';
import type { EngineWorkerApi } from '../workers/protocol';

/** a stub engine: one model slot, a run answers with the model it ran on */
function stubApi(): EngineWorkerApi {
  let model = '';
  return {
    ping: async () => 'pong',
    loadModel: async (_job: string, req: { model: string }) => {
      model = req.model;
      return { info: { id: req.model } };
    },
    runOperation: async () => ({ ranOn: model }),
    cancel: async () => false,
  } as unknown as EngineWorkerApi;
}

let server: EngineServer;
const open: EngineConnection[] = [];
const conn = async () => {
  const c = await connectEngine(`${server.url}#token=${server.token}`, server.token);
  open.push(c);
  return c;
};
/** the notices a connection has heard */
const heard = (c: EngineConnection) => {
  const got: Record<string, string>[] = [];
  c.endpoint.addEventListener('notice', (ev) => got.push((ev as Event & { detail: Record<string, string> }).detail));
  return got;
};
const refusal = (p: Promise<unknown>) =>
  p.then(
    () => null,
    (e) => e?.error ?? e,
  );

beforeAll(async () => {
  server = await startEngineServer({ api: stubApi(), port: 0 });
});
afterAll(async () => {
  for (const c of open) c.close();
  await server.close();
});

describe('two pages on one served engine', () => {
  it("tells A at once that B replaced its model, refuses A's runs until A loads again", async () => {
    const a = await conn();
    const b = await conn();
    const aHeard = heard(a);
    const bHeard = heard(b);
    const load = (c: EngineConnection, m: string) =>
      c.api.loadModel(
        'l',
        { model: m, backend: 'auto' } as never,
        Comlink.proxy(() => {}),
      );
    const run = (c: EngineConnection) =>
      c.api.runOperation(
        'r',
        'trace',
        {},
        Comlink.proxy(() => {}),
      );

    await load(a, 'model-A');
    expect(await run(a)).toEqual({ ranOn: 'model-A' });
    await load(b, 'model-B');
    await expect.poll(() => aHeard.length).toBe(1);
    expect(aHeard[0]).toMatchObject({ type: 'model_replaced', model: 'model-B' });
    expect(bHeard).toEqual([]);

    const err = await refusal(run(a));
    expect(err).toMatchObject({ code: 'MODEL_REPLACED', details: { model: 'model-B' } });
    expect(err.message).toContain('model-B');
    expect(await run(b)).toEqual({ ranOn: 'model-B' });

    // A loads again: A runs, and now B is the one told and refused
    await load(a, 'model-A');
    expect(await run(a)).toEqual({ ranOn: 'model-A' });
    await expect.poll(() => bHeard.length).toBe(1);
    expect(bHeard[0]).toMatchObject({ type: 'model_replaced', model: 'model-A' });
    expect(await refusal(run(b))).toMatchObject({ code: 'MODEL_REPLACED' });

    // a connection that loaded nothing runs on the engine's model, and is told nothing
    const c = await conn();
    const cHeard = heard(c);
    expect(await run(c)).toEqual({ ranOn: 'model-A' });
    await load(b, 'model-B');
    await expect.poll(() => aHeard.length).toBe(2);
    expect(cHeard).toEqual([]);
  });

  it('a page ignores a notice frame that is not one (no type, not an object)', async () => {
    const a = await conn();
    const got = heard(a);
    a.endpoint.receive(JSON.stringify({ n: [1] }));
    a.endpoint.receive(JSON.stringify({ n: { model: 'x' } }));
    a.endpoint.receive(JSON.stringify({ n: { type: 'model_replaced', model: 3 } }));
    expect(got).toEqual([{ type: 'model_replaced' }]);
    expect(await a.api.ping()).toBe('pong');
  });
});
