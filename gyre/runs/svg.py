"""Small inline-SVG charts for the run report: no JavaScript, no fonts, nothing fetched."""

from __future__ import annotations

import html
import math

PALETTE = ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#FF9DA6", "#9D755D"]
W, H, PAD_L, PAD_R, PAD_T, PAD_B = 640, 240, 56, 150, 24, 34

Series = tuple[str, list[tuple[float, float]]]


def _ticks(lo: float, hi: float, n: int = 4) -> list[float]:
    if hi <= lo:
        return [lo]
    try:
        step = (hi - lo) / n
        mag = 10 ** math.floor(math.log10(step))
        step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= step), default=step)
        first = math.ceil(lo / step) * step
        return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]
    except (OverflowError, ValueError, ZeroDivisionError):  # a span past a float's range
        return [lo, hi]


def _num(v: float) -> str:
    return f"{v:.3g}"


def line_chart(title: str, series: list[Series], x_label: str, y_label: str = "") -> str:
    """One chart: each series a polyline with dots, a legend on the right. Empty series are
    left out; no series at all gives a one-line note instead of an empty frame."""
    series = [
        (n, [(x, y) for x, y in pts if math.isfinite(x) and math.isfinite(y)]) for n, pts in series
    ]
    series = [(n, pts) for n, pts in series if pts]
    esc = html.escape
    if not series:
        return f'<p class="none">{esc(title)}: not recorded in this run</p>'
    xs = [x for _, pts in series for x, _ in pts]
    ys = [y for _, pts in series for _, y in pts]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        y0, y1 = y0 - (abs(y0) or 1) * 0.1, y1 + (abs(y1) or 1) * 0.1
    pw, ph = W - PAD_L - PAD_R, H - PAD_T - PAD_B

    def px(x: float) -> float:
        return PAD_L + (x - x0) / (x1 - x0) * pw

    def py(y: float) -> float:
        return PAD_T + ph - (y - y0) / (y1 - y0) * ph

    out = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
        f'viewBox="0 0 {W} {H}" role="img" aria-label="{esc(title)}">',
        f'<text x="{PAD_L}" y="15" class="title">{esc(title)}</text>',
        f'<rect x="{PAD_L}" y="{PAD_T}" width="{pw}" height="{ph}" class="frame"/>',
    ]
    for t in _ticks(y0, y1):
        out.append(
            f'<line x1="{PAD_L}" x2="{PAD_L + pw}" y1="{py(t):.1f}" y2="{py(t):.1f}" class="grid"/>'
        )
        out.append(
            f'<text x="{PAD_L - 4}" y="{py(t) + 4:.1f}" class="tick" text-anchor="end">{_num(t)}</text>'
        )
    for t in _ticks(x0, x1):
        out.append(
            f'<text x="{px(t):.1f}" y="{PAD_T + ph + 14}" class="tick" text-anchor="middle">{_num(t)}</text>'
        )
    out.append(
        f'<text x="{PAD_L + pw / 2}" y="{H - 4}" class="tick" text-anchor="middle">{esc(x_label)}</text>'
    )
    if y_label:
        out.append(
            f'<text x="12" y="{PAD_T + ph / 2}" class="tick" transform="rotate(-90 12 {PAD_T + ph / 2})" text-anchor="middle">{esc(y_label)}</text>'
        )
    for i, (name, pts) in enumerate(series):
        c = PALETTE[i % len(PALETTE)]
        pts = sorted(pts)
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        out.append(
            f'<polyline points="{path}" fill="none" stroke="{c}" stroke-width="2" class="series"/>'
        )
        for x, y in pts:
            out.append(
                f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{c}"><title>{esc(name)} {_num(x)}: {y:.4g}</title></circle>'
            )
        ly = PAD_T + 12 + i * 16
        out.append(f'<rect x="{W - PAD_R + 10}" y="{ly - 9}" width="10" height="10" fill="{c}"/>')
        out.append(f'<text x="{W - PAD_R + 24}" y="{ly}" class="legend">{esc(name[:22])}</text>')
    out.append("</svg>")
    return "".join(out)


def bar_rows(title: str, rows: list[tuple[str, dict[str, float]]], colors: dict[str, str]) -> str:
    """Stacked horizontal bars (one per row, shares summing to about 1): the role shares."""
    esc = html.escape
    if not rows:
        return f'<p class="none">{esc(title)}: not recorded in this run</p>'
    h = PAD_T + 22 * len(rows) + 30
    bw = W - PAD_L - PAD_R
    out = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" '
        f'viewBox="0 0 {W} {h}" role="img" aria-label="{esc(title)}">',
        f'<text x="{PAD_L}" y="15" class="title">{esc(title)}</text>',
    ]
    keys: list[str] = []
    for r, (label, shares) in enumerate(rows):
        y, x = PAD_T + 22 * r, float(PAD_L)
        out.append(
            f'<text x="{PAD_L - 4}" y="{y + 13}" class="tick" text-anchor="end">{esc(label)}</text>'
        )
        for k, v in shares.items():
            keys += [k] if k not in keys else []
            c = colors.get(k, PALETTE[keys.index(k) % len(PALETTE)])
            out.append(
                f'<rect x="{x:.1f}" y="{y}" width="{v * bw:.1f}" height="16" fill="{c}"><title>{esc(k)} {v:.1%}</title></rect>'
            )
            x += v * bw
    for i, k in enumerate(keys):
        c = colors.get(k, PALETTE[i % len(PALETTE)])
        ly = PAD_T + 12 + i * 16
        out.append(f'<rect x="{W - PAD_R + 10}" y="{ly - 9}" width="10" height="10" fill="{c}"/>')
        out.append(f'<text x="{W - PAD_R + 24}" y="{ly}" class="legend">{esc(k)}</text>')
    out.append("</svg>")
    return "".join(out)
