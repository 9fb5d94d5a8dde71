"""Cache sizes to try, sampling rates, and the size recommended for a target. Pure."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

from spark_warmup.units import shorten

# Fractions of a node's footprint (the bytes of every object it served) the
# curve is drawn at when no sizes are given: dense where hit ratios change most.
FOOTPRINT_FRACTIONS = (1 / 64, 1 / 32, 1 / 16, 1 / 8, 3 / 16, 1 / 4, 3 / 8, 1 / 2, 3 / 4, 1.0,
                       1.25)
_UNITS = {"": 1, "B": 1, "KB": 1000, "MB": 1000 ** 2, "GB": 1000 ** 3, "TB": 1000 ** 4,
          "KIB": 1024, "MIB": 1024 ** 2, "GIB": 1024 ** 3, "TIB": 1024 ** 4}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*")


class SizeError(ValueError):
    pass


_MAX_SIZE = 2**63


def parse_sizes(text: str) -> list[int]:
    """`64GiB,128GiB,...` -> bytes, ascending, without repeats."""
    sizes: set[int] = set()
    for item in text.split(","):
        match = _SIZE.fullmatch(item)
        unit = match.group(2).upper() if match else ""
        if match is None or unit not in _UNITS:
            raise SizeError(f"--sizes: {item.strip()!r} is not a size (e.g. 64GiB, 500MB)")
        scaled = float(match.group(1)) * _UNITS[unit]
        # 309 digits and more are float infinity, which int() refuses; the report's
        # tables hold sizes as int64s.
        if not scaled < _MAX_SIZE:
            raise SizeError(f"--sizes: {shorten(item.strip())!r} is too large "
                            f"(at most {_MAX_SIZE - 1} bytes)")
        value = int(scaled)
        if value <= 0:
            raise SizeError(f"--sizes: {item.strip()!r} is not a positive size")
        sizes.add(value)
    if not sizes:
        raise SizeError("--sizes: no size given")
    return sorted(sizes)


def default_sizes(footprint_bytes: int, block_size: int, current: int | None) -> list[int]:
    """Sizes for a node's curve: fractions of its footprint, and its current size."""
    sizes = {max(block_size, int(footprint_bytes * f)) for f in FOOTPRINT_FRACTIONS}
    if current:
        sizes.add(current)
    return sorted(sizes)


def unbounded_size(footprint_bytes: int, block_size: int) -> int:
    """A cache size that holds every block of a footprint, slot headers and
    partial last blocks included: twice the footprint, and a block more for
    each of a thousand objects."""
    return 2 * footprint_bytes + 1024 * (block_size + 4096)


def sample_rate(requests: int, max_requests: int) -> float:
    """The share of a node's trace replayed: all of it up to max_requests."""
    if requests <= max_requests or requests == 0:
        return 1.0
    return max_requests / requests


def unit_hash(unit: str) -> float:
    """Spatial sampling's hash of a unit (a partition), in [0, 1): a unit is in the
    sample at rate R when its hash is below R. Stable in every process (Python's
    hash() is salted per process)."""
    # CRC-32 would do for stability but not for spread: keys differing in one
    # digit (partition 4, 5, ...) land close together.
    digest = hashlib.blake2b(unit.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2 ** 64


@dataclass(frozen=True)
class Point:
    cache_bytes: int
    byte_hit_ratio: float
    origin_bytes_per_served_byte: float
    # Of those origin bytes, read-ahead evicted before anyone read it.
    wasted_per_served_byte: float = 0.0


def recommend(curve: Sequence[Point], target: float) -> int | None:
    """The smallest size whose predicted byte hit ratio reaches `target`, between
    two points by linear interpolation; None when no size on the curve does."""
    points = sorted(curve, key=lambda p: p.cache_bytes)
    previous: Point | None = None
    for point in points:
        if point.byte_hit_ratio >= target:
            if previous is None or point.byte_hit_ratio == previous.byte_hit_ratio:
                return point.cache_bytes
            share = (target - previous.byte_hit_ratio) / \
                (point.byte_hit_ratio - previous.byte_hit_ratio)
            return int(previous.cache_bytes + share * (point.cache_bytes - previous.cache_bytes))
        previous = point
    return None


# Two ratios this close are the same on a curve (sampling and interpolation
# make finer differences meaningless).
SAME_RATIO = 0.0005


def best_size(curve: Sequence[Point]) -> Point | None:
    """The smallest size whose predicted byte hit ratio is the best on the curve
    (within SAME_RATIO): where a larger cache buys nothing more."""
    if not curve:
        return None
    best = max(point.byte_hit_ratio for point in curve)
    return min((point for point in curve if point.byte_hit_ratio >= best - SAME_RATIO),
               key=lambda point: point.cache_bytes)
