"""Taking the memory tier's pages at start, in the background.

A chunk copied into a page the kernel has yet to give costs the origin thread
about four times the copy itself: a fresh shared-memory page, and on a virtual
machine often a fault on the host as well (bench/ANALYSIS.md). So the store
asks for the tier's pages once, when the sidecar starts, a step at a time in
its disk executor (``MemoryTier.reserve``), and a cold replay's chunks land in
pages already there. The memory given to the tier is then taken at start, not
in the middle of a catch-up: a container limit too small for it shows when
the sidecar starts. A region evicted later still takes fresh pages for its
refill (a socket may hold the old ones), so this helps each region's first fill.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from sidecar.cache.disk_work import DiskWork
from sidecar.cache.memory_tier import MemoryTier

# fallocate(2) of 64 MiB takes 15-100 ms here: short enough for the stop not
# to wait on it, long enough for the executor hand-offs not to count.
RESERVE_STEP_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Reserved:
    """What the reserve took: ``error`` says why it stopped short, if it did."""

    bytes: int
    seconds: float
    error: str | None = None


async def reserve(tier: MemoryTier, work: DiskWork, stopping: Callable[[], bool],
                  clock: Callable[[], float] = time.perf_counter) -> Reserved:
    """The tier's pages taken, ``RESERVE_STEP_BYTES`` at a time, until all
    are, ``stopping()`` says so (checked before each step), or the kernel
    refuses one (the rest is then taken as chunks come in, as without it)."""
    started, taken = clock(), 0
    for offset in range(0, tier.size_bytes, RESERVE_STEP_BYTES):
        if stopping():
            break
        try:
            taken += await work.run(tier.reserve, offset, RESERVE_STEP_BYTES)
        except OSError as exc:
            return Reserved(taken, clock() - started, exc.strerror or str(exc))
    return Reserved(taken, clock() - started)
