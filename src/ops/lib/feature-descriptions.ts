/**
 * Auto-interp feature descriptions in Neuronpedia's export layout, read from a file the user gives
 * (URL, path or the JSON itself) or one published next to the SAE (`explanations.json` beside
 * cfg.json). Descriptions are only ever read: a feature without one gets `null`, never a made-up
 * label.
 *
 * Neuronpedia's exports are lists of explanation records, one per (feature, explanation):
 *   {"modelId": "gpt2-small", "layer": "6-res-jb", "index": "1234", "description": "…",
 *    "explanationModelName": "gpt-4o-mini", "typeName": "oai_token-act-pair", …}
 * shipped as
 *  - a JSON array of records (the former /api/explanation/export answer),
 *  - `{"explanations": [records]}` (the same wrapped; also a single feature's API answer, whose
 *    explanations carry no index: the top-level `index` applies),
 *  - JSON Lines, one record per line (the S3 dataset's `explanations/batch-N.jsonl.gz`), gzipped or not.
 * `index` may be a string or a number. A feature with several explanations keeps the first one
 * listed (Neuronpedia lists its default first).
 */
import { CAPS } from '../../engine/caps';
import { LoupeError } from '../../engine/errors';
import { inflateCapped, isGzip } from '../../engine/inflate';

export interface FeatureDescription {
  description: string;
  /** the model that wrote the explanation (explanationModelName), when given */
  explanation_model: string | null;
  /** Neuronpedia's explanation method (typeName), when given */
  type: string | null;
}

export interface DescriptionSet {
  byFeature: Map<number, FeatureDescription>;
  /** the same by each record's layer ('' when it names none): a transcoder set's one file covers every layer */
  byLayer: Map<string, Map<number, FeatureDescription>>;
  format: 'json_array' | 'json_object' | 'jsonl';
  gzip: boolean;
  /** explanation records read (a feature can have several) */
  records: number;
  /** Neuronpedia modelId / layer (source id, e.g. "6-res-jb") when every record that has one agrees */
  model_id: string | null;
  layer: string | null;
}

const bad = (where: string, msg: string) =>
  new LoupeError(
    'BAD_INPUT',
    `Descriptions from ${where}: ${msg}`,
    "Give a file in Neuronpedia's export layout: a JSON array (or JSON Lines) " +
      'of records with "index" and "description", e.g. [{"index": "3", "description": "dates"}].',
  );

/** text of the file: gunzipped when it starts with the gzip magic, inflating at most maxDescriptionsBytes */
function textOf(bytes: Uint8Array, where: string): { text: string; gzip: boolean } {
  if (!isGzip(bytes)) return { text: new TextDecoder().decode(bytes), gzip: false };
  const tooLarge = () =>
    new LoupeError(
      'TOO_LARGE',
      `Descriptions from ${where}: the gzip data inflates past ${CAPS.maxDescriptionsBytes.toLocaleString('en-US')} bytes (maxDescriptionsBytes).`,
      'Give a smaller descriptions file (one SAE’s explanations).',
    );
  let out: Uint8Array;
  try {
    out = inflateCapped(bytes, { format: 'gzip', maxBytes: CAPS.maxDescriptionsBytes, tooLarge });
  } catch (e) {
    if (e instanceof LoupeError) throw e;
    throw bad(where, `the gzip data is corrupt (${(e as Error).message}).`);
  }
  return { text: new TextDecoder().decode(out), gzip: true };
}

/** records and the layout they came in, from JSON text or an already parsed value */
function recordsOf(value: unknown, where: string): { records: unknown[]; format: DescriptionSet['format'] } {
  if (Array.isArray(value)) return { records: value, format: 'json_array' };
  if (value && typeof value === 'object' && Array.isArray((value as { explanations?: unknown }).explanations)) {
    const top = value as { explanations: unknown[]; index?: unknown; modelId?: unknown; layer?: unknown };
    // a single feature's answer: its explanations inherit the feature's index, model and layer
    const records = top.explanations.map((r) =>
      r && typeof r === 'object' ? { modelId: top.modelId, layer: top.layer, index: top.index, ...(r as object) } : r,
    );
    return { records, format: 'json_object' };
  }
  throw bad(where, 'expected a JSON array of explanation records or an object with an "explanations" array.');
}

function parseText(text: string, where: string): { records: unknown[]; format: DescriptionSet['format'] } {
  const t = text.trim();
  if (t === '') return { records: [], format: 'json_array' };
  try {
    return recordsOf(JSON.parse(t), where);
  } catch (e) {
    if (e instanceof LoupeError) throw e;
  }
  // not one JSON value: JSON Lines
  const records: unknown[] = [];
  const lines = t.split(/\r?\n/);
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i].trim();
    if (!line) continue;
    try {
      records.push(JSON.parse(line));
    } catch {
      throw bad(where, `line ${i + 1} is not JSON (neither the whole file nor each line parses).`);
    }
  }
  return { records, format: 'jsonl' };
}

function featureIndex(v: unknown): number | undefined {
  const n = typeof v === 'number' ? v : typeof v === 'string' && /^\s*\d+\s*$/.test(v) ? Number(v) : NaN;
  return Number.isInteger(n) && n >= 0 ? n : undefined;
}

const str = (v: unknown): string | null => (typeof v === 'string' && v.trim() !== '' ? v : null);

/**
 * Parse descriptions from file bytes, JSON text or an inline JSON value (array / object).
 * `where` names the origin in error messages.
 */
export function parseDescriptions(data: Uint8Array | string | unknown, where: string): DescriptionSet {
  let parsed: { records: unknown[]; format: DescriptionSet['format'] };
  let gzip = false;
  if (data instanceof Uint8Array) {
    const t = textOf(data, where);
    gzip = t.gzip;
    parsed = parseText(t.text, where);
  } else if (typeof data === 'string') {
    parsed = parseText(data, where);
  } else {
    parsed = recordsOf(data, where);
  }
  const byFeature = new Map<number, FeatureDescription>();
  const byLayer = new Map<string, Map<number, FeatureDescription>>();
  const models = new Set<string>();
  const layers = new Set<string>();
  parsed.records.forEach((r, i) => {
    if (!r || typeof r !== 'object') throw bad(where, `record ${i} is not an object.`);
    const rec = r as Record<string, unknown>;
    const index = featureIndex(rec.index ?? rec.feature);
    if (index === undefined)
      throw bad(where, `record ${i} has no valid "index" (got ${JSON.stringify(rec.index ?? null)}).`);
    if (str(rec.modelId)) models.add(rec.modelId as string);
    if (str(rec.layer)) layers.add(rec.layer as string);
    const description = str(rec.description);
    // an empty description is no description: the feature stays absent rather than labelled ""
    if (description === null) return;
    const d = { description, explanation_model: str(rec.explanationModelName), type: str(rec.typeName) };
    const layer = typeof rec.layer === 'number' ? String(rec.layer) : (str(rec.layer) ?? '');
    if (!byLayer.has(layer)) byLayer.set(layer, new Map());
    if (!byLayer.get(layer)!.has(index)) byLayer.get(layer)!.set(index, d);
    if (!byFeature.has(index)) byFeature.set(index, d);
  });
  return {
    byFeature,
    byLayer,
    format: parsed.format,
    gzip,
    records: parsed.records.length,
    model_id: models.size === 1 ? [...models][0] : null,
    layer: layers.size === 1 ? [...layers][0] : null,
  };
}

/**
 * Refuse descriptions that belong to another SAE: an index past d_sae, or a Neuronpedia id that
 * contradicts the SAE's cfg.json `neuronpedia_id` ("model/layer"). Wrong labels next to features
 * would be worse than none.
 */
export function checkDescriptions(
  set: DescriptionSet,
  sae: { d_sae: number; neuronpedia_id?: string | null },
  where: string,
): void {
  let max = -1;
  for (const k of set.byFeature.keys()) max = Math.max(max, k);
  if (max >= sae.d_sae) {
    throw new LoupeError(
      'BAD_INPUT',
      `Descriptions from ${where} describe feature ${max}, but the SAE has only ${sae.d_sae} features.`,
      'These descriptions belong to another SAE; give the explanations export of this SAE.',
    );
  }
  const np = sae.neuronpedia_id;
  if (np && set.model_id && set.layer) {
    const [model, ...rest] = np.split('/');
    const layer = rest.join('/');
    if (model !== set.model_id || layer !== set.layer) {
      throw new LoupeError(
        'BAD_INPUT',
        `Descriptions from ${where} are for Neuronpedia ${set.model_id}/${set.layer}, but the SAE's cfg.json says neuronpedia_id ${np}.`,
        `Give the explanations of ${np}.`,
      );
    }
  }
}

/** the description of a feature, or null when none was given (never invented) */
export function describe(set: DescriptionSet | null, feature: number): string | null {
  return set?.byFeature.get(feature)?.description ?? null;
}
