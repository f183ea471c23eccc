"""Charts as inline SVG, drawn on the server (pure): they show without JavaScript.

A chart is a few series of (x, y) points; each is drawn as a polyline with
a circle per point (``class="point"``, so tests can count what was drawn),
on axes with a handful of labelled ticks. Every text is escaped: series
names may come from files a user wrote.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

#: Colours of successive series (colour-blind-safe, Okabe-Ito).
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000")
#: Points drawn per series at most (a long run is thinned evenly, its last point kept).
MAX_POINTS = 400


@dataclass(frozen=True)
class Series:
    name: str
    points: Sequence[tuple[float, float]]


@dataclass(frozen=True)
class Segment:
    """One bar of a timeline: a lane (attempt), a label (partition), from ``start`` to ``end``."""

    lane: str
    label: str
    start: float
    end: float


def _finite(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in points if math.isfinite(x) and math.isfinite(y)]


def thin(points: Sequence[tuple[float, float]], limit: int = MAX_POINTS) -> list[tuple[float, float]]:
    """At most ``limit`` points, evenly spaced over the series, first and last kept."""
    pts = list(points)
    if len(pts) <= limit:
        return pts
    step = (len(pts) - 1) / (limit - 1)
    return [pts[round(i * step)] for i in range(limit)]


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(1, count)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.floor(lo / step) * step
    ticks = []
    value = first
    while value <= hi + step * 1e-9:
        if value >= lo - step * 1e-9:
            ticks.append(round(value, 10))
        value += step
    return ticks


def _label(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 10000 or abs(value) < 0.01:
        return f"{value:.2g}"
    return f"{value:.4g}"


def line_chart(series: Sequence[Series], *, title: str, x_label: str, y_label: str, chart_id: str,
               width: int = 640, height: int = 280, y_from_zero: bool = False) -> str:
    """An SVG line chart; a text saying there is nothing to draw yet when no series has a point."""
    drawn = [Series(s.name, thin(_finite(s.points))) for s in series]
    drawn = [s for s in drawn if s.points]
    head = (f'<svg id="{escape(chart_id)}" class="chart" role="img" aria-labelledby="{escape(chart_id)}-title" '
            f'viewBox="0 0 {width} {height}" width="100%" preserveAspectRatio="xMidYMid meet" '
            f'xmlns="http://www.w3.org/2000/svg"><title id="{escape(chart_id)}-title">{escape(title)}</title>')
    if not drawn:
        return (head + f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" class="empty">'
                f'{escape(title)}: no data yet</text></svg>')
    left, right, top, bottom = 64, 16, 28, 44
    xs = [x for s in drawn for x, _ in s.points]
    ys = [y for s in drawn for _, y in s.points]
    x_lo, x_hi = min(xs), max(xs)
    y_lo, y_hi = (0.0 if y_from_zero else min(ys)), max(ys)
    x_ticks, y_ticks = nice_ticks(x_lo, x_hi), nice_ticks(y_lo, y_hi)
    x_lo, x_hi = min(x_lo, x_ticks[0]), max(x_hi, x_ticks[-1])
    y_lo, y_hi = min(y_lo, y_ticks[0]), max(y_hi, y_ticks[-1])
    if x_hi == x_lo:
        x_hi = x_lo + 1
    if y_hi == y_lo:
        y_hi = y_lo + 1
    plot_w, plot_h = width - left - right, height - top - bottom

    def px(x: float) -> float:
        return left + (x - x_lo) / (x_hi - x_lo) * plot_w

    def py(y: float) -> float:
        return top + plot_h - (y - y_lo) / (y_hi - y_lo) * plot_h

    parts = [head, f'<text x="{left}" y="16" class="chart-title">{escape(title)}</text>']
    for t in x_ticks:
        parts.append(f'<line class="grid" x1="{px(t):.1f}" y1="{top}" x2="{px(t):.1f}" y2="{top + plot_h}"/>'
                     f'<text class="tick" x="{px(t):.1f}" y="{top + plot_h + 14}" text-anchor="middle">'
                     f'{_label(t)}</text>')
    for t in y_ticks:
        parts.append(f'<line class="grid" x1="{left}" y1="{py(t):.1f}" x2="{left + plot_w}" y2="{py(t):.1f}"/>'
                     f'<text class="tick" x="{left - 6}" y="{py(t) + 4:.1f}" text-anchor="end">{_label(t)}</text>')
    parts.append(f'<rect class="frame" x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none"/>')
    parts.append(f'<text class="axis" x="{left + plot_w / 2}" y="{height - 6}" text-anchor="middle">'
                 f'{escape(x_label)}</text>')
    parts.append(f'<text class="axis" transform="translate(14 {top + plot_h / 2}) rotate(-90)" '
                 f'text-anchor="middle">{escape(y_label)}</text>')
    for i, s in enumerate(drawn):
        colour = PALETTE[i % len(PALETTE)]
        coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s.points)
        parts.append(f'<g class="series" data-series="{escape(s.name)}"><title>{escape(s.name)}</title>'
                     f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{coords}"/>')
        parts.extend(f'<circle class="point" cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{colour}">'
                     f'<title>{escape(s.name)}: {_label(x)}, {_label(y)}</title></circle>' for x, y in s.points)
        parts.append("</g>")
        lx = left + 8 + (i % 4) * 150
        ly = top + 14 + (i // 4) * 14
        parts.append(f'<rect x="{lx}" y="{ly - 9}" width="10" height="10" fill="{colour}"/>'
                     f'<text class="legend" x="{lx + 14}" y="{ly}">{escape(s.name[:22])}</text>')
    parts.append("</svg>")
    return "".join(parts)


def timeline(segments: Sequence[Segment], *, title: str, chart_id: str, now: float, width: int = 640) -> str:
    """Attempts as bars on a time axis (seconds since the first start), one lane each, labelled."""
    lanes = list(dict.fromkeys(s.lane for s in segments))
    height = 40 + 22 * max(1, len(lanes))
    head = (f'<svg id="{escape(chart_id)}" class="chart timeline" role="img" '
            f'aria-labelledby="{escape(chart_id)}-title" viewBox="0 0 {width} {height}" width="100%" '
            f'xmlns="http://www.w3.org/2000/svg"><title id="{escape(chart_id)}-title">{escape(title)}</title>')
    if not segments:
        return head + f'<text x="{width / 2}" y="24" text-anchor="middle">{escape(title)}: no attempt yet</text></svg>'
    t0 = min(s.start for s in segments)
    t1 = max(max(s.end, s.start) for s in segments)
    span = max(1.0, t1 - t0)
    left, right = 90, 16
    plot_w = width - left - right
    parts = [head]
    partitions = list(dict.fromkeys(s.label for s in segments))
    for s in segments:
        row = lanes.index(s.lane)
        x = left + (s.start - t0) / span * plot_w
        w = max(2.0, (max(s.end, s.start) - s.start) / span * plot_w)
        colour = PALETTE[partitions.index(s.label) % len(PALETTE)]
        y = 10 + row * 22
        parts.append(f'<text x="{left - 6}" y="{y + 13}" text-anchor="end" class="tick">{escape(s.lane)}</text>'
                     f'<rect class="segment" x="{x:.1f}" y="{y}" width="{w:.1f}" height="16" fill="{colour}">'
                     f'<title>{escape(s.lane)} on {escape(s.label)}: {_label(s.end - s.start)} s</title></rect>'
                     f'<text x="{x + 4:.1f}" y="{y + 12}" class="bar-label">{escape(s.label)}</text>')
    axis_y = 14 + len(lanes) * 22
    for t in nice_ticks(0, span, 4):
        x = left + t / span * plot_w
        parts.append(f'<text class="tick" x="{x:.1f}" y="{axis_y + 12}" text-anchor="middle">{_label(t)} s</text>')
    parts.append("</svg>")
    return "".join(parts)
