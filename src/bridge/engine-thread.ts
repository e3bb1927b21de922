/**
 * The headless companion's engine, in a worker thread of its own (headless-engine.ts starts it):
 * a HeadlessExecutor driven by messages, so that model work — a tokenizer's regex, a template, a
 * forward — never blocks the companion's thread, where the deadline timers and loupe_status run.
 *
 * In:  {t: 'exec', id, tool, args, deadline} · {t: 'cancel', id} · {t: 'close'}
 * Out: {t: 'progress', id, p} · {t: 'done', id, result} · {t: 'fail', id, error} ·
 *      {t: 'status', status} (after each call) · {t: 'log', msg} · {t: 'closed'}
 */
import { parentPort, workerData } from 'node:worker_threads';
import { toLoupeError } from '../engine/errors';
import { HeadlessExecutor } from './headless';
import type { LocalAccess } from '../node/local-access';
import type { NodeBackend } from '../node/backends';

export interface EngineThreadData {
  instanceId: string;
  backend?: NodeBackend;
  model?: string;
  local: LocalAccess;
}

export type ToThread =
  | { t: 'exec'; id: number; tool: string; args: Record<string, unknown>; deadline: number }
  | { t: 'cancel'; id: number }
  | { t: 'close' };

export type FromThread =
  | { t: 'progress'; id: number; p: unknown }
  | { t: 'done'; id: number; result: unknown }
  | { t: 'fail'; id: number; error: unknown }
  | { t: 'status'; status: Record<string, unknown> }
  | { t: 'log'; msg: string }
  | { t: 'closed' };

const port = parentPort!;
const data = workerData as EngineThreadData;
const post = (m: FromThread) => port.postMessage(m);
const executor = new HeadlessExecutor({
  instanceId: data.instanceId,
  backend: data.backend,
  model: data.model,
  local: data.local,
  log: (msg) => post({ t: 'log', msg }),
});
const running = new Map<number, AbortController>();

port.on('message', (m: ToThread) => {
  if (m.t === 'cancel') running.get(m.id)?.abort();
  else if (m.t === 'close') void executor.close().finally(() => post({ t: 'closed' }));
  else if (m.t === 'exec') {
    const ctl = new AbortController();
    running.set(m.id, ctl);
    executor
      .execute(m.tool, m.args, {
        deadline: m.deadline,
        signal: ctl.signal,
        onProgress: (p) => post({ t: 'progress', id: m.id, p }),
      })
      .then(
        (result) => post({ t: 'done', id: m.id, result }),
        (e) => post({ t: 'fail', id: m.id, error: toLoupeError(e).toJSON() }),
      )
      .finally(async () => {
        running.delete(m.id);
        post({ t: 'status', status: await executor.status() });
      });
  }
});
