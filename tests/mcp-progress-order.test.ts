/**
 * Progress sent just before a tool's result must reach the client's `onprogress`, even when both
 * arrive in one read (as stdio delivers them under load). The linked pair here delivers what one
 * side sends within one macrotask as one chunk, synchronously in order, as the SDK's stdio
 * transport does with the lines of one chunk.
 */
import { Client, type JSONRPCMessage, type Transport } from '@modelcontextprotocol/client';
import { Server } from '@modelcontextprotocol/server';
import { describe, expect, it } from 'vitest';
import { OrderedClient } from './helpers/mcp-client';

class ChunkedEnd implements Transport {
  peer!: ChunkedEnd;
  onmessage?: (m: JSONRPCMessage) => void;
  onclose?: () => void;
  onerror?: (e: Error) => void;
  private queue: JSONRPCMessage[] = [];
  async start(): Promise<void> {}
  async send(m: JSONRPCMessage): Promise<void> {
    const peer = this.peer;
    if (peer.queue.push(m) === 1)
      setImmediate(() => {
        const chunk = peer.queue.splice(0);
        for (const msg of chunk) peer.onmessage?.(msg);
      });
  }
  async close(): Promise<void> {
    this.onclose?.();
  }
}

function chunkedPair(): [ChunkedEnd, ChunkedEnd] {
  const a = new ChunkedEnd();
  const b = new ChunkedEnd();
  a.peer = b;
  b.peer = a;
  return [a, b];
}

async function progressSeen(client: Client): Promise<{ seen: number[]; errors: string[] }> {
  const server = new Server({ name: 'progress-order', version: '1' }, { capabilities: { tools: {} } });
  server.setRequestHandler('tools/list', async () => ({
    tools: [{ name: 'count', inputSchema: { type: 'object' as const } }],
  }));
  server.setRequestHandler('tools/call', async (req, ctx) => {
    const token = req.params._meta?.progressToken;
    for (let i = 1; i <= 3; i++)
      if (token !== undefined)
        void ctx.mcpReq.notify({
          method: 'notifications/progress',
          params: { progressToken: token, progress: i, total: 3 },
        });
    return { content: [{ type: 'text' as const, text: 'done' }] };
  });
  const [c, s] = chunkedPair();
  await server.connect(s);
  await client.connect(c);
  const seen: number[] = [];
  const errors: string[] = [];
  client.onerror = (e) => void errors.push(e.message);
  const r = await client.callTool({ name: 'count', arguments: {} }, { onprogress: (p) => void seen.push(p.progress) });
  expect(r.isError).toBeFalsy();
  await new Promise((r) => setTimeout(r, 20));
  await client.close();
  await server.close();
  return { seen, errors };
}

describe('progress sent before the result, delivered in the same chunk', () => {
  it('reaches onprogress in order with OrderedClient', async () => {
    expect(await progressSeen(new OrderedClient({ name: 't', version: '1' }))).toEqual({ seen: [1, 2, 3], errors: [] });
  });

  it("is lost by the SDK's plain Client (the cause; when this fails, the SDK orders them and OrderedClient can go)", async () => {
    const { seen, errors } = await progressSeen(new Client({ name: 't', version: '1' }));
    expect(seen).toEqual([]);
    expect(errors).toHaveLength(3);
    for (const e of errors) expect(e).toMatch(/progress notification for an unknown token/);
  });
});
