/**
 * One operation = one module exporting `operation = defineOperation({...})`: an input schema, an
 * output schema and a function (model, parsed input, ctx) → document. The CLI, the worker (page),
 * the MCP bridge and the headless server all call `operation.run` and return its document
 * unchanged; `run` parses the raw input (BAD_INPUT on failure), applies chat format when asked
 * (lib/tokens.ts applyChatFormat), and checks the document against the
 * output schema, so no surface and no operation does either by hand.
 */
import type { z } from 'zod';
import { LoupeError } from '../engine/errors';
import type { LoadedModel } from '../engine/api';
import type { SaeFiles } from '../engine/sae';
import type { TranscoderFiles, TranscoderLoadOptions } from '../engine/source/transcoder-loader';
import type { FileProgress } from '../engine/source/types';
import type { DocumentCache } from '../engine/source/document-cache';
import { applyChatFormat } from './lib/tokens';
import { DEVICE_LOST_NOTICE, deviceLostError } from '../engine/runtime/device-lost';

/** Where an SAE lives: a Hub repo (or URL / folder, as for models) and its folder inside it. */
export interface SaeRef {
  /** 'owner/name[@revision]', an http(s) URL, or (Node) a folder */
  source: string;
  /** the SAE's folder inside the source ('' = its root), e.g. 'blocks.8.hook_resid_pre' */
  path: string;
}

export interface Progress {
  /** what is being done, e.g. 'ablating heads' */
  stage: string;
  done: number;
  total: number;
}

export interface OpContext {
  onProgress?: (p: Progress) => void;
  signal?: AbortSignal;
  /** in-memory store for handles (captures, probes) that outlive one call */
  store?: HandleStore;
  /**
   * fetch an SAE's files through this surface's source and cache (Node: folder/Hub + directory
   * cache; page: Hub/URL + IndexedDB), with download progress
   */
  loadSae?: (
    ref: SaeRef,
    opts: {
      signal?: AbortSignal;
      onProgress?: (p: FileProgress) => void;
      /** SAELens's cfg.json, judged (throw to refuse) before the weights are fetched */
      judge?: (cfg: Record<string, any>) => void;
    },
  ) => Promise<SaeFiles>;
  /** fetch one more file beside an SAE (e.g. explanations.json); null when optional and absent */
  loadSaeFile?: (
    ref: SaeRef,
    file: string,
    opts: { signal?: AbortSignal; optional?: boolean },
  ) => Promise<Uint8Array | null>;
  /**
   * fetch a transcoder set through this surface's sources and caches (engine/source/transcoder-loader.ts):
   * judged from its headers (opts.judge) before any weight byte, then its files with download progress
   */
  loadTranscoders?: (ref: SaeRef, opts: TranscoderLoadOptions) => Promise<TranscoderFiles>;
  /** documents kept between calls (page: IndexedDB; Node: the cache folder); absent = in the process only */
  documents?: DocumentCache;
}

export interface HandleStore {
  put(kind: string, value: unknown): string;
  get<T>(kind: string, id: string): T;
}

/**
 * What a run hands on to other operations: `{ probe: { capture: 'handle' } }` = after a run, the
 * document's `handle` fills the probe's `capture` input (the page fills that form).
 */
export type Feeds = Record<string, Record<string, string>>;

/** the JSON Schema keyword under which an input field says when it applies (page forms hide it otherwise) */
export const FORM_WHEN = 'x-loupe-when';

/**
 * An input field that applies only while other fields hold one of the given values, e.g.
 * `.meta(formWhen({ subject: ['neuron'] }))`: the page's form shows it only then and leaves it out
 * of the input otherwise. An annotation in the JSON Schema; validation ignores it.
 */
export function formWhen(when: Record<string, string[]>): Record<string, unknown> {
  return { [FORM_WHEN]: when };
}

/** What an operation module declares: its name, title, description and schemas. */
export interface OperationSpec<In extends z.ZodType, Out extends z.ZodType> {
  name: string;
  /** a short name for people: the page's tab, the MCP tool's title */
  title: string;
  /** written for a model (agent) reading it: what it computes, units, conventions, cost */
  description: string;
  input: In;
  output: Out;
  /** long operations (sweeps, scans) that surfaces may run as jobs */
  long?: boolean;
  /** document fields that are other operations' inputs (see Feeds) */
  feeds?: Feeds;
}

/** An operation's body: input already parsed by `input` (defaults applied); its result is checked against `output`. */
export type OperationBody<In extends z.ZodType, Out extends z.ZodType> = (
  model: LoadedModel,
  input: z.output<In>,
  ctx: OpContext,
) => Promise<z.input<Out>>;

/** What every surface sees: raw input in, validated document out. */
export interface Operation<In extends z.ZodType = z.ZodType, Out extends z.ZodType = z.ZodType> extends OperationSpec<
  In,
  Out
> {
  run(model: LoadedModel, input: z.input<In>, ctx?: OpContext): Promise<z.output<Out>>;
}

/**
 * The registry's view of an operation whose schemas it does not know statically (looked up by a
 * name from a command line, a message or a tool call): raw input in, its document out.
 */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type AnyOperation = Operation<any, any>;

/** an operation's document type */
export type DocumentOf<O extends Operation> = z.output<O['output']>;
/** what a caller may send an operation (fields with defaults optional) */
export type InputOf<O extends Operation> = z.input<O['input']>;

/**
 * Zod parse → BAD_INPUT listing every offending field (path: message), which is what a person or
 * an agent needs to fix the call. The one BAD_INPUT format for operation input and for the
 * bridge's own tools alike.
 */
export function parseInput<S extends z.ZodType>(schema: S, raw: unknown, what = 'input'): z.output<S> {
  const r = schema.safeParse(raw ?? {});
  if (r.success) return r.data as z.output<S>;
  const issues = r.error.issues.map(
    (i) => `${i.path.length ? i.path.map(String).join('.') : `(${what})`}: ${i.message}`,
  );
  throw new LoupeError(
    'BAD_INPUT',
    `Invalid ${what}: ${issues.join('; ')}`,
    "Check the input schema (`loupe <op> --help`, `loupe schema <op>`, or the tool's inputSchema).",
    { issues: r.error.issues.slice(0, 20).map((i) => ({ path: i.path.map(String), message: i.message })) },
  );
}

/** An operation's raw input → its parsed input, with the one BAD_INPUT format. */
export function parseOperationInput<In extends z.ZodType>(
  op: Pick<Operation<In>, 'name' | 'input'>,
  raw: unknown,
): z.output<In> {
  return parseInput(op.input, raw, `input for ${op.name}`);
}

/**
 * A GPU device lost during the body (DEVICE_LOST, runtime/device-lost.ts): the model's sessions
 * made again on a new device and the whole body run once more, since values it kept on the lost
 * device (a KV cache, hooks) went with it. The document says so (`notices`), and so does a progress
 * event; a second loss fails with DEVICE_LOST, `again` in its details.
 */
async function withDeviceRecovery<T>(
  model: LoadedModel,
  ctx: OpContext,
  run: () => Promise<T>,
): Promise<{ doc: T; notices: string[] }> {
  try {
    return { doc: await run(), notices: [] };
  } catch (e) {
    if (!(e instanceof LoupeError) || e.code !== 'DEVICE_LOST' || !model.recoverDevice) throw e;
    ctx.onProgress?.({
      stage: 'the GPU device was lost: recreating the sessions and running again',
      done: 0,
      total: 1,
    });
    await model.recoverDevice();
    try {
      return { doc: await run(), notices: [DEVICE_LOST_NOTICE] };
    } catch (e2) {
      if (e2 instanceof LoupeError && e2.code === 'DEVICE_LOST') throw deviceLostError(e2.message, true);
      throw e2;
    }
  }
}

/**
 * The one operation template:
 *
 *   export const operation = defineOperation({ name, title, description, input, output }).implement(
 *     async (model, input, ctx) => ({ ...document }));
 *
 * The body is typed from the schemas (parsed input in, the output schema's input type out); the
 * returned operation parses raw input first (BAD_INPUT) and checks the document against `output`
 * (INTERNAL: a document that breaks its own schema is a bug). Two steps, so that the schemas fix
 * the body's types before TypeScript checks it (a one-object form widens the document's literals).
 */
export function defineOperation<In extends z.ZodType, Out extends z.ZodType>(spec: OperationSpec<In, Out>) {
  return {
    implement(body: OperationBody<In, Out>): Operation<In, Out> {
      return {
        name: spec.name,
        title: spec.title,
        description: spec.description,
        input: spec.input,
        output: spec.output,
        ...(spec.long ? { long: true } : {}),
        ...(spec.feeds ? { feeds: spec.feeds } : {}),
        async run(model, raw, ctx = {}) {
          const input = parseInput(spec.input, raw, `input for ${spec.name}`);
          // the one place chat format is applied, so every prompt-taking operation gets it alike
          const promptFormat =
            input && typeof input === 'object' ? applyChatFormat(model, input as Record<string, unknown>) : undefined;
          const { doc: body0, notices } = await withDeviceRecovery(model, ctx, () => body(model, input, ctx));
          const doc = {
            ...(body0 as object),
            ...(promptFormat ? { prompt_format: promptFormat } : {}),
            ...(notices.length ? { notices } : {}),
          };
          const checked = spec.output.safeParse(doc);
          if (checked.success) return checked.data as z.output<Out>;
          const issues = checked.error.issues.slice(0, 3).map((i) => `${i.path.map(String).join('.')}: ${i.message}`);
          throw new LoupeError(
            'INTERNAL',
            `The ${spec.name} document does not match its schema: ${issues.join('; ')}.`,
            'This is a bug in Loupe; please report it with the input that caused it.',
          );
        },
      };
    },
  };
}
