/** What a readout input asks for, checked the same way whichever readout runs. */
import { readoutWidths, type ModelSpec } from '../spec';
import type { Tensor } from '../tensor';
import type { WeightProductsInput } from '../api';
import { LoupeError } from '../errors';

/** the WeightProducts inputs of the readout, validated: a wrong shape is BAD_INPUT, whichever readout runs */
export function checkReadoutInput(spec: ModelSpec, input: WeightProductsInput): void {
  const { nLayers: L, dModel: D } = spec;
  const check = (name: string, t: Tensor | undefined, inner: number) => {
    if (
      t &&
      (t.dims.length !== 3 || t.dims[0] !== L || t.dims[2] !== inner || t.data.length !== L * t.dims[1] * inner)
    ) {
      throw new LoupeError('BAD_INPUT', `weightProducts: ${name} must be [${L}, n, ${inner}], got [${t.dims}].`);
    }
  };
  // layers of different widths (Gemma 4) are stacked at the widest, each layer's rows zero-padded
  const { HD, M: Mmax } = readoutWidths(spec);
  check('z', input.z, HD);
  check('post', input.post, Mmax);
  check('attnDirs', input.attnDirs, D);
  check('mlpDirs', input.mlpDirs, D);
}

/** whether an input asks for any product of the readout graph (else no session is needed) */
export const needsReadoutSession = (input: WeightProductsInput): boolean =>
  !!(input.z || input.post || input.attnDirs || input.mlpDirs);
