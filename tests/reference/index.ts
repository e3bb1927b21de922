// The test oracle: an independent float64 forward of the Hugging Face modeling math, random-weight
// models in exact HF layout for every family, and a small safetensors reader/writer.
// Nothing here imports from src/ (it is what the engine is judged against).

export {
  referenceForward,
  greedyGenerate64,
  loadModelDir,
  hookNames,
  lastLogits,
  logSoftmax64,
  argmax,
  erf,
  SUPPORTED_FAMILIES,
  type Family,
  type RefFeature,
  type RefModel,
  type RefTensor,
  type HookValue,
  type HookFn,
  type ForwardOptions,
  type ForwardResult,
} from './forward64';

export {
  makeRandomModel,
  makeCaseModel,
  caseTokens,
  randomTokens,
  mulberry32,
  gaussian,
  ALL_FAMILY_CASES,
  MOE_FAMILY_CASES,
  MOE_FAMILIES,
  type FamilyCase,
  type RandomModel,
  type RandomModelOptions,
  type GeneratedTensor,
} from './random-models';

export {
  encodeSafetensors,
  decodeSafetensors,
  roundToDtype,
  f32ToF16Bits,
  f16BitsToF32,
  f32ToBf16Bits,
  bf16BitsToF32,
  type StDtype,
  type StTensor,
  type WriteEntry,
} from './safetensors-io';

export { makeTokenizer, bytesToUnicode, type TokenizerSpec, type GeneratedTokenizer } from './tokenizer-gen';

export { compareHooks, maxAbsDiff, type HookComparison } from './compare';

export {
  edgeGraph64,
  edgeForward64,
  metric64,
  circuitMetric64,
  exactScores64,
  eapScores64,
  eapIgInputsScores64,
  prune64,
  faithfulness64,
  MIB_PCTS,
  type EdgeGraph64,
  type Pair64,
  type Faithfulness64,
  type LayerState,
} from './edges64';
