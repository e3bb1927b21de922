/**
 * The agent bridge, page side. The page mounts the panel with `mountBridge(host, app)`
 * (components/BridgeSlot.svelte); `connectBridge` is the protocol client underneath, for a page
 * that wants its own panel. Both live in src/bridge/ next to the hub they talk to.
 */
export { mountBridge } from '../bridge/page-panel';
export { pageExecutor, wireModel, type BridgeApp } from '../bridge/page-adapter';
export {
  connectBridge,
  takePairingToken,
  rememberPairingToken,
  forgetPairingToken,
  pageInstanceId,
  tabId,
  type BridgeOptions,
  type BridgeConnection,
  type BridgeStatus,
  type BridgeLogEntry,
  type ExecuteContext,
} from '../bridge/page-client';
