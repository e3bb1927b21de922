/** One floating tooltip for every chart: hover shows the numbers behind a mark. */
let el: HTMLDivElement | null = null;

function node(): HTMLDivElement {
  if (!el) {
    el = document.createElement('div');
    el.className = 'chart-tooltip';
    el.setAttribute('role', 'tooltip');
    el.setAttribute('data-testid', 'chart-tooltip');
    document.body.appendChild(el);
  }
  return el;
}

export function showTooltip(ev: { clientX: number; clientY: number }, lines: string[]): void {
  const t = node();
  t.replaceChildren(
    ...lines.map((l, i) => {
      const d = document.createElement('div');
      d.textContent = l;
      if (i === 0) d.className = 'tt-title';
      return d;
    }),
  );
  t.style.display = 'block';
  const pad = 14;
  const w = t.offsetWidth;
  const h = t.offsetHeight;
  let x = ev.clientX + pad;
  let y = ev.clientY + pad;
  if (x + w > window.innerWidth - 4) x = ev.clientX - w - pad;
  if (y + h > window.innerHeight - 4) y = ev.clientY - h - pad;
  t.style.left = `${Math.max(4, x)}px`;
  t.style.top = `${Math.max(4, y)}px`;
}

export function hideTooltip(): void {
  if (el) el.style.display = 'none';
}
