"""How far to trust a node's curve: the error the accuracy benchmark measured on
the grid cell nearest the node's regime. Pure but for reading the table.

`python -m bench.capacity_accuracy` serves a grid of workloads (streams read at
once, groups, cache share of the working set) with real sidecars and sets the
curve's predictions beside what they measured; it writes the errors of each
cell to accuracy.json beside this module. A node's regime is how many streams
its log shows at once and its cache's share of its footprint; the nearest cell
(on log scales of both) says how far its curve was off there.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

TABLE = Path(__file__).with_name("accuracy.json")


def load_cells(path: Path = TABLE) -> list[dict[str, Any]]:
    """The benchmark's cells, or none when it has not been run (or is unreadable)."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    cells = document.get("cells") if isinstance(document, dict) else None
    return [c for c in cells or [] if isinstance(c, dict)
            and {"streams", "share", "hit_error", "origin_error"} <= set(c)]


def nearest(cells: Sequence[Mapping[str, Any]], streams: float, share: float
            ) -> dict[str, Any] | None:
    """The cell nearest (streams, share), with its errors; None without cells."""
    def distance(cell: Mapping[str, Any]) -> float:
        return abs(math.log(max(streams, 1.0) / float(cell["streams"]))) + \
            abs(math.log(max(share, 0.01) / max(float(cell["share"]), 0.01)))
    if not cells:
        return None
    nearest_distance = min(distance(cell) for cell in cells)
    # The grid measures several access patterns at each point, all as near: the
    # log does not say which one a node's is, so the worst of them is quoted
    # (the first in the table would understate the error for the others).
    tied = [cell for cell in cells if distance(cell) <= nearest_distance + 1e-9]
    worst: Mapping[str, Any] = max(tied, key=lambda cell: abs(float(cell["hit_error"])))
    quoted = dict(worst)
    if len(tied) > 1:
        quoted["patterns"] = sorted({str(cell.get("pattern", "?")) for cell in tied})
    return quoted


def trust_text(cell: Mapping[str, Any] | None) -> str:
    if cell is None:
        return "No accuracy measurement to compare this node with (run python -m " \
            "bench.capacity_accuracy)."
    patterns = cell.get("patterns")
    pattern = (f"{cell.get('pattern', '?')}, the worst of the patterns measured there "
               f"({', '.join(patterns)})" if isinstance(patterns, list)
               else str(cell.get("pattern", "?")))
    return (f"How far to trust this curve: on the benchmark cell nearest this node "
            f"({cell['streams']} streams, {pattern}, cache at "
            f"{100 * float(cell['share']):.0f}% of the working set) the prediction was off by "
            f"{100 * float(cell['hit_error']):+.1f} points of byte hit ratio and "
            f"{100 * float(cell['origin_error']):+.1f}% of origin bytes per served byte"
            + _spreads(cell) + ".")


def _spreads(cell: Mapping[str, Any]) -> str:
    """How far the sidecar's own runs of the cell, and the curves of their logs,
    differed: an error within them says little either way."""
    runs, curves = cell.get("measured_hit_spread"), cell.get("predicted_hit_spread")
    if not isinstance(runs, (int, float)) or not isinstance(curves, (int, float)):
        return ""
    return (f"; the sidecar's runs of that cell differed by up to {100 * runs:.1f} points, "
            f"the curves of their logs by {100 * curves:.1f}")
