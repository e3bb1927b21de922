/**
 * What crosses between JavaScript and the runtime's device, counted at the one place every session
 * run goes through (EngineModel wraps each variant's session). A feed held in JS memory is bytes
 * written; an output handed back in JS memory is bytes read; a tensor already on the device (a
 * 'gpu-buffer' feed, an output kept there) crosses nothing and is counted apart. On WebGPU this is
 * the traffic between host and GPU; on the CPU backends (node, wasm) the same count is what passes
 * between JS and onnxruntime's memory (onnxruntime-node wraps a feed's bytes without a copy,
 * onnxruntime-web copies it into its heap; both copy outputs out). Nodes the WebGPU provider left to
 * the CPU come from onnxruntime's profiler (src/node/device-session.ts) where the session says.
 */
import type { TransferCounts } from '../api';
import type { EngineSession, OrtTensorLike, Placement } from './ort-session';

export type { TransferCounts };

export const onDevice = (t: OrtTensorLike): boolean => {
  const loc = (t as { location?: string }).location;
  return loc !== undefined && loc !== 'cpu' && loc !== 'cpu-pinned';
};

/** bytes of a tensor held in JS (0 for one on the device) */
export function hostBytes(t: OrtTensorLike): number {
  if (onDevice(t)) return 0;
  const d = t.data as { byteLength?: number } | unknown[];
  if (Array.isArray(d)) return d.length * 8;
  return (d as { byteLength?: number })?.byteLength ?? 0;
}

export class TransferCounter {
  private c: Omit<TransferCounts, 'off_device_nodes' | 'off_device_ops'> = {
    runs: 0,
    written_bytes: 0,
    read_bytes: 0,
    device_feeds: 0,
    device_outputs: 0,
  };
  /** placement by session, while it is live */
  private readonly placed = new Map<EngineSession, Placement>();

  record(feeds: Record<string, OrtTensorLike>, out: Record<string, OrtTensorLike>): void {
    this.c.runs++;
    for (const t of Object.values(feeds)) {
      if (onDevice(t)) this.c.device_feeds++;
      else this.c.written_bytes += hostBytes(t);
    }
    for (const t of Object.values(out)) {
      if (onDevice(t)) this.c.device_outputs++;
      else this.c.read_bytes += hostBytes(t);
    }
  }

  /** a tensor copied to the device once (SessionFactory.upload), outside any counted run: its bytes written */
  uploaded(t: OrtTensorLike): void {
    this.c.written_bytes += hostBytes(t);
  }

  counts(): TransferCounts {
    const r: TransferCounts = { ...this.c };
    if (this.placed.size) {
      r.off_device_nodes = 0;
      r.off_device_ops = {};
      for (const p of this.placed.values()) {
        r.off_device_nodes += p.offDevice;
        for (const [op, n] of Object.entries(p.ops)) r.off_device_ops[op] = (r.off_device_ops[op] ?? 0) + n;
      }
    }
    return r;
  }

  /** A session whose runs (and, where it reports one, placement) this counter counts. */
  wrap(session: EngineSession): EngineSession {
    const counted: EngineSession = {
      ...session,
      run: async (feeds, fetches, opts) => {
        const out = await session.run(feeds, fetches, opts);
        this.record(feeds, out);
        const p = session.placement?.();
        if (p) this.placed.set(counted, p);
        return out;
      },
      release: async () => {
        this.placed.delete(counted);
        await session.release();
      },
    };
    return counted;
  }
}
