/**
 * The companion's stdin, cut into JSON-RPC lines before the SDK's stdio transport sees them.
 *
 * The SDK's transport drops a line it cannot parse or validate without answering (a request
 * whose id is readable then waits forever), and closes itself — ending the companion — when one
 * line exceeds its 10 MiB buffer. Here every line is checked first: a valid message passes on
 * unchanged; an invalid one that carries an id gets a JSON-RPC error reply (-32700 parse error,
 * -32600 invalid request); a line over `maxLineBytes` is discarded up to its newline and
 * answered the same way. Nothing a client writes can end the process.
 */
import { PassThrough, type Readable, type Writable } from 'node:stream';
import { parseJSONRPCMessage } from '@modelcontextprotocol/server';

/** the longest message accepted (a request can carry a long prompt list; documents go out, not in) */
export const MAX_LINE_BYTES = 64 * 1024 * 1024;
/** what the SDK transport's own line buffer must hold: one line at the limit, and some more */
export const TRANSPORT_BUFFER_BYTES = MAX_LINE_BYTES + 1024 * 1024;

export interface LineGuardOptions {
  maxLineBytes?: number;
  log?: (msg: string) => void;
}

/** Returns the stream to hand to StdioServerTransport as its stdin. */
export function guardStdin(input: Readable, output: Writable, o: LineGuardOptions = {}): PassThrough {
  const max = o.maxLineBytes ?? MAX_LINE_BYTES;
  const out = new PassThrough();
  let parts: Buffer[] = [];
  let size = 0;
  let discarding = false;
  const reply = (id: unknown, code: number, message: string) => {
    if (typeof id !== 'string' && typeof id !== 'number') {
      o.log?.(`ignored a stdin line: ${message}`);
      return;
    }
    output.write(JSON.stringify({ jsonrpc: '2.0', id, error: { code, message } }) + '\n');
  };
  const line = (buf: Buffer) => {
    const text = buf.toString('utf8').replace(/\r$/, '');
    if (text.trim() === '') return;
    let msg: unknown;
    try {
      msg = JSON.parse(text);
    } catch {
      // Not JSON: an id may still be readable; answer it rather than leave the caller waiting.
      const id = /"id"\s*:\s*(\d{1,15}|"[^"\\]{0,200}")/.exec(text.slice(0, 4096))?.[1];
      return reply(id === undefined ? undefined : JSON.parse(id), -32700, 'Parse error: the line is not valid JSON.');
    }
    let valid = true;
    try {
      parseJSONRPCMessage(msg);
    } catch {
      valid = false;
    }
    if (!valid)
      return reply(
        (msg as { id?: unknown } | null)?.id,
        -32600,
        'Invalid Request: not a JSON-RPC 2.0 message the server understands.',
      );
    out.write(text + '\n');
  };
  input.on('data', (chunk: Buffer) => {
    let start = 0;
    for (let i = chunk.indexOf(10); i >= 0; i = chunk.indexOf(10, start)) {
      const piece = chunk.subarray(start, i);
      start = i + 1;
      if (discarding) {
        discarding = false;
        parts = [];
        size = 0;
        continue;
      }
      parts.push(piece);
      const whole = Buffer.concat(parts);
      parts = [];
      size = 0;
      try {
        line(whole);
      } catch (e) {
        o.log?.(`dropped a stdin line: ${(e as Error).message}`);
      }
    }
    if (start < chunk.length && !discarding) {
      const rest = chunk.subarray(start);
      size += rest.length;
      if (size > max) {
        const head = Buffer.concat([...parts, rest])
          .subarray(0, 4096)
          .toString('utf8');
        const id = /"id"\s*:\s*(\d{1,15}|"[^"\\]{0,200}")/.exec(head)?.[1];
        reply(
          id === undefined ? undefined : JSON.parse(id),
          -32600,
          `Invalid Request: the message is larger than ${max} bytes.`,
        );
        discarding = true;
        parts = [];
        size = 0;
      } else parts.push(rest);
    }
  });
  input.on('end', () => out.end());
  input.on('close', () => out.destroy());
  input.on('error', (e) => out.destroy(e));
  return out;
}
