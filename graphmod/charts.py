"""Self-contained HTML pages of line charts in inline SVG (no scripts, no
network): the pictures of graphmod.verify and graphmod profile."""
import html
import math
from typing import Dict, List, Optional, Sequence

# Distinct, print-safe line colours, in the order series are drawn.
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
          "#17becf")
WIDTH, HEIGHT, MARGIN = 640, 260, 48
_STYLE = ("body{font-family:Helvetica,Arial,sans-serif;margin:16px} "
          "h2{font-size:15px;margin:18px 0 4px} td{padding:1px 8px} .bad{color:#c62828} "
          "svg{vertical-align:top;margin:4px}")


def line_chart(title: str, series: Dict[str, Sequence[float]], x_label: str = "step",
               log_y: bool = False, guide: Optional[float] = None,
               guide_label: str = "") -> str:
    """An SVG chart of each series against x = 1, 2, ... ; log_y draws the y
    axis in powers of ten (values <= 0 sit at the bottom); guide: a dashed
    horizontal line (e.g. a tolerance)."""
    e = html.escape
    finite = [v for s in series.values() for v in s if math.isfinite(v)]
    if guide is not None:
        finite.append(guide)
    y = (lambda v: math.log10(v) if v > 0 else None) if log_y else (lambda v: v)
    ys = [y(v) for v in finite if y(v) is not None] or [0.0]
    lo, hi = min(ys), max(ys)
    if log_y:
        lo, hi = math.floor(lo), math.ceil(hi)
    if hi - lo < 1e-12:
        lo, hi = lo - 1, hi + 1
    n = max((len(s) for s in series.values()), default=1)
    plot_w, plot_h = WIDTH - 2 * MARGIN, HEIGHT - 2 * MARGIN

    def px(i: int) -> float:
        return MARGIN + (plot_w * (i - 1) / (n - 1) if n > 1 else plot_w / 2)

    def py(v: float) -> float:
        w = y(v) if math.isfinite(v) else hi
        w = lo if w is None else w
        return MARGIN + plot_h * (1 - (w - lo) / (hi - lo))

    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{HEIGHT}' "
           f"role='img' aria-label='{e(title)}' style='border:1px solid #ddd;background:#fff'>",
           f"<text x='{MARGIN}' y='20' font-size='13' font-weight='bold'>{e(title)}</text>",
           f"<line x1='{MARGIN}' y1='{HEIGHT - MARGIN}' x2='{WIDTH - MARGIN}' "
           f"y2='{HEIGHT - MARGIN}' stroke='#888'/>",
           f"<line x1='{MARGIN}' y1='{MARGIN}' x2='{MARGIN}' y2='{HEIGHT - MARGIN}' "
           "stroke='#888'/>",
           f"<text x='{WIDTH / 2}' y='{HEIGHT - 10}' font-size='11' "
           f"text-anchor='middle'>{e(x_label)}</text>"]
    for tick in _ticks(lo, hi, log_y):
        t = MARGIN + plot_h * (1 - (tick - lo) / (hi - lo))
        label = f"1e{tick:g}" if log_y else f"{tick:.4g}"
        out.append(f"<text x='{MARGIN - 4}' y='{t + 4}' font-size='10' "
                   f"text-anchor='end'>{label}</text>")
    for i in sorted({1, n, *range(1, n + 1, max(1, n // 8))}):
        out.append(f"<text x='{px(i)}' y='{HEIGHT - MARGIN + 14}' font-size='10' "
                   f"text-anchor='middle'>{i}</text>")
    if guide is not None:
        g = py(guide)
        out.append(f"<line x1='{MARGIN}' y1='{g}' x2='{WIDTH - MARGIN}' y2='{g}' "
                   f"stroke='#555' stroke-dasharray='5,4'/><text x='{WIDTH - MARGIN}' "
                   f"y='{g - 4}' font-size='10' text-anchor='end'>{e(guide_label)}</text>")
    for k, (name, values) in enumerate(series.items()):
        color = COLORS[k % len(COLORS)]
        points = " ".join(f"{px(i):.1f},{py(v):.1f}" for i, v in enumerate(values, 1))
        out.append(f"<polyline points='{points}' fill='none' stroke='{color}' "
                   "stroke-width='2.5'/>")
        out.append(f"<text x='{WIDTH - MARGIN}' y='{MARGIN + 12 * k}' font-size='11' "
                   f"text-anchor='end' fill='{color}'>{e(name)}</text>")
    out.append("</svg>")
    return "".join(out)


def bar_chart(title: str, values: Dict[str, float]) -> str:
    """An SVG chart of one horizontal bar per name, its value written beside it."""
    e = html.escape
    top = max(values.values(), default=0.0) or 1.0
    row, label_w = 26, 120
    height = 40 + row * len(values)
    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{height}' "
           f"role='img' aria-label='{e(title)}' style='border:1px solid #ddd;background:#fff'>",
           f"<text x='10' y='20' font-size='13' font-weight='bold'>{e(title)}</text>"]
    span = WIDTH - label_w - 90
    for k, (name, value) in enumerate(values.items()):
        y = 32 + row * k
        width = max(span * value / top, 0.0)
        out.append(f"<text x='{label_w - 6}' y='{y + 15}' font-size='11' "
                   f"text-anchor='end'>{e(name)}</text>"
                   f"<rect x='{label_w}' y='{y}' width='{width:.1f}' height='{row - 8}' "
                   f"fill='{COLORS[k % len(COLORS)]}'/>"
                   f"<text x='{label_w + width + 6:.1f}' y='{y + 15}' font-size='11'>"
                   f"{value:.4g}</text>")
    out.append("</svg>")
    return "".join(out)


def _ticks(lo: float, hi: float, log_y: bool) -> List[float]:
    if log_y:
        step = max(1, int(math.ceil((hi - lo) / 6)))
        return [float(t) for t in range(int(lo), int(hi) + 1, step)]
    return [lo + (hi - lo) * i / 4 for i in range(5)]


def page(title: str, parts: Sequence[str]) -> str:
    """A self-contained HTML page: the title, then each part (HTML)."""
    e = html.escape
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'>"
            f"<title>{e(title)}</title><style>{_STYLE}</style></head><body>"
            f"<h1 style='font-size:18px'>{e(title)}</h1>\n" + "\n".join(parts) +
            "\n</body></html>\n")
