/**
 * The hub's side of one paired page: sends calls, relays progress, and guarantees that every
 * call ends — with the page's result or error, or with PAGE_GONE when the socket closes or the
 * page stops answering heartbeats, DEADLINE_EXCEEDED at the call's hard deadline, or CANCELLED
 * when the caller's signal aborts. In the last two cases the page is told to `cancel`.
 */
import type WebSocket from 'ws';
import { LoupeError } from '../engine/errors';
import type { Progress } from '../ops/types';
import {
  CLOSE_POLICY,
  type AgentInfo,
  type HelloMsg,
  type HubToPage,
  type ResultMsg,
  type WireModel,
  parseMessage,
} from './protocol';
import { randomHex } from '../ops/lib/handles';
import { startHeartbeat, type Heartbeat } from './heartbeat';
import { PendingCalls } from './pending-calls';
import { callCancelled } from './call-errors';

export interface ExecResult {
  document: unknown;
  link?: string;
  /** the page (or process) instance that produced it; handles in the document belong to it */
  instance_id?: string;
  /** the model it ran on (ModelInfo, plus the page's share `ref`), for the result's link */
  model?: WireModel;
}

/** a result message's document and link, from `instance_id`'s page running `model` */
export const execResult = (m: ResultMsg, instance_id?: string, model?: WireModel): ExecResult => ({
  document: m.document,
  link: m.link,
  instance_id,
  model,
});

export interface CallOptions {
  /** epoch ms */
  deadline: number;
  agent?: AgentInfo;
  onProgress?: (p: Progress) => void;
  signal?: AbortSignal;
}

export interface PageSessionOptions {
  heartbeatMs: number;
  /** drop the page after this many heartbeat intervals without hearing from it */
  missedBeats: number;
  onGone(session: PageConnection): void;
  onModel?(session: PageConnection): void;
  log?(msg: string): void;
}

export class PageConnection {
  readonly tabId: string;
  readonly instanceId: string;
  readonly connectedAt = Date.now();
  model: WireModel;
  private pending = new PendingCalls<ExecResult>();
  private beat: Heartbeat;
  private gone = false;

  constructor(
    private ws: WebSocket,
    hello: HelloMsg,
    private opts: PageSessionOptions,
  ) {
    this.tabId = hello.tab_id;
    this.instanceId = hello.instance_id;
    this.model = hello.model;
    ws.on('message', (data, isBinary) => {
      try {
        this.onMessage(isBinary ? '' : data.toString());
      } catch (e) {
        // Catch-all: a message that breaks its handler drops this page, never the companion.
        opts.log?.(`page ${this.tabId}: dropped after a message failed: ${(e as Error)?.message ?? String(e)}`);
        this.end('PAGE_GONE', 'The Loupe page sent a message the companion could not handle.');
        ws.terminate();
      }
    });
    ws.on('close', () => this.end('PAGE_GONE', 'The Loupe page closed or reloaded while the call was running.'));
    ws.on('error', () => this.end('PAGE_GONE', 'The connection to the Loupe page failed.'));
    this.beat = startHeartbeat({
      intervalMs: opts.heartbeatMs,
      silenceMs: opts.heartbeatMs * opts.missedBeats,
      ping: () => this.send({ type: 'ping', t: Date.now() }),
      onSilent: () => {
        opts.log?.(`page ${this.tabId}/${this.instanceId} missed ${opts.missedBeats} heartbeats; dropping it`);
        this.end('PAGE_GONE', 'The Loupe page stopped answering (it may be frozen or its tab suspended).');
        ws.terminate();
      },
    });
  }

  get alive(): boolean {
    return !this.gone;
  }

  get pendingCount(): number {
    return this.pending.size;
  }

  send(msg: HubToPage): void {
    if (!this.gone && this.ws.readyState === this.ws.OPEN) this.ws.send(JSON.stringify(msg));
  }

  call(tool: string, args: Record<string, unknown>, o: CallOptions): Promise<ExecResult> {
    if (this.gone) return Promise.reject(new LoupeError('PAGE_GONE', 'The Loupe page is no longer connected.'));
    if (o.signal?.aborted) return Promise.reject(callCancelled());
    const id = 'c' + randomHex(8);
    const remaining = Math.max(0, o.deadline - Date.now());
    const done = this.pending.open(id, {
      timeoutMs: remaining,
      signal: o.signal,
      onProgress: o.onProgress,
      onDeadline: () => {
        this.send({ type: 'cancel', id, reason: 'deadline' });
        return new LoupeError(
          'DEADLINE_EXCEEDED',
          `${tool} did not finish within its deadline (${Math.round(remaining / 1000)} s).`,
          'Use smaller inputs, or for long operations pass as_job: true and poll job_status.',
        );
      },
      onCancel: () => {
        this.send({ type: 'cancel', id, reason: 'client' });
        return callCancelled();
      },
    });
    this.send({ type: 'call', id, tool, args, deadline: o.deadline, ...(o.agent ? { agent: o.agent } : {}) });
    return done;
  }

  /** Fail every pending call at once and stop; used on close, heartbeat loss and replacement. */
  end(code: 'PAGE_GONE', message: string): void {
    if (this.gone) return;
    this.gone = true;
    this.beat.stop();
    const err = new LoupeError(
      code,
      message,
      'Open the pairing URL (see loupe_status) or reload the Loupe tab, then call again.',
    );
    this.pending.failAll(err);
    this.opts.onGone(this);
  }

  close(reason: string): void {
    this.send({ type: 'bye', reason });
    this.end('PAGE_GONE', `The Loupe page was disconnected: ${reason}.`);
    this.ws.close(CLOSE_POLICY, reason.slice(0, 120));
  }

  private onMessage(text: string): void {
    this.beat.heard();
    const m = parseMessage(text);
    if (!m) {
      this.opts.log?.(`page ${this.tabId}: ignoring a malformed message`);
      return;
    }
    switch (m.type) {
      case 'ping':
        return this.send({ type: 'pong', t: m.t });
      case 'pong':
        return;
      case 'model':
        this.model = m.model;
        this.opts.onModel?.(this);
        return;
      case 'progress':
      case 'result':
      case 'error':
        return this.pending.reply(m, (r) => execResult(r, this.instanceId, this.model));
      default:
        this.opts.log?.(`page ${this.tabId}: unexpected ${m.type} message`);
    }
  }
}
