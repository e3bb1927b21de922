/**
 * Raw loopback HTTP/WebSocket pokes for the hardening tests: requests written byte for byte on a
 * TCP socket (so headers can hold any byte 0–255, which Node's HTTP client refuses to send), and
 * hand-built WebSocket frames (masked or not, any opcode, any declared length).
 */
import { randomBytes } from 'node:crypto';
import net from 'node:net';

export interface RawReply {
  /** HTTP status of the reply, 0 when the socket closed without one */
  status: number;
  /** the open socket after a 101, for sending frames; destroyed otherwise */
  socket?: net.Socket;
  head: string;
}

/** Write `lines` (request line + headers, as latin1 bytes) and read the status line. */
export function rawRequest(port: number, head: Buffer | string, timeoutMs = 5000): Promise<RawReply> {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1');
    let buf = Buffer.alloc(0);
    let done = false;
    const finish = (r: RawReply) => {
      if (done) return;
      done = true;
      clearTimeout(t);
      if (!r.socket) s.destroy();
      resolve(r);
    };
    const t = setTimeout(() => finish({ status: -1, head: 'timeout' }), timeoutMs);
    s.on('error', () => finish({ status: 0, head: buf.toString('latin1') }));
    s.on('close', () => finish({ status: 0, head: buf.toString('latin1') }));
    s.on('data', (c) => {
      buf = Buffer.concat([buf, c]);
      const end = buf.indexOf('\r\n\r\n');
      if (end < 0) return;
      const text = buf.subarray(0, end).toString('latin1');
      const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(text)?.[1] ?? 0);
      if (status === 101) {
        s.removeAllListeners('data');
        s.on('error', () => undefined);
        finish({ status, socket: s, head: text });
      } else finish({ status, head: text });
    });
    s.write(typeof head === 'string' ? Buffer.from(head, 'latin1') : head);
  });
}

/** An upgrade request with these header values (latin1: one byte per char) and a fresh key. */
export function upgradeHead(pathname: string, headers: Record<string, string | undefined>): Buffer {
  const h: Record<string, string | undefined> = {
    Connection: 'Upgrade',
    Upgrade: 'websocket',
    'Sec-WebSocket-Version': '13',
    'Sec-WebSocket-Key': randomBytes(16).toString('base64'),
    ...headers,
  };
  let out = `GET ${pathname} HTTP/1.1\r\n`;
  for (const [k, v] of Object.entries(h)) if (v !== undefined) out += `${k}: ${v}\r\n`;
  return Buffer.from(out + '\r\n', 'latin1');
}

/** One WebSocket frame. Clients must mask; `mask: false` makes a protocol violation on purpose. */
export function frame(
  opcode: number,
  payload: Buffer,
  o: { fin?: boolean; mask?: boolean; rsv?: number; declaredLength?: number } = {},
): Buffer {
  const fin = o.fin ?? true;
  const mask = o.mask ?? true;
  const len = o.declaredLength ?? payload.length;
  const b0 = (fin ? 0x80 : 0) | ((o.rsv ?? 0) << 4) | (opcode & 0x0f);
  let hdr: Buffer;
  if (len < 126) hdr = Buffer.from([b0, (mask ? 0x80 : 0) | len]);
  else if (len < 65536) {
    hdr = Buffer.alloc(4);
    hdr[0] = b0;
    hdr[1] = (mask ? 0x80 : 0) | 126;
    hdr.writeUInt16BE(len, 2);
  } else {
    hdr = Buffer.alloc(10);
    hdr[0] = b0;
    hdr[1] = (mask ? 0x80 : 0) | 127;
    hdr.writeBigUInt64BE(BigInt(len), 2);
  }
  if (!mask) return Buffer.concat([hdr, payload]);
  const key = randomBytes(4);
  const body = Buffer.from(payload);
  for (let i = 0; i < body.length; i++) body[i] ^= key[i & 3];
  return Buffer.concat([hdr, key, body]);
}

export const textFrame = (s: string, o?: Parameters<typeof frame>[2]) => frame(0x1, Buffer.from(s, 'utf8'), o);
