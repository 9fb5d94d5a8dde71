"""Blocks that left the cache, told to the read-ahead planner.

Every room that makes the store evict (a fetch's slot reservation, a sealed
block, a failed read, invalidation, shrinking) passes what it evicted here:
the planner forgets those blocks and counts read-ahead nobody read as wasted.
"""

from __future__ import annotations

from collections.abc import Iterable

from sidecar.cache import BlockIdent
from sidecar.prefetch.planner import ReadAheadPlanner
from sidecar.telemetry.metrics import Metrics


class EvictedBlocks:
    def __init__(self, planner: ReadAheadPlanner | None, metrics: Metrics) -> None:
        self._planner = planner
        self._metrics = metrics

    def left_cache(self, idents: Iterable[BlockIdent]) -> None:
        """Blocks left the cache: read-ahead nobody read was wasted."""
        if self._planner is None:
            return
        for ident in idents:
            if self._planner.on_evicted(ident):
                self._metrics.prefetch_blocks.labels("wasted").inc()
