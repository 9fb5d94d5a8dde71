"""report.html: one self-contained page (inline CSS and SVG, no script, nothing
fetched) with the capacity curves, hit ratios over time and the topics that
miss most. Pure: documents in, text out.

Each chart is an <svg class="chart" data-chart=NAME data-points=N>, its series
<path class="series" data-series=NAME> or <rect class="bar">, its legend
<g class="legend"> of swatches (<rect class="swatch" data-series=NAME>), so a
test (and an operator's tooling) can find what was drawn.

Readable at a glance on a 1,400 px window: one quantity per chart (a ratio of
0-1 never shares an axis with origin bytes per served byte), charts as wide as
the page holds (two curves side by side, the time chart and the bars the whole
width), every label inside its chart, time ticks on round steps.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from spark_warmup.capacity.accuracy import trust_text

# The page's width for charts: a 1,400 px window less the body's margins.
PAGE_WIDTH = 1340
GAP = 24
HALF_WIDTH = (PAGE_WIDTH - GAP) // 2
HEIGHT = 300
LEFT, RIGHT, TOP, BOTTOM = 64, 48, 30, 70
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b",
           "#e377c2")
# Round tick steps for time axes, seconds.
TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600,
              43200, 86400, 7 * 86400)
MAX_TICKS = 8
CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 32px; } h3 { font-size: 15px; }
table { border-collapse: collapse; margin: 8px 0; }
td, th { border-bottom: 1px solid #ddd; padding: 4px 10px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.charts { display: flex; flex-wrap: wrap; gap: GAPpx; }
figure { margin: 0; } figcaption { font-size: 13px; color: #555; }
svg.chart { background: #fff; border: 1px solid #ddd; display: block; }
svg.chart text { font-size: 12px; fill: #444; }
.grid { stroke: #eee; } .axis { stroke: #999; }
.series { fill: none; stroke-width: 2; }
.target { stroke: #999; stroke-dasharray: 4 3; }
.note { color: #555; max-width: PAGEpx; }
""".replace("GAP", str(GAP)).replace("PAGE", str(PAGE_WIDTH))

TickText = Callable[[float], str]


def size_text(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, factor in (("TiB", 1024 ** 4), ("GiB", 1024 ** 3), ("MiB", 1024 ** 2),
                         ("KiB", 1024)):
        if value >= factor:
            scaled = value / factor
            # Three significant digits, but never an exponent: 1000 to 1023 of a
            # unit (and past 1000 TiB) would read "1e+03".
            return f"{scaled:.0f} {unit}" if scaled >= 999.5 else f"{scaled:.3g} {unit}"
    return f"{value:.0f} B"


def percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def _scale(lo: float, hi: float, out_lo: float, out_hi: float,
           log: bool = False) -> Callable[[float], float]:
    if log:
        lo, hi = math.log10(max(lo, 1e-9)), math.log10(max(hi, 1e-9))
    span = (hi - lo) or 1.0

    def at(value: float) -> float:
        v = math.log10(max(value, 1e-9)) if log else value
        return out_lo + (v - lo) / span * (out_hi - out_lo)
    return at


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k at or above `value` (an axis's top)."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(float(step * power) for step in (1, 2, 2.5, 5, 10)
                if step * power >= value * 0.9999)


def time_ticks(lo: float, hi: float) -> list[tuple[float, str]]:
    """Ticks on a round step (10 s, 5 min, 1 h...), at most MAX_TICKS, each label
    once, as precise as the step needs."""
    span = hi - lo
    step = next((s for s in TIME_STEPS if span / s <= MAX_TICKS), TIME_STEPS[-1])
    shown = "%H:%M:%S" if step < 60 else "%H:%M" if step < 86400 else "%m-%d"
    if span >= 86400 and step < 86400:
        shown = "%m-%d " + shown
    first = math.ceil(lo / step) * step
    ticks = [float(first + n * step) for n in range(int((hi - first) // step) + 1)] or [lo]
    return [(t, datetime.fromtimestamp(t, UTC).strftime(shown)) for t in ticks]


def size_ticks(lo: float, hi: float) -> list[tuple[float, str]]:
    """Powers of two between lo and hi (a log axis of cache sizes), thinned to
    MAX_TICKS; the ends themselves when no power lies between."""
    low, high = math.ceil(math.log2(max(lo, 1))), math.floor(math.log2(max(hi, 1)))
    powers = list(range(low, high + 1))
    if len(powers) < 2:
        return [(lo, size_text(lo)), (hi, size_text(hi))] if hi > lo else [(lo, size_text(lo))]
    stride = math.ceil(len(powers) / MAX_TICKS)
    return [(2.0 ** p, size_text(2 ** p)) for p in powers[::stride]]


def _legend(labels: Sequence[str], width: int, y: float) -> str:
    """A row of swatches and labels, centred under the plot."""
    items = []
    widths = [24 + 7 * len(label) + 20 for label in labels]
    x = max(4.0, (width - sum(widths)) / 2)
    for number, (label, item_width) in enumerate(zip(labels, widths, strict=True)):
        colour = COLOURS[number % len(COLOURS)]
        items.append(f'<rect class="swatch" data-series="{html.escape(label)}" x="{x:.1f}" '
                     f'y="{y - 9:.1f}" width="14" height="10" fill="{colour}"/>'
                     f'<text x="{x + 20:.1f}" y="{y:.1f}">{html.escape(label)}</text>')
        x += item_width
    return f'<g class="legend">{"".join(items)}</g>'


def line_chart(name: str, series: Mapping[str, Sequence[tuple[float, float]]], *,
               x_label: str, y_label: str, x_ticks: Callable[[float, float],
                                                              list[tuple[float, str]]],
               y_max: float = 1.0, y_text: TickText = lambda v: f"{v:.2g}",
               width: int = HALF_WIDTH, log_x: bool = False,
               marks: Sequence[tuple[str, float]] = (), target: float | None = None) -> str:
    """Lines of (x, y) points; y from 0 to y_max; `marks`: labelled vertical lines."""
    xs = [x for points in series.values() for x, _ in points] + [x for _, x in marks]
    if not xs:
        return f'<p class="note">No data for {html.escape(name)}.</p>'
    lo, hi = min(xs), max(xs)
    plot_right = width - RIGHT
    x_at = _scale(lo, hi, LEFT, plot_right, log_x)
    if hi == lo:
        x_at = lambda _value: (LEFT + plot_right) / 2  # noqa: E731 (one x: the middle)
    y_at = _scale(0.0, y_max, HEIGHT - BOTTOM, TOP)
    parts = [f'<svg class="chart" data-chart="{html.escape(name)}" '
             f'data-points="{sum(len(p) for p in series.values())}" width="{width}" '
             f'height="{HEIGHT}" viewBox="0 0 {width} {HEIGHT}" '
             'xmlns="http://www.w3.org/2000/svg">']
    for tick in range(6):
        value = y_max * tick / 5
        y = y_at(value)
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{plot_right}" y1="{y:.1f}" '
                     f'y2="{y:.1f}"/><text x="{LEFT - 6}" y="{y + 4:.1f}" '
                     f'text-anchor="end">{html.escape(y_text(value))}</text>')
    for value, label in x_ticks(lo, hi):
        x = x_at(value)
        parts.append(f'<line class="grid" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" '
                     f'y2="{HEIGHT - BOTTOM}"/><text class="tick" x="{x:.1f}" '
                     f'y="{HEIGHT - BOTTOM + 18}" text-anchor="middle">'
                     f'{html.escape(label)}</text>')
    parts.append(f'<line class="axis" x1="{LEFT}" x2="{plot_right}" y1="{HEIGHT - BOTTOM}" '
                 f'y2="{HEIGHT - BOTTOM}"/>')
    parts.append(f'<text x="{(LEFT + plot_right) / 2}" y="{HEIGHT - BOTTOM + 36}" '
                 f'text-anchor="middle">{html.escape(x_label)}</text>')
    parts.append(f'<text x="{LEFT}" y="{TOP - 12}" text-anchor="start">'
                 f'{html.escape(y_label)}</text>')
    if target is not None:
        y = y_at(target)
        parts.append(f'<line class="target" x1="{LEFT}" x2="{plot_right}" y1="{y:.1f}" '
                     f'y2="{y:.1f}"/><text x="{plot_right - 4}" y="{y - 4:.1f}" '
                     f'text-anchor="end">target {html.escape(y_text(target))}</text>')
    for label, x_value in marks:
        x = x_at(x_value)
        # Labelled on the side with room, never past the chart's edge.
        anchor, dx = ("start", 3) if x < (LEFT + plot_right) / 2 else ("end", -3)
        parts.append(f'<line class="target" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" '
                     f'y2="{HEIGHT - BOTTOM}"/><text x="{x + dx:.1f}" y="{TOP + 12}" '
                     f'text-anchor="{anchor}">{html.escape(label)}</text>')
    for number, (label, points) in enumerate(series.items()):
        colour = COLOURS[number % len(COLOURS)]
        ordered = sorted(points)
        path = " ".join(f"{'M' if i == 0 else 'L'}{x_at(x):.1f},{y_at(min(y, y_max)):.1f}"
                        for i, (x, y) in enumerate(ordered))
        if len(ordered) == 1:  # one point: a dot, or nothing would be drawn
            x, y = ordered[0]
            parts.append(f'<circle cx="{x_at(x):.1f}" cy="{y_at(min(y, y_max)):.1f}" r="3" '
                         f'fill="{colour}"/>')
        parts.append(f'<path class="series" data-series="{html.escape(label)}" '
                     f'stroke="{colour}" d="{path}"/>')
    parts.append(_legend(list(series), width, HEIGHT - 10))
    parts.append("</svg>")
    return "".join(parts)


def bar_chart(name: str, bars: Sequence[tuple[str, float]], value_text: TickText,
              width: int = PAGE_WIDTH) -> str:
    """Horizontal bars, largest first."""
    if not bars:
        return f'<p class="note">No data for {html.escape(name)}.</p>'
    row = 24
    height = TOP + row * len(bars) + 8
    label_width = 260
    top = max(value for _, value in bars) or 1.0
    parts = [f'<svg class="chart" data-chart="{html.escape(name)}" data-points="{len(bars)}" '
             f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
             'xmlns="http://www.w3.org/2000/svg">']
    for number, (label, value) in enumerate(bars):
        y = TOP + number * row
        bar = max(1.0, (width - label_width - 110) * value / top)
        shown = label if len(label) <= 36 else label[:35] + "\u2026"
        parts.append(f'<text x="{label_width - 8}" y="{y + 15}" text-anchor="end">'
                     f'<title>{html.escape(label)}</title>{html.escape(shown)}</text>'
                     f'<rect class="bar" data-series="{html.escape(label)}" x="{label_width}" '
                     f'y="{y + 3}" width="{bar:.1f}" height="{row - 8}" fill="{COLOURS[1]}"/>'
                     f'<text x="{label_width + bar + 6:.1f}" y="{y + 15}">'
                     f'{html.escape(value_text(value))}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _nodes_table(nodes: Mapping[str, Any]) -> list[str]:
    out = ["<h2>Nodes</h2><table><tr><th>node</th><th>requests</th><th>served</th>"
           "<th>byte hit ratio</th><th>origin (logged)</th><th>foreground</th>"
           "<th>prefetch</th><th>warm</th><th>cache now</th><th>recommended</th>"
           "<th>best predicted</th><th>bound by first reads</th></tr>"]
    for node, facts in nodes.items():
        lanes = facts.get("origin_bytes_by_lane") or {}
        recommended = facts["recommended_cache_bytes"]
        # A node with no reads has no curve: nothing was tried, nothing not reached.
        recommended_text = size_text(recommended) if recommended else \
            "not reached" if facts["requests"] else "-"
        out.append(
            f"<tr><td>{html.escape(node)}</td><td>{facts['requests']}</td>"
            f"<td>{size_text(facts['served_bytes'])}</td>"
            f"<td>{percent(facts['byte_hit_ratio'])}</td>"
            f"<td>{size_text(facts['origin_bytes'])}</td>"
            + "".join(f"<td>{size_text(lanes.get(lane))}</td>"
                      for lane in ("foreground", "prefetch", "warm"))
            + f"<td>{size_text(facts['current_cache_bytes'])}</td>"
            f"<td>{recommended_text}</td>"
            f"<td>{percent(facts.get('best_predicted_byte_hit_ratio'))}</td>"
            f"<td>{percent(facts.get('hit_ratio_bound'))}</td></tr>")
    out.append("</table>")
    return out


def finding_line(node: str, facts: Mapping[str, Any], target: float) -> str:
    """A node's findings in one line, as the job prints them: the size for the
    target, or why none reaches it (unreached_note says the same at length)."""
    if not facts["requests"]:
        return (f"{node}: no object reads, only background fetches "
                f"({facts['origin_bytes']} origin bytes); no curve")
    head = (f"{node}: {facts['requests']} requests, byte hit ratio "
            f"{percent(facts['byte_hit_ratio'])}")
    recommended = facts.get("recommended_cache_bytes")
    if recommended:
        return f"{head}; for {percent(target)}: {size_text(recommended)} ({recommended} bytes)"
    why = []
    if facts.get("hit_ratio_bound") is not None:
        why.append(f"first reads bound it at {percent(facts['hit_ratio_bound'])}")
    best, best_size = facts.get("best_predicted_byte_hit_ratio"), facts.get(
        "best_predicted_cache_bytes")
    if best is not None and best_size:
        why.append(f"the best, {percent(best)}, at {size_text(best_size)}")
    return (f"{head}; {percent(target)} is not reached at any size tried"
            + (f" ({'; '.join(why)})" if why else ""))


def unreached_note(node: str, facts: Mapping[str, Any], target: float) -> str | None:
    """Why a target is not reached, and the size that reaches what can be: the
    first read of every block misses (unless read-ahead brought it), so no
    cache size passes that bound."""
    if facts.get("recommended_cache_bytes"):
        return None
    bound = facts.get("hit_ratio_bound")
    best = facts.get("best_predicted_byte_hit_ratio")
    best_size = facts.get("best_predicted_cache_bytes")
    text = f"{node}: the target {percent(target)} is not reached at any size tried."
    if bound is not None:
        text += (f" First reads bound the byte hit ratio at {percent(bound)}: a cache that "
                 "holds everything still misses the first read of each block that "
                 "read-ahead did not bring.")
    if best is not None and best_size:
        text += (f" The best predicted ratio, {percent(best)}, is reached at "
                 f"{size_text(best_size)}; a larger cache buys nothing more.")
    return f'<p class="note unreached">{html.escape(text)}</p>'


def _curves(nodes: Mapping[str, Any], target: float) -> list[str]:
    out = ["<h2>Cache size &rarr; predicted byte hit ratio and origin reads</h2>"]
    for node, facts in nodes.items():
        curve = facts["curve"]
        if not facts["requests"]:
            out.append(f'<p class="note">{html.escape(node)}: no object reads in its log, only '
                       "read-ahead or warm-up fetches: no curve to draw.</p>")
            continue
        marks = []
        if facts["current_cache_bytes"]:
            marks.append(("now", float(facts["current_cache_bytes"])))
        if facts["recommended_cache_bytes"]:
            marks.append(("recommended", float(facts["recommended_cache_bytes"])))
        hit = [(float(p["cache_bytes"]), float(p["byte_hit_ratio"])) for p in curve]
        origin = {
            "origin bytes per served byte": [
                (float(p["cache_bytes"]), float(p["origin_bytes_per_served_byte"]))
                for p in curve],
            "of which read-ahead evicted unread": [
                (float(p["cache_bytes"]), float(p.get("read_ahead_wasted_per_served_byte", 0)))
                for p in curve],
        }
        y_max = nice_ceiling(max([0.1] + [y for points in origin.values() for _, y in points]))
        out.append('<div class="charts">')
        out.append(f"<figure>{line_chart(f'curve:{node}', {'byte hit ratio': hit}, x_label='cache size', y_label='predicted byte hit ratio (0-1)', x_ticks=size_ticks, log_x=True, marks=marks, target=target)}"  # noqa: E501
                   f"<figcaption>{html.escape(node)}: byte hit ratio</figcaption></figure>")
        out.append(f"<figure>{line_chart(f'origin:{node}', origin, x_label='cache size', y_label='origin bytes per served byte', x_ticks=size_ticks, y_max=y_max, log_x=True, marks=marks)}"  # noqa: E501
                   f"<figcaption>{html.escape(node)}: origin bytes per served byte "
                   "(what the object store bills)</figcaption></figure>")
        out.append("</div>")
        if "accuracy" in facts:
            out.append(f'<p class="note trust">{html.escape(trust_text(facts["accuracy"]))}'
                       "</p>")
        note = unreached_note(node, facts, target)
        if note:
            out.append(note)
    return out


def render_html(summary: Mapping[str, Any], over_time: Sequence[Mapping[str, Any]],
                topic_rows: Sequence[Mapping[str, Any]], window_s: int) -> str:
    """The page. `topic_rows` (per node and topic) are summed in `summary["topics"]`,
    which both the bars and the Topics table show."""
    del topic_rows  # the summary's topics are the one set of per-topic figures
    target = float(summary["target_hit_ratio"])
    nodes: Mapping[str, Any] = summary["nodes"]
    out = ["<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">",
           "<title>Cache capacity report</title>", f"<style>{CSS}</style></head><body>",
           "<h1>Cache capacity report</h1>",
           f'<p class="note">{len(nodes)} node(s), {summary["lines"]["reads"]} object reads '
           f'analysed; {summary["lines"]["malformed"]} malformed and '
           f'{summary["lines"]["unreadable"]} unreadable lines skipped. Target byte hit ratio '
           f"{percent(target)}. Curves are predicted by replaying each node's reads through "
           "the sidecar's own eviction policy and read-ahead at each size. Origin bytes are "
           "what the access log records for every lane (foreground, prefetch, warm), as "
           "the sidecar's own counters do.</p>"]
    out += _nodes_table(nodes)
    out += _curves(nodes, target)
    out.append(f"<h2>Byte hit ratio over time ({window_s}s windows)</h2>")
    series: dict[str, list[tuple[float, float]]] = {}
    for row in over_time:
        if row["served_bytes"]:
            series.setdefault(str(row["node"]), []).append(
                (float(row["window_start"]), row["hit_bytes"] / row["served_bytes"]))
    out.append(line_chart("hit-ratio-over-time", series, x_label="time (UTC)",
                          y_label="byte hit ratio (0-1)", x_ticks=time_ticks,
                          width=PAGE_WIDTH, target=target))
    topics: Mapping[str, Any] = summary["topics"]
    top = sorted(((t, float(f["origin_bytes"])) for t, f in topics.items()
                  if f["origin_bytes"] > 0), key=lambda tv: (-tv[1], tv[0]))[:10]
    out.append("<h2>Topics that miss most (bytes read from the origin, as in the Topics "
               "table)</h2>")
    out.append(bar_chart("top-missing-topics", top, size_text))
    out.append("<h2>Topics</h2><table><tr><th>topic</th><th>served</th>"
               "<th>byte hit ratio</th><th>origin</th></tr>")
    for topic, facts in list(topics.items())[:50]:
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
