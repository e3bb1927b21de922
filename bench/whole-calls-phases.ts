/**
 * One CLI call's stages, for bench/whole-calls.ts --phases: the steps `loupe <op>` takes
 * (src/cli/main.ts runOperation), run here with a clock around each, importing the code of the
 * checkout TREE. Inside the operation: the time in the engine's model.run and weightProducts
 * (DLA's readout), summed over calls. Prints one JSON line of stage → ms.
 *
 *   node --import tsx bench/whole-calls-phases.ts TREE generate|trace MODEL PROMPT
 */
export {};

const t0 = performance.now();
const [tree, op, model, prompt] = process.argv.slice(2);
const out: Record<string, number> = {};
let last = t0;
const lap = (name: string) => {
  const t = performance.now();
  out[name] = t - last;
  last = t;
};

async function main() {
  const src = (p: string) => import(new URL(`src/${p}`, `file://${tree.replace(/\/?$/, '/')}`).href);
  const ops = await src('ops/index.ts');
  const { loadModelForCli } = await src('cli/load-model.ts');
  lap('imports');
  const m = await loadModelForCli(model, undefined, undefined, undefined);
  lap('load');
  const inEngine: Record<string, number> = { 'in op: model.run': 0, 'in op: weightProducts': 0 };
  for (const fn of ['run', 'weightProducts'] as const) {
    const f = m[fn].bind(m);
    m[fn] = async (...a: unknown[]) => {
      const s = performance.now();
      try {
        return await f(...a);
      } finally {
        inEngine[`in op: ${fn === 'run' ? 'model.run' : fn}`] += performance.now() - s;
      }
    };
  }
  const operation = ops.getOperation(op);
  const input = op === 'generate' ? { prompt, max_new_tokens: 1 } : { prompt };
  const sae = (await src('node/load-sae.ts')).createNodeSaeLoaders();
  const documents = (await src('node/document-cache.ts')).nodeDocumentCache();
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
