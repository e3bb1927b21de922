/**
 * "Fill example" presets: working parameters for the operations whose inputs are hard to guess
 * (directions, paired prompts, labelled sets). Written for the bundled stories260K (whose 512-token
 * vocabulary has " happy", " big", " little" as single tokens); on other models they are a template.
 */
export interface Example {
  prompt?: string;
  params: Record<string, unknown>;
  note: string;
  /** said on the page after filling, when the example cannot run as it is */
  caveat?: string;
}

/** capture's prompts, each with its label */
const labelled = (label: number, texts: string[]) => texts.map((text) => ({ text, label }));

/** the operations that read an SAE: their sae_source/sae_path carry over from one form to another */
export const SAE_OPS = ['sae_features', 'feature', 'sae_steer'];
const SAE_FIELDS = ['sae_source', 'sae_path', 'descriptions'];

/** The SAE last given in another SAE operation's form (empty when none). */
export function carriedSae(
  params: Record<string, Record<string, unknown> | undefined>,
  op: string,
): Record<string, unknown> {
  if (!SAE_OPS.includes(op)) return {};
  for (const other of SAE_OPS) {
    const p = params[other];
    if (other === op || !p || typeof p.sae_source !== 'string' || !p.sae_source.trim()) continue;
    return Object.fromEntries(SAE_FIELDS.filter((k) => p[k] !== undefined).map((k) => [k, p[k]]));
  }
  return {};
}

// stories260K has no published SAE, so these presets fill everything but the SAE itself
const NO_SAE =
  'stories260K has no published SAE: set sae_source to your own SAE for this ' +
  'model in SAELens layout (cfg.json + sae_weights.safetensors) — a Hub repo, ' +
  'or an http(s) folder that sends CORS headers — and sae_path to its folder.';

const story = 'Once upon a time, there was a little';

export const EXAMPLES: Record<string, Example> = {
  ablate: { prompt: story, params: { layer: '0', head: '0', method: 'zero' }, note: 'zero-ablate head L0H0' },
  circuit: {
    prompt: story,
    params: { top_k_heads: '8', top_k_neurons: '5' },
    note: 'rank 8 heads and 5 neurons, ablate singly and in groups',
  },
  patch: {
    prompt: story,
    params: { corrupted_prompt: 'Once upon a time, there was a big' },
    note: 'clean “little” vs corrupted “big” (same token count)',
  },
  steer: {
    prompt: story,
    params: { layer: '2', direction: 'tokens: happy - big', alpha: '4', max_new_tokens: '16' },
    note: 'push the residual stream at layer 2 toward “happy”, away from “big”',
  },
  sweep: {
    prompt: story,
    params: { layer: '2', direction: 'tokens: happy - big', max_new_tokens: '12' },
    note: 'the same direction over α = multiples of the residual norm',
  },
  causality: {
    prompt: story,
    params: { layer: '2', direction: 'tokens: happy - big', n_random: '32' },
    note: 'compare the direction with 32 random directions of equal norm',
  },
  capture: {
    params: {
      prompts: JSON.stringify([
        ...labelled(1, [
          'Lily was very happy',
          'Tim was so happy and',
          'The big dog was happy',
          'She was happy to play',
          'Mom was happy with',
          'They were happy and',
        ]),
        ...labelled(0, [
          'Lily saw a big tree',
          'Tim had a big ball',
          'The dog was big and',
          'She saw a big box',
          'Mom had a big car',
          'They saw a big bird',
        ]),
      ]),
    },
    note: '12 labelled prompts (1 = “happy”, 0 = “big”); then run Probe on the capture',
  },
  layer_ablation: { prompt: story, params: {}, note: "ablate every layer's attention and MLP in turn" },
  generate: { prompt: story, params: { max_new_tokens: '24' }, note: 'greedy continuation' },
  sae_features: {
    prompt: story,
    params: { top_k: '8' },
    note: 'top 8 features per token (keeps the SAE you set)',
    caveat: NO_SAE,
  },
  feature: {
    prompt: story,
    params: {
      feature: '0',
      prompts: 'Lily was very happy\nThe big dog ran to the park\nTim had a red ball',
      top_k: '10',
    },
    note: 'feature 0 over three more prompts (pick a feature from SAE features; keeps the SAE you set)',
    caveat: NO_SAE,
  },
  dashboard: {
    params: {
      subject: 'neuron',
      layer: '4',
      neuron: '7',
      corpus: [
        'Once upon a time, there was a little girl named Lily. She loved to play outside in the park.',
        'Tim had a big red ball. He liked to kick it high into the sky.',
        'One day, a little dog found a bone under the tree. The dog was very happy.',
        'Mom said, "Let\'s go to the store." Lily smiled and took her hand.',
      ].join('\n\n'),
      samples: '8',
      sample_length: '32',
      window: '24',
    },
    note: 'neuron L4 N7 over four short stories and 8 samples the model writes',
  },
  sae_steer: {
    prompt: story,
    params: { feature: '0', edit: 'add', alpha: '', alphas: '-8, -4, 0, 4, 8', max_new_tokens: '12' },
    note: 'sweep feature 0 over α = −8 … 8 (pick a feature from SAE features; keeps the SAE you set)',
    caveat: NO_SAE,
  },
};
