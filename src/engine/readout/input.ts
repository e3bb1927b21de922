/** What a readout input asks for, checked the same way whichever readout runs. */
import { uniformLayers, type ModelSpec } from '../spec';
import type { Tensor } from '../tensor';
import type { WeightProductsInput } from '../api';
import { LoupeError } from '../errors';

/** the WeightProducts inputs of the readout, validated: a wrong shape is BAD_INPUT, whichever readout runs */
export function checkReadoutInput(spec: ModelSpec, input: WeightProductsInput): void {
  const { nLayers: L, dModel: D, nHeads: H, dHead: Dh, dMlp: M } = spec;
  const check = (name: string, t: Tensor | undefined, inner: number) => {
    if (
      t &&
      (t.dims.length !== 3 || t.dims[0] !== L || t.dims[2] !== inner || t.data.length !== L * t.dims[1] * inner)
    ) {
      throw new LoupeError('BAD_INPUT', `weightProducts: ${name} must be [${L}, n, ${inner}], got [${t.dims}].`);
    }
  };
  // the products stack one per layer: Gemma 4's layers differ in head width, MLP width and more
  if (needsReadoutSession(input) && !uniformLayers(spec))
    throw new LoupeError(
      'UNSUPPORTED_OP',
      `DLA's weight products are not available for this ${spec.family} model: its layers differ in head width, ` +
        'MLP width, shared keys and values or per-layer inputs.',
      'Read its hooks (activations, run) instead; trace and attribution need layers of one shape.',
      { family: spec.family },
    );
  check('z', input.z, H * Dh);
  check('post', input.post, M);
  check('attnDirs', input.attnDirs, D);
  check('mlpDirs', input.mlpDirs, D);
}

/** whether an input asks for any product of the readout graph (else no session is needed) */
export const needsReadoutSession = (input: WeightProductsInput): boolean =>
  !!(input.z || input.post || input.attnDirs || input.mlpDirs);
