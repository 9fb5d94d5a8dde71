"""Serve a byte range: cache lookup -> single-flight fetch of misses -> stream.

The engine is the one place that starts origin fetches, for every lane:
foreground (a reader waits), prefetch (read-ahead the planner asked for) and
warm (the warm-up API). One in-flight table (block ident -> the block on its
way, sidecar.in_flight) is the only way a block is fetched, so a block is
fetched once however many readers want it at the same time.

A fetch reserves each block's slot in the cache first, then reads the origin's
bytes in worker threads (sidecar.origin) straight into the slots, a chunk (the
cache's 1 MiB checksum unit) at a time, hashed while in hand; readers of the
block are woken as each chunk lands and read it from the slot, verified, as
they read cached blocks. Once a block's chunks are all there, its header is
written and it is cached; it stays in the in-flight table until then, so a
reader never finds it in neither place and fetches it again. Bytes from the
origin are never handed between threads, copied into block buffers or held in
memory for readers.

Every piece handed to the HTTP layer is a verified copy of at most one chunk
(sidecar.cache.slab explains why never a reference to the slab's pages).

The other parts answer, the engine acts: the read-ahead planner
(sidecar.prefetch.planner) returns the blocks to fetch ahead; the store returns
what a write evicted and whether the disk failed (the engine then switches the
modes to bypass, and the readers of the blocks caught in it read from the
origin directly); evictions go back to the planner, which counts unread
read-ahead as waste.

A lookup is a hit when the block is in the cache or already on its way from the
origin (read ahead, warmed, or fetched for an earlier request): the reader's
request causes no origin read. A miss is a lookup that starts an origin fetch,
and only the bytes of fetches a request started count as served from origin.

Bounded requests fetch their adjacent missing blocks in one coalesced fetch.
Open-ended requests (`bytes=pos-`, or no Range at all) are read lazily, a block at
a time as the client consumes: Kafka's RemoteLogManager opens `bytes=pos-` and
closes after about one fetch, so fetching ahead here would waste origin bytes
(read-ahead, which follows what was consumed, does that job). A foreground
fetch is split into a few ranged GETs run at once (as the AWS CRT and
mountpoint-s3 do): the block a reader waits for lands after the first byte and
a quarter of its transfer, not all of it.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterable
from contextlib import aclosing
from dataclasses import astuple, dataclass
from typing import Any, Protocol

from sidecar.blocks import block_span, blocks_for_range, coalesce_runs
from sidecar.cache import BlockIdent, BlockStore, CacheDiskError
from sidecar.cache.errors import ChecksumMismatch
from sidecar.errors import DownloadsPaused, OriginBadBody, OriginCircuitOpen, Overloaded
from sidecar.in_flight import InFlightBlock, Unslotted
from sidecar.isolation.modes import ModeState
from sidecar.model import FOREGROUND, PREFETCH, WARM, ObjectInfo
from sidecar.prefetch.planner import NextSegment, ReadAheadPlanner
from sidecar.prefetch.streams import Stream
from sidecar.tally import CACHED, FETCHED, JOINED, ReadTally
from sidecar.telemetry.metrics import Metrics

log = logging.getLogger(__name__)

# Pieces handed to the HTTP layer: a client that stops after 1 MiB costs about
# 1 MiB of hashing, not a whole block. Equal to the cache's checksum chunk.
PIECE_SIZE = 1024 * 1024
# Ranged GETs a foreground fetch is split into, run at once: the chunk a reader
# waits for arrives after the first byte and a quarter of the transfer.
FOREGROUND_PARTS = 4


# What the engine hands the HTTP layer: bytes of its own, never a view of
# memory that changes once the piece is handed over.
Piece = bytes | memoryview

Sink = Callable[[int, memoryview], None]
"""Takes one chunk of a fetch in a worker thread: (object offset, bytes)."""


def piece_length(piece: Piece) -> int:
    return len(piece)


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


class Source(enum.Enum):
    CACHE = "cache"
    ORIGIN = "origin"


class OriginReader(Protocol):
    """The origin as the engine needs it (handed in; tests give a fake)."""

    async def fetch_into(
        self, info: ObjectInfo, start: int, end: int, lane: str, sink: Sink, chunk_size: int,
        *, waited_for: bool = False,
    ) -> None:
        """Bytes [start, end) of the object to `sink`, in chunks of `chunk_size`
        aligned in object offsets, called in worker threads; retried, resumed
        and bounded by the origin's own rules. `waited_for`: a reader waits on
        these bytes now (they go before other work for the origin)."""

    def read_range(
        self, info: ObjectInfo, start: int, end: int, lane: str
    ) -> AsyncGenerator[bytes, None]:
        """Bytes [start, end) as they arrive (what bypasses the cache)."""

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
        modes: ModeState | None = None,
        max_buffered_bytes: int | None = None,
        warm_concurrency: int = 4,
        planner: ReadAheadPlanner | None = None,
        foreground_parts: int = FOREGROUND_PARTS,
    ) -> None:
        self._store = store
        self._origin = origin
        self._metrics = metrics
        self._block_size = block_size
        self._chunk_size = min(PIECE_SIZE, block_size)
        self._max_run = max_coalesce_blocks
        self._modes = modes or ModeState()
        # Bytes of foreground blocks being fetched: past the bound, new
        # foreground fetches are refused (503 SlowDown).
        self._max_buffered = max_buffered_bytes
        self._buffered = 0
        self._warm_gate = asyncio.Semaphore(warm_concurrency)  # the warm lane's connections
        self._planner = planner
        self._parts = max(1, foreground_parts)
        self._in_flight: dict[BlockIdent, InFlightBlock] = {}
        self._commits: dict[BlockIdent, asyncio.Task[bool]] = {}  # blocks being sealed
        self._tasks: set[asyncio.Task[Any]] = set()
        self._streams = 0  # ranges being served right now

    @property
    def block_size(self) -> int:
        return self._block_size

    async def stream(
        self, info: ObjectInfo, start: int, end: int, *, lazy: bool,
        tally: ReadTally | None = None,
    ) -> AsyncGenerator[tuple[Piece, Source], None]:
        """Yield the bytes of [start, end] (inclusive) in order, with their source.
        `tally`, if given, is told how each block was found (the access log's)."""
        self._streams += 1
        try:
            async with aclosing(self._stream(info, start, end, lazy,
                                             tally or ReadTally())) as pieces:
                async for piece in pieces:
                    yield piece
        finally:
            self._streams -= 1

    async def _stream(
        self, info: ObjectInfo, start: int, end: int, lazy: bool, tally: ReadTally
    ) -> AsyncGenerator[tuple[Piece, Source], None]:
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
            async with aclosing(self._block_pieces(info, block, lo, hi, ahead, started,
                                                   tally)) as pieces:
                async for piece in pieces:
                    yield piece
                    # Back here only once the client took the piece: heads follow
                    # delivered bytes, not the range asked for.
                    position += piece_length(piece[0])
                    if stream is not None:
                        self._read_ahead(stream, info, position)
            if block_start + hi == block_end:
                # The reader went past the block: its pages may leave the page cache.
                self._store.release_pages(BlockIdent(info.bucket, info.key, info.etag, block))

    async def _block_pieces(
        self, info: ObjectInfo, block: int, lo: int, hi: int, ahead: range,
        started: set[BlockIdent], tally: ReadTally,
    ) -> AsyncGenerator[tuple[Piece, Source], None]:
        if not self._modes.caching:
            tally.add(block, FETCHED)
            async with aclosing(self._bypass(info, block, lo, hi)) as passing:
                async for passed in passing:
                    yield passed
            return
        ident = BlockIdent(info.bucket, info.key, info.etag, block)
        record = self._store.lookup(ident)
        joined = ident in self._in_flight and ident not in started
        anticipated = record is not None or joined
        self._tell(tally, ident, record is not None, joined)
        self._metrics.cache_lookups.labels("hit" if anticipated else "miss").inc()
        if not anticipated:
            log.debug("miss %s block %d", info.key, block)
        if self._planner is not None and self._planner.on_block_read(ident):
            self._metrics.prefetch_blocks.labels("used").inc()
        while record is not None and lo < hi:
            # One chunk a piece: each is read and verified once.
            upto = min(hi, (lo // self._chunk_size + 1) * self._chunk_size)
            data = await self._store.read(record, lo, upto, through=hi)
            if data is None:  # evicted meanwhile, or failed its checksum: refetch
                self._forget_evicted((ident,))
                self._mind_disk_reads()
                self._tell(tally, ident, False, ident in self._in_flight)
                break
            lo = upto
            yield data, Source.CACHE
        if lo >= hi:
            return
        source = Source.CACHE if joined else Source.ORIGIN
        in_flight = self._fetching(info, ident, ahead, started)
        try:
            async with aclosing(self._landed(in_flight, lo, hi)) as landing:
                async for piece in landing:
                    lo += piece_length(piece)
                    yield piece, source
        except (Unslotted, ChecksumMismatch):
            # No slot to land in, its disk failed, or did not keep the bytes:
            # this reader's bytes come straight from the origin, uncached.
            self._mind_disk_reads()
            async with aclosing(self._bypass(info, block, lo, hi)) as passing:
                async for passed in passing:
                    yield passed

    def _tell(self, tally: ReadTally, ident: BlockIdent, cached: bool, joined: bool) -> None:
        if cached:
            tally.add(ident.block, CACHED)
        elif joined:
            tally.add(ident.block, JOINED, self._in_flight[ident].lane)
        else:
            tally.add(ident.block, FETCHED)

    async def _landed(
        self, in_flight: InFlightBlock, lo: int, hi: int
    ) -> AsyncGenerator[Piece, None]:
        """Bytes [lo, hi) of an in-flight block, each chunk as soon as it lands."""
        self._attach(in_flight)
        try:
            while lo < hi:
                chunk = lo // self._chunk_size
                write = await in_flight.wait_for(chunk)
                upto = min(hi, (chunk + 1) * self._chunk_size)
                in_flight.read = True
                yield await self._store.read_landed(write, lo, upto, through=hi)
                lo = upto
        finally:
            self._detach(in_flight)

    def _mind_disk_reads(self) -> None:
        """After a failed read: a disk that keeps failing reads is bypassed, as one
        that fails a write is (until the disk watcher sees it well)."""
        problem = self._store.read_fault()
        if problem is not None and self._modes.disk_problem is None:
            self._modes.disk_failed(f"cache disk reads: {problem}")

    def _attach(self, in_flight: InFlightBlock) -> None:
        """A reader of the block: its slot stays its own (pinned) until the reader
        is done, whatever becomes of the fetch meanwhile."""
        in_flight.readers += 1
        if in_flight.write is not None:
            self._store.pin_write(in_flight.write)

    def _detach(self, in_flight: InFlightBlock) -> None:
        in_flight.readers -= 1
        if in_flight.write is not None:
            self._store.unpin_write(in_flight.write)

    async def _bypass(
        self, info: ObjectInfo, block: int, lo: int, hi: int
    ) -> AsyncGenerator[tuple[Piece, Source], None]:
        """The bytes straight from the origin, not cached, not shared (bypass mode,
        or a block that could not land in the cache)."""
        start = block_span(block, self._block_size, info.size)[0]
        async with aclosing(
            self._origin.read_range(info, start + lo, start + hi, FOREGROUND)
        ) as chunks:
            async for chunk in chunks:
                yield chunk, Source.ORIGIN

    def _fetching(
        self, info: ObjectInfo, ident: BlockIdent, ahead: range, started: set[BlockIdent]
    ) -> InFlightBlock:
        """The block on its way: of an in-flight fetch, or of a new coalesced one.

        The fetch runs in a task of its own: a reader that goes away stops
        waiting for the block, not the fetch that others (and the cache) await.
        """
        in_flight = self._in_flight.get(ident)
        if in_flight is None:
            if not self._modes.downloads:
                raise DownloadsPaused("cache-only mode: the block is not cached")
            started.update(self._start_foreground(info, ahead))
            in_flight = self._in_flight[ident]
        return in_flight

    def _start_foreground(self, info: ObjectInfo, ahead: range) -> list[BlockIdent]:
        """Fetch the first block of `ahead` and the missing blocks right after it."""
        run_end = ahead.start + 1
        while run_end < ahead.stop and run_end - ahead.start < self._max_run:
            if self._present(BlockIdent(info.bucket, info.key, info.etag, run_end)):
                break
            run_end += 1
        (first, last), = coalesce_runs(range(ahead.start, run_end), self._max_run)
        size = block_span(last, self._block_size, info.size)[1] \
            - block_span(first, self._block_size, info.size)[0]
        if self._max_buffered is not None and self._buffered and \
                self._buffered + size > self._max_buffered:
            raise Overloaded(f"{self._buffered} bytes of blocks already on their way")
        run = [self._new_in_flight(info, block, FOREGROUND) for block in range(first, last + 1)]
        self._spawn(self._fetch_run(info, run, FOREGROUND))
        return [block.ident for block in run]

    def _new_in_flight(self, info: ObjectInfo, block: int, lane: str) -> InFlightBlock:
        ident = BlockIdent(info.bucket, info.key, info.etag, block)
        in_flight = InFlightBlock(ident, self._block_length(info, block), self._chunk_size, lane)
        self._in_flight[ident] = in_flight
        self._buffered += in_flight.length
        return in_flight

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
        if self._present(BlockIdent(info.bucket, info.key, info.etag, block)):
            return None
        return self._spawn(self._fetch_run(info, [self._new_in_flight(info, block, lane)], lane))

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
            self._spawn(self._prefetch(info, self._new_in_flight(info, block, PREFETCH)))

    async def _prefetch(self, info: ObjectInfo, in_flight: InFlightBlock) -> None:
        assert self._planner is not None
        cached = False
        try:
            cached = await self._fetch_run(info, [in_flight], PREFETCH)
        except Exception:  # logged by _fetch_run; read-ahead is best effort
            pass
        finally:
            self._planner.finished(in_flight.ident, cached)

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
                        fetched = self._block_length(info, block)
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
            # Nobody reads warmed blocks now: their pages go back at once.
            self._store.release_pages(ident)
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

    # One fetch: slots first, then the origin's bytes into them.

    async def _fetch_run(self, info: ObjectInfo, run: list[InFlightBlock], lane: str) -> bool:
        """Fetch consecutive blocks into their slots; whether all reached the cache.

        A failure reaches each block's readers through the block; the prefetch
        and warm lanes, which have no reader to tell, get it raised.
        """
        first, last = run[0].ident.block, run[-1].ident.block
        try:
            for in_flight in run:
                write = await self._store.begin_write(in_flight.ident, in_flight.length,
                                                      may_wait=in_flight is run[0])
                if write is None:
                    raise Unslotted("no cache slot is free (all pinned or being written, or the "
                                    "scan after a restart has found none yet)")
                self._forget_evicted(write.evicted)
                for _ in range(in_flight.readers):
                    self._store.pin_write(write)
                in_flight.slotted(write)
            start = block_span(first, self._block_size, info.size)[0]
            end = block_span(last, self._block_size, info.size)[1]
            parts = _parts_of(start, end, self._chunk_size,
                              self._parts if lane == FOREGROUND else 1)
            await self._get_parts(info, run, lane, parts)
            short = [block.ident.block for block in run if not block.complete]
            if short:
                # Never leave readers waiting on bytes that will not come.
                raise OriginBadBody(f"s3://{info.bucket}/{info.key}: the fetch of blocks "
                                    f"{first}-{last} ended without blocks {short}")
            return all(await asyncio.gather(*(self._commits[block.ident] for block in run)))
        except BaseException as exc:
            failure: BaseException = exc
            if isinstance(exc, CacheDiskError):
                # The cache disk failed under this fetch: bypass the cache until
                # the disk watcher sees it well; its readers read the origin.
                self._modes.disk_failed(str(exc))
                failure = Unslotted(str(exc))
            quiet = lane == PREFETCH or isinstance(
                exc, (asyncio.CancelledError, OriginCircuitOpen, Unslotted, CacheDiskError)
            )
            log.log(logging.INFO if quiet else logging.WARNING,
                    "%s fetch of s3://%s/%s blocks %d-%d failed: %r",
                    lane, info.bucket, info.key, first, last, exc)
            for in_flight in run:
                if not in_flight.complete:
                    # Readers of chunks that landed keep them; the rest get the error.
                    self._give_up(in_flight, failure if isinstance(failure, Exception)
                                  else ConnectionAbortedError())
            # Blocks that did land whole are cached all the same.
            await asyncio.gather(*(self._commits[block.ident] for block in run
                                   if block.ident in self._commits), return_exceptions=True)
            if lane != FOREGROUND or not isinstance(exc, Exception):
                raise  # the prefetch and warm waits see it
            return False
        finally:
            for block in run:
                task = self._commits.get(block.ident)
                if task is not None and task.done():
                    del self._commits[block.ident]

    async def _get_parts(
        self, info: ObjectInfo, run: list[InFlightBlock], lane: str,
        parts: list[tuple[int, int]],
    ) -> None:
        """The run's bytes in ranged GETs read at once, the first one first.

        The others start once the first one's first chunk has landed: by then
        the origin has answered with the version the reads are planned against
        (the ETag checked), so an object rewritten since its HEAD fails the
        fetch before any byte of it reaches a reader, and the request is
        answered afresh rather than cut off midway.
        """
        sink = self._sink(info, run)
        (first_start, first_end), *rest = parts
        leading = asyncio.ensure_future(self._origin.fetch_into(
            info, first_start, first_end, lane, sink, self._chunk_size, waited_for=True))
        tasks: list[asyncio.Future[None]] = [leading]
        try:
            if rest:
                block = run[0]
                landed = asyncio.ensure_future(block.wait_for(0))
                try:
                    await asyncio.wait({leading, landed}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    landed.cancel()
                    await asyncio.gather(landed, return_exceptions=True)
                if leading.done() and leading.exception() is not None:
                    raise leading.exception()  # type: ignore[misc]
                tasks.extend(asyncio.ensure_future(self._origin.fetch_into(
                    info, a, b, lane, sink, self._chunk_size)) for a, b in rest)
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        failures = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
        if failures:
            raise failures[0]

    def _sink(self, info: ObjectInfo, run: list[InFlightBlock]) -> Sink:
        """What the fetch's worker threads do with each chunk: into its block's
        slot (hashed there), then word to the loop that it landed."""
        loop = asyncio.get_running_loop()
        first = run[0].ident.block
        block_size, chunk_size, store = self._block_size, self._chunk_size, self._store

        def take(offset: int, data: memoryview) -> None:
            block = offset // block_size
            if not 0 <= block - first < len(run):
                raise ValueError(f"offset {offset} is outside the fetch of blocks {first}..")
            in_flight = run[block - first]
            write = in_flight.write
            assert write is not None
            at = offset - block * block_size
            chunk = at // chunk_size
            checksum = store.write_chunk(write, at, data)
            # A reader waiting for this chunk (a miss's) gets it from memory.
            copy = store.landed_copy(data) if in_flight.awaited(chunk) else None
            loop.call_soon_threadsafe(self._chunk_landed, in_flight, chunk, checksum, copy)

        return take

    def _chunk_landed(self, in_flight: InFlightBlock, chunk: int, checksum: int,
                      copy: memoryview | None) -> None:
        if in_flight.failed:
            return
        if copy is not None and in_flight.write is not None:
            self._store.keep_landed(in_flight.write, chunk, copy)
        in_flight.landed(chunk, checksum)
        if in_flight.complete:
            # Cached as soon as it is whole, not when the rest of its run is.
            self._commits[in_flight.ident] = self._spawn(self._committed(in_flight))

    async def _committed(self, in_flight: InFlightBlock) -> bool:
        """A block whose chunks all landed becomes a cached block."""
        write = in_flight.write
        assert write is not None and write.complete
        try:
            if not self._modes.caching:
                self._store.abort(write)
                return False
            written = await self._store.commit(write, read=in_flight.read)
            self._forget_evicted(written.evicted)
            if written.disk_error is not None:
                self._modes.disk_failed(written.disk_error)
            return written.record is not None
        finally:
            self._leave_table(in_flight)

    def _give_up(self, in_flight: InFlightBlock, error: Exception) -> None:
        in_flight.fail(error)
        if in_flight.write is not None:
            self._store.abort(in_flight.write)  # the slot waits for its readers
        self._leave_table(in_flight)

    def _leave_table(self, in_flight: InFlightBlock) -> None:
        if self._in_flight.get(in_flight.ident) is in_flight:
            del self._in_flight[in_flight.ident]
            self._buffered -= in_flight.length

    def _block_length(self, info: ObjectInfo, block: int) -> int:
        start, end = block_span(block, self._block_size, info.size)
        return end - start

    def invalidate(self, bucket: str, key: str) -> int:
        """Drop every cached block of the object; how many were dropped."""
        purged = self._store.invalidate_object(bucket, key)
        self._forget_evicted(purged.unread)
        return purged.blocks

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


def _parts_of(start: int, end: int, chunk_size: int, parts: int) -> list[tuple[int, int]]:
    """[start, end) cut into at most `parts` ranges of whole chunks (the last may
    end short at `end`), as equal as whole chunks allow."""
    chunks = -(-(end - start) // chunk_size)
    count = max(1, min(parts, chunks))
    bounds = [start + (chunks * i // count) * chunk_size for i in range(count)] + [end]
    return [(bounds[i], min(bounds[i + 1], end)) for i in range(count)]


def max_coalesce_blocks(max_coalesce_bytes: int, block_size: int) -> int:
    return max(1, max_coalesce_bytes // block_size)
