"""Sizes (`8MiB`, `500MB`, bytes) and rates (`200MiB/s`) in the plan, and their display.

The same spelling as the sidecar's flags (docs/ARCHITECTURE.md); parsed here rather than
imported so that the job needs nothing of the sidecar but its pure modules.
"""

from __future__ import annotations

import re

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_MAX_SIZE = 2**63  # sizes and rates are int64s wherever they are kept (the report's table)
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*")


def parse_size(value: object) -> int:
    """`8MiB`, `10GiB`, `500MB`, `4096` or an int -> bytes; ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a size must not be negative, got {value}")
        return value
    match = _SIZE.fullmatch(value) if isinstance(value, str) else None
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ValueError(f"not a size: {value!r} (expected e.g. 8MiB, 10GiB, 500MB or bytes)")
    scaled = float(match.group(1)) * _UNITS[unit]
    # 309 digits and more are float infinity, which int() refuses with an OverflowError.
    if not scaled < _MAX_SIZE:
        raise ValueError(f"too large: {shorten(str(value))!r} (at most {_MAX_SIZE - 1} bytes)")
    return int(scaled)


def shorten(text: str, keep: int = 24) -> str:
    """`text` cut to about `keep` characters for an error message: a value of
    thousands of digits would otherwise fill the screen."""
    return text if len(text) <= keep else f"{text[:keep - 8]}...{text[-5:]}"


def parse_rate(value: object) -> float:
    """`200MiB/s`, `1.5GB/s` -> bytes per second (> 0); ValueError otherwise."""
    if not isinstance(value, str) or not value.strip().endswith("/s"):
        raise ValueError(f"not a rate: {value!r} (expected e.g. 200MiB/s)")
    rate = parse_size(value.strip()[:-2])
    if rate <= 0:
        raise ValueError(f"a rate must be positive, got {value!r}")
    return float(rate)


def format_bytes(count: float) -> str:
    """Binary units, as the sizes in the plan are usually written: `1.5 MiB`."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(count) < 1024 or unit == "TiB":
            return f"{count:.0f} B" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")
