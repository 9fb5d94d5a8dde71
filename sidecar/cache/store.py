"""The block cache as the engine sees it: a façade over the cache's rooms.

Each concept is a module of its own; ``BlockStore`` only wires them:

    slot_states   where each slot stands (free, writing, live, retiring) and pins
    residency     the index and the eviction policy: lookup, warm-up protection,
                  room for a write, invalidation, shrink and grow
    slot_reads    reading a slot, verified (also the chunks of a write on its way)
    block_writes  the write lifecycle of a block: reserve, write, seal, cache
    startup       where the store starts from: the snapshot, or a scan to come
    scan          the background scan of the slot headers after a crash
    scrub         the background verification of the recovered blocks
    snapshot      the index saved at close for the next start
    disk_faults   the disk's failures, counted towards bypass
    disk_work     the executor the disk work runs in, and the tasks under way
    memory_tier   verified chunks in a sealed memfd, sent with sendfile
                  (tier_regions: its accounting and eviction; tier_reserve:
                  its pages taken at start)

Every disk touch runs in the executor handed in; the event loop only does
bookkeeping, so it never waits for the disk. The in-memory state is only ever
changed on the event loop thread, which is what serializes the slab's callers.
The store calls nobody back: what a call evicted, and a write that failed on
the disk, come back in its result (``sidecar.cache.outcomes``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from sidecar.cache import snapshot
from sidecar.cache.block_writes import BlockWrite, BlockWriter
from sidecar.cache.disk_faults import DiskFaults
from sidecar.cache.disk_work import DiskWork
from sidecar.cache.ident import BlockIdent, SlotRecord
from sidecar.cache.memory_tier import MemoryTier, TierSlice
from sidecar.cache.outcomes import GENERATION_IN_INDEX, CacheMetrics, Purged, Shrunk, Written
from sidecar.cache.recent import RecentChunks
from sidecar.cache.recovery import RecoveredIndex, RecoveryReport, ScanMerge, ScrubProgress
from sidecar.cache.residency import Residency
from sidecar.cache.scan import SCAN_BATCH_SLOTS, BackgroundScan
from sidecar.cache.scrub import Scrubber
from sidecar.cache.slab import Slab
from sidecar.cache.slot_reads import SlotReader
from sidecar.cache.slot_states import SlotStates
from sidecar.cache.startup import (
    RECENT_CHUNK_BYTES,
    empty_index,
    log_recovery,
    read_buffers_for,
    recover_index,
    report_for,
    slots_for_capacity,
)
from sidecar.cache.tier_reserve import Reserved, reserve
from sidecar.errors import ConfigError

log = logging.getLogger(__name__)

__all__ = ["BlockStore", "BlockWrite", "CacheMetrics", "Purged", "Shrunk", "Written"]


class BlockStore:
    def __init__(
        self,
        *,
        slab: Slab,
        executor: concurrent.futures.Executor,
        metrics: CacheMetrics,
        loop: asyncio.AbstractEventLoop,
        clock: Callable[[], float] = time.monotonic,
        protected_share: float = 0.5,
        drop_written_pages: bool = False,
        recovered: RecoveredIndex | None = None,
        report: RecoveryReport | None = None,
        admit_to_main: Callable[[BlockIdent], bool] | None = None,
        recent_chunk_bytes: int = RECENT_CHUNK_BYTES,
        scan: ScanMerge | None = None,
        tier: MemoryTier | None = None,
    ) -> None:
        # Use BlockStore.open; this only adopts an opened slab (and the index
        # recovered from it, or the scan that is to fill it), and the memory
        # tier, which it closes with the slab.
        recovered = recovered or empty_index(slab)
        self._slab = slab
        self.tier = tier
        self._work = DiskWork(loop, executor)
        if tier is not None:
            tier.release_later = self._release_tier_regions
        self._faults = DiskFaults(metrics, clock)
        self._slots = SlotStates(recovered.free, slab, self._work, metrics)
        recent = RecentChunks(recent_chunk_bytes, slab.chunk_size)
        self._residency = Residency(
            recovered=recovered, slots=self._slots, slab=slab, work=self._work,
            metrics=metrics, clock=clock, protected_share=protected_share,
            drop_written_pages=drop_written_pages,
            admit_to_main=admit_to_main or _nothing_skips_probation, recent=recent, scan=scan)
        self._reader = SlotReader(residency=self._residency, slab=slab, work=self._work,
                                  faults=self._faults, recent=recent, tier=tier)
        self._writer = BlockWriter(residency=self._residency, slab=slab, work=self._work,
                                   faults=self._faults,
                                   next_generation=recovered.next_generation)
        self._scrubber = Scrubber(residency=self._residency, reader=self._reader, slab=slab,
                                  work=self._work)
        self._scan = BackgroundScan(residency=self._residency, slab=slab, work=self._work,
                                    metrics=metrics, report=report, scrubber=self._scrubber)
        self.recovery = report
        self.tier_reserve: asyncio.Task[Reserved] | None = None  # see start_tier_reserve
        # What close() waits for now: read by the stop's deadline, from its thread.
        self.close_step = "nothing (open)"

    @classmethod
    async def open(
        cls,
        directory: Path,
        capacity_bytes: int,
        block_size: int,
        executor: concurrent.futures.Executor,
        metrics: CacheMetrics,
        clock: Callable[[], float] = time.monotonic,
        protected_share: float = 0.5,
        drop_written_pages: bool = False,
        direct_io: bool = False,
        preallocate: bool = True,
        scrub_rate: int | None = None,
        admit_to_main: Callable[[BlockIdent], bool] | None = None,
        recent_chunk_bytes: int = RECENT_CHUNK_BYTES,
        scan_batch: int = SCAN_BATCH_SLOTS,
        scan_pause: Callable[[int], Awaitable[None]] | None = None,
        memory_tier_bytes: int = 0,
        reserve_tier: bool = False,
    ) -> BlockStore:
        """Open (or create) the slab in ``directory`` and recover its index.

        After a clean stop the index snapshot is taken over. Otherwise the
        store is returned as soon as the slab is open, and the slot headers
        the file kept are read in the background, ``scan_batch`` at a time,
        every valid block joining the index as its batch is merged (see
        ``sidecar.cache.scan``); ``scanned`` waits for the end.
        ``scan_pause``, if given, is awaited between batches with the slots
        scanned so far (tests hold the scan part-way with it).
        With ``scrub_rate`` (bytes per second) the recovered blocks' data is
        then verified in the background at that rate (``start_scrub``), once
        the scan is done. With ``memory_tier_bytes`` verified chunks are also
        kept in a memory tier of that size (``sidecar.cache.memory_tier``),
        whose pages ``reserve_tier`` takes in the background from the start
        (``start_tier_reserve``).
        """
        if scan_batch < 1:
            raise ValueError(f"scan_batch must be at least 1, got {scan_batch}")
        slot_count = slots_for_capacity(capacity_bytes, block_size)
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        slab = await loop.run_in_executor(
            executor, Slab.open, directory, slot_count, block_size, preallocate, direct_io,
            read_buffers_for(recent_chunk_bytes, block_size),
        )
        try:
            tier = MemoryTier.create(memory_tier_bytes, slab.chunk_size)
        except BaseException as exc:
            await loop.run_in_executor(executor, slab.close)
            if isinstance(exc, OSError):
                # Not the disk cache's fault: name what could not be had.
                raise ConfigError(f"cannot set up a {memory_tier_bytes}-byte memory_tier: "
                                  f"{exc.strerror or exc}") from None
            if isinstance(exc, ValueError):
                # Too small for one region: a chunk rounded up to whole pages,
                # which the config's check (one chunk) cannot see where pages
                # are larger than 4 KiB. A clear error, not a traceback.
                raise ConfigError(f"cannot set up a {memory_tier_bytes}-byte memory_tier: "
                                  f"{exc}") from None
            raise
        recovered, merge = await recover_index(slab, executor, loop)
        report = report_for(slab, recovered, merge)
        store = cls(slab=slab, executor=executor, metrics=metrics, loop=loop, clock=clock,
                    recent_chunk_bytes=recent_chunk_bytes, tier=tier,
                    protected_share=protected_share, drop_written_pages=drop_written_pages,
                    recovered=recovered, report=report, admit_to_main=admit_to_main,
                    scan=merge)
        report.seconds = time.perf_counter() - started
        if merge is None:
            log_recovery(report)
        else:
            store._scan.start(slab.opening.kept_slots, scan_batch, scan_pause, started,
                              admit_to_main is not None)
        if scrub_rate:
            store.start_scrub(scrub_rate)
        if reserve_tier:
            store.start_tier_reserve()
        return store

    # Recovery, the scan and the scrub.

    @property
    def scrub(self) -> ScrubProgress | None:
        return self._scrubber.progress

    async def scanned(self) -> None:
        """Wait until the scan of the slot headers is over (done, failed, or
        stopped by ``close``); at once when there was none."""
        await self._residency.scanned.wait()

    @property
    def scanning(self) -> bool:
        """Whether the background scan of the slot headers is still running."""
        return self._residency.scan_merge is not None

    def recovery_stats(self) -> dict[str, Any] | None:
        """The recovery report and the scrub's progress (``cache.recovery`` in the stats)."""
        if self.recovery is None:
            return None
        return {**self.recovery.as_dict(),
                "scrub": None if self.scrub is None else self.scrub.as_dict()}

    def start_scrub(self, rate: int) -> None:
        """Verify every cached block's data at most ``rate`` bytes per second
        (``sidecar.cache.scrub``)."""
        self._scrubber.start(rate)

    def start_tier_reserve(self) -> None:
        """Take the memory tier's pages in the background
        (``sidecar.cache.tier_reserve``); ``tier_reserve`` is its task."""
        if self.tier is not None and self.tier_reserve is None:
            self.tier_reserve = self._work.start(self._reserve_tier(self.tier))

    async def _reserve_tier(self, tier: MemoryTier) -> Reserved:
        done = await reserve(tier, self._work, lambda: self._slots.closed)
        if done.error is not None:
            log.warning("memory tier: %d of its %d MiB taken at start, then the kernel "
                        "refused more (%s); the rest is taken as chunks come in",
                        done.bytes >> 20, tier.size_bytes >> 20, done.error)
        elif done.bytes == tier.size_bytes:
            log.info("memory tier: its %d MiB taken in %.2f s",
                     done.bytes >> 20, done.seconds)
        return done

    # Geometry and residency.

    @property
    def block_size(self) -> int:
        return self._slab.block_size

    @property
    def slot_count(self) -> int:
        return self._slab.slot_count

    def lookup(self, ident: BlockIdent, *, touch: bool = True) -> SlotRecord | None:
        """The record of a cached block, or None (``Residency.lookup``)."""
        return self._residency.lookup(ident, touch=touch)

    def protect(self, ident: BlockIdent, ttl_s: float) -> bool:
        """Keep a cached block from eviction until it is read or ttl_s passes.

        False when the block is not cached or the protected share is full.
        """
        return self._residency.protect(ident, ttl_s)

    def protected_blocks(self) -> int:
        return self._residency.protected_blocks()

    def release_pages(self, ident: BlockIdent) -> None:
        """A reader went past this block: write its pages back and drop them from
        the page cache, unless someone is reading it now (with drop_written_pages)."""
        self._residency.release_pages(ident)

    def invalidate_object(self, bucket: str, key: str) -> Purged:
        """Drop every cached block of the object, whatever its ETag."""
        if self.tier is not None:
            self._release_tier_regions(self.tier.forget_object(bucket, key))
        return self._residency.invalidate_object(bucket, key)

    def _release_tier_regions(self, regions: list[int]) -> None:
        """Punch the pages of the tier's regions given up (purged, or their
        last send over) out in the disk executor, not on the event loop; they
        stay unclaimable until then."""
        if not regions or self.tier is None:
            return
        if self._slots.closed:
            # The store is closing, or closed: its close closes the tier, whose
            # file goes with its pages, so nothing is punched (kernel work the
            # loop would wait for); the hold on the file is let go at once, as
            # after the close the disk threads may have stopped.
            self.tier.release(regions, punch=False)
            return
        self._work.start(self._work.run(self.tier.release, regions))

    def used_bytes(self) -> int:
        return self._residency.index.used_bytes

    def index_bytes(self) -> int:
        """Memory the index of the slots takes, for the benchmark."""
        return self._residency.index_bytes()

    def capacity_bytes(self) -> int:
        """Bytes of block data the usable slots can hold (slot headers not included)."""
        return self._residency.capacity_bytes()

    def shrink(self, nbytes: int) -> Shrunk:
        """Give about `nbytes` of disk space back (free slots first, then evicting
        the policy's victims). Never touches pinned, protected or in-flight slots."""
        return self._residency.shrink(nbytes)

    def grow(self) -> int:
        """Take back every slot given to the disk; returns how many."""
        return self._residency.grow()

    def block_count(self) -> int:
        return len(self._residency.index)

    # Reads (sidecar.cache.slot_reads).

    async def read(
        self, record: SlotRecord, start: int, end: int, *, through: int = 0,
        reader: int | None = None,
    ) -> memoryview | None:
        """Bytes ``start..end-1`` of the block, read and verified, or None if it
        is no longer cached (``SlotReader.read``)."""
        return await self._reader.read(record, start, end, through=through, reader=reader)

    async def lift(self, ident: BlockIdent) -> int:
        """A cached block a warm-up asked for, held in the memory tier until
        read (``SlotReader.lift``): how many of its chunks the tier keeps for
        it (0 with no tier, or the block no longer cached)."""
        if self.tier is None:
            return 0
        record = self._residency.lookup(ident, touch=False)
        return 0 if record is None else await self._reader.lift(record)

    def tier_slice(
        self, ident: BlockIdent, generation: int, start: int, end: int, *,
        reader: int | None = None,
    ) -> TierSlice | None:
        """Bytes [start, end) of one chunk of the block (that copy of it: its
        generation), if the memory tier holds them: pinned until the caller's
        send releases them, served with no read and no second hash."""
        if self.tier is None:
            return None
        chunk = start // self._slab.chunk_size
        lo = chunk * self._slab.chunk_size
        return self.tier.slice((ident, generation & GENERATION_IN_INDEX, chunk),
                               start - lo, end - lo, reader=reader)

    def tier_landed(self, write: BlockWrite, at: int, data: memoryview, *,
                    warm: bool = False) -> bool:
        """The chunk of ``write`` at ``at`` just hashed in hand (the same bytes
        its checksum was taken over) into the memory tier; whether it took it.
        Only a whole chunk goes in; one fetched for a warm-up (``warm``) is
        kept until read, as the disk keeps its block. Any thread: the fetch's
        workers call it before they reuse ``data``."""
        size = self._slab.chunk_size
        chunk = at // size
        whole = at % size == 0 and len(data) == min(size, write.length - at)
        if self.tier is None or not whole:
            return False
        return self.tier.put((write.ident, write.generation & GENERATION_IN_INDEX, chunk),
                             data, read=False, warm=warm)

    async def read_landed(
        self, write: BlockWrite, start: int, end: int, *, through: int = 0
    ) -> memoryview:
        """Bytes [start, end) of an unfinished write, from chunks that have
        landed, verified (``SlotReader.read_landed``)."""
        return await self._reader.read_landed(write, start, end, through=through)

    def landed_copy(self, data: memoryview) -> memoryview | None:
        """A copy of a chunk in hand as it lands, for ``keep_landed``."""
        return self._reader.landed_copy(data)

    def keep_landed(self, write: BlockWrite, chunk: int, copy: memoryview) -> None:
        """A landing chunk of ``write`` kept for the reader waiting for it."""
        self._reader.keep_landed(write, chunk, copy)

    def pin_write(self, write: BlockWrite) -> None:
        """Keep the write's slot from being reused while a reader is at it, even
        if the write is aborted meanwhile (its landed chunks stay readable)."""
        self._slots.pin(write.slot)

    def unpin_write(self, write: BlockWrite) -> None:
        self._slots.unpin(write.slot)

    # Writes (sidecar.cache.block_writes).

    async def write(
        self, ident: BlockIdent, data: bytes | bytearray, *, read: bool = True
    ) -> Written:
        """Cache ``data`` as ``ident`` (replacing any previous copy)."""
        return await self._writer.write(ident, data, read=read)

    async def begin_write(
        self, ident: BlockIdent, length: int, *, may_wait: bool = True
    ) -> BlockWrite | None:
        """Reserve a slot for a block of `length` bytes about to arrive
        (``BlockWriter.begin_write``)."""
        return await self._writer.begin_write(ident, length, may_wait=may_wait)

    def write_chunk(self, write: BlockWrite, offset: int, data: memoryview) -> int:
        """Write one chunk of `write` at `offset` of its data; its checksum."""
        return self._writer.write_chunk(write, offset, data)

    async def commit(self, write: BlockWrite, *, read: bool) -> Written:
        """Seal a complete write and cache it (``BlockWriter.commit``)."""
        return await self._writer.commit(write, read=read)

    def abort(self, write: BlockWrite) -> None:
        """Give an unfinished write's slot back (once its readers have let go)."""
        self._writer.abort(write)

    # The disk.

    def read_fault(self) -> str | None:
        """Why the disk counts as failing its reads (sidecar.cache.faults), or None:
        for the caller to decide whether to keep using the cache."""
        return self._faults.read_fault()

    def disk_recovered(self) -> None:
        """The disk was seen well again: earlier failed reads no longer count."""
        self._faults.disk_recovered()

    @property
    def busy(self) -> bool:
        """Whether disk work (reads, writes, page advice, the scrub) is under way."""
        return self._work.busy

    async def idle(self) -> None:
        """Wait until no disk work is under way (work started meanwhile included)."""
        await self._work.idle()

    async def close(self) -> None:
        """Stop the scrub and the scan, wait for the reads and writes in progress,
        save the index snapshot (not while the scan runs), then close the slab."""
        if self._slots.closed:
            return
        self._slots.closed = True
        self._scrubber.stop()
        self.close_step = "the start-up scan of the slot headers to stop"
        await self._scan.stop()
        self.close_step = "the cache disk's reads and writes in progress"
        await self._work.idle()
        residency = self._residency
        try:
            if residency.scan_merge is None:
                self.close_step = "the index snapshot to be written to the cache disk"
                await self._work.run(snapshot.save_at_close, self._slab.path, self._slab.stat,
                                     residency.index, residency.policy, self._slots.free,
                                     self._writer.next_generation)
            else:
                self._scan.log_unsaved()
        finally:
            if self.tier is not None:
                self.tier.close()
            self.close_step = "the slab file to close"
            await self._work.run(self._slab.close)
            self.close_step = "nothing (closed)"


def _nothing_skips_probation(ident: BlockIdent) -> bool:
    return False
