/**
 * What the MCP server needs from whatever runs the tools: the paired page (through the hub this
 * companion owns, or through another companion's hub) or the engine in this process (headless).
 */
import type { CallOptions, ExecResult } from './page-connection';
import type { AgentInfo } from './protocol';
import { LoupeError } from '../engine/errors';

export type { CallOptions, ExecResult };

/** why a call failed when its client cancelled it */
export function callCancelled(): LoupeError {
  return new LoupeError('CANCELLED', 'The call was cancelled by the client.');
}

/** why a call run in this process failed when its deadline passed first */
export function deadlineExceeded(tool: string): LoupeError {
  return new LoupeError(
    'DEADLINE_EXCEEDED',
    `${tool} did not finish within its deadline.`,
    'Use smaller inputs, or for long operations pass as_job: true.',
  );
}

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
