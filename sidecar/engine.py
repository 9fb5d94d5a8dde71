"""Serve a byte range: cache lookup -> single-flight fetch of misses -> stream.

The engine is the one place that starts origin fetches, for every lane:
foreground (a reader waits), prefetch (read-ahead the planner asked for) and
warm (the warm-up API). One in-flight table (block ident -> the block's buffer
as it arrives) is the only way a block is fetched, so a block is fetched once
however many readers want it at the same time; each reader takes the block's
bytes as they land (sidecar.block_buffer). A block stays in the table until it
is written to the cache, so a reader never finds it in neither place and
fetches it again.

The other parts answer, the engine acts: the read-ahead planner
(sidecar.prefetch.planner) returns the blocks to fetch ahead; the store returns
what a write evicted and whether the disk failed (the engine then switches the
modes to bypass); evictions go back to the planner, which counts unread
read-ahead as waste.

A lookup is a hit when the block is in the cache or already on its way from the
origin (read ahead, warmed, or fetched for an earlier request): the reader's
request causes no origin read. A miss is a lookup that starts an origin fetch,
and only the bytes of fetches a request started count as served from origin.

Bounded requests fetch their adjacent missing blocks in one coalesced origin GET.
Open-ended requests (`bytes=pos-`, or no Range at all) are read lazily, a block at
a time as the client consumes: Kafka's RemoteLogManager opens `bytes=pos-` and
closes after about one fetch, so fetching ahead here would waste origin bytes
(read-ahead, which follows what was consumed, does that job).
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine, Iterable
from contextlib import aclosing
from dataclasses import astuple, dataclass
from typing import Any, Protocol

from sidecar.block_buffer import BlockBuffer
from sidecar.blocks import block_span, blocks_for_range, coalesce_runs
from sidecar.cache import BlockIdent, BlockStore, SlabRegion
from sidecar.errors import DownloadsPaused, OriginBadBody, OriginCircuitOpen, Overloaded
from sidecar.isolation.modes import ModeState
from sidecar.model import FOREGROUND, PREFETCH, WARM, ObjectInfo
from sidecar.prefetch.planner import NextSegment, ReadAheadPlanner
from sidecar.prefetch.streams import Stream
from sidecar.telemetry.metrics import Metrics

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


class OriginReader(Protocol):
    """The origin as the engine needs it (handed in; tests give a fake)."""

    def read_range(
        self, info: ObjectInfo, start: int, end: int, lane: str
    ) -> AsyncGenerator[bytes, None]: ...

    async def head(self, bucket: str, key: str) -> ObjectInfo: ...

    async def list_keys(self, bucket: str, prefix: str) -> list[str]: ...


class Engine:
    def __init__(
        self,
        store: BlockStore,
        origin: OriginReader,
        metrics: Metrics,
        block_size: int,
        max_coalesce_blocks: int,
        *,
        zero_copy: bool = False,
        modes: ModeState | None = None,
        max_buffered_bytes: int | None = None,
        warm_concurrency: int = 4,
        planner: ReadAheadPlanner | None = None,
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
        self._planner = planner
        self._in_flight: dict[BlockIdent, BlockBuffer] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._streams = 0  # ranges being served right now

    @property
    def block_size(self) -> int:
        return self._block_size

    async def stream(
        self, info: ObjectInfo, start: int, end: int, *, lazy: bool
    ) -> AsyncGenerator[tuple[Piece, Source], None]:
        """Yield the bytes of [start, end] (inclusive) in order, with their source."""
        self._streams += 1
        try:
            async for piece in self._stream(info, start, end, lazy):
                yield piece
        finally:
            self._streams -= 1

    async def _stream(
        self, info: ObjectInfo, start: int, end: int, lazy: bool
    ) -> AsyncIterator[tuple[Piece, Source]]:
        planner = self._planner if self._modes.read_ahead else None
        stream = planner.on_request(info, start) if planner is not None else None
        if stream is not None:
            self._read_ahead(stream, info, start)  # a continued stream reads ahead now
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
                if stream is not None:
                    self._read_ahead(stream, info, position)

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
        if self._planner is not None and self._planner.on_block_read(ident):
            self._metrics.prefetch_blocks.labels("used").inc()
        while record is not None and lo < hi:
            upto = min(hi, lo + PIECE_SIZE)
            data: Piece | None
            if self._zero_copy:
                data = await self._store.read_region(record, lo, upto)
            else:
                data = await self._store.read(record, lo, upto)
            if data is None:  # evicted meanwhile, or failed its checksum: refetch
                self._forget_evicted((ident,))
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
        async for chunk in self._origin.read_range(info, start + lo, start + hi, FOREGROUND):
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
            started.update(self._start_foreground(info, ahead))
            buffer = self._in_flight[ident]
        return buffer

    def _start_foreground(self, info: ObjectInfo, ahead: range) -> list[BlockIdent]:
        """Fetch the first block of `ahead` and the missing blocks right after it."""
        run_end = ahead.start + 1
        while run_end < ahead.stop and run_end - ahead.start < self._max_run:
            if self._present(BlockIdent(info.bucket, info.key, info.etag, run_end)):
                break
            run_end += 1
        (first, last), = coalesce_runs(range(ahead.start, run_end), self._max_run)
        self._reserve_buffer(
            block_span(last, self._block_size, info.size)[1]
            - block_span(first, self._block_size, info.size)[0]
        )
        buffers = [self._new_buffer(info, block) for block in range(first, last + 1)]
        self._spawn(self._fetch_run(info, buffers, FOREGROUND))
        return [ident for ident, _ in buffers]

    def _new_buffer(self, info: ObjectInfo, block: int) -> tuple[BlockIdent, BlockBuffer]:
        ident = BlockIdent(info.bucket, info.key, info.etag, block)
        buffer = BlockBuffer(self._block_length(info, block))
        self._in_flight[ident] = buffer
        return ident, buffer

    def _present(self, ident: BlockIdent) -> bool:
        """Cached or on its way: fetching it again would fetch it twice."""
        return ident in self._in_flight or self._store.lookup(ident, touch=False) is not None

    def will_hit(self, info: ObjectInfo, offset: int) -> bool:
        """Whether the block holding `offset` is cached or being read ahead (no side effects)."""
        return self._present(
            BlockIdent(info.bucket, info.key, info.etag, offset // self._block_size)
        )

    def _fetch_one(self, info: ObjectInfo, block: int, lane: str) -> asyncio.Task[bool] | None:
        """Fetch one block in the background unless it is cached or in flight; the
        task says whether the block reached the cache."""
        ident = BlockIdent(info.bucket, info.key, info.etag, block)
        if self._present(ident):
            return None
        entry = self._new_buffer(info, block)
        self._buffered += entry[1].length
        return self._spawn(self._fetch_run(info, [entry], lane))

    # Read-ahead: the planner decides, the engine fetches.

    def _read_ahead(self, stream: Stream, info: ObjectInfo, position: int) -> None:
        assert self._planner is not None
        plan = self._planner.on_delivered(stream, info, position)
        self._fetch_ahead(stream, info, plan.blocks)
        if plan.next_segment is not None:
            self._spawn(self._into_next_segment(plan.next_segment))

    def _fetch_ahead(self, stream: Stream, info: ObjectInfo, blocks: Iterable[int]) -> None:
        assert self._planner is not None
        for block in blocks:
            ident = BlockIdent(info.bucket, info.key, info.etag, block)
            if self._present(ident):
                continue
            if not self._planner.admit(ident, stream):
                return  # over a bound: the stream asks again at its next delivery
            self._metrics.prefetch_blocks.labels("issued").inc()
            entry = self._new_buffer(info, block)
            self._buffered += entry[1].length
            self._spawn(self._prefetch(info, entry))

    async def _prefetch(self, info: ObjectInfo, entry: tuple[BlockIdent, BlockBuffer]) -> None:
        assert self._planner is not None
        cached = False
        try:
            cached = await self._fetch_run(info, [entry], PREFETCH)
        except Exception:  # logged by _fetch_run; read-ahead is best effort
            pass
        finally:
            self._planner.finished(entry[0], cached)

    async def _into_next_segment(self, wanted: NextSegment) -> None:
        """Look up the partition's next segment and read its first blocks ahead."""
        assert self._planner is not None
        bucket = wanted.after.bucket
        try:
            keys = await self._origin.list_keys(bucket, wanted.partition_prefix)
            next_key = self._planner.next_key(wanted, keys)
            if next_key is None:
                return
            next_info = await self._origin.head(bucket, next_key)
        except Exception as exc:  # read-ahead is best effort; the reader will ask itself
            log.info("no cross-segment prefetch after s3://%s/%s: %s",
                     bucket, wanted.after.key, exc)
            return
        self._fetch_ahead(wanted.stream, next_info,
                          self._planner.continue_into(wanted, next_info))

    def _forget_evicted(self, idents: Iterable[BlockIdent]) -> None:
        """Blocks left the cache: read-ahead nobody read was wasted."""
        if self._planner is None:
            return
        for ident in idents:
            if self._planner.on_evicted(ident):
                self._metrics.prefetch_blocks.labels("wasted").inc()

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
                task = self._fetch_one(info, block, WARM)
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

    def _spawn(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _fetch_run(
        self, info: ObjectInfo, buffers: list[tuple[BlockIdent, BlockBuffer]], lane: str
    ) -> bool:
        """One origin GET for consecutive blocks, filling their buffers as bytes arrive;
        each full block is then written to the cache (and leaves the table).

        Returns whether every block reached the cache. A failure reaches the
        block's readers through its buffer; the prefetch and warm lanes, which
        have no reader to tell, get it raised.
        """
        first, last = buffers[0][0].block, buffers[-1][0].block
        start = block_span(first, self._block_size, info.size)[0]
        end = block_span(last, self._block_size, info.size)[1]
        index = 0
        landings: list[asyncio.Task[bool]] = []
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
            quiet = lane == PREFETCH or isinstance(
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
        landed = await asyncio.gather(*landings, return_exceptions=True)
        if failure is not None and (lane != FOREGROUND or not isinstance(failure, Exception)):
            raise failure  # the prefetch and warm waits see it
        return failure is None and all(result is True for result in landed)

    async def _land(self, ident: BlockIdent, buffer: BlockBuffer, expected: int) -> bool:
        """Write a full block to the cache; whether it is cached now."""
        try:
            # The store keeps what it is given: a block of any other length
            # than its span of the object would serve wrong bytes at offsets.
            if buffer.filled != expected or buffer.length != expected:
                log.error("not caching s3://%s/%s block %d: %d bytes where %d were due",
                          ident.bucket, ident.key, ident.block, buffer.filled, expected)
                return False
            if not self._modes.caching:
                return False
            written = await self._store.write(ident, buffer.data, read=buffer.read)
            self._forget_evicted(written.evicted)
            if written.disk_error is not None:
                # The sidecar bypasses the cache until the disk watcher sees it well.
                self._modes.disk_failed(written.disk_error)
            return written.record is not None
        finally:
            del self._in_flight[ident]
            self._buffered -= buffer.length

    def _block_length(self, info: ObjectInfo, block: int) -> int:
        start, end = block_span(block, self._block_size, info.size)
        return end - start

    def invalidate(self, bucket: str, key: str) -> int:
        """Drop every cached block of the object; how many were dropped."""
        dropped = self._store.invalidate_object(bucket, key)
        self._forget_evicted(dropped)
        return len(dropped)

    def shrink_cache(self, nbytes: int) -> int:
        """Give about `nbytes` of the cache's disk space back; the bytes released."""
        shrunk = self._store.shrink(nbytes)
        self._forget_evicted(shrunk.evicted)
        return shrunk.released_bytes

    def activity(self) -> dict[str, int | bool]:
        """What is under way (the stats' `engine` section; tests await `idle`)."""
        return {
            "streams": self._streams,
            "blocks_in_flight": len(self._in_flight),
            "buffered_bytes": self._buffered,
            "prefetch_in_flight": self._planner.blocks_in_flight if self._planner else 0,
            "prefetch_pending": self._planner.pending_blocks if self._planner else 0,
            "idle": not self._streams and not self._tasks and not self._store.busy,
        }

    async def idle(self) -> None:
        """Wait until no fetch, landing, look-up or disk work is under way,
        including work that what is under way starts meanwhile (ranges still
        being streamed are their callers' to finish)."""
        while self._tasks or self._store.busy:
            if self._tasks:
                await asyncio.wait(list(self._tasks))
            await self._store.idle()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def max_coalesce_blocks(max_coalesce_bytes: int, block_size: int) -> int:
    return max(1, max_coalesce_bytes // block_size)
