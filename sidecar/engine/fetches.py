"""The single-flight fetch of missing blocks, and each fetch's lifecycle.

One in-flight table (block ident -> the block on its way, sidecar.in_flight)
is the only way a block is fetched, for every lane: foreground (a reader
waits), prefetch (read-ahead the planner asked for) and warm (the warm-up
API). So a block is fetched once however many readers want it at the same
time.

A fetch reserves each block's slot in the cache first, then reads the origin's
bytes in worker threads (sidecar.origin) straight into the slots, a chunk (the
cache's 1 MiB checksum unit) at a time, hashed while in hand; readers of the
block are woken as each chunk lands and read it from the slot, verified, as
they read cached blocks. Once a block's chunks are all there, its header is
written and it is cached; it stays in the in-flight table until then, so a
reader never finds it in neither place and fetches it again. Bytes from the
origin are never handed between threads, copied into block buffers or held in
memory for readers.

Bounded requests fetch their adjacent missing blocks in one coalesced fetch.
A foreground fetch is split into a few ranged GETs run at once (as the AWS CRT
and mountpoint-s3 do): the block a reader waits for lands after the first byte
and a quarter of its transfer, not all of it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

from sidecar.blocks import block_span, coalesce_runs
from sidecar.cache import BlockIdent, BlockStore, CacheDiskError
from sidecar.engine.background import BackgroundTasks
from sidecar.engine.evictions import EvictedBlocks
from sidecar.engine.origin_reader import OriginReader, Sink
from sidecar.engine.pieces import PIECE_SIZE
from sidecar.errors import (
    DownloadsPaused,
    FetchStopped,
    OriginBadBody,
    OriginCircuitOpen,
    Overloaded,
)
from sidecar.in_flight import InFlightBlock, Unslotted
from sidecar.isolation.modes import ModeState
from sidecar.model import FOREGROUND, PREFETCH, WARM, FetchDone, ObjectInfo

# The engine's log lines keep the one logger name, whichever of its rooms writes them.
log = logging.getLogger("sidecar.engine")

# Ranged GETs a foreground fetch is split into, run at once: the chunk a reader
# waits for arrives after the first byte and a quarter of the transfer.
FOREGROUND_PARTS = 4


class Fetches:
    """The blocks on their way, and the fetches that bring them."""

    def __init__(
        self,
        store: BlockStore,
        origin: OriginReader,
        modes: ModeState,
        evicted: EvictedBlocks,
        tasks: BackgroundTasks,
        *,
        block_size: int,
        max_coalesce_blocks: int,
        max_buffered_bytes: int | None,
        foreground_parts: int,
    ) -> None:
        self._store = store
        self._origin = origin
        self._modes = modes
        self._evicted = evicted
        self._tasks = tasks
        self._block_size = block_size
        self._chunk_size = min(PIECE_SIZE, block_size)
        self._max_run = max_coalesce_blocks
        # Bytes of blocks being fetched (every lane), and of the foreground's
        # alone. Past the bound a reader's miss is refused (503 SlowDown) only
        # for the foreground's own bytes: read-ahead and warm-up yield to
        # readers, never crowd them out. They start only while all bytes on
        # their way stay within it, so theirs are bounded too, and the total
        # stays under twice the bound (and a run).
        self._max_buffered = max_buffered_bytes
        self._buffered = 0
        self._foreground = 0
        # Set (and renewed) whenever a block leaves the table: warm-up waiting
        # for room asks again.
        self._room = asyncio.Event()
        self._parts = max(1, foreground_parts)
        self._in_flight: dict[BlockIdent, InFlightBlock] = {}
        self._sealing: dict[BlockIdent, asyncio.Task[bool]] = {}
        # Told of each prefetch and warm fetch as it ends (the access log's
        # lines of them); foreground fetches are told in their requests' lines.
        self.on_background_done: Callable[[FetchDone], None] | None = None

    @property
    def on_their_way(self) -> Mapping[BlockIdent, InFlightBlock]:
        """The in-flight table: every block being fetched, by ident."""
        return self._in_flight

    @property
    def buffered_bytes(self) -> int:
        return self._buffered

    def background_fits(self, length: int) -> bool:
        """Whether a read-ahead or warm block of `length` may start now: into
        the room the bound leaves, readers' blocks counted (one when nothing
        is on its way, as a reader's first miss, whatever its size)."""
        bound = self._max_buffered
        return bound is None or not self._buffered or self._buffered + length <= bound

    async def room_for_background(self, length: int) -> None:
        """Wait until a background block of `length` fits (background_fits)."""
        while not self.background_fits(length):
            await self._room.wait()

    def present(self, ident: BlockIdent) -> bool:
        """Cached or on its way: fetching it again would fetch it twice."""
        return ident in self._in_flight or self._store.lookup(ident, touch=False) is not None

    def block_length(self, info: ObjectInfo, block: int) -> int:
        start, end = block_span(block, self._block_size, info.size)
        return end - start

    def join_or_start(
        self, info: ObjectInfo, ident: BlockIdent, ahead: range, started: set[BlockIdent]
    ) -> InFlightBlock:
        """The block on its way: of an in-flight fetch, or of a new coalesced one.

        The fetch runs in a task of its own: a reader that goes away stops
        waiting for the block, not the fetch that others (and the cache) await.
        """
        in_flight = self._in_flight.get(ident)
        if in_flight is None:
            if not self._modes.downloads:
                raise DownloadsPaused("cache-only mode: the block is not cached",
                                      self._modes.current.value)
            started.update(self._start_foreground(info, ahead))
            in_flight = self._in_flight[ident]
        return in_flight

    def _start_foreground(self, info: ObjectInfo, ahead: range) -> list[BlockIdent]:
        """Fetch the first block of `ahead` and the missing blocks right after it."""
        run_end = ahead.start + 1
        while run_end < ahead.stop and run_end - ahead.start < self._max_run:
            if self.present(BlockIdent(info.bucket, info.key, info.etag, run_end)):
                break
            run_end += 1
        (first, last), = coalesce_runs(range(ahead.start, run_end), self._max_run)
        size = block_span(last, self._block_size, info.size)[1] \
            - block_span(first, self._block_size, info.size)[0]
        # The foreground's own bytes only: read-ahead and warm-up on their way
        # never turn a reader away (they take no room readers need, above).
        if self._max_buffered is not None and self._foreground and \
                self._foreground + size > self._max_buffered:
            raise Overloaded(f"{self._foreground} bytes of readers' blocks already on their way")
        run = [self.enter(info, block, FOREGROUND) for block in range(first, last + 1)]
        self._tasks.spawn(self.fetch_run(info, run, FOREGROUND))
        return [block.ident for block in run]

    def fetch_one(self, info: ObjectInfo, block: int, lane: str) -> asyncio.Task[bool] | None:
        """Fetch one block in the background unless it is cached or in flight; the
        task says whether the block reached the cache."""
        if self.present(BlockIdent(info.bucket, info.key, info.etag, block)):
            return None
        if not self.background_fits(self.block_length(info, block)):
            raise Overloaded(f"{self._buffered} bytes of blocks already on their way")
        return self._tasks.spawn(self.fetch_run(info, [self.enter(info, block, lane)], lane))

    async def sealed(self, in_flight: InFlightBlock) -> None:
        """Wait until a block on its way is cached, or was not (the cache
        refused it); raises its fetch's failure. Its chunks all landed is not
        enough: its header is being written then, and it is not in the index."""
        await in_flight.wait_complete()
        sealing = self._sealing.get(in_flight.ident)
        if sealing is not None:
            # Shielded: the waiter may be cancelled, the block's seal must not be.
            await asyncio.shield(sealing)

    def enter(self, info: ObjectInfo, block: int, lane: str) -> InFlightBlock:
        """The block enters the in-flight table: it is on its way from now on."""
        ident = BlockIdent(info.bucket, info.key, info.etag, block)
        in_flight = InFlightBlock(ident, self.block_length(info, block), self._chunk_size, lane)
        self._in_flight[ident] = in_flight
        self._buffered += in_flight.length
        if lane == FOREGROUND:
            self._foreground += in_flight.length
        return in_flight

    # One fetch: slots first, then the origin's bytes into them.

    async def fetch_run(self, info: ObjectInfo, run: list[InFlightBlock], lane: str) -> bool:
        """Fetch consecutive blocks into their slots; whether all reached the cache.

        A failure reaches each block's readers through the block; the prefetch
        and warm lanes, which have no reader to tell, get it raised.
        """
        began = time.monotonic()
        ok = False
        try:
            await self._reserve_slots(run)
            self._check_mode_still_allows(lane, run)
            first, last = run[0].ident.block, run[-1].ident.block
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
            ok = all(await asyncio.gather(*(self._sealing[block.ident] for block in run)))
            return ok
        except Exception as exc:
            await self._abandon(info, run, lane, exc)
            if lane != FOREGROUND:
                raise  # the prefetch and warm waits see it
            return False
        except (asyncio.CancelledError, KeyboardInterrupt, SystemExit) as exc:
            # Stopped, not failed: its readers are told and its slots freed all
            # the same, then the stop goes on up.
            await self._abandon(info, run, lane, exc)
            raise
        finally:
            for block in run:
                task = self._sealing.get(block.ident)
                if task is not None and task.done():
                    del self._sealing[block.ident]
            if lane != FOREGROUND and self.on_background_done is not None:
                self.on_background_done(FetchDone(
                    lane, info, run[0].ident.block, run[-1].ident.block,
                    sum(block.length for block in run if block.complete),
                    time.monotonic() - began, ok))

    def _check_mode_still_allows(self, lane: str, run: list[InFlightBlock]) -> None:
        """Read-ahead and warm-up may wait a while for their slots: a switch
        made meanwhile to a mode that pauses them starts no origin read.
        A fetch a reader waits for goes on, foreground or joined (the reader
        was let in before the switch, and would get a refusal for a mode
        that still fetches misses)."""
        if any(block.readers for block in run):
            return
        if lane == PREFETCH and not self._modes.read_ahead:
            mode = self._modes.current.value
            raise DownloadsPaused(f"mode {mode}: read-ahead is paused", mode)
        if lane == WARM and not (self._modes.downloads and self._modes.caching):
            mode = self._modes.current.value
            raise DownloadsPaused(f"mode {mode}: warm-up is paused", mode)

    async def _reserve_slots(self, run: list[InFlightBlock]) -> None:
        for in_flight in run:
            write = await self._store.begin_write(in_flight.ident, in_flight.length,
                                                  may_wait=in_flight is run[0])
            if write is None:
                raise Unslotted("no cache slot is free (all pinned or being written, or the "
                                "scan after a restart has found none yet)")
            self._evicted.left_cache(write.evicted)
            for _ in range(in_flight.readers):
                self._store.pin_write(write)
            in_flight.slotted(write)

    async def _abandon(
        self, info: ObjectInfo, run: list[InFlightBlock], lane: str, exc: BaseException
    ) -> None:
        """A fetch that failed or was stopped: its blocks still missing fail
        their readers, those that landed whole are cached all the same."""
        failure: Exception = exc if isinstance(exc, Exception) else FetchStopped(
            f"the fetch of s3://{info.bucket}/{info.key} blocks {run[0].ident.block}-"
            f"{run[-1].ident.block} was stopped")
        if isinstance(exc, CacheDiskError):
            # The cache disk failed under this fetch: bypass the cache until
            # the disk watcher sees it well; its readers read the origin.
            self._modes.disk_failed(str(exc))
            failure = Unslotted(str(exc))
        quiet = lane == PREFETCH or isinstance(
            exc, (asyncio.CancelledError, OriginCircuitOpen, Unslotted, CacheDiskError,
                  DownloadsPaused)
        )
        log.log(logging.INFO if quiet else logging.WARNING,
                "%s fetch of s3://%s/%s blocks %d-%d failed: %r",
                lane, info.bucket, info.key, run[0].ident.block, run[-1].ident.block, exc)
        for in_flight in run:
            if not in_flight.complete:
                # Readers of chunks that landed keep them; the rest get the error.
                self._give_up(in_flight, failure)
        await asyncio.gather(*(self._sealing[block.ident] for block in run
                               if block.ident in self._sealing), return_exceptions=True)

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
        sink = self._chunk_writer(run)
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
            # Whatever stops the fetch stops its GETs with it.
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        failures = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
        if failures:
            raise failures[0]

    def _chunk_writer(self, run: list[InFlightBlock]) -> Sink:
        """What the fetch's worker threads do with each chunk: into its block's
        slot (hashed there), then word to the loop that it landed."""
        loop = asyncio.get_running_loop()
        first = run[0].ident.block
        block_size, chunk_size, store = self._block_size, self._chunk_size, self._store

        def write_chunk_into_slot(offset: int, data: memoryview) -> None:
            block = offset // block_size
            if not 0 <= block - first < len(run):
                raise ValueError(f"offset {offset} is outside the fetch of blocks {first}..")
            in_flight = run[block - first]
            write = in_flight.write
            assert write is not None
            at = offset - block * block_size
            chunk = at // chunk_size
            checksum = store.write_chunk(write, at, data)
            # The bytes just hashed, into the memory tier (read-ahead and warm-up
            # land there too, a warm-up's kept until read); else a reader
            # waiting for this chunk (a miss's) gets a copy of it from memory.
            kept = store.tier_landed(write, at, data, warm=in_flight.lane == WARM)
            copy = store.landed_copy(data) if not kept and in_flight.awaited(chunk) else None
            loop.call_soon_threadsafe(self._chunk_landed, in_flight, chunk, checksum, copy)

        return write_chunk_into_slot

    def _chunk_landed(self, in_flight: InFlightBlock, chunk: int, checksum: int,
                      copy: memoryview | None) -> None:
        if in_flight.failed:
            return
        if copy is not None and in_flight.write is not None:
            self._store.keep_landed(in_flight.write, chunk, copy)
        in_flight.landed(chunk, checksum)
        if in_flight.complete:
            # Cached as soon as it is whole, not when the rest of its run is.
            self._sealing[in_flight.ident] = self._tasks.spawn(self._seal(in_flight))

    async def _seal(self, in_flight: InFlightBlock) -> bool:
        """A block whose chunks all landed becomes a cached block: its header
        is written and it joins the index."""
        write = in_flight.write
        assert write is not None and write.complete
        try:
            if not self._modes.caching:
                self._store.abort(write)
                return False
            written = await self._store.commit(write, read=in_flight.read)
            self._evicted.left_cache(written.evicted)
            if written.disk_error is not None:
                self._modes.disk_failed(written.disk_error)
            return written.record is not None
        finally:
            self._remove_from_table(in_flight)

    def _give_up(self, in_flight: InFlightBlock, error: Exception) -> None:
        in_flight.fail(error)
        if in_flight.write is not None:
            self._store.abort(in_flight.write)  # the slot waits for its readers
        self._remove_from_table(in_flight)

    def _remove_from_table(self, in_flight: InFlightBlock) -> None:
        """The block is no longer on its way (cached, or given up); its bytes no
        longer count against max_buffered."""
        if self._in_flight.get(in_flight.ident) is in_flight:
            del self._in_flight[in_flight.ident]
            self._buffered -= in_flight.length
            if in_flight.lane == FOREGROUND:
                self._foreground -= in_flight.length
            room, self._room = self._room, asyncio.Event()
            room.set()


def _parts_of(start: int, end: int, chunk_size: int, parts: int) -> list[tuple[int, int]]:
    """[start, end) cut into at most `parts` ranges of whole chunks (the last may
    end short at `end`), as equal as whole chunks allow."""
    chunks = -(-(end - start) // chunk_size)
    count = max(1, min(parts, chunks))
    bounds = [start + (chunks * i // count) * chunk_size for i in range(count)] + [end]
    return [(bounds[i], min(bounds[i + 1], end)) for i in range(count)]


def max_coalesce_blocks(max_coalesce_bytes: int, block_size: int) -> int:
    return max(1, max_coalesce_bytes // block_size)
