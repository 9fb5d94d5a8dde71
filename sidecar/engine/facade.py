"""Engine: a façade that wires the engine's rooms, no logic of its own beyond
the counts it reports.

The rooms: serving a range piece by piece (serving), the single-flight fetch
of missing blocks and its lifecycle (fetches), read-ahead (read_ahead),
warm-up (warm_up), blocks that left the cache told to the planner (evictions)
and the tasks no caller awaits (background).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing

from sidecar.cache import BlockIdent, BlockStore
from sidecar.engine.background import BackgroundTasks
from sidecar.engine.evictions import EvictedBlocks
from sidecar.engine.fetches import FOREGROUND_PARTS, Fetches
from sidecar.engine.origin_reader import OriginReader
from sidecar.engine.pieces import Piece, Source
from sidecar.engine.read_ahead import ReadAhead
from sidecar.engine.serving import RangeServer
from sidecar.engine.warm_up import WarmResult, WarmUp
from sidecar.isolation.modes import ModeState
from sidecar.model import FetchDone, ObjectInfo
from sidecar.prefetch.planner import ReadAheadPlanner
from sidecar.tally import ReadTally
from sidecar.telemetry.metrics import Metrics


class Engine:
    def __init__(
        self,
        store: BlockStore,
        origin: OriginReader,
        metrics: Metrics,
        block_size: int,
        max_coalesce_blocks: int,
        *,
        modes: ModeState | None = None,
        max_buffered_bytes: int | None = None,
        warm_concurrency: int = 4,
        planner: ReadAheadPlanner | None = None,
        foreground_parts: int = FOREGROUND_PARTS,
    ) -> None:
        self._store = store
        self._block_size = block_size
        modes = modes or ModeState()
        self._tasks = BackgroundTasks()
        self._evicted = EvictedBlocks(planner, metrics)
        self._fetches = Fetches(
            store, origin, modes, self._evicted, self._tasks, block_size=block_size,
            max_coalesce_blocks=max_coalesce_blocks, max_buffered_bytes=max_buffered_bytes,
            foreground_parts=foreground_parts,
        )
        self._read_ahead = None if planner is None else \
            ReadAhead(planner, origin, metrics, self._fetches, self._tasks, modes)
        self._server = RangeServer(store, origin, metrics, modes, self._fetches,
                                   self._read_ahead, self._evicted, block_size=block_size)
        self._warm_up = WarmUp(store, metrics, modes, self._fetches, block_size=block_size,
                               warm_concurrency=warm_concurrency)
        self._streams = 0  # ranges being served right now

    @property
    def block_size(self) -> int:
        return self._block_size

    def tell_background_fetches(self, listener: Callable[[FetchDone], None]) -> None:
        """`listener` hears of each prefetch and warm fetch as it ends (the
        access log's lines of them)."""
        self._fetches.on_background_done = listener

    async def stream(
        self, info: ObjectInfo, start: int, end: int, *, lazy: bool,
        tally: ReadTally | None = None,
    ) -> AsyncGenerator[tuple[Piece, Source], None]:
        """Yield the bytes of [start, end] (inclusive) in order, with their source.
        `tally`, if given, is told how each block was found (the access log's)."""
        self._streams += 1
        try:
            async with aclosing(self._server.pieces(info, start, end, lazy,
                                                    tally or ReadTally())) as pieces:
                async for piece in pieces:
                    yield piece
        finally:
            self._streams -= 1

    def will_hit(self, info: ObjectInfo, offset: int) -> bool:
        """Whether the block holding `offset` is cached or being read ahead (no side effects)."""
        return self._fetches.present(
            BlockIdent(info.bucket, info.key, info.etag, offset // self._block_size)
        )

    async def warm(
        self, info: ObjectInfo, start: int, end: int, ttl_s: float, concurrency: int = 4
    ) -> WarmResult:
        """Make the blocks of [start, end] (inclusive) cached and protected for
        ttl_s (sidecar.engine.warm_up)."""
        return await self._warm_up.warm(info, start, end, ttl_s, concurrency)

    def invalidate(self, bucket: str, key: str) -> int:
        """Drop every cached block of the object; how many were dropped."""
        purged = self._store.invalidate_object(bucket, key)
        self._evicted.left_cache(purged.unread)
        return purged.blocks

    def shrink_cache(self, nbytes: int) -> int:
        """Give about `nbytes` of the cache's disk space back; the bytes released."""
        shrunk = self._store.shrink(nbytes)
        self._evicted.left_cache(shrunk.evicted)
        return shrunk.released_bytes

    def activity(self) -> dict[str, int | bool]:
        """What is under way (the stats' `engine` section; tests await `idle`)."""
        read_ahead = self._read_ahead
        return {
            "streams": self._streams,
            "blocks_in_flight": len(self._fetches.on_their_way),
            "buffered_bytes": self._fetches.buffered_bytes,
            "prefetch_in_flight": read_ahead.blocks_in_flight if read_ahead else 0,
            "prefetch_pending": read_ahead.pending_blocks if read_ahead else 0,
            "idle": not self._streams and not self._tasks and not self._store.busy,
        }

    async def idle(self) -> None:
        """Wait until no fetch, landing, look-up or disk work is under way,
        including work that what is under way starts meanwhile (ranges still
        being streamed are their callers' to finish)."""
        while self._tasks or self._store.busy:
            await self._tasks.wait()
            await self._store.idle()

    async def close(self) -> None:
        await self._tasks.cancel()
