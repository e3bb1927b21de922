/**
 * Export a chart as SVG or PNG and a document as JSON. Charts write their colours as attributes
 * (charts/palette.ts), so the serialised SVG stands alone; the PNG is that SVG drawn on a canvas
 * at 2× for sharpness.
 */

export function download(name: string, blob: Blob): void {
  const url = URL.createObjectURL(blob);
  const a = document.createElement('a');
  a.href = url;
  a.download = name;
  a.rel = 'noopener';
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

export function svgText(svg: SVGSVGElement): string {
  const clone = svg.cloneNode(true) as SVGSVGElement;
  clone.setAttribute('xmlns', 'http://www.w3.org/2000/svg');
  clone.removeAttribute('tabindex');
  const bg = svg.style.background;
  if (bg) {
    // a background rect, since CSS background is not part of the SVG image model
    const r = document.createElementNS('http://www.w3.org/2000/svg', 'rect');
    r.setAttribute('width', '100%');
    r.setAttribute('height', '100%');
    r.setAttribute('fill', bg);
    clone.insertBefore(r, clone.firstChild);
  }
  return `<?xml version="1.0" encoding="UTF-8"?>\n${new XMLSerializer().serializeToString(clone)}`;
}

export function exportSvg(svg: SVGSVGElement, name: string): void {
  download(`${name}.svg`, new Blob([svgText(svg)], { type: 'image/svg+xml' }));
}

export async function svgToPngBlob(svg: SVGSVGElement, scale = 2): Promise<Blob> {
  const w = Number(svg.getAttribute('width')) || svg.clientWidth || 600;
  const h = Number(svg.getAttribute('height')) || svg.clientHeight || 400;
  const url = URL.createObjectURL(new Blob([svgText(svg)], { type: 'image/svg+xml' }));
  try {
    const img = new Image();
    img.decoding = 'sync';
    await new Promise<void>((ok, fail) => {
      img.onload = () => ok();
      img.onerror = () => fail(new Error('the chart could not be rendered as an image'));
      img.src = url;
    });
    const canvas = document.createElement('canvas');
    canvas.width = Math.ceil(w * scale);
    canvas.height = Math.ceil(h * scale);
    const ctx = canvas.getContext('2d')!;
    ctx.scale(scale, scale);
    ctx.drawImage(img, 0, 0, w, h);
    return await new Promise<Blob>((ok, fail) =>
      canvas.toBlob((b) => (b ? ok(b) : fail(new Error('PNG encoding failed'))), 'image/png'),
    );
  } finally {
    URL.revokeObjectURL(url);
  }
}

export async function exportPng(svg: SVGSVGElement, name: string): Promise<void> {
  download(`${name}.png`, await svgToPngBlob(svg));
}

export function exportJson(doc: unknown, name: string): void {
  download(`${name}.json`, new Blob([`${JSON.stringify(doc, null, 2)}\n`], { type: 'application/json' }));
}
