/**
 * One CLI call's stages, for bench/whole-calls.ts --phases: the steps `loupe <op>` takes
 * (src/cli/main.ts runOperation), run here with a clock around each, on the code of the checkout
 * this file sits in (whole-calls.ts copies it into another checkout's bench/ to time that one).
 * Inside the operation: the time in the engine's model.run and weightProducts (DLA's readout),
 * summed over calls. Prints one JSON line of stage → ms.
 *
 *   node --import tsx bench/whole-calls-phases.ts generate|trace MODEL PROMPT
 */
export {};

const t0 = performance.now();
const [op, model, prompt] = process.argv.slice(2);
const out: Record<string, number> = {};
let last = t0;
const lap = (name: string) => {
  const t = performance.now();
  out[name] = t - last;
  last = t;
};

async function main() {
  // imported here, after the clock starts, as the CLI imports them
  const ops = await import('../src/ops/index');
  const { loadModelForCli } = await import('../src/cli/load-model');
  lap('imports');
  const m = await loadModelForCli(model, undefined, undefined, undefined);
  lap('load');
  const inEngine: Record<string, number> = { 'in op: model.run': 0, 'in op: weightProducts': 0 };
  // the other checkout's model may differ in its types: wrapped as plain functions
  const timed = m as unknown as Record<'run' | 'weightProducts', (...a: unknown[]) => Promise<unknown>>;
  for (const fn of ['run', 'weightProducts'] as const) {
    const f = timed[fn].bind(m);
    timed[fn] = async (...a: unknown[]) => {
      const s = performance.now();
      try {
        return await f(...a);
      } finally {
        inEngine[`in op: ${fn === 'run' ? 'model.run' : fn}`] += performance.now() - s;
      }
    };
  }
  const operation = ops.getOperation(op);
  if (!operation) throw new Error(`no operation ${op}`);
  const input = op === 'generate' ? { prompt, max_new_tokens: 1 } : { prompt };
  const sae = (await import('../src/node/load-sae')).createNodeSaeLoaders();
  const documents = (await import('../src/node/document-cache')).nodeDocumentCache();
  lap('parse, SAE loaders, document cache');
  const doc = await operation.run(m, input, {
    documents,
    loadSae: sae.loadSae,
    loadSaeFile: sae.loadSaeFile,
    loadTranscoders: sae.loadTranscoders,
  });
  lap('operation');
  Object.assign(out, inEngine);
  out['in op: the rest'] = out.operation - inEngine['in op: model.run'] - inEngine['in op: weightProducts'];
  JSON.stringify(doc);
  lap('JSON');
  await m.dispose();
  lap('dispose');
  out.total = performance.now() - t0;
  process.stdout.write(JSON.stringify(out) + '\n');
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
