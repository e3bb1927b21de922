/** Why a tool call failed, where every executor and link says it alike. */
import { LoupeError } from '../engine/errors';

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
