"""Reading a slot: its bytes, verified against their chunks' checksums.

A cached block is read one chunk at a time into a new buffer, hashed there,
and that buffer is what the caller gets: on the event loop when the chunk is
in the page cache (RWF_NOWAIT), else in the executor. Past the page cache
(``direct_io``) a run of chunks is read at once, as far as the caller's
request goes on into the block. Verified chunks are kept in memory for the
next reader (``sidecar.cache.recent``). A chunk that fails its checksum, or a
read the disk fails, drops the block: the caller gets None and fetches again.
Chunks of a block still on its way (``BlockWrite``) are read the same way,
against the checksums taken as they landed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from sidecar.cache.block_writes import BlockWrite
from sidecar.cache.disk_faults import DiskFaults
from sidecar.cache.disk_work import DiskWork
from sidecar.cache.errors import ChecksumMismatch
from sidecar.cache.ident import BlockIdent, SlotRecord
from sidecar.cache.memory_tier import MemoryTier
from sidecar.cache.outcomes import GENERATION_IN_INDEX, REASON_CHECKSUM
from sidecar.cache.recent import RecentChunks
from sidecar.cache.residency import NAMELESS, Residency
from sidecar.cache.slab import NotResident, Slab

# The store's log lines keep the logger name they always had.
log = logging.getLogger("sidecar.cache.store")

T = TypeVar("T")

# Chunks read at once from a slab written past the page cache (there is no
# kernel read-ahead to lean on): a reader's next fetches find them in memory.
DIRECT_READ_CHUNKS = 4


class SlotReader:
    def __init__(self, *, residency: Residency, slab: Slab, work: DiskWork,
                 faults: DiskFaults, recent: RecentChunks,
                 tier: MemoryTier | None = None) -> None:
        self._residency = residency
        self._tier = tier
        self._slots = residency.slots
        self._slab = slab
        self._work = work
        self._faults = faults
        self._recent = recent

    async def read(
        self, record: SlotRecord, start: int, end: int, *, through: int = 0,
        reader: int | None = None,
    ) -> memoryview | None:
        """Bytes ``start..end-1`` of the block, read and verified (a copy: the
        slot may be rewritten once this returns), or None if it is no longer
        cached (evicted or replaced since lookup, or failed its checksum).
        ``through``: where in the block the caller's request ends, which a read
        past the page cache may read up to (DIRECT_READ_CHUNKS at most).
        ``reader``: who reads (a read stream's number; None: unknown), for the
        memory tier's admission (``RegionTable.claim``)."""
        if not self._pin_if_current(record, start, end):
            return None
        chunk, lo, hi = self.chunk_around(start, end, record.length)
        # The whole chunk when the range is in one, kept for the next reader
        # and offered to the memory tier.
        keep = bool(hi) and (self._recent.enabled or self._tier is not None)
        recent = self._recent.get(record.ident, record.generation & GENERATION_IN_INDEX,
                                  chunk) if keep and self._recent.enabled else None
        if recent is not None:
            self._slots.unpin(record.slot)
            return recent[start - lo:end - lo]
        first, stop = (lo, hi) if keep else (start, end)
        try:
            data = self._read_resident(record, first, stop)
        except NotResident:
            # Neither a task nor the executor for bytes in the page cache: only
            # a read that may wait for the disk needs them.
            data = await self._work.shielded(
                self._read_pinned(record, first, stop, through, reader))
        else:
            self._slots.unpin(record.slot)
            if data is not None and keep:
                self._offer_later(record, chunk, data, reader)
        if data is None or not keep:
            return data
        self._keep(record.ident, record.generation, chunk, data)
        return data[start - lo:end - lo]

    def _offer_later(self, record: SlotRecord, chunk: int, data: memoryview,
                     reader: int | None) -> None:
        """A whole chunk just read through the page cache and verified (on the
        loop), offered to the memory tier in the executor: the tier follows the
        working set whether or not the slab is read past the page cache, and
        the copy (and a victim's punch) is never the loop's. ``data`` is the
        reader's own buffer, which nothing writes to again. Asked on the loop
        first: a full tier declines most chunks read, and a trip to the
        executor for each of them would only queue behind the disk's reads."""
        if self._tier is None or record.ident is NAMELESS:
            return
        if self._tier.could_take((record.ident, record.generation & GENERATION_IN_INDEX,
                                  chunk), reader=reader):
            self._work.start(self._work.run(self._into_tier, record.ident, record.generation,
                                            chunk, [data], reader))

    def _read_resident(self, record: SlotRecord, start: int, end: int) -> memoryview | None:
        """The bytes read and verified right here on the loop if they are all in
        the page cache (None: they failed their checksum, the block is dropped);
        raises NotResident otherwise, and for a slot whose pages were dropped
        (a read that may not wait still starts the kernel's read-ahead for what
        it misses, on the loop)."""
        if record.slot in self._residency.paged_out:
            raise NotResident(record.slot)
        try:
            return self._slab.read_checked(record.slot, start, end, record.length,
                                           record.checksums, resident=True)
        except (ChecksumMismatch, OSError) as exc:
            self.checksum_failed(record, exc)
            return None

    async def _read_pinned(
        self, record: SlotRecord, start: int, end: int, through: int = 0,
        reader: int | None = None,
    ) -> memoryview | None:
        try:
            chunk, lo, hi = self.chunk_around(start, end, record.length)
            if hi and self._slab.direct_io:
                return await self._read_direct(record, chunk, start - lo, end - lo,
                                               max(end, through), reader)
            whole = bool(hi) and start == lo and end == hi
            read = self._paged_into_tier(chunk, reader) if whole else self._slab.read_paged_in
            data = await self.verified(read, record, start, end)
            self._residency.paged_out.discard(record.slot)  # the kernel reads the rest ahead
            return data
        finally:
            self._slots.unpin(record.slot)

    async def _read_direct(
        self, record: SlotRecord, chunk: int, start: int, end: int, through: int,
        reader: int | None = None,
    ) -> memoryview | None:
        """Bytes [start, end) of the chunk, read past the page cache with the
        chunks after it the request goes on into, up to ``through`` in the block
        (at most DIRECT_READ_CHUNKS in all, kept for the reader's next pieces:
        one trip to the executor, not one a chunk). None as ``verified``."""
        size = self._slab.chunk_size
        wanted = -(-min(through, record.length) // size) if self._recent.enabled else 0
        run = max(chunk + 1, min(wanted, chunk + DIRECT_READ_CHUNKS))

        def read(slot: int, first: int, stop: int, expected: SlotRecord) -> list[memoryview]:
            views = self._slab.read_direct(slot, first, stop, expected.length,
                                           expected.checksums)
            self._into_tier(expected.ident, expected.generation, first, views, reader)
            return views

        views = await self.verified(read, record, chunk, run)
        if views is None:
            return None
        self._keep_chunks(record.ident, record.generation, chunk, views)
        return views[0][start:end]

    async def lift(self, record: SlotRecord) -> int:
        """A cached block a warm-up asked for, held in the memory tier until
        its first read, as a block fetched for a warm-up is: the chunks the
        tier holds already are protected there, and the others read from the
        slab, verified, and put in (in the executor, a run of at most
        DIRECT_READ_CHUNKS a trip, so that a lift holds few buffers) while the
        tier's protected share has room: a warm-up larger than that would
        read the disk only to push out what it lifted before. How many of the
        block's chunks the tier keeps for it; 0 without a tier, and for a block
        no longer cached or one that failed its checksum (dropped)."""
        tier = self._tier
        if tier is None or record.ident is NAMELESS:
            return 0
        generation = record.generation & GENERATION_IN_INDEX
        chunks = -(-record.length // self._slab.chunk_size)
        missing = [chunk for chunk in range(chunks)
                   if not tier.protect((record.ident, generation, chunk))]
        held = chunks - len(missing)

        def read(slot: int, first: int, stop: int, expected: SlotRecord) -> int:
            views = self._slab.read_direct(slot, first, stop, expected.length,
                                           expected.checksums)
            return sum(tier.put((expected.ident, generation, chunk), view, read=False,
                                warm=True)
                       for chunk, view in enumerate(views, first))

        async def read_pinned(first: int, stop: int) -> int | None:
            try:
                return await self.verified(read, record, first, stop)
            finally:
                self._slots.unpin(record.slot)

        for first, stop in _runs(missing, DIRECT_READ_CHUNKS):
            if tier.protectable_chunks() < stop - first:
                return held
            if not self._pin_if_current(record, 0, record.length):
                return held  # evicted or replaced meanwhile: nothing more to hold
            put = await self._work.shielded(read_pinned(first, stop))
            if put is None:
                return 0  # failed its checksum: dropped, and fetched again if read
            held += put
        return held

    async def read_landed(
        self, write: BlockWrite, start: int, end: int, *, through: int = 0
    ) -> memoryview:
        """Bytes [start, end) of an unfinished write, from chunks that have
        landed, verified against the checksums taken as they arrived (and,
        as in ``read``, landed ones up to ``through``).
        Raises ChecksumMismatch if the disk did not keep them."""
        write.check_landed(start, end)
        chunk, lo, hi = self.chunk_around(start, end, write.length)
        recent = self._recent.get(write.ident, write.generation & GENERATION_IN_INDEX,
                                  chunk) if hi else None
        if recent is not None:
            return recent[start - lo:end - lo]
        # The whole chunk when the range is in one, kept for the next reader.
        keep = bool(hi) and self._recent.enabled
        self._slots.pin(write.slot)
        try:
            if keep and self._slab.direct_io:
                # Landed on the disk, not in the page cache: this chunk and the
                # landed ones after it, in one read.
                # Not offered to the memory tier: each of these chunks was
                # offered as it landed (taken if a region was free), and this
                # first read of it is no sign of reuse (tier_regions: admission).
                views = await self._work.shielded(self._work.run(
                    self._slab.read_direct, write.slot, chunk,
                    self._landed_run(write, chunk, through), write.length, write.checksums))
                self._keep_chunks(write.ident, write.generation, chunk, views)
                return views[0][start - lo:end - lo]
            first, stop = (lo, hi) if keep else (start, end)
            view = await self._read_checked(write, first, stop)
            if not keep:
                return view
            self._keep(write.ident, write.generation, chunk, view)
            return view[start - lo:end - lo]
        except (ChecksumMismatch, OSError) as exc:
            log.warning("block %s read back wrong while being written: %s", write.ident, exc)
            self._faults.checksum_failed(exc)
            raise ChecksumMismatch(write.slot, start // write.chunk_size) from exc
        finally:
            self._slots.unpin(write.slot)

    def _paged_into_tier(
        self, chunk: int, reader: int | None
    ) -> Callable[[int, int, int, SlotRecord], memoryview]:
        """A read of one whole chunk through the page cache that offers it,
        verified, to the memory tier in the same trip to the executor (as a
        read past the page cache does)."""
        def read(slot: int, first: int, stop: int, expected: SlotRecord) -> memoryview:
            view = self._slab.read_paged_in(slot, first, stop, expected)
            self._into_tier(expected.ident, expected.generation, chunk, [view], reader)
            return view
        return read

    def _into_tier(self, block: BlockIdent, generation: int, first: int,
                   views: list[memoryview], reader: int | None = None) -> None:
        """Chunks ``first``.. just read and verified, offered to the memory
        tier (in the executor: the copy is the thread's, not the loop's). A hit
        there is sent from memory, with no read and no hash."""
        if self._tier is None or block is NAMELESS:
            return  # a recovered block read by slot: no reader could look it up by name
        for chunk, view in enumerate(views, first):
            self._tier.put((block, generation & GENERATION_IN_INDEX, chunk), view,
                           reader=reader)

    def _landed_run(self, write: BlockWrite, chunk: int, through: int) -> int:
        """The end of the run of landed chunks from ``chunk`` on that a read past
        the page cache takes along, up to ``through`` (DIRECT_READ_CHUNKS at most)."""
        run = chunk + 1
        wanted = min(-(-min(through, write.length) // self._slab.chunk_size),
                     chunk + DIRECT_READ_CHUNKS)
        while run < wanted and write.checksums[run] is not None:
            run += 1
        return run

    async def _read_checked(self, write: BlockWrite, first: int, stop: int) -> memoryview:
        """Landed bytes of ``write`` through the page cache: on the loop if they
        are there, else in the executor."""
        try:
            return self._slab.read_checked(write.slot, first, stop, write.length,
                                           write.checksums, resident=True)
        except NotResident:
            return await self._work.shielded(self._work.run(
                self._slab.read_checked, write.slot, first, stop, write.length,
                write.checksums))

    def keep_landed(self, write: BlockWrite, chunk: int, copy: memoryview) -> None:
        """A landing chunk of ``write``, copied (``landed_copy``) from the buffer
        its checksum was taken in, for the reader waiting for it: served from
        memory like a chunk just read and verified, with no read of the slot."""
        self._recent.put(write.ident, write.generation & GENERATION_IN_INDEX, chunk, copy,
                         len(copy))

    def landed_copy(self, data: memoryview) -> memoryview | None:
        """A copy of a chunk in hand as it lands, for ``keep_landed``; None when
        no chunk is kept in memory (``recent_chunks`` 0). Blocking-free, thread
        safe: called in the fetch's worker thread, which reuses ``data``."""
        return self._slab.copy_of(data) if self._recent.enabled and data else None

    def chunk_around(self, start: int, end: int, length: int) -> tuple[int, int, int]:
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
        if self._slots.closed or not self._residency.current(record):
            return False
        self._slots.pin(record.slot)
        return True

    async def verified(
        self, work: Callable[[int, int, int, SlotRecord], T], record: SlotRecord,
        start: int, end: int,
    ) -> T | None:
        """Run a checksummed slab read in the executor; None (block dropped) on a
        mismatch, and on a read the disk failed (EIO): the bytes cannot be
        trusted either way, and the block is fetched again."""
        try:
            return await self._work.run(work, record.slot, start, end, record)
        except ChecksumMismatch as exc:
            self.checksum_failed(record, exc)
            return None
        except OSError as exc:
            self.checksum_failed(record, exc)
            return None

    def checksum_failed(self, record: SlotRecord, exc: ChecksumMismatch | OSError) -> None:
        log.warning("dropping cached block %s of slot %d: %s",
                    "(recovered)" if record.ident is NAMELESS else record.ident,
                    record.slot, exc)
        self._faults.checksum_failed(exc)
        if self._residency.current(record):
            self._residency.drop(record.slot, REASON_CHECKSUM)

    def _keep(self, block: BlockIdent, generation: int, chunk: int, view: memoryview) -> None:
        """A chunk just read and verified, for the next reader (its bytes are a
        copy of the slab's, which nothing writes to again)."""
        data = view.obj
        if isinstance(data, bytes | bytearray) and len(view) == len(data):
            # Keyed by what the index keeps of the generation, so that a record
            # from a lookup finds the chunks its write kept.
            self._recent.put(block, generation & GENERATION_IN_INDEX, chunk, data, len(data))

    def _keep_chunks(self, block: BlockIdent, generation: int, first: int,
                     views: list[memoryview]) -> None:
        """Chunks ``first``.. just read and verified, each in a buffer of its own
        that nothing writes to again, for the next reader."""
        for chunk, view in enumerate(views, first):
            self._recent.put(block, generation & GENERATION_IN_INDEX, chunk, view, len(view))


def _runs(chunks: list[int], longest: int) -> list[tuple[int, int]]:
    """Ascending chunk numbers as runs [first, stop) of consecutive ones, each
    at most ``longest`` long."""
    runs: list[tuple[int, int]] = []
    for chunk in chunks:
        if runs and runs[-1][1] == chunk and chunk - runs[-1][0] < longest:
            runs[-1] = (runs[-1][0], chunk + 1)
        else:
            runs.append((chunk, chunk + 1))
    return runs
