"""What every part of the report shares: reading a results dict, formatting
its figures, and the report's prose (bench/report_methods.md).

Pure: results in, text out.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

MiB = 1024 * 1024

#: A results file as bench/run.py writes it (JSON: scenarios, runs, settings).
Results = dict[str, Any]
#: One run's figures, as its scenario recorded them.
Run = dict[str, Any]
#: Formats one figure for a table cell.
Shown = Callable[[float], str]

TEMPLATES = Path(__file__).with_name("report_methods.md")
_BLOCK = re.compile(r"^<!-- block: ([\w-]+) -->$", re.MULTILINE)


# --- reading the results ---------------------------------------------------------------


def find_run(results: Results, scenario: str, run: str) -> Run | None:
    found = ((results.get("scenarios") or {}).get(scenario) or {}).get("runs", {}).get(run)
    return found if isinstance(found, dict) else None


def mbps(run: Run | None) -> float | None:
    value = run.get("mb_per_s") if run else None
    return float(value) if isinstance(value, int | float) else None


def ratio_of(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def sidecar_stat(run: Run | None, name: str) -> Any:
    if not run:
        return None
    stats = run.get("sidecar")
    if isinstance(stats, dict) and stats.get(name) is not None:
        return stats[name]
    return run.get(name)


def integrity_problem(*runs: Run | None) -> str | None:
    for run in runs:
        if run is None:
            continue
        if run.get("crc_errors"):
            return f"{run['crc_errors']} batch check failures"
        if run.get("exit_code") not in (None, 0):
            return f"replay exited {run['exit_code']}"
        errors = run.get("errors")
        if isinstance(errors, dict) and any(errors.values()):
            return f"wrk errors {errors}"
    return None


def rounds_of(results: Results, scenario: str, run: str) -> list[Run | None]:
    info = (results.get("scenarios") or {}).get(scenario) or {}
    count = int(info.get("rounds") or 0)
    return [find_run(results, scenario, f"{run}_{number}") for number in range(1, count + 1)]


def median(values: Sequence[float | None]) -> float | None:
    known = sorted(value for value in values if value is not None)
    if not known:
        return None
    middle = len(known) // 2
    return known[middle] if len(known) % 2 else (known[middle - 1] + known[middle]) / 2


def spread(values: Sequence[float | None], shown: Shown, rounds: bool = True) -> str:
    """`median (min-max, N rounds)`, each value formatted by `shown`."""
    known = [value for value in values if value is not None]
    if not known:
        return "n/a"
    if len(known) == 1:
        return str(shown(known[0]))
    count = f", {len(known)} rounds" if rounds else ""
    middle = median(known)
    assert middle is not None  # of values that are all known
    return f"{shown(middle)} ({shown(min(known))}-{shown(max(known))}{count})"


def cpu_per_gib(run: Run | None, part: str = "total") -> float | None:
    value = ((run or {}).get("server_cpu_per_gib") or {}).get(part)
    return float(value) if isinstance(value, int | float) else None


def fetch_latency(run: Run | None, name: str) -> float | None:
    value = ((run or {}).get("fetch_latency_ms") or {}).get(name)
    return float(value) if isinstance(value, int | float) else None


def probe_p99(run: Run | None) -> float | None:
    value = (((run or {}).get("probe") or {}).get("lateness_us") or {}).get("p99")
    return float(value) if isinstance(value, int | float) else None


def foreign_cores(run: Run | None) -> float:
    value = (((run or {}).get("probe") or {}).get("foreign_cpu") or {}).get("cores")
    return float(value) if isinstance(value, int | float) else 0.0


def broker_cpu(run: Run | None, field: str) -> float | None:
    value = ((run or {}).get(field) or {}).get("total")
    return float(value) if isinstance(value, int | float) else None


# --- formatting ---------------------------------------------------------------------


def times(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def pct(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{100 * value:.{digits}f}%"


def num(value: Any, digits: int = 1) -> str:
    return "n/a" if not isinstance(value, int | float) else f"{value:,.{digits}f}"


def status_text(met: bool | None) -> str:
    return {True: "met", False: "**not met**", None: "not measured"}[met]


def md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def prefetch_line(results: Results, scenario: str, run: str) -> str:
    """The sidecar's read-ahead and origin bytes under a replay's table."""
    data = find_run(results, scenario, run)
    if data is None:
        return ""
    samples = data.get("sidecar_prefetch_blocks_total")
    stats = data.get("sidecar") or {}
    shown = "absent (no read-ahead in this build)" if not samples else ", ".join(
        f"{key.removeprefix('outcome=')} {int(value)}" for key, value in sorted(samples.items()))
    listed = data.get("listed_via")
    return (f"Sidecar `sidecar_prefetch_blocks_total` after the run: {shown}; origin read "
            f"{num((stats.get('origin_bytes') or 0) / 1e6)} MB for "
            f"{num((data.get('bytes') or 0) / 1e6)} MB replayed"
            + (f"; listing via {listed}." if listed else "."))


# --- the prose ----------------------------------------------------------------------


@functools.cache
def _blocks() -> dict[str, str]:
    """bench/report_methods.md's blocks by name, each without its blank edges."""
    parts = _BLOCK.split(TEMPLATES.read_text(encoding="utf-8"))
    return {name: text.strip("\n") for name, text in zip(parts[1::2], parts[2::2], strict=True)}


def verbatim(name: str) -> str:
    """A block of the template file as it is written (markdown with its own line breaks)."""
    return _blocks()[name]


def paragraph(name: str, **values: object) -> str:
    """A block as one paragraph, its lines joined, each `{value}` filled in.

    The template wraps its prose for reading; BENCHMARKS.md has each paragraph
    on one line, as it always had.
    """
    return " ".join(_blocks()[name].split("\n")).format(**values)
