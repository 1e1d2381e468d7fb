"""A Pareto plot as SVG text, written by hand (no plotting library on the device machines):
LC p99 × alone on x (lower is better), BE ÷ alone on y (higher is better), one point per mode."""

import math
from xml.sax.saxutils import escape

W, H = 720, 400
LEFT, RIGHT, TOP, BOTTOM = 64, 184, 40, 52
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f"]


def nice_ticks(lo, hi, n=5):
    """About n round tick values covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step) * step
    ticks, t = [], first
    while True:  # the last tick at or above hi, so every point lies inside the axes
        ticks.append(round(t, 10))
        if t >= hi - step * 1e-9:
            return ticks
        t += step


def pareto_front(points):
    """Labels of the points no other point beats on both axes (x lower, y higher)."""
    front = []
    for lab, x, y, *_ in points:
        if not any(ox <= x and oy >= y and (ox < x or oy > y) for _, ox, oy, *_ in points):
            front.append(lab)
    return front


def pareto_svg(title, points, x_label="LC p99 × alone (lower is better)", y_label="BE ÷ alone (higher is better)"):
    """points: (label, x, y[, (x_lo, x_hi)]) with numbers; points with a None coordinate are left
    out. The alone point (1, 1) is drawn as a reference. Returns the SVG document as a string."""
    pts = [p for p in points if p[1] is not None and p[2] is not None]
    xs = [1.0] + [p[1] for p in pts] + [c for p in pts if len(p) > 3 and p[3] for c in p[3] if c is not None]
    ys = [1.0, 0.0] + [p[2] for p in pts]
    xt = nice_ticks(min(0.0, min(xs)) if min(xs) < 0 else 0.0, max(xs) * 1.05)
    yt = nice_ticks(min(ys), max(1.05, max(ys) * 1.05))
    x0, x1, y0, y1 = xt[0], xt[-1], yt[0], yt[-1]

    def px(x):
        return LEFT + (x - x0) / (x1 - x0) * (W - LEFT - RIGHT)

    def py(y):
        return H - BOTTOM - (y - y0) / (y1 - y0) * (H - TOP - BOTTOM)

    front = set(pareto_front(pts))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
           'font-family="sans-serif" font-size="11">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="14">{escape(title)}</text>']
    for t in xt:
        out.append(f'<line x1="{px(t):.1f}" y1="{TOP}" x2="{px(t):.1f}" y2="{H - BOTTOM}" stroke="#e6e6e6"/>')
        out.append(f'<text x="{px(t):.1f}" y="{H - BOTTOM + 16}" text-anchor="middle">{t:g}</text>')
    for t in yt:
        out.append(f'<line x1="{LEFT}" y1="{py(t):.1f}" x2="{W - RIGHT}" y2="{py(t):.1f}" stroke="#e6e6e6"/>')
        out.append(f'<text x="{LEFT - 6}" y="{py(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{W - LEFT - RIGHT}" height="{H - TOP - BOTTOM}" fill="none" stroke="#333"/>')
    out.append(f'<text x="{(LEFT + W - RIGHT) / 2}" y="{H - 12}" text-anchor="middle">{escape(x_label)}</text>')
    out.append(f'<text x="16" y="{(TOP + H - BOTTOM) / 2}" text-anchor="middle" '
               f'transform="rotate(-90 16 {(TOP + H - BOTTOM) / 2})">{escape(y_label)}</text>')
    out.append(f'<circle cx="{px(1):.1f}" cy="{py(1):.1f}" r="5" fill="none" stroke="#333" stroke-dasharray="2,2"/>')
    out.append(f'<text x="{px(1) + 7:.1f}" y="{py(1) - 7:.1f}" fill="#333">alone</text>')
    for i, p in enumerate(pts):
        label, x, y = p[0], p[1], p[2]
        color = COLORS[i % len(COLORS)]
        if len(p) > 3 and p[3] and None not in p[3]:
            lo, hi = p[3]
            out.append(f'<line x1="{px(lo):.1f}" y1="{py(y):.1f}" x2="{px(hi):.1f}" y2="{py(y):.1f}" stroke="{color}"/>')
        shape = "rect" if label in front else "circle"
        if shape == "rect":
            out.append(f'<rect x="{px(x) - 5:.1f}" y="{py(y) - 5:.1f}" width="10" height="10" fill="{color}"/>')
        else:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="5" fill="{color}"/>')
        # the mode's name beside its point, alternately above and below (neighbours often overlap);
        # the numbers go in the legend on the right
        dy = -8 if i % 2 == 0 else 16
        out.append(f'<text x="{px(x) + 7:.1f}" y="{py(y) + dy:.1f}" fill="{color}">{escape(label)}</text>')
        ly = TOP + 14 + 18 * i
        lx = W - RIGHT + 16
        out.append(f'<rect x="{lx}" y="{ly - 9}" width="10" height="10" fill="{color}"/>' if label in front else
                   f'<circle cx="{lx + 5}" cy="{ly - 4}" r="5" fill="{color}"/>')
        out.append(f'<text x="{lx + 16}" y="{ly}" fill="{color}">{escape(label)} ({x:.2f}, {y:.2f})</text>')
    out.append(f'<text x="{W - RIGHT + 16}" y="{TOP - 6}" fill="#555">mode (p99 ×, BE ÷)</text>')
    out.append(f'<text x="{W - RIGHT + 16}" y="{H - BOTTOM}" fill="#555">squares: Pareto front</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
