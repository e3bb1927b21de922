/**
 * The app protocol between the hub (inside `loupe mcp`) and its peers, as JSON text frames over a
 * loopback WebSocket. Two kinds of peer speak it:
 *  - the page (`/ws/page`): an executor. It says `hello`, then receives `call`s and answers with
 *    `progress`, then one `result` or `error`; the hub may `cancel` a call.
 *  - a forwarding companion (`/ws/agent`): a second `loupe mcp` sharing this hub. It says
 *    `attach`, then sends `call`s and receives `progress` / `result` / `error`, and may `cancel`.
 * Both sides send `ping` and answer `pong` (heartbeats).
 *
 * This module is imported by the page too (src/ui/bridge-client.ts), so it stays plain
 * TypeScript with no Node or zod dependency; `parseMessage` does the structural checks by hand.
 */

import type { ModelInfo } from '../engine/api';

export const PROTOCOL_VERSION = 1;
/** WebSocket subprotocol the hub selects; the token travels as a second offered subprotocol so
 * that it never appears in a URL (URLs end up in logs and history). */
export const SUBPROTOCOL = 'loupe.v1';
export const TOKEN_PROTOCOL_PREFIX = 'loupe.token.';
/**
 * A forwarding companion offers `loupe.challenge.<64 hex nonce>` instead of the token: the hub
 * must first prove it holds the token (`challenge` message: an HMAC of the nonce keyed by the
 * token), then the companion proves the same to the hub (`attach` with an HMAC of the hub's
 * nonce). The token itself never crosses the socket, so a program squatting on the port learns
 * nothing from a companion that finds a stale token file. (src/bridge/token.ts computes them.)
 */
export const CHALLENGE_PROTOCOL_PREFIX = 'loupe.challenge.';
export const PAGE_PATH = '/ws/page';
export const AGENT_PATH = '/ws/agent';
/** Unauthenticated probe that tells a second companion "a Loupe hub listens here" (no secrets). */
export const HUB_PROBE_PATH = '/.well-known/loupe-hub';
/** Close code the hub uses when it drops a peer on purpose (replaced, heartbeat lost, bad message). */
export const CLOSE_POLICY = 4000;

export interface WireError {
  code: string;
  message: string;
  hint?: string;
}

/**
 * What the page reports about its loaded model: ModelInfo from src/engine/api.ts, plus `ref`
 * ({kind: 'bundled'|'hub'|'url', id, revision, endpoint?}, never a token) so that the companion
 * can make share links; or null when no model is loaded.
 */
export type WireModel = Record<string, unknown> | null;

/**
 * What a page may report about its model, field by field: the hub echoes it in every
 * `loupe_status` and result, so a page (or anything holding the token) must not be able to make
 * those huge or smuggle other data through them. Typed against ModelInfo so that a new field
 * fails to compile until it is listed here.
 */
const MODEL_FIELDS: Record<keyof ModelInfo, 'string' | 'number' | 'number|null' | 'boolean'> = {
  id: 'string',
  requested_name: 'string',
  revision: 'string',
  commit: 'string',
  source: 'string',
  architecture: 'string',
  dtype: 'string',
  backend: 'string',
  norm: 'string',
  weights: 'string',
  weights_reason: 'string',
  weight_bytes: 'number',
  vocab_chunks: 'number',
  vocab_reason: 'string',
  readout: 'string',
  readout_reason: 'string',
  n_layers: 'number',
  n_heads: 'number',
  n_kv_heads: 'number',
  d_model: 'number',
  d_head: 'number',
  d_mlp: 'number',
  num_experts: 'number',
  experts_per_token: 'number',
  shared_expert: 'boolean',
  d_vocab: 'number',
  n_ctx: 'number',
  n_params: 'number',
  norm_eps: 'number',
  final_softcap: 'number|null',
  post_norms: 'boolean',
  pos_embed: 'boolean',
  parallel_attn_mlp: 'boolean',
  act_fn: 'string',
  gated_mlp: 'boolean',
};
const REF_FIELDS = ['kind', 'id', 'revision', 'commit', 'endpoint'] as const;
/** longest string kept in a reported model (ids are Hub ids or URLs) */
export const WIRE_STRING_MAX = 512;

const shortStr = (v: unknown): v is string => typeof v === 'string' && v.length <= WIRE_STRING_MAX;

/** The whitelisted, bounded copy of a reported model; null for anything that is not an object. */
export function sanitizeWireModel(m: unknown): WireModel {
  if (!isObj(m)) return null;
  const out: Record<string, unknown> = {};
  for (const [k, kind] of Object.entries(MODEL_FIELDS)) {
    const v = m[k];
    const ok =
      kind === 'string'
        ? shortStr(v)
        : kind === 'number'
          ? isNum(v)
          : kind === 'number|null'
            ? v === null || isNum(v)
            : typeof v === 'boolean';
    if (ok) out[k] = v;
  }
  if (isObj(m.ref)) {
    const ref: Record<string, string> = {};
    for (const k of REF_FIELDS) if (shortStr(m.ref[k])) ref[k] = m.ref[k] as string;
    out.ref = ref;
  }
  return out;
}

export interface AgentInfo {
  name: string;
  version?: string;
}

// ---- page → hub ----
export interface HelloMsg {
  type: 'hello';
  protocol: number;
  /** stable for the life of the browser tab (sessionStorage) */
  tab_id: string;
  /** new on every page load; handles minted by the page carry it */
  instance_id: string;
  model: WireModel;
  app?: { name: string; version?: string };
}
/** the user loaded another model in the page */
export interface ModelMsg {
  type: 'model';
  model: WireModel;
}
export interface ProgressMsg {
  type: 'progress';
  id: string;
  done: number;
  total: number;
  stage: string;
}
export interface ResultMsg {
  type: 'result';
  id: string;
  document: unknown;
  /** shareable link to this result, when the page can make one */
  link?: string;
  /** the page instance that produced it (filled by the hub for agents) */
  instance_id?: string;
  /** the page's model when it answered (filled by the hub for agents; used to make the link) */
  model?: WireModel;
}
export interface ErrorMsg {
  type: 'error';
  id: string;
  error: WireError;
}
export interface PingMsg {
  type: 'ping';
  t: number;
}
export interface PongMsg {
  type: 'pong';
  t: number;
}

// ---- hub → page / agent ----
export interface WelcomeMsg {
  type: 'welcome';
  protocol: number;
  hub: { version: string; port: number };
  agents: AgentInfo[];
}
export interface CallMsg {
  type: 'call';
  id: string;
  tool: string;
  args: Record<string, unknown>;
  /** hard deadline, epoch milliseconds (hub and page share a clock: both are on this machine) */
  deadline: number;
  /** which agent asked, for the page's live log */
  agent?: AgentInfo;
}
export interface CancelMsg {
  type: 'cancel';
  id: string;
  reason?: string;
}
export interface AgentsMsg {
  type: 'agents';
  agents: AgentInfo[];
}
export interface ByeMsg {
  type: 'bye';
  reason: string;
}

// ---- agent → hub ----
/** first message of a forwarding companion; sent again when its MCP client's name is known */
export interface AttachMsg {
  type: 'attach';
  protocol: number;
  agent: AgentInfo;
  /** on a challenge connection, the companion's proof over the hub's `challenge.nonce` */
  proof?: string;
}

// ---- hub → agent, first message on a challenge connection ----
export interface ChallengeMsg {
  type: 'challenge';
  /** the hub's proof over the nonce the companion offered */
  proof: string;
  /** the nonce the companion must prove the token over in its `attach` */
  nonce: string;
}

export type PageToHub = HelloMsg | ModelMsg | ProgressMsg | ResultMsg | ErrorMsg | PingMsg | PongMsg;
export type HubToPage = WelcomeMsg | CallMsg | CancelMsg | AgentsMsg | ByeMsg | PingMsg | PongMsg;
export type AgentToHub = AttachMsg | CallMsg | CancelMsg | PingMsg | PongMsg;
export type HubToAgent = ChallengeMsg | WelcomeMsg | ProgressMsg | ResultMsg | ErrorMsg | ByeMsg | PingMsg | PongMsg;
export type AnyMsg = PageToHub | HubToPage | AgentToHub | HubToAgent;

const isStr = (v: unknown): v is string => typeof v === 'string';
const isNum = (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v);
const isObj = (v: unknown): v is Record<string, unknown> => !!v && typeof v === 'object' && !Array.isArray(v);
/** ids are short opaque tokens; bounding them keeps a hostile peer from growing our maps' keys */
const isId = (v: unknown): v is string => isStr(v) && v.length > 0 && v.length <= 128;
export const isHex64 = (v: unknown): v is string => isStr(v) && /^[0-9a-f]{64}$/.test(v);

/**
 * Parse one text frame. Returns undefined for anything malformed (the caller drops the peer or
 * ignores the frame); never throws.
 */
export function parseMessage(text: string): AnyMsg | undefined {
  let m: unknown;
  try {
    m = JSON.parse(text);
  } catch {
    return undefined;
  }
  if (!isObj(m) || !isStr(m.type)) return undefined;
  switch (m.type) {
    case 'hello':
      return isNum(m.protocol) && isId(m.tab_id) && isId(m.instance_id) && (m.model === null || isObj(m.model))
        ? ({ ...m, model: sanitizeWireModel(m.model) } as unknown as HelloMsg)
        : undefined;
    case 'model':
      return m.model === null || isObj(m.model)
        ? ({ type: 'model', model: sanitizeWireModel(m.model) } as ModelMsg)
        : undefined;
    case 'progress':
      return isId(m.id) && isNum(m.done) && isNum(m.total) && isStr(m.stage)
        ? ({ type: 'progress', id: m.id, done: m.done, total: m.total, stage: m.stage.slice(0, 200) } as ProgressMsg)
        : undefined;
    case 'result':
      return isId(m.id) && 'document' in m && (m.link === undefined || isStr(m.link))
        ? (m as unknown as ResultMsg)
        : undefined;
    case 'error':
      return isId(m.id) && isObj(m.error) && isStr(m.error.code) && isStr(m.error.message)
        ? ({
            type: 'error',
            id: m.id,
            error: {
              code: m.error.code.slice(0, 64),
              message: m.error.message.slice(0, 4000),
              ...(isStr(m.error.hint) ? { hint: m.error.hint.slice(0, 4000) } : {}),
            },
          } as ErrorMsg)
        : undefined;
    case 'ping':
    case 'pong':
      return isNum(m.t) ? (m as unknown as PingMsg | PongMsg) : undefined;
    case 'welcome':
      return isNum(m.protocol) && isObj(m.hub) && Array.isArray(m.agents) ? (m as unknown as WelcomeMsg) : undefined;
    case 'call':
      return isId(m.id) && isStr(m.tool) && isObj(m.args) && isNum(m.deadline) ? (m as unknown as CallMsg) : undefined;
    case 'cancel':
      return isId(m.id) ? (m as unknown as CancelMsg) : undefined;
    case 'agents':
      return Array.isArray(m.agents) ? (m as unknown as AgentsMsg) : undefined;
    case 'bye':
      return isStr(m.reason) ? (m as unknown as ByeMsg) : undefined;
    case 'attach':
      return isNum(m.protocol) && isObj(m.agent) && isStr(m.agent.name) && (m.proof === undefined || isHex64(m.proof))
        ? (m as unknown as AttachMsg)
        : undefined;
    case 'challenge':
      return isHex64(m.proof) && isHex64(m.nonce) ? (m as unknown as ChallengeMsg) : undefined;
    default:
      return undefined;
  }
}

/** The token offered as a subprotocol: `loupe.token.<64 hex>`. */
export function tokenProtocol(token: string): string {
  return TOKEN_PROTOCOL_PREFIX + token;
}

/** Tools the hub answers itself for forwarding companions (never sent to the page). */
export const HUB_STATUS_TOOL = '$status';
