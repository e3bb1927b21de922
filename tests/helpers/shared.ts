/**
 * The shared folder beside the checkout (../shared: real models and references), wherever the
 * checkout lives; LOUPE_SHARED overrides it.
 */
import * as path from 'node:path';

export const SHARED = process.env.LOUPE_SHARED ?? path.resolve(__dirname, '../../../shared');
