/** The generated-text block shared by generate, steer, sweep and sae_steer documents. */
import { z } from 'zod';

export const stopReason = z.enum(['eos', 'max_new_tokens']);

export const generationBlock = z.object({
  generated_token_ids: z.array(z.number().int()),
  generated_text: z.string().describe('The text the new tokens add to the prompt.'),
  stop_reason: stopReason,
});
