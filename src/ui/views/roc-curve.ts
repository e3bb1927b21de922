/** ROC points (FPR, TPR) from scores and 0/1 labels: one point per distinct threshold, ties together. */
export function rocCurve(scores: number[], labels: number[]): { fpr: number; tpr: number; threshold: number }[] {
  const P = labels.filter((y) => y === 1).length;
  const N = labels.length - P;
  const order = scores.map((s, i) => [s, labels[i]] as const).sort((a, b) => b[0] - a[0]);
  const pts = [{ fpr: 0, tpr: 0, threshold: Infinity }];
  let tp = 0,
    fp = 0;
  for (let i = 0; i < order.length; i++) {
    if (order[i][1] === 1) tp++;
    else fp++;
    if (i === order.length - 1 || order[i + 1][0] !== order[i][0]) {
      pts.push({ fpr: N ? fp / N : 0, tpr: P ? tp / P : 0, threshold: order[i][0] });
    }
  }
  return pts;
}

/** area under the curve by the trapezoid rule (equals the rank AUROC with ties counted half) */
export function aucOf(pts: { fpr: number; tpr: number }[]): number {
  let a = 0;
  for (let i = 1; i < pts.length; i++) a += ((pts[i].fpr - pts[i - 1].fpr) * (pts[i].tpr + pts[i - 1].tpr)) / 2;
  return a;
}
