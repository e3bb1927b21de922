/**
 * Turning documents and errors into MCP tool results, and keeping every document a client's
 * session produced as a resource, `loupe://results/{id}`: listed with its operation, model and
 * prompt, readable by URI, handed to other tools (compare) instead of resending its numbers.
 *
 * A document is data held by this companion, so it outlives the page instance that computed it
 * (a reload does not take it away) and is gone when the companion stops. Each client session has
 * its own store (scope.ts), bounded in count and bytes, evicted oldest first. Ids are 128 random
 * bits: knowing a URI is what lets a client read it.
 */
import type { CallToolResult } from '@modelcontextprotocol/server';
import { LoupeError, toLoupeError } from '../engine/errors';
import { randomHex } from '../ops/lib/handles';

export const RESULT_URI_PREFIX = 'loupe://results/';
export const RESULT_URI_TEMPLATE = 'loupe://results/{id}';
const RESULT_ID = /^[0-9a-f]{32}$/;

/** most results one session keeps, and most bytes of their JSON together */
export const RESULTS_PER_SESSION = 64;
export const RESULT_BYTES_PER_SESSION = 256 * 1024 * 1024;

export interface StoredResult {
  uri: string;
  operation: string;
  model?: string;
  prompt?: string;
  link?: string;
  created: number;
  /** the document's JSON, as the tool result's text carried it */
  json: string;
}

export function okResult(document: unknown, extra: { link?: string; result?: StoredResult } = {}): CallToolResult {
  const content: CallToolResult['content'] = [{ type: 'text', text: extra.result?.json ?? JSON.stringify(document) }];
  // what happened to the job (a GPU device lost and recovered), said beside the document too
  for (const n of (document as { notices?: unknown })?.notices instanceof Array
    ? ((document as { notices: unknown[] }).notices.filter((x) => typeof x === 'string') as string[])
    : [])
    content.push({ type: 'text', text: `Notice: ${n}` });
  if (extra.link)
    content.push({
      type: 'text',
      text: `Shareable link (opens this result in the Loupe workbench and re-runs it locally): ${extra.link}`,
    });
  if (extra.result)
    content.push({
      type: 'resource_link',
      uri: extra.result.uri,
      name: resultName(extra.result),
      mimeType: 'application/json',
      description: 'This document, readable (and usable by compare) until this session ends or evicts it.',
    });
  const meta: Record<string, unknown> = {};
  if (extra.link) meta['loupe/link'] = extra.link;
  if (extra.result) meta['loupe/resource'] = extra.result.uri;
  return {
    content,
    structuredContent: document as Record<string, unknown>,
    ...(Object.keys(meta).length ? { _meta: meta } : {}),
  };
}

/** An error the agent can act on: the error document as text, isError set, no structuredContent
 * (clients validate structuredContent against the outputSchema even on errors). */
export function errorResult(e: unknown): CallToolResult {
  const err = toLoupeError(e);
  return { content: [{ type: 'text', text: JSON.stringify(err.toJSON()) }], isError: true };
}

function resultName(r: StoredResult): string {
  const prompt =
    r.prompt === undefined ? '' : ` ${JSON.stringify(r.prompt.length > 60 ? r.prompt.slice(0, 57) + '…' : r.prompt)}`;
  return `${r.operation}${r.model ? ` · ${r.model}` : ''}${prompt}`;
}

export class ResultStore {
  private items = new Map<string, StoredResult>();
  private bytes = 0;

  constructor(
    private readonly maxCount = RESULTS_PER_SESSION,
    private readonly maxBytes = RESULT_BYTES_PER_SESSION,
  ) {}

  /** Keep a document; the oldest go first while the store is over its count or bytes. */
  add(operation: string, document: unknown, link?: string): StoredResult {
    const json = JSON.stringify(document);
    const d = document as { model?: { id?: unknown }; prompt?: unknown; clean_prompt?: unknown } | null;
    const prompt =
      typeof d?.prompt === 'string' ? d.prompt : typeof d?.clean_prompt === 'string' ? d.clean_prompt : undefined;
    const r: StoredResult = {
      uri: RESULT_URI_PREFIX + randomHex(16),
      operation,
      model: typeof d?.model?.id === 'string' ? d.model.id : undefined,
      prompt,
      link,
      created: Date.now(),
      json,
    };
    this.items.set(r.uri, r);
    this.bytes += json.length;
    for (const [uri, old] of this.items) {
      if (this.items.size <= 1 || (this.items.size <= this.maxCount && this.bytes <= this.maxBytes)) break;
      this.items.delete(uri);
      this.bytes -= old.json.length;
    }
    return r;
  }

  list(): StoredResult[] {
    return [...this.items.values()];
  }

  /** The stored result at `uri`, or HANDLE_EXPIRED. */
  get(uri: string): StoredResult {
    const id = typeof uri === 'string' && uri.startsWith(RESULT_URI_PREFIX) ? uri.slice(RESULT_URI_PREFIX.length) : '';
    const r = RESULT_ID.test(id) ? this.items.get(uri) : undefined;
    if (!r)
      throw new LoupeError(
        'HANDLE_EXPIRED',
        `${String(uri).slice(0, 200)} is not a result of this session: it was evicted (a session ` +
          `keeps its latest ${this.maxCount}), its companion restarted, or another client made it.`,
        'Run the operation again to make a new one.',
      );
    return r;
  }

  clear(): void {
    this.items.clear();
    this.bytes = 0;
  }

  /** The MCP resource entry of a result (resources/list). */
  static entry(r: StoredResult): Record<string, unknown> {
    return {
      uri: r.uri,
      name: resultName(r),
      title: resultName(r),
      description:
        `${r.operation} document${r.model ? ` of ${r.model}` : ''}${r.prompt !== undefined ? ` on ${JSON.stringify(r.prompt.slice(0, 200))}` : ''}, ` +
        `made ${new Date(r.created).toISOString()}.`,
      mimeType: 'application/json',
      size: r.json.length,
      _meta: {
        'loupe/operation': r.operation,
        ...(r.model ? { 'loupe/model': r.model } : {}),
        ...(r.prompt !== undefined ? { 'loupe/prompt': r.prompt.slice(0, 2000) } : {}),
        ...(r.link ? { 'loupe/link': r.link } : {}),
        'loupe/created': new Date(r.created).toISOString(),
      },
    };
  }
}
