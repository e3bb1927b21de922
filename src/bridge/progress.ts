/**
 * Operation progress → MCP `notifications/progress`.
 *
 * Operations report {stage, done, total} and may start a new stage from 0; MCP requires
 * `progress` to increase with every notification. So each finished stage's total is carried as
 * an offset: progress = offset + done, total = offset + stage total (a total that grows as stages
 * appear, which the spec allows). Notifications are throttled (clients reset their timeouts on
 * each one, so a few per second is plenty), but a stage's last step is always sent.
 */
import type { Progress } from '../ops/types';

export interface McpProgress {
  progress: number;
  total?: number;
  message?: string;
}

export function progressMapper(send: (p: McpProgress) => void, minIntervalMs = 100): (p: Progress) => void {
  let offset = 0;
  let stage: string | undefined;
  let stageTotal = 0;
  let lastDone = 0;
  let lastSent = -Infinity;
  let lastAt = 0;
  return (p) => {
    const total = Number.isFinite(p.total) && p.total > 0 ? p.total : 0;
    const done = Number.isFinite(p.done) && p.done > 0 ? p.done : 0;
    if (stage !== undefined && (p.stage !== stage || done < lastDone)) {
      offset += Math.max(stageTotal, lastDone);
      lastDone = 0;
    }
    stage = p.stage;
    stageTotal = total;
    lastDone = done;
    const progress = offset + done;
    const now = Date.now();
    const last = total > 0 && done >= total;
    if (progress <= lastSent) return;
    if (!last && now - lastAt < minIntervalMs) return;
    lastSent = progress;
    lastAt = now;
    send({
      progress,
      ...(total > 0 ? { total: offset + total } : {}),
      message: total > 0 ? `${p.stage}: ${done}/${total}` : p.stage,
    });
  };
}
