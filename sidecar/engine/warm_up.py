"""Warm-up: make an object's blocks cached and protected for a while (the
`POST /api/v1/warm` API), through the same single-flight table as readers."""

from __future__ import annotations

import asyncio
from dataclasses import astuple, dataclass

from sidecar.blocks import blocks_for_range
from sidecar.cache import BlockIdent, BlockStore
from sidecar.engine.fetches import Fetches
from sidecar.errors import DownloadsPaused
from sidecar.isolation.modes import ModeState
from sidecar.model import WARM, ObjectInfo
from sidecar.telemetry.metrics import Metrics


@dataclass(frozen=True)
class WarmResult:
    """What a warm call did (the `POST /api/v1/warm` answer, docs/ARCHITECTURE.md)."""

    requested_blocks: int = 0
    already_cached: int = 0
    fetched: int = 0
    failed: int = 0
    bytes_fetched: int = 0

    def __add__(self, other: WarmResult) -> WarmResult:
        return WarmResult(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))


class WarmUp:
    def __init__(
        self, store: BlockStore, metrics: Metrics, modes: ModeState, fetches: Fetches,
        *, block_size: int, warm_concurrency: int,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._modes = modes
        self._fetches = fetches
        self._block_size = block_size
        self._warm_gate = asyncio.Semaphore(warm_concurrency)  # the warm lane's connections

    async def warm(
        self, info: ObjectInfo, start: int, end: int, ttl_s: float, concurrency: int = 4
    ) -> WarmResult:
        """Make the blocks of [start, end] (inclusive) cached and protected for ttl_s.

        Missing blocks are fetched on the `warm` lane, through the same
        single-flight table as readers (a block being fetched for someone else
        is waited for, not fetched again).
        """
        if not (self._modes.downloads and self._modes.caching):
            mode = self._modes.current.value
            raise DownloadsPaused(f"mode {mode}: warm-up is paused", mode)
        if info.size == 0 or start > end:
            return WarmResult()
        gate = asyncio.Semaphore(concurrency)
        results = await asyncio.gather(
            *(self._warm_block(info, block, ttl_s, gate)
              for block in blocks_for_range(start, min(end, info.size - 1), self._block_size))
        )
        return sum(results, WarmResult())

    async def _warm_block(
        self, info: ObjectInfo, block: int, ttl_s: float, gate: asyncio.Semaphore
    ) -> WarmResult:
        ident = BlockIdent(info.bucket, info.key, info.etag, block)
        if self._store.lookup(ident, touch=False) is not None:
            self._store.protect(ident, ttl_s)
            async with gate:
                await self._lift(ident)
            self._metrics.warm_blocks.labels("already_cached").inc()
            return WarmResult(1, already_cached=1)
        async with gate, self._warm_gate:
            # Readers' misses fill max_buffered: warm-up waits for room
            # rather than turn them away.
            await self._fetches.room_for_background(self._fetches.block_length(info, block))
            if not (self._modes.downloads and self._modes.caching):
                # The mode changed while this call waited its turn: cache-only
                # and bypass download nothing for warm-up, as at the call's start.
                self._metrics.warm_blocks.labels("failed").inc()
                return WarmResult(1, failed=1)
            task = self._fetches.fetch_one(info, block, WARM)
            try:
                if task is not None:
                    await asyncio.shield(task)
                    fetched = self._fetches.block_length(info, block)
                else:
                    pending = self._fetches.on_their_way.get(ident)
                    if pending is not None:
                        # Cached, not only whole: else it is not there to protect.
                        await self._fetches.sealed(pending)
                    fetched = 0
            except Exception:
                self._metrics.warm_blocks.labels("failed").inc()
                return WarmResult(1, failed=1)
        # A write that found every slot pinned leaves the block uncached.
        if not self._store.protect(ident, ttl_s) and \
                self._store.lookup(ident, touch=False) is None:
            self._metrics.warm_blocks.labels("failed").inc()
            return WarmResult(1, failed=1)
        if not fetched:
            async with gate:
                await self._lift(ident)  # it landed for another lane
            self._metrics.warm_blocks.labels("already_cached").inc()
            return WarmResult(1, already_cached=1)
        self._metrics.warm_blocks.labels("fetched").inc()
        # Nobody reads warmed blocks now: their pages go back at once.
        self._store.release_pages(ident)
        return WarmResult(1, fetched=1, bytes_fetched=fetched)

    async def _lift(self, ident: BlockIdent) -> None:
        """A block cached before this call, held in the memory tier until read
        as one it fetched is: the planned replay is served from memory whether
        or not its blocks were on the disk already. A lift that cannot (no
        tier, the block gone, a bad checksum) leaves it to the disk."""
        if await self._store.lift(ident):
            self._store.release_pages(ident)  # read past the page cache, or dropped now
