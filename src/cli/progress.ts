/**
 * Progress lines on stderr. On a terminal each message overwrites the last in place. Elsewhere (a
 * log file, a pipe, CI) every line stays, so they are throttled: a line when a stage begins, when
 * it finishes (done = total, 100%), and at most one per `everyMs` between — not one per pair per
 * stage (64 pairs of edge_attribution printed about 200).
 */
export interface ProgressOptions {
  quiet: boolean;
  tty: boolean;
  everyMs?: number;
  now?: () => number;
}

/** the counter at a message's end ("… 12/64", "… 40%"): the stage is what is left */
const COUNTER = /\s*(\d+)(?:\/(\d+)|(\.\d+)?%)$/;

export function progressPrinter(write: (s: string) => void, o: ProgressOptions): (msg: string) => void {
  const every = o.everyMs ?? 2000;
  const now = o.now ?? Date.now;
  let last = '';
  let lastStage: string | null = null;
  let lastAt = -Infinity;
  return (msg: string) => {
    if (o.quiet || msg === last) return;
    last = msg;
    if (o.tty) {
      write(`\r\x1b[2K${msg}`);
      return;
    }
    const m = COUNTER.exec(msg);
    const stage = m ? msg.slice(0, m.index) : msg;
    const finished = !!m && (m[2] !== undefined ? m[1] === m[2] : msg.endsWith('100%'));
    const t = now();
    if (stage !== lastStage || finished || t - lastAt >= every) {
      write(`${msg}\n`);
      lastStage = stage;
      lastAt = t;
    }
  };
}
