/**
 * `loupe` — the command-line surface. Thin: it parses flags into an operation's input (generic,
 * from the input schema), loads the model, calls the same `operation.run` as every other
 * surface, and prints the document (--json) or a table.
 *
 * Exit codes: 0 ok · 1 runtime error · 2 usage error (also a malformed model id, before any
 * request) · 3 unsupported model: an architecture Loupe has no adapter for, or one too large
 * for the backend's memory (both found before any weight byte is downloaded).
 */
import { operations, getOperation, parseOperationInput } from '../ops/index';
import type { AnyOperation } from '../ops/types';
import type { LoadedModel } from '../engine/api';
import { LoupeError, toLoupeError, type ErrorDocument } from '../engine/errors';
import { operationSchemas, schemasOf, allSchemas } from '../ops/schemas';
import { CLI_FLAGS, UsageError, flagsToInput, isBooleanField, properties, splitArgs } from './args';
import { render } from './format';
import { progressPrinter } from './progress';
import { operationHelp, mainHelp } from './help';
import { loadModelForCli, type Io } from './load-model';
import { packageVersion } from '../node/package';
import { readFileSync, statSync } from 'node:fs';
import { checkCap } from '../engine/caps';

export type { Io } from './load-model';

const defaultIo: Io = {
  stdout: (s) => process.stdout.write(s),
  stderr: (s) => process.stderr.write(s),
};

export const EXIT = { ok: 0, runtime: 1, usage: 2, unsupported: 3 } as const;

const UNSUPPORTED = new Set(['UNSUPPORTED_ARCHITECTURE', 'UNSUPPORTED_CONFIG']);

function errorDoc(e: LoupeError): ErrorDocument {
  return e.toJSON();
}

/** print an error the way the flags ask, and return its exit code (`code` overrides the one its kind gets) */
function fail(io: Io, json: boolean, e: unknown, code?: number): number {
  if (e instanceof UsageError) {
    if (json)
      io.stdout(
        JSON.stringify({ error: { code: 'BAD_INPUT', message: e.message, ...(e.hint ? { hint: e.hint } : {}) } }) +
          '\n',
      );
    io.stderr(`loupe: ${e.message}\n${e.hint ? e.hint + '\n' : ''}Run 'loupe --help' for usage.\n`);
    return EXIT.usage;
  }
  const le = toLoupeError(e);
  if (json) io.stdout(JSON.stringify(errorDoc(le)) + '\n');
  io.stderr(`loupe: error ${le.code}: ${le.message}\n${le.hint ? `hint: ${le.hint}\n` : ''}`);
  if (le.code === 'INTERNAL' && e instanceof Error && e.stack && process.env.LOUPE_DEBUG) io.stderr(e.stack + '\n');
  return code ?? (UNSUPPORTED.has(le.code) ? EXIT.unsupported : EXIT.runtime);
}

async function runOperation(op: AnyOperation, argv: string[], io: Io): Promise<number> {
  const schema = operationSchemas(op).input;
  const props = properties(schema);
  const isBool = (name: string) =>
    name in CLI_FLAGS ? CLI_FLAGS[name].boolean : isBooleanField(schema, props[name.replace(/-/g, '_')]);
  let json = argv.includes('--json');
  try {
    const { positionals, flags } = splitArgs(argv, isBool);
    json = flags.get('json') === true;
    if (flags.get('help') === true) {
      io.stdout(operationHelp(op) + '\n');
      return EXIT.ok;
    }
    const quiet = flags.get('quiet') === true;
    const hasPrompt = 'prompt' in props;
    const extra = flags.get('input');
    let fromJson: Record<string, unknown> = {};
    if (typeof extra === 'string') {
      try {
        fromJson = JSON.parse(extra);
      } catch (e) {
        throw new UsageError(`--input is not valid JSON: ${(e as Error).message}`);
      }
      if (!fromJson || typeof fromJson !== 'object' || Array.isArray(fromJson))
        throw new UsageError('--input must be a JSON object.');
    }
    const [modelSpec, prompt, ...rest] = positionals;
    if (!modelSpec)
      throw new UsageError(
        `Missing MODEL: loupe ${op.name} MODEL${hasPrompt ? ' PROMPT' : ''} [options]`,
        "MODEL is 'default' (the bundled stories260K), a name from 'loupe models' (e.g. gpt2-small), a Hub id or a folder.",
      );
    if (rest.length || (!hasPrompt && prompt !== undefined))
      throw new UsageError(
        `Unexpected argument ${JSON.stringify(rest[0] ?? prompt)}.`,
        'Quote a prompt that contains spaces.',
      );
    const promptRequired = ((schema.required as string[] | undefined) ?? []).includes('prompt');
    if (promptRequired && prompt === undefined && !('prompt' in fromJson))
      throw new UsageError(`Missing PROMPT: loupe ${op.name} MODEL PROMPT [options]`);
    const input: Record<string, unknown> = {
      ...(hasPrompt && prompt !== undefined ? { prompt } : {}),
      ...flagsToInput(schema, filesToFlags(props, flags)),
      ...fromJson,
    };
    // a malformed input is a usage error, caught before the model is loaded
    try {
      parseOperationInput(op, input);
    } catch (e) {
      if (e instanceof LoupeError && e.code === 'BAD_INPUT')
        throw new UsageError(e.message, `See 'loupe ${op.name} --help'.`);
      throw e;
    }
    const backend = flags.get('backend');
    const idle = flags.get('idle-timeout');
    if (idle !== undefined) {
      if (typeof idle !== 'string' || !(Number(idle) > 0))
        throw new UsageError(`--idle-timeout needs a number of seconds above 0 (got '${idle}').`);
      process.env.LOUPE_IDLE_TIMEOUT = idle; // read by every download of this process (http-source.ts)
    }
    const say = progressPrinter(io.stderr, { quiet, tty: !!process.stderr.isTTY });
    const weights = flags.get('weights');
    let model: LoadedModel;
    try {
      model = await loadModelForCli(
        modelSpec,
        typeof backend === 'string' ? backend : undefined,
        say,
        typeof weights === 'string' ? weights : undefined,
      );
    } catch (e) {
      // a model too large for the backend is refused like an unsupported one (an operation's own TOO_LARGE caps stay exit 1)
      if (e instanceof LoupeError && e.code === 'TOO_LARGE') return fail(io, json, e, EXIT.unsupported);
      throw e;
    }
    // Ctrl-C cancels the operation between engine runs (it then fails with ABORTED, exit 1)
    const ac = new AbortController();
    const onSigint = () => ac.abort();
    process.once('SIGINT', onSigint);
    try {
      // SAE loaders touch nothing until an SAE operation asks for one
      const sae = (await import('../node/load-sae')).createNodeSaeLoaders();
      const documents = (await import('../node/document-cache')).nodeDocumentCache();
      const doc = await op.run(model, input, {
        documents,
        signal: ac.signal,
        onProgress: (p) => say(`${op.name}: ${p.stage} ${p.done}/${p.total}`),
        loadSae: sae.loadSae,
        loadSaeFile: sae.loadSaeFile,
        loadTranscoders: sae.loadTranscoders,
      });
      if (!quiet && process.stderr.isTTY) io.stderr('\r\x1b[2K');
      // what happened to the job (a GPU device lost and recovered): said even when --quiet
      for (const n of (doc as { notices?: string[] }).notices ?? []) io.stderr(`loupe: notice: ${n}\n`);
      io.stdout(
        json
          ? JSON.stringify(doc) + '\n'
          : render(doc, { color: !!process.stdout.isTTY && !process.env.NO_COLOR }) + '\n',
      );
      return EXIT.ok;
    } finally {
      process.off('SIGINT', onSigint);
      await model.dispose().catch(() => undefined);
    }
  } catch (e) {
    return fail(io, json, e);
  }
}

/**
 * Local files, a CLI feature: `--dataset FILE` reads JSON Lines or CSV pairs into dataset_text
 * (an inline JSON array still goes to dataset), `--circuit FILE` reads a Graph.to_json circuit
 * (an inline JSON object still goes to circuit). Each file is size-checked before it is read.
 */
function filesToFlags(
  props: Record<string, unknown>,
  flags: Map<string, string | boolean>,
): Map<string, string | boolean> {
  const out = new Map(flags);
  const read = (file: string, cap: 'maxDatasetChars' | 'maxCircuitFileBytes', flag: string): string => {
    let size: number;
    try {
      size = statSync(file).size;
    } catch {
      throw new UsageError(`--${flag}: no file ${JSON.stringify(file)}.`);
    }
    checkCap(cap, size, `--${flag} ${file}`, { unit: 'bytes' });
    return readFileSync(file, 'utf8');
  };
  const dataset = flags.get('dataset');
  if ('dataset_text' in props && typeof dataset === 'string' && !dataset.trim().startsWith('[')) {
    out.delete('dataset');
    if (flags.has('dataset-text')) throw new UsageError('Give --dataset FILE or --dataset-text, not both.');
    out.set('dataset-text', read(dataset, 'maxDatasetChars', 'dataset'));
  }
  const circuit = flags.get('circuit');
  if ('circuit' in props && typeof circuit === 'string' && !circuit.trim().startsWith('{'))
    out.set('circuit', read(circuit, 'maxCircuitFileBytes', 'circuit'));
  return out;
}

async function schemaCommand(argv: string[], io: Io): Promise<number> {
  const names = argv.filter((a) => !a.startsWith('-'));
  try {
    if (names.length > 1) throw new UsageError('loupe schema takes at most one operation name.');
    const out = names.length ? schemasOf(names[0]) : allSchemas();
    io.stdout(JSON.stringify(out, null, 2) + '\n');
    return EXIT.ok;
  } catch (e) {
    if (e instanceof LoupeError && e.code === 'UNKNOWN_OPERATION')
      return fail(io, argv.includes('--json'), new UsageError(e.message, e.hint));
    return fail(io, argv.includes('--json'), e);
  }
}

async function mcpCommand(argv: string[], io: Io): Promise<number> {
  // imported on use: `loupe trace …` need not load the MCP SDK and the hub
  const { runMcp } = await import('../bridge/main');
  const code = await runMcp(argv, {
    // `--engine URL`: the tools run on a served engine (src/serve)
    engineExecutor: async (url, o) => {
      const { RemoteExecutor } = await import('../serve/mcp-executor');
      const { engineToken } = await import('../serve/client');
      return new RemoteExecutor({ url, token: await engineToken(url), ...o });
    },
  });
  // runMcp may report through process.exitCode instead of returning a code
  return typeof code === 'number' ? code : typeof process.exitCode === 'number' ? process.exitCode : EXIT.ok;
}

export async function main(argv: string[], io: Io = defaultIo): Promise<number> {
  const [cmd, ...rest] = argv;
  if (cmd === undefined) {
    io.stderr(mainHelp() + '\n');
    return EXIT.usage;
  }
  if (cmd === '--help' || cmd === '-h' || cmd === 'help') {
    if (cmd === 'help' && rest[0] && getOperation(rest[0])) {
      io.stdout(operationHelp(getOperation(rest[0])!) + '\n');
      return EXIT.ok;
    }
    io.stdout(mainHelp() + '\n');
    return EXIT.ok;
  }
  if (cmd === '--version') {
    io.stdout(`loupe ${packageVersion()}\n`);
    return EXIT.ok;
  }
  if (cmd === 'schema') return schemaCommand(rest, io);
  if (cmd === 'doctor') {
    const { doctor } = await import('./doctor');
    return doctor(rest, io);
  }
  if (cmd === 'mcp') return mcpCommand(rest, io);
  if (cmd === 'serve') return (await import('../serve/main')).serveCommand(rest, io);
  if (cmd === 'models') return (await import('./models')).modelsCommand(rest, io);
  const op = getOperation(cmd);
  if (!op) {
    return fail(
      io,
      argv.includes('--json'),
      new UsageError(
        `Unknown command '${cmd}'.`,
        `Commands: ${Object.keys(operations).join(', ')}, models, doctor, schema, mcp, serve. Run 'loupe --help'.`,
      ),
    );
  }
  return runOperation(op, rest, io);
}
