/**
 * The page worker under hostile input (issue 9): random operation inputs generated from each
 * operation's JSON Schema (wrong types, Infinity and NaN, huge and negative numbers, huge
 * strings, unknown fields, paths) and corrupt model and SAE files from the Hub stand-in. Each
 * must end in a document or a structured error; afterwards the worker still runs, gives the same
 * trace as before, and no job is left in the job bar. Seeded (LOUPE_HOSTILE_SEED) and bounded.
 */
import { join } from 'node:path';
import { test, expect, openReady, watchErrors, SHARED_MODELS, PROMPT } from './fixtures';
import { argsFromSchema, randomLatin1, rng, type Rng } from '../tests/helpers/hostile';

const SEED = Number(process.env.LOUPE_HOSTILE_SEED ?? 20261201);
const INPUTS_PER_OP = 3;
const TRACE = { prompt: PROMPT, top_k: 5 };

/**
 * Sprinkle NaN into numbers (JSON cannot carry it; the page's structured clone can). Nesting is
 * cut at 40 levels: Playwright's argument serialiser has its own depth limit.
 */
function withNaN(r: Rng, v: unknown, depth = 0): unknown {
  if (typeof v === 'number') return r() < 0.2 ? NaN : v;
  if (depth > 40) return [];
  if (Array.isArray(v)) return v.map((x) => withNaN(r, x, depth + 1));
  if (v && typeof v === 'object')
    return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, withNaN(r, x, depth + 1)]));
  return v;
}

test('random operation inputs and corrupt model/SAE files never kill the worker or leave the UI stuck', async ({
  page,
  site,
  hub,
}) => {
  test.setTimeout(600_000);
  const errors = watchErrors(page);
  await openReady(page, site.url);
  const run = (op: string, input: unknown) =>
    page.evaluate(
      async ([o, i]) => {
        const a = (globalThis as any).__loupe;
        const doc = await a.runOperation(o, i, { scroll: false });
        return {
          doc,
          error: a.jobError ? { code: a.jobError.code, message: String(a.jobError.message).slice(0, 200) } : null,
        };
      },
      [op, input] as const,
    );
  const baseline = (await run('trace', TRACE)).doc;
  expect(baseline).toMatchObject({ operation: 'trace' });

  const ops = await page.evaluate(() =>
    (globalThis as any).__loupe.ops.map((o: any) => ({ name: o.name, inputSchema: o.inputSchema })),
  );
  expect(ops.length).toBeGreaterThan(15);
  const r = rng(SEED + 10);
  const outcomes: Record<string, number> = {};
  let n = 0;
  for (const op of ops as { name: string; inputSchema: Record<string, unknown> }[]) {
    for (let k = 0; k < INPUTS_PER_OP; k++) {
      const input = withNaN(r, JSON.parse(argsFromSchema(r, op.inputSchema)));
      n += 1;
      const res = await run(op.name, input);
      // a document or a structured error, never neither
      expect(
        res.doc !== null || typeof res.error?.code === 'string',
        `${op.name} ${JSON.stringify(input).slice(0, 300)}`,
      ).toBe(true);
      const key = res.doc !== null ? 'document' : res.error!.code;
      outcomes[key] = (outcomes[key] ?? 0) + 1;
    }
  }
  expect(outcomes.INTERNAL ?? 0, JSON.stringify(outcomes)).toBe(0);
  await expect(page.getByTestId('job')).toHaveCount(0);
  expect((await run('trace', TRACE)).doc).toEqual(baseline);

  // corrupt models: each load fails with a structured error and the bundled model stays loaded
  const induction = join(SHARED_MODELS, 'induction-gpt2');
  const header = (len: number) => {
    const b = Buffer.alloc(8);
    b.writeBigUInt64LE(BigInt(len));
    return b;
  };
  const corrupt: [string, string, Uint8Array | string][] = [
    ['cfg-bytes', 'config.json', Buffer.from(randomLatin1(r, 300), 'latin1')],
    [
      'cfg-absurd',
      'config.json',
      JSON.stringify({ model_type: 'gpt2', n_layer: 1e9, n_head: -3, n_embd: 1e999, vocab_size: 'x', n_positions: 0 }),
    ],
    ['tok-bytes', 'tokenizer.json', Buffer.from(randomLatin1(r, 500), 'latin1')],
    ['st-hugeheader', 'model.safetensors', Buffer.concat([header(2 ** 50), Buffer.from('{}')])],
    ['st-bytes', 'model.safetensors', Buffer.from(randomLatin1(r, 4096), 'latin1')],
    [
      'st-badjson',
      'model.safetensors',
      Buffer.concat([header(40), Buffer.from('{"wte.weight":{"dtype":"F32","shape":[-1]')]),
    ],
  ];
  for (const [name, file, bytes] of corrupt) {
    const id = `hostile/${name}`;
    hub.addRepo(id, induction);
    hub.addFile(id, file, bytes);
    n += 1;
    const res = await page.evaluate(
      async ([i, endpoint]) => {
        const a = (globalThis as any).__loupe;
        const ok = await a.loadModel({ kind: 'hub', id: i, revision: 'main', endpoint });
        return { ok, status: a.modelStatus, model: a.model?.info.id, error: a.models.error?.code ?? null };
      },
      [id, hub.url] as const,
    );
    expect(res.ok, name).toBe(false);
    expect(res.status, name).toBe('ready');
    expect(res.model, name).toBe('stories260K');
    expect(res.error, name).toMatch(/^[A-Z_]+$/);
    expect(res.error, name).not.toBe('INTERNAL');
    outcomes[`model:${res.error}`] = (outcomes[`model:${res.error}`] ?? 0) + 1;
  }

  // corrupt SAEs: garbage cfg.json, weights that are not safetensors, shapes that do not fit
  const SAE = 'hostile/saes';
  hub.addRepo(SAE, null);
  hub.addFile(SAE, 'a/cfg.json', Buffer.from(randomLatin1(r, 200), 'latin1'));
  hub.addFile(SAE, 'a/sae_weights.safetensors', Buffer.from('x'));
  hub.addFile(
    SAE,
    'b/cfg.json',
    JSON.stringify({
      architecture: 'standard',
      d_in: 64,
      d_sae: 16,
      hook_name: 'blocks.0.hook_resid_pre',
      dtype: 'float32',
    }),
  );
  hub.addFile(SAE, 'b/sae_weights.safetensors', Buffer.from(randomLatin1(r, 2048), 'latin1'));
  hub.addFile(
    SAE,
    'c/cfg.json',
    JSON.stringify({ architecture: 'standard', d_in: 1e9, d_sae: 1e9, hook_name: 'blocks.0.hook_resid_pre' }),
  );
  hub.addFile(SAE, 'c/sae_weights.safetensors', Buffer.concat([header(2 ** 40), Buffer.from('{')]));
  for (const p of ['a', 'b', 'c']) {
    n += 1;
    const res = await run('sae_features', {
      prompt: 'Once upon a time',
      sae_source: `${hub.url}/${SAE}/resolve/main/${p}/`,
      top_k: 3,
    });
    expect(res.doc, p).toBeNull();
    expect(res.error?.code, p).toMatch(/^[A-Z_]+$/);
    expect(res.error?.code, p).not.toBe('INTERNAL');
    outcomes[`sae:${res.error!.code}`] = (outcomes[`sae:${res.error!.code}`] ?? 0) + 1;
  }

  await expect(page.getByTestId('job')).toHaveCount(0);
  expect((await run('trace', TRACE)).doc).toEqual(baseline);
  expect(
    errors.filter((e) => e.startsWith('pageerror')),
    errors.join('\n'),
  ).toEqual([]);
  console.log(`[e2e] hostile worker inputs (seed ${SEED}): ${n}, outcomes ${JSON.stringify(outcomes)}`);
});
