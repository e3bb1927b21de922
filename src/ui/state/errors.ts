import { toLoupeError, type ErrorDocument } from '../../engine/errors';

export type ErrorInfo = ErrorDocument['error'];

export function errInfo(e: unknown): ErrorInfo {
  return toLoupeError(e).toJSON().error;
}
