/**
 * What the MCP server needs from whatever runs the tools: the paired page (through the hub this
 * companion owns, or through another companion's hub) or the engine in this process (headless).
 */
import type { CallOptions, ExecResult } from './page-connection';
import type { AgentInfo } from './protocol';

export type { CallOptions, ExecResult };

export interface Executor {
  readonly mode: 'page' | 'headless';
  /** A JSON object describing where tools run now (merged into loupe_status). */
  status(): Promise<Record<string, unknown>>;
  /** Run one tool (an operation, load_model or list_models). Rejects with a LoupeError. */
  execute(tool: string, args: Record<string, unknown>, o: CallOptions): Promise<ExecResult>;
  /** The instance whose handles are valid now (the paired page's, or this process's). */
  currentInstance(): Promise<string | undefined>;
  /** The MCP client's name, shown in the page's live log. */
  setAgent(agent: AgentInfo): void;
  close(): Promise<void>;
}
