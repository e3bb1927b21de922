/**
 * Argument validation shared by the MCP server and the headless executor: a zod parse whose
 * failure becomes BAD_INPUT with the issues spelled out, so an agent can fix its call.
 */
import { LoupeError } from '../engine/errors';

/** zod parse → BAD_INPUT with the issues spelled out (the agent can fix them). */
export function parse<T>(schema: { safeParse(v: unknown): { success: true; data: T } | { success: false; error: { issues: { path: PropertyKey[]; message: string }[] } } }, args: unknown): T {
  const r = schema.safeParse(args);
  if (r.success) return r.data;
  const issues = r.error.issues.slice(0, 8).map((i) => `${i.path.map(String).join('.') || '(arguments)'}: ${i.message}`);
  throw new LoupeError('BAD_INPUT', `Invalid arguments: ${issues.join('; ')}.`, "Fix the arguments to match the tool's inputSchema.", { issues: r.error.issues.slice(0, 20) });
}
