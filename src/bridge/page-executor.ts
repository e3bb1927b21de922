/**
 * Page mode: tools run in the paired browser page. This companion either owns the hub on the
 * port, or — when another `loupe mcp` already serves a Loupe hub there — forwards its calls to
 * that hub. If the owning companion exits, a forwarder takes the port over (new token, new
 * pairing URL printed to stderr), so the remaining agents keep working once the page re-pairs.
 */
import { LoupeError } from '../engine/errors';
import type { Executor } from './executor';
import { ForwardClient, probeHub } from './forward';
import { Hub, type HubOptions } from './hub';
import type { CallOptions, ExecResult } from './page-connection';
import type { AgentInfo } from './protocol';
import {
  ensureConfigDir,
  newToken,
  readHubRecord,
  removeHubRecord,
  removeHubRecordSync,
  removeStaleHubRecords,
  writeHubRecord,
} from './token';

export interface PageExecutorOptions extends Omit<HubOptions, 'token'> {
  log: (msg: string) => void;
  /** where the token file lives (tests); default the user's config dir */
  configDir?: string;
  /** own the port or fail (loupe mcp --http serves its endpoint there): never forward to another hub */
  ownPort?: boolean;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export class PageExecutor implements Executor {
  readonly mode = 'page' as const;
  private hub?: Hub;
  private fwd?: ForwardClient;
  private ready: Promise<void>;
  private agent: AgentInfo = { name: 'unknown agent' };
  private closed = false;
  private onExit?: () => void;

  constructor(private o: PageExecutorOptions) {
    this.ready = this.establish();
  }

  /** Resolves once this companion owns a hub or is attached to one; rejects if neither is possible. */
  started(): Promise<void> {
    return this.ready;
  }

  get role(): 'hub' | 'forwarding' | 'starting' {
    return this.hub ? 'hub' : this.fwd?.alive ? 'forwarding' : 'starting';
  }

  /** The port tools are served on (the real one when started with port 0). */
  get port(): number {
    return this.hub?.port ?? this.fwd?.port ?? this.o.port;
  }

  /** The hub this companion owns (undefined when forwarding). */
  get ownHub(): Hub | undefined {
    return this.hub;
  }

  setAgent(agent: AgentInfo): void {
    this.agent = agent;
    this.hub?.setLocalAgent(agent);
    this.fwd?.setAgent(agent);
  }

  async status(): Promise<Record<string, unknown>> {
    await this.ensure();
    if (this.hub) return { role: 'hub', ...this.hub.status() };
    const s = await this.fwd!.status();
    return { role: 'forwarding', ...s };
  }

  async execute(tool: string, args: Record<string, unknown>, o: CallOptions): Promise<ExecResult> {
    await this.ensure();
    if (this.hub) return this.hub.execute(tool, args, { ...o, agent: o.agent ?? this.agent });
    return this.fwd!.call(tool, args, o);
  }

  async currentInstance(): Promise<string | undefined> {
    await this.ensure();
    if (this.hub) return this.hub.activePage?.instanceId;
    const s = (await this.fwd!.status()) as { page?: { instance_id?: string } | null };
    return s.page?.instance_id;
  }

  async close(): Promise<void> {
    this.closed = true;
    this.fwd?.close();
    if (this.onExit) process.off('exit', this.onExit);
    if (this.hub) {
      await removeHubRecord(this.hub.port, this.hub.token, this.o.configDir);
      await this.hub.close();
    }
  }

  private async ensure(): Promise<void> {
    await this.ready;
    if (!this.hub && !this.fwd?.alive && !this.closed) {
      this.ready = this.establish();
      await this.ready;
    }
  }

  private async establish(): Promise<void> {
    this.fwd = undefined;
    if (this.o.port !== 0) {
      // Refuse an unsafe config folder before listening (CONFIG_UNSAFE), and clear the records
      // of companions that died without removing theirs (SIGKILL, power loss).
      await ensureConfigDir(this.o.configDir);
      const stale = await removeStaleHubRecords(this.o.configDir);
      if (stale.length) this.o.log(`removed stale hub records of exited companions: ${stale.join(', ')}`);
    }
    for (let attempt = 0; ; attempt++) {
      try {
        const token = newToken();
        const hub = await Hub.start({ ...this.o, token });
        hub.setLocalAgent(this.agent);
        if (this.o.port !== 0) {
          try {
            await writeHubRecord(
              { port: hub.port, pid: process.pid, token, started_at: new Date().toISOString() },
              this.o.configDir,
            );
          } catch (e) {
            await hub.close();
            throw e;
          }
          // Remove the record however this process ends, a crash included ('exit' runs then too).
          this.onExit = () => removeHubRecordSync(hub.port, token, this.o.configDir);
          process.once('exit', this.onExit);
        }
        this.hub = hub;
        this.o.log(`Loupe hub on ${hub.origin}/ — to pair the page, open:\n  ${hub.pairingUrl}`);
        return;
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== 'EADDRINUSE') throw e;
      }
      // Someone holds the port. Forward to it if it is a Loupe hub; never talk to anything else.
      const probe = await probeHub(this.o.port);
      if (probe && this.o.ownPort)
        throw new LoupeError(
          'BAD_INPUT',
          `Port ${this.o.port} is served by another loupe mcp (pid ${probe.pid}); an HTTP companion must own its port.`,
          'Stop the other companion (its clients can connect to this one by URL instead), or pass another --port.',
        );
      if (!probe) {
        if (attempt < 2) {
          await sleep(300); // the holder may be a hub that is just shutting down
          continue;
        }
        throw new LoupeError(
          'NO_PAGE',
          `Port ${this.o.port} on 127.0.0.1 is used by a program that is not a Loupe hub.`,
          'Stop that program, or start loupe mcp with --port N (and use the same port for every client).',
        );
      }
      // The hub writes its token file right after it starts listening: allow it a moment.
      for (let i = 0; i < 20; i++) {
        const rec = await readHubRecord(this.o.port, this.o.configDir);
        if (rec) {
          try {
            const fwd = await ForwardClient.connect(this.o.port, rec.token, this.agent, {
              heartbeatMs: this.o.heartbeatMs,
            });
            fwd.onClose = () => this.onForwardClosed();
            this.fwd = fwd;
            this.o.log(
              `Loupe hub already running on 127.0.0.1:${this.o.port} (pid ${probe.pid}); this companion forwards its calls to it.`,
            );
            return;
          } catch {
            /* a stale file from a previous hub: wait for the new one */
          }
        }
        await sleep(150);
      }
      if (attempt >= 2)
        throw new LoupeError(
          'NO_PAGE',
          `A Loupe hub runs on port ${this.o.port} but its token file could not be read or was refused.`,
          'Stop the other loupe mcp, or start this one with another --port.',
        );
    }
  }

  private onForwardClosed(): void {
    if (this.closed) return;
    this.o.log('the Loupe hub this companion was forwarding to went away; taking over');
    // Jitter, so that several forwarders do not all race for the port at once.
    this.ready = sleep(50 + Math.random() * 250)
      .then(() => this.establish())
      .catch((e) => {
        this.o.log(`could not take over the hub: ${(e as Error).message}`);
      });
  }
}
