"""report.html: one self-contained page (inline CSS and SVG, no script, nothing
fetched) with the capacity curves, hit ratios over time and the topics that
miss most. Pure: documents in, text out.

Each chart is an <svg class="chart" data-chart=NAME data-points=N>, its series
<path class="series" data-series=NAME> or <rect class="bar">, so a test (and an
operator's tooling) can find what was drawn.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

WIDTH, HEIGHT = 640, 260
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 16, 40
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b",
           "#e377c2")
CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; max-width: 1400px; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 32px; } h3 { font-size: 15px; }
table { border-collapse: collapse; margin: 8px 0; }
td, th { border-bottom: 1px solid #ddd; padding: 4px 10px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.charts { display: flex; flex-wrap: wrap; gap: 24px; }
figure { margin: 0; } figcaption { font-size: 13px; color: #555; }
svg.chart { background: #fff; border: 1px solid #ddd; }
svg.chart text { font-size: 11px; fill: #555; }
.grid { stroke: #eee; } .axis { stroke: #999; }
.series { fill: none; stroke-width: 2; }
.target { stroke: #999; stroke-dasharray: 4 3; }
.note { color: #555; }
"""


def size_text(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, factor in (("TiB", 1024 ** 4), ("GiB", 1024 ** 3), ("MiB", 1024 ** 2),
                         ("KiB", 1024)):
        if value >= factor:
            return f"{value / factor:.3g} {unit}"
    return f"{value:.0f} B"


def percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def _scale(lo: float, hi: float, out_lo: float, out_hi: float, log: bool = False):  # type: ignore[no-untyped-def]
    if log:
        lo, hi = math.log10(max(lo, 1e-9)), math.log10(max(hi, 1e-9))
    span = (hi - lo) or 1.0

    def at(value: float) -> float:
        v = math.log10(max(value, 1e-9)) if log else value
        return out_lo + (v - lo) / span * (out_hi - out_lo)
    return at


def line_chart(name: str, series: Mapping[str, Sequence[tuple[float, float]]], *,
               x_label: str, y_label: str, x_text: Any, y_max: float = 1.0,
               log_x: bool = False, marks: Sequence[tuple[str, float]] = (),
               target: float | None = None) -> str:
    """Lines of (x, y) points; y from 0 to y_max; `marks`: labelled vertical lines."""
    xs = [x for points in series.values() for x, _ in points] + [x for _, x in marks]
    if not xs:
        return f'<p class="note">No data for {html.escape(name)}.</p>'
    x_at = _scale(min(xs), max(xs), LEFT, WIDTH - RIGHT, log_x)
    y_at = _scale(0.0, y_max, HEIGHT - BOTTOM, TOP)
    parts = [f'<svg class="chart" data-chart="{html.escape(name)}" '
             f'data-points="{sum(len(p) for p in series.values())}" width="{WIDTH}" '
             f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" '
             'xmlns="http://www.w3.org/2000/svg">']
    for tick in range(6):
        value = y_max * tick / 5
        y = y_at(value)
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" '
                     f'y2="{y:.1f}"/><text x="{LEFT - 6}" y="{y + 4:.1f}" '
                     f'text-anchor="end">{html.escape(f"{value:.2g}")}</text>')
    lo, hi = min(xs), max(xs)
    for tick in range(5):
        value = (lo * (hi / lo) ** (tick / 4)) if log_x and lo > 0 else lo + (hi - lo) * tick / 4
        x = x_at(value)
        parts.append(f'<text x="{x:.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle">'
                     f'{html.escape(x_text(value))}</text>')
    parts.append(f'<line class="axis" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{HEIGHT - BOTTOM}" '
                 f'y2="{HEIGHT - BOTTOM}"/>')
    parts.append(f'<text x="{(LEFT + WIDTH - RIGHT) / 2}" y="{HEIGHT - 6}" '
                 f'text-anchor="middle">{html.escape(x_label)}</text>')
    parts.append(f'<text x="12" y="{TOP + 8}" text-anchor="start">{html.escape(y_label)}</text>')
    if target is not None:
        y = y_at(target)
        parts.append(f'<line class="target" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" '
                     f'y2="{y:.1f}"/>')
    for label, x_value in marks:
        x = x_at(x_value)
        parts.append(f'<line class="target" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" '
                     f'y2="{HEIGHT - BOTTOM}"/><text x="{x + 3:.1f}" y="{TOP + 10}">'
                     f'{html.escape(label)}</text>')
    for number, (label, points) in enumerate(series.items()):
        colour = COLOURS[number % len(COLOURS)]
        ordered = sorted(points)
        path = " ".join(f"{'M' if i == 0 else 'L'}{x_at(x):.1f},{y_at(min(y, y_max)):.1f}"
                        for i, (x, y) in enumerate(ordered))
        if len(ordered) == 1:  # one point: a dot, or nothing would be drawn
            x, y = ordered[0]
            parts.append(f'<circle cx="{x_at(x):.1f}" cy="{y_at(y):.1f}" r="3" '
                         f'fill="{colour}"/>')
        parts.append(f'<path class="series" data-series="{html.escape(label)}" '
                     f'stroke="{colour}" d="{path}"/>')
        parts.append(f'<text x="{WIDTH - RIGHT - 4}" y="{TOP + 14 * (number + 1)}" '
                     f'text-anchor="end" fill="{colour}">{html.escape(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def bar_chart(name: str, bars: Sequence[tuple[str, float]], value_text: Any) -> str:
    """Horizontal bars, largest first."""
    if not bars:
        return f'<p class="note">No data for {html.escape(name)}.</p>'
    row = 24
    height = TOP + row * len(bars) + 8
    label_width = 180
    top = max(value for _, value in bars) or 1.0
    parts = [f'<svg class="chart" data-chart="{html.escape(name)}" data-points="{len(bars)}" '
             f'width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" '
             'xmlns="http://www.w3.org/2000/svg">']
    for number, (label, value) in enumerate(bars):
        y = TOP + number * row
        width = max(1.0, (WIDTH - label_width - 90) * value / top)
        parts.append(f'<text x="{label_width - 6}" y="{y + 15}" text-anchor="end">'
                     f'{html.escape(label[:28])}</text>'
                     f'<rect class="bar" data-series="{html.escape(label)}" x="{label_width}" '
                     f'y="{y + 3}" width="{width:.1f}" height="{row - 8}" fill="{COLOURS[1]}"/>'
                     f'<text x="{label_width + width + 6:.1f}" y="{y + 15}">'
                     f'{html.escape(value_text(value))}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _time_text(window_s: int) -> Any:
    shown = "%H:%M:%S" if window_s < 60 else "%m-%d %H:%M"
    return lambda value: datetime.fromtimestamp(value, UTC).strftime(shown)


def render_html(summary: Mapping[str, Any], over_time: Sequence[Mapping[str, Any]],
                topic_rows: Sequence[Mapping[str, Any]], window_s: int) -> str:
    target = float(summary["target_hit_ratio"])
    nodes: Mapping[str, Any] = summary["nodes"]
    out = ["<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">",
           "<title>Cache capacity report</title>", f"<style>{CSS}</style></head><body>",
           "<h1>Cache capacity report</h1>",
           f'<p class="note">{len(nodes)} node(s), {summary["lines"]["reads"]} object reads '
           f'analysed; {summary["lines"]["malformed"]} malformed and '
           f'{summary["lines"]["unreadable"]} unreadable lines skipped. Target byte hit ratio '
           f"{percent(target)}. Curves are predicted by replaying each node's reads through "
           "the sidecar's own eviction policy and read-ahead at each size.</p>",
           "<h2>Nodes</h2><table><tr><th>node</th><th>requests</th><th>served</th>"
           "<th>byte hit ratio</th><th>origin (logged)</th><th>cache now</th>"
           "<th>recommended</th><th>best predicted</th></tr>"]
    for node, facts in nodes.items():
        out.append(
            f"<tr><td>{html.escape(node)}</td><td>{facts['requests']}</td>"
            f"<td>{size_text(facts['served_bytes'])}</td>"
            f"<td>{percent(facts['byte_hit_ratio'])}</td>"
            f"<td>{size_text(facts['origin_bytes'])}</td>"
            f"<td>{size_text(facts['current_cache_bytes'])}</td>"
            f"<td>{size_text(facts['recommended_cache_bytes']) if facts['recommended_cache_bytes'] else 'not reached'}</td>"  # noqa: E501
            f"<td>{percent(facts.get('best_predicted_byte_hit_ratio'))}</td></tr>")
    out.append("</table>")
    out.append("<h2>Cache size &rarr; predicted byte hit ratio</h2><div class=\"charts\">")
    for node, facts in nodes.items():
        curve = facts["curve"]
        marks = []
        if facts["current_cache_bytes"]:
            marks.append(("now", float(facts["current_cache_bytes"])))
        if facts["recommended_cache_bytes"]:
            marks.append(("recommended", float(facts["recommended_cache_bytes"])))
        hit = [(float(p["cache_bytes"]), float(p["byte_hit_ratio"])) for p in curve]
        origin = [(float(p["cache_bytes"]), float(p["origin_bytes_per_served_byte"]))
                  for p in curve]
        y_max = max([1.0] + [y for _, y in origin])
        out.append(f"<figure>{line_chart(f'curve:{node}', {'byte hit ratio': hit, 'origin bytes per served byte': origin}, x_label='cache size', y_label='ratio', x_text=size_text, y_max=y_max, log_x=True, marks=marks, target=target)}"  # noqa: E501
                   f"<figcaption>{html.escape(node)}</figcaption></figure>")
    out.append("</div>")
    out.append(f"<h2>Byte hit ratio over time ({window_s}s windows)</h2>")
    series: dict[str, list[tuple[float, float]]] = {}
    for row in over_time:
        if row["served_bytes"]:
            series.setdefault(str(row["node"]), []).append(
                (float(row["window_start"]), row["hit_bytes"] / row["served_bytes"]))
    out.append(line_chart("hit-ratio-over-time", series, x_label="time (UTC)",
                          y_label="byte hit ratio", x_text=_time_text(window_s),
                          target=target))
    misses: dict[str, float] = {}
    for row in topic_rows:
        misses[str(row["topic"])] = misses.get(str(row["topic"]), 0.0) + \
            float(row["served_bytes"] - row["hit_bytes"])
    top = sorted(((t, v) for t, v in misses.items() if v > 0), key=lambda tv: -tv[1])[:10]
    out.append("<h2>Topics that miss most (bytes served from the origin)</h2>")
    out.append(bar_chart("top-missing-topics", top, size_text))
    out.append("<h2>Topics</h2><table><tr><th>topic</th><th>served</th>"
               "<th>byte hit ratio</th><th>origin</th></tr>")
    for topic, facts in list(summary["topics"].items())[:50]:
        out.append(f"<tr><td>{html.escape(topic)}</td><td>{size_text(facts['served_bytes'])}"
                   f"</td><td>{percent(facts['byte_hit_ratio'])}</td>"
                   f"<td>{size_text(facts['origin_bytes'])}</td></tr>")
    out.append("</table>")
    if summary["problems"]:
        out.append("<h2>Lines skipped</h2><table><tr><th>why</th><th>lines</th></tr>")
        for problem in summary["problems"]:
            out.append(f"<tr><td>{html.escape(problem['kind'])}: "
                       f"{html.escape(str(problem['reason']))}</td>"
                       f"<td>{problem['lines']}</td></tr>")
        out.append("</table>")
    out.append("</body></html>\n")
    return "\n".join(out)
