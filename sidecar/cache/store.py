"""The block cache as the engine sees it: an index in memory over the slab.

Every disk touch (opening and preallocating, copying, hashing) runs in the
executor handed in; the event loop only does bookkeeping, so it never waits for
the disk. The in-memory state is only ever changed on the event loop thread,
which is what serializes the slab's callers.

A slot is in exactly one of these states:

    free       in ``_free``, ready for a write
    writing    in ``_writing``: a write is copying into it in the executor
    live       holds a block in the index (``SlotIndex``) and the policy
    retiring   in ``_retiring``: its block was dropped, but readers still pin it
               or its on-disk valid flag is being cleared; free afterwards

Readers pin the slot of the record they read. Only live, unpinned slots are
ever chosen as eviction victims, and a dropped slot goes back to ``free`` only
once nobody pins it, so a write never overwrites bytes that a reader is
copying out.

The index is flat arrays (``sidecar.cache.index``) and the eviction policy
S3-FIFO over slot numbers (``sidecar.cache.slot_fifo``): no object per block.
A ``SlotRecord`` is made when a lookup asks for one.

``BlockStore.open`` starts from what the slab holds: after a clean stop the
index saved by ``close`` (``sidecar.cache.snapshot``), else every valid slot
header comes back as a live block (``sidecar.cache.recovery``; the crash
analysis is in ``slab.py``); the rest are free, and ``recovery`` reports what
was found. After a crash the store serves at once and the headers are scanned
in the background, batch by batch (``_scan``): a slot the scan has not reached
yet is a sixth state, *unscanned*, neither live nor free, so nothing reads or
writes it until its header has been read.

Executor work is run in a task of its own and awaited through ``shield``: a
client that disconnects mid-read cancels its wait, not the copy, so a pin is
released (and a slot reused) only when the executor is really done with it.

The store calls nobody back: what a call evicted, and a write that failed on
the disk, come back in its result (``Written``, ``Shrunk``, the idents that
``invalidate_object`` dropped); a read of a block that fails its checksum
returns None. The engine acts on them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import functools
import logging
import time
from array import array
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from sidecar.cache import snapshot
from sidecar.cache.errors import CacheDiskError, CacheFullError, ChecksumMismatch
from sidecar.cache.faults import ReadFaults
from sidecar.cache.ident import BlockIdent, SlotRecord
from sidecar.cache.index import SlotBits, SlotIndex, fingerprint, ident_hash, object_hash
from sidecar.cache.recent import RecentChunks
from sidecar.cache.recovery import (
    RecoveredIndex,
    RecoveryReport,
    ScanMerge,
    ScrubProgress,
    free_stack,
)
from sidecar.cache.slab import NotResident, Slab
from sidecar.cache.slot_fifo import SlotFifo
from sidecar.cache.slot_format import SLOT_HEADER_SIZE, SlotScan, chunk_size_for

log = logging.getLogger(__name__)

T = TypeVar("T")

REASON_CAPACITY = "capacity"
REASON_CHECKSUM = "checksum"
REASON_INVALIDATED = "invalidated"
REASON_SHRINK = "shrink"
REASON_RECOVERY = "recovery"
# The name of a block the scrub verifies: recovered blocks are known by slot
# and identity hash only (their names are in their slot headers).
_NAMELESS = BlockIdent("", "", "", -1)
# Memory for verified chunks kept for the next reader (sidecar.cache.recent).
RECENT_CHUNK_BYTES = 64 * 1024 * 1024
# Chunks read at once from a slab written past the page cache (there is no
# kernel read-ahead to lean on): a reader's next fetches find them in memory.
DIRECT_READ_CHUNKS = 4
# Read buffers kept past what the recent-chunk memory holds: reads in flight
# and pieces being sent.
SPARE_READ_BUFFERS = 32
# Slot headers the background scan reads per batch: a batch's merge into the
# index runs on the event loop, a few milliseconds for this many.
SCAN_BATCH_SLOTS = 1024
# Slot headers past the batch being read that the disk is asked for: reads in
# flight while the loop merges, and for a disk that serves many at once.
SCAN_AHEAD_SLOTS = 8192
# The low 32 bits of a generation: what the index keeps (sidecar.cache.index).
_GENERATION_IN_INDEX = 0xFFFFFFFF


class CacheMetrics(Protocol):
    """What the store reports; sidecar.telemetry.metrics.Metrics implements it."""

    def on_eviction(self, reason: str) -> None:
        """A block left the cache: "capacity", "checksum", "invalidated", "shrink",
        or "recovery" (a slot header dropped when the index was rebuilt at start)."""

    def on_checksum_failure(self) -> None:
        """A read found cached bytes that do not match their checksum."""

    def on_disk_error(self, op: str) -> None:
        """The cache disk failed a "read" or a "write" (EIO, ENOSPC...)."""


@dataclass(frozen=True)
class Written:
    """What ``BlockStore.write`` did.

    ``record``: the block as cached, or None when nothing was cached (every
    slot pinned or being written, the object invalidated meanwhile, the store
    closed, or the disk failed). ``evicted``: blocks pushed out to make room
    that no reader had had (cached ahead of their readers): the index keeps
    no names, only the names of such blocks (``_names``), which is what the
    engine needs (read-ahead wasted). The others are counted in the metrics.
    ``disk_error``: why the disk refused the write (``ENOSPC: No space left on
    device``), for the caller to decide whether to keep using the cache.
    """

    record: SlotRecord | None
    evicted: tuple[BlockIdent, ...] = ()
    disk_error: str | None = None


@dataclass(frozen=True)
class Shrunk:
    """What ``BlockStore.shrink`` gave back to the disk, and the unread blocks it
    evicted (as ``Written.evicted``)."""

    released_bytes: int
    evicted: tuple[BlockIdent, ...] = ()


@dataclass(frozen=True)
class Purged:
    """What ``BlockStore.invalidate_object`` dropped: how many blocks, and which
    of them no reader had had (as ``Written.evicted``)."""

    blocks: int
    unread: tuple[BlockIdent, ...] = ()


@dataclass(eq=False)
class BlockWrite:
    """A slot reserved for a block whose bytes are on their way (a fetch in flight).

    Chunks are written into the slot as they arrive (``write_chunk``, in the
    fetch's worker thread) and can be read from it at once (``read_of``);
    ``commit`` then makes it a cached block, ``abort`` gives the slot back.
    ``evicted``: what reserving the slot pushed out of the cache.
    """

    ident: BlockIdent
    slot: int
    length: int
    generation: int
    chunk_size: int
    evicted: tuple[BlockIdent, ...]
    checksums: list[int | None]

    @property
    def complete(self) -> bool:
        return None not in self.checksums


def read_buffers_for(recent_chunk_bytes: int, block_size: int) -> int:
    """How many read buffers the slab keeps for reuse: one per chunk the
    recent-chunk memory holds, and SPARE_READ_BUFFERS more."""
    return recent_chunk_bytes // chunk_size_for(block_size) + SPARE_READ_BUFFERS


def slots_for_capacity(capacity_bytes: int, block_size: int) -> int:
    """Slots that fit ``capacity_bytes``, counting each slot's 4 KiB header."""
    slot_count = capacity_bytes // (block_size + SLOT_HEADER_SIZE)
    if slot_count < 1:
        raise ValueError(
            f"cache capacity of {capacity_bytes} bytes cannot hold one block of "
            f"{block_size} bytes plus its {SLOT_HEADER_SIZE}-byte slot header"
        )
    return slot_count


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
    ) -> None:
        # Use BlockStore.open; this only adopts an opened slab (and the index
        # recovered from it, or the scan that is to fill it).
        self._slab = slab
        self._executor = executor
        self._metrics = metrics
        self._loop = loop
        # Which slot holds which block, as flat arrays (sidecar.cache.index):
        # no object per block, so that millions of slots cost ~100 bytes each.
        # A recovered index is taken over as it is: never two of them in memory.
        if recovered is None:
            recovered = _empty_index(slab)
        self._index = recovered.index
        self._policy = recovered.policy
        # A stack: the most recently freed slot is reused first, while its pages
        # may still be in the page cache.
        self._free: array[int] = recovered.free
        self._pins: dict[int, int] = {}
        self._writing: dict[int, BlockIdent] = {}
        self._cancelled: set[int] = set()  # writing slots whose object was invalidated
        self._landed = asyncio.Event()  # set (and replaced) each time a write ends
        self._retiring: dict[int, bool] = {}  # slot -> clear the on-disk valid flag first
        self._tasks: set[asyncio.Task[Any]] = set()
        self._scrubbing: asyncio.Task[Any] | None = None
        # The background scan of the slot headers after a crash (see _scan):
        # set while it runs; the scrub waits for it (_scrub_rate).
        self._scan_merge = scan
        self._scanning: asyncio.Task[Any] | None = None
        self._scanned = asyncio.Event()
        if scan is None:
            self._scanned.set()
        self._scrub_rate: int | None = None
        # The last generation given out: a start that scans gives out those of
        # a new epoch, above every one on disk (slab.py, "Generations"); one
        # from the snapshot resumes its counter.
        self._generation = 0
        self._closed = False
        self.recovery = report
        self.scrub: ScrubProgress | None = None
        # Warmed blocks: never evicted until read or until their deadline, and
        # never more than a share of the slots, so a warm-up cannot evict
        # itself or flush the live hot set.
        self._clock = clock
        self._protected: dict[int, float] = {}  # slot -> until
        self._max_protected = int(slab.slot_count * protected_share)
        # Slots of cached blocks no reader has had yet (see lookup), and the
        # names of at most _max_names of them: the engine is told when such a
        # block leaves unread (read ahead in vain), and the index has no names.
        self._unread = SlotBits(slab.slot_count)
        self._names: dict[int, BlockIdent] = {}
        self._max_names = max(1024, slab.slot_count // 64)
        # Slots the scrub has yet to verify (cleared when a slot's block leaves
        # the cache).
        self._unscrubbed = SlotBits(slab.slot_count)
        self._drop_written_pages = drop_written_pages
        self._disabled: set[int] = set()  # slots whose space was given back to the disk
        # Slots whose pages were dropped from the page cache: read in the executor
        # straight away. A read that only may not wait (RWF_NOWAIT) still starts
        # the kernel's read-ahead for what it misses, on the event loop.
        self._paged_out = SlotBits(slab.slot_count)
        # Blocks that skip the policy's probation (small objects read whole and
        # often: a segment's manifest and indexes), so scans cannot evict them.
        self._admit_to_main = admit_to_main or _nothing_skips_probation
        self._recent = RecentChunks(recent_chunk_bytes, slab.chunk_size)
        self._read_faults = ReadFaults()
        self._adopt(recovered)

    def _adopt(self, recovered: RecoveredIndex) -> None:
        self._generation = recovered.next_generation - 1

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
    ) -> BlockStore:
        """Open (or create) the slab in ``directory`` and recover its index.

        After a clean stop the index snapshot is taken over. Otherwise the
        store is returned as soon as the slab is open, and the slot headers
        the file kept are read in the background, ``scan_batch`` at a time,
        every valid block joining the index as its batch is merged (see
        ``sidecar.cache.recovery``); ``scanned`` waits for the end.
        ``scan_pause``, if given, is awaited between batches with the slots
        scanned so far (tests hold the scan part-way with it).
        With ``scrub_rate`` (bytes per second) the recovered blocks' data is
        then verified in the background at that rate (``start_scrub``), once
        the scan is done.
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
            recovered = await _take_snapshot(slab, executor, loop)
            merge: ScanMerge | None = None
            if recovered is None:
                # Before any write: every generation of this start must
                # outrank those on disk the scan has yet to find (slab.py).
                await loop.run_in_executor(executor, slab.advance_epoch)
                recovered = _empty_index(slab, first_free=slab.opening.kept_slots,
                                         next_generation=slab.first_generation())
                if slab.opening.kept_slots:
                    merge = ScanMerge(recovered.index, recovered.policy,
                                      recovered.next_generation)
        except BaseException:
            await loop.run_in_executor(executor, slab.close)
            raise
        opening = slab.opening
        if opening.damaged:
            log.warning("cache file %s: %s", slab.path, opening.reason)
        elif opening.reason is not None:
            log.info("cache file %s: %s", slab.path, opening.reason)
        report = RecoveryReport(
            file=opening.state,
            reason=opening.reason,
            slots=slot_count,
            slots_scanned=0 if merge is not None else opening.kept_slots,
            blocks_recovered=len(recovered.index),
            bytes_recovered=recovered.used_bytes,
            corrupt_headers=0,
            duplicates=0,
            next_generation=recovered.next_generation,
            seconds=0.0,
            index="snapshot" if recovered.from_snapshot else "scan",
            scanning=merge is not None,
            slots_to_scan=0 if merge is None else opening.kept_slots,
            scan_seconds=None if merge is not None else 0.0,
            epoch=slab.epoch,
        )
        store = cls(slab=slab, executor=executor, metrics=metrics, loop=loop, clock=clock,
                    recent_chunk_bytes=recent_chunk_bytes,
                    protected_share=protected_share, drop_written_pages=drop_written_pages,
                    recovered=recovered, report=report, admit_to_main=admit_to_main,
                    scan=merge)
        report.seconds = time.perf_counter() - started
        if merge is None:
            store._log_recovery()
        else:
            store._scanning = loop.create_task(store._scan(
                opening.kept_slots, scan_batch, scan_pause, started,
                admit_to_main is not None))
        if scrub_rate:
            store.start_scrub(scrub_rate)
        return store

    def _log_recovery(self) -> None:
        report = self.recovery
        assert report is not None
        if report.dropped:
            log.warning(
                "cache recovery dropped %d slot headers: %d corrupt, %d older duplicates",
                report.dropped, report.corrupt_headers, report.duplicates,
            )
        log.info(
            "cache recovery: %s file, index from the %s, %d of %d slots kept, %d blocks "
            "(%d bytes) recovered, %d corrupt headers and %d duplicates dropped, ready in "
            "%.3f s, scanned in %.3f s",
            report.file, report.index, report.slots_scanned, report.slots,
            report.blocks_recovered, report.bytes_recovered, report.corrupt_headers,
            report.duplicates, report.seconds, report.scan_seconds or 0.0,
        )

    async def scanned(self) -> None:
        """Wait until the scan of the slot headers is over (done, failed, or
        stopped by ``close``); at once when there was none."""
        await self._scanned.wait()

    @property
    def scanning(self) -> bool:
        """Whether the background scan of the slot headers is still running."""
        return self._scan_merge is not None

    async def _scan(self, stop: int, batch: int,
                    pause: Callable[[int], Awaitable[None]] | None, started: float,
                    admit: bool) -> None:
        """Read the slot headers of slots ``0..stop-1`` in batches in the
        executor and merge each into the index here, on the loop, while the
        next batch is read."""
        merge, report = self._scan_merge, self.recovery
        assert merge is not None and report is not None
        try:
            if await self._scan_batches(merge, report, stop, batch, pause, admit):
                report.scanning = False
                report.scan_seconds = time.perf_counter() - started
                self._scan_merge = None  # gives its per-slot array back
                self._log_recovery()
                if self._scrub_rate is not None and not self._closed:
                    self.start_scrub(self._scrub_rate)
        finally:
            self._scanned.set()

    async def _scan_batches(self, merge: ScanMerge, report: RecoveryReport, stop: int,
                            batch: int, pause: Callable[[int], Awaitable[None]] | None,
                            admit: bool) -> bool:
        """Whether every batch was read and merged."""
        admit_to_main = self._admit_to_main if admit else None
        try:
            first, advised = 0, 0
            while True:
                # Each batch asks the disk for the next one's headers before it
                # returns: the kernel reads them while this batch is merged.
                # The read itself waits for the merge: a thread decoding
                # headers while the loop merges takes the GIL from it every
                # few milliseconds (at 2M slots the loop then stalled up to
                # 96 ms, 13 ms this way, for the same scan time).
                last = min(stop, first + batch)
                found = await asyncio.shield(self._read_batch(first, last, admit_to_main,
                                                              advised))
                if self._closed:
                    return False
                self._merge_batch(merge, report, found, last - first)
                if last >= stop:
                    return True
                if pause is not None:
                    await pause(merge.slots_scanned)
                # The call before hinted SCAN_AHEAD_SLOTS past its end.
                first, advised = last, SCAN_AHEAD_SLOTS
        except asyncio.CancelledError:
            log.info("cache scan stopped at %d of %d slot headers", merge.slots_scanned, stop)
            raise
        except Exception as exc:
            # The slots not scanned stay out of use (neither free nor indexed)
            # until the next start scans them again; the cache works with the rest.
            if isinstance(exc, OSError):
                self._metrics.on_disk_error("read")
            log.warning("cache scan stopped at %d of %d slot headers: %s",
                        merge.slots_scanned, stop, exc)
            return False

    def _read_batch(
        self, first: int, stop: int,
        admit_to_main: Callable[[BlockIdent], bool] | None, advised: int,
    ) -> asyncio.Task[SlotScan]:
        # Its own task (in _tasks): close waits for a batch being read before
        # it closes the slab, even when the scan itself was cancelled.
        task = self._loop.create_task(self._in_executor(functools.partial(
            self._slab.scan, first, stop, admit_to_main, advised=advised,
            ahead=SCAN_AHEAD_SLOTS)))
        self._track(task)
        return task

    def _merge_batch(self, merge: ScanMerge, report: RecoveryReport, found: SlotScan,
                     slots: int) -> None:
        merged = merge.merge(found, slots, self._drop_older_copy)
        # Pushed highest first: the stack hands out the lowest slot first.
        self._free.extend(array("i", reversed(merged.free)))
        for _ in merged.erase:
            self._metrics.on_eviction(REASON_RECOVERY)
        for _ in merged.purged:
            self._metrics.on_eviction(REASON_INVALIDATED)
        if merged.erase or merged.purged:
            self._track(self._loop.create_task(
                self._erase_then_free(merged.erase + merged.purged)))
        report.slots_scanned = merge.slots_scanned
        report.blocks_recovered = merge.blocks_recovered
        report.bytes_recovered = merge.bytes_recovered
        report.corrupt_headers = merge.corrupt_headers
        report.duplicates = merge.duplicates

    def _drop_older_copy(self, slot: int) -> None:
        """A block recovered earlier in the scan has a newer copy on disk."""
        self._drop(slot, REASON_RECOVERY)

    async def _erase_then_free(self, slots: list[int]) -> None:
        # Out of the free list until erased, so that the erasure never lands
        # on a newer block's header.
        try:
            await self._loop.run_in_executor(self._executor, _erase_all, self._slab, slots)
        except Exception as exc:  # the next write of each slot clears its flag anyway
            if isinstance(exc, OSError):
                self._metrics.on_disk_error("write")
            log.warning("could not erase %d dropped cache slot headers: %s", len(slots), exc)
        if not self._closed:
            self._free.extend(array("i", reversed(slots)))

    def recovery_stats(self) -> dict[str, Any] | None:
        """The recovery report and the scrub's progress (``cache.recovery`` in the stats)."""
        if self.recovery is None:
            return None
        return {**self.recovery.as_dict(),
                "scrub": None if self.scrub is None else self.scrub.as_dict()}

    def start_scrub(self, rate: int) -> None:
        """Verify the data of every block cached now, in slot order (the disk's),
        at most ``rate`` bytes per second, in the background until done or closed.

        Reads are lazily verified anyway; the scrub finds damage before a
        client meets it, with a bound on the disk bandwidth it takes from the
        foreground: one block at a time, paced after each block.
        """
        if rate <= 0:
            raise ValueError(f"scrub rate must be positive, got {rate}")
        if self._closed or self.scrub is not None:
            return
        if self._scan_merge is not None:
            # Not every recovered block is indexed yet: the scan starts it.
            self._scrub_rate = rate
            return
        for slot in range(self._index.slot_count):
            if self._index.holds(slot):
                self._unscrubbed.add(slot)
        self.scrub = ScrubProgress(rate=rate, blocks=len(self._unscrubbed))
        self._track(self._loop.create_task(self._scrub(self.scrub)))

    @property
    def block_size(self) -> int:
        return self._slab.block_size

    @property
    def slot_count(self) -> int:
        return self._slab.slot_count

    def lookup(self, ident: BlockIdent, *, touch: bool = True) -> SlotRecord | None:
        """The record of a cached block, or None. ``touch`` counts it as a hit
        for eviction (the engine's look-ahead probes pass False).

        The first read of a block cached before any reader had its bytes (a
        coalesced fetch running ahead of its reader, read-ahead, warm-up) is its
        first use, not a reuse: counted as a hit, a segment scan would promote
        every block it reads into S3-FIFO's main queue and push out the blocks
        that are really shared (manifests, indexes).
        """
        if self._closed:
            return None
        slot = self._index.find(ident_hash(ident))
        if slot < 0:
            return None
        if touch:
            if slot in self._unread:
                self._unread.discard(slot)
                self._names.pop(slot, None)
            else:
                self._policy.touch(slot)
            self._protected.pop(slot, None)  # warmed "until read": it was read
        return self._record(ident, slot)

    def _record(self, ident: BlockIdent, slot: int) -> SlotRecord:
        # Made on demand: the index holds no object per block (the generation
        # is its low 32 bits, see sidecar.cache.index).
        return SlotRecord(ident, slot, self._index.length(slot), self._index.generation(slot),
                          self._index.checksums_of(slot))

    def _current(self, record: SlotRecord) -> bool:
        """Whether ``record``'s slot still holds that block with those checksums."""
        slot, index = record.slot, self._index
        if not index.holds(slot) or index.length(slot) != record.length \
                or index.generation(slot) != record.generation & 0xFFFFFFFF \
                or index.checksums_of(slot) != record.checksums:
            return False
        return record.ident is _NAMELESS or index.hash_of(slot) == ident_hash(record.ident)

    def protect(self, ident: BlockIdent, ttl_s: float) -> bool:
        """Keep a cached block from eviction until it is read or ttl_s passes.

        False when the block is not cached or the protected share is full.
        """
        slot = self._index.find(ident_hash(ident))
        if slot < 0:
            return False
        if slot not in self._protected and len(self._protected) >= self._max_protected:
            now = self._clock()
            for expired in [s for s, until in self._protected.items() if until <= now]:
                del self._protected[expired]
            if len(self._protected) >= self._max_protected:
                return False
        self._protected[slot] = max(self._protected.get(slot, 0.0), self._clock() + ttl_s)
        return True

    def protected_blocks(self) -> int:
        return len(self._protected)

    async def read(
        self, record: SlotRecord, start: int, end: int, *, through: int = 0
    ) -> memoryview | None:
        """Bytes ``start..end-1`` of the block, read and verified (a copy: the
        slot may be rewritten once this returns), or None if it is no longer
        cached (evicted or replaced since lookup, or failed its checksum).
        ``through``: where in the block the caller's request ends, which a read
        past the page cache may read up to (DIRECT_READ_CHUNKS at most)."""
        if not self._pin_if_current(record, start, end):
            return None
        chunk, lo, hi = self._chunk_around(start, end, record.length)
        # The whole chunk when the range is in one, kept for the next reader.
        keep = bool(hi) and self._recent.enabled
        recent = self._recent.get(record.ident, record.generation & _GENERATION_IN_INDEX,
                                  chunk) if keep else None
        if recent is not None:
            self._unpin(record.slot)
            return recent[start - lo:end - lo]
        first, stop = (lo, hi) if keep else (start, end)
        try:
            data = self._read_resident(record, first, stop)
        except NotResident:
            # Neither a task nor the executor for bytes in the page cache: only
            # a read that may wait for the disk needs them.
            data = await self._in_task(self._read_pinned(record, first, stop, through))
        else:
            self._unpin(record.slot)
        if data is None or not keep:
            return data
        self._keep(record.ident, record.generation, chunk, data)
        return data[start - lo:end - lo]

    def _read_resident(self, record: SlotRecord, start: int, end: int) -> memoryview | None:
        """The bytes read and verified right here on the loop if they are all in
        the page cache (None: they failed their checksum, the block is dropped);
        raises NotResident otherwise, and for a slot whose pages were dropped
        (a read that may not wait still starts the kernel's read-ahead for what
        it misses, on the loop)."""
        if record.slot in self._paged_out:
            raise NotResident(record.slot)
        try:
            return self._slab.read_checked(record.slot, start, end, record.length,
                                           record.checksums, resident=True)
        except (ChecksumMismatch, OSError) as exc:
            self._checksum_failed(record, exc)
            return None

    def _chunk_around(self, start: int, end: int, length: int) -> tuple[int, int, int]:
        """The chunk [start, end) lies in and its bounds in the block; hi 0 when
        the range spans more than one chunk."""
        size = self._slab.chunk_size
        chunk = start // size
        lo, hi = chunk * size, min((chunk + 1) * size, length)
        return (chunk, lo, hi) if end <= hi else (chunk, lo, 0)

    def _pin_if_current(self, record: SlotRecord, start: int, end: int) -> bool:
        """Pin the record's slot if it still holds that record (checked and pinned
        in one step: from here on the slot cannot be handed to a writer)."""
        if not 0 <= start <= end <= record.length:
            raise ValueError(f"range {start}..{end} outside the block's {record.length} bytes")
        if self._closed or not self._current(record):
            return False
        self._pin(record.slot)
        return True

    async def _verified(
        self, work: Callable[[int, int, int, SlotRecord], T], record: SlotRecord,
        start: int, end: int,
    ) -> T | None:
        """Run a checksummed slab read in the executor; None (block dropped) on a
        mismatch, and on a read the disk failed (EIO): the bytes cannot be
        trusted either way, and the block is fetched again."""
        try:
            return await self._loop.run_in_executor(
                self._executor, work, record.slot, start, end, record
            )
        except ChecksumMismatch as exc:
            self._checksum_failed(record, exc)
            return None
        except OSError as exc:
            self._checksum_failed(record, exc)
            return None

    async def write(
        self, ident: BlockIdent, data: bytes | bytearray, *, read: bool = True
    ) -> Written:
        """Cache ``data`` as ``ident`` (replacing any previous copy).

        ``read`` False: no reader has had the bytes yet (the block was fetched
        ahead of them), so its first lookup is its first use, not a hit.
        """
        if len(data) > self._slab.block_size:
            raise ValueError(f"{len(data)} bytes do not fit a block of {self._slab.block_size}")
        if self._closed:
            return Written(None)
        slot, evicted = await self._reserve_slot()
        if slot is None or self._closed:
            if slot is not None:
                self._free.append(slot)
            return Written(None)
        self._writing[slot] = ident
        self._paged_out.discard(slot)
        self._generation += 1
        written = await self._in_task(
            self._write_reserved(slot, ident, self._generation, data, read)
        )
        if evicted is None:
            return written
        return Written(written.record, (evicted, *written.evicted), written.disk_error)

    async def begin_write(
        self, ident: BlockIdent, length: int, *, may_wait: bool = True
    ) -> BlockWrite | None:
        """Reserve a slot for a block of `length` bytes about to arrive, its valid
        flag cleared (step 1 of slab.py's write); None when no slot can be had
        (every slot pinned or being written) or the store is closed.

        ``may_wait``: the caller holds no other reserved slot, so it may wait for
        a block on its way into probation to make room (see _reserve_slot); a
        fetch reserving the second block of a run must not, or it would wait
        for its own first block, which lands only once all are reserved."""
        if not 0 <= length <= self._slab.block_size:
            raise ValueError(f"{length} bytes do not fit a block of {self._slab.block_size}")
        if self._closed:
            return None
        slot, evicted = await self._reserve_slot(may_wait)
        if slot is None or self._closed:
            if slot is not None:
                self._free.append(slot)
            return None
        self._writing[slot] = ident
        if self._slab.direct_io:
            # Its chunks go past the page cache: a read of the block goes to
            # the disk at once, with no try on the loop first.
            self._paged_out.add(slot)
        else:
            self._paged_out.discard(slot)
        self._generation += 1
        chunk = self._slab.chunk_size
        write = BlockWrite(ident, slot, length, self._generation, chunk,
                           () if evicted is None else (evicted,),
                           [None] * -(-length // chunk))
        try:
            await self._in_task(self._in_executor(self._slab.invalidate, slot))
        except OSError as exc:
            self.abort(write)
            raise CacheDiskError(self._write_failed(exc)) from exc
        return write

    def write_chunk(self, write: BlockWrite, offset: int, data: memoryview) -> int:
        """Write one chunk of `write` at `offset` of its data; its checksum.
        Blocking, thread safe: called in the fetch's worker thread (the slot is
        the write's alone). Raises CacheDiskError when the disk refuses it."""
        try:
            return self._slab.write_chunk(write.slot, offset, data, first=False)
        except OSError as exc:
            raise CacheDiskError(self._write_failed(exc)) from exc

    def landed_copy(self, data: memoryview) -> memoryview | None:
        """A copy of a chunk in hand as it lands, for ``keep_landed``; None when
        no chunk is kept in memory (``recent_chunks`` 0). Blocking-free, thread
        safe: called in the fetch's worker thread, which reuses ``data``."""
        return self._slab.copy_of(data) if self._recent.enabled and data else None

    def keep_landed(self, write: BlockWrite, chunk: int, copy: memoryview) -> None:
        """A landing chunk of ``write``, copied (``landed_copy``) from the buffer
        its checksum was taken in, for the reader waiting for it: served from
        memory like a chunk just read and verified, with no read of the slot."""
        self._recent.put(write.ident, write.generation & _GENERATION_IN_INDEX, chunk, copy,
                         len(copy))

    def hold(self, write: BlockWrite) -> None:
        """Keep the write's slot from being reused while a reader is at it, even
        if the write is aborted meanwhile (its landed chunks stay readable)."""
        self._pin(write.slot)

    def let_go(self, write: BlockWrite) -> None:
        self._unpin(write.slot)

    async def read_of(
        self, write: BlockWrite, start: int, end: int, *, through: int = 0
    ) -> memoryview:
        """Bytes [start, end) of an unfinished write, from chunks that have
        landed, verified against the checksums taken as they arrived (and,
        as in ``read``, landed ones up to ``through``).
        Raises ChecksumMismatch if the disk did not keep them."""
        self._check_landed(write, start, end)
        chunk, lo, hi = self._chunk_around(start, end, write.length)
        recent = self._recent.get(write.ident, write.generation & _GENERATION_IN_INDEX,
                                  chunk) if hi else None
        if recent is not None:
            return recent[start - lo:end - lo]
        # The whole chunk when the range is in one, kept for the next reader.
        keep = bool(hi) and self._recent.enabled
        first, stop = (lo, hi) if keep else (start, end)
        self._pin(write.slot)
        try:
            if keep and self._slab.direct_io:
                # Landed on the disk, not in the page cache: this chunk and the
                # landed ones after it, in one read.
                run = chunk + 1
                wanted = min(-(-min(through, write.length) // self._slab.chunk_size),
                             chunk + DIRECT_READ_CHUNKS)
                while run < wanted and write.checksums[run] is not None:
                    run += 1
                views = await self._in_task(self._in_executor(
                    self._slab.read_direct, write.slot, chunk, run, write.length,
                    write.checksums))
                self._keep_chunks(write.ident, write.generation, chunk, views)
                return views[0][start - lo:end - lo]
            try:
                view = self._slab.read_checked(write.slot, first, stop, write.length,
                                               write.checksums, resident=True)
            except NotResident:
                view = await self._in_task(self._in_executor(
                    self._slab.read_checked, write.slot, first, stop, write.length,
                    write.checksums))
            if not keep:
                return view
            self._keep(write.ident, write.generation, chunk, view)
            return view[start - lo:end - lo]
        except (ChecksumMismatch, OSError) as exc:
            log.warning("block %s read back wrong while being written: %s", write.ident, exc)
            self._metrics.on_checksum_failure()
            self._read_failed(exc)
            raise ChecksumMismatch(write.slot, start // write.chunk_size) from exc
        finally:
            self._unpin(write.slot)

    async def commit(self, write: BlockWrite, *, read: bool) -> Written:
        """Seal a complete write (its header, step 3) and cache it. ``read``: as in
        ``write``. A write invalidated meanwhile is dropped, not cached."""
        if not write.complete:
            raise ValueError(f"block {write.ident} is not complete")
        checksums = tuple(c for c in write.checksums if c is not None)
        try:
            record = await self._in_task(self._in_executor(
                self._slab.seal, write.slot, write.ident, write.generation, write.length,
                checksums))
        except OSError as exc:
            log.warning("could not cache block %s in slot %d: %s", write.ident, write.slot, exc)
            self.abort(write)
            return Written(None, write.evicted, self._write_failed(exc))
        written = self._insert(write.slot, write.ident, record, read)
        return Written(written.record, (*write.evicted, *written.evicted), written.disk_error)

    def abort(self, write: BlockWrite) -> None:
        """Give an unfinished write's slot back (once its readers have let go)."""
        if self._writing.get(write.slot) == write.ident:
            self._end_write(write.slot)
            # The flag was cleared first: whatever landed is no block for recovery.
            self._retire(write.slot, clear_on_disk=False)

    def _keep(self, block: BlockIdent, generation: int, chunk: int, view: memoryview) -> None:
        """A chunk just read and verified, for the next reader (its bytes are a
        copy of the slab's, which nothing writes to again)."""
        data = view.obj
        if isinstance(data, bytes | bytearray) and len(view) == len(data):
            # Keyed by what the index keeps of the generation, so that a record
            # from a lookup finds the chunks its write kept.
            self._recent.put(block, generation & _GENERATION_IN_INDEX, chunk, data, len(data))

    def _keep_chunks(self, block: BlockIdent, generation: int, first: int,
                     views: list[memoryview]) -> None:
        """Chunks ``first``.. just read and verified, each in a buffer of its own
        that nothing writes to again, for the next reader."""
        for chunk, view in enumerate(views, first):
            self._recent.put(block, generation & _GENERATION_IN_INDEX, chunk, view, len(view))

    def release_pages(self, ident: BlockIdent) -> None:
        """A reader went past this block: write its pages back and drop them from
        the page cache, unless someone is reading it now (with drop_written_pages)."""
        slot = self._index.find(ident_hash(ident))
        if slot < 0 or not self._drop_written_pages or slot in self._pins:
            return
        self._track(self._loop.create_task(self._write_back(slot)))

    def _check_landed(self, write: BlockWrite, start: int, end: int) -> None:
        first, last = start // write.chunk_size, (end - 1) // write.chunk_size
        if not 0 <= start < end <= write.length or \
                any(write.checksums[c] is None for c in range(first, last + 1)):
            raise ValueError(f"bytes {start}..{end} of {write.ident} have not all landed")

    async def _in_executor(self, work: Callable[..., T], *args: Any) -> T:
        return await self._loop.run_in_executor(self._executor, work, *args)

    async def _write_back(self, slot: int) -> None:
        try:
            await self._loop.run_in_executor(self._executor, self._slab.write_back, slot)
        except (OSError, ValueError) as exc:  # advice only; a closed slab ends it
            log.debug("could not write back cache slot %d: %s", slot, exc)
        else:
            self._paged_out.add(slot)

    def invalidate_object(self, bucket: str, key: str) -> Purged:
        """Drop every cached block of the object, whatever its ETag."""
        digest = object_hash(bucket.encode(), key.encode())
        slots = self._index.slots_of_object(digest)
        if self._scan_merge is not None:
            # Its blocks in slots not scanned yet must not come back.
            self._scan_merge.purge(digest)
        self._recent.forget_object(bucket, key)
        unread = [name for slot in slots if (name := self._names.get(slot)) is not None]
        for slot in slots:
            self._drop(slot, REASON_INVALIDATED)
        # A write still copying would otherwise bring the object back.
        for slot, ident in self._writing.items():
            if (ident.bucket, ident.key) == (bucket, key):
                self._cancelled.add(slot)
        return Purged(len(slots), tuple(unread))

    def used_bytes(self) -> int:
        return self._index.used_bytes

    def index_bytes(self) -> int:
        """Memory the index of the slots takes (arrays of the index, the policy,
        the free stack and the per-slot bits), for the benchmark."""
        return (self._index.nbytes() + self._policy.nbytes()
                + self._free.itemsize * self._free.buffer_info()[1]
                + self._unread.nbytes() + self._unscrubbed.nbytes() + self._paged_out.nbytes()
                + (0 if self._scan_merge is None else self._scan_merge.nbytes()))

    def capacity_bytes(self) -> int:
        """Bytes of block data the usable slots can hold (slot headers not included)."""
        return (self._slab.slot_count - len(self._disabled)) * self._slab.block_size

    def shrink(self, nbytes: int) -> Shrunk:
        """Give about `nbytes` of disk space back (free slots first, then evicting
        the policy's victims). Never touches pinned, protected or in-flight slots."""
        slot_bytes = SLOT_HEADER_SIZE + self._slab.block_size
        want = -(-nbytes // slot_bytes)
        evicted: list[BlockIdent] = []
        if want > len(self._free):
            for victim in self._policy.choose_victims(want - len(self._free), self._is_pinned):
                name = self._forget(victim)
                self._evicted(victim, REASON_SHRINK)
                self._retire(victim, clear_on_disk=False)
                if name is not None:
                    evicted.append(name)
        slots = [self._free.pop() for _ in range(min(want, len(self._free)))]
        self._disabled.update(slots)
        for slot in slots:
            self._track(self._loop.create_task(self._release_space(slot)))
        return Shrunk(len(slots) * slot_bytes, tuple(evicted))

    def grow(self) -> int:
        """Take back every slot given to the disk; returns how many."""
        slots = sorted(self._disabled, reverse=True)
        self._disabled.clear()
        self._free.extend(array("i", slots))
        return len(slots)

    async def _release_space(self, slot: int) -> None:
        try:
            await self._loop.run_in_executor(self._executor, self._slab.release_space, slot)
        except OSError as exc:
            log.warning("could not give back the space of cache slot %d: %s", slot, exc)

    def block_count(self) -> int:
        return len(self._index)

    @property
    def busy(self) -> bool:
        """Whether disk work (reads, writes, page advice, the scrub) is under way."""
        return bool(self._tasks)

    async def idle(self) -> None:
        """Wait until no disk work is under way (work started meanwhile included)."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))

    async def close(self) -> None:
        """Stop the scrub, wait for the reads and writes in progress, then unmap
        the slab."""
        if self._closed:
            return
        self._closed = True
        if self._scrubbing is not None:
            # Cancels the pacing, not a verification in flight: that one runs
            # in a task of its own (in _tasks), awaited below like any read.
            self._scrubbing.cancel()
        if self._scanning is not None:
            # Likewise: a batch being read is in _tasks and awaited below.
            self._scanning.cancel()
            await asyncio.wait([self._scanning])
        while self._tasks:
            # wait, not gather: cancelling close must not cancel the copies.
            await asyncio.wait(list(self._tasks))
        try:
            if self._scan_merge is None:
                await self._loop.run_in_executor(self._executor, self._save_snapshot)
            else:
                # The index lacks the slots not scanned: a snapshot of it would
                # lose their blocks. The next start scans again instead.
                log.info("cache index snapshot not saved: the scan had read %d of %d slot "
                         "headers", self._scan_merge.slots_scanned,
                         self.recovery.slots_to_scan if self.recovery else 0)
        finally:
            await self._loop.run_in_executor(self._executor, self._slab.close)

    def _save_snapshot(self) -> None:
        """The index for the next start (sidecar.cache.snapshot): no read or
        write of a live slot is under way any more. Blocking."""
        started = time.perf_counter()
        try:
            size = snapshot.save(self._slab.path.parent, self._slab.path, self._index,
                                 self._policy, self._free, self._generation + 1)
        except OSError as exc:  # the next start scans the slot headers instead
            log.warning("could not save the cache index snapshot: %s", exc)
            return
        log.info("cache index snapshot saved: %d blocks, %d bytes, in %.3f s",
                 len(self._index), size, time.perf_counter() - started)

    async def _scrub(self, progress: ScrubProgress) -> None:
        self._scrubbing = asyncio.current_task()
        due = self._loop.time()
        for slot in range(self._index.slot_count):
            if self._closed:
                return
            if slot not in self._unscrubbed:
                continue
            self._unscrubbed.discard(slot)
            if not self._index.holds(slot):
                progress.skipped += 1
                continue
            # The slot still holds the block recovered into it (a block leaving
            # clears its bit): verify it by slot, its name is on disk only.
            record = SlotRecord(_NAMELESS, slot, self._index.length(slot),
                                self._index.generation(slot), self._index.checksums_of(slot))
            self._pin(slot)
            try:
                intact = await self._in_task(self._scrub_pinned(record))
            except Exception as exc:  # the scrub is advice; reads still verify
                log.warning("cache scrub stopped at slot %d: %s", record.slot, exc)
                return
            if intact:
                progress.verified += 1
                progress.verified_bytes += record.length
            else:
                progress.dropped += 1
            # Blocks start at least length/rate seconds apart: never more than
            # `rate` on average, and time lost in a slow read is not made up
            # for with a burst.
            due = max(due + record.length / progress.rate, self._loop.time())
            delay = due - self._loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
        progress.done = True
        log.info("cache scrub done: %d blocks verified, %d dropped, %d gone before their turn",
                 progress.verified, progress.dropped, progress.skipped)

    async def _scrub_pinned(self, record: SlotRecord) -> bool:
        try:
            intact = await self._verified(self._slab_intact, record, 0, record.length)
        finally:
            self._unpin(record.slot)
        if record.slot not in self._pins:
            # Read for the check only: out of the page cache again, unless a
            # client is reading the block right now.
            self._track(self._loop.create_task(self._drop_pages(record.slot)))
        return intact is not None

    def _slab_intact(self, slot: int, start: int, end: int, record: SlotRecord) -> bool:
        self._slab.verify(slot, start, end, record)
        return True

    async def _read_pinned(
        self, record: SlotRecord, start: int, end: int, through: int = 0
    ) -> memoryview | None:
        try:
            chunk, lo, hi = self._chunk_around(start, end, record.length)
            if hi and self._slab.direct_io:
                return await self._read_direct(record, chunk, start - lo, end - lo,
                                               max(end, through))
            data = await self._verified(self._slab.read_paged_in, record, start, end)
            self._paged_out.discard(record.slot)  # the kernel reads the rest ahead
            return data
        finally:
            self._unpin(record.slot)

    async def _read_direct(
        self, record: SlotRecord, chunk: int, start: int, end: int, through: int
    ) -> memoryview | None:
        """Bytes [start, end) of the chunk, read past the page cache with the
        chunks after it the request goes on into, up to ``through`` in the block
        (at most DIRECT_READ_CHUNKS in all, kept for the reader's next pieces:
        one trip to the executor, not one a chunk). None as _verified."""
        size = self._slab.chunk_size
        wanted = -(-min(through, record.length) // size) if self._recent.enabled else 0
        run = max(chunk + 1, min(wanted, chunk + DIRECT_READ_CHUNKS))

        def read(slot: int, first: int, stop: int, expected: SlotRecord) -> list[memoryview]:
            return self._slab.read_direct(slot, first, stop, expected.length,
                                          expected.checksums)

        views = await self._verified(read, record, chunk, run)
        if views is None:
            return None
        self._keep_chunks(record.ident, record.generation, chunk, views)
        return views[0][start:end]

    def _checksum_failed(self, record: SlotRecord, exc: ChecksumMismatch | OSError) -> None:
        log.warning("dropping cached block %s of slot %d: %s",
                    "(recovered)" if record.ident is _NAMELESS else record.ident,
                    record.slot, exc)
        self._metrics.on_checksum_failure()
        self._read_failed(exc)
        if self._current(record):
            self._drop(record.slot, REASON_CHECKSUM)

    def _read_failed(self, exc: ChecksumMismatch | OSError) -> None:
        if isinstance(exc, OSError):
            self._metrics.on_disk_error("read")
            self._read_faults.error(self._clock(), exc)
        else:
            self._read_faults.mismatch(self._clock())

    def _write_failed(self, exc: OSError) -> str:
        """Count a write the disk refused; what went wrong, for the caller."""
        self._metrics.on_disk_error("write")
        return _describe_disk_error(exc)

    def read_fault(self) -> str | None:
        """Why the disk counts as failing its reads (sidecar.cache.faults), or None:
        for the caller to decide whether to keep using the cache."""
        return self._read_faults.problem(self._clock())

    def disk_recovered(self) -> None:
        """The disk was seen well again: earlier failed reads no longer count."""
        self._read_faults.clear()

    async def _write_reserved(
        self, slot: int, ident: BlockIdent, generation: int, data: bytes | bytearray,
        read: bool,
    ) -> Written:
        try:
            record = await self._loop.run_in_executor(
                self._executor, self._slab.write_block, slot, ident, generation, data
            )
        except BaseException as exc:
            # The next write of this slot clears its valid flag first, so a
            # half-written slot needs no cleanup on disk.
            self._end_write(slot)
            self._retire(slot, clear_on_disk=False)
            if isinstance(exc, OSError):
                # A failing cache disk must not fail the client whose block
                # this is: the block is just not cached.
                log.warning("could not cache block %s in slot %d: %s", ident, slot, exc)
                return Written(None, disk_error=self._write_failed(exc))
            raise
        return self._insert(slot, ident, record, read)

    def _insert(self, slot: int, ident: BlockIdent, record: SlotRecord, read: bool) -> Written:
        """A block written and sealed in its slot joins the index and the policy."""
        cancelled = self._end_write(slot)
        if self._closed:
            return Written(None)
        if cancelled:
            self._retire(slot, clear_on_disk=True)
            return Written(None)
        evicted: list[BlockIdent] = []
        digest = ident_hash(ident)
        previous = self._index.find(digest)
        if previous >= 0:
            # Replaced while we wrote (or before): the new slot takes the old
            # one's place in the policy.
            self._forget(previous)
            self._policy.replace(previous, slot)
            self._retire(previous, clear_on_disk=True)
        else:
            try:
                victims = self._policy.insert(
                    slot, fingerprint(digest), self._is_pinned,
                    main=self._admit_to_main(ident))
            except CacheFullError:
                # Cannot happen while the reserved slot is outside the policy
                # (it has fewer entries than slots); kept correct regardless.
                self._retire(slot, clear_on_disk=True)
                return Written(None)
            for victim in victims:
                name = self._forget(victim)
                self._evicted(victim, REASON_CAPACITY)
                self._retire(victim, clear_on_disk=False)
                if name is not None:
                    evicted.append(name)
        self._index.add(slot, digest, record.length, record.generation, record.checksums)
        if self._scan_merge is not None:
            self._scan_merge.written(slot, record.generation)
        # As a lookup would make it: the index keeps the low 32 bits.
        record = record._replace(generation=record.generation & _GENERATION_IN_INDEX)
        if not read:
            self._unread.add(slot)
            if len(self._names) < self._max_names:
                self._names[slot] = ident
        return Written(record, tuple(evicted))

    def _end_write(self, slot: int) -> bool:
        self._writing.pop(slot)
        # Wakes the writes waiting for a victim in probation (_reserve_slot);
        # the record, if any, is inserted before they run again.
        self._landed.set()
        self._landed = asyncio.Event()
        if slot in self._cancelled:
            self._cancelled.discard(slot)
            return True
        return False

    async def _reserve_slot(self, may_wait: bool = True) -> tuple[int | None, BlockIdent | None]:
        """A slot for a write, and the block evicted to free it (if one was).

        S3-FIFO takes victims from the small FIFO while it holds its share,
        else from main. Blocks being written now will join the small FIFO, but
        are not in it yet: with a small FIFO of a few slots, writes that overlap
        would find it empty and evict blocks that proved reuse (a segment's
        manifest, say) from main. A write then waits for the block written
        before it to land in probation, and evicts that one instead.
        """
        while True:
            if self._free:
                return self._free.pop(), None
            if not self._scanned.is_set():
                # Unscanned slots may be empty: evicting a recovered block to
                # make room would throw it away for nothing. The block is
                # served uncached instead, until the scan frees or finds one.
                return None, None
            joining_probation = may_wait and any(
                not self._admit_to_main(ident) for ident in self._writing.values()
            )
            victims = self._policy.choose_victims(1, self._is_pinned,
                                                  probation_only=joining_probation)
            if victims:
                break
            if not joining_probation or self._closed:
                return None, None
            await self._landed.wait()
        victim = victims[0]
        name = self._forget(victim)
        self._evicted(victim, REASON_CAPACITY)
        # Unpinned by construction, so the writer may take the slot at once;
        # the write itself clears the old header's valid flag first.
        return victim, name

    def _is_pinned(self, slot: int) -> bool:
        if slot in self._pins:
            return True
        until = self._protected.get(slot)
        if until is None:
            return False
        if until > self._clock():
            return True
        del self._protected[slot]
        return False

    def _forget(self, slot: int) -> BlockIdent | None:
        """Remove the slot's block from the index (not from the policy); its name
        if it was unread and named."""
        self._index.remove(slot)
        self._protected.pop(slot, None)
        self._unread.discard(slot)
        self._unscrubbed.discard(slot)
        return self._names.pop(slot, None)

    def _drop(self, slot: int, reason: str) -> None:
        self._forget(slot)
        self._policy.remove(slot)
        self._evicted(slot, reason)
        # Cleared on disk so that a future recovery of the index cannot bring
        # back an invalidated or corrupt block.
        self._retire(slot, clear_on_disk=True)

    def _evicted(self, slot: int, reason: str) -> None:
        self._metrics.on_eviction(reason)
        # Evicted data is of no use in the page cache: say so now rather than
        # let it push out the broker's pages.
        self._track(self._loop.create_task(self._drop_pages(slot)))

    async def _drop_pages(self, slot: int) -> None:
        try:
            await self._loop.run_in_executor(self._executor, self._slab.drop_pages, slot)
        except (OSError, ValueError) as exc:  # advice only; a closed slab ends it
            log.debug("could not advise the kernel about slot %d: %s", slot, exc)
        else:
            self._paged_out.add(slot)

    def _retire(self, slot: int, *, clear_on_disk: bool) -> None:
        self._retiring[slot] = clear_on_disk or self._retiring.get(slot, False)
        self._recycle_if_idle(slot)

    def _recycle_if_idle(self, slot: int) -> None:
        if slot in self._pins or self._closed:
            return
        clear_on_disk = self._retiring.pop(slot, None)
        if clear_on_disk is None:
            return
        if clear_on_disk:
            self._track(self._loop.create_task(self._clear_then_free(slot)))
        else:
            self._free.append(slot)

    async def _clear_then_free(self, slot: int) -> None:
        # The slot stays out of the free list until the flag is cleared, so this
        # 2-byte write can never land on top of a newer block's header.
        try:
            await self._loop.run_in_executor(self._executor, self._slab.invalidate, slot)
        except Exception as exc:  # the next write clears the flag anyway
            if isinstance(exc, OSError):
                self._metrics.on_disk_error("write")
            log.warning("could not clear the valid flag of cache slot %d: %s", slot, exc)
        if not self._closed:
            self._free.append(slot)

    def _pin(self, slot: int) -> None:
        self._pins[slot] = self._pins.get(slot, 0) + 1

    def _unpin(self, slot: int) -> None:
        count = self._pins[slot] - 1
        if count:
            self._pins[slot] = count
            return
        del self._pins[slot]
        self._recycle_if_idle(slot)

    async def _in_task(self, work: Coroutine[Any, Any, T]) -> T:
        task = self._loop.create_task(work)
        self._track(task)
        return await asyncio.shield(task)

    def _track(self, task: asyncio.Task[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


async def _take_snapshot(
    slab: Slab, executor: concurrent.futures.Executor, loop: asyncio.AbstractEventLoop,
) -> RecoveredIndex | None:
    """The index snapshot of the last clean stop if there is a good one (read
    in the executor); None: the slot headers must be scanned.

    One scan job at a time, not several in parallel: ``Slab.scan`` already
    keeps a batch of header reads in flight, and decoding holds the GIL, so
    more threads only contend for it (measured with ``python -m bench.recovery``).
    """
    taken = await loop.run_in_executor(
        executor, functools.partial(
            snapshot.take, slab.path.parent, slab.path, slab.slot_count, slab.block_size,
            slab.chunk_size, usable=slab.opening.state == "reused"))
    if taken.reason is not None:
        log.warning("cache file %s: %s", slab.path, taken.reason)
    if taken.restored is None:
        return None
    return RecoveredIndex(
        index=taken.restored.index, policy=taken.restored.policy,
        free=taken.restored.free, next_generation=taken.restored.next_generation,
        from_snapshot=True)


def _empty_index(slab: Slab, first_free: int = 0, next_generation: int = 1) -> RecoveredIndex:
    """An empty index; the slots below ``first_free`` are not free (yet): the
    scan frees those it finds empty."""
    index = SlotIndex(slab.slot_count, slab.block_size, slab.chunk_size)
    return RecoveredIndex(index=index, policy=SlotFifo(slab.slot_count, index.fingerprint_of),
                          free=free_stack(index, first_free), next_generation=next_generation)


def _nothing_skips_probation(ident: BlockIdent) -> bool:
    return False


def _describe_disk_error(exc: OSError) -> str:
    return f"{errno.errorcode.get(exc.errno or 0, 'error')}: {exc.strerror or exc}"


def _erase_all(slab: Slab, slots: list[int]) -> None:
    for slot in slots:
        slab.erase_header(slot)
