/**
 * Turning documents and errors into MCP tool results, and keeping trace documents readable as
 * resources (`loupe://trace/{id}`) while the page instance that made them is still the paired
 * one. The id is a handle minted with that instance's id, so a reload expires it.
 */
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { LoupeError, toLoupeError } from '../engine/errors';
import { mintHandle, parseHandle } from '../ops/lib/handles';

export const TRACE_URI_PREFIX = 'loupe://trace/';
export const TRACE_URI_TEMPLATE = 'loupe://trace/{id}';

export function okResult(document: unknown, extra: { link?: string; resourceUri?: string } = {}): CallToolResult {
  const content: CallToolResult['content'] = [{ type: 'text', text: JSON.stringify(document) }];
  if (extra.link)
    content.push({
      type: 'text',
      text: `Shareable link (opens this result in the Loupe workbench and re-runs it locally): ${extra.link}`,
    });
  if (extra.resourceUri)
    content.push({
      type: 'resource_link',
      uri: extra.resourceUri,
      name: extra.resourceUri.slice('loupe://'.length),
      mimeType: 'application/json',
      description: 'This trace document, readable while the page that made it stays open.',
    });
  const meta: Record<string, unknown> = {};
  if (extra.link) meta['loupe/link'] = extra.link;
  if (extra.resourceUri) meta['loupe/resource'] = extra.resourceUri;
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

export class TraceResources {
  private docs = new Map<string, { document: unknown; created: number; prompt?: string }>();

  constructor(private limit = 50) {}

  /** Keep a trace; returns its resource URI. */
  add(document: unknown, instanceId: string): string {
    const id = mintHandle('trace', instanceId);
    const prompt = (document as { prompt?: unknown })?.prompt;
    this.docs.set(id, { document, created: Date.now(), prompt: typeof prompt === 'string' ? prompt : undefined });
    while (this.docs.size > this.limit) this.docs.delete(this.docs.keys().next().value as string);
    return TRACE_URI_PREFIX + id;
  }

  list(currentInstance: string | undefined): { uri: string; name: string; description?: string; mimeType: string }[] {
    this.dropStale(currentInstance);
    return [...this.docs.entries()].map(([id, d]) => ({
      uri: TRACE_URI_PREFIX + id,
      name: `trace ${id}`,
      ...(d.prompt !== undefined
        ? { description: `trace of ${JSON.stringify(d.prompt.slice(0, 80))} at ${new Date(d.created).toISOString()}` }
        : {}),
      mimeType: 'application/json',
    }));
  }

  read(uri: string, currentInstance: string | undefined): unknown {
    this.dropStale(currentInstance);
    const id = uri.startsWith(TRACE_URI_PREFIX) ? uri.slice(TRACE_URI_PREFIX.length) : '';
    const d = this.docs.get(id);
    if (!d) {
      throw new LoupeError(
        'HANDLE_EXPIRED',
        `${uri} is not available: the page that made it has reloaded or closed, or it was evicted.`,
        'Call trace again to make a new one.',
      );
    }
    return d.document;
  }

  /** Forget traces made by a page instance that is no longer the paired one. */
  private dropStale(currentInstance: string | undefined): void {
    for (const id of [...this.docs.keys()]) if (parseHandle(id)?.instance !== currentInstance) this.docs.delete(id);
  }
}
