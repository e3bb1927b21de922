/**
 * One structured error for every surface (worker, page, CLI, MCP bridge).
 * `code` is stable and machine-readable; `hint` tells a person (or an agent) what to do next.
 * Errors cross the worker boundary and the WebSocket as plain JSON via `toJSON()`.
 */
export type ErrorCode =
  // sources / files
  | 'MODEL_NOT_FOUND'
  | 'FILE_NOT_FOUND'
  | 'NOT_A_FILE'
  | 'CACHE_MISMATCH'
  | 'HTTP_ERROR'
  | 'NETWORK_ERROR'
  | 'ABORTED'
  | 'MISSING_TOKENIZER'
  | 'MISSING_CONFIG'
  | 'BAD_CONFIG'
  | 'BAD_INDEX'
  | 'NO_CHAT_TEMPLATE'
  | 'BAD_CHAT_TEMPLATE'
  // safetensors validation
  | 'SAFETENSORS_HEADER_TOO_LARGE'
  | 'SAFETENSORS_BAD_HEADER'
  | 'SAFETENSORS_TRUNCATED'
  | 'SAFETENSORS_UNKNOWN_DTYPE'
  | 'SAFETENSORS_OFFSET_OUT_OF_RANGE'
  | 'SAFETENSORS_OVERLAP'
  | 'SAFETENSORS_SIZE_MISMATCH'
  | 'MISSING_TENSOR'
  | 'BAD_TENSOR_SHAPE'
  // architecture / graph / runtime
  | 'UNSUPPORTED_ARCHITECTURE'
  | 'UNSUPPORTED_CONFIG'
  | 'UNKNOWN_HOOK'
  | 'BAD_INTERVENTION'
  /** a library hook function threw, or returned a value of the wrong shape, type or with a non-finite number */
  | 'HOOK_FAILED'
  | 'SAE_MISMATCH'
  | 'TRANSCODER_MISMATCH'
  | 'BAD_WEIGHTS'
  | 'PROMPT_TOO_LONG'
  | 'EMPTY_PROMPT'
  | 'BAD_TOKEN_ID'
  | 'TOO_LARGE'
  | 'BACKEND_UNAVAILABLE'
  | 'RUNTIME_ERROR'
  /** the GPU device was lost during a run, and again after Loupe recreated its sessions (runtime/device-lost.ts) */
  | 'DEVICE_LOST'
  | 'UNSUPPORTED_OP'
  // operations / surfaces
  | 'BAD_INPUT'
  | 'UNKNOWN_OPERATION'
  | 'UNKNOWN_TOKEN'
  | 'HANDLE_EXPIRED'
  | 'NO_MODEL'
  | 'NO_PAGE'
  | 'PAGE_GONE'
  | 'ENGINE_UNREACHABLE'
  | 'ENGINE_GONE'
  | 'MODEL_REPLACED'
  | 'NOT_FOUND'
  | 'HOST_NOT_ALLOWED'
  | 'DEADLINE_EXCEEDED'
  | 'CANCELLED'
  | 'LOCAL_PATH_REFUSED'
  | 'CONFIG_UNSAFE'
  | 'INTERNAL';

export interface ErrorDocument {
  error: { code: ErrorCode; message: string; hint?: string; details?: unknown };
}

export class LoupeError extends Error {
  readonly code: ErrorCode;
  readonly hint?: string;
  readonly details?: unknown;
  constructor(code: ErrorCode, message: string, hint?: string, details?: unknown) {
    super(message);
    this.name = 'LoupeError';
    this.code = code;
    this.hint = hint;
    this.details = details;
  }
  toJSON(): ErrorDocument {
    return {
      error: {
        code: this.code,
        message: this.message,
        ...(this.hint ? { hint: this.hint } : {}),
        ...(this.details !== undefined ? { details: this.details } : {}),
      },
    };
  }
}

/** Wrap anything thrown into a LoupeError so surfaces never show a bare stack. */
export function toLoupeError(e: unknown): LoupeError {
  if (e instanceof LoupeError) return e;
  if (e && typeof e === 'object' && 'name' in e && (e as Error).name === 'AbortError') {
    return new LoupeError('ABORTED', 'The operation was cancelled.');
  }
  if (e && typeof e === 'object' && 'error' in e && (e as ErrorDocument).error?.code) {
    const d = (e as ErrorDocument).error;
    return new LoupeError(d.code, d.message, d.hint, d.details);
  }
  const msg = e instanceof Error ? e.message : String(e);
  return new LoupeError('INTERNAL', msg, 'This is a bug in Loupe; please report it with the input that caused it.');
}

export function throwIfAborted(signal?: AbortSignal): void {
  if (signal?.aborted) throw new LoupeError('ABORTED', 'The operation was cancelled.');
}
