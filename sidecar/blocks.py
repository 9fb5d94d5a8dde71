"""Fixed-size block arithmetic: objects are cached as aligned blocks of
``block_size`` bytes, the last block of an object being shorter."""

from __future__ import annotations

from collections.abc import Iterable

# Block sizes the cache accepts: a block is a multiple of 4 KiB (a page, so no
# data page shares one with a slot header) from 64 KiB to 256 MiB (the slot
# header has room for the checksums of 256 chunks of 1 MiB).
MIN_BLOCK_SIZE = 64 * 1024
MAX_BLOCK_SIZE = 256 * 1024 * 1024


def block_count(size: int, block_size: int) -> int:
    """Number of blocks an object of ``size`` bytes occupies (0 for an empty object)."""
    _require_positive("block_size", block_size)
    _require_non_negative("size", size)
    return -(-size // block_size)


def blocks_for_range(start: int, end: int, block_size: int) -> range:
    """Ids of the blocks covering bytes ``start..end`` (``end`` inclusive)."""
    _require_positive("block_size", block_size)
    _require_non_negative("start", start)
    if start > end:
        raise ValueError(f"start {start} is after end {end}")
    return range(start // block_size, end // block_size + 1)


def block_span(block: int, block_size: int, size: int) -> tuple[int, int]:
    """``(start, end_exclusive)`` of ``block`` in an object of ``size`` bytes."""
    count = block_count(size, block_size)
    if not 0 <= block < count:
        raise ValueError(f"block {block} outside 0..{count - 1} for size {size}")
    start = block * block_size
    return start, min(start + block_size, size)


def coalesce_runs(blocks: Iterable[int], max_run: int) -> list[tuple[int, int]]:
    """Group block ids into ascending runs ``(first, last)`` of consecutive ids.

    Runs are capped at ``max_run`` blocks so that one origin request never
    fetches more than the caller is willing to buffer.
    """
    _require_positive("max_run", max_run)
    ids = sorted(set(blocks))
    if ids and ids[0] < 0:
        raise ValueError(f"block ids must be non-negative, got {ids[0]}")
    runs: list[tuple[int, int]] = []
    for block in ids:
        if runs and block == runs[-1][1] + 1 and block - runs[-1][0] < max_run:
            runs[-1] = (runs[-1][0], block)
        else:
            runs.append((block, block))
    return runs


def _require_positive(name: str, value: int) -> None:
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")


def _require_non_negative(name: str, value: int) -> None:
    if value < 0:
        raise ValueError(f"{name} must be non-negative, got {value}")
