"""Serve a byte range: cache lookup -> single-flight fetch of misses -> stream.

One in-flight table (block ident -> the block's buffer as it arrives) is the
only way a block is fetched, so a block is fetched once however many readers
want it at the same time; each reader takes the block's bytes as they land
(sidecar.block_buffer). A block stays in the table until it is written to the
cache, so a reader never finds it in neither place and fetches it again.

A lookup is a hit when the block is in the cache or already on its way from the
origin (read ahead, warmed, or fetched for an earlier request): the reader's
request causes no origin read. A miss is a lookup that starts an origin fetch,
and only the bytes of fetches a request started count as served from origin.

Bounded requests fetch their adjacent missing blocks in one coalesced origin GET.
Open-ended requests (`bytes=pos-`, or no Range at all) are read lazily, a block at
a time as the client consumes: Kafka's RemoteLogManager opens `bytes=pos-` and
closes after about one fetch, so fetching ahead here would waste origin bytes.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine
from contextlib import aclosing
from dataclasses import astuple, dataclass
from typing import TYPE_CHECKING, Any, Protocol

from sidecar.block_buffer import BlockBuffer
from sidecar.blocks import block_span, blocks_for_range, coalesce_runs
from sidecar.cache import BlockIdent, BlockStore, SlabRegion
from sidecar.errors import DownloadsPaused, OriginBadBody, OriginCircuitOpen, Overloaded
from sidecar.isolation.modes import ModeState
from sidecar.model import ObjectInfo
from sidecar.telemetry.metrics import Metrics

if TYPE_CHECKING:
    from sidecar.prefetch.prefetcher import Prefetcher

log = logging.getLogger(__name__)

# Pieces handed to the HTTP layer: a client that stops after 1 MiB costs about
# 1 MiB of copying and hashing, not a whole block.
PIECE_SIZE = 1024 * 1024


# What the engine hands the HTTP layer: bytes, or a verified region of the slab
# file that the HTTP layer sends with sendfile(2) and then releases.
Piece = bytes | memoryview | SlabRegion


def piece_length(piece: Piece) -> int:
    return piece.count if isinstance(piece, SlabRegion) else len(piece)


@dataclass(frozen=True)
class WarmResult:
    """What a warm call did (the `POST /api/v1/warm` answer, DESIGN.md)."""

    requested_blocks: int = 0
    already_cached: int = 0
    fetched: int = 0
    failed: int = 0
    bytes_fetched: int = 0

    def __add__(self, other: WarmResult) -> WarmResult:
        return WarmResult(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))


class Source(enum.Enum):
    CACHE = "cache"
    ORIGIN = "origin"


class BlockReader(Protocol):
    """The origin as the engine needs it (handed in; tests give a fake)."""

    def read_range(
        self, info: ObjectInfo, start: int, end: int, lane: str
    ) -> AsyncGenerator[bytes, None]: ...


class Engine:
    def __init__(
        self,
        store: BlockStore,
        origin: BlockReader,
        metrics: Metrics,
        block_size: int,
        max_coalesce_blocks: int,
        zero_copy: bool = False,
        modes: ModeState | None = None,
        max_buffered_bytes: int | None = None,
        warm_concurrency: int = 4,
    ) -> None:
        self._store = store
        self._origin = origin
        self._metrics = metrics
        self._block_size = block_size
        self._max_run = max_coalesce_blocks
        # Cache hits as slab regions for sendfile(2) instead of copies (the
        # caller's event loop must support loop.sendfile).
        self._zero_copy = zero_copy
        self._modes = modes or ModeState()
        # Bytes of fetched blocks held for readers until they reach the cache:
        # past the bound, new foreground fetches are refused (503 SlowDown).
        self._max_buffered = max_buffered_bytes
        self._buffered = 0
        self._warm_gate = asyncio.Semaphore(warm_concurrency)  # the warm lane's connections
        self._in_flight: dict[BlockIdent, BlockBuffer] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.prefetcher: Prefetcher | None = None

    @property
    def block_size(self) -> int:
        return self._block_size

    async def stream(
        self, info: ObjectInfo, start: int, end: int, *, lazy: bool
    ) -> AsyncGenerator[tuple[Piece, Source], None]:
        """Yield the bytes of [start, end] (inclusive) in order, with their source."""
        prefetcher = self.prefetcher if self._modes.read_ahead else None
        stream = prefetcher.on_request(info, start) if prefetcher is not None else None
        if prefetcher is not None and stream is not None:
            prefetcher.on_delivered(stream, info, start)  # a continued stream reads ahead now
        position = start
        started: set[BlockIdent] = set()  # blocks whose origin fetch this request began
        blocks = blocks_for_range(start, end, self._block_size)
        for block in blocks:
            block_start, block_end = block_span(block, self._block_size, info.size)
            lo = max(start, block_start) - block_start
            hi = min(end + 1, block_end) - block_start
            ahead = range(block, block + 1) if lazy else range(block, blocks.stop)
            async for piece in self._block_pieces(info, block, lo, hi, ahead, started):
                yield piece
                # Back here only once the client took the piece: heads follow
                # delivered bytes, not the range asked for.
                position += piece_length(piece[0])
                if prefetcher is not None and stream is not None:
                    prefetcher.on_delivered(stream, info, position)

    async def _block_pieces(
        self, info: ObjectInfo, block: int, lo: int, hi: int, ahead: range,
        started: set[BlockIdent],
    ) -> AsyncIterator[tuple[Piece, Source]]:
        if not self._modes.caching:
            async for piece in self._bypass(info, block, lo, hi):
                yield piece
            return
        ident = BlockIdent(info.bucket, info.key, info.etag, block)
        record = self._store.lookup(ident)
        joined = ident in self._in_flight and ident not in started
        anticipated = record is not None or joined
        self._metrics.cache_lookups.labels("hit" if anticipated else "miss").inc()
        if not anticipated:
            log.debug("miss %s block %d", info.key, block)
        if self.prefetcher is not None:
            self.prefetcher.on_block_read(ident)
        while record is not None and lo < hi:
            upto = min(hi, lo + PIECE_SIZE)
            data: Piece | None
            if self._zero_copy:
                data = await self._store.read_region(record, lo, upto)
            else:
                data = await self._store.read(record, lo, upto)
            if data is None:  # evicted meanwhile, or failed its checksum: refetch
                break
            lo = upto
            yield data, Source.CACHE
        if lo >= hi:
            return
        source = Source.CACHE if joined else Source.ORIGIN
        async for view in self._fetching(info, ident, ahead, started).pieces(lo, hi, PIECE_SIZE):
            yield view, source

    async def _bypass(
        self, info: ObjectInfo, block: int, lo: int, hi: int
    ) -> AsyncIterator[tuple[Piece, Source]]:
        """Bypass mode: the bytes straight from the origin, not cached, not shared."""
        start = block_span(block, self._block_size, info.size)[0]
        async for chunk in self._origin.read_range(info, start + lo, start + hi, "foreground"):
            yield chunk, Source.ORIGIN

    def _reserve_buffer(self, size: int) -> None:
        if self._max_buffered is not None and self._buffered and \
                self._buffered + size > self._max_buffered:
            raise Overloaded(f"{self._buffered} bytes already buffered for readers")
        self._buffered += size

    def _fetching(
        self, info: ObjectInfo, ident: BlockIdent, ahead: range, started: set[BlockIdent]
    ) -> BlockBuffer:
        """The block's buffer: of an in-flight fetch, or of a new coalesced one.

        The fetch runs in a task of its own: a reader that goes away stops
        reading the buffer, not the fetch that others (and the cache) await.
        """
        buffer = self._in_flight.get(ident)
        if buffer is None:
            if not self._modes.downloads:
                raise DownloadsPaused("cache-only mode: the block is not cached")
            started.update(self._start_fetch(info, ahead))
            buffer = self._in_flight[ident]
        return buffer

    def _start_fetch(self, info: ObjectInfo, ahead: range) -> list[BlockIdent]:
        """Fetch the first block of `ahead` and the missing blocks right after it."""
        run_end = ahead.start + 1
        while run_end < ahead.stop and run_end - ahead.start < self._max_run:
            ident = BlockIdent(info.bucket, info.key, info.etag, run_end)
            if ident in self._in_flight or self._store.lookup(ident, touch=False) is not None:
                break
            run_end += 1
        (first, last), = coalesce_runs(range(ahead.start, run_end), self._max_run)
        self._reserve_buffer(
            block_span(last, self._block_size, info.size)[1]
            - block_span(first, self._block_size, info.size)[0]
        )
        buffers = [self._new_buffer(info, block) for block in range(first, last + 1)]
        self._spawn(self._fetch_run(info, buffers, "foreground"))
        return [ident for ident, _ in buffers]

    def _new_buffer(self, info: ObjectInfo, block: int) -> tuple[BlockIdent, BlockBuffer]:
        ident = BlockIdent(info.bucket, info.key, info.etag, block)
        buffer = BlockBuffer(self._block_length(info, block))
        self._in_flight[ident] = buffer
        return ident, buffer

    def will_hit(self, info: ObjectInfo, offset: int) -> bool:
        """Whether the block holding `offset` is cached or being read ahead (no side effects)."""
        ident = BlockIdent(info.bucket, info.key, info.etag, offset // self._block_size)
        return ident in self._in_flight or self._store.lookup(ident, touch=False) is not None

    def fetch_ahead(
        self, info: ObjectInfo, block: int, lane: str = "prefetch"
    ) -> asyncio.Task[None] | None:
        """Fetch one block in the background unless it is cached or in flight."""
        ident = BlockIdent(info.bucket, info.key, info.etag, block)
        if ident in self._in_flight or self._store.lookup(ident, touch=False) is not None:
            return None
        entry = self._new_buffer(info, block)
        self._buffered += entry[1].length
        task = self._spawn(self._fetch_run(info, [entry], lane))
        return task

    async def warm(
        self, info: ObjectInfo, start: int, end: int, ttl_s: float, concurrency: int = 4
    ) -> WarmResult:
        """Make the blocks of [start, end] (inclusive) cached and protected for ttl_s.

        Missing blocks are fetched on the `warm` lane, through the same
        single-flight table as readers (a block being fetched for someone else
        is waited for, not fetched again).
        """
        if not (self._modes.downloads and self._modes.caching):
            raise DownloadsPaused(f"mode {self._modes.current.value}: warm-up is paused")
        if info.size == 0 or start > end:
            return WarmResult()
        gate = asyncio.Semaphore(concurrency)

        async def one(block: int) -> WarmResult:
            ident = BlockIdent(info.bucket, info.key, info.etag, block)
            if self._store.lookup(ident, touch=False) is not None:
                self._store.protect(ident, ttl_s)
                self._metrics.warm_blocks.labels("already_cached").inc()
                return WarmResult(1, already_cached=1)
            async with gate, self._warm_gate:
                task = self.fetch_ahead(info, block, "warm")
                try:
                    if task is not None:
                        await asyncio.shield(task)
                        data_length = block_span(block, self._block_size, info.size)
                        fetched = data_length[1] - data_length[0]
                    else:
                        pending = self._in_flight.get(ident)
                        if pending is not None:
                            await pending.wait_complete()
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
                self._metrics.warm_blocks.labels("already_cached").inc()
                return WarmResult(1, already_cached=1)
            self._metrics.warm_blocks.labels("fetched").inc()
            return WarmResult(1, fetched=1, bytes_fetched=fetched)

        results = await asyncio.gather(
            *(one(block) for block in blocks_for_range(start, min(end, info.size - 1),
                                                        self._block_size))
        )
        return sum(results, WarmResult())

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _fetch_run(
        self, info: ObjectInfo, buffers: list[tuple[BlockIdent, BlockBuffer]], lane: str
    ) -> None:
        """One origin GET for consecutive blocks, filling their buffers as bytes arrive;
        each full block is then written to the cache (and leaves the table)."""
        first, last = buffers[0][0].block, buffers[-1][0].block
        start = block_span(first, self._block_size, info.size)[0]
        end = block_span(last, self._block_size, info.size)[1]
        index = 0
        landings: list[asyncio.Task[None]] = []
        failure: BaseException | None = None
        try:
            # Closed at once when a block cannot take the bytes: the origin's
            # connection is released now, not when the generator is collected.
            async with aclosing(self._origin.read_range(info, start, end, lane)) as chunks:
                async for chunk in chunks:
                    view = memoryview(chunk)
                    while view:
                        if index == len(buffers):
                            raise OriginBadBody(f"s3://{info.bucket}/{info.key}: more than the "
                                                f"{end - start} bytes of blocks {first}-{last}")
                        ident, buffer = buffers[index]
                        room = buffer.length - buffer.filled
                        buffer.append(view[:room])
                        view = view[room:]
                        if buffer.complete:
                            index += 1
                            landings.append(self._spawn(
                                self._land(ident, buffer, self._block_length(info, ident.block))
                            ))
            if index < len(buffers):
                # Never leave readers waiting on bytes that will not come.
                raise OriginBadBody(f"s3://{info.bucket}/{info.key}: blocks {first}-{last} "
                                    f"ended {end - start - sum(b.filled for _, b in buffers)} "
                                    "bytes short")
        except BaseException as exc:
            failure = exc
            # An open breaker has said so once already; not again for every miss.
            quiet = lane == "prefetch" or isinstance(
                exc, (asyncio.CancelledError, OriginCircuitOpen)
            )
            log.log(logging.INFO if quiet else logging.WARNING,
                    "%s fetch of s3://%s/%s blocks %d-%d failed: %r",
                    lane, info.bucket, info.key, first, last, exc)
            for ident, buffer in buffers[index:]:
                # Readers of the bytes that arrived keep them; the rest get the error.
                buffer.fail(exc if isinstance(exc, Exception) else ConnectionAbortedError())
                self._in_flight.pop(ident, None)
                self._buffered -= buffer.length
        await asyncio.gather(*landings, return_exceptions=True)
        if failure is not None and (lane != "foreground" or not isinstance(failure, Exception)):
            raise failure  # the prefetcher's and warm's waits see it

    async def _land(self, ident: BlockIdent, buffer: BlockBuffer, expected: int) -> None:
        try:
            # The store keeps what it is given: a block of any other length
            # than its span of the object would serve wrong bytes at offsets.
            if buffer.filled != expected or buffer.length != expected:
                log.error("not caching s3://%s/%s block %d: %d bytes where %d were due",
                          ident.bucket, ident.key, ident.block, buffer.filled, expected)
            elif self._modes.caching:
                await self._store.write(ident, buffer.data, read=buffer.read)
        finally:
            del self._in_flight[ident]
            self._buffered -= buffer.length

    def _block_length(self, info: ObjectInfo, block: int) -> int:
        start, end = block_span(block, self._block_size, info.size)
        return end - start

    def invalidate(self, bucket: str, key: str) -> int:
        return self._store.invalidate_object(bucket, key)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def max_coalesce_blocks(max_coalesce_bytes: int, block_size: int) -> int:
    return max(1, max_coalesce_bytes // block_size)

